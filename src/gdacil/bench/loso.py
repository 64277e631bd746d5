"""Leave-one-set-out choice of LR-RGDA's constants: each feature set scored with the constants
chosen on the others.

A default fitted on the sets it is reported on flatters itself. Here every point of a grid of
``(alpha1, alpha2, alpha3)`` is measured on every (feature set, scaling, seed) cell, and for each
set the point with the best mean Last-Acc over the *other* sets (each set weighted equally: the
mean over its scalings and seeds) is applied to it. The held-out set's Last-Acc with that point
is what a user with data like none of the others would get from constants tuned the way gdacil's
are. The point chosen on all sets, and each set's own best point (an oracle no user has), are
reported beside it.

Each cell fits one :class:`~gdacil.ClassGaussians` of the training split of all classes and one
head, refitted at every grid point: the eigenpairs of the class covariances do not depend on the
alphas, so the head reuses them and only the terms that depend on them are rebuilt. A Gaussian
head rebuilt from its statistics after every task ends where a fit on all classes at once does,
so this Last-Acc is the class-incremental one of :mod:`gdacil.bench.incremental`.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch

__all__ = ["GRID", "choose", "grid_points", "leave_one_set_out", "measure_cell", "run"]

#: The constants tried (gdacil's default, (0.1, 2, 0.6), is one of the points)
GRID: dict[str, tuple[float, ...]] = {"alpha1": (0.05, 0.1, 0.2), "alpha2": (1.0, 2.0, 4.0),
                                      "alpha3": (0.3, 0.6, 1.2, 2.4)}
#: Subdirectory of the benchmark's output keeping every measured (cell, point)
RUNS_DIR = "loso_runs"


def grid_points(grid: dict[str, tuple[float, ...]] = GRID) -> list[dict[str, float]]:
    """Every combination of the grid's values, as keyword arguments of the head."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def point_name(point: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in point.items())


def measure_cell(X: torch.Tensor, y: np.ndarray, train: np.ndarray, test: np.ndarray,
                 points: list[dict[str, float]], make_head) -> list[float]:
    """Last-Acc (%) of ``make_head()`` with every point's parameters, fitted on ``train``."""
    from ..stats import ClassGaussians

    stats = ClassGaussians(X.shape[1]).update(X[train], torch.from_numpy(y[train]))
    head, y_test = make_head(), torch.from_numpy(y[test])
    return [100.0 * float((head.set_params(**p).fit(stats).predict(X[test]) == y_test)
                          .double().mean()) for p in points]


def choose(scores: dict[str, np.ndarray], sets) -> int:
    """The grid point with the best mean over ``sets`` of their scores (first on ties)."""
    return int(np.argmax(np.mean([scores[s] for s in sets], axis=0)))


def leave_one_set_out(scores: dict[str, np.ndarray]) -> dict[str, int]:
    """Per set: the point :func:`choose` picks from all the other sets."""
    return {s: choose(scores, [t for t in scores if t != s]) for s in scores}


def run(feature_sets, scalings, seeds, *, grid=None, runs_dir=None, make_head=None,
        log=print) -> dict:
    """Measure ``grid`` (default :data:`GRID`) on every cell and choose the constants by
    leave-one-set-out.

    With ``runs_dir``, each cell's scores are kept in ``<features>-<scaling>-<seed>.json``, keyed
    by the head's ``repr`` at each point, and read back instead of measured again.
    """
    from ..heads import LRRGDA
    from ..io import atomic_write_text
    from .featuresets import FEATURE_SETS, load_features, scale_features, split

    make_head, grid = make_head or LRRGDA, grid or GRID
    points = grid_points(grid)
    keys = [repr(make_head().set_params(**p)) for p in points]
    default = {k: getattr(make_head(), k) for k in grid}
    per_cell: dict[tuple[str, str], np.ndarray] = {}
    for name in feature_sets:
        X_raw, y = load_features(name)
        for scaling in scalings:
            X = scale_features(X_raw.double(), scaling)
            accs = []
            for seed in seeds:
                path = Path(runs_dir) / f"{name}-{scaling}-{seed}.json" if runs_dir else None
                done = json.loads(path.read_text()) if path is not None and path.exists() else {}
                if not all(k in done for k in keys):
                    train, test = split(y, FEATURE_SETS[name].test_fraction, seed)
                    done.update(zip(keys, measure_cell(X, y, train, test, points, make_head)))
                    if path is not None:  # the write creates the folder
                        atomic_write_text(path, json.dumps(done, indent=1, sort_keys=True) + "\n")
                accs.append([done[k] for k in keys])
            per_cell[name, scaling] = np.mean(accs, axis=0)
            log(f"loso grid {name} {scaling}: best {per_cell[name, scaling].max():.2f}")
    scores = {s: np.mean([per_cell[s, sc] for sc in scalings], axis=0) for s in feature_sets}
    held_out = leave_one_set_out(scores)
    d = points.index(default) if default in points else None
    return {
        "grid": {k: list(v) for k, v in grid.items()}, "default": default,
        "chosen_on_all": points[choose(scores, feature_sets)],
        "criterion": "mean Last-Acc over the other sets, each set the mean over its scalings "
                     "and seeds",
        "sets": {s: {"chosen": points[i], "last_acc": float(scores[s][i]),
                     "default_last_acc": None if d is None else float(scores[s][d]),
                     "oracle": points[int(np.argmax(scores[s]))],
                     "oracle_last_acc": float(scores[s].max())}
                 for s, i in held_out.items()},
        "cells": [{"features": s, "scaling": sc, "last_acc": float(per_cell[s, sc][held_out[s]]),
                   "default_last_acc": None if d is None else float(per_cell[s, sc][d])}
                  for s in feature_sets for sc in scalings],
    }
