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
backbone: {name: efficientnet-lite0, options: {size: 64}}
heads:
  lda: {shrinkage: 0.2}
  low: {name: lr_rgda, params: {rank: 8}}
""")
    cfg = load_config(p, ["seeds=[3]", "heads.lda.shrinkage=0.3", "protocol.test_cap=4"])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.seeds == [3] and cfg.protocol.test_cap == 4 and cfg.protocol.train_cap == 5
    assert cfg.heads["lda"] == HeadConfig("lda", {"shrinkage": 0.3})
    assert cfg.heads["low"] == HeadConfig("lr_rgda", {"rank": 8})
    protocol = cfg.build_protocol(7)
    assert protocol.seed == 7 and protocol.datasets == ("fashion-mnist",)


@pytest.mark.parametrize(
    "text, override, match",
    [
        ("nmae: x\n", [], r"unknown key\(s\) \['nmae'\]"),
        ("protocol: {datasets: [x], increment: ten}\n", [],
         "protocol.increment: expected an integer, got 'ten'"),
        ("protocol: {datasets: [x], increment: 0}\n", [], "increment must be an integer >= 1"),
        ("protocol: {datasets: [x], sede: 1}\n", [], r"protocol: unknown key\(s\) \['sede'\]"),
        ("protocol: {datasets: [x], seed: 1}\n", [], "protocol.seed: .*top-level `seeds`"),
        ("heads: {svm: {}}\n", [], "unknown head 'svm'"),
        ("heads: {lda: {rank: 3}}\n", [], "head 'lda' has no parameter"),
        ("heads: {ncm: {defaults: paper}}\n", [], r"head 'ncm' has no preset 'paper' \(its presets: none"),
        ("heads: {lda: {defaults: best}}\n", [], r"head 'lda' has no preset 'best' \(its presets: 'paper'"),
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


def test_heads_take_the_paper_preset_with_overrides(tmp_path):
    from gdacil.heads import LDA, LRRGDA

    cfg = load_config(write(tmp_path, "heads:\n  lr_rgda: {rank: 8, defaults: paper}\n"
                                      "  lda: {name: lda, defaults: paper}\n  rgda: {}\n"))
    assert repr(cfg.heads["lr_rgda"].build()) == repr(LRRGDA.paper(rank=8))
    assert repr(cfg.heads["lda"].build()) == repr(LDA.paper())
    assert cfg.heads["rgda"].build().identity_scale == "samples"  # gdacil's defaults otherwise
    again = ExperimentConfig.from_dict(cfg.to_dict())
    assert again.heads == cfg.heads


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


# ---------------------------------------------------------------- the typed config layer
BASE = """
protocol: {datasets: [wordnet-hypernym]}
strategy: {name: seqft}
compensators: {h: {name: hopdc}}
heads: {low: {name: lr_rgda}}
"""

def test_every_shipped_config_round_trips_through_to_dict():
    """What a run records in results.json loads back into an equal config."""
    import json

    for name, path in shipped_configs().items():
        cfg = load_config(path)
        saved = json.loads(json.dumps(cfg.to_dict()))
        assert saved == cfg.to_dict(), name  # JSON-native
        assert ExperimentConfig.from_dict(saved) == cfg, name


def test_sections_are_typed_and_keep_their_yaml_spelling(tmp_path):
    from gdacil.cil.config import CompensatorConfig, StrategySpec
    from gdacil.data import ProtocolConfig

    cfg = load_config(write(tmp_path, """
strategy: {name: seqft, defaults: reference, train: {steps: 3}}
compensators:
  none: {name: identity}
  hopdc: {name: hopdc, defaults: paper, topk: 100, anchors: 512}
