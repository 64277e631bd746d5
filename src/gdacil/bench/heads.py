"""gdacil's heads against the analytic heads users would pick instead, class-incremental.

Every head runs with its defaults on feature sets of :mod:`gdacil.bench.featuresets` (by
default the four whose data Debian ships: MiniLM on WordNet hypernyms and supersenses,
EfficientNet-Lite0 on openclipart and Fashion-MNIST; a run's sets are listed below), each in
three scalings (raw, non-affine LayerNorm, L2), over seeds, with the
protocol of :mod:`gdacil.bench.incremental`: Last-Acc, Inc-Acc, fit seconds, predictions per
second and peak memory. The anchors, with their published defaults: RanPAC (random ReLU
projection to M = 10000, ridge with the penalty chosen per task; ``ranpac_ridge`` is M = 0),
FeCAM (its ViT scripts' setting, ``fecam``, and its ImageNet-R script's, ``fecam_imagenet_r``),
ACIL (8192-wide random buffer, gamma = 0.1) and RBF-LDA (5000 random Fourier features, OAS).

Regenerate: ``python -m gdacil bench heads --out benchmarks --overwrite`` (writes ``anchors.json``,
``anchors.md``, ``anchors.png``, and one file per measured cell under ``incremental_runs/``,
shared with ``gdacil bench defaults``, from which an interrupted run continues; on three or more
feature sets also the leave-one-set-out grid's cells under ``loso_runs/``). The committed files
cover all ten feature sets, seeds 0-2: ``--features`` with every set and ``--seeds 0 1 2``,
the six public sets' data laid out by ``scripts/feature_set_data.sh``. Without ``--out`` the
results go to ``runs/bench/heads/``; existing results are replaced only with ``--overwrite``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from .._plotting import save_figure, subplots
from . import loso
from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)
from .featuresets import DEFAULT_FEATURE_SETS, FEATURE_SETS, SCALINGS
from .incremental import RUNS_DIR, TASKS, HeadEntry, run_cells

__all__ = ["ANCHORS", "DEFAULT_HEAD", "head_entries", "main", "plot", "render", "run"]

#: The head a user gets with no arguments
DEFAULT_HEAD = "lr_rgda"
#: Names of the anchor heads (the others are gdacil's)
ANCHORS = ("ranpac", "ranpac_ridge", "fecam", "fecam_imagenet_r", "acil", "rbf_lda")
#: Fewest feature sets for which the leave-one-set-out choice of constants is reported
LOSO_MIN_SETS = 3


def head_entries() -> dict[str, HeadEntry]:
    """gdacil's heads and the anchors, each with its defaults."""
    from ..heads import ACIL, LDA, LRRGDA, NCM, QDA, RBFLDA, RGDA, FeCAM, RanPAC

    return {
        "lr_rgda": HeadEntry(LRRGDA),
        "rgda": HeadEntry(RGDA),
        "qda": HeadEntry(QDA),
        "lda": HeadEntry(LDA),
        "ncm": HeadEntry(NCM),
        "ranpac": HeadEntry(RanPAC, streaming=True),
        "ranpac_ridge": HeadEntry(lambda: RanPAC(dim_out=0), streaming=True),
        "fecam": HeadEntry(lambda: FeCAM.preset("vit"), streaming=True),
        "fecam_imagenet_r": HeadEntry(lambda: FeCAM.preset("imagenet_r"), streaming=True),
        "acil": HeadEntry(ACIL, streaming=True),
        "rbf_lda": HeadEntry(RBFLDA, streaming=True),
    }


def run(feature_sets, scalings, seeds, heads, *, runs_dir=None, loso_dir=None,
        log=print) -> dict:
    """Every head on every cell; with the default head and at least :data:`LOSO_MIN_SETS`
    feature sets, also its constants chosen by leave-one-set-out (:mod:`gdacil.bench.loso`)."""
    entries = {name: head_entries()[name] for name in heads}
    cells = run_cells(feature_sets, scalings, seeds, entries, runs_dir=runs_dir, log=log)
    payload = {"benchmark": "heads", "default_head": DEFAULT_HEAD, "anchors": list(ANCHORS),
               "seeds": list(seeds), "tasks": {n: TASKS[n] for n in feature_sets},
               "machine": machine_info(), "cells": cells}
    if DEFAULT_HEAD in heads and len(feature_sets) >= LOSO_MIN_SETS:
        payload["leave_one_set_out"] = loso.run(feature_sets, scalings, seeds,
                                                runs_dir=loso_dir, log=log)
    return payload


def _best_anchor(cell: dict) -> float | None:
    """The best Last-Acc of the anchors measured in ``cell`` (``None`` without anchors)."""
    return max((v["last_acc"] for h, v in cell["heads"].items() if h in ANCHORS), default=None)


def _overall(payload: dict, heads: list[str]) -> dict:
    """Per head: mean Last-Acc over cells, mean fit seconds, and the worst gap to the best anchor."""
    cells = payload["cells"]
    best_anchor = [np.nan if (b := _best_anchor(c)) is None else b for c in cells]
    return {h: {"last_acc": float(np.mean([c["heads"][h]["last_acc"] for c in cells])),
                "fit_s": float(np.mean([c["heads"][h]["fit_s"] for c in cells])),
                "worst_gap": float(min(c["heads"][h]["last_acc"] - b
                                       for c, b in zip(cells, best_anchor)))}
            for h in heads}


