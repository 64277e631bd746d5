"""``gdacil learn / predict / calibrate / info / forget / versions / rollback`` end to end,
their one-line errors, and the README's "Use it as a continual classifier" commands (real offline models)."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from gdacil.cli import main

from _assets import (
    TINY_VIT,
    needs_efficientnet,
    needs_minilm,
    needs_openclipart,
    needs_transformers,
)
from test_learner import image_folder

README = Path(__file__).resolve().parents[2] / "README.md"
TINY = ["--backbone", "vit", "--backbone-option", f"config={json.dumps(TINY_VIT)}"]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return out


def fails(capsys, *argv) -> str:
    """The error of a command that must fail: status 2 and one line on stderr."""
    code, out, err = run(capsys, *argv)
    assert code == 2 and not out, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gdacil: error: "), err
    return lines[0]


@needs_transformers
def test_the_commands_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "first", ["red", "green"], 4)
    image_folder(tmp_path / "second", ["blue", "red"], 4, seed=1)
    (tmp_path / "first" / "empty").mkdir()
    out = ok(capsys, "learn", "model", "--data", "first", *TINY, "--head-param", "rank=8")
    assert out == ("model: v1: learned 8 samples of 2 classes (2 new, 0 updated); skipped 1 "
                   "folders without images: empty; 2 classes in all\n")
    image_folder(tmp_path / "query", ["red", "green", "blue"], 1, seed=5)
    listed = json.loads(ok(capsys, "predict", "model", "query/red/0.png", "query/green",
                           "--top-k", "5"))
    assert [r["input"] for r in listed] == ["query/red/0.png", "query/green/0.png"]
    assert [r["predictions"][0]["class"] for r in listed] == ["red", "green"]
    assert len(listed[0]["predictions"]) == 2  # capped at the classes the model holds
    assert set(listed[0]["predictions"][0]) == {"class", "score", "probability"}
    out = ok(capsys, "learn", "model", "--data", "second")
    assert "v2: learned 8 samples of 2 classes (1 new, 1 updated); 3 classes in all" in out
    rows = list(csv.DictReader(io.StringIO(ok(capsys, "predict", "model", "query",
                                              "--format", "csv", "--top-k", "2"))))
    assert [(r["input"], r["rank"], r["class"]) for r in rows[::2]] == [
        ("query/blue/0.png", "1", "blue"), ("query/green/0.png", "1", "green"),
        ("query/red/0.png", "1", "red")]
    assert float(rows[0]["probability"]) >= float(rows[1]["probability"])
    info = json.loads(ok(capsys, "info", "model", "--format", "json"))
    assert info["classes"] == {"red": 8, "green": 4, "blue": 4} and info["versions"] == 2
    assert info["head"] == {"name": "lr_rgda", "params": {"rank": 8}}
    text = ok(capsys, "info", "model")
    assert re.search(r"^classes +3: green \(4\), red \(8\), blue \(4\)$", text, re.M)
    assert "(version v2 of 2)" in text and "(image, 32-d)" in text
    assert ok(capsys, "forget", "model", "--class", "green", "--class", "blue") == (
        "model: v3: forgot green, blue; 1 classes left\n")
    listing = ok(capsys, "versions", "model").splitlines()
    assert [line[:4] for line in listing] == ["  v1", "  v2", "* v3"]
    assert "learned 8 samples from second (1 new classes, 1 updated)" in listing[1]
    assert listing[2].endswith("forgot 2 classes")  # the history keeps no forgotten name
    assert ok(capsys, "rollback", "model", "v2") == "model: v2 is current again (3 classes)\n"
    assert json.loads(ok(capsys, "predict", "model", "query/blue/0.png"))[0]["predictions"][0][
        "class"] == "blue"
    old = json.loads(ok(capsys, "predict", "model", "query", "--version", "v1"))
    assert {r["predictions"][0]["class"] for r in old} <= {"red", "green"}
    assert [v["version"] for v in json.loads(ok(capsys, "versions", "model", "--format",
                                                "json")) if v["current"]] == ["v2"]


@needs_transformers
def test_errors_are_one_line_with_status_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "photos", ["red", "green"], 3)
    ok(capsys, "learn", "model", "--data", "photos", *TINY)
    assert "unknown class 'gren'; did you mean 'green'?" in fails(
        capsys, "forget", "model", "--class", "gren")
    Path("texts.csv").write_text("text,label\nhello,a\n")
    assert "texts.csv holds texts, but this model's backbone 'vit' takes images" in fails(
        capsys, "learn", "model", "--data", "texts.csv")
    assert "no such image file or folder: 'hello world' (model classifies images)" in fails(
        capsys, "predict", "model", "hello world")
    (tmp_path / "empty" / "red").mkdir(parents=True)
    assert "no images found under empty" in fails(capsys, "learn", "model", "--data", "empty")
    assert "no model at missing (create one with: gdacil learn missing --data PATH)" in fails(
        capsys, "predict", "missing", "photos/red/0.png")
    assert "already exists with backbone 'vit'; --backbone applies only when a model is " \
           "created" in fails(capsys, "learn", "model", "--data", "photos",
                              "--backbone", "minilm")
    assert "photos is not empty and not a gdacil model" in fails(
        capsys, "learn", "photos", "--data", "photos")
    assert "'ranpac' learns from features" in fails(
        capsys, "learn", "new", "--data", "photos", *TINY, "--head", "ranpac")
    assert "--head-param 'rank': expected KEY=VALUE" in fails(
        capsys, "learn", "new", "--data", "photos", "--head-param", "rank")
    assert "has no version v7" in fails(capsys, "rollback", "model", "v7")
    shutil.copytree("model", "broken")
    stats = Path("broken/versions/v1/statistics/0.safetensors")
    stats.write_bytes(stats.read_bytes()[:-1] + b"\0")
    line = fails(capsys, "predict", "broken", "photos/red/0.png")
    assert str(stats) in line and "does not match the sha256" in line
    assert str(stats) in fails(capsys, "info", "broken")
    assert not Path("new").exists()  # failed learns write nothing


@needs_transformers
def test_predict_rejects_unknown_inputs_and_gives_conformal_sets(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "photos", ["red", "green", "blue"], 20)  # 60 records
    ok(capsys, "learn", "model", "--data", "photos", *TINY)
    assert re.search(r"^calibration +60 records, temperature \S+, threshold \S+ at reject rate "
                     r"0.05 \(relative_likelihood\)$", ok(capsys, "info", "model"), re.M)
    image_folder(tmp_path / "query", ["red", "yellow", "purple"], 2, seed=5)
    listed = json.loads(ok(capsys, "predict", "model", "query", "--reject", "--reject-rate",
                           "0.25", "--top-k", "2"))
    assert [r["input"] for r in listed][:2] == ["query/purple/0.png", "query/purple/1.png"]
    for entry in listed:
        assert set(entry) == {"input", "predictions", "unknown", "novelty", "threshold"}
        assert entry["unknown"] == (entry["novelty"] < entry["threshold"])
        assert len(entry["predictions"]) == 2
    # the unlearned colours are far below the threshold; a known input is at times below it
    # too (at the rate asked for), but not both red ones here
    assert [r["unknown"] for r in listed if "/red/" not in r["input"]] == [True] * 4
    assert not all(r["unknown"] for r in listed if "/red/" in r["input"])
    rows = list(csv.DictReader(io.StringIO(ok(capsys, "predict", "model", "query", "--reject",
                                              "--reject-rate", "0.25", "--format", "csv"))))
    assert [(r["input"], r["unknown"]) for r in rows] == [(r["input"], str(r["unknown"]).lower())
                                                          for r in listed]
    assert [float(r["novelty"]) for r in rows] == [r["novelty"] for r in listed]
    sets = json.loads(ok(capsys, "predict", "model", "query/red", "--sets", "0.2"))
    assert [s["set"] for s in sets] == [["red"], ["red"]]
    assert "set" in next(csv.DictReader(io.StringIO(ok(
        capsys, "predict", "model", "query/red/0.png", "--sets", "0.2", "--format", "csv"))))
    # without --reject the output is as before
    assert set(json.loads(ok(capsys, "predict", "model", "query/red/0.png"))[0]) == {
        "input", "predictions"}
    assert "60 records, too few for a false-rejection rate of 0.01" in fails(
        capsys, "predict", "model", "query/red/0.png", "--reject", "--reject-rate", "0.01")
    assert "--reject-rate applies with --reject only" in fails(
        capsys, "predict", "model", "query/red/0.png", "--reject-rate", "0.3")
    for flag, value, message in (("--reject-rate", "1.5", "a number strictly between 0 and 1"),
                                 ("--sets", "0", "a number strictly between 0 and 1"),
                                 ("--sets", "nan", "a finite number")):
        with pytest.raises(SystemExit) as usage:  # argparse's usage error
            main(["predict", "model", "query/red/0.png", "--reject", flag, value])
        assert usage.value.code == 2
        assert f"argument {flag}: expected {message}; got '{value}'" in capsys.readouterr().err
    ok(capsys, "learn", "plain", "--data", "photos", *TINY, "--max-per-class", "2")
    assert "rejection needs a calibrated model, and this one has no calibration" in fails(
        capsys, "predict", "plain", "query/red/0.png", "--reject")
    assert re.search(r"^calibration +none", ok(capsys, "info", "plain"), re.M)
    # forget drops the records (every one was scored by a head that held green); calibrate on
    # held-out images brings rejection back, as a new version
    ok(capsys, "forget", "model", "--class", "green")
    assert "forgetting classes dropped the records" in fails(
        capsys, "predict", "model", "query/red/0.png", "--reject")
    image_folder(tmp_path / "held", ["red", "blue"], 12, seed=9)
    assert ok(capsys, "calibrate", "model", "--data", "held") == (
        "model: v3: calibrated on 24 samples of held\n")
    assert re.search(r"^calibration +24 records", ok(capsys, "info", "model"), re.M)
    assert len(json.loads(ok(capsys, "predict", "model", "query/red", "--reject",
                             "--reject-rate", "0.25"))) == 2
    assert "calibrated on 24 samples from held" in ok(capsys, "versions", "model")
    assert "unknown class 'purple'" in fails(capsys, "calibrate", "model", "--data", "query")


def readme_commands() -> list[str]:
    """The ``gdacil`` command lines of the README's "Use it as a continual classifier"."""
    text = README.read_text()
    section = text.split("## Use it as a continual classifier", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


TICKETS = [("I was charged twice for my subscription", "billing"),
           ("My invoice shows the wrong amount", "billing"),
           ("Please refund the last payment", "billing"),
           ("The app crashes when I open settings", "bugs"),
           ("Login fails with an error message", "bugs"),
           ("The page freezes after I click save", "bugs"),
           ("How do I change my email address", "account"),
           ("I want to delete my account", "account"),
           ("Reset my password please", "account")]


@needs_openclipart
@needs_efficientnet
@needs_minilm
def test_the_readme_commands_run(tmp_path, capsys, monkeypatch):
    """Every command of the README section, as written, on the offline openclipart images
    (EfficientNet-Lite0) and a small CSV of support tickets (MiniLM)."""
    monkeypatch.chdir(tmp_path)
    with open("tickets.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([("body", "queue"), *TICKETS])
    commands = readme_commands()
    assert [c.split()[1] for c in commands] == ["learn", "predict", "learn", "predict", "info",
                                                "forget", "versions", "rollback", "learn",
                                                "predict"]
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "gdacil", command
        outputs.append(ok(capsys, *argv[1:]))
    # images neither learn took (they take 10 per class): the pig is still a mammal after the
    # plants came
    first, second = json.loads(outputs[1]), list(csv.DictReader(io.StringIO(outputs[3])))
    assert len(first[0]["predictions"]) == 3
    assert "mammals" in [p["class"] for p in first[0]["predictions"]]
    assert [r["rank"] for r in second] == ["1", "2", "3"] * 2
    assert "flowers" in [r["class"] for r in second[:3]]
    assert "mammals" in [r["class"] for r in second[3:]]
    assert "classes      9:" in outputs[4]
    assert outputs[5] == "clipart-model: v3: forgot fantasy; 8 classes left\n"
    assert outputs[7] == "clipart-model: v2 is current again (9 classes)\n"
    tickets = json.loads(outputs[9])
    assert [t["predictions"][0]["class"] for t in tickets] == ["billing", "bugs"]


def _clipart_folder(root: Path, classes: dict[str, str], n: int) -> Path:
    """``root/<class>/`` holding links to the first ``n`` openclipart images of each folder."""
    for name, folder in classes.items():
        (root / name).mkdir(parents=True)
        for src in sorted(Path("/usr/share/openclipart/png", folder).glob("*.png"))[:n]:
            (root / name / src.name).symlink_to(src)
    return root


@needs_openclipart
@needs_efficientnet
@pytest.mark.filterwarnings("ignore:topk=400 exceeds the number of anchors")
def test_learn_with_seqft_trains_the_image_backbone_end_to_end(tmp_path, capsys):
    """``gdacil learn --strategy seqft`` on a folder of real images (EfficientNet-Lite0): the
    first learn fine-tunes the pointwise convolutions, the second moves the old classes."""
    first = _clipart_folder(tmp_path / "first", {"mammals": "animals/mammals",
                                                 "birds": "animals/birds"}, 4)
    second = _clipart_folder(tmp_path / "second", {"flowers": "plants/flowers"}, 4)
    model = tmp_path / "model"
    out = ok(capsys, "learn", model, "--data", first, "--strategy", "seqft",
             "--strategy-option", "train.steps=2", "--strategy-option", "train.batch_size=4",
             "--backbone-option", "size=96")
    assert out == (f"{model}: v1: learned 8 samples of 2 classes (2 new, 0 updated); trained "
                   "the backbone; 2 classes in all\n")
    out = ok(capsys, "learn", model, "--data", second)
    assert "trained the backbone and moved the old classes' statistics; 3 classes in all" in out
    info = json.loads((model / "versions" / "v2" / "learner.json").read_text())
    assert info["config"]["strategy"] == {"name": "seqft", "train": {"augment": "auto", "steps": 2,
                                                                     "batch_size": 4}}
    assert (model / "versions" / "v2" / "backbone.safetensors").is_file()
    flower = next(p for p in sorted(second.rglob("*.png")))
    predictions = json.loads(ok(capsys, "predict", model, flower, "--top-k", "3"))
    assert {p["class"] for p in predictions[0]["predictions"]} == {"mammals", "birds", "flowers"}
    assert "needs --strategy" in fails(capsys, "learn", tmp_path / "other", "--data", first,
                                       "--strategy-option", "train.steps=2")


@needs_transformers
@pytest.mark.filterwarnings("ignore:topk=400 exceeds the number of anchors")
def test_learn_accepts_the_strategy_a_model_has_and_refuses_another(tmp_path, capsys):
    """Repeating ``--strategy`` (and options) that a model already has is accepted, whichever
    defaults the CLI gives new models now (a model made when ``--strategy`` set no augmentation
    keeps none); a strategy or option that would change it is refused."""
    from gdacil.learner import Learner

    image_folder(tmp_path / "first", ["red", "green"], 4)
    image_folder(tmp_path / "second", ["blue"], 4, seed=1)
    model = tmp_path / "model"
    made_earlier = Learner(backbone="vit", backbone_options={"config": TINY_VIT},
                           strategy={"name": "seqft", "train": {"steps": 1, "batch_size": 4}})
    made_earlier.learn(tmp_path / "first")
    made_earlier.save(model)
    for flags in (["--strategy", "seqft", "--strategy-option", "train.steps=3"],
                  ["--strategy", "lora_seqft"],
                  ["--strategy", "seqft", "--strategy-option", "train.augment=auto"]):
        error = fails(capsys, "learn", model, "--data", tmp_path / "second", *flags)
        assert "already exists with strategy" in error and "--strategy" in error
    out = ok(capsys, "learn", model, "--data", tmp_path / "second", "--strategy", "seqft",
             "--strategy-option", "train.steps=1")
    assert "v2" in out and "3 classes in all" in out
    info = json.loads((model / "versions" / "v2" / "learner.json").read_text())
    assert info["config"]["strategy"] == {"name": "seqft", "train": {"steps": 1, "batch_size": 4}}
