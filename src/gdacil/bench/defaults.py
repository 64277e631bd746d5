"""Class-incremental accuracy of every head with its defaults, on real features in three scalings.

For each feature set of :mod:`gdacil.bench.featuresets` (MiniLM on WordNet hypernyms and
supersenses, EfficientNet-Lite0 on openclipart and Fashion-MNIST), each scaling (raw, non-affine
LayerNorm, L2) and each seed, the seed draws a class order and a train/test split of every class;
the classes arrive in equal tasks, the statistics take each task's training features, every head
is rebuilt and scored on the test samples of all classes seen so far. The backbone is frozen, so
this measures the heads alone. Last-Acc is the accuracy after the final task, Inc-Acc the mean
over tasks. The absolute regularisation of the LR-RGDA paper [LR-RGDA] runs beside gdacil's
defaults (``*_paper``).

Regenerate: ``python -m gdacil bench defaults --out benchmarks --overwrite`` (writes
``defaults.json`` and ``defaults.md``, and one file per measured cell under ``incremental_runs/``,
shared with ``gdacil bench heads``, from which an interrupted run continues). Without ``--out``
the results go to ``runs/bench/defaults/``; existing results are replaced only with
``--overwrite``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .common import machine_info, markdown_table, output_arguments, refuse_to_overwrite, write_json
from .featuresets import DEFAULT_FEATURE_SETS, FEATURE_SETS, SCALINGS
from .incremental import RUNS_DIR, TASKS, HeadEntry, run_cells

__all__ = ["HEAD_FACTORIES", "head_entries", "main", "render", "run"]


def head_entries() -> dict[str, HeadEntry]:
    """gdacil's heads with their defaults, and the LR-RGDA paper's presets (``*_paper``)."""
    from ..heads import LDA, LRRGDA, NCM, QDA, RGDA, SGDHead

    factories: dict[str, Callable[[], Any]] = {
        "ncm": NCM, "lda": LDA, "qda": QDA, "rgda": RGDA, "lr_rgda": LRRGDA, "sgd": SGDHead,
        "lda_paper": LDA.paper, "rgda_paper": RGDA.paper, "lr_rgda_paper": LRRGDA.paper}
    return {name: HeadEntry(factory) for name, factory in factories.items()}


HEAD_FACTORIES = tuple(head_entries())


def run(feature_sets, scalings, seeds, heads, *, runs_dir=None, log=print) -> dict:
    entries = {name: head_entries()[name] for name in heads}
    cells = run_cells(feature_sets, scalings, seeds, entries, runs_dir=runs_dir, log=log)
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
    if {"lda", "ncm", payload["default_head"]} <= set(heads):
        lines += ["", f"{payload['default_head']} against LDA and NCM (Last-Acc points, mean over "
                  "seeds, smallest to largest seed in brackets), and how far it is from its "
                  "best scaling of the same features.", ""]
        lines.append(markdown_table(["features", "scaling", "- lda", "- ncm", "below best scaling"],
                                    margin_rows(payload)))
    return "\n".join(lines) + "\n"


def margin_rows(payload: dict) -> list[list[str]]:
    """Per cell: the default head's Last-Acc lead over ``lda`` and ``ncm`` (mean over seeds, with
    the smallest and largest seed's), and its distance below its best scaling's mean."""
    head = payload["default_head"]
    best: dict[str, float] = {}
    for c in payload["cells"]:
        best[c["features"]] = max(best.get(c["features"], -np.inf), c["heads"][head]["last_acc"])

    def lead(cell, other):
        d = [r[head]["last_acc"] - r[other]["last_acc"] for r in cell["seeds"].values()]
        return f"{np.mean(d):+.2f} ({min(d):+.2f} to {max(d):+.2f})"

    return [[c["features"], c["scaling"], lead(c, "lda"), lead(c, "ncm"),
             f"{best[c['features']] - c['heads'][head]['last_acc']:.2f}"]
            for c in payload["cells"]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench defaults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", nargs="+", default=list(DEFAULT_FEATURE_SETS),
                        choices=FEATURE_SETS)
    parser.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--heads", nargs="+", default=list(HEAD_FACTORIES), choices=HEAD_FACTORIES)
    output_arguments(parser, "defaults",
                     "defaults.{json,md} and incremental_runs/ (measured cells, kept and reused)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: timings stay meaningful on a shared "
                             "machine, where oversubscribed threads slow LAPACK down many times)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    refuse_to_overwrite(parser, args, "defaults.json")
    target = args.out / "defaults.json"
    payload = run(args.features, args.scalings, args.seeds, args.heads,
                  runs_dir=args.out / RUNS_DIR, log=lambda line: print(line, flush=True))
    write_json(target, payload)
    from ..io import atomic_write_text

    atomic_write_text(args.out / "defaults.md", render(payload))
    print(render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
