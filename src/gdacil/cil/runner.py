"""The class-incremental experiment runner.

For every seed, the run builds one :class:`~gdacil.cil.IncrementalModel` (the backbone, the
Stage-1 strategy, one track of class statistics per compensator, every head) and, for every
task ``t``: the model learns the task (:meth:`~gdacil.cil.IncrementalModel.learn_task`, the task
step the :class:`~gdacil.learner.Learner` takes too, with the task's training samples from the
feature cache and, for ``t > 0`` when a compensator needs them, the anchors), every head is
evaluated on the test samples of all classes seen so far, and the model's state is checkpointed.

One backbone trajectory per seed feeds every compensator and every head, so the expensive part
runs once.

Streaming heads (``ranpac``, ``acil``, ``rbf_lda``: :data:`gdacil.heads.STREAMING_HEADS`) keep
statistics of randomly mapped features, not per-class Gaussians in feature space, so no
compensator can move them: each runs once per seed, and its results are labelled as if on the
uncompensated track (:func:`streaming_track`). When the strategy trains the backbone after the
first task, their old classes stay in the old feature space (the no-compensation baseline
of the LR-RGDA paper [LR-RGDA]). A checkpoint after every task lets ``resume=True`` continue an
interrupted run to exactly the results of an uninterrupted one.

Messages go to the ``gdacil.cil.runner`` logger (:mod:`logging`; the library installs no
handler, the ``gdacil`` command does): INFO for each task's accuracies with the run's progress
and an estimate of the time left, WARNING for what may surprise, DEBUG for each task's timings.
:mod:`gdacil.callbacks` get every Stage-1 step's losses, each task's timings and metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from .. import distributed
from ..callbacks import Callback, CallbackList, TensorBoardLogger
from ..hashing import sha256_json
from ..io import CorruptFileError, remove_stale_temp_files
from ..stats import ClassGaussians
from .checkpoint import ADVICE as CHECKPOINT_ADVICE
from .checkpoint import SeedState, load_checkpoint, save_checkpoint
from .config import ExperimentConfig, check_output_name, without_reporting_keys
from .metrics import IncrementalMetrics, TaskEvaluation
from .model import IncrementalModel, TaskData, _Clock, peak_memory_bytes, result_label
from .progress import RunProgress
from .results import results_record, write_results

__all__ = [
    "anchor_subset",
    "experiment_fingerprint",
    "output_dir",
    "result_label",
    "run_experiment",
    "streaming_track",
]

logger = logging.getLogger(__name__)


def output_dir(cfg: ExperimentConfig) -> Path:
    """``cfg.output_dir`` if set, else ``runs/<name>``, or ``runs/<name>-<hash>`` with ``--set``
    overrides (the first 8 hex digits of the sha256 of the override list, in order). A name that
    would leave ``runs/`` (set after the config was validated) raises
    :class:`~gdacil.cil.ConfigError`."""
    if cfg.output_dir:
        return Path(cfg.output_dir)
    name = check_output_name(cfg.name)
    overrides = list(getattr(cfg, "overrides", ()))
    return Path("runs") / (f"{name}-{sha256_json(overrides)[:8]}" if overrides else name)


def experiment_fingerprint(cfg: ExperimentConfig) -> str:
    """Hash of everything that determines the results (not where they go, nor how the run
    reports its progress)."""
    d = without_reporting_keys(cfg.to_dict())
    # what runs, so a run resumed where "auto" means another precision starts afresh
    d["backbone"]["precision"] = cfg.backbone.resolved_precision()
    if cfg.statistics.storage == "dense":  # the default: fingerprints of earlier runs stay valid
        d.pop("statistics")
    d["protocol"] = cfg.build_protocol(0).identity()  # without storage locations
    return sha256_json(d)


def streaming_track(cfg: ExperimentConfig) -> str:
    """The track streaming heads are reported on: the first ``identity`` compensator's label, or
    ``"none"`` without one (``result_label`` drops it when there is a single track)."""
    return next((label for label, spec in cfg.compensators.items() if spec.name == "identity"),
                "none")


def build_feature_backbone(cfg: ExperimentConfig):
    from ..backbones import RandomProjection, build_backbone

    bc = cfg.backbone
    backbone = build_backbone(bc.name, **bc.options)
    if bc.projection_dim:
        backbone = RandomProjection(backbone, bc.projection_dim, seed=bc.projection_seed)
    return backbone.set_precision(bc.precision)


class _SeedRun:
    def __init__(self, cfg: ExperimentConfig, seed: int, directory: Path,
                 log: Callable | None = None, callbacks: CallbackList | None = None,
                 progress: RunProgress | None = None):
        from ..data import FeatureCache

        self.cfg, self.seed, self.dir = cfg, seed, directory
        self.say = _Messages(log)
        self.callbacks = callbacks if callbacks is not None else CallbackList()
        self.progress = progress if progress is not None else RunProgress()
        with distributed.main_process_first():  # rank 0 writes the manifest, the others check it
            self.tasks = cfg.build_protocol(seed).build(manifest=directory / "manifest.json")
        self.backbone = build_feature_backbone(cfg)
        self.num_workers = cfg.backbone.resolve_workers(self.backbone.device)
        self.strategy = cfg.build_strategy()
        self.compensators = {label: cfg.build_compensator(label) for label in cfg.compensators}
        self.needs_anchors = any(c.name != "identity" for c in self.compensators.values())
        self.external = self.cfg.anchors.build_external() if self.needs_anchors else None
        if self.external is not None and self.external.dataset.modality != self.tasks.modality:
            raise ValueError(f"anchors.dataset {self.external.dataset.name!r} holds "
                             f"{self.external.dataset.modality} samples but the protocol's are "
                             f"{self.tasks.modality}")
        self.anchor_pool = self._draw_anchors() if self.needs_anchors else ()
        self.cache = FeatureCache(cfg.cache_dir)
        self.model = IncrementalModel(
            self.backbone, cfg.statistics, compensators=self.compensators,
            heads={label: h.build for label, h in cfg.heads.items() if not h.streaming},
            streaming={label: h.build() for label, h in cfg.heads.items() if h.streaming},
            strategy=self.strategy, ddof=cfg.ddof, seed=seed,
            adapt_options={"num_workers": self.num_workers}, streaming_track=streaming_track(cfg))

    def _draw_anchors(self) -> tuple[str, ...]:
        from ..data import draw_anchors

        a = self.cfg.anchors
        if self.external is not None:
            return self.external.ids
        return draw_anchors(self.tasks, a.n, seed=a.seed, pool=a.pool) if a.n else ()

    def features(self, ids) -> torch.Tensor:
        """Features of ``ids`` in order, cached under the samples' content hashes (a sample
        changed under the same id is extracted again). Under torch.distributed each rank
        extracts (and caches, under its own key) its contiguous shard, and every rank gets all
        the rows."""
        from ..data.anchors import content_hashes

        progress = self.cfg.progress and distributed.is_main_process()
        namespace = self.tasks.cache_namespace
        if self.external is not None and any(map(self.external.owns, ids)):
            namespace = sha256_json([namespace, self.external.cache_namespace])
        shard = distributed.shard(ids)
        mine = self.cache.get_or_compute(self.backbone, shard, self._load, namespace=namespace,
                                         content=content_hashes(shard, self.tasks, self.external),
                                         batch_size=self.cfg.backbone.batch_size,
                                         progress=progress, num_workers=self.num_workers)
        return distributed.all_gather_rows(mine)

    def _load(self, ids) -> list:
        """Raw samples of task ids and external anchor ids, in order."""
        from ..data.anchors import per_source

        return per_source(ids, self.external, self.external and self.external.load,
                          self.tasks.load)

    # ------------------------------------------------------------------ the loop
    def run(self, state: SeedState | None, on_task_end: Callable | None) -> SeedState:
        if state is None:
            state = SeedState(0)
        else:
            if state.completed > len(self.tasks):
                raise CorruptFileError(self.dir / "state.json", f"records {state.completed} "
                                       f"tasks done of the {len(self.tasks)} the run has",
                                       CHECKPOINT_ADVICE)
            self.model.load_state_parts(state.parts)
        self._warn_uncompensated()
        self.progress.skip(state.completed)
        for t in range(state.completed, len(self.tasks)):
            self.callbacks.on_task_start(self.seed, t, self._task_info(t))
            timing = self.run_task(t, state)
            state.timings.append(timing)
            state.completed = t + 1
            state.parts = self.model.state_parts(heads=False)  # heads: rebuilt from statistics
            if distributed.is_main_process():
                start = time.perf_counter()
                save_checkpoint(self.dir, state, experiment_fingerprint(self.cfg))
                # in memory only (this checkpoint is written): the next one and timings.json
                timing["checkpoint_s"] = time.perf_counter() - start
            self._report(t, state, timing)
            if on_task_end is not None:
                on_task_end(self.seed, t)
        return state

    def _task_info(self, t: int) -> dict:
        """What :meth:`Callback.on_task_start` gets for task ``t``."""
        steps = [self.strategy.config.train.steps if self.strategy.trains_on(j) else 0
                 for j in range(t + 1)]
        return {"tasks": len(self.tasks), "classes": len(self.tasks[t].classes),
                "seen": sum(len(self.tasks[j].classes) for j in range(t + 1)),
                "train_samples": len(self.tasks[t].train.ids), "steps": steps[t],
                "first_step": sum(steps[:t])}

    def _report(self, t: int, state: SeedState, timing: dict) -> None:
        """Log task ``t``'s accuracies with the run's progress, and call the callbacks."""
        self.progress.task_done(timing["task_s"] + timing.get("checkpoint_s", 0.0))
        metrics = {label: {"pooled_acc": evals[-1].pooled,
                           "class_balanced_acc": evals[-1].class_balanced}
                   for label, evals in state.evaluations.items()}
        accs = ", ".join(f"{label} {m['pooled_acc']:.3f}" for label, m in metrics.items())
        seen = sum(len(self.tasks[j].classes) for j in range(t + 1))
        self.say.info(f"seed {self.seed} task {t + 1}/{len(self.tasks)}: "
                      f"{len(self.tasks[t].classes)} new classes, {seen} seen; accuracy {accs} "
                      f"{self.progress.summary()}")
        self.say.debug(f"seed {self.seed} task {t + 1} timings: " + ", ".join(
            f"{key} {value:.3f}s" for key, value in timing.items()
            if key.endswith("_s") and isinstance(value, float)))
        self.callbacks.on_task_end(self.seed, t, timing, metrics)

    def _warn_uncompensated(self) -> None:
        streaming = self.model.streaming
        if streaming and any(self.strategy.trains_on(t) for t in range(1, len(self.tasks))):
            self.say.warning(
                f"seed {self.seed}: streaming heads {', '.join(streaming)} learn from "
                f"features and are not drift-compensated: strategy {self.strategy.name!r} "
                "changes the backbone, and their old classes stay in the old feature space")

    def run_task(self, t: int, state: SeedState) -> dict:
        """Learn task ``t`` and evaluate every head; returns its timings (``task_s``: all of
        it, before the checkpoint)."""
        start = time.perf_counter()
        task = self.tasks[t]
        anchors = self._anchor_ids(t)
        old_classes = [c for j in range(t) for c in self.tasks[j].classes]
        diagnose = anchors and self.cfg.drift_diagnostics
        report: dict = {"task": t}

        def diagnosed(track, before, after):
            """The drift report of ``track`` against the old classes' statistics recomputed
            under the adapted backbone (needs their data; computed once per task)."""
            from ..drift import drift_report

            if "oracle" not in report:
                report["oracle"] = self._oracle(t, old_classes)
            report[track] = drift_report(after, report["oracle"], before=before,
                                         labels=old_classes)

        timing = self.model.learn_task(t, TaskData(
            keys=task.train.ids, labels=torch.tensor(task.train.labels, dtype=torch.int64),
            samples=self.tasks.load(task.train.ids) if self.model.trains_on(t) else (),
            features=self.features, anchors=anchors, anchor_rows=self._track_rows,
            old_classes=old_classes),
            on_step=self._on_step(t), on_compensated=diagnosed if diagnose else None)
        if diagnose:
            report.pop("oracle", None)
            state.diagnostics.append(report)
        if "adapt" in timing:
            log, final = timing["adapt"], timing["adapt"]["final_loss"]
            self.say.debug(f"seed {self.seed} task {t + 1}: Stage-1 {log['steps']} steps in "
                           f"{log['seconds']:.2f}s, final loss "
                           f"{'-' if final is None else format(final, '.4g')}")
        self._evaluate(t, state, timing)
        timing["max_rss_bytes"] = peak_memory_bytes()
        timing["task_s"] = time.perf_counter() - start
        return timing

    def _on_step(self, t: int) -> Callable | None:
        """The strategy's ``on_step`` for task ``t``: ``None`` (no per-step wait for the device)
        unless a callback reads step losses."""
        if not self.callbacks.wants_steps:
            return None
        return lambda step, losses: self.callbacks.on_train_step(self.seed, t, step, losses)

    def _anchor_ids(self, t: int) -> list[str]:
        if t == 0 or not self.needs_anchors:
            return []
        ids = list(self.anchor_pool)
        if self.cfg.anchors.include_current:
            ids += [i for i in self.tasks[t].train.ids if i not in set(self.anchor_pool)]
        if not ids:
            raise ValueError("drift compensation needs anchors: set anchors.n > 0 or "
                             "anchors.include_current: true")
        return ids

    def _track_rows(self, track: str, n_rows: int) -> torch.Tensor | slice:
        """Rows of the anchor features that ``track`` fits on: its subset of the external pool,
        then every current-task sample (which follow the pool in :meth:`_anchor_ids`)."""
        n = self.cfg.track_anchors(track)
        pool = len(self.anchor_pool)
        if n is None or n == pool:
            return slice(None)
        keep = anchor_subset(pool, n, self.cfg.anchors.seed)
        return torch.cat([keep, torch.arange(pool, n_rows)])

    def _oracle(self, t: int, old_classes: list[int]) -> ClassGaussians:
        """Statistics of the old classes recomputed under the current backbone (needs their data)."""
        oracle = ClassGaussians(self.backbone.dim, ddof=self.cfg.ddof)
        for j in range(t):
            split = self.tasks[j].train
            oracle.update(self.features(split.ids), torch.tensor(split.labels, dtype=torch.int64))
        return oracle.subset(old_classes)

    def _evaluate(self, t: int, state: SeedState, timing: dict) -> None:
        """Every head's predictions on the test samples of every class seen so far."""
        seen = range(t + 1)
        with _Clock(timing)("test_features_s"):
            X_test = torch.cat([self.features(self.tasks[j].test.ids) for j in seen])
        y_test = np.concatenate([np.asarray(self.tasks[j].test.labels) for j in seen])
        task_of = np.concatenate([np.full(len(self.tasks[j].test.ids), j) for j in seen])
        for key, head in self.model.fitted_heads():
            start = time.perf_counter()
            pred = head.predict(X_test).numpy()
            state.evaluations.setdefault(key, []).append(TaskEvaluation(y_test, pred, task_of))
            timing["heads"][key].update(predict_s=time.perf_counter() - start,
                                        bytes=head.memory_report()["total"])


