"""Open-set recognition and per-task calibration after class-incremental learning, frozen features.

On the offline feature sets of :mod:`gdacil.bench.featuresets` (MiniLM on WordNet hypernyms and
supersenses, EfficientNet-Lite0 on openclipart and Fashion-MNIST), each in three scalings (raw,
non-affine LayerNorm, L2), over seeds: a quarter of the classes (drawn per seed) are unknown,
never learned, and their test samples are the unknown inputs. The other classes arrive in tasks
(the class orders and train/test splits of :mod:`gdacil.bench.incremental`); the default head,
LR-RGDA, is refitted after every task on the class statistics merged so far, and a calibration
(:mod:`gdacil.calibration`) is fitted on records of THAT task's training samples, cross-fitted
as the Learner does by default: each class's samples are dealt into ten folds, and each fold is
scored by a copy of the head refitted on the statistics without it (the statistics include
every sample), so every sample is a record; earlier tasks' newest records join a task with
fewer than 100. The last task's calibration
serves the final evaluation, on the test samples of every known class and of the
unknown ones: AUROC (known positive) and FPR at 95% TPR of every novelty score of
:mod:`gdacil.novelty` on LR-RGDA, of Mahalanobis++ (the ``"mahalanobis"`` score of statistics of
L2-normalised features) and of two anchors (RanPAC's largest softmax probability; FeCAM's
Mahalanobis distance, its ViT setting); rejection at a 5% target false-rejection rate; the
expected calibration error before and after calibration (temperature, then the top-label map)
with its floor on this many test inputs (:func:`gdacil.calibration.ece_floor`);
split-conformal sets at alpha = 0.1.

Regenerate: ``python -m gdacil bench openset --out benchmarks --overwrite`` (writes
``openset.json``, ``openset.md`` and one file per measured (feature set, scaling, seed) under
``openset_runs/``, from which an interrupted run continues; ``--skip-anchors`` leaves RanPAC and
FeCAM out). Without ``--out`` the results go to ``runs/bench/openset/``; existing results are
replaced only with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..calibration import (
    CALIBRATION_SHARE,
    MIN_RECORDS,
    TEMPERATURE_PRIOR,
    TOP_LABEL_PRIOR,
    Calibration,
    calibration_folds,
    ece_floor,
    expected_calibration_error,
    held_out_calibration,
)
from ..novelty import DEFAULT_SCORE, NORM_BAND, NOVELTY_SCORES, TYPICAL_NORM_SCORES
from ..stats import ClassGaussians
from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)
from .featuresets import DEFAULT_FEATURE_SETS, FEATURE_SETS, SCALINGS, scale_features, split
from .incremental import TASKS, task_classes

__all__ = ["ALPHA", "CALIBRATION_SHARE", "DEFAULT_ANCHORS", "TARGET_RATE", "UNKNOWN_FRACTION",
           "Anchor", "OpenSetSplit", "auroc", "evaluate_cell", "fpr_at_tpr", "main",
           "make_split", "payload", "render", "run", "run_seed"]

#: Subdirectory of the output that keeps every measured (features, scaling, seed)
RUNS_DIR = "openset_runs"
#: Share of the classes held out as unknown (``len(classes) // 4`` of them)
UNKNOWN_FRACTION = 0.25
#: Target false-rejection rate of the rejection threshold
TARGET_RATE = 0.05
#: Miscoverage of the conformal sets
ALPHA = 0.1
#: Bins of the expected calibration error
ECE_BINS = 15
#: True-positive rate (known inputs kept) at which FPR is read
TPR = 0.95
#: The L2-normalised Mahalanobis score's name
MAHALANOBIS_PP = "mahalanobis++"
#: Bumped when the protocol changes, so stored runs are remeasured
PROTOCOL = "openset/1"


@dataclass(frozen=True)
class Anchor:
    """A head users would pick instead, streamed task by task with ``partial_fit(X, y)``, and
    its novelty score ``score(head, X)`` (higher means more typical of the known classes)."""

    factory: Callable[[], Any]
    score: Callable[[Any, torch.Tensor], torch.Tensor]


def _ranpac_msp(head, X):
    return head.score_samples(X)


def _fecam_mahalanobis(head, X):
    return head.decision_function(X).amax(1)


def default_anchors() -> dict[str, Anchor]:
    """The anchors with their published defaults: RanPAC (M = 10000, ridge penalty chosen per
    task) scored by its largest softmax probability, FeCAM's ViT setting by minus half its
    smallest Mahalanobis distance."""
    from ..heads import FeCAM, RanPAC

    return {"ranpac_msp": Anchor(RanPAC, _ranpac_msp),
            "fecam_mahalanobis": Anchor(lambda: FeCAM.preset("vit"), _fecam_mahalanobis)}


#: Names of :func:`default_anchors`
DEFAULT_ANCHORS = ("ranpac_msp", "fecam_mahalanobis")


# ---------------------------------------------------------------------- split
@dataclass(frozen=True)
class OpenSetSplit:
    """One seed's known and unknown classes, tasks of known classes, train and test positions."""

    known: np.ndarray
    unknown: np.ndarray
    tasks: list[np.ndarray]
    train: np.ndarray           #: training positions of known classes
    known_test: np.ndarray      #: test positions of known classes
    unknown_test: np.ndarray    #: test positions of unknown classes


