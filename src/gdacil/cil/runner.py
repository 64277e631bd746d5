"""The class-incremental experiment runner.

For every seed and every task ``t``: features of the task's training samples (from the feature
cache) -> statistics of the new classes merged into the running :class:`~gdacil.ClassGaussians`
-> every configured head rebuilt from the same statistics -> evaluation on the test samples of
all classes seen so far. A checkpoint after every task lets ``resume=True`` continue an
interrupted run to exactly the results of an uninterrupted one.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..hashing import sha256_json
from ..heads import build_head
from ..stats import ClassGaussians
from .checkpoint import SeedState, load_checkpoint, save_checkpoint
from .config import ExperimentConfig
from .metrics import IncrementalMetrics, TaskEvaluation
from .results import write_results

__all__ = ["run_experiment", "experiment_fingerprint", "output_dir"]


def output_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg.output_dir or Path("runs") / cfg.name)


def experiment_fingerprint(cfg: ExperimentConfig) -> str:
    """Hash of everything that determines the results (not where they go, nor progress bars)."""
    d = cfg.to_dict()
    for key in ("output_dir", "cache_dir", "progress"):
        d.pop(key)
    d["protocol"] = cfg.build_protocol(0).identity()  # without storage locations
    return sha256_json(d)


def build_feature_backbone(cfg: ExperimentConfig):
    from ..backbones import RandomProjection, build_backbone

    bc = cfg.backbone
    backbone = build_backbone(bc.name, **bc.options)
    if bc.projection_dim:
        backbone = RandomProjection(backbone, bc.projection_dim, seed=bc.projection_seed)
    return backbone


@dataclass
class _TaskData:
    """Features and labels of one task's split, with the index of the task."""

    X: torch.Tensor
    y: np.ndarray
    task: int


class _SeedRun:
    def __init__(self, cfg: ExperimentConfig, seed: int, directory: Path, log: Callable):
        from ..data import FeatureCache

        self.cfg, self.seed, self.dir, self.log = cfg, seed, directory, log
        self.tasks = cfg.build_protocol(seed).build(manifest=directory / "manifest.json")
        self.backbone = build_feature_backbone(cfg)
        self.cache = FeatureCache(cfg.cache_dir)
        self.heads = {label: build_head(h.name, **h.params) for label, h in cfg.heads.items()}
        self._test: dict[int, _TaskData] = {}

    def features(self, ids) -> torch.Tensor:
        return self.cache.get_or_compute(self.backbone, ids, self.tasks.load,
                                         namespace=self.tasks.cache_namespace,
                                         batch_size=self.cfg.backbone.batch_size,
                                         progress=self.cfg.progress)

    def test_data(self, t: int) -> _TaskData:
        if t not in self._test:
            split = self.tasks[t].test
            self._test[t] = _TaskData(self.features(split.ids), np.asarray(split.labels), t)
        return self._test[t]

    def run(self, state: SeedState | None, on_task_end: Callable | None) -> SeedState:
        if state is None:
            state = SeedState(0, ClassGaussians(self.backbone.dim, ddof=self.cfg.ddof),
                              {label: [] for label in self.heads})
        for t in range(state.completed, len(self.tasks)):
            state.timings.append(self.run_task(t, state))
            state.completed = t + 1
            save_checkpoint(self.dir, state, experiment_fingerprint(self.cfg))
            if on_task_end is not None:
                on_task_end(self.seed, t)
        return state

    def run_task(self, t: int, state: SeedState) -> dict:
        task = self.tasks[t]
        timing: dict = {"task": t}
        start = time.perf_counter()
        X = self.features(task.train.ids)
        timing["features_s"] = time.perf_counter() - start
        start = time.perf_counter()
        state.stats.update(X, torch.tensor(task.train.labels, dtype=torch.int64))
        timing["stats_s"] = time.perf_counter() - start
        timing["stats_bytes"] = state.stats.nbytes
        seen = [self.test_data(j) for j in range(t + 1)]
        X_test = torch.cat([s.X for s in seen])
        y_test = np.concatenate([s.y for s in seen])
        task_of = np.concatenate([np.full(len(s.y), s.task) for s in seen])
        timing["heads"] = {}
        for label, head in self.heads.items():
            start = time.perf_counter()
            head.fit(state.stats)
            build = time.perf_counter() - start
            start = time.perf_counter()
            pred = head.predict(X_test).numpy()
            evaluation = TaskEvaluation(y_test, pred, task_of)
            state.evaluations[label].append(evaluation)
            timing["heads"][label] = {"build_s": build, "predict_s": time.perf_counter() - start,
                                      "bytes": head.memory_report()["total"]}
        timing["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        accs = ", ".join(f"{k} {v[-1].pooled:.3f}" for k, v in state.evaluations.items())
        self.log(f"seed {self.seed} task {t + 1}/{len(self.tasks)}: {len(task.classes)} new classes, "
                 f"{state.stats.n_classes} seen; accuracy {accs}")
        return timing


def run_experiment(cfg: ExperimentConfig, *, resume: bool = False, overwrite: bool = False,
                   log: Callable = print, on_task_end: Callable | None = None) -> dict:
    """Run every seed of ``cfg``; write results, plots and checkpoints to its output directory.

    Parameters
    ----------
    resume : bool
        Continue from the checkpoints of an interrupted run of the same configuration.
    overwrite : bool
        Discard checkpoints of an earlier run in the output directory (its protocol manifests
        stay, so a run whose split differs is still refused).
    on_task_end : callable, optional
        Called as ``on_task_end(seed, task_index)`` after each task's checkpoint is written.

    Returns
    -------
    dict
        The content of ``results.json``.
    """
    out = output_dir(cfg)
    fingerprint = experiment_fingerprint(cfg)
    states = {}
    for seed in cfg.seeds:
        seed_dir = out / f"seed_{seed}"
        state = None
        if (seed_dir / "state.json").is_file():
            if resume:
                state = load_checkpoint(seed_dir, fingerprint)
                log(f"seed {seed}: resuming after task {state.completed}")
            elif not overwrite:
                raise FileExistsError(
                    f"{seed_dir} holds a checkpoint of an earlier run; pass --resume to continue "
                    "it, --overwrite to start over, or set another output_dir")
            else:  # the manifest stays: it still guards the data against silent changes
                for f in (*seed_dir.glob("stats_task*.safetensors"), seed_dir / "state.json"):
                    f.unlink(missing_ok=True)
        runner = _SeedRun(cfg, seed, seed_dir, log)
        states[seed] = runner.run(state, on_task_end)
        n_tasks = len(runner.tasks)
    metrics = {
        seed: {label: _metrics(evals, n_tasks) for label, evals in state.evaluations.items()}
        for seed, state in states.items()
    }
    return write_results(out, cfg, metrics, {s: st.timings for s, st in states.items()}, log=log)


def _metrics(evaluations: list[TaskEvaluation], n_tasks: int) -> IncrementalMetrics:
    m = IncrementalMetrics(n_tasks)
    for e in evaluations:
        m.add(e)
    return m