def render(payload: dict) -> str:
    heads = list(payload["cells"][0]["heads"])
    lines = ["# gdacil's heads against the anchors, class-incremental, frozen features", "",
             " ".join(__doc__.split("\n\n")[1].split()), "",
             f"Seeds {payload['seeds']}; tasks per set {payload['tasks']}; default head "
             f"`{payload['default_head']}`. Means over seeds.", ""]
    for key, what, fmt in (("last_acc", "Last-Acc (%)", "{:.2f}"), ("inc_acc", "Inc-Acc (%)", "{:.2f}"),
                           ("fit_s", "Fit seconds per run (all tasks)", "{:.2f}"),
                           ("predict_per_s", "Predictions per second", "{:.0f}"),
                           ("peak_mib", "Peak memory added (MiB)", "{:.0f}")):
        rows = [[c["features"], c["scaling"], *(fmt.format(c["heads"][h][key]) for h in heads)]
                for c in payload["cells"]]
        lines += [f"## {what}", "", markdown_table(["features", "scaling", *heads], rows)]
    overall = _overall(payload, heads)
    rows = [[h, f"{v['last_acc']:.2f}", f"{v['worst_gap']:+.2f}", f"{v['fit_s']:.2f}"]
            for h, v in overall.items()]
    lines += ["## Over all cells", "",
              "Worst gap: the head's Last-Acc minus the best anchor's, in its worst cell.", "",
              markdown_table(["head", "mean Last-Acc", "worst gap to best anchor", "mean fit s"],
                             rows)]
    if "leave_one_set_out" in payload:
        lines += loso_section(payload)
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    """A Last-Acc cell, ``-`` where there is none (no anchor, defaults off the grid)."""
    return "-" if value is None else f"{value:.2f}"


def loso_section(payload: dict) -> list[str]:
    """The leave-one-set-out table: per cell, the default head with the constants chosen without
    its set, with its defaults, and the best anchor."""
    result = payload["leave_one_set_out"]
    best = {(c["features"], c["scaling"]): _best_anchor(c) for c in payload["cells"]}
    rows = []
    for c in result["cells"]:
        s, b = result["sets"][c["features"]], best.get((c["features"], c["scaling"]))
        rows.append([c["features"], c["scaling"], loso.point_name(s["chosen"]),
                     f"{c['last_acc']:.2f}", _percent(c["default_last_acc"]), _percent(b),
                     "-" if b is None else f"{c['last_acc'] - b:+.2f}"])
    header = ["features", "scaling", "constants chosen on the other sets", "Last-Acc",
              "with defaults", "best anchor", "gap"]
    sets = result["sets"]
    per_set = [[s, f"{v['last_acc']:.2f}", _percent(v["default_last_acc"]),
                loso.point_name(v["oracle"]), f"{v['oracle_last_acc']:.2f}"]
               for s, v in sets.items()]
    means = {k: [v[k] for v in sets.values()]
             for k in ("last_acc", "default_last_acc", "oracle_last_acc")}
    per_set.append(["**mean**", f"**{np.mean(means['last_acc']):.2f}**",
                    "-" if None in means["default_last_acc"]
                    else f"**{np.mean(means['default_last_acc']):.2f}**", "",
                    f"**{np.mean(means['oracle_last_acc']):.2f}**"])
    return ["", "## Leave one set out", "", " ".join(loso.__doc__.split("\n\n")[1].split()), "",
            f"Grid: {result['grid']}; defaults: {loso.point_name(result['default'])}; chosen on "
            f"all sets: {loso.point_name(result['chosen_on_all'])}. Last-Acc (%), mean over "
            "seeds.", "", markdown_table(header, rows), "",
            "Per set, the mean over its scalings: held out, with the defaults, and with the "
            "set's own best point (chosen on its test data).", "",
            markdown_table(["features", "held out", "defaults", "own best point", "own best"],
                           per_set)]


def plot(payload: dict, path: Path) -> None:
    """Mean Last-Acc over cells against mean fit seconds, one point per head."""
    heads = list(payload["cells"][0]["heads"])
    overall = _overall(payload, heads)
    fig, ax = subplots(figsize=(6.5, 4.5))
    for h, v in overall.items():
        anchor = h in ANCHORS
        ax.scatter(v["fit_s"], v["last_acc"], marker="s" if anchor else "o",
                   color="tab:gray" if anchor else "tab:blue")
        ax.annotate(h, (v["fit_s"], v["last_acc"]), textcoords="offset points", xytext=(4, 3),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("fit seconds per run (mean over cells, log scale)")
    ax.set_ylabel("Last-Acc, mean over cells (%)")
    ax.set_title("gdacil heads (circles) and anchors (squares)")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench heads", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", nargs="+", default=list(DEFAULT_FEATURE_SETS),
                        choices=FEATURE_SETS)
    parser.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    names = list(head_entries())
    parser.add_argument("--heads", nargs="+", default=names, choices=names)
    output_arguments(parser, "heads",
                     "anchors.{json,md,png} and incremental_runs/ (measured cells, kept and reused)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: timings stay meaningful on a shared "
                             "machine, where oversubscribed threads slow LAPACK down many times)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    refuse_to_overwrite(parser, args, "anchors.json")
    payload = run(args.features, args.scalings, args.seeds, args.heads,
                  runs_dir=args.out / RUNS_DIR, loso_dir=args.out / loso.RUNS_DIR,
                  log=lambda line: print(line, flush=True))
    plot(payload, args.out / "anchors.png")
    write_report(args.out, "anchors", payload, render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
