"""Progress of a run over all its seeds: tasks done, time elapsed, and an estimate of the rest.

The estimate is the mean time of the tasks this process has run, times the tasks left (tasks a
resumed run found checkpointed count as done but not in the mean). Later tasks evaluate more
classes, so it tends to run short; it is an estimate, and says so.

>>> progress = RunProgress(total=4, clock=iter([0.0, 30.0]).__next__)
>>> progress.task_done(10.0)
>>> progress.task_done(20.0)
>>> progress.summary()
'[2/4 tasks, 30s elapsed, about 30s left]'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["RunProgress", "format_duration", "remaining_seconds"]


def remaining_seconds(task_seconds: Sequence[float], tasks_left: int) -> float | None:
    """The mean of ``task_seconds`` times ``tasks_left``; ``None`` before any task is timed.

    >>> remaining_seconds([10.0, 20.0], 3)
    45.0
    >>> remaining_seconds([], 3) is None
    True
    """
    if tasks_left < 0:
        raise ValueError(f"tasks_left must be >= 0; got {tasks_left}")
    if not task_seconds:
        return None
    return sum(task_seconds) / len(task_seconds) * tasks_left


def format_duration(seconds: float) -> str:
    """``45s``, ``1m20s``, ``2h05m``: two units at most, rounded to the smaller.

    >>> [format_duration(s) for s in (4.4, 80, 3599.6, 7500)]
    ['4s', '1m20s', '1h00m', '2h05m']
    """
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


class RunProgress:
    """Counts the tasks of a run and estimates the time left.

    Parameters
    ----------
    total : int, optional
        Tasks over all seeds; may be set later (the runner knows it once the first seed's
        protocol is built).
    clock : callable
        Seconds, monotonic; elapsed time counts from construction.
    """

    def __init__(self, total: int | None = None, *,
                 clock: Callable[[], float] = time.perf_counter):
        self.total = total
        self.done = 0
        self.task_seconds: list[float] = []
        self._clock = clock
        self._start = clock()

    def skip(self, n: int) -> None:
        """Count ``n`` tasks done earlier (restored from a checkpoint), not timed here."""
        self.done += n

    def task_done(self, seconds: float) -> None:
        """Count a task this process ran in ``seconds``."""
        self.done += 1
        self.task_seconds.append(seconds)

    def summary(self) -> str:
        """``[12/30 tasks, 1m20s elapsed, about 2m40s left]`` (no estimate once all are done)."""
        elapsed = format_duration(self._clock() - self._start)
        total = self.total if self.total is not None else "?"
        parts = [f"{self.done}/{total} tasks", f"{elapsed} elapsed"]
        if self.total is not None and self.done < self.total:
            left = remaining_seconds(self.task_seconds, self.total - self.done)
            if left is not None:
                parts.append(f"about {format_duration(left)} left")
        return f"[{', '.join(parts)}]"
