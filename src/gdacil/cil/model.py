"""The incremental model: backbone, Stage-1 strategy, compensators, statistics and heads, and the
one task step that both the experiment runner and the :class:`~gdacil.learner.Learner` take.

:meth:`IncrementalModel.learn_task` learns one task:

1. the anchors' features under the backbone as it is (when the task gives anchors);
2. the Stage-1 strategy adapts the backbone on the task's samples (when it trains on the task);
3. the features of the task's samples and of the anchors under the adapted backbone (one
   extraction), and the Gaussian statistics of the task's classes (compressed once when the
   statistics are low-rank);
4. every compensator track moves its statistics into the new feature space, fitted on the
   anchors' features before and after step 2, then takes the task's statistics;
5. every head is rebuilt from its track's statistics, and every streaming head takes the task's
   features (``partial_fit``).

Steps 4 and 5 are a transaction: when a merge or a head fails, every track's statistics and
every head are as they were before the task.

The model does not decide where features come from nor which samples are anchors: the runner
reads them from its feature cache and its anchor pool, the Learner extracts them from the
samples it is given and its reservoir (:class:`TaskData`). Its state (:meth:`state_parts`,
:meth:`state_dict`) is what checkpoints and model bundles store.
"""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..state import State, nest, part
from ..stats import ClassGaussians, ClassStatistics

__all__ = ["IncrementalModel", "TaskData", "result_label", "task_seed"]

#: the seed purpose of a task's Stage-1 training (see :func:`task_seed`)
ADAPT_SEED = 0


def task_seed(seed: int, task: int, purpose: int) -> int:
    """An independent seed for (run seed, task, purpose), so streams never overlap across runs."""
    return int(np.random.SeedSequence([seed, task, purpose]).generate_state(1)[0])


def result_label(track: str, head: str, n_tracks: int) -> str:
    """``head`` alone with one compensator track, else ``track/head``."""
    return head if n_tracks == 1 else f"{track}/{head}"


@dataclass(frozen=True)
class TaskData:
    """What :meth:`IncrementalModel.learn_task` needs of one task, however it is stored.

    - ``keys``: one hashable key per training sample, in order (sample ids, file paths,
      positions);
    - ``labels``: their ``(n,)`` int64 class labels;
    - ``samples``: the raw samples, in order (loaded when indexed, if lazy): what the strategy
      trains on;
    - ``features``: ``features(keys) -> (len(keys), d)`` under the backbone as it is when called;
    - ``anchors``: keys of the anchors whose features before and after the strategy trains fit
      the compensators; empty: the task compensates nothing;
    - ``anchor_rows``: ``anchor_rows(track, n) -> rows`` of the ``n`` anchors that ``track``
      fits on (all of them when None);
    - ``old_classes``: the classes compensation moves, in this order (its pseudo-samples are
      drawn class by class); every class of the track, in storage order, when None.
    """

    keys: Sequence
    labels: torch.Tensor
    samples: Sequence
    features: Callable[[list], torch.Tensor]
    anchors: Sequence = ()
    anchor_rows: Callable[[str, int], torch.Tensor | slice] | None = None
    old_classes: Sequence[int] | None = None


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


