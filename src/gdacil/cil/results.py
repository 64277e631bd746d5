"""Results of a run: JSON (metrics only, so resumed runs reproduce it byte for byte), CSV, timings,
a plot of accuracy against task per head, and a printed table."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._plotting import save_figure, subplots
from ..io import atomic_write_text
from .config import ExperimentConfig, without_reporting_keys
from .metrics import IncrementalMetrics, summarize_seeds

__all__ = ["results_record", "results_table", "write_results"]

_SUMMARY_KEYS = ("last_acc", "inc_acc", "forgetting", "final_class_balanced_acc")

logger = logging.getLogger(__name__)


def results_record(cfg: ExperimentConfig, metrics: dict[int, dict[str, IncrementalMetrics]], *,
                   diagnostics: dict | None = None) -> dict:
    """The content of ``results.json``: the config (without :data:`~gdacil.cil.REPORTING_KEYS`),
    the precision the backbone ran in (``backbone_precision``, ``"auto"`` resolved), the metrics
    per seed and head, their summary over seeds, and ``diagnostics`` if any."""
    per_seed = {str(seed): {label: m.to_dict() for label, m in heads.items()}
                for seed, heads in metrics.items()}
    labels = list(next(iter(metrics.values())))
    summary = {
        label: {key: summarize_seeds([per_seed[str(s)][label][key] for s in metrics])
                for key in _SUMMARY_KEYS}
        for label in labels
    }
    results: dict[str, Any] = {"name": cfg.name, "config": cfg.to_dict(), "seeds": per_seed,
                               "summary": summary,
                               "overrides": list(getattr(cfg, "overrides", ()))}
    if diagnostics:
        results["drift_diagnostics"] = {str(s): d for s, d in diagnostics.items()}
    without_reporting_keys(results["config"])
    results["backbone_precision"] = cfg.backbone.resolved_precision()
    return results


def write_results(out: Path, cfg: ExperimentConfig, metrics: dict[int, dict[str, IncrementalMetrics]],
                  timings: dict, *, diagnostics: dict | None = None,
                  log: Callable | None = None) -> dict:
    """Write ``results.json``, ``results.csv``, ``results.md``, ``timings.json`` and
    ``accuracy.png`` under ``out``, and log the results table (INFO, to this module's logger,
    or to ``log`` if given).

    ``diagnostics`` (per seed, per task, per compensator track: errors against the oracle
    statistics) go into ``results.json`` too. Returns :func:`results_record`."""
    results = results_record(cfg, metrics, diagnostics=diagnostics)
    per_seed, summary = results["seeds"], results["summary"]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(results, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "timings.json", json.dumps(timings, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "results.csv", _csv(per_seed))
    _plot(out / "accuracy.png", cfg.name, metrics)
    table = results_table(summary)
    atomic_write_text(out / "results.md", f"# {cfg.name}\n\n{_run_description(cfg)}\n{table}")
    say = logger.info if log is None else log
    say(f"results of {cfg.name} (percent):\n{table.rstrip()}")
    say(f"results written to {out}/ (results.json, results.csv, results.md, timings.json, "
        "accuracy.png)")
    return results


def _run_description(cfg: ExperimentConfig) -> str:
    """What ``results.md`` says about the run before its table: seeds, overrides, the units."""
    lines = [f"Seeds: {', '.join(map(str, cfg.seeds))}."]
    overrides = getattr(cfg, "overrides", ())
    lines.append("Overrides: " + (", ".join(f"`--set {o}`" for o in overrides) if overrides
                                  else "none (the config as written)") + ".")
    interval = ("± is the half-width of the 95% Student-t confidence interval of the mean over "
                "the seeds" if len(cfg.seeds) > 1 else "one seed, so no interval")
    lines.append(f"Accuracies in percent, mean over seeds; {interval}. The full configuration "
                 "is in results.json.")
    return "\n".join(lines) + "\n"


def _csv(per_seed: dict) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["seed", "head", "task", "pooled_acc", "class_balanced_acc"])
    for seed, heads in per_seed.items():
        for label, m in heads.items():
            for t, (p, cb) in enumerate(zip(m["pooled_acc_per_task"],
                                            m["class_balanced_acc_per_task"]), 1):
                writer.writerow([seed, label, t, f"{p:.6f}", f"{cb:.6f}"])
    return buf.getvalue()


def _fmt(s: dict) -> str:
    text = f"{100 * s['mean']:.2f}"
    return text if s["ci95"] is None else f"{text} ± {100 * s['ci95']:.2f}"


def results_table(summary: dict) -> str:
    """Markdown table of the summary (percent; ± is the 95% interval over seeds)."""
    rows = ["| head | Last-Acc | Inc-Acc | forgetting | class-balanced |", "|---|---|---|---|---|"]
    for label, s in summary.items():
        rows.append(f"| {label} | {_fmt(s['last_acc'])} | {_fmt(s['inc_acc'])} | "
                    f"{_fmt(s['forgetting'])} | {_fmt(s['final_class_balanced_acc'])} |")
    return "\n".join(rows) + "\n"


def _plot(path: Path, title: str, metrics: dict[int, dict[str, IncrementalMetrics]]) -> None:
    fig, ax = subplots(figsize=(6.5, 4.2))
    labels = list(next(iter(metrics.values())))
    for label in labels:
        curves = np.array([metrics[s][label].pooled for s in metrics]) * 100
        tasks = np.arange(1, curves.shape[1] + 1)
        mean = curves.mean(0)
        ax.plot(tasks, mean, marker="o", label=label)
        if len(curves) > 1:
            lo, hi = curves.min(0), curves.max(0)
            ax.fill_between(tasks, lo, hi, alpha=0.15)
    ax.set_xlabel("task")
    ax.set_ylabel("accuracy on all seen classes (%)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
