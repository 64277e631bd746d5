"""The class-incremental protocol shared by ``bench defaults`` and ``bench heads``: streaming heads
against a direct fit, resumable runs keyed by the head's configuration, memory sampling, tables."""

import json

import numpy as np
import pytest
import torch

from gdacil.bench import featuresets, heads, incremental
from gdacil.bench.featuresets import FeatureSet, split
from gdacil.bench.incremental import HeadEntry, PeakRSS, run_cell, run_cells
from gdacil.heads import RBFLDA, RanPAC


def blobs(seed=0, n_classes=6, per_class=30, d=8):
    g = torch.Generator().manual_seed(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    X = torch.randn(len(y), d, generator=g, dtype=torch.float64) + 2.0 * torch.randn(
        n_classes, d, generator=g, dtype=torch.float64)[torch.from_numpy(y)]
    return X, y


@pytest.mark.parametrize("make", [lambda: RanPAC(dim_out=40, lam=0.5), lambda: RBFLDA(dim_out=60)])
def test_streaming_heads_after_the_last_task_equal_a_direct_fit(make):
    X, y = blobs()
    cell = run_cell(X, y, n_tasks=3, test_fraction=1 / 3, seed=4,
                    heads={"h": HeadEntry(make, streaming=True)})["h"]
    train, test = split(y, 1 / 3, seed=4)
    direct = 100 * make().fit(X[train], torch.from_numpy(y[train])).score(X[test], y[test])
    assert cell["last_acc"] == pytest.approx(direct, abs=1e-9)
    assert cell["fit_s"] > 0 and cell["predict_per_s"] > 0 and cell["peak_mib"] >= 0


@pytest.fixture
def tiny_feature_set(monkeypatch):
    X, y = blobs(n_classes=4, per_class=12)
    monkeypatch.setattr(featuresets, "load_features", lambda name: (X.float(), y))
    monkeypatch.setitem(featuresets.FEATURE_SETS, "tiny", FeatureSet("tiny", "none", per_class=12))
    monkeypatch.setitem(incremental.TASKS, "tiny", 2)
    return X, y


def test_runs_are_stored_reused_and_remeasured_when_the_head_changes(tiny_feature_set, tmp_path,
                                                                     monkeypatch):
    from gdacil.heads import LDA, NCM

    calls = []
    real = incremental.run_head
    monkeypatch.setattr(incremental, "run_head",
                        lambda entry, **kw: calls.append(entry) or real(entry, **kw))
    entries = {"ncm": HeadEntry(NCM), "lda": HeadEntry(LDA)}
    first = run_cells(["tiny"], ["raw"], [0, 1], entries, runs_dir=tmp_path, log=lambda _: None)
    assert len(calls) == 4
    stored = json.loads((tmp_path / "tiny-raw-1.json").read_text())
    assert stored["lda"]["head"] == repr(LDA()) and set(stored) == {"ncm", "lda"}
    again = run_cells(["tiny"], ["raw"], [0, 1], entries, runs_dir=tmp_path, log=lambda _: None)
    assert len(calls) == 4 and again == first
    changed = {"ncm": HeadEntry(NCM), "lda": HeadEntry(lambda: LDA(shrinkage=0.9))}
    run_cells(["tiny"], ["raw"], [0, 1], changed, runs_dir=tmp_path, log=lambda _: None)
    assert len(calls) == 6  # only the changed head, once per seed
    cell = first[0]
    assert cell["heads"]["ncm"]["last_acc"] == pytest.approx(
        np.mean([cell["seeds"][s]["ncm"]["last_acc"] for s in ("0", "1")]))


def test_peak_memory_sees_a_transient_allocation():
    with PeakRSS() as m:
        block = torch.ones(12_500_000, dtype=torch.float64)  # 95.4 MiB
        block.add_(1.0)
        del block
    assert 0.9 * 95.4 < m.peak_bytes / 2**20 < 95.4 + 64


def test_table_states_each_heads_worst_gap_to_the_best_anchor(tmp_path):
    def cell(default, ranpac, fecam):
        row = {"last_acc": 0.0, "inc_acc": 0.0, "fit_s": 1.0, "predict_per_s": 1.0, "peak_mib": 1.0}
        return {"features": "f", "scaling": "raw",
                "heads": {"lr_rgda": {**row, "last_acc": default},
                          "ranpac": {**row, "last_acc": ranpac},
                          "fecam": {**row, "last_acc": fecam}}}

    payload = {"cells": [cell(70.0, 69.0, 71.0), cell(60.0, 60.5, 50.0)], "seeds": [0],
               "tasks": {}, "default_head": "lr_rgda"}
    overall = heads._overall(payload, ["lr_rgda", "ranpac", "fecam"])
    assert overall["lr_rgda"]["worst_gap"] == pytest.approx(-1.0)
    assert overall["ranpac"]["worst_gap"] == pytest.approx(-2.0)
    assert overall["lr_rgda"]["last_acc"] == pytest.approx(65.0)
    assert "| lr_rgda | 65.00 | -1.00 | 1.00 |" in heads.render(payload)
    heads.plot(payload, tmp_path / "anchors.png")
    assert (tmp_path / "anchors.png").stat().st_size > 0


def test_every_anchor_is_named_for_the_schema():
    names = heads.head_entries()
    for part in ("ranpac", "fecam", "acil", "rbf_lda"):
        assert any(part in a and names[a].streaming for a in heads.ANCHORS)
    assert heads.DEFAULT_HEAD in names and not names[heads.DEFAULT_HEAD].streaming
