"""``gdacil bench pipeline --quick``: the three files, the documented keys, sane ratios, and the
pipeline's features equal to ``Backbone.extract``."""

import json
import math

import pytest

from gdacil.bench import BENCHMARKS
from gdacil.bench.pipeline import main

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
    assert set(payload) == {"config", "machine", "image_source", "models", "overhead", "claims",
                            "done_when"}
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
        assert t["wall_s"] >= t["extraction_s"] > 0 and t["fingerprint_calls"] >= 2
        assert t["overhead_s"] > 0 and math.isfinite(t["other_s"])
    assert run["tasks"][1]["compensate_s"] > 0  # the alpha1-SLDC track from the second task
    assert all(math.isfinite(v) and v > 0 for k, v in payload["claims"].items()
               if "fraction" in k or "speedup" in k)
    text = (tmp_path / "pipeline.md").read_text()
    assert "## Ratios from this run" in text and "| tiny-vit | fp32 |" in text
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
