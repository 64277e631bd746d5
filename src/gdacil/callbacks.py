"""Callbacks: what an experiment run reports while it runs.

:func:`gdacil.cil.run_experiment` calls every :class:`Callback` it is given (``callbacks=[...]``)
at five points::

    on_run_start(cfg)
    for each seed, for each task:
        on_task_start(seed, task, info)
        on_train_step(seed, task, step, losses)     # every Stage-1 step, while it trains
        on_task_end(seed, task, timing, metrics)   # after the task's checkpoint is written
    on_run_end(results)

A callback overrides the methods it needs; the others do nothing. Under torch.distributed only
rank 0 calls them. Callbacks observe: they must not change what they are given.
:class:`TensorBoardLogger` writes all of it as TensorBoard scalars (``tensorboard: true`` in an
experiment config, or ``gdacil run --tensorboard``).

>>> class LastLoss(Callback):
...     def on_train_step(self, seed, task, step, losses):
...         self.last = losses["loss"]
>>> recorder = LastLoss()
>>> CallbackList([recorder]).on_train_step(0, 0, 0, {"loss": 1.5, "task_loss": 1.5, "kd_loss": 0.0})
>>> recorder.last
1.5
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from pathlib import Path

from ._optional import require

__all__ = ["Callback", "CallbackList", "TensorBoardLogger"]


class Callback:
    """Hooks of an experiment run; every method is a no-op unless overridden.

    ``seed`` is the run seed and ``task`` the 0-based task index throughout.
    """

    def on_run_start(self, cfg) -> None:
        """Before the first seed; ``cfg`` is the :class:`~gdacil.cil.ExperimentConfig`."""

    def on_task_start(self, seed: int, task: int, info: dict) -> None:
        """Before task ``task`` of ``seed``.

        ``info`` holds ``tasks`` (the seed's number of tasks), ``classes`` (new classes),
        ``seen`` (classes after this task), ``train_samples``, ``steps`` (the Stage-1 steps this
        task trains; 0 when the backbone stays frozen) and ``first_step`` (the Stage-1 steps of
        the seed's earlier tasks, so ``first_step + step`` counts steps over the whole seed, a
        resumed run included).
        """

    def on_train_step(self, seed: int, task: int, step: int, losses: dict[str, float]) -> None:
        """After Stage-1 optimisation step ``step`` (0-based, within the task).

        ``losses`` maps ``loss`` (the total), ``task_loss`` and ``kd_loss`` to that step's
        values: the entries ``step`` of the lists in the strategy's training log. Under
        torch.distributed they are summed over the ranks once the task's training ends, and
        the calls come then.
        """

    def on_task_end(self, seed: int, task: int, timing: dict, metrics: dict) -> None:
        """After task ``task`` of ``seed`` is evaluated and checkpointed.

        ``timing`` is the task's entry of ``timings.json`` (seconds under keys ending in
        ``_s``: ``task_s``, ``adapt_s``, ``features_s``, ``test_features_s``, ``checkpoint_s``,
        ...). ``metrics`` maps each result label (as in ``results.json``) to its
        ``pooled_acc`` and ``class_balanced_acc`` on every class seen so far.
        """

    def on_run_end(self, results: dict) -> None:
        """After the results are written; ``results`` is the content of ``results.json``."""


class CallbackList(Callback):
    """Calls each of ``callbacks`` in order, at every hook.

    Parameters
    ----------
    callbacks : iterable of Callback
    """

    def __init__(self, callbacks: Iterable[Callback] = ()):
        self.callbacks = list(callbacks)
        bad = [c for c in self.callbacks if not isinstance(c, Callback)]
        if bad:
            raise TypeError(f"callbacks must be gdacil.callbacks.Callback instances; got {bad!r}")

    def __len__(self) -> int:
        return len(self.callbacks)

    @property
    def wants_steps(self) -> bool:
        """Whether a callback overrides :meth:`~Callback.on_train_step` (reading every step's
        losses as it happens waits for the device, so it is skipped when nothing listens)."""
        return any(type(c).on_train_step is not Callback.on_train_step for c in self.callbacks)

    def on_run_start(self, cfg) -> None:
        for c in self.callbacks:
            c.on_run_start(cfg)

    def on_task_start(self, seed, task, info) -> None:
        for c in self.callbacks:
            c.on_task_start(seed, task, info)

    def on_train_step(self, seed, task, step, losses) -> None:
        for c in self.callbacks:
            c.on_train_step(seed, task, step, losses)

    def on_task_end(self, seed, task, timing, metrics) -> None:
        for c in self.callbacks:
            c.on_task_end(seed, task, timing, metrics)

    def on_run_end(self, results) -> None:
        for c in self.callbacks:
            c.on_run_end(results)


class TensorBoardLogger(Callback):
    """Writes a run's progress as TensorBoard scalars, one run folder per seed.

    Under ``log_dir/seed<k>/`` (the experiment runner uses ``<output_dir>/tensorboard``):

    - ``stage1/loss``, ``stage1/task_loss``, ``stage1/kd_loss``: every Stage-1 step, at its
      step over the seed (``info["first_step"] + step``);
    - ``accuracy/<label>`` and ``class_balanced_accuracy/<label>``: after each task, at the
      number of tasks learned (1, 2, ...);
    - ``time/<key>`` for every time in the task's timings (``time/task_s``,
      ``time/heads/<label>/build_s``, ``time/compensate_s/<track>``, ...) and
      ``memory/<key>`` for every byte count (``memory/max_rss_bytes``, ...), at the number of
      tasks learned.

    A resumed run appends to the same folders. Needs the ``tensorboard`` package
    (``pip install 'gdacil[tensorboard]'``).

    Parameters
    ----------
    log_dir : str or Path
        The folder of the seeds' run folders.
    """

    def __init__(self, log_dir):
        require("tensorboard", feature="the TensorBoard logger",
                install="pip install 'gdacil[tensorboard]'")
        self.log_dir = Path(log_dir)
        self._writers: dict = {}
        self._first_step: dict[int, int] = {}

    def writer(self, seed: int):
        """The ``SummaryWriter`` of ``seed`` (created on first use)."""
        if seed not in self._writers:
            from torch.utils.tensorboard import SummaryWriter

            self._writers[seed] = SummaryWriter(str(self.log_dir / f"seed{seed}"))
        return self._writers[seed]

    def on_task_start(self, seed, task, info) -> None:
        self._first_step[seed] = int(info.get("first_step", 0))

    def on_train_step(self, seed, task, step, losses) -> None:
        writer, at = self.writer(seed), self._first_step.get(seed, 0) + step
        for name, value in losses.items():
            writer.add_scalar(f"stage1/{name}", value, at)

    def on_task_end(self, seed, task, timing, metrics) -> None:
        writer, at = self.writer(seed), task + 1
        for label, m in metrics.items():
            writer.add_scalar(f"accuracy/{label}", m["pooled_acc"], at)
            writer.add_scalar(f"class_balanced_accuracy/{label}", m["class_balanced_acc"], at)
        for key, value in _numbers(timing):
            parts = key.split("/")
            if any(p.endswith("_s") for p in parts):
                writer.add_scalar(f"time/{key}", value, at)
            elif any(p.endswith("bytes") for p in parts):
                writer.add_scalar(f"memory/{key}", value, at)
        writer.flush()  # a run killed later keeps what its finished tasks wrote

    def on_run_end(self, results) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close every seed's writer."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


def _numbers(tree: dict, prefix: str = ""):
    """``(path/to/key, value)`` for every number in a nested dict, paths joined by ``/``."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _numbers(value, f"{path}/")
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            yield path, float(value)