"""))
    assert isinstance(cfg.protocol, ProtocolConfig)
    assert cfg.strategy == StrategySpec("seqft", "reference", {"train": {"steps": 3}})
    assert cfg.compensators["hopdc"] == CompensatorConfig("hopdc", "paper", 512, {"topk": 100})
    assert cfg.to_dict()["strategy"] == {"name": "seqft", "defaults": "reference",
                                         "train": {"steps": 3}}
    assert cfg.to_dict()["compensators"]["none"] == {"name": "identity"}
    assert cfg.build_protocol(5) == cfg.protocol.with_seed(5)
    assert cfg.build_compensator("hopdc").topk == 100 and cfg.track_anchors("hopdc") == 512


def test_set_reaches_every_nested_field(tmp_path):
    path = write(tmp_path, "protocol: {datasets: [wordnet-hypernym]}\nstrategy: {name: seqft}\n"
                           "compensators: {hopdc: {name: hopdc}}\n")
    cfg = load_config(path, ["protocol.increment=5",
                             "protocol.dataset_options.wordnet-hypernym.n_classes=20",
                             "strategy.train.lr=0.001", "strategy.defaults=reference",
                             "compensators.hopdc.topk=100", "compensators.hopdc.anchors=64",
                             "statistics.storage=lowrank", "anchors.n=128"])
    assert cfg.protocol.increment == 5
    assert cfg.protocol.dataset_options == {"wordnet-hypernym": {"n_classes": 20}}
    strategy = cfg.build_strategy().config
    assert strategy.train.lr == 0.001 and strategy.train.optimizer == "adamw"  # reference
    assert cfg.compensators["hopdc"].params == {"topk": 100}
    assert cfg.track_anchors("hopdc") == 64 and cfg.build_compensator("hopdc").topk == 100
    assert cfg.statistics.storage == "lowrank" and cfg.anchors.n == 128


@pytest.mark.parametrize(
    "override, match",
    [
        ("protocol.increment=ten", r"^protocol\.increment: expected an integer, got 'ten'$"),
        ("protocol.cross_domain=maybe", r"^protocol\.cross_domain: expected true or false"),
        ("protocol.datasets=wordnet", r"^protocol\.datasets: expected a list of strings"),
        ("protocol.test_fraction=[1]", r"^protocol\.test_fraction: expected a number"),
        ("strategy.name=[seqft]", r"^strategy\.name: expected a string"),
        ("strategy.train.lr=fast", r"^strategy\.train\.lr: expected a number, got 'fast'$"),
        ("strategy.train.augment.flip=often", r"^strategy\.train\.augment\.flip: expected a number"),
        ("strategy.lora.targets=attention", r"^strategy\.lora\.targets: expected a list of strings"),
        ("compensators.h.anchors=many", r"^compensators\.h\.anchors: expected an integer or null"),
        ("compensators.h.defaults=1", r"^compensators\.h\.defaults: expected a string or null"),
        ("anchors.n=lots", r"^anchors\.n: expected an integer"),
        ("backbone.batch_size=1.5", r"^backbone\.batch_size: expected an integer, got 1\.5$"),
        ("statistics.rank=high", r"^statistics\.rank: expected an integer"),
        ("heads.low.params=3", r"^heads\.low\.params: expected a mapping, got 3$"),
        # unknown nested keys
        ("protocol.increments=5", r"^protocol: unknown key\(s\) \['increments'\]; known: datasets, "),
        ("strategy.train.lrr=0.1", r"^strategy\.train: unknown key\(s\) \['lrr'\]; known: steps, "),
        ("strategy.trian={}", r"^strategy: unknown key\(s\) \['trian'\]; known: name, params"),
        ("strategy.lora.alpha=2", r"^strategy\.lora: unknown key\(s\) \['alpha'\]; known: rank, "),
        ("compensators.h.temperature=1", r"^compensators\.h: .*temperature"),
        ("backbone.colour=red", r"^backbone: unknown key\(s\) \['colour'\]; known: name, options"),
        ("anchors.size=3", r"^anchors: unknown key\(s\) \['size'\]"),
        ("statistics.q=3", r"^statistics: unknown key\(s\) \['q'\]"),
        ("heads.low.rank=3", r"^heads\.low: unknown key\(s\) \['rank'\]; known: name, params, defaults$"),
    ],
)
def test_a_wrong_type_or_unknown_key_names_its_dotted_path(tmp_path, override, match):
    path = write(tmp_path, BASE)
    with pytest.raises(ConfigError, match=match) as err:
        load_config(path, [override])
    assert isinstance(err.value, ValueError)


def test_missing_names_and_python_built_configs_are_checked_the_same_way():
    with pytest.raises(ConfigError, match=r"^strategy: missing key\(s\) \['name'\]$"):
        ExperimentConfig.from_dict({"strategy": {"defaults": "paper"}})
    with pytest.raises(ConfigError, match=r"^compensators\.x: missing key\(s\) \['name'\]$"):
        ExperimentConfig.from_dict({"compensators": {"x": {"topk": 3}}})
    with pytest.raises(ConfigError, match=r"^protocol\.increment: expected an integer"):
        ExperimentConfig(protocol={"datasets": ["wordnet-hypernym"], "increment": "ten"})
    cfg = ExperimentConfig(protocol={"datasets": ["fashion-mnist"], "increment": 2},
                           strategy={"name": "seqft"}, compensators={"h": {"name": "sdc"}})
    assert cfg == ExperimentConfig.from_dict(cfg.to_dict())
    assert cfg.protocol.datasets == ("fashion-mnist",)


def test_one_error_type_for_every_config():
    """The strategy, learner and protocol configs refuse bad values with the same ConfigError."""
    from gdacil.adapt import StrategyConfig, build_strategy
    from gdacil.data import Protocol
    from gdacil.learner import LearnerConfig

    for build, match in [
        (lambda: StrategyConfig.from_dict({"lora": {"rank": "four"}}, where="strategy"),
         r"^strategy\.lora\.rank: expected an integer, got 'four'$"),
        (lambda: build_strategy("seqft", train={"steps": "many"}), r"^strategy\.train\.steps: "),
        (lambda: Protocol.from_dict({"datasets": ["a"], "seed": "x"}), r"^seed: expected an"),
        (lambda: LearnerConfig.from_dict({"anchors": "all"}), r"^anchors: expected an integer"),
        (lambda: LearnerConfig.from_dict({"strategy": {"name": "seqft", "train": {"lr": "x"}}}),
         r"strategy\.train\.lr: expected a number"),
    ]:
        with pytest.raises(ConfigError, match=match):
            build()
