"""Learner.forget: the model equals one that never learned the class, and the version saved
after forgetting holds nothing of it: neither its name nor its statistics (the files are
scanned for both), nor its anchors; deleting the earlier versions purges it from the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gdacil.learner import Learner

from _assets import needs_transformers
from test_learner import colour_images, tiny_learner, trained_learner

pytestmark = needs_transformers

#: a class name no file holds by chance, learned from purple images
SECRET = "zebra-7f3a9c"
FIRST = [("red", "red"), (SECRET, "purple")]
SECOND = [("green", "green"), ("blue", "blue")]


def samples(pairs, n: int, seed: int = 0, without: str | None = None):
    inputs, labels = [], []
    for label, colour in pairs:
        if label != without:
            inputs += colour_images(colour, n, seed)
            labels += [label] * n
    return inputs, labels


def scores(learner: Learner, inputs) -> dict[str, torch.Tensor]:
    """Every class's scores of ``inputs``, by class name."""
    X = learner._features(inputs)
    return dict(zip(learner.classes, learner.head.decision_function(X).T))


def traces(folder: Path, name: str, mean: torch.Tensor) -> list[str]:
    """The files under ``folder`` that hold ``name`` (in any file's bytes), or ``mean`` as a
    row or column of a tensor (in the safetensors files)."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if name.encode() in path.read_bytes():
            found.append(f"{path.relative_to(folder)}: the name")
        if path.suffix != ".safetensors":
            continue
        for key, t in load_file(path).items():
            if not t.is_floating_point() or t.ndim == 0:
                continue
            t = t.double()
            for view in (t, t.transpose(-1, -2)) if t.ndim > 1 else (t,):
                if view.shape[-1] == mean.shape[0]:
                    gap = (view.reshape(-1, mean.shape[0]) - mean).abs().amax(1)
                    if bool((gap <= 1e-6 * (1 + float(mean.abs().max()))).any()):
                        found.append(f"{path.relative_to(folder)}: {key} holds its mean")
    return found


def learned(make, *, without: str | None = None) -> Learner:
    learner = make()
    learner.learn(*samples(FIRST, 6, without=without))
    learner.learn(*samples(SECOND, 6, seed=1, without=without))
    return learner


@pytest.mark.parametrize("head", [{"head": "lr_rgda", "head_params": {"rank": 4}},
                                  {"head": "fecam"}, {"head": "qda", "head_params":
                                                      {"reg_param": 0.1}}],
                         ids=lambda h: h["head"])
def test_forget_gives_the_model_that_never_learned_the_class_and_saves_no_trace(tmp_path,
                                                                                  head):
    model = tmp_path / "model"
    learner = learned(lambda: tiny_learner(**head))
    stats = learner.statistics
    mean = stats.means[stats.positions([learner.class_ids()[SECRET]])][0].clone()
    learner.save(model)
    assert traces(model / "versions" / "v1", SECRET, mean)  # the scan finds what is there
    assert learner.forget(SECRET) == [SECRET]
    assert learner.save(model) == "v2"
    assert traces(model / "versions" / "v2", SECRET, mean) == []
    history = json.loads((model / "versions" / "v2" / "learner.json").read_text())["history"]
    assert [e["action"] for e in history] == ["learn", "learn", "forget"]
    assert history[0]["new"] == ["red"] and history[-1]["count"] == 1

    never = learned(lambda: tiny_learner(**head), without=SECRET)
    queries = samples(FIRST + SECOND, 2, seed=5)[0]
    ours, theirs = scores(learner, queries), scores(never, queries)
    assert list(ours) == list(theirs) == ["red", "green", "blue"]
    for name, expected in theirs.items():
        gap = float((ours[name] - expected).abs().max()) / max(1.0, float(expected.abs().max()))
        assert gap <= 1e-10, name
    loaded = Learner.load(model)
    assert loaded.classes == ["red", "green", "blue"]
    assert [p.classes for p in loaded.predict(queries, top_k=3)] == [
        p.classes for p in never.predict(queries, top_k=3)]

    shutil.rmtree(model / "versions" / "v1")  # the purge the docstring describes
    assert traces(model, SECRET, mean) == []
    reloaded = Learner.load(model)
    reloaded.learn(*samples([("yellow", "yellow")], 4))
    assert reloaded.save(model) == "v3"


def test_a_trained_learner_drops_the_anchors_and_the_name_of_the_class(tmp_path):
    model = tmp_path / "model"
    learner = learned(trained_learner)
    assert SECRET in learner._reservoir.labels()
    stats = learner.statistics
    mean = stats.means[stats.positions([learner.class_ids()[SECRET]])][0].clone()
    learner.save(model)
    anchors = {a.file for a in learner._reservoir.anchors if a.label == SECRET}
    learner.forget([SECRET])
    learner.save(model)
    v2 = model / "versions" / "v2"
    assert traces(v2, SECRET, mean) == []
    kept = json.loads((v2 / "anchors.json").read_text())["anchors"]
    assert kept and all(a["label"] != SECRET for a in kept)
    assert not any((v2 / f).exists() for f in anchors if f)


def test_forgetting_before_the_first_save_leaves_no_name_either(tmp_path):
    learner = learned(tiny_learner)
    stats = learner.statistics
    mean = stats.means[stats.positions([learner.class_ids()[SECRET]])][0].clone()
    learner.forget(SECRET)
    learner.save(tmp_path / "model")
    folder = tmp_path / "model" / "versions" / "v1"
    assert traces(folder, SECRET, mean) == []
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [e["action"] for e in manifest["summary"]["events"]] == ["learn", "learn", "forget"]
