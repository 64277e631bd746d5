import pytest

from gdacil.cil.config import ConfigError, ExperimentConfig, HeadConfig, load_config
from gdacil.cli import main, shipped_configs


def write(tmp_path, text):
    p = tmp_path / "exp.yaml"
    p.write_text(text)
    return p


def test_yaml_config_is_validated_into_dataclasses(tmp_path):
    p = write(tmp_path, """
name: t
seeds: [1, 2]
protocol: {datasets: [fashion-mnist], increment: 2, train_cap: 5}
backbone: {name: efficientnet-lite0, options: {image_size: 64}}
heads:
  lda: {shrinkage: 0.2}
  low: {name: lr_rgda, params: {rank: 8}}
""")
    cfg = load_config(p, ["seeds=[3]", "heads.lda.shrinkage=0.3", "protocol.test_cap=4"])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.seeds == [3] and cfg.protocol["test_cap"] == 4 and cfg.protocol["train_cap"] == 5
    assert cfg.heads["lda"] == HeadConfig("lda", {"shrinkage": 0.3})
    assert cfg.heads["low"] == HeadConfig("lr_rgda", {"rank": 8})
    protocol = cfg.build_protocol(7)
    assert protocol.seed == 7 and protocol.datasets == ("fashion-mnist",)


@pytest.mark.parametrize(
    "text, override, match",
    [
        ("nmae: x\n", [], r"unknown key\(s\) \['nmae'\]"),
        ("protocol: {datasets: [x], increment: ten}\n", [], "increment must be a positive integer"),
        ("protocol: {datasets: [x], sede: 1}\n", [], r"unknown protocol fields \['sede'\]"),
        ("protocol: {datasets: [x], seed: 1}\n", [], "top-level `seeds`"),
        ("heads: {svm: {}}\n", [], "unknown head 'svm'"),
        ("heads: {lda: {rank: 3}}\n", [], "head 'lda' has no parameter"),
        ("seeds: []\n", [], "at least one seed"),
        ("ddof: 2\n", [], "ddof must be 0 or 1"),
        ("- a\n- b\n", [], "top level must be a mapping"),
        ("name: x\n", ["seeds"], "expected key=value"),
        ("name: x\n", ["name.sub=1"], "'name' is not a section"),
        ("protocol: [1]\n", [], "protocol: expected a mapping"),
    ],
)
def test_bad_configs_get_clear_errors(tmp_path, text, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(write(tmp_path, text), override)


def test_missing_config_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_every_shipped_config_loads():
    configs = shipped_configs()
    assert "demo" in configs
    for name, path in configs.items():
        cfg = load_config(path)
        assert cfg.name, name


def test_cli_list_and_errors(capsys):
    assert main(["list", "heads"]) == 0
    out = capsys.readouterr().out
    assert "lr_rgda" in out and "sgd" in out and "ranpac" in out and "rbf_lda" in out
    with pytest.raises(SystemExit, match="no shipped config of that name"):
        main(["run", "no-such-config"])
    with pytest.raises(SystemExit):
        main(["list", "widgets"])


def test_cli_bad_config_error_is_readable(tmp_path):
    p = write(tmp_path, "heads: {svm: {}}\n")
    with pytest.raises(SystemExit, match="bad configuration: heads.svm: unknown head"):
        main(["run", str(p)])


def test_cli_help_mentions_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("run", "demo", "bench", "list"):
        assert command in out


def test_overrides_get_their_own_output_folder_and_are_recorded(tmp_path):
    from pathlib import Path

    from gdacil.cil.runner import output_dir
    from gdacil.hashing import sha256_json

    path = write(tmp_path, "name: t\n")
    assert output_dir(load_config(path)) == Path("runs/t")
    varied = load_config(path, ["seeds=[4]"])
    assert varied.overrides == ("seeds=[4]",)
    assert output_dir(varied) == Path(f"runs/t-{sha256_json(['seeds=[4]'])[:8]}")
    assert output_dir(load_config(path, ["seeds=[5]"])) != output_dir(varied)
    explicit = load_config(path, ["seeds=[4]", f"output_dir={tmp_path / 'x'}"])
    assert output_dir(explicit) == tmp_path / "x"


def test_every_example_of_gdacil_help_parses():
    """The examples in ``gdacil --help`` stay true: each is a command line the parser takes."""
    import shlex

    from gdacil.cli import EPILOG, build_parser

    # "  gdacil run demo --set seeds=[1,2,3]           what it does": the command ends at "  "
    commands = [shlex.split(line.strip().split("  ")[0]) for line in EPILOG.splitlines()[1:]]
    commands = [c[1:] for c in commands if c and c[0] == "gdacil"]
    assert len(commands) >= 10
    for argv in commands:
        args = build_parser().parse_args(argv)
        assert callable(args.func), argv
