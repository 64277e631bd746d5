"""The class-incremental experiment runner.

For every seed and every task ``t``:

1. anchor features under the current backbone (``t > 0``, when a compensator needs them);
2. the Stage-1 strategy adapts the backbone on the task's training samples;
3. features of the task's training samples and of the anchors under the adapted backbone (one
   extraction), and the statistics of the new classes;
4. every compensator track moves its old-class statistics into the new feature space (fitted on
   the anchors' features before and after step 2), then takes the new classes;
5. every head is rebuilt from every track's statistics, every streaming head takes the task's
   training features (``partial_fit``), and each is evaluated on the test samples of all classes
   seen so far.

One backbone trajectory per seed feeds every compensator and every head, so the expensive part
runs once.

Streaming heads (``ranpac``, ``acil``, ``rbf_lda``: :data:`gdacil.heads.STREAMING_HEADS`) keep
statistics of randomly mapped features, not per-class Gaussians in feature space, so no
compensator can move them: each runs once per seed, and its results are labelled as if on the
uncompensated track (:func:`streaming_track`). When the strategy trains the backbone after the
first task, their old classes stay in the old feature space (the paper's no-compensation
baseline). A checkpoint after every task lets ``resume=True`` continue an interrupted run to
exactly the results of an uninterrupted one.

Messages go to the ``gdacil.cil.runner`` logger (:mod:`logging`; the library installs no
handler, the ``gdacil`` command does): INFO for each task's accuracies with the run's progress
and an estimate of the time left, WARNING for what may surprise, DEBUG for each task's timings.
:mod:`gdacil.callbacks` get every Stage-1 step's losses, each task's timings and metrics.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from .. import distributed
from ..callbacks import Callback, CallbackList, TensorBoardLogger
from ..hashing import sha256_json
from ..io import remove_stale_temp_files
from ..stats import ClassGaussians
from .checkpoint import SeedState, load_checkpoint
from .checkpoint import save_checkpoint as save_checkpoint  # bench pipeline patches it
from .config import ExperimentConfig, check_output_name, without_reporting_keys
from .metrics import IncrementalMetrics, TaskEvaluation
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


def result_label(track: str, head: str, n_tracks: int) -> str:
    """``head`` alone with one compensator track, else ``track/head``."""
    return head if n_tracks == 1 else f"{track}/{head}"


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


def task_seed(seed: int, task: int, purpose: int) -> int:
    """An independent seed for (run seed, task, purpose), so streams never overlap across runs."""
    return int(np.random.SeedSequence([seed, task, purpose]).generate_state(1)[0])


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
        self.heads = {track: {label: h.build() for label, h in cfg.heads.items() if not h.streaming}
                      for track in self.compensators}
        self.streaming_label = streaming_track(cfg)

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
            state = SeedState(0, {track: self.cfg.statistics.empty(self.backbone.dim, self.cfg.ddof)
                                  for track in self.compensators},
                              streaming={label: h.build() for label, h in self.cfg.heads.items()
                                         if h.streaming})
        else:
            self._restore(state)
        self._warn_uncompensated(state)
        self.progress.skip(state.completed)
        for t in range(state.completed, len(self.tasks)):
            self.callbacks.on_task_start(self.seed, t, self._task_info(t))
            timing = self.run_task(t, state)
            state.timings.append(timing)
            state.completed = t + 1
            if self.strategy.config.params != "none":
                state.backbone = {k: v.detach().clone()
                                  for k, v in self.backbone.model.state_dict().items()}
                state.strategy = self.strategy.state_dict()
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

    def _restore(self, state: SeedState) -> None:
        if state.backbone is not None:
            self.backbone.model.load_state_dict(state.backbone)
        if state.strategy is not None:
            self.strategy.load_state_dict(*state.strategy)

    def _warn_uncompensated(self, state: SeedState) -> None:
        if state.streaming and any(self.strategy.trains_on(t) for t in range(1, len(self.tasks))):
            self.say.warning(
                f"seed {self.seed}: streaming heads {', '.join(state.streaming)} learn from "
                f"features and are not drift-compensated: strategy {self.strategy.name!r} "
                "changes the backbone, and their old classes stay in the old feature space")

    def run_task(self, t: int, state: SeedState) -> dict:
        """Run task ``t``; returns its timings (``task_s``: all of it, before the checkpoint)."""
        start = time.perf_counter()
        task = self.tasks[t]
        timing: dict = {"task": t}
        clock = _Clock(timing)
        anchor_ids = self._anchor_ids(t)
        with clock("anchors_before_s"):
            old_anchors = self.features(anchor_ids) if anchor_ids else None
        if self.strategy.trains_on(t):
            with clock("adapt_s"):
                labels = np.asarray(task.train.labels)
                log = self.strategy.adapt_task(self.backbone, t, self.tasks.load(task.train.ids),
                                               labels, generator=task_seed(self.seed, t, 0),
                                               on_step=self._on_step(t),
                                               num_workers=self.num_workers)
            timing["adapt"] = {k: v for k, v in log.items() if k not in ("loss", "task_loss",
                                                                            "kd_loss")}
            timing["adapt"]["final_loss"] = log["loss"][-1] if log.get("loss") else None
            final = timing["adapt"]["final_loss"]
            self.say.debug(f"seed {self.seed} task {t + 1}: Stage-1 {log['steps']} steps in "
                           f"{log['seconds']:.2f}s, final loss "
                           f"{'-' if final is None else format(final, '.4g')}")
        with clock("features_s"):  # one extraction for the task's samples and the anchors
            position = {i: k for k, i in enumerate(dict.fromkeys([*task.train.ids, *anchor_ids]))}
            after = self.features(list(position))
            X = after[: len(task.train.ids)]
            new_anchors = (after[torch.tensor([position[i] for i in anchor_ids], dtype=torch.long)]
                           if anchor_ids else None)
        with clock("stats_s"):
            new = ClassGaussians(self.backbone.dim, ddof=self.cfg.ddof).update(
                X, torch.tensor(task.train.labels, dtype=torch.int64))
            if self.cfg.statistics.storage != "dense":  # compress the new classes once, for every track
                new = self.cfg.statistics.empty(self.backbone.dim, self.cfg.ddof).merge(new)
        if old_anchors is not None:
            self._compensate(t, state, old_anchors, new_anchors, timing)
        for stats in state.tracks.values():
            stats.merge(new)  # type: ignore[attr-defined]  # both storages merge
        timing["stats_bytes"] = {track: s.nbytes for track, s in state.tracks.items()}
        self._evaluate(t, state, timing, X)
        timing["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
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

    def _compensate(self, t, state, old_anchors, new_anchors, timing) -> None:
        old_classes = [c for j in range(t) for c in self.tasks[j].classes]
        oracle = self._oracle(t, old_classes) if self.cfg.drift_diagnostics else None
        timing["compensate_s"], report = {}, {"task": t}
        for track, comp in self.compensators.items():
            if comp.name == "identity":
                continue
            start = time.perf_counter()
            before = state.tracks[track]
            rows = self._track_rows(track, old_anchors.shape[0])
            comp.fit(old_anchors[rows], new_anchors[rows])
            state.tracks[track] = comp.transform(before, labels=old_classes)
            timing["compensate_s"][track] = time.perf_counter() - start
            if oracle is not None:
                from ..drift import drift_report

                report[track] = drift_report(state.tracks[track], oracle, before=before,
                                             labels=old_classes)
        if oracle is not None:
            state.diagnostics.append(report)

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

    def _evaluate(self, t: int, state: SeedState, timing: dict, X_task: torch.Tensor) -> None:
        seen = range(t + 1)
        with _Clock(timing)("test_features_s"):
            X_test = torch.cat([self.features(self.tasks[j].test.ids) for j in seen])
        y_test = np.concatenate([np.asarray(self.tasks[j].test.labels) for j in seen])
        task_of = np.concatenate([np.full(len(self.tasks[j].test.ids), j) for j in seen])
        timing["heads"] = {}
        for key, head, build in self._fitted_heads(t, state, X_task):
            start = time.perf_counter()
            pred = head.predict(X_test).numpy()
            state.evaluations.setdefault(key, []).append(TaskEvaluation(y_test, pred, task_of))
            timing["heads"][key] = {"build_s": build, "predict_s": time.perf_counter() - start,
                                    "bytes": head.memory_report()["total"]}

    def _fitted_heads(self, t: int, state: SeedState, X_task: torch.Tensor):
        """``(result label, head, seconds to fit it)`` for every head, fitted up to task ``t``:
        the track heads rebuilt from their statistics, the streaming heads given the task's
        training features."""
        for track, heads in self.heads.items():
            for label, head in heads.items():
                start = time.perf_counter()
                head.fit(state.tracks[track])
                yield result_label(track, label, len(self.heads)), head, time.perf_counter() - start
        labels = torch.tensor(self.tasks[t].train.labels, dtype=torch.int64)
        for label, head in state.streaming.items():
            start = time.perf_counter()
            head.partial_fit(X_task, labels).solve()  # solved here, so it is timed as a build
            yield (result_label(self.streaming_label, label, len(self.heads)), head,
                   time.perf_counter() - start)


def anchor_subset(pool_size: int, n: int, seed: int) -> torch.Tensor:
    """Sorted positions of ``n`` of ``pool_size`` anchors; the subsets for growing ``n`` are
    nested (prefixes of one seeded permutation), so a sweep over ``n`` adds anchors, never swaps."""
    order = np.random.default_rng([seed, pool_size]).permutation(pool_size)
    return torch.from_numpy(np.sort(order[:n]))


class _Clock:
    """``with clock("name_s"):`` records the block's wall time in ``timing["name_s"]``."""

    def __init__(self, timing: dict):
        self.timing = timing

    def __call__(self, key: str):
        self.key = key
        return self

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.timing[self.key] = time.perf_counter() - self.start


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
