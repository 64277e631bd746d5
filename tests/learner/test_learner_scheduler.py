"""The serving scheduler (:mod:`gdacil.learner.scheduler`): a small request is never stuck behind
another client's work, batches stay within their time, the queue and deadlines are bounded, one
bad input fails only its own request, and one request never mixes two models."""

from __future__ import annotations

import threading

import pytest

from gdacil.learner.scheduler import Busy, Expired, PredictionScheduler


class Recorder:
    """A ``run`` that records each batch and can be held inside a batch until released."""

    def __init__(self, fail_on=None):
        self.batches: list[tuple[object, list]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail_on = fail_on

    def __call__(self, model, items, top_k):
        self.batches.append((model, list(items)))
        self.entered.set()
        assert self.release.wait(30)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"bad input {self.fail_on!r}")
        return [(model, x, top_k) for x in items]


def hold_first_batch(run: Recorder, scheduler: PredictionScheduler, model, items):
    """Submit ``items`` and wait until their first batch is inside ``run``, held there."""
    run.release.clear()
    future = scheduler.submit(model, items, [1.0] * len(items), top_k=1, timeout=60)
    assert run.entered.wait(30)
    return future


def test_a_small_request_joins_the_next_batch_whatever_another_client_queued():
    run = Recorder()
    scheduler = PredictionScheduler(run, max_batch=8, max_pending=1000, batch_seconds=1.0)
    scheduler.seconds_per_cost = 1 / 8  # 8 inputs of cost 1 fill one batch's time
    scheduler.start()
    try:
        big = hold_first_batch(run, scheduler, "m", [f"big{i}" for i in range(200)])
        more = scheduler.submit("m", [f"more{i}" for i in range(100)], [1.0] * 100, top_k=1,
                                timeout=60)
        small = scheduler.submit("m", ["small"], [1.0], top_k=3, timeout=60)
        run.release.set()
        assert [x for _, x, _ in small.result(30)] == ["small"]
        assert len(big.result(30)) == 200 and len(more.result(30)) == 100
    finally:
        scheduler.close()
    # the batch in flight, then the small request first in the very next one
    assert run.batches[1][1][0] == "small"
    assert all(len(items) <= 8 for _, items in run.batches)
    # every input was scored once, in its request's order
    scored = [x for _, items in run.batches for x in items]
    assert sorted(scored) == sorted([f"big{i}" for i in range(200)]
                                    + [f"more{i}" for i in range(100)] + ["small"])
    assert [x for x in scored if x.startswith("big")] == [f"big{i}" for i in range(200)]


def test_batches_hold_about_batch_seconds_of_work_by_cost():
    clock = FakeClock()
    sizes = []

    def run(model, items, top_k):
        sizes.append(len(items))
        clock.now += 0.01 * 20 * len(items)  # 0.01 s per unit, 20 units per input
        return items

    scheduler = PredictionScheduler(run, max_batch=64, max_pending=1000, batch_seconds=0.5,
                                    clock=clock)
    scheduler.seconds_per_cost = 0.01  # 50 units per batch
    scheduler.start()
    try:
        scheduler.submit("m", list(range(20)), [20.0] * 20, top_k=1, timeout=1e9).result(30)
    finally:
        scheduler.close()
    # 20-unit inputs: two fit the 50-unit budget
    assert sizes == [2] * 10
    assert scheduler.seconds_per_cost == pytest.approx(0.01)


def test_the_measured_speed_follows_the_batches():
    clock = FakeClock()

    def run(model, items, top_k):
        clock.now += 0.1 * len(items)  # 0.1 s per unit of cost
        return items

    scheduler = PredictionScheduler(run, max_batch=4, max_pending=100, batch_seconds=1.0,
                                    clock=clock).start()
    try:
        scheduler.submit("m", list(range(40)), [1.0] * 40, top_k=1, timeout=1e9).result(30)
    finally:
        scheduler.close()
    assert scheduler.seconds_per_cost == pytest.approx(0.1)
    assert scheduler.batches == 10


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_full_queue_refuses_at_once_and_deadlines_drop_waiting_work():
    run = Recorder()
    clock = FakeClock()
    scheduler = PredictionScheduler(run, max_batch=2, max_pending=10, batch_seconds=1.0,
                                    clock=clock)
    scheduler.seconds_per_cost = 0.5
    scheduler.start()
    try:
        first = hold_first_batch(run, scheduler, "m", ["a", "b", "c", "d"])
        late = scheduler.submit("m", list("efghij"), [1.0] * 6, top_k=1, timeout=5)
        with pytest.raises(Busy, match="busy .*8 inputs waiting, at most 10"):
            scheduler.submit("m", list("klm"), [1.0] * 3, top_k=1, timeout=5)
        clock.now = 100.0  # every deadline passed while the batch was in flight
        run.release.set()
        with pytest.raises(Expired):
            late.result(30)
        with pytest.raises(Expired):
            first.result(30)
    finally:
        scheduler.close()
    assert [items for _, items in run.batches] == [["a", "b"]]  # nothing expired was scored


