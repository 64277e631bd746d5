"""The inbox of ``gdacil serve --inbox``: bounded by count and bytes (the oldest unlabelled item
dropped first, never a labelled one), every write atomic, everything read back after a restart,
the bounds hold at every moment under concurrent writers, and a labelled item is learned once
even when the process dies between saving the learn and removing the item."""

from __future__ import annotations

import contextlib
import json
import threading

import pytest

from gdacil.learner import Learner, rollback
from gdacil.learner.inbox import Inbox
from gdacil.learner.serve import ModelService

UNKNOWN = {"predictions": [{"class": "red", "score": 1.0, "probability": 0.99}],
           "unknown": True, "novelty": -5.0, "threshold": -2.0}
KNOWN = {"predictions": [{"class": "red", "score": 1.0, "probability": 0.99}],
         "unknown": False, "novelty": 1.0, "threshold": -2.0}


def on_disk(directory) -> tuple[int, int]:
    """``(items, bytes)`` of the item files in ``directory``, as a reader of the folder sees
    them (every file but temporary ones)."""
    files = [p for p in directory.iterdir() if p.suffix == ".json"]
    sizes = []
    for p in files:
        with contextlib.suppress(FileNotFoundError):  # deleted between listing and stat
            sizes.append(p.stat().st_size)
    return len(sizes), sum(sizes)


def test_only_unknown_or_unsure_inputs_are_kept_once(tmp_path):
    inbox = Inbox(tmp_path, max_items=10, max_bytes=1 << 20)
    assert inbox.offer("known", KNOWN, "v1") is None
    first = inbox.offer("odd", UNKNOWN, "v1")
    assert first is not None and (first.input, first.version, first.label) == ("odd", "v1", None)
    assert inbox.offer("odd", UNKNOWN, "v2") is None  # the same input again
    unsure = {"predictions": [{"class": "red", "score": 1.0, "probability": 0.4}]}
    assert inbox.offer("unsure", unsure, "v1") is None  # no `below`
    below = Inbox(tmp_path / "below", max_items=10, max_bytes=1 << 20, below=0.5)
    assert below.offer("unsure", unsure, "v1") is not None
    assert below.offer("sure", {"predictions": [{"class": "red", "probability": 0.6}]},
                       "v1") is None
    assert [i.input for i in inbox.items()] == ["odd"]
    saved = json.loads((tmp_path / f"{first.id}.json").read_text())
    assert saved["answer"] == UNKNOWN and saved["input"] == "odd" and saved["version"] == "v1"


def test_any_json_input_is_kept_and_read_back(tmp_path):
    inbox = Inbox(tmp_path, max_items=10, max_bytes=1 << 20)
    vector = [0.5, -1.25, 3.0]
    assert inbox.offer(vector, UNKNOWN, "v1").input == vector
    assert inbox.offer([0.5, -1.25, 3.0], UNKNOWN, "v1") is None  # the same value
    assert inbox.offer({"b": 1, "a": 2}, UNKNOWN, "v1") is not None
    assert inbox.offer({"a": 2, "b": 1}, UNKNOWN, "v1") is None  # key order aside
    assert [i.input for i in Inbox(tmp_path, max_items=10, max_bytes=1 << 20).items()] == [
        vector, {"b": 1, "a": 2}]


def test_the_oldest_unlabelled_item_is_dropped_first_and_labelled_ones_never(tmp_path):
    inbox = Inbox(tmp_path, max_items=3, max_bytes=1 << 20)
    for text in ("a", "b", "c"):
        inbox.offer(text, UNKNOWN, "v1")
    inbox.label(inbox.items()[0].id, "letter")  # "a" is labelled: it stays
    inbox.offer("d", UNKNOWN, "v1")
    assert [i.input for i in inbox.items()] == ["a", "c", "d"]
    for item in inbox.items():
        inbox.label(item.id, "letter")
    assert inbox.offer("e", UNKNOWN, "v1") is None  # no room: every item is a person's work
    assert [i.input for i in inbox.items()] == ["a", "c", "d"] and inbox.dropped == 2
    assert on_disk(tmp_path) == (3, inbox.bytes)


