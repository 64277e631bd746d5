"""Fair, deadline-bound batching of prediction requests (what ``gdacil serve`` scores with).

A :class:`PredictionScheduler` owns one worker thread that runs every backbone forward. Requests
are queued as jobs; each forward takes a batch built from the waiting jobs:

- **smallest job first, round-robin**: the jobs with the least work left give their inputs
  first, one input per job in turn, so a one-input request joins the very next batch however
  much work another client has queued;
- **batches of bounded time**: a batch holds at most ``max_batch`` inputs and about
  ``batch_seconds`` of work, estimated from the time per unit of cost the worker has measured so
  far (a text costs its length in tokens, an image costs 1). So the forward in flight when a
  request arrives ends within about ``batch_seconds``, and a small request is answered within
  about two batches (plus its own decoding), whatever the other clients send;
- **bounded queue**: a job that would bring the inputs waiting over ``max_pending`` is refused at
  once (:class:`Busy`), instead of waiting behind work it cannot finish before its deadline;
- **deadlines**: a job not finished by its deadline fails with :class:`Expired` and its remaining
  inputs are dropped, so abandoned work does not hold up the others;
- **one model per job**: a job is answered wholly by the model it was submitted under (a batch
  only mixes jobs of one model), so a model swapped in mid-job never mixes two versions;
- **options**: a job's ``options`` (what it asks beyond ``top_k``, e.g. rejection) are passed
  to ``run``, and a batch only mixes jobs of equal options, so no job gets answers computed
  for another's.

If a batch fails, each of its jobs is retried alone, so one bad input fails only its own job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

__all__ = ["Busy", "Expired", "PredictionScheduler"]


class Busy(RuntimeError):
    """The queue is full: the job was not accepted."""


class Expired(TimeoutError):
    """The job's deadline passed before all its inputs were scored."""


@dataclass(eq=False)
class _Job:
    model: object
    items: list
    costs: list[float]
    top_k: int
    deadline: float
    options: tuple = ()  # sorted (name, value) pairs: run's keyword arguments
    future: Future = field(default_factory=Future)
    results: list = field(default_factory=list)
    given: int = 0  # inputs handed to batches so far

    @property
    def left(self) -> float:
        return sum(self.costs[self.given:])


