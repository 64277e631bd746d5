"""Class-incremental runs of heads on frozen offline features: the protocol of ``gdacil bench
defaults`` and ``gdacil bench heads``.

One cell is a (feature set, scaling, seed). The seed draws a class order and a train/test split
of every class; the classes arrive in equal tasks. A head either takes each task's training
features into :class:`~gdacil.ClassGaussians` and is rebuilt from them (gdacil's Gaussian heads),
or takes them itself with ``partial_fit(X, y)`` (the streaming heads: RanPAC, ACIL, RBF-LDA,
FeCAM with its own transform). After every task it is scored on the test samples of all classes
seen so far. Last-Acc is the accuracy after the final task, Inc-Acc the mean over tasks.

Per head and cell we also record ``fit_s`` (taking in every task's data and building the head,
up to its first prediction, summed over tasks, with ``threads`` torch threads),
``predict_per_s`` (test samples scored per second after the final task) and ``peak_mib`` (the
most resident memory the head's run added above what the process held when it started, sampled
every few milliseconds on Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ..stats import ClassGaussians

__all__ = ["TASKS", "HeadEntry", "PeakRSS", "run_cell", "run_cells", "run_head", "task_classes"]

#: Subdirectory of a benchmark's output that keeps every measured (cell, seed, head)
RUNS_DIR = "incremental_runs"
#: Tasks per feature set (classes are dealt out in class order, the first tasks take the extra ones)
TASKS = {"wordnet-hypernym": 10, "wordnet-supersense": 8, "openclipart": 4, "fashion-mnist": 5,
         "banking77": 7, "clinc150": 10, "hwu64": 8, "stackoverflow20": 5, "caltech101": 10,
         "cifar10": 5}


@dataclass(frozen=True)
class HeadEntry:
    """How to build one head of a benchmark and how it takes data."""

    factory: Callable[[], Any]
    #: ``partial_fit(X, y)`` per task instead of ``fit(ClassGaussians)``
    streaming: bool = False


def task_classes(classes: np.ndarray, n_tasks: int, seed: int) -> list[np.ndarray]:
    """The seed's class order cut into ``n_tasks`` tasks."""
    order = np.random.default_rng([seed, 0]).permutation(classes)
    return [t for t in np.array_split(order, n_tasks) if len(t)]


def _release_freed_memory() -> None:
    """Return freed heap pages to the system (glibc), so resident memory measures live data."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: may under-report, never over
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Context manager: ``peak_bytes`` is the most resident memory added while it was open.

    Freed heap memory is first returned to the system, then ``/proc/self/statm`` is sampled
    every ``interval`` seconds on a thread (Linux). Elsewhere it falls back to the process's
    lifetime peak (``ru_maxrss``), which can only under-report.
    """

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak_bytes = 0

    def __enter__(self) -> PeakRSS:
        _release_freed_memory()
        self._sampled = os.path.exists("/proc/self/statm")
        self._start = _rss_bytes() if self._sampled else self._lifetime_peak()
        self._peak = self._start
        self._stop = threading.Event()
        if self._sampled:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, _rss_bytes())

    @staticmethod
    def _lifetime_peak() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._sampled:
            self._thread.join()
            self._peak = max(self._peak, _rss_bytes())
        else:
            self._peak = self._lifetime_peak()
        self.peak_bytes = max(0, self._peak - self._start)


