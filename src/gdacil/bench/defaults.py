"""Class-incremental accuracy of every head with its defaults, on real features in three scalings.

For each feature set of :mod:`gdacil.bench.featuresets` (MiniLM on WordNet hypernyms and
supersenses, EfficientNet-Lite0 on openclipart and Fashion-MNIST), each scaling (raw, non-affine
LayerNorm, L2) and each seed, the seed draws a class order and a train/test split of every class;
the classes arrive in equal tasks, the statistics take each task's training features, every head
is rebuilt and scored on the test samples of all classes seen so far. The backbone is frozen, so
this measures the heads alone. Last-Acc is the accuracy after the final task, Inc-Acc the mean
over tasks. The paper's absolute regularisation runs beside gdacil's defaults (``*_paper``).

Regenerate: ``python -m gdacil bench defaults --out benchmarks`` (writes ``defaults.json`` and
``defaults.md``; committed results are overwritten only with ``--overwrite``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from ..stats import ClassGaussians
from .common import machine_info, markdown_table, write_json
from .featuresets import FEATURE_SETS, SCALINGS, load_features, scale_features, split

__all__ = ["HEAD_FACTORIES", "TASKS", "run_cell", "run", "render", "main"]

#: Tasks per feature set (classes are dealt out in class order, the first tasks take the extra ones)
TASKS = {"wordnet-hypernym": 10, "wordnet-supersense": 8, "openclipart": 4, "fashion-mnist": 5}


def _heads():
    from ..heads import LDA, LRRGDA, NCM, QDA, RGDA, SGDHead

    return {
        "ncm": NCM,
        "lda": LDA,
        "qda": QDA,
        "rgda": RGDA,
        "lr_rgda": LRRGDA,
        "sgd": SGDHead,
        "lda_paper": LDA.paper,
        "rgda_paper": RGDA.paper,
        "lr_rgda_paper": LRRGDA.paper,
    }


HEAD_FACTORIES = tuple(_heads())


def task_classes(classes: np.ndarray, n_tasks: int, seed: int) -> list[np.ndarray]:
    """The seed's class order cut into ``n_tasks`` tasks."""
    order = np.random.default_rng([seed, 0]).permutation(classes)
    return [t for t in np.array_split(order, n_tasks) if len(t)]


def run_cell(X: torch.Tensor, y: np.ndarray, *, n_tasks: int, test_fraction: float, seed: int,
             heads: list[str]) -> dict:
    """Last-Acc, Inc-Acc (percent) and build seconds of every head on one (features, seed)."""
    factories = _heads()
    train, test = split(y, test_fraction, seed)
    stats = ClassGaussians(X.shape[1])
    built = {name: factories[name]() for name in heads}
    accs = {name: [] for name in heads}
    fit_s = dict.fromkeys(heads, 0.0)
    seen: list[int] = []
    for classes in task_classes(np.unique(y), n_tasks, seed):
        rows = train[np.isin(y[train], classes)]
        stats.update(X[rows], torch.from_numpy(y[rows]))
        seen.extend(classes.tolist())
        rows = test[np.isin(y[test], seen)]
        X_test, y_test = X[rows], torch.from_numpy(y[rows])
        for name, head in built.items():
            start = time.perf_counter()
            head.fit(stats)
            fit_s[name] += time.perf_counter() - start
            accs[name].append(100.0 * float((head.predict(X_test) == y_test).double().mean()))
    return {name: {"last_acc": a[-1], "inc_acc": float(np.mean(a)), "fit_s": fit_s[name]}
            for name, a in accs.items()}


def run(feature_sets, scalings, seeds, heads, *, log=print) -> dict:
    cells = []
    for name in feature_sets:
        X_raw, y = load_features(name)
        for scaling in scalings:
            X = scale_features(X_raw.double(), scaling)
            per_seed = [run_cell(X, y, n_tasks=TASKS[name], seed=seed, heads=heads,
                                 test_fraction=FEATURE_SETS[name].test_fraction) for seed in seeds]
            summary = {h: {k: float(np.mean([r[h][k] for r in per_seed])) for k in per_seed[0][h]}
                       for h in heads}
            cells.append({"features": name, "scaling": scaling, "heads": summary,
                          "seeds": {str(s): r for s, r in zip(seeds, per_seed)}})
            log(f"{name} {scaling}: " + ", ".join(f"{h} {v['last_acc']:.2f}"
                                                  for h, v in summary.items()))
    return {"benchmark": "defaults", "default_head": "lr_rgda", "seeds": list(seeds),
            "tasks": {n: TASKS[n] for n in feature_sets}, "machine": machine_info(),
            "cells": cells}


def render(payload: dict) -> str:
    heads = list(payload["cells"][0]["heads"])
    lines = ["# Every head with its defaults, class-incremental, frozen features", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"Seeds {payload['seeds']}; tasks per set {payload['tasks']}. "
             "Last-Acc (%), mean over seeds.", ""]
    rows = [[c["features"], c["scaling"], *(f"{c['heads'][h]['last_acc']:.2f}" for h in heads)]
            for c in payload["cells"]]
    lines.append(markdown_table(["features", "scaling", *heads], rows))
    lines += ["", "Inc-Acc (%), mean over seeds.", ""]
    rows = [[c["features"], c["scaling"], *(f"{c['heads'][h]['inc_acc']:.2f}" for h in heads)]
            for c in payload["cells"]]
    lines.append(markdown_table(["features", "scaling", *heads], rows))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench defaults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", nargs="+", default=list(FEATURE_SETS), choices=FEATURE_SETS)
    parser.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--heads", nargs="+", default=list(HEAD_FACTORIES), choices=HEAD_FACTORIES)
    parser.add_argument("--out", type=Path, default=Path("benchmarks"),
                        help="directory for defaults.json and defaults.md (default benchmarks/)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results already in --out")
    args = parser.parse_args(argv)
    target = args.out / "defaults.json"
    if target.exists() and not args.overwrite:
        parser.error(f"{target} exists; pass --overwrite to replace it, or another --out")
    payload = run(args.features, args.scalings, args.seeds, args.heads,
                  log=lambda line: print(line, flush=True))
    write_json(target, payload)
    from ..io import atomic_write_text

    atomic_write_text(args.out / "defaults.md", render(payload))
    print(render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