class PredictionScheduler:
    """Score queued jobs with ``run(model, items, top_k) -> one result per item`` on one thread.

    Parameters
    ----------
    run : callable
        ``run(model, items, top_k, **options)``: the results of ``items`` under ``model``, in
        order (``options``: those the jobs were submitted with; none for most).
    max_batch : int
        Most inputs in one call of ``run``.
    max_pending : int
        Most inputs waiting (queued and not yet scored); more is refused with :class:`Busy`.
    batch_seconds : float
        Target duration of one call of ``run``.
    clock : callable
        Seconds, monotonic (for tests).

    Examples
    --------
    >>> scheduler = PredictionScheduler(lambda model, items, k: [model * x for x in items],
    ...                                 max_batch=8, max_pending=64, batch_seconds=0.1).start()
    >>> scheduler.submit(10, [1, 2, 3], [1.0] * 3, top_k=1, timeout=5).result()
    [10, 20, 30]
    >>> scheduler.close()
    """

    def __init__(self, run: Callable[[object, list, int], Sequence], *, max_batch: int = 64,
                 max_pending: int = 1024, batch_seconds: float = 0.3,
                 clock: Callable[[], float] = time.monotonic):
        self.run = run
        self.max_batch, self.max_pending, self.batch_seconds = max_batch, max_pending, batch_seconds
        self.clock = clock
        self.seconds_per_cost: float | None = None  # measured; None until the first batch
        self.batches = 0
        self._jobs: list[_Job] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> PredictionScheduler:
        with self._cond:
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._work, name="gdacil-predict",
                                                daemon=True)
                self._thread.start()
        return self

    def close(self, reason: BaseException | None = None) -> None:
        """Stop the worker once its batch in flight is scored; every job not finished then
        fails with ``reason`` (default: :class:`Busy`), and new jobs are refused."""
        with self._cond:
            self._stop = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join()
        with self._cond:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            _fail(job, reason or Busy("the server is shutting down"))

    @property
    def alive(self) -> bool:
        """Whether the worker thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Inputs queued and not yet handed to a batch."""
        with self._cond:
            return sum(len(j.items) - j.given for j in self._jobs)

    # ------------------------------------------------------------------ jobs
    def submit(self, model, items: list, costs: list[float], *, top_k: int,
               timeout: float, options: Mapping | None = None) -> Future:
        """Queue ``items`` (with their ``costs``) to be scored under ``model``; the future
        resolves to their results, or fails with :class:`Expired` after ``timeout`` seconds.
        ``options`` (hashable values) are passed to ``run`` as keyword arguments; the job shares
        batches only with jobs of equal options. Raises :class:`Busy` when the queue is full or
        the scheduler is not running."""
        if len(costs) != len(items):
            raise ValueError(f"{len(items)} items but {len(costs)} costs")
        job = _Job(model, list(items), [float(c) for c in costs], top_k, self.clock() + timeout,
                   tuple(sorted((options or {}).items())))
        with self._cond:
            if self._stop or self._thread is None:
                raise Busy("the server is not running")
            self._drop_expired()
            waiting = sum(len(j.items) - j.given for j in self._jobs)
            if waiting + len(items) > self.max_pending:
                raise Busy(f"the server is busy ({waiting} inputs waiting, at most "
                           f"{self.max_pending}); try again shortly")
            self._jobs.append(job)
            self._cond.notify()
        return job.future

    def _next_batch(self) -> list[tuple[_Job, int]]:
        """Inputs for the next forward (called with the lock held): expired jobs dropped, then
        one input per job in turn, smallest job first, within the batch's size and time."""
        self._drop_expired()
        if not self._jobs:
            return []
        first = min(self._jobs, key=lambda j: j.left)
        ready = sorted((j for j in self._jobs if j.model is first.model
                        and j.options == first.options and j.given < len(j.items)),
                       key=lambda j: j.left)
        budget = (self.batch_seconds / self.seconds_per_cost
                  if self.seconds_per_cost else float("inf"))
        batch: list[tuple[_Job, int]] = []
        spent, cursor = 0.0, {id(j): j.given for j in ready}
        while ready and len(batch) < self.max_batch:
            for job in list(ready):
                i = cursor[id(job)]
                cost = job.costs[i]
                if batch and (spent + cost > budget or len(batch) >= self.max_batch):
                    ready = []
                    break
                batch.append((job, i))
                spent += cost
                cursor[id(job)] = i + 1
                if i + 1 == len(job.items):
                    ready.remove(job)
        for job in {id(j): j for j, _ in batch}.values():
            job.given = cursor[id(job)]
        return batch

    def _drop_expired(self) -> None:
        """Drop the jobs past their deadline or given up by their caller (lock held)."""
        now = self.clock()
        for job in [j for j in self._jobs if j.deadline <= now or j.future.done()]:
            self._jobs.remove(job)
            _fail(job, Expired("not answered within its deadline; the server is overloaded"))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._stop and not self._jobs:
                    self._cond.wait()
                if self._stop:
                    return
                batch = self._next_batch()
            if batch:
                self._score(batch)

    def _score(self, batch: list[tuple[_Job, int]]) -> None:
        jobs = list({id(j): j for j, _ in batch}.values())
        model, options = jobs[0].model, dict(jobs[0].options)  # one model and options a batch
        top_k = max(j.top_k for j in jobs)
        started = self.clock()
        try:
            results = list(self.run(model, [j.items[i] for j, i in batch], top_k, **options))
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} inputs")
        except Exception as exc:  # one bad input fails only its own job
            if len(jobs) == 1:
                self._drop(jobs[0], exc)
            else:
                for job in jobs:
                    self._score([(j, i) for j, i in batch if j is job])
            return
        self._learn_speed(self.clock() - started, sum(j.costs[i] for j, i in batch))
        for (job, _), result in zip(batch, results):
            job.results.append(result)
        with self._cond:
            finished = [j for j in jobs if len(j.results) == len(j.items)]
            for job in finished:
                if job in self._jobs:
                    self._jobs.remove(job)
        for job in finished:
            if not job.future.done():
                job.future.set_result(job.results)

    def _drop(self, job: _Job, exc: BaseException) -> None:
        with self._cond:
            if job in self._jobs:
                self._jobs.remove(job)
        _fail(job, exc)

    def _learn_speed(self, seconds: float, cost: float) -> None:
        """Update the measured seconds per unit of cost (a moving average over batches)."""
        self.batches += 1
        if cost <= 0:
            return
        rate = seconds / cost
        self.seconds_per_cost = rate if self.seconds_per_cost is None else (
            0.7 * self.seconds_per_cost + 0.3 * rate)


def _fail(job: _Job, exc: BaseException) -> None:
    if not job.future.done():
        job.future.set_exception(exc)
