"""The inbox of ``gdacil serve --inbox DIR``: inputs the model answered unknown, kept for a
person to label, so the next learn teaches the model what it did not know.

Each item is one JSON file ``DIR/<id>.json``: the input as the client sent it (a text, or a
base64-encoded image file), the answer it got, the version that gave it, when it arrived, and
its label once someone gives one. Every write is atomic (a temporary file renamed over the
item), so a crash leaves each item as it was before or after, never half; a restart reads the
items back, labels included.

The inbox is bounded by a count (``max_items``) and a size in bytes (``max_bytes``, the sum of
the item files): to make room for a new item the oldest unlabelled items are deleted first,
before the new one is written, so the folder never holds more. Labelled items are never
dropped to make room (they are a person's work): when only labelled items are left, a new input
is not kept. The same input (byte for byte) is kept once.

A labelled item is learned once: the version an inbox learn saves records each item's
:attr:`InboxItem.key` in its history, and ``gdacil serve`` removes (or, when it cannot, skips)
every labelled item whose key the current version's history holds, so a process that died
between saving that version and removing its items does not learn them again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..io import atomic_write_bytes, remove_stale_temp_files

__all__ = ["Inbox", "InboxItem"]

_log = logging.getLogger(__name__)
#: The file name of an item: its id, twelve digits in arrival order
_ITEM_FILE = re.compile(r"^(\d{12})\.json$")
#: Hex characters of an item's key: 64 bits, as a model's history holds one per item learned
KEY_CHARS = 16


@dataclass(frozen=True)
class InboxItem:
    """One kept input: ``id``, ``input`` (as sent: a text, a base64 image file, any JSON
    value an input may be), ``answer`` (its predictions, and
    ``unknown``, ``novelty``, ``threshold``, ``set`` as the answer had them), ``version`` (of
    the model that answered), ``received`` (seconds since the epoch), ``label`` (None until
    labelled) and ``digest`` (SHA-256 of the input)."""

    id: str
    input: object
    answer: dict
    version: str
    received: float
    label: str | None = None
    digest: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "input": self.input, "answer": self.answer,
                "version": self.version, "received": self.received, "label": self.label,
                "digest": self.digest}

    def encode(self) -> bytes:
        return json.dumps(self.to_dict(), ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")

    @property
    def key(self) -> str:
        """What a version that learns this item records of it: a hash of its id, digest, arrival
        and label, so the item relabelled, or another one kept under a freed id, has another
        key (and a forgotten class's name is not left in the history)."""
        fields = json.dumps([self.id, self.digest, self.received, self.label])
        return hashlib.sha256(fields.encode("utf-8")).hexdigest()[:KEY_CHARS]


class Inbox:
    """A bounded folder of kept inputs (see the module's documentation).

    Parameters
    ----------
    directory : path
        Where the items live (created if missing).
    max_items : int
        Most items kept.
    max_bytes : int
        Most bytes of item files kept.
    below : float, optional
        Also keep inputs whose best class has a probability below this (0 < below <= 1);
        inputs answered unknown are always kept.

    Examples
    --------
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> inbox = Inbox(tmp.name, max_items=2, max_bytes=1 << 20)
    >>> answer = {"predictions": [{"class": "cat", "probability": 0.9}], "unknown": True}
    >>> [inbox.offer(text, answer, "v1") is not None for text in ("a", "b", "c")]
    [True, True, True]
    >>> [item.input for item in inbox.items()]  # the oldest was dropped
    ['b', 'c']
    >>> inbox.label(inbox.items()[0].id, "bird").label
    'bird'
    >>> [item.input for item in Inbox(tmp.name, max_items=2, max_bytes=1 << 20).items()]
    ['b', 'c']
    >>> tmp.cleanup()
    """

    def __init__(self, directory, *, max_items: int = 1000, max_bytes: int = 100 << 20,
                 below: float | None = None):
        for name, value in (("max_items", max_items), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"inbox {name} must be a positive integer; got {value!r}")
        if below is not None and not 0 < below <= 1:
            raise ValueError(f"inbox below must be a probability in (0, 1]; got {below!r}")
        self.directory = Path(directory).expanduser()
        self.max_items, self.max_bytes, self.below = max_items, max_bytes, below
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._items: dict[str, InboxItem] = {}  # in arrival order
        self._sizes: dict[str, int] = {}
        self._digests: dict[str, str] = {}  # digest -> id
        self.dropped = 0  # items deleted to make room, or not kept for want of it
        self._load()

    # ------------------------------------------------------------------ reading back
    def _load(self) -> None:
        remove_stale_temp_files(self.directory, max_age=0)
        for path in sorted(self.directory.iterdir()):
            if not _ITEM_FILE.match(path.name) or not path.is_file():
                continue
            try:
                raw = path.read_bytes()
                data = json.loads(raw.decode("utf-8"))
                item = InboxItem(**{k: data[k] for k in (
                    "id", "input", "answer", "version", "received", "label", "digest")})
                if item.id != path.stem:
                    raise ValueError(f"its id is {item.id!r}")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                _log.warning("gdacil inbox: %s is not an inbox item (%s); left as it is", path,
                             exc)
                continue
            self._remember(item, len(raw))

    def _remember(self, item: InboxItem, size: int) -> None:
        self._items[item.id] = item
        self._sizes[item.id] = size
        self._digests[item.digest] = item.id

    def _forget(self, item_id: str) -> None:
        item = self._items.pop(item_id)
        del self._sizes[item_id]
        self._digests.pop(item.digest, None)

    # ------------------------------------------------------------------ what is kept
    @property
    def bytes(self) -> int:
        """Bytes of the item files."""
        return sum(self._sizes.values())

    def __len__(self) -> int:
        return len(self._items)

    def items(self) -> list[InboxItem]:
        """Every item, oldest first."""
        with self._lock:
            return list(self._items.values())

    def get(self, item_id: str) -> InboxItem:
        """The item ``item_id``; ``KeyError`` (naming it) when there is none."""
        with self._lock:
            return self._get(item_id)

    def _get(self, item_id: str) -> InboxItem:
        try:
            return self._items[item_id]
        except KeyError:
            raise KeyError(f"no inbox item {item_id!r} (it was learned, discarded or dropped "
                           "to make room)") from None

    def wanted(self, answer: dict) -> bool:
        """Whether an input with ``answer`` is kept: answered unknown, or its best class's
        probability is below :attr:`below`."""
        if answer.get("unknown"):
            return True
        if self.below is None or not answer.get("predictions"):
            return False
        probability = answer["predictions"][0].get("probability")
        return probability is not None and probability < self.below

    def offer(self, sent, answer: dict, version: str) -> InboxItem | None:
        """Keep ``sent`` (an input as sent, a JSON value) with its ``answer`` and ``version`` if
        :meth:`wanted`, not already kept, and there is room (made by dropping the oldest
        unlabelled items); the item kept, or None."""
        if not self.wanted(answer):
            return None
        canonical = json.dumps(sent, ensure_ascii=False, sort_keys=True, allow_nan=False)
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        with self._lock:
            if digest in self._digests:
                return None
            item = InboxItem(self._next_id(), sent, answer, version, time.time(), None, digest)
            data = item.encode()
            if not self._make_room(len(data)):
                self.dropped += 1
                return None
            atomic_write_bytes(self._path(item.id), data)
            self._remember(item, len(data))
            return item

    def _next_id(self) -> str:
        last = next(reversed(self._items), None)
        return f"{int(last) + 1 if last else 1:012d}"

    def _make_room(self, size: int, replacing: str | None = None) -> bool:
        """Delete the oldest unlabelled items until one of ``size`` bytes fits (in place of
        item ``replacing``, when given); False (nothing deleted) when it cannot fit."""
        unlabelled = [i for i, item in self._items.items()
                      if item.label is None and i != replacing]
        count, total, doomed = len(self._items), self.bytes, []
        if replacing is not None:
            count, total = count - 1, total - self._sizes[replacing]
        for item_id in unlabelled:
            if count < self.max_items and total + size <= self.max_bytes:
                break
            doomed.append(item_id)
            count, total = count - 1, total - self._sizes[item_id]
        if count >= self.max_items or total + size > self.max_bytes:
            return False
        for item_id in doomed:
            self._delete(item_id)
            self.dropped += 1
        return True

    def _path(self, item_id: str) -> Path:
        return self.directory / f"{item_id}.json"

    def _delete(self, item_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(item_id))
        self._forget(item_id)

    # ------------------------------------------------------------------ a person's work
    def label(self, item_id: str, label: str | None) -> InboxItem:
        """Give item ``item_id`` the class ``label`` (None: take its label back), written
        atomically; the item as it is now. A label that makes the item too big for the inbox's
        bound (after dropping unlabelled items) is refused with ``ValueError``."""
        with self._lock:
            item = replace(self._get(item_id), label=label)
            data = item.encode()
            if not self._make_room(len(data), replacing=item_id):
                raise ValueError(f"the inbox is full of labelled items ({len(self._items)} "
                                 f"items, {self.bytes} bytes): learn or discard some first")
            atomic_write_bytes(self._path(item_id), data)
            self._remember(item, len(data))
            return item

    def discard(self, item_id: str) -> None:
        """Delete item ``item_id``."""
        with self._lock:
            self._get(item_id)
            self._delete(item_id)

    def labelled(self) -> list[InboxItem]:
        """The labelled items, oldest first."""
        return [item for item in self.items() if item.label is not None]

    def remove(self, items: list[InboxItem]) -> None:
        """Delete ``items`` (those learned) where they are unchanged since they were read: an
        item relabelled meanwhile is kept."""
        with self._lock:
            for item in items:
                if self._items.get(item.id) == item:
                    self._delete(item.id)