def anchor_subset(pool_size: int, n: int, seed: int) -> torch.Tensor:
    """Sorted positions of ``n`` of ``pool_size`` anchors; the subsets for growing ``n`` are
    nested (prefixes of one seeded permutation), so a sweep over ``n`` adds anchors, never swaps."""
    order = np.random.default_rng([seed, pool_size]).permutation(pool_size)
    return torch.from_numpy(np.sort(order[:n]))


def run_experiment(cfg: ExperimentConfig, *, resume: bool = False, overwrite: bool = False,
                   log: Callable | None = None, on_task_end: Callable | None = None,
                   callbacks: Sequence[Callback] = ()) -> dict:
    """Run every seed of ``cfg``; write results, plots and checkpoints to its output directory.

    Under torch.distributed (``torchrun``, see :mod:`gdacil.distributed`) every rank calls
    this: feature extraction and Stage-1 training are shared out, everything else is computed
    identically on every rank, and only rank 0 writes files, logs and calls ``callbacks``.

    Parameters
    ----------
    resume : bool
        Continue from the checkpoints of an interrupted run of the same configuration.
    overwrite : bool
        Discard checkpoints of an earlier run in the output directory (its protocol manifests
        stay, so a run whose split differs is still refused).
    log : callable, optional
        Receives each message of level INFO and above as one string, instead of the
        ``gdacil.cil.runner`` and ``gdacil.cil.results`` loggers.
    on_task_end : callable, optional
        Called as ``on_task_end(seed, task_index)`` after each task's checkpoint is written
        (on every rank).
    callbacks : sequence of :class:`gdacil.callbacks.Callback`
        Told of the run's start and end, each task's start, every Stage-1 step's losses, and
        each task's timings and accuracies. With ``cfg.tensorboard`` a
        :class:`~gdacil.callbacks.TensorBoardLogger` writing to ``<output_dir>/tensorboard``
        is added.

    Returns
    -------
    dict
        The content of ``results.json`` (on every rank).
    """
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other: --resume continues the "
                         "run's checkpoints, --overwrite discards them; pass one of them")
    cfg.check_backbone_options()  # an option the backbone does not take: before any work
    out = output_dir(cfg)
    fingerprint = experiment_fingerprint(cfg)
    main = distributed.is_main_process()
    log = log if main else _quiet
    say = _Messages(log)
    hooks = CallbackList(_run_callbacks(cfg, out, callbacks) if main else ())
    progress = RunProgress()
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if main:  # what writers killed mid-write (kill -9) left here more than an hour ago
        for folder in (out, *(out / f"seed_{seed}" for seed in cfg.seeds)):
            remove_stale_temp_files(folder)
    say.debug(f"{cfg.name}: seeds {', '.join(map(str, cfg.seeds))}, output {out}/, "
              f"fingerprint {fingerprint[:12]}")
    hooks.on_run_start(cfg)
    try:
        states, n_tasks = {}, 0
        for seed in cfg.seeds:
            seed_dir = out / f"seed_{seed}"
            state = _initial_state(seed_dir, fingerprint, resume, overwrite)
            if state is not None:
                say.info(f"seed {seed}: resuming after task {state.completed}")
            runner = _SeedRun(cfg, seed, seed_dir, log, hooks, progress)
            progress.total = progress.total or len(cfg.seeds) * len(runner.tasks)
            states[seed] = runner.run(state, on_task_end)
            n_tasks = len(runner.tasks)
    finally:
        torch.set_num_threads(threads)
    metrics = {seed: {label: _metrics(evals, n_tasks) for label, evals in st.evaluations.items()}
               for seed, st in states.items()}
    diagnostics = {seed: st.diagnostics for seed, st in states.items() if st.diagnostics}
    if not main:
        results = results_record(cfg, metrics, diagnostics=diagnostics)
    else:
        results = write_results(out, cfg, metrics, {s: st.timings for s, st in states.items()},
                                diagnostics=diagnostics, log=log)
    hooks.on_run_end(results)
    distributed.barrier()  # every rank returns once the results are on disk
    return results