def make_split(y: np.ndarray, n_tasks: int, test_fraction: float, seed: int) -> OpenSetSplit:
    """The seed's unknown quarter of the classes, the known ones cut into tasks, and the
    train/test split of :func:`~gdacil.bench.featuresets.split`."""
    classes = np.unique(y)
    n_unknown = math.floor(UNKNOWN_FRACTION * len(classes))
    unknown = np.sort(np.random.default_rng([seed, 7]).choice(classes, n_unknown, replace=False))
    known = np.setdiff1d(classes, unknown)
    train, test = split(y, test_fraction, seed)
    return OpenSetSplit(known=known, unknown=unknown, tasks=task_classes(known, n_tasks, seed),
                        train=train[np.isin(y[train], known)],
                        known_test=test[np.isin(y[test], known)],
                        unknown_test=test[np.isin(y[test], unknown)])


# ---------------------------------------------------------------------- metrics
def auroc(known: torch.Tensor, unknown: torch.Tensor) -> float:
    """Area under the ROC curve (percent), known inputs the positives."""
    from sklearn.metrics import roc_auc_score

    k, u = known.double().cpu().numpy(), unknown.double().cpu().numpy()
    truth = np.r_[np.ones(len(k)), np.zeros(len(u))]
    return 100.0 * float(roc_auc_score(truth, np.r_[k, u]))


def fpr_at_tpr(known: torch.Tensor, unknown: torch.Tensor, tpr: float = TPR) -> float:
    """Percent of unknown inputs scoring at or above the score that keeps ``tpr`` of the known
    inputs (the ``floor((1 - tpr) n)``-th smallest known score, counted from 0)."""
    k = known.double().sort().values
    cut = k[min(len(k) - 1, math.floor((1.0 - tpr) * len(k) + 1e-9))]
    return 100.0 * float((unknown.double() >= cut).double().mean())


def _percent(mask: torch.Tensor) -> float:
    return 100.0 * float(mask.double().mean())


# ---------------------------------------------------------------------- one seed
def _task_rows(y: np.ndarray, sp: OpenSetSplit, classes: np.ndarray) -> np.ndarray:
    return sp.train[np.isin(y[sp.train], classes)]


