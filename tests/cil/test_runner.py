"""The whole class-incremental loop, end to end, on small real and generated data."""

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

from gdacil.cil import load_config, run_experiment
from gdacil.cil.config import ExperimentConfig, config_from_dict

from _assets import (
    TINY_VIT,
    needs_efficientnet,
    needs_fashion_mnist,
    needs_minilm,
    needs_transformers,
    needs_wordnet,
)


def color_folder(root, n_classes=4, n_train=6, n_test=3, size=32, seed=0):
    """train/<class>/ and test/<class>/ images: each class a noisy tint, easy to tell apart."""
    rng = np.random.default_rng(seed)
    tints = rng.uniform(0, 255, size=(n_classes, 3))
    for split, n in (("train", n_train), ("test", n_test)):
        for c in range(n_classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                pixels = np.clip(tints[c] + rng.normal(0, 25, size=(size, size, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.png")
    return root


def vit_config(tmp_path, out="run", precision=None, **extra):
    """The tiny-ViT experiment on ``tmp_path/images``; ``precision`` pins
    ``backbone.precision`` (None: the default "auto", which depends on the machine)."""
    data = {
        "name": "tiny-vit",
        "seeds": [3],
        "protocol": {"datasets": ["image-folder"], "initial": 2, "increment": 1,
                     "dataset_options": {"image-folder": {"root": str(tmp_path / "images")}}},
        "backbone": {"name": "vit", "options": {"config": TINY_VIT}, "batch_size": 4},
        "heads": {"ncm": {}, "lda": {"shrinkage": 0.5}, "lr_rgda": {"rank": 4}},
        "output_dir": str(tmp_path / out),
        "cache_dir": str(tmp_path / "cache"),
        "progress": False,
    }
    if precision is not None:
        data["backbone"]["precision"] = precision
    data.update(extra)
    return config_from_dict(ExperimentConfig, data)


#: both forward-pass precisions, whatever the machine's "auto" picks: equalities that must hold
#: in bf16 too run in both (bf16 is emulated, correct but slower, on a CPU without AVX512-BF16)
BOTH_PRECISIONS = pytest.mark.parametrize("precision", ["fp32", "bf16"])


def hand_metrics(evaluations, n_tasks):
    """Last-Acc, Inc-Acc and the accuracy matrix by plain loops over stored predictions."""
    matrix = [[None] * n_tasks for _ in range(n_tasks)]
    pooled = []
    for t, e in enumerate(evaluations):
        right = [int(a == b) for a, b in zip(e["y_true"], e["y_pred"])]
        pooled.append(sum(right) / len(right))
        for j in range(t + 1):
            mine = [r for r, task in zip(right, e["task_of_sample"]) if task == j]
            matrix[t][j] = sum(mine) / len(mine)
    return pooled[-1], sum(pooled) / len(pooled), matrix


@needs_transformers
def test_tiny_vit_run_records_metrics_that_match_a_hand_computed_matrix(tmp_path):
    color_folder(tmp_path / "images")
    cfg = vit_config(tmp_path)
    results = run_experiment(cfg, log=lambda *_: None)
    out = tmp_path / "run"
    for name in ("results.json", "results.csv", "results.md", "timings.json", "accuracy.png"):
        assert (out / name).is_file(), name
    state = json.loads((out / "seed_3" / "state.json").read_text())
    assert state["completed"] == 3
    for label in ("ncm", "lda", "lr_rgda"):
        last, inc, matrix = hand_metrics(state["evaluations"][label], 3)
        got = results["seeds"]["3"][label]
        assert got["last_acc"] == pytest.approx(last)
        assert got["inc_acc"] == pytest.approx(inc)
        assert got["accuracy_matrix"] == [[pytest.approx(v) if v is not None else None for v in row]
                                          for row in matrix]
        assert results["summary"][label]["last_acc"]["mean"] == pytest.approx(last)
    # the tints are trivially separable: a real bug in features, stats or heads shows up here
    assert results["seeds"]["3"]["lda"]["last_acc"] >= 0.75
    timings = json.loads((out / "timings.json").read_text())
    assert set(timings["3"][0]["heads"]) == {"ncm", "lda", "lr_rgda"}
    report = (out / "results.md").read_text()
    assert "Seeds: 3." in report and "Overrides: none" in report and "one seed, so no interval" in report


@needs_transformers
@BOTH_PRECISIONS
def test_resume_after_an_interruption_gives_identical_results(tmp_path, precision):
    color_folder(tmp_path / "images")
    full = run_experiment(vit_config(tmp_path, out="full", precision=precision),
                          log=lambda *_: None)
    assert full["backbone_precision"] == precision

    class Killed(Exception):
        pass

    def kill_after_first_task(seed, t):
        if t == 0:
            raise Killed

    cfg = vit_config(tmp_path, out="killed", precision=precision)
    with pytest.raises(Killed):
        run_experiment(cfg, log=lambda *_: None, on_task_end=kill_after_first_task)
    assert not (tmp_path / "killed" / "results.json").exists()
    with pytest.raises(FileExistsError, match="--resume"):
        run_experiment(cfg, log=lambda *_: None)
    # a worker count changes how fast features come, not what they are: it may differ on resume
    cfg.backbone.num_workers = 1
    resumed = run_experiment(cfg, resume=True, log=lambda *_: None)
    assert resumed == full
    assert ((tmp_path / "killed" / "results.json").read_bytes()
            == (tmp_path / "full" / "results.json").read_bytes())


@needs_transformers
def test_resume_refuses_a_checkpoint_of_another_configuration(tmp_path):
    color_folder(tmp_path / "images")
    cfg = vit_config(tmp_path)

    def stop(seed, t):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, log=lambda *_: None, on_task_end=stop)
    other = vit_config(tmp_path, heads={"ncm": {}})
    with pytest.raises(ValueError, match="different configuration"):
        run_experiment(other, resume=True, log=lambda *_: None)


@pytest.mark.parametrize("native", [False, True])
def test_the_fingerprint_and_results_hold_the_precision_that_runs(monkeypatch, tmp_path, native):
    import gdacil.backbones.base as base
    from gdacil.cil.metrics import IncrementalMetrics, TaskEvaluation
    from gdacil.cil.results import results_record
    from gdacil.cil.runner import experiment_fingerprint

    monkeypatch.setattr(base, "native_bfloat16", lambda device: native)

    def fingerprint(precision, workers="auto"):
        return experiment_fingerprint(vit_config(tmp_path, backbone={
            "name": "vit", "options": {"config": TINY_VIT}, "precision": precision,
            "num_workers": workers}))

    ran = "bf16" if native else "fp32"
    assert fingerprint("auto") == fingerprint(ran) != fingerprint({"bf16": "fp32"}.get(ran, "bf16"))
    assert fingerprint("auto", workers=0) == fingerprint("auto", workers=3)
    metrics = IncrementalMetrics(n_tasks=1)
    metrics.add(TaskEvaluation(np.array([0, 1]), np.array([0, 1]), np.array([0, 0])))
    record = results_record(vit_config(tmp_path), {3: {"ncm": metrics}})
    assert record["backbone_precision"] == ran and record["config"]["backbone"]["precision"] == "auto"
    assert "num_workers" not in record["config"]["backbone"]
    assert "output_dir" not in record["config"]


@needs_transformers
def test_changed_class_order_is_refused_by_the_manifest(tmp_path):
    from gdacil.data import ManifestMismatchError

    color_folder(tmp_path / "images")
    run_experiment(vit_config(tmp_path, heads={"ncm": {}}), log=lambda *_: None)
    # the same output directory with a protocol whose tasks differ
    moved = vit_config(tmp_path, heads={"ncm": {}})
    moved.protocol = dataclasses.replace(moved.protocol, initial=1)
    with pytest.raises(ManifestMismatchError, match="differs"):
        run_experiment(moved, overwrite=True, log=lambda *_: None)


@needs_minilm
@needs_wordnet
def test_minilm_on_wordnet_end_to_end(tmp_path):
    cfg = load_config(None, [
        "name=wordnet", "seeds=[0]",
        "protocol={datasets: [wordnet-hypernym], initial: 4, increment: 3, train_cap: 12, "
        "test_cap: 6, dataset_options: {wordnet-hypernym: {n_classes: 10}}}",
        "backbone={name: minilm, options: {final_norm: nonaffine_ln}}",
        "heads={lda: {}, lr_rgda: {rank: 8}, sgd: {base_steps: 200, steps_per_class: 0}}",
        f"output_dir={tmp_path / 'out'}", f"cache_dir={tmp_path / 'cache'}", "progress=false",
    ])
    results = run_experiment(cfg, log=lambda *_: None)
    for label in ("lda", "lr_rgda", "sgd"):
        m = results["seeds"]["0"][label]
        assert len(m["pooled_acc_per_task"]) == 3
        assert m["last_acc"] > 0.3, (label, m["last_acc"])  # chance is 0.1


@needs_efficientnet
@needs_fashion_mnist
def test_efficientnet_on_fashion_mnist_end_to_end(tmp_path):
    cfg = load_config(None, [
        "name=fmnist", "seeds=[0]",
        "protocol={datasets: [fashion-mnist], initial: 4, increment: 3, train_cap: 10, test_cap: 5}",
        "backbone={name: efficientnet-lite0, options: {size: 64}, batch_size: 32}",
        "heads={lda: {shrinkage: 0.3}, lr_rgda: {rank: 4}}",
        f"output_dir={tmp_path / 'out'}", f"cache_dir={tmp_path / 'cache'}", "progress=false",
    ])
    results = run_experiment(cfg, log=lambda *_: None)
    for label in ("lda", "lr_rgda"):
        assert results["seeds"]["0"][label]["last_acc"] > 0.3  # chance is 0.1


# ------------------------------------------------------------------ strategies and drift in the loop
TRAIN_TINY = {"name": "seqft", "train": {"steps": 4, "batch_size": 4, "lr": 0.05, "head_lr": 0.05}}
TRACKS = {"none": {"name": "identity"},
          "hopdc": {"name": "hopdc", "tau": 0.1, "topk": 4, "n_samples": 64},
          "sldc": {"name": "sldc_linear"}}


def adapting_config(tmp_path, out, precision=None, **extra):
    return vit_config(tmp_path, out=out, precision=precision, strategy=TRAIN_TINY,
                      compensators=TRACKS,
                      anchors={"n": 0, "include_current": True}, **extra)


@needs_transformers
def test_fine_tuned_backbone_feeds_every_compensator_track(tmp_path):
    color_folder(tmp_path / "images")
    # fp32 pinned: the equalities below hold in either precision, and "auto" would tie the
    # test to the CPU (the bf16 trajectory is checked by the resume test below)
    results = run_experiment(adapting_config(tmp_path, "adapt", "fp32", drift_diagnostics=True),
                             log=lambda *_: None)
    seeds = results["seeds"]["3"]
    assert set(seeds) == {f"{t}/{h}" for t in TRACKS for h in ("ncm", "lda", "lr_rgda")}
    # task 1 has nothing to compensate: every track starts from the same statistics
    first = {label: m["pooled_acc_per_task"][0] for label, m in seeds.items()}
    for head in ("ncm", "lda", "lr_rgda"):
        assert first[f"none/{head}"] == first[f"hopdc/{head}"] == first[f"sldc/{head}"]
    diagnostics = results["drift_diagnostics"]["3"]
    assert [d["task"] for d in diagnostics] == [1, 2]
    for d in diagnostics:
        assert set(d) == {"task", "hopdc", "sldc"}
        assert "gain" in d["hopdc"] and d["hopdc"]["identity"]["mean_error"] > 0
    timings = json.loads((tmp_path / "adapt" / "timings.json").read_text())["3"]
    assert timings[0]["adapt"]["steps"] == 4 and "compensate_s" in timings[1]
    # the identity track is exactly the run without compensators: one backbone trajectory
    alone = run_experiment(vit_config(tmp_path, out="alone", precision="fp32",
                                      strategy=TRAIN_TINY), log=lambda *_: None)
    for head in ("ncm", "lda", "lr_rgda"):
        assert alone["seeds"]["3"][head] == seeds[f"none/{head}"]


@needs_transformers
@BOTH_PRECISIONS
def test_resume_with_a_training_strategy_gives_identical_results(tmp_path, precision):
    color_folder(tmp_path / "images")
    full = run_experiment(adapting_config(tmp_path, "full", precision), log=lambda *_: None)
    assert full["backbone_precision"] == precision

    def kill(seed, t):
        if t == 1:
            raise KeyboardInterrupt

    cfg = adapting_config(tmp_path, "killed", precision)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, log=lambda *_: None, on_task_end=kill)
    assert sorted(p.name for p in (tmp_path / "killed" / "seed_3").glob("backbone_task*"))\
        == ["backbone_task2.safetensors"]
    resumed = run_experiment(cfg, resume=True, log=lambda *_: None)
    assert resumed == full