def _accuracy(pred: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * float((pred == y).double().mean())


def run_head(entry: HeadEntry, X: torch.Tensor, y: np.ndarray, train: np.ndarray,
             test: np.ndarray, tasks: list[np.ndarray]) -> dict:
    """One head through every task: Last-Acc, Inc-Acc, fit seconds, predictions per second,
    peak memory (see the module docstring)."""
    with PeakRSS() as memory:
        head = entry.factory()
        stats = None if entry.streaming else ClassGaussians(X.shape[1])
        accs, fit_s, seen = [], 0.0, []
        for classes in tasks:
            rows = train[np.isin(y[train], classes)]
            X_task, y_task = X[rows], torch.from_numpy(y[rows])
            seen.extend(classes.tolist())
            rows = test[np.isin(y[test], seen)]
            X_test, y_test = X[rows], torch.from_numpy(y[rows])
            start = time.perf_counter()
            if entry.streaming:
                head.partial_fit(X_task, y_task)
            else:
                head.fit(cast(ClassGaussians, stats).update(X_task, y_task))  # not streaming
            head.predict(X_test[:1])  # builds what the head builds lazily
            fit_s += time.perf_counter() - start
            start = time.perf_counter()
            pred = head.predict(X_test)
            predict_s = time.perf_counter() - start
            accs.append(_accuracy(pred, y_test))
        del head, stats
    return {"last_acc": accs[-1], "inc_acc": float(np.mean(accs)), "fit_s": fit_s,
            "predict_per_s": len(X_test) / max(predict_s, 1e-9),
            "peak_mib": memory.peak_bytes / 2**20, "threads": torch.get_num_threads()}


def run_cell(X: torch.Tensor, y: np.ndarray, *, n_tasks: int, test_fraction: float, seed: int,
             heads: dict[str, HeadEntry]) -> dict:
    """:func:`run_head` for every head on one (features, seed)."""
    from .featuresets import split

    train, test = split(y, test_fraction, seed)
    tasks = task_classes(np.unique(y), n_tasks, seed)
    return {name: run_head(entry, X, y, train, test, tasks) for name, entry in heads.items()}


def _mean_over_seeds(per_seed: list[dict], heads) -> dict:
    return {h: {k: float(np.mean([r[h][k] for r in per_seed])) for k in per_seed[0][h]}
            for h in heads}


def run_cells(feature_sets, scalings, seeds, heads: dict[str, HeadEntry], *,
              runs_dir: str | os.PathLike | None = None, log=print) -> list[dict]:
    """Every (feature set, scaling) cell: per-seed results of :func:`run_head` and their mean.

    With ``runs_dir``, each (features, scaling, seed, head) result is written there as soon as it
    is measured (``<features>-<scaling>-<seed>.json``, keyed by head name, with the head's
    ``repr``) and read back instead of rerun while the head's ``repr`` is unchanged, so an
    interrupted benchmark continues where it stopped and benchmarks sharing ``runs_dir`` share
    their measurements. Delete the files to remeasure after changing code.
    """
    from .featuresets import FEATURE_SETS, load_features, scale_features, split

    cells = []
    for name in feature_sets:
        X_raw, y = load_features(name)
        fs = FEATURE_SETS[name]
        for scaling in scalings:
            X = scale_features(X_raw.double(), scaling)
            per_seed = []
            for seed in seeds:
                path = Path(runs_dir) / f"{name}-{scaling}-{seed}.json" if runs_dir else None
                train, test = split(y, fs.test_fraction, seed)
                tasks = task_classes(np.unique(y), TASKS[name], seed)
                measure = partial(run_head, X=X, y=y, train=train, test=test, tasks=tasks)
                per_seed.append({head: _measured(path, head, entry, measure)
                                 for head, entry in heads.items()})
            summary = _mean_over_seeds(per_seed, heads)
            cells.append({"features": name, "scaling": scaling, "heads": summary,
                          "seeds": {str(s): r for s, r in zip(seeds, per_seed)}})
            log(f"{name} {scaling}: " + ", ".join(f"{h} {v['last_acc']:.2f}"
                                                  for h, v in summary.items()))
    return cells


def _measured(path: Path | None, head: str, entry: HeadEntry, measure) -> dict:
    """``measure(entry)``, or its earlier result for the same head ``repr`` stored in ``path``."""
    from ..io import atomic_write_text

    config = repr(entry.factory())
    done = json.loads(path.read_text()) if path is not None and path.exists() else {}
    if done.get(head, {}).get("head") == config:
        return done[head]["result"]
    result = measure(entry)
    if path is not None:
        done = json.loads(path.read_text()) if path.exists() else {}
        done[head] = {"head": config, "result": result}
        atomic_write_text(path, json.dumps(done, indent=1, sort_keys=True) + "\n")
    return result
