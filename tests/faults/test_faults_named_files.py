"""Every damaged or edited file is named in its one line, the version included (issue 43,
failure 5 and the state.json item of 7): JSON's NaN and Infinity in a manifest, edited
learner.json values, a head file of another kind, state.json entries edited with their
checksums recomputed, and a --backbone-option that is not JSON (docs/reliability.md). The
fixtures ``model`` and ``interrupted`` are in conftest.py."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest
from test_cli_errors import _edit_learner_json, one_line
from test_faults_storage import checkpoint_copy, quiet

from gdacil.cil import run_experiment
from gdacil.cil.checkpoint import _state_checksum
from gdacil.cli import main
from gdacil.hashing import sha256_json
from gdacil.io import CorruptFileError, read_json
from gdacil.learner import Learner, bundle

from _assets import needs_transformers
from test_runner import color_folder, vit_config

pytestmark = needs_transformers


# ---------------------------------------------------------------------- manifest.json
@pytest.mark.parametrize("damage", ["Infinity", "-Infinity", "NaN"])
def test_a_manifest_holding_a_non_json_number_is_named_by_every_command(model, capsys, damage):
    # json.loads reads NaN and Infinity; the manifest's checksum (strict JSON) then raised
    # "Out of range float values are not JSON compliant" from every command, naming no file
    path = model / "versions" / "v1" / "manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"classes": 2', f'"classes": {damage}', 1))
    assert path.read_text() != text
    with pytest.raises(CorruptFileError, match=re.escape(f"not valid JSON ({damage} is not a "
                                                         "JSON number")) as raised:
        Learner.load(model)
    assert raised.value.path == path
    for argv in (["info", "model"], ["predict", "model", "photos/red/0.png"],
                 ["learn", "model", "--data", "photos"], ["rollback", "model", "v1"]):
        line = one_line(capsys, *argv)
        assert "model/versions/v1/manifest.json: not valid JSON" in line, (argv, line)
    code = main(["versions", "model"])
    out = capsys.readouterr().out
    assert code == 0 and "v1" in out and "manifest.json: not valid JSON" in out


def test_read_json_is_strict_and_names_the_file(tmp_path):
    path = tmp_path / "x.json"
    for text, problem in [('{"a": NaN}', "NaN is not a JSON number"), ("[1, 2", "Expecting"),
                          ("[" * 100_000, "nested too deeply")]:
        path.write_text(text)
        with pytest.raises(CorruptFileError, match=problem) as raised:
            read_json(path)
        assert raised.value.path == path
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(CorruptFileError, match="not valid JSON"):
        read_json(path)
    path.write_text('{"t": NaN}')
    assert read_json(path, allow_nan=True)["t"] != read_json(path, allow_nan=True)["t"]


# ---------------------------------------------------------------------- learner.json
def test_a_nan_backbone_dim_names_the_version_and_file(model, capsys):
    path = _edit_learner_json(model, lambda m: m)  # the same content, written compactly
    compact = path.read_text()
    assert '"dim": 32, "modality"' in compact
    path.write_text(compact.replace('"dim": 32, "modality"', '"dim": NaN, "modality"'))
    _refresh_manifest(model, "learner.json")
    with pytest.raises(CorruptFileError, match="NaN is not a JSON number") as raised:
        Learner.load(model)
    assert raised.value.path == path
    line = one_line(capsys, "predict", "model", "photos/red/0.png")
    assert "model/versions/v1/learner.json: not valid JSON" in line


@pytest.mark.parametrize("dim, problem", [
    ("32", "backbone.dim must be an integer >= 0; got '32'"),
    (0, "backbone.dim must be >= 1"),
    (None, "backbone.dim must be an integer >= 0; got None"),
])
def test_an_edited_backbone_dim_is_refused_at_load_naming_the_file(model, capsys, dim, problem):
    path = _edit_learner_json(model, lambda m: m["backbone"].update(dim=dim))
    with pytest.raises(CorruptFileError, match=problem) as raised:
        Learner.load(model)
    assert raised.value.path == path


def test_a_backbone_dim_of_another_backbone_names_the_version_and_file(model, capsys):
    path = _edit_learner_json(model, lambda m: m["backbone"].update(dim=31))
    line = one_line(capsys, "predict", "model", "photos/red/0.png")
    assert f"{path}: the backbone 'vit' gives 32-d image features, but this model was built " \
           "on 31-d" in line


@pytest.mark.parametrize("head", ["lda", "rgda", "ncm"])
def test_another_head_in_learner_json_names_the_version_and_the_head_file(model, capsys, head):
    _edit_learner_json(model, lambda m: m["config"].update(head=head))
    line = one_line(capsys, "predict", "model", "photos/red/0.png")
    assert "model/versions/v1/head.safetensors: holds a 'LRRGDA', not a " in line, line


def _refresh_manifest(directory, relative):
    folder = directory / "versions" / "v1"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][relative] = bundle.sha256_file(folder / relative)
    manifest.pop("sha256")
    manifest["sha256"] = sha256_json(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


# ---------------------------------------------------------------------- --backbone-option
def test_a_backbone_option_that_is_not_json_names_the_option_and_the_backbone(tmp_path, capsys,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    color_folder(tmp_path / "photos")
    line = one_line(capsys, "learn", "m", "--data", "photos", "--backbone", "vit",
                    "--backbone-option", "config={'hidden_size': 16}")
    assert "backbone 'vit'" in line and "the option config must be a mapping" in line, line
    assert "{'hidden_size': 16}" in line and not (tmp_path / "m").exists()


# ---------------------------------------------------------------------- state.json
EDITS = {
    "no files": lambda s: s.pop("files"),
    "no fingerprint": lambda s: s.pop("fingerprint"),
    "completed a string": lambda s: s.update(completed="1"),
    "completed beyond the evaluations": lambda s: s.update(completed=7),
    "evaluations a list": lambda s: s.update(evaluations=[1]),
    "tracks a list": lambda s: s["files"].update(tracks=["x"]),
    "a file name a number": lambda s: s["files"]["tracks"].update(none=5),
    "a file outside the folder": lambda s: s["files"]["tracks"].update(
        none="../stats_task1_none.safetensors"),
    "an evaluation without y_true": lambda s: [e.pop("y_true") for v in
                                               s["evaluations"].values() for e in v],
    "an evaluation of strings": lambda s: [e.update(y_pred=["a"] * len(e["y_pred"])) for v in
                                           s["evaluations"].values() for e in v],
    "timings a string": lambda s: s.update(timings="x"),
    "diagnostics a string": lambda s: s.update(diagnostics="x"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_state_json_edited_with_its_checksum_recomputed_is_named(interrupted, tmp_path, edit):
    # raised KeyError('files'), TypeError, AttributeError: errors that name no file
    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    path = seed_dir / "state.json"
    if edit == "a file outside the folder":  # a real checkpoint file, one folder up
        shutil.copy(seed_dir / "stats_task1_none.safetensors", seed_dir.parent)
    state = json.loads(path.read_text())
    changed = copy.deepcopy(state)
    EDITS[edit](changed)
    assert changed != state
    changed.pop("sha256")
    changed["sha256"] = _state_checksum(changed)
    path.write_text(json.dumps(changed))
    with pytest.raises(CorruptFileError, match="--overwrite") as raised:
        run_experiment(cfg, resume=True, log=quiet)
    assert raised.value.path == path


def test_a_checkpoint_of_more_tasks_than_the_run_has_is_named(interrupted, tmp_path):
    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    path = seed_dir / "state.json"
    state = json.loads(path.read_text())
    state["completed"] = 5  # the run has 3 tasks
    state["timings"] *= 5
    state["evaluations"] = {k: v * 5 for k, v in state["evaluations"].items()}
    state.pop("sha256")
    state["sha256"] = _state_checksum(state)
    path.write_text(json.dumps(state))
    with pytest.raises(CorruptFileError, match="records 5 tasks done of the 3") as raised:
        run_experiment(cfg, resume=True, log=quiet)
    assert raised.value.path == path


# ---------------------------------------------------------------------- --resume --overwrite
def test_resume_with_overwrite_is_refused_before_any_work(tmp_path, capsys):
    import yaml

    cfg = vit_config(tmp_path)  # no images: a run would fail on its data
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        run_experiment(cfg, resume=True, overwrite=True, log=quiet)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    line = one_line(capsys, "run", str(config), "--resume", "--overwrite")
    assert "--resume continues the run's checkpoints, --overwrite discards them" in line
    assert not (tmp_path / "run").exists()