def test_the_byte_bound_counts_the_item_files(tmp_path):
    probe = Inbox(tmp_path / "probe", max_items=100, max_bytes=1 << 20)
    size = len(probe.offer("x" * 1000, UNKNOWN, "v1").encode())
    inbox = Inbox(tmp_path / "inbox", max_items=100, max_bytes=3 * size + 10)
    for n in range(10):
        inbox.offer(f"{n}" * 1000, UNKNOWN, "v1")
        assert on_disk(tmp_path / "inbox")[1] <= inbox.max_bytes
    assert [i.input[0] for i in inbox.items()] == ["7", "8", "9"]
    assert inbox.offer("y" * 10_000, UNKNOWN, "v1") is None  # larger than the whole inbox
    assert len(inbox) == 3
    with pytest.raises(ValueError, match="full of labelled items"):  # a label grows the file
        full = Inbox(tmp_path / "full", max_items=1, max_bytes=size + 5)
        full.offer("z" * 1000, UNKNOWN, "v1")
        full.label(full.items()[0].id, "a-long-class-name")
    assert full.items()[0].label is None


def test_labels_and_discards_survive_a_restart(tmp_path):
    inbox = Inbox(tmp_path, max_items=10, max_bytes=1 << 20)
    for text in ("a", "b", "c", "d"):
        inbox.offer(text, UNKNOWN, "v1")
    a, b, c, d = inbox.items()
    inbox.label(a.id, "first")
    inbox.label(c.id, "third")
    inbox.label(c.id, None)  # taken back
    inbox.discard(b.id)
    (tmp_path / f".{d.id}.json.abcdefgh.tmp").write_text("{half")  # an interrupted write
    (tmp_path / "notes.txt").write_text("not an item")
    (tmp_path / "000000000099.json").write_text("{broken")  # damaged: left as it is
    again = Inbox(tmp_path, max_items=10, max_bytes=1 << 20)
    assert [(i.input, i.label) for i in again.items()] == [("a", "first"), ("c", None),
                                                           ("d", None)]
    assert again.items() == [inbox.get(a.id), inbox.get(c.id), inbox.get(d.id)]
    assert not list(tmp_path.glob(".*.tmp")) and (tmp_path / "000000000099.json").exists()
    new = again.offer("e", UNKNOWN, "v2")
    assert new.id == "000000000005"  # ids keep counting after the last item
    assert again.offer("a", UNKNOWN, "v2") is None  # still known after the restart
    with pytest.raises(KeyError, match="no inbox item '000000000002'"):
        again.label(b.id, "x")


def test_remove_keeps_an_item_relabelled_meanwhile(tmp_path):
    inbox = Inbox(tmp_path, max_items=10, max_bytes=1 << 20)
    for text in ("a", "b"):
        inbox.offer(text, UNKNOWN, "v1")
        inbox.label(inbox.items()[-1].id, "old")
    learned = inbox.labelled()
    inbox.label(learned[1].id, "new")  # while the learn ran
    inbox.remove(learned)
    assert [(i.input, i.label) for i in inbox.items()] == [("b", "new")]


def test_bad_bounds_are_refused(tmp_path):
    for kwargs, message in [({"max_items": 0}, "max_items must be a positive integer"),
                            ({"max_bytes": 1.5}, "max_bytes must be a positive integer"),
                            ({"below": 0}, r"below must be a probability in \(0, 1\]"),
                            ({"below": 1.5}, r"below must be a probability in \(0, 1\]")]:
        with pytest.raises(ValueError, match=message):
            Inbox(tmp_path, **kwargs)


