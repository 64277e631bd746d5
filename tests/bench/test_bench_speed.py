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
            assert row["roofline_fraction"] > 0
    assert len(payload["gemm_fp32"]["samples"]) == 3  # before, and after each class count
    inc = payload["incremental"]
    assert [i["decomposed_on_refit"] for i in inc] == [2, 2]
    json.dumps(payload)
    assert "| 12 | lr_rgda_r4 |" in render(payload)


def test_decomposition_benchmark_states_cost_and_error_of_each_method():
    import torch

    from gdacil.bench.decomposition import render, run, spectra

    plateau = torch.linalg.eigvalsh(spectra("plateau", 80, 1, rank=8))[0].flip(0)
    assert 0 < (plateau[7] - plateau[8]) / plateau[7] < 1e-2   # nearly equal around the rank
    payload = run(dims=(80,), n_classes=3, rank=8)
    for row in payload["results"]:
        assert row["max_model_error"]["checked"] < 1e-8
        assert all(t > 0 for t in row["ms_per_class"].values())
    worst = max(r["max_model_error"]["unchecked"] for r in payload["results"])
    assert worst > 1e-3   # what the check is for
    assert "| 80 | plateau |" in render(payload)