def _gdacil_part(X: torch.Tensor, y: np.ndarray, sp: OpenSetSplit, seed: int,
                 head_factory: Callable[[], Any]) -> dict:
    """LR-RGDA (``head_factory``) through every task with per-task calibration; the final
    evaluation of its scores, of Mahalanobis++, rejection, ECE and conformal sets."""
    from ..heads import NCM

    X_l2 = torch.nn.functional.normalize(X, dim=1)
    head = head_factory()
    stats, stats_l2 = ClassGaussians(X.shape[1]), ClassGaussians(X.shape[1])
    fit_s = calibrate_s = 0.0
    history = []
    cal: Calibration | None = None
    for i, classes in enumerate(sp.tasks):
        rows = _task_rows(y, sp, classes)
        X_task, y_task = X[rows], torch.from_numpy(y[rows])
        start = time.perf_counter()
        head.fit(stats.update(X_task, y_task))
        stats_l2.update(X_l2[rows], y_task)
        fit_s += time.perf_counter() - start
        start = time.perf_counter()
        folds = calibration_folds(y_task, CALIBRATION_SHARE, seed * 1000 + i)
        # the fitted head: its copies reuse the eigenpairs of the classes a fold leaves
        cal = held_out_calibration(head, stats, X_task, y_task, folds=folds, previous=cal)
        calibrate_s += time.perf_counter() - start
        history.append({"task": i, "classes": len(classes), "records": cal.n_records,
                        "temperature": cal.temperature_, "threshold": cal.threshold(TARGET_RATE)})
    assert cal is not None  # at least one task
    start = time.perf_counter()
    Xk, Xu = X[sp.known_test], X[sp.unknown_test]
    yk = torch.from_numpy(y[sp.known_test])
    scores = {m: {"known": head.score_samples(Xk, m), "unknown": head.score_samples(Xu, m)}
              for m in NOVELTY_SCORES}
    # every distance score is a function of the class statistics alone, the same for every
    # Gaussian head: NCM has it without LR-RGDA's eigendecompositions
    pp = NCM().fit(stats_l2)
    scores[MAHALANOBIS_PP] = {"known": pp.score_samples(X_l2[sp.known_test], "mahalanobis"),
                              "unknown": pp.score_samples(X_l2[sp.unknown_test], "mahalanobis")}

    logits = head.decision_function(Xk).double()
    column = {c: j for j, c in enumerate(head.classes_.tolist())}
    cols = torch.tensor([column[c] for c in yk.tolist()], dtype=torch.int64)
    correct = logits.argmax(1) == cols
    default_known = scores[DEFAULT_SCORE]["known"]
    default_unknown = scores[DEFAULT_SCORE]["unknown"]
    threshold = cal.threshold(TARGET_RATE)
    rejected = default_known < threshold
    last = torch.from_numpy(np.isin(y[sp.known_test], sp.tasks[-1]))
    sets = cal.prediction_sets(logits, ALPHA)
    calibrated = cal.calibrated(logits)
    covered = sets[torch.arange(len(cols)), cols]
    evaluate_s = time.perf_counter() - start
    return {
        "scores": {m: {"auroc": auroc(s["known"], s["unknown"]),
                       "fpr95": fpr_at_tpr(s["known"], s["unknown"])} for m, s in scores.items()},
        "rejection": {"target": 100.0 * TARGET_RATE,
                      "false_rejection": _percent(rejected),
                      "false_rejection_last_task": _percent(rejected[last]),
                      "false_rejection_earlier_tasks": _percent(rejected[~last]),
                      "unknown_rejected": _percent(default_unknown < threshold),
                      "known_accuracy": _percent(correct & ~rejected),
                      "known_accuracy_no_rejection": _percent(correct)},
        "ece": {"before": expected_calibration_error(torch.softmax(logits, 1), cols, ECE_BINS),
                "after": expected_calibration_error(calibrated, cols, ECE_BINS),
                "floor": ece_floor(calibrated, ECE_BINS),
                "after_temperature": expected_calibration_error(cal.tempered(logits), cols,
                                                                ECE_BINS)},
        "temperature": cal.temperature_,
        "conformal": {"alpha": ALPHA, "coverage": _percent(covered),
                      "coverage_last_task": _percent(covered[last]),
                      "coverage_earlier_tasks": _percent(covered[~last]),
                      "set_size": float(sets.sum(1).double().mean())},
        "calibration_records": cal.n_records,
        "tasks": history,
        "n_known_test": len(sp.known_test), "n_unknown_test": len(sp.unknown_test),
        "seconds": {"fit": fit_s, "calibrate": calibrate_s, "evaluate": evaluate_s},
    }