def _run_callbacks(cfg: ExperimentConfig, out: Path, callbacks: Sequence[Callback]) -> list:
    """``callbacks``, and the TensorBoard logger if ``cfg`` asks for it."""
    callbacks = list(callbacks)
    if cfg.tensorboard:
        callbacks.append(TensorBoardLogger(out / "tensorboard"))
    return callbacks


def _initial_state(seed_dir: Path, fingerprint: str, resume: bool, overwrite: bool
                   ) -> SeedState | None:
    """The checkpoint in ``seed_dir`` to resume (``resume``), or ``None`` to start afresh
    (``overwrite`` discards an earlier run's checkpoint: rank 0 deletes it, the others wait)."""
    state = None
    if (seed_dir / "state.json").is_file():
        if resume:
            state = load_checkpoint(seed_dir, fingerprint)
        elif not overwrite:
            raise FileExistsError(
                f"{seed_dir} holds a checkpoint of an earlier run; pass --resume to "
                "continue it, --overwrite to start over, or set another output_dir")
        elif distributed.is_main_process():  # the manifest stays: it still guards the data
            for f in (*seed_dir.glob("*_task*.safetensors"), seed_dir / "state.json"):
                f.unlink(missing_ok=True)
    distributed.barrier()
    return state


def _quiet(*_args, **_kwargs) -> None:
    """The ``log`` of ranks other than 0."""


class _Messages:
    """The runner's messages: to :data:`logger` at their level, or, given ``log``, to ``log``
    as plain strings (INFO and above; the ``log`` argument of :func:`run_experiment`)."""

    def __init__(self, log: Callable | None = None):
        self.log = log

    def emit(self, level: int, message: str) -> None:
        if self.log is None:
            logger.log(level, message)
        elif level >= logging.INFO:
            self.log(message)

    def debug(self, message: str) -> None:
        self.emit(logging.DEBUG, message)

    def info(self, message: str) -> None:
        self.emit(logging.INFO, message)

    def warning(self, message: str) -> None:
        self.emit(logging.WARNING, message)


def _metrics(evaluations: list[TaskEvaluation], n_tasks: int) -> IncrementalMetrics:
    m = IncrementalMetrics(n_tasks)
    for e in evaluations:
        m.add(e)
    return m