class IncrementalModel:
    """A backbone, its Stage-1 strategy, compensator tracks of class statistics, and the heads
    built from them, learning one task at a time.

    Parameters
    ----------
    backbone : Backbone
        What :meth:`learn_task`'s strategy trains (features come from :class:`TaskData`).
    statistics : StatisticsConfig
        How every track stores its class statistics.
    compensators : mapping of str to Compensator
        One track of statistics per compensator, by label.
    heads : mapping of str to callable
        Head label -> a function building the head (one head per track and label).
    streaming : mapping of str to head, optional
        Streaming heads by label (they learn from the task's features, not from a track).
    strategy : Strategy, optional
        The Stage-1 strategy (None: the backbone stays as it is).
    ddof : int
        Of the statistics (0: ``1/n`` covariances, as LR-RGDA [LR-RGDA] uses).
    seed : int
        Seeds each task's Stage-1 training (:func:`task_seed`).
    adapt_options : mapping, optional
        Keyword arguments of the strategy's ``adapt_task`` (``num_workers``).
    streaming_track : str
        The track label streaming heads are reported under (see :func:`result_label`).

    Attributes
    ----------
    tracks : dict of str to ClassStatistics
        The statistics of every track (empty before the first task).
    heads : dict of str to dict of str to head
        ``heads[track][label]``, fitted on that track's statistics after every task.
    streaming : dict of str to head
        The streaming heads.
    """

    def __init__(self, backbone, statistics, *, compensators: Mapping, heads: Mapping[str, Callable],
                 streaming: Mapping | None = None, strategy=None, ddof: int = 0, seed: int = 0,
                 adapt_options: Mapping | None = None, streaming_track: str = "none"):
        self.backbone, self.statistics, self.strategy = backbone, statistics, strategy
        self.compensators = dict(compensators)
        self.ddof, self.seed = ddof, seed
        self.adapt_options = dict(adapt_options or {})
        self.streaming_track = streaming_track
        self.tracks: dict[str, ClassStatistics] = {}
        self._head_builders = dict(heads)
        self.heads = {track: {label: build() for label, build in heads.items()}
                      for track in self.compensators}
        self.streaming = dict(streaming or {})

    def trains_on(self, task: int) -> bool:
        """Whether the strategy trains the backbone on task ``task``."""
        return self.strategy is not None and self.strategy.trains_on(task)

    # ------------------------------------------------------------------ the task step
    def learn_task(self, t: int, task: TaskData, *,
                   on_step: Callable[[int, dict], None] | None = None,
                   on_compensated: Callable[[str, ClassStatistics, ClassStatistics], None]
                   | None = None,
                   finish: Callable[[torch.Tensor], None] | None = None) -> dict:
        """Learn task ``t`` (see the module docstring); returns its timings.

        ``on_step(step, losses)`` gets every Stage-1 step's losses; ``on_compensated(track,
        before, after)`` each track's statistics before and after compensation; ``finish(X)``,
        given the task's features, runs inside the transaction last: an exception there undoes
        the task's statistics and heads too.

        Timings (seconds unless named otherwise): ``anchors_before_s``, ``adapt_s`` and
        ``adapt`` (the strategy's log, when it trains), ``features_s``, ``stats_s``,
        ``compensate_s`` (per track, when anchors are given), ``stats_bytes`` (per track) and
        ``heads`` (``{result label: {"build_s": ...}}``).
        """
        timing: dict = {"task": t}
        clock = _Clock(timing)
        anchors = list(task.anchors)
        with clock("anchors_before_s"):
            old_anchors = task.features(anchors) if anchors else None
        if self.trains_on(t):
            with clock("adapt_s"):
                log = self.strategy.adapt_task(
                    self.backbone, t, task.samples, task.labels.numpy(),
                    generator=task_seed(self.seed, t, ADAPT_SEED), on_step=on_step,
                    **self.adapt_options)
            timing["adapt"] = {k: v for k, v in log.items()
                               if k not in ("loss", "task_loss", "kd_loss")}
            timing["adapt"]["final_loss"] = log["loss"][-1] if log.get("loss") else None
        with clock("features_s"):  # one extraction for the task's samples and the anchors
            X, new_anchors = self._features(task, anchors)
        with clock("stats_s"):
            new = self._task_statistics(X, task.labels)
        tracks = dict(self.tracks) or {track: self.statistics.empty(self.backbone.dim, self.ddof)
                                       for track in self.compensators}
        if old_anchors is not None:
            tracks = self._compensated(tracks, old_anchors, new_anchors, task, timing,
                                       on_compensated)
        self._merge_and_fit(tracks, new, X, task.labels, timing, finish)
        timing["stats_bytes"] = {track: s.nbytes for track, s in self.tracks.items()}
        return timing

    def _features(self, task: TaskData, anchors: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        keys = list(task.keys)
        position = {k: i for i, k in enumerate(dict.fromkeys([*keys, *anchors]))}
        after = task.features(list(position))
        rows = [position[k] for k in keys]
        X = after[: len(keys)] if rows == list(range(len(keys))) else after[rows]
        if not anchors:
            return X, None
        return X, after[torch.tensor([position[k] for k in anchors], dtype=torch.long)]

    def _task_statistics(self, X: torch.Tensor, labels: torch.Tensor) -> ClassStatistics:
        """The task's class statistics, compressed once (for every track) unless dense."""
        new = ClassGaussians(self.backbone.dim, ddof=self.ddof).update(X, labels)
        if self.statistics.storage != "dense":
            new = self.statistics.empty(self.backbone.dim, self.ddof).merge(new)
        return new

    def _compensated(self, tracks, old_anchors, new_anchors, task, timing, on_compensated):
        timing["compensate_s"] = {}
        tracks = dict(tracks)
        for track, comp in self.compensators.items():
            if comp.name == "identity" or not tracks[track].n_classes:
                continue
            start = time.perf_counter()
            before = tracks[track]
            rows = (slice(None) if task.anchor_rows is None
                    else task.anchor_rows(track, old_anchors.shape[0]))
            comp.fit(old_anchors[rows], new_anchors[rows])
            old = before.classes if task.old_classes is None else list(task.old_classes)
            tracks[track] = comp.transform(before, labels=old)
            timing["compensate_s"][track] = time.perf_counter() - start
            if on_compensated is not None:
                on_compensated(track, before, tracks[track])
        return tracks

    def _merge_and_fit(self, tracks, new, X, labels, timing, finish) -> None:
        """Merge the task's statistics into every track and refit every head, as one
        transaction; then the streaming heads take the task's features."""
        heads: dict = {}
        try:
            with contextlib.ExitStack() as undo:
                for stats in tracks.values():
                    undo.enter_context(stats.rollback_on_error(new.classes))
                for stats in tracks.values():
                    stats.merge(new)
                for track, track_heads in self.heads.items():
                    for label, head in track_heads.items():
                        start = time.perf_counter()
                        head.fit(tracks[track])
                        heads[result_label(track, label, len(self.heads))] = {
                            "build_s": time.perf_counter() - start}
                if finish is not None:
                    finish(X)
        except BaseException:
            self._restore_heads()
            raise
        self.tracks = tracks
        for label, head in self.streaming.items():
            start = time.perf_counter()
            head.partial_fit(X, labels).solve()  # solved here, so it is timed as a build
            heads[result_label(self.streaming_track, label, len(self.heads))] = {
                "build_s": time.perf_counter() - start}
        timing["heads"] = heads

    def _restore_heads(self) -> None:
        """Every track head as before a failed task: refitted on the statistics of before
        (rolled back), or built afresh where there were none."""
        for track, track_heads in self.heads.items():
            stats = self.tracks.get(track)
            for label in track_heads:
                if stats is not None and stats.n_classes:
                    track_heads[label].fit(stats)
                else:
                    track_heads[label] = self._head_builders[label]()

    def fitted_heads(self):
        """``(result label, head)`` of every head: track heads, then streaming heads."""
        for track, track_heads in self.heads.items():
            for label, head in track_heads.items():
                yield result_label(track, label, len(self.heads)), head
        for label, head in self.streaming.items():
            yield result_label(self.streaming_track, label, len(self.heads)), head

    # ------------------------------------------------------------------ state
    def state_parts(self, *, heads: bool = True) -> dict[str, State]:
        """The model's state in named parts: ``tracks/<track>``, ``heads/<track>/<label>``
        (fitted track heads; left out with ``heads=False``: they are rebuilt from the
        statistics), ``streaming/<label>``, and ``backbone`` and ``strategy`` when a strategy
        trains the backbone."""
        parts = {f"tracks/{track}": stats.state_dict() for track, stats in self.tracks.items()}
        if heads and self.tracks:
            parts.update({f"heads/{track}/{label}": head.state_dict()
                          for track, track_heads in self.heads.items()
                          for label, head in track_heads.items()})
        parts.update({f"streaming/{label}": head.state_dict()
                      for label, head in self.streaming.items() if hasattr(head, "stats_")})
        if self.strategy is not None and self.strategy.config.params != "none":
            parts["backbone"] = (backbone_weights(self.backbone), {})
            parts["strategy"] = self.strategy.state_dict()
        return parts

    def load_state_parts(self, parts: Mapping[str, State]) -> IncrementalModel:
        """Set the state of :meth:`state_parts` (any subset of its parts); returns ``self``."""
        for name, state in parts.items():
            kind, _, rest = name.partition("/")
            if kind == "tracks":
                self.tracks[rest] = ClassStatistics.from_state(state, source=name)
            elif kind == "heads":
                track, _, label = rest.partition("/")
                self.heads[track][label].load_state_dict(*state)
            elif kind == "streaming":
                self.streaming[rest].load_state_dict(*state)
            elif kind == "backbone":
                self.backbone.model.load_state_dict(state[0])
            elif kind == "strategy":
                self.strategy.load_state_dict(*state)
            else:
                raise ValueError(f"unknown part {name!r} of a model's state")
        for track, track_heads in self.heads.items():
            if track in self.tracks:
                for head in track_heads.values():
                    if hasattr(head, "classes_"):
                        head.bind(self.tracks[track])
        return self

    def state_dict(self) -> State:
        """All of :meth:`state_parts` as one state (:func:`gdacil.state.nest`)."""
        return nest(self.state_parts())

    def load_state_dict(self, tensors, metadata) -> IncrementalModel:
        return self.load_state_parts({name: part((tensors, metadata), name) for name in metadata})


def backbone_weights(backbone) -> dict[str, torch.Tensor]:
    """A copy of the backbone's weights (standard strides: safetensors and hashing need them)."""
    return {k: v.detach().clone(memory_format=torch.contiguous_format)
            for k, v in backbone.model.state_dict().items()}


def peak_memory_bytes() -> int:
    """The process's peak resident memory so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
