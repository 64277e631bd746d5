"""``gdacil bench pipeline --quick``: the three files, the documented keys, sane ratios, and the
pipeline's features equal to ``Backbone.extract``."""

import json
import math

import pytest

from gdacil.bench import BENCHMARKS
from gdacil.bench.pipeline import PARTS, TaskClock, main, split_task

from _assets import needs_efficientnet, needs_minilm, needs_transformers

FILES = ("pipeline.json", "pipeline.md", "pipeline.png")


@needs_transformers
@needs_minilm
@needs_efficientnet
def test_quick_run_writes_the_three_files_with_checked_features(tmp_path, capsys):
    assert BENCHMARKS["pipeline"] == "gdacil.bench.pipeline"
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    assert all((tmp_path / name).stat().st_size > 0 for name in FILES)
    payload = json.loads((tmp_path / "pipeline.json").read_text())
    assert set(payload) == {"config", "machine", "image_source", "models", "overhead", "claims"}
    assert payload["machine"]["torch_threads"] == 1 and "load_average_before" in payload["machine"]
    models = {m["model"]: m for m in payload["models"]}
    assert set(models) == {"tiny-vit", "efficientnet-lite0", "tiny-bert"}
    for m in models.values():
        assert [r["precision"] for r in m["extraction"]] == ["fp32", "bf16"]
        for r in m["extraction"]:
            assert [p["workers"] for p in r["pipeline"]] == [0, 1]
            for p in r["pipeline"]:
                assert math.isfinite(p["fraction"]) and p["fraction"] > 0
            assert r["check"]["workers_equal"] and r["check"]["equal_to_extract"]
            assert r["check"]["max_abs_diff_to_extract"] < 1e-3  # text: other batches, round-off
    assert models["efficientnet-lite0"]["training"] == []  # no transformer MLP for SeqFT
    for name in ("tiny-vit", "tiny-bert"):
        rows = models[name]["training"]
        assert [r["precision"] for r in rows] == ["fp32", "bf16"]
        for r in rows:
            assert r["steps"] == 2 and r["samples"] == 8
            assert math.isfinite(r["pipeline"]["fraction"]) and r["pipeline"]["fraction"] > 0
    (run,) = payload["overhead"]
    assert [t["task"] for t in run["tasks"]] == [0, 1, 2, 3]
    for t in run["tasks"]:
        assert t["wall_s"] >= t["extraction_s"] > 0 and t["overhead_s"] > 0
        # the parts and the rest add up to the wall time, and no part is counted twice: the
        # runner's timed blocks lie inside its task_s, which with the checkpoint lies inside
        # the callback's wall time
        assert sum(t[k] for k in PARTS) + t["other_s"] == pytest.approx(t["wall_s"], abs=1e-9)
        assert sum(t[k] for k in PARTS if k != "checkpoint_s") <= t["task_s"]
        assert t["task_s"] + t["checkpoint_s"] <= t["wall_s"] and t["other_s"] >= 0
    assert run["tasks"][0]["compensate_s"] == 0  # no anchors from before the first task
    assert run["tasks"][1]["compensate_s"] > 0  # the alpha1-SLDC track from the second task
    assert run["parameters"] > 0 and run["uncached_hash_s"] > 0 and run["cached_hash_s"] > 0
    assert payload["claims"]["overhead_tiny-vit-images_fingerprint_uncached_s"] == (
        run["uncached_hash_s"])
    assert all(math.isfinite(v) and v > 0 for k, v in payload["claims"].items()
               if "fraction" in k or "speedup" in k)
    text = (tmp_path / "pipeline.md").read_text()
    assert "## Ratios from this run" in text and "| tiny-vit | fp32 |" in text
    assert "## Per-task time: tiny-vit-images" in text and "from scratch" in text
    capsys.readouterr()
    with pytest.raises(SystemExit):  # results are never replaced without --overwrite
        main(["--quick", "--out", str(tmp_path)])
    assert "pipeline.json exists; pass --overwrite" in capsys.readouterr().err


def test_default_output_and_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "default runs/bench/pipeline/" in " ".join(capsys.readouterr().out.split())


@needs_transformers
def test_the_bare_training_loop_runs_the_batches_seqft_draws(monkeypatch):
    import numpy as np

    from gdacil.adapt import build_strategy
    from gdacil.adapt.base import Strategy
    from gdacil.backbones import build_backbone
    from gdacil.bench.pipeline import _seqft_batches

    from _assets import TINY_VIT, random_images

    raws, labels, seen = random_images(11), np.arange(11) % 3, []
    inputs = Strategy._inputs
    monkeypatch.setattr(Strategy, "_inputs", lambda self, bb, batch, gen: (
        seen.append([next(k for k, r in enumerate(raws) if r is b) for b in batch]),
        inputs(self, bb, batch, gen))[1])
    bb = build_backbone("vit", config=TINY_VIT)
    build_strategy("seqft", train={"steps": 4, "batch_size": 4}).adapt_task(
        bb, 0, raws, labels, generator=7)
    assert seen == [i.tolist() for i in _seqft_batches(11, 4, 4, 3, bb.dim, 7)]


TIMING = {"task": 1, "anchors_before_s": 0.5, "adapt_s": 2.0, "features_s": 1.0,
          "stats_s": 0.125, "compensate_s": {"sldc": 0.25, "hopdc": 0.5},
          "heads": {"ncm": {"build_s": 0.25, "predict_s": 0.125, "bytes": 10},
                    "sldc/lda": {"build_s": 1.0, "predict_s": 0.25, "bytes": 20}},
          "test_features_s": 0.25, "task_s": 6.5, "checkpoint_s": 0.5, "stats_bytes": {},
          "max_rss_bytes": 1}


def test_a_task_is_split_with_the_runners_documented_timings():
    row = split_task(1, 8.0, TIMING)
    assert row == {"task": 1, "wall_s": 8.0, "task_s": 6.5, "extraction_s": 1.75, "adapt_s": 2.0,
                   "stats_s": 0.125, "compensate_s": 0.75, "heads_s": 1.25,
                   "evaluation_s": 0.375, "checkpoint_s": 0.5, "overhead_s": 4.25,
                   "other_s": 1.25}
    first = {k: v for k, v in TIMING.items() if k not in ("adapt_s", "compensate_s")}
    row = split_task(0, 8.0, first)  # a frozen backbone, no anchors from before
    assert row["adapt_s"] == row["compensate_s"] == 0
    assert sum(row[k] for k in PARTS) + row["other_s"] == 8.0


def test_the_task_clock_is_a_callback_that_only_reads():
    from gdacil.callbacks import Callback, CallbackList

    clock = TaskClock()
    timing = json.loads(json.dumps(TIMING))
    hooks = CallbackList([clock])  # refuses anything but a Callback
    hooks.on_task_start(0, 1, {})
    hooks.on_task_end(0, 1, timing, {})
    assert isinstance(clock, Callback) and timing == TIMING  # unchanged
    (row,) = clock.rows
    assert row == split_task(1, row["wall_s"], TIMING) and row["wall_s"] >= 0