def _anchor_part(anchor: Anchor, X: torch.Tensor, y: np.ndarray, sp: OpenSetSplit) -> dict:
    """An anchor streamed through every task, then its score's AUROC and FPR95."""
    start = time.perf_counter()
    head = anchor.factory()
    for classes in sp.tasks:
        rows = _task_rows(y, sp, classes)
        head.partial_fit(X[rows], torch.from_numpy(y[rows]))
    Xk, Xu = X[sp.known_test], X[sp.unknown_test]
    known, unknown = anchor.score(head, Xk), anchor.score(head, Xu)
    accuracy = _percent(head.predict(Xk).cpu() == torch.from_numpy(y[sp.known_test]))
    return {"auroc": auroc(known, unknown), "fpr95": fpr_at_tpr(known, unknown),
            "known_accuracy": accuracy, "seconds": time.perf_counter() - start}


def _stored(path: Path | None, part: str, config: str, measure: Callable[[], dict]) -> dict:
    """``measure()``, or its earlier result for the same ``config`` stored in ``path``."""
    from ..io import atomic_write_text

    done = json.loads(path.read_text()) if path is not None and path.exists() else {}
    if done.get(part, {}).get("config") == config:
        return done[part]["result"]
    result = measure()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        done = json.loads(path.read_text()) if path.exists() else {}
        done[part] = {"config": config, "result": result}
        atomic_write_text(path, json.dumps(done, indent=1, sort_keys=True) + "\n")
    return result


def run_seed(X: torch.Tensor, y: np.ndarray, *, n_tasks: int, test_fraction: float, seed: int,
             anchors: dict[str, Anchor] | None = None,
             head_factory: Callable[[], Any] | None = None,
             store: str | os.PathLike | None = None) -> dict:
    """Every measurement of one seed on features ``X`` ``(n, d)`` with labels ``y``.

    ``anchors`` (default none) are streamed as well; ``head_factory`` defaults to ``LRRGDA``.
    With ``store`` (a JSON file), each part (``"gdacil"``, each anchor) is written there as soon
    as it is measured and read back instead of rerun while its configuration is unchanged.
    """
    from ..heads import LRRGDA

    factory = LRRGDA if head_factory is None else head_factory
    X = torch.as_tensor(X).double()
    y = np.asarray(y, dtype=np.int64)
    sp = make_split(y, n_tasks, test_fraction, seed)
    path = Path(store) if store is not None else None
    config = (f"{PROTOCOL} {factory()!r} share={CALIBRATION_SHARE} rate={TARGET_RATE} "
              f"alpha={ALPHA} bins={ECE_BINS} tasks={n_tasks} test={test_fraction} "
              f"min_records={MIN_RECORDS} maps=temperature(prior={TEMPERATURE_PRIOR})"
              f"+top-label(prior={TOP_LABEL_PRIOR}) "
              "probe=whole-head records=cross-fitted "
              f"scores={','.join(NOVELTY_SCORES)} default={DEFAULT_SCORE} "
              "relative-likelihood=each-model-against-its-moments "
              f"typical-norm={','.join(TYPICAL_NORM_SCORES)}(band={NORM_BAND})")
    result = _stored(path, "gdacil", config,
                     lambda: _gdacil_part(X, y, sp, seed, factory))
    result = json.loads(json.dumps(result))  # a copy: the anchors join its scores
    result["anchors"] = {}
    for name, anchor in (anchors or {}).items():
        measured = _stored(path, name, f"{PROTOCOL} {anchor.factory()!r} tasks={n_tasks} "
                           f"test={test_fraction}", partial(_anchor_part, anchor, X, y, sp))
        result["scores"][name] = {"auroc": measured["auroc"], "fpr95": measured["fpr95"]}
        result["anchors"][name] = {"known_accuracy": measured["known_accuracy"],
                                   "seconds": measured["seconds"]}
    return result


