import json

from gdacil.bench.speed import HeadsBenchConfig, render, run


def test_heads_benchmark_runs_and_reports_every_head(tmp_path):
    cfg = HeadsBenchConfig(classes=(6, 12), dim=16, ranks=(2, 4), batch=32, samples_per_class=20,
                           spectrum_rank=6, added_classes=2,
                           heads=("ncm", "lda", "rgda", "sklearn_qda", "lr_rgda"))
    payload = run(cfg, log=lambda *_: None)
    heads = {r["head"] for r in payload["results"]}
    assert heads == {"ncm", "lda", "rgda", "sklearn_qda", "lr_rgda_r2", "lr_rgda_r4"}
    for row in payload["results"]:
        assert row["throughput"] > 0 and row["build_s"] >= 0
        if row["head"].startswith("lr_rgda"):
            assert row["flops_per_sample"] == 2 * 16 * row["classes"] * (int(row["head"][9:]) + 1)
            assert 0 < row["roofline_fraction"]
    assert len(payload["gemm_fp32"]["samples"]) == 3  # before, and after each class count
    inc = payload["incremental"]
    assert [i["decomposed_on_refit"] for i in inc] == [2, 2]
    json.dumps(payload)
    assert "| 12 | lr_rgda_r4 |" in render(payload)
