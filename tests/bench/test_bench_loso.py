"""Leave-one-set-out choice of LR-RGDA's constants: the refits at grid points equal fresh fits,
the choice never sees the held-out set, cells are stored and reused, and the table reports it."""

import itertools
import json

import numpy as np
import pytest
import torch

from gdacil.bench import featuresets, heads, incremental, loso
from gdacil.bench.featuresets import FeatureSet, split
from gdacil.heads import LRRGDA
from gdacil.stats import ClassGaussians


def blobs(seed, n_classes=5, per_class=24, d=10):
    g = torch.Generator().manual_seed(seed)
    y = np.repeat(np.arange(n_classes), per_class)
    scale = torch.rand(n_classes, 1, d, generator=g, dtype=torch.float64) * 2 + 0.2
    X = (torch.randn(len(y), d, generator=g, dtype=torch.float64) * scale[y, 0]
         + 1.5 * torch.randn(n_classes, d, generator=g, dtype=torch.float64)[y])
    return X, y


def test_refitting_one_head_across_the_grid_equals_a_fresh_head_per_point():
    X, y = blobs(0)
    train, test = split(y, 1 / 3, seed=0)
    points = loso.grid_points({"alpha1": (0.05, 0.4), "alpha2": (0.5, 4.0), "alpha3": (0.1, 3.0)})
    make = lambda: LRRGDA(rank=3)  # noqa: E731
    accs = loso.measure_cell(X, y, train, test, points, make)
    stats = ClassGaussians(X.shape[1]).update(X[train], torch.from_numpy(y[train]))
    fresh = [100 * float((LRRGDA(rank=3, **p).fit(stats).predict(X[test])
                          == torch.from_numpy(y[test])).double().mean()) for p in points]
    assert accs == fresh
    assert len(set(accs)) > 1  # the grid matters on these blobs, so a stale refit would show


def test_grid_holds_the_default_and_every_combination():
    points = loso.grid_points()
    assert len(points) == np.prod([len(v) for v in loso.GRID.values()])
    default = {k: getattr(LRRGDA(), k) for k in loso.GRID}
    assert default in points
    assert len({tuple(p.values()) for p in points}) == len(points)


def test_leave_one_set_out_never_looks_at_the_held_out_set():
    rng = np.random.default_rng(0)
    scores = {s: rng.uniform(50, 90, size=7) for s in "abcde"}
    chosen = loso.leave_one_set_out(scores)
    for s in scores:  # brute force: the best mean over the other sets
        others = [t for t in scores if t != s]
        means = [np.mean([scores[t][i] for t in others]) for i in range(7)]
        assert chosen[s] == int(np.argmax(means))
        changed = dict(scores, **{s: scores[s] + 100 * np.eye(7)[(chosen[s] + 1) % 7]})
        assert loso.leave_one_set_out(changed)[s] == chosen[s]


@pytest.fixture
def three_sets(monkeypatch):
    data = {f"s{i}": blobs(i) for i in range(3)}
    monkeypatch.setattr(featuresets, "load_features", lambda name: (data[name][0].float(),
                                                                    data[name][1]))
    for name in data:
        monkeypatch.setitem(featuresets.FEATURE_SETS, name, FeatureSet(name, "none", per_class=24))
        monkeypatch.setitem(incremental.TASKS, name, 2)
    return data


GRID = {"alpha1": (0.05, 0.4), "alpha2": (2.0,), "alpha3": (0.6, 3.0)}


def test_run_stores_cells_reuses_them_and_reports_each_set_held_out(three_sets, tmp_path,
                                                                     monkeypatch):
    calls = []
    real = loso.measure_cell
    monkeypatch.setattr(loso, "measure_cell", lambda *a: calls.append(a) or real(*a))
    make = lambda: LRRGDA(rank=3, alpha1=0.4, alpha3=3.0)  # noqa: E731
    result = loso.run(list(three_sets), ["raw", "l2"], [0, 1], grid=GRID,
                      runs_dir=tmp_path, make_head=make, log=lambda _: None)
    assert len(calls) == 3 * 2 * 2
    again = loso.run(list(three_sets), ["raw", "l2"], [0, 1], grid=GRID,
                     runs_dir=tmp_path, make_head=make, log=lambda _: None)
    assert len(calls) == 12 and again == result
    stored = json.loads((tmp_path / "s1-l2-0.json").read_text())
    assert repr(make().set_params(alpha1=0.05, alpha2=2.0, alpha3=0.6)) in stored

    points = loso.grid_points(GRID)
    assert result["default"] == {"alpha1": 0.4, "alpha2": 2.0, "alpha3": 3.0}
    per_set = {}
    for name, (X, y) in three_sets.items():  # each set's mean over scalings and seeds, by hand
        accs = []
        for scaling, seed in itertools.product(["raw", "l2"], [0, 1]):
            Xs = featuresets.scale_features(X.float().double(), scaling)
            train, test = split(y, 1 / 3, seed)
            accs.append(real(Xs, y, train, test, points, make))
        per_set[name] = np.mean(accs, axis=0)
    for name, entry in result["sets"].items():
        others = [t for t in per_set if t != name]
        i = int(np.argmax(np.mean([per_set[t] for t in others], axis=0)))
        assert entry["chosen"] == points[i]
        assert entry["last_acc"] == pytest.approx(per_set[name][i])
        assert entry["default_last_acc"] == pytest.approx(per_set[name][points.index(result["default"])])
        assert entry["oracle_last_acc"] == pytest.approx(per_set[name].max())

    cells = [{"features": c["features"], "scaling": c["scaling"],
              "heads": {"lr_rgda": {"last_acc": 0.0, "inc_acc": 0.0, "fit_s": 1.0,
                                    "predict_per_s": 1.0, "peak_mib": 1.0},
                        "ranpac": {"last_acc": 50.0, "inc_acc": 0.0, "fit_s": 1.0,
                                   "predict_per_s": 1.0, "peak_mib": 1.0}}}
             for c in result["cells"]]
    payload = {"cells": cells, "seeds": [0, 1], "tasks": {}, "default_head": "lr_rgda",
               "leave_one_set_out": result}
    text = heads.render(payload)
    first = result["cells"][0]
    assert "## Leave one set out" in text
    assert (f"| s0 | raw | {loso.point_name(result['sets']['s0']['chosen'])} | "
            f"{first['last_acc']:.2f} | {first['default_last_acc']:.2f} | 50.00 | "
            f"{first['last_acc'] - 50:+.2f} |") in text


def test_table_says_so_when_the_defaults_are_not_a_grid_point(three_sets, tmp_path):
    make = lambda: LRRGDA(rank=3, alpha1=0.3)  # noqa: E731  (0.3 is not in GRID)
    result = loso.run(list(three_sets), ["raw"], [0], grid=GRID, runs_dir=tmp_path,
                      make_head=make, log=lambda _: None)
    assert result["sets"]["s0"]["default_last_acc"] is None
    row = {"last_acc": 0.0, "inc_acc": 0.0, "fit_s": 1.0, "predict_per_s": 1.0, "peak_mib": 1.0}
    cells = [{"features": c["features"], "scaling": c["scaling"], "heads": {"lr_rgda": row}}
             for c in result["cells"]]
    text = heads.render({"cells": cells, "seeds": [0], "tasks": {}, "default_head": "lr_rgda",
                         "leave_one_set_out": result})
    assert f"| s1 | raw | {loso.point_name(result['sets']['s1']['chosen'])} | " in text
    assert "| **mean** |" in text and "| - |" in text
