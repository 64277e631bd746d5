"""The drift benchmark: a quick in-process run, and one cell in its own process."""

import json

import pytest

from gdacil.bench import drift as bench


def test_quick_inline_run_writes_json_and_markdown(tmp_path):
    assert bench.main(["--quick", "--inline", "--out", str(tmp_path)]) == 0
    payload = json.loads((tmp_path / "drift.json").read_text())
    rows = payload["results"]
    assert [r["compensator"] for r in rows] == list(bench.QUICK.compensators)
    for r in rows:
        assert "error" not in r
        assert r["total_s"] == pytest.approx(r["fit_s"] + r["transform_s"])
        assert r["peak_mib"] >= 0 and r["stats_mib"] > 0 and r["cpu_s"] >= 0
        assert (r["classes"], r["anchors"], r["dim"]) == (6, 64, 32)
    hop = next(r for r in rows if r["compensator"] == "hopdc")
    assert hop["config"] == {"n_samples": 64, "topk": 64}  # k clamped to N
    md = (tmp_path / "drift.md").read_text()
    assert "gdacil bench drift --quick --inline" in md
    assert "| hopdc | 6 | 64 | 64 | 64 |" in md


def test_isolated_cell_and_overrides(tmp_path):
    cfg = bench.DriftBenchConfig(classes=(3,), anchors=(16,), dim=8,
                                 compensators=("identity",), overrides={"3": {"hopdc_samples": 9}})
    assert bench.compensator_config("hopdc", cfg, 3, 16) == {"n_samples": 9, "topk": 16}
    assert bench.compensator_config("hopdc", cfg, 4, 500)["n_samples"] == cfg.hopdc_samples
    payload = bench.run(cfg, log=lambda line: None)
    (row,) = payload["results"]
    assert "error" not in row, row
    assert row["memory_method"].startswith(("rss high-water mark reset", "process rss"))
    with pytest.raises(SystemExit):
        bench.main(["--override", "3:tau=1", "--out", str(tmp_path)])
