"""Configs are validated whole before any work; the CLI turns expected failures into one line."""

import pytest

import gdacil.cil as cil
from gdacil.cil.config import ConfigError, load_config
from gdacil.cil.runner import build_feature_backbone
from gdacil.cli import main

from _assets import TINY_VIT, needs_transformers


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_every_problem_of_a_config_is_listed_at_once(tmp_path):
    path = write(tmp_path, "name: t\nseeds: [3, x, 3]\nthreads: 1000000\n"
                           "compensators: {h: {name: hopdc, tau: -1.0}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    assert text.startswith("3 problems:")
    assert "seeds: seeds must be non-negative integers; got ['x']" in text
    assert "threads: expected an integer from 1 to" in text
    assert "compensators.h:" in text and "tau" in text
    with pytest.raises(ConfigError, match=r"seed\(s\) \[3\] appear more than once"):
        load_config(path, ["seeds=[3, 3]", "threads=1", "compensators={h: {name: hopdc}}"])


def test_a_bad_yaml_override_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"--set 'seeds=\[1,': the value is not valid YAML"):
        load_config(write(tmp_path, "name: t\n"), ["seeds=[1,"])
    with pytest.raises(SystemExit, match="bad configuration: --set"):
        main(["run", str(write(tmp_path, "name: t\n")), "--set", "seeds=[1,"])


@needs_transformers
def test_precision_is_validated_and_reaches_the_backbone(tmp_path):
    base = f"name: t\nbackbone: {{name: vit, options: {{config: {TINY_VIT}}}}}\n"
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        load_config(write(tmp_path, base), ["backbone.precision=fp8"])
    with pytest.raises(ConfigError, match="fp16 cannot train the backbone"):
        load_config(write(tmp_path, base), ["backbone.precision=fp16", "strategy={name: seqft}"])
    cfg = load_config(write(tmp_path, base), ["backbone.precision=bf16"])
    assert build_feature_backbone(cfg).precision == "bf16"
    from gdacil._hardware import native_bfloat16  # the default: "auto", resolved for the device
    expected = "bf16" if native_bfloat16("cpu") else "fp32"
    assert build_feature_backbone(load_config(write(tmp_path, base))).precision == expected


@needs_transformers
def test_check_reports_missing_data_without_running_anything(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, f"""
name: check
protocol: {{datasets: [image-folder], initial: 2, increment: 1,
           dataset_options: {{image-folder: {{root: {tmp_path / 'nowhere'}}}}}}}
backbone: {{name: vit, options: {{config: {TINY_VIT}}}}}
cache_dir: {tmp_path / 'cache'}
""")
    assert main(["run", str(path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "gdacil: missing: dataset 'image-folder'" in err
    assert "--set protocol.dataset_options.image-folder.root=PATH" in err
    assert "backbone" not in err  # the random-init ViT needs no download
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_interrupt_and_disk_errors_are_one_line(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, "name: t\nseeds: [3]\n")

    def interrupted(cfg, *, on_task_end, **kw):
        on_task_end(3, 0)
        raise KeyboardInterrupt

    monkeypatch.setattr(cil, "run_experiment", interrupted)
    assert main(["run", str(path), "--set", "seeds=[3]"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == (f"gdacil: interrupted after task 1 of seed 3; continue with: "
                           f"gdacil run {path} --set seeds=[3] --resume")

    def disk_full(cfg, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cil, "run_experiment", disk_full)
    assert main(["run", str(path)]) == 2
    assert capsys.readouterr().err.strip() == "gdacil: error: [Errno 28] No space left on device"