# ---------------------------------------------------------------------- cells
def _mean(results: list) -> Any:
    """Mean over seeds of every number (keys present in every seed; lists are left out)."""
    first = results[0]
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(r, dict) and k in r for r in results)]
        means = {k: _mean([r[k] for r in results]) for k in keys}
        return {k: v for k, v in means.items() if v is not None}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return float(np.mean(results))
    return None


def evaluate_cell(X: torch.Tensor, y: np.ndarray, *, features: str, scaling: str, n_tasks: int,
                  test_fraction: float, seeds: Sequence[int],
                  anchors: dict[str, Anchor] | None = None,
                  head_factory: Callable[[], Any] | None = None,
                  runs_dir: str | os.PathLike | None = None, log=print) -> dict:
    """One (feature set, scaling) cell: :func:`run_seed` per seed and the means over seeds."""
    per_seed = []
    for seed in seeds:
        start = time.perf_counter()
        store = Path(runs_dir) / f"{features}-{scaling}-{seed}.json" if runs_dir else None
        per_seed.append(run_seed(X, y, n_tasks=n_tasks, test_fraction=test_fraction, seed=seed,
                                 anchors=anchors, head_factory=head_factory, store=store))
        log(f"  {features} {scaling} seed {seed}: {time.perf_counter() - start:.1f} s")
    mean = _mean(per_seed)
    return {"features": features, "scaling": scaling, **mean,
            "seeds": {str(s): r for s, r in zip(seeds, per_seed)}}


def payload(cells: list[dict], seeds: Sequence[int], *, tasks: dict | None = None,
            anchors: Sequence[str] = ()) -> dict:
    """The benchmark's JSON document around measured cells."""
    return {"benchmark": "openset", "default_score": DEFAULT_SCORE, "scores": list(NOVELTY_SCORES),
            "anchors": list(anchors), "seeds": list(seeds), "unknown_fraction": UNKNOWN_FRACTION,
            "calibration_share": CALIBRATION_SHARE, "tpr": 100.0 * TPR,
            "tasks": tasks or {}, "machine": machine_info(), "cells": cells}


def _summary(cell: dict) -> str:
    aurocs = {m: v["auroc"] for m, v in cell["scores"].items()}
    best = max(aurocs, key=aurocs.__getitem__)
    return (f"{DEFAULT_SCORE} AUROC {aurocs[DEFAULT_SCORE]:.2f} (best {best} {aurocs[best]:.2f}), "
            f"FRR {cell['rejection']['false_rejection']:.1f}% (target "
            f"{cell['rejection']['target']:.0f}%), ECE {cell['ece']['before']:.3f} -> "
            f"{cell['ece']['after']:.3f}, coverage {cell['conformal']['coverage']:.1f}% "
            f"(size {cell['conformal']['set_size']:.2f})")


def run(feature_sets, scalings, seeds, *, anchors: bool = True, runs_dir=None, log=print) -> dict:
    """Every (feature set, scaling) cell on the cached offline features."""
    from .featuresets import load_features

    entries = default_anchors() if anchors else {}
    cells = []
    for name in feature_sets:
        X_raw, y = load_features(name)
        for scaling in scalings:
            start = time.perf_counter()
            cell = evaluate_cell(scale_features(X_raw.double(), scaling), y, features=name,
                                 scaling=scaling, n_tasks=TASKS[name],
                                 test_fraction=FEATURE_SETS[name].test_fraction, seeds=seeds,
                                 anchors=entries, runs_dir=runs_dir, log=log)
            cell["wall_s"] = time.perf_counter() - start
            cells.append(cell)
            log(f"{name} {scaling} ({cell['wall_s']:.0f} s): {_summary(cell)}")
    return payload(cells, seeds, tasks={n: TASKS[n] for n in feature_sets}, anchors=list(entries))


