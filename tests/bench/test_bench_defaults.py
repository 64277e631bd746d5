"""The defaults benchmark: its splits, task order and scalings, and one cell against a direct fit."""

import numpy as np
import torch

from gdacil import ClassGaussians
from gdacil.bench.defaults import head_entries
from gdacil.bench.featuresets import scale_features, split
from gdacil.bench.incremental import run_cell, task_classes
from gdacil.heads import LRRGDA, NCM


def blobs(seed=0, n_classes=6, per_class=30, d=8):
    g = torch.Generator().manual_seed(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    X = torch.randn(len(y), d, generator=g, dtype=torch.float64) + 2.0 * torch.randn(
        n_classes, d, generator=g, dtype=torch.float64)[torch.from_numpy(y)]
    return X, y


def test_split_is_seeded_disjoint_and_per_class():
    _, y = blobs()
    train, test = split(y, 1 / 3, seed=5)
    assert not set(train) & set(test) and len(train) + len(test) == len(y)
    assert all((y[test] == c).sum() == 10 for c in range(6))
    again = split(y, 1 / 3, seed=5)
    assert np.array_equal(again[0], train) and not np.array_equal(split(y, 1 / 3, 6)[0], train)


def test_tasks_deal_out_every_class_once():
    tasks = task_classes(np.arange(10), 4, seed=1)
    assert [len(t) for t in tasks] == [3, 3, 2, 2]
    assert sorted(np.concatenate(tasks).tolist()) == list(range(10))


def test_scalings_are_exact():
    X, _ = blobs()
    ln = scale_features(X, "ln")
    assert torch.allclose(ln.mean(1), torch.zeros(len(X), dtype=X.dtype), atol=1e-12)
    assert torch.allclose(scale_features(X, "l2").norm(dim=1), torch.ones(len(X), dtype=X.dtype))
    assert torch.equal(scale_features(X, "raw"), X)


def test_last_acc_equals_a_direct_fit_on_all_classes():
    X, y = blobs()
    cell = run_cell(X, y, n_tasks=3, test_fraction=1 / 3, seed=2,
                    heads={name: head_entries()[name] for name in ("ncm", "lr_rgda")})
    train, test = split(y, 1 / 3, seed=2)
    stats = ClassGaussians(X.shape[1]).update(X[train], torch.from_numpy(y[train]))
    for name, head in (("ncm", NCM()), ("lr_rgda", LRRGDA())):
        direct = 100 * head.fit(stats).score(X[test], y[test])
        assert abs(cell[name]["last_acc"] - direct) < 1e-9
        assert 0 < cell[name]["inc_acc"] <= 100 and cell[name]["fit_s"] >= 0


def test_the_margin_table_takes_leads_per_seed_and_the_best_scaling():
    from gdacil.bench.defaults import margin_rows, render

    def seed(lr, lda, ncm):
        return {"lr_rgda": {"last_acc": lr, "inc_acc": lr}, "lda": {"last_acc": lda, "inc_acc": lda},
                "ncm": {"last_acc": ncm, "inc_acc": ncm}}

    def cell(scaling, seeds):
        heads = {h: {k: float(np.mean([s[h][k] for s in seeds])) for k in ("last_acc", "inc_acc")}
                 for h in seeds[0]}
        return {"features": "f", "scaling": scaling, "heads": heads,
                "seeds": {str(i): s for i, s in enumerate(seeds)}}

    payload = {"default_head": "lr_rgda", "seeds": [0, 1], "tasks": {"f": 2}, "cells": [
        cell("raw", [seed(80, 78, 70), seed(84, 81, 75)]),     # leads 2 and 3; mean 82
        cell("l2", [seed(83, 82, 71), seed(85, 84, 72)])]}     # leads 1 and 1; mean 84
    assert margin_rows(payload) == [
        ["f", "raw", "+2.50 (+2.00 to +3.00)", "+9.50 (+9.00 to +10.00)", "2.00"],
        ["f", "l2", "+1.00 (+1.00 to +1.00)", "+12.50 (+12.00 to +13.00)", "0.00"]]
    assert "| f | raw | +2.50 (+2.00 to +3.00) |" in render(payload)
