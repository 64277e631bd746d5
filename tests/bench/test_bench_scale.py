"""The scale benchmark: synthetic classes, one quick cell in process and one in a worker."""

import json

import pytest
import torch

from gdacil.bench import scale as bench


def test_synthetic_classes_are_seeded_per_class_and_follow_their_model():
    classes = bench.SyntheticClasses(bench.QUICK)
    means, covs = classes.moments([3, 7])
    again, _ = classes.moments([7])
    assert torch.equal(means[1], again[0])  # a class does not depend on its block
    d = bench.QUICK.dim
    expected_trace = float(classes.spectrum.sum()) + d * bench.QUICK.noise_variance
    torch.testing.assert_close(covs.diagonal(dim1=1, dim2=2).sum(1),
                               torch.full((2,), expected_trace, dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    X = classes.sample(torch.full((4000,), 3), g)
    torch.testing.assert_close(X.mean(0), means[0], atol=0.05, rtol=0)
    torch.testing.assert_close(torch.cov(X.T), covs[0], atol=0.05, rtol=0)


def test_quick_inline_run_reports_every_figure(tmp_path):
    assert bench.main(["--quick", "--inline", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "scale.json").read_text())
    rows = payload["results"]
    assert [r["classes"] for r in rows] == list(bench.QUICK.classes)
    for r in rows:
        assert "error" not in r
        # exact pruning for the argmax and the top-k, with the head's own and a lowered screening
        assert [(p["k"], p["screen_dtype"]) for p in r["pruned"]] == [
            (k, screen) for k in (1, bench.QUICK.topk) for screen in ("bfloat16", "float32")]
        for p in r["pruned"]:
            assert p["equal_to_dense"], p
            assert 0 < p["pairs_scored_fraction"] <= 1
        # the default path: below 1,000 classes "auto" and predict score densely, exactly
        assert [(a["k"], a["mode"]) for a in r["auto"]] == [(1, "dense"), (bench.QUICK.topk, "dense")]
        assert all(a["equal_to_dense"] for a in r["auto"]) and r["predict"]["equal_to_dense"]
        assert r["predict"]["speedup"] > 0
        assert r["build_s"] == pytest.approx(r["compress_s"] + r["fit_s"])
        assert r["generate_s"] > 0 and set(r["per_class_s"]) == {
            "validate", "convert", "decompose", "orthonormalize"}
        assert r["decomposed_on_refit"] == 0  # the stored eigenpairs are reused
        d, q = bench.QUICK.dim, bench.QUICK.rank
        assert r["stats_bytes"] >= r["classes"] * d * q * 4
        assert r["peer_dense_fp32_bytes"] == r["classes"] * d * d * 4
    # the float32 build makes the float64 build's decisions
    (checked,) = [r for r in rows if "against_float64" in r]
    assert checked["classes"] == 60 and checked["against_float64"]["topk_entries_differ"] == 0
    assert checked["against_float64"]["max_relative_score_difference"] < 1e-4
    md = (tmp_path / "scale.md").read_text()
    assert "Decisions against the same classes compressed in float64" in md
    # the projection scales the largest cell linearly
    last = rows[-1]
    far = bench.projection(last, 10 * last["classes"])
    assert far["build_s"] == pytest.approx(10 * last["build_s"])
    assert far["dense_throughput"] == pytest.approx(last["dense_throughput"] / 10)
    assert "## Projected from C = 120" in md and "| 1,000,000 |" in md
    assert "python -m gdacil bench scale --quick --inline" in md
    assert "## The default path against dense" in md and "| 60 | predict | dense |" in md
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_a_cell_runs_in_its_own_process_and_builds_in_two():
    cfg = bench.ScaleBenchConfig(**{**bench.asdict(bench.QUICK), "classes": (30,),
                                    "processes": 2, "reference_classes": (30,)})
    (row,) = bench.run(cfg, log=lambda _: None)["results"]
    assert "error" not in row, row
    assert row["classes"] == 30 and row["peak_rss_bytes"] > 0
    # the workers draw their own classes and time it: the build is the wall time less that
    assert 0 < row["generate_s"] < row["build_wall_s"]
    assert row["compress_s"] > 0
    assert row["build_wall_s"] == pytest.approx(row["build_s"] + row["generate_s"])
    assert row["against_float64"]["topk_entries_differ"] == 0
    # the float64 check runs after the float32 model is freed, and its peak is kept apart
    assert row["reference_peak_rss_bytes"] >= row["peak_rss_bytes"] > 0