# ---------------------------------------------------------------------- report
def _score_names(payload: dict) -> list[str]:
    """The scores of the cells: the default first, then gdacil's, Mahalanobis++ and the
    anchors in the payload's order (stored runs sort their scores by name)."""
    listed = [payload["default_score"], *payload.get("scores", []), MAHALANOBIS_PP,
              *payload.get("anchors", [])]
    names: list[str] = []
    for cell in payload["cells"]:
        names += [m for m in cell["scores"] if m not in names]
    rank = {m: i for i, m in enumerate(dict.fromkeys(listed))}
    return sorted(names, key=lambda m: (rank.get(m, len(rank)), names.index(m)))


def _marked(values: dict, names: list[str], best: float) -> list[str]:
    return [("-" if m not in values else
             f"**{values[m]:.2f}**" if values[m] == best else f"{values[m]:.2f}") for m in names]


def _score_table(payload: dict, key: str, higher: bool) -> tuple[str, list[float]]:
    names = _score_names(payload)
    pick = max if higher else min
    rows, gaps = [], []
    for c in payload["cells"]:
        values = {m: v[key] for m, v in c["scores"].items()}
        best = pick(values.values())
        gap = values[payload["default_score"]] - best
        gaps.append(gap)
        rows.append([c["features"], c["scaling"], *_marked(values, names, best), f"{gap:+.2f}"])
    means = {m: float(np.mean([c["scores"][m][key] for c in payload["cells"]]))
             for m in names if all(m in c["scores"] for c in payload["cells"])}
    best = pick(means.values())
    rows.append(["**mean**", "", *_marked(means, names, best), f"{np.mean(gaps):+.2f}"])
    return markdown_table(["features", "scaling", *names, "default - best"], rows), gaps


