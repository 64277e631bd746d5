"""What gdacil at commit a8fdd53 saved still loads, predicts and resumes as it did then.

tests/fixtures/a8fdd53 was written by a8fdd53's code (tests/fixtures/make_a8fdd53.py says how and
what it holds): two Learner models (heads lr_rgda, with its stored eigenpairs, and fecam on
low-rank statistics) and an experiment run interrupted after its second task. A later way of
saving heads or checkpoints must keep reading these: every check here compares with what
a8fdd53 itself computed from the same files (``expected.json``, ``run-expected.json``,
``run-checkpoint.safetensors``). The committed files are copied to ``tmp_path`` first and never
written to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gdacil.learner import Learner, versions

from _assets import needs_transformers

FIXTURE = Path(__file__).parents[1] / "fixtures" / "a8fdd53"
SEED = 3
RESUMED_TASKS = [2, 3]  # the checkpoint holds tasks 0 and 1 of 4

pytestmark = needs_transformers


def expected() -> dict:
    return json.loads((FIXTURE / "expected.json").read_text())


def inputs() -> list[str]:
    return [str(FIXTURE / "inputs" / name) for name in expected()["inputs"]]


def assert_same_predictions(predictions, recorded, what: str) -> None:
    """Top-2 classes equal; scores within rtol 1e-4 and probabilities within 1e-4 (features
    are float32, computed by another machine's kernels)."""
    got = [p.to_list() for p in predictions]
    assert len(got) == len(recorded), what
    for i, (mine, theirs) in enumerate(zip(got, recorded)):
        where = f"{what}, input {i}"
        assert [x["class"] for x in mine] == [x["class"] for x in theirs], where
        np.testing.assert_allclose([x["score"] for x in mine], [x["score"] for x in theirs],
                                   rtol=1e-4, err_msg=where)
        np.testing.assert_allclose([x["probability"] for x in mine],
                                   [x["probability"] for x in theirs], atol=1e-4, err_msg=where)


# ---------------------------------------------------------------------- Learner models
@pytest.mark.parametrize("head", ["lr_rgda", "fecam"])
def test_each_saved_version_loads_and_predicts_as_a8fdd53_did(tmp_path, head):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE / f"model-{head}", model)
    assert [(v.name, v.current) for v in versions(model)] == [("v1", False), ("v2", True)]
    for version in ("v2", "v1"):
        learner = Learner.load(model, version)
        assert learner.config.head == head and learner.version == version
        assert_same_predictions(learner.predict(inputs(), top_k=2),
                                expected()[f"model-{head}"][version], f"{head} {version}")
    current = Learner.load(model)
    assert current.version == "v2"
    assert current.classes == ["red", "green", "blue", "yellow"]
    assert current.class_counts() == ({"red": 10, "green": 6, "blue": 6, "yellow": 4}
                                      if head == "lr_rgda" else
                                      {"red": 6, "green": 6, "blue": 6, "yellow": 4})
    if head == "fecam":  # its low-rank statistics are read back as low-rank statistics
        from gdacil.stats import LowRankGaussians

        assert isinstance(current.statistics, LowRankGaussians)
        assert current.statistics.rank == 4


@pytest.mark.parametrize("head", ["lr_rgda", "fecam"])
def test_a_loaded_model_learns_and_forgets_as_a8fdd53_did(tmp_path, head):
    """The model goes on from its loaded statistics (and, for LR-RGDA, its stored eigenpairs):
    after learning purple and after forgetting green it predicts what a8fdd53 predicted after
    the same steps, and a save continues the version line."""
    recorded = expected()[f"model-{head}"]
    model = tmp_path / "model"
    shutil.copytree(FIXTURE / f"model-{head}", model)
    learner = Learner.load(model)
    learn = sorted(str(p) for p in (FIXTURE / "learn").glob("*.png"))
    report = learner.learn(learn, ["purple"] * len(learn))
    assert report.new == ("purple",) and report.updated == ()
    for step in ("learned", "forgot"):
        if step == "forgot":
            assert learner.forget(["green"]) == ["green"]
        assert learner.classes == recorded[step]["classes"], step
        if head == "lr_rgda":
            # learning decomposes purple alone: a8fdd53's stored eigenpairs of the other four
            # classes were read (none are decomposed by a forget)
            assert learner.head.n_decomposed_ == recorded[step]["n_decomposed"] == \
                {"learned": 1, "forgot": 0}[step]
        assert_same_predictions(learner.predict(inputs(), top_k=2), recorded[step]["predictions"],
                                f"{head} after {step}")
    assert learner.save(model) == "v3"
    assert [(v.name, v.parent) for v in versions(model)] == [("v1", None), ("v2", "v1"),
                                                             ("v3", "v2")]
    again = Learner.load(model)
    assert again.classes == recorded["forgot"]["classes"]
    assert_same_predictions(again.predict(inputs(), top_k=2), recorded["forgot"]["predictions"],
                            f"{head} v3 saved by this gdacil")


# ---------------------------------------------------------------------- the run checkpoint
def run_config(root: Path):
    """run-config.json with its image root, output_dir and cache_dir under ``root``."""
    from gdacil.cil.config import ExperimentConfig, config_from_dict

    data = json.loads((FIXTURE / "run-config.json").read_text())
    options = data["protocol"]["dataset_options"]["image-folder"]
    options["root"] = str(root / options["root"])
    data["output_dir"] = str(root / data["output_dir"])
    data["cache_dir"] = str(root / data["cache_dir"])
    return config_from_dict(ExperimentConfig, data)