def test_the_bounds_hold_at_every_moment_under_concurrent_writers(tmp_path):
    """6 threads offer 150 inputs each of random sizes, and label and discard some, while a
    watcher lists the folder as fast as it can: no listing ever holds more items or bytes than
    the bounds, and at the end the labelled items are all there."""
    max_items, max_bytes = 25, 40_000
    inbox = Inbox(tmp_path, max_items=max_items, max_bytes=max_bytes)
    stop, worst, labelled = threading.Event(), [0, 0], []
    lock = threading.Lock()

    def watch() -> None:
        while not stop.is_set():
            count, size = on_disk(tmp_path)
            worst[0], worst[1] = max(worst[0], count), max(worst[1], size)

    def write(w: int) -> None:
        import random

        rng = random.Random(w)
        for n in range(150):
            item = inbox.offer(f"{w}-{n}-" + "x" * rng.randrange(10, 4000), UNKNOWN, "v1")
            if item is None or n % 7:
                continue
            try:
                if n % 14:
                    inbox.discard(item.id)
                elif len(inbox.labelled()) < 10:
                    with lock:
                        labelled.append(inbox.label(item.id, f"class-{w}"))
            except (KeyError, ValueError):  # dropped by another writer meanwhile, or full
                pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in range(6)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    watcher.join()
    assert worst[0] <= max_items and worst[1] <= max_bytes, worst
    assert inbox.dropped > 400  # the bounds were hit, over and over
    assert on_disk(tmp_path) == (len(inbox), inbox.bytes)
    kept = {i.id: i for i in Inbox(tmp_path, max_items=max_items, max_bytes=max_bytes).items()}
    assert labelled and all(kept.get(i.id) == i for i in labelled)


class Crash(BaseException):
    """The process dying at the point it is raised (no handler of the service catches it)."""


def vectors_model(directory):
    """A vectors model of three classes (``k0``, ``k1``, ``k2``, 10 samples each), saved as v1."""
    learner = Learner("vectors")
    X = [[float(n % 5) / 5 + (3.0 if d == c else 0.0) for d in range(4)]
         for c in range(3) for n in range(10)]
    learner.learn(X, [f"k{c}" for c in range(3) for _ in range(10)])
    learner.save(directory)
    return directory


def crashed_inbox_learn(tmp_path, monkeypatch):
    """Three items in an inbox over a vectors model, two labelled ``k3`` and learned by an
    inbox learn whose process died after saving v2, before removing them; the third is labelled
    ``k3`` after the crash. ``(model, inbox folder, the ids learned, the id labelled since)``."""
    model = vectors_model(tmp_path / "model")
    inbox = Inbox(tmp_path / "inbox")
    items = [inbox.offer([0.1 * n, 0.0, 0.0, 3.0], UNKNOWN, "v1") for n in range(3)]
    for item in items[:2]:
        inbox.label(item.id, "k3")
    service = ModelService(model, poll=0, allow_learn=True, inbox=inbox)

    def die(self, learned):
        raise Crash

    with monkeypatch.context() as patch, pytest.raises(Crash):
        patch.setattr(Inbox, "remove", die)
        service.inbox_learn()
    assert Learner.load(model).version == "v2" and len(inbox.labelled()) == 2  # saved, kept
    inbox.label(items[2].id, "k3")
    return model, tmp_path / "inbox", [i.id for i in items[:2]], items[2].id


def test_items_a_saved_version_learned_are_not_learned_again_after_a_crash(tmp_path,
                                                                             monkeypatch):
    model, folder, _, later = crashed_inbox_learn(tmp_path, monkeypatch)
    inbox = Inbox(folder)  # a new process over the same folders
    service = ModelService(model, poll=0, allow_learn=True, inbox=inbox)
    at_start = [i.id for i in inbox.items()]
    answer = service.inbox_learn()
    assert Learner.load(model).class_counts()["k3"] == 3  # 2 + 1, not 2 + 3
    assert answer["version"] == "v3" and answer["learned"] == [later]
    assert at_start == [later]  # those v2 learned were removed at startup
    assert not inbox.items() and not Inbox(folder).items()


def test_items_are_learned_again_after_a_rollback_to_before_their_learn(tmp_path, monkeypatch):
    """The version that learned them is no longer current: the model lacks them, so the next
    inbox learn learns them (nothing lost, nothing counted twice)."""
    model, folder, learned, later = crashed_inbox_learn(tmp_path, monkeypatch)
    rollback(model, "v1")
    service = ModelService(model, poll=0, allow_learn=True, inbox=Inbox(folder))
    assert service.inbox_learn()["learned"] == [*learned, later]
    assert Learner.load(model).class_counts()["k3"] == 3