def test_one_bad_input_fails_only_its_own_request():
    run = Recorder(fail_on="bad")
    scheduler = PredictionScheduler(run, max_batch=16, max_pending=100, batch_seconds=10)
    scheduler.start()
    try:
        blocker = hold_first_batch(run, scheduler, "m", ["x"])
        good = scheduler.submit("m", ["g1", "g2"], [1.0, 1.0], top_k=2, timeout=60)
        bad = scheduler.submit("m", ["ok", "bad"], [1.0, 1.0], top_k=1, timeout=60)
        run.release.set()
        assert [x for _, x, _ in good.result(30)] == ["g1", "g2"]
        with pytest.raises(ValueError, match="bad input 'bad'"):
            bad.result(30)
        blocker.result(30)
        # the worker goes on
        assert scheduler.submit("m", ["after"], [1.0], top_k=1, timeout=60).result(30)
    finally:
        scheduler.close()


def test_a_request_is_answered_by_the_model_it_was_queued_under():
    run = Recorder()
    scheduler = PredictionScheduler(run, max_batch=3, max_pending=100, batch_seconds=10)
    scheduler.start()
    try:
        held = hold_first_batch(run, scheduler, "v1", ["h"])
        old = scheduler.submit("v1", list("abcde"), [1.0] * 5, top_k=1, timeout=60)
        new = scheduler.submit("v2", list("xyz"), [1.0] * 3, top_k=1, timeout=60)
        run.release.set()
        assert {m for m, _, _ in old.result(30)} == {"v1"}
        assert {m for m, _, _ in new.result(30)} == {"v2"}
        held.result(30)
    finally:
        scheduler.close()
    for model, items in run.batches:
        assert all(x in "habcde" for x in items) if model == "v1" else set(items) <= set("xyz")


def test_requests_with_other_options_never_share_a_batch():
    """A request asking for rejection (at some rate) is batched only with requests asking the
    same, and ``run`` gets its options: no request gets answers computed for another's."""
    batches: list[tuple[dict, list]] = []
    entered, release = threading.Event(), threading.Event()

    def run(model, items, top_k, **options):
        batches.append((options, list(items)))
        entered.set()
        assert release.wait(30)
        return [(x, options) for x in items]

    reject = {"reject": True, "reject_rate": 0.1}
    scheduler = PredictionScheduler(run, max_batch=16, max_pending=100, batch_seconds=10)
    scheduler.start()
    try:
        held = scheduler.submit("m", ["held"], [1.0], top_k=1, timeout=60)
        assert entered.wait(30)  # the others queue while this batch is in flight
        plain = scheduler.submit("m", ["a", "b"], [1.0] * 2, top_k=1, timeout=60)
        rejecting = scheduler.submit("m", ["c", "d"], [1.0] * 2, top_k=1, timeout=60,
                                     options=reject)
        other_rate = scheduler.submit("m", ["e"], [1.0], top_k=1, timeout=60,
                                      options={**reject, "reject_rate": 0.2})
        same = scheduler.submit("m", ["f"], [1.0], top_k=2, timeout=60,
                                options={"reject_rate": 0.1, "reject": True})  # any order
        sets = scheduler.submit("m", ["g"], [1.0], top_k=1, timeout=60, options={"sets": 0.1})
        release.set()
        assert [o for _, o in held.result(30)] == [{}]
        assert [o for _, o in plain.result(30)] == [{}, {}]
        assert [o for _, o in rejecting.result(30)] == [reject, reject]
        assert [o for _, o in other_rate.result(30)] == [{**reject, "reject_rate": 0.2}]
        assert [o for _, o in same.result(30)] == [reject]
        assert [o for _, o in sets.result(30)] == [{"sets": 0.1}]
    finally:
        scheduler.close()
    asked = {"held": {}, "a": {}, "b": {}, "c": reject, "d": reject, "f": reject,
             "e": {**reject, "reject_rate": 0.2}, "g": {"sets": 0.1}}
    for options, items in batches:
        assert all(asked[x] == options for x in items), (options, items)
    assert sorted(items for _, items in batches) == [["a", "b"], ["e"], ["f", "c", "d"], ["g"],
                                                     ["held"]]


def test_closing_fails_the_waiting_requests_and_refuses_new_ones():
    run = Recorder()
    scheduler = PredictionScheduler(run, max_batch=1, max_pending=100, batch_seconds=10)
    scheduler.start()
    held = hold_first_batch(run, scheduler, "m", ["a"])
    waiting = scheduler.submit("m", ["b"], [1.0], top_k=1, timeout=60)
    closer = threading.Thread(target=scheduler.close, args=(RuntimeError("closing"),))
    closer.start()
    while not scheduler._stop:  # closing has begun while the batch is still in flight
        threading.Event().wait(0.01)
    run.release.set()
    closer.join(30)
    assert held.result(30)  # the batch in flight is answered
    with pytest.raises(RuntimeError, match="closing"):
        waiting.result(30)
    assert not scheduler.alive and len(run.batches) == 1
    with pytest.raises(Busy, match="not running"):
        scheduler.submit("m", ["c"], [1.0], top_k=1, timeout=60)