@pytest.fixture
def run_copy(tmp_path) -> Path:
    """The images and the interrupted run's directory, copied under ``tmp_path``."""
    shutil.copytree(FIXTURE / "images", tmp_path / "images")
    shutil.copytree(FIXTURE / "run", tmp_path / "run")
    return tmp_path


def test_the_fingerprint_of_the_run_config_is_a8fdd53s(run_copy):
    """The checkpoint resumes only under the fingerprint it was written with."""
    from gdacil.cil.runner import experiment_fingerprint

    assert experiment_fingerprint(run_config(run_copy)) == expected()["run"]["fingerprint"]


def test_the_interrupted_run_resumes_to_a8fdd53s_results(run_copy):
    from gdacil.cil import run_experiment

    cfg = run_config(run_copy)
    ran = []
    results = run_experiment(cfg, resume=True, log=lambda *_: None,
                             on_task_end=lambda seed, t: ran.append((seed, t)))
    assert ran == [(SEED, t) for t in RESUMED_TASKS]  # the checkpoint's tasks were not rerun
    full = json.loads((FIXTURE / "run-expected.json").read_text())
    # accuracies are ratios of counts of right labels: equal, not close
    assert results["seeds"] == full["seeds"]
    assert results["summary"] == full["summary"]
    assert results["backbone_precision"] == full["backbone_precision"] == "fp32"
    written = json.loads((run_copy / "run" / "results.json").read_text())
    assert written["seeds"] == full["seeds"]


def checkpoint_part(state, kind: str):
    """The ``backbone`` or ``strategy`` state ``(tensors, metadata)`` that ``load_checkpoint``
    read: attributes of ``SeedState`` up to 246c7e5 (the backbone as its tensors alone), items
    of ``SeedState.parts`` in the refactor of checkpoints begun after it."""
    if hasattr(state, kind):
        value = getattr(state, kind)
        return (value, None) if kind == "backbone" and value is not None else value
    return state.parts.get(kind)


def test_the_checkpoint_loads_with_each_tracks_statistics_and_streaming_heads(run_copy):
    from safetensors.torch import load_file

    from gdacil.cil.checkpoint import load_checkpoint
    from gdacil.cil.runner import experiment_fingerprint

    cfg = run_config(run_copy)
    recorded = expected()["run"]
    state = load_checkpoint(run_copy / "run" / f"seed_{SEED}", experiment_fingerprint(cfg))
    assert state is not None and state.completed == recorded["completed"] == 2
    assert set(state.tracks) == set(cfg.compensators) == {"none", "hopdc"}
    backbone, strategy = checkpoint_part(state, "backbone"), checkpoint_part(state, "strategy")
    assert backbone is not None and strategy is not None  # nsp_seqft trained the backbone
    assert sorted(backbone[0]) == recorded["backbone"]
    full = json.loads((FIXTURE / "run-expected.json").read_text())["seeds"][str(SEED)]
    assert set(state.evaluations) == set(full)
    for label, evaluations in state.evaluations.items():
        assert [e.pooled for e in evaluations] == full[label]["pooled_acc_per_task"][:2], label

    # each track's statistics and the strategy's state as a8fdd53 read them (HopDC moved the
    # old classes: the tracks differ)
    stats = load_file(str(FIXTURE / "run-checkpoint.safetensors"))
    assert not torch.equal(stats["none.means"], stats["hopdc.means"])
    for track, s in state.tracks.items():
        assert s.classes == recorded["classes"][track], track
        assert torch.equal(s.counts, stats[f"{track}.counts"]), track
        assert torch.equal(s.means, stats[f"{track}.means"]), track
        torch.testing.assert_close(s.covariances(), stats[f"{track}.covariances"],
                                   rtol=1e-12, atol=0, msg=track)

    moments = {k.removeprefix("strategy."): v for k, v in stats.items()
               if k.startswith("strategy.")}
    tensors, metadata = strategy
    assert moments and set(tensors) == set(moments)
    for name, value in moments.items():
        assert torch.equal(tensors[name], value), name
    assert metadata == recorded["strategy"]

    # every configured head fitted on each track, and the streaming heads, on fixed features
    features = load_file(str(FIXTURE / "run-features.safetensors"))["features"]
    for track, heads in recorded["tracks"].items():
        assert set(heads) == {label for label, h in cfg.heads.items() if not h.streaming}
        for label, want in heads.items():
            head = cfg.heads[label].build().fit(state.tracks[track])
            what = f"{track}/{label}"
            assert head.predict(features).tolist() == want["labels"], what
            np.testing.assert_allclose(head.decision_function(features).numpy(), want["scores"],
                                       rtol=1e-6, err_msg=what)
    assert set(state.streaming) == set(recorded["streaming"]) == {"ranpac", "rbf_lda"}
    for label, head in state.streaming.items():
        want = recorded["streaming"][label]
        assert head.predict(features).tolist() == want["labels"], label
        np.testing.assert_allclose(head.decision_function(features).numpy(), want["scores"],
                                   rtol=1e-6, err_msg=label)