def _plain(text: str) -> str:
    """reStructuredText roles and literals as markdown code."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def render(payload: dict) -> str:
    default = payload["default_score"]
    anchors = payload.get("anchors") or []
    lines = ["# Open-set recognition and per-task calibration, class-incremental, frozen features",
             "", _plain(" ".join(__doc__.split("\n\n")[1].split())), "",
             f"Seeds {payload['seeds']}; tasks per set {payload['tasks']}; "
             f"{100 * payload['unknown_fraction']:.0f}% of the classes unknown; "
             f"calibration records cross-fitted in {round(1 / payload['calibration_share'])} "
             f"folds of each task's training samples. Means over seeds. Default score `{default}`"
             + (f"; anchors {', '.join(f'`{a}`' for a in anchors)}." if anchors else
                "; anchors not run (`--skip-anchors`).")
             + " AUROC, FPR, rejection rates, accuracies and coverage in percent; ECE as a "
               "fraction (0.03 = 3%).", ""]
    table, _ = _score_table(payload, "auroc", higher=True)
    lines += ["## AUROC (%), known classes positive", "",
              "Best per row in bold; `default - best`: the default score's AUROC minus the "
              "row's best.", "", table]
    table, _ = _score_table(payload, "fpr95", higher=False)
    lines += ["## FPR at 95% TPR (%), lower is better", "",
              "The share of unknown inputs scoring at or above the score that keeps 95% of the "
              "known inputs. Best per row in bold.", "", table]
    rows = [[c["features"], c["scaling"], f"{r['target']:.0f}", f"{r['false_rejection']:.2f}",
             f"{r['false_rejection_last_task']:.2f}", f"{r['false_rejection_earlier_tasks']:.2f}",
             f"{r['unknown_rejected']:.2f}", f"{r['known_accuracy_no_rejection']:.2f}",
             f"{r['known_accuracy']:.2f}"]
            for c in payload["cells"] for r in [c["rejection"]]]
    lines += ["## Rejection at the calibrated threshold", "",
              f"Threshold `cal.threshold({TARGET_RATE})` of the last task's calibration on the "
              f"default score; false rejection measured on the known test inputs (all known "
              f"classes; those of the last task, whose samples calibrated it; those of earlier "
              f"tasks). Accuracy with rejection counts a rejected known input as wrong.", "",
              markdown_table(["features", "scaling", "target", "false rejection", "last task",
                              "earlier tasks", "unknown rejected", "known acc.",
                              "known acc. with rejection"], rows)]
    rows = [[c["features"], c["scaling"], f"{c['ece']['before']:.4f}",
             f"{c['ece'].get('after_temperature', float('nan')):.4f}", f"{c['ece']['after']:.4f}",
             f"{c['ece'].get('floor', float('nan')):.4f}", f"{c['temperature']:.3f}"]
            for c in payload["cells"]]
    lines += ["## Expected calibration error (fraction, 15 bins), known test inputs", "",
              "Before: `softmax(decision_function)`; temperature: divided by the temperature "
              "fitted on the calibration records; after: `Calibration.calibrated`, the "
              "temperature and then the top-label map; floor: the mean ECE of a perfectly "
              "calibrated model with the calibrated probabilities on these test inputs "
              "(`gdacil.calibration.ece_floor`), below which no measured ECE can be told from "
              "sampling noise.", "",
              markdown_table(["features", "scaling", "ECE before", "ECE temperature",
                              "ECE after", "ECE floor", "temperature"], rows)]
    rows = [[c["features"], c["scaling"], f"{c['conformal']['alpha']:g}",
             f"{c['conformal']['coverage']:.2f}", f"{c['conformal']['coverage_last_task']:.2f}",
             f"{c['conformal']['coverage_earlier_tasks']:.2f}",
             f"{c['conformal']['set_size']:.2f}"] for c in payload["cells"]]
    target = 100 * (1 - ALPHA)
    lines += [f"## Split-conformal sets, alpha = {ALPHA} (target coverage {target:.0f}%)",
              "", "Coverage of the true class on the known test inputs (all; last task's classes; "
              "earlier tasks' classes) and the mean set size.", "",
              markdown_table(["features", "scaling", "alpha", "coverage", "last task",
                              "earlier tasks", "mean set size"], rows)]
    rows = []
    for c in payload["cells"]:
        s = c["seconds"]
        rows.append([c["features"], c["scaling"], f"{s['fit']:.1f}", f"{s['calibrate']:.1f}",
                     f"{s['evaluate']:.1f}",
                     *(f"{c['anchors'][a]['seconds']:.1f}" if a in c.get("anchors", {}) else "-"
                       for a in anchors),
                     *(f"{c['anchors'][a]['known_accuracy']:.2f}" if a in c.get("anchors", {})
                       else "-" for a in anchors)])
    lines += ["## Time per seed (s) and the anchors' known-class accuracy (%)", "",
              "LR-RGDA fits over all tasks, per-task calibrations, the final evaluation; each "
              f"anchor's whole run (threads: {payload['machine']['torch_threads']}).", "",
              markdown_table(["features", "scaling", "fit", "calibrate", "evaluate",
                              *(f"{a} s" for a in anchors), *(f"{a} acc." for a in anchors)],
                             rows)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench openset", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", nargs="+", default=list(DEFAULT_FEATURE_SETS),
                        choices=FEATURE_SETS)
    parser.add_argument("--scalings", nargs="+", default=list(SCALINGS), choices=SCALINGS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--skip-anchors", action="store_true",
                        help="leave out RanPAC (M = 10000: minutes per cell on few cores) and "
                             "FeCAM")
    output_arguments(parser, "openset",
                     "openset.{json,md} and openset_runs/ (measured seeds, kept and reused)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: timings stay meaningful on a shared "
                             "machine, where oversubscribed threads slow LAPACK down many times)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    refuse_to_overwrite(parser, args, "openset.json")
    result = run(args.features, args.scalings, args.seeds, anchors=not args.skip_anchors,
                 runs_dir=args.out / RUNS_DIR, log=lambda line: print(line, flush=True))
    write_report(args.out, "openset", result, render(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
