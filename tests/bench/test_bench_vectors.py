"""``gdacil bench vectors`` at a tiny size: the three engines' statistics agree, the report and
JSON are written, and every learn is measured."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("pyarrow")


def test_bench_vectors_tiny(tmp_path, capsys):
    from gdacil.bench.vectors import main

    assert main(["--classes", "6", "--per-class", "200", "--block-classes", "3", "--dim", "8",
                 "--learn-sizes", "400", "800", "--learn-classes", "4", "--out",
                 str(tmp_path), "--machine", "test"]) == 0
    payload = json.loads((tmp_path / "vectors.json").read_text())
    engines = payload["engines"]
    assert engines["vectors"] == 1200 and engines["files"] == 2
    assert max(engines["max_relative_difference_vs_one"].values()) < 1e-10
    assert [r["vectors"] for r in payload["learns"]] == [400, 800]
    assert all(r["peak_rss_mib"] > 0 and r["seconds"] > 0 for r in payload["learns"])
    assert "| torchrun |" in (tmp_path / "vectors.md").read_text()
