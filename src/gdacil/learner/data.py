"""What a learner learns from and classifies: labelled samples from folders, files or memory.

:func:`read_samples` accepts

- a folder with one sub-folder of images per class (any layout
  :class:`gdacil.data.ImageFolder` reads; with an official split, its ``train`` part);
- a CSV (``.csv``; ``.tsv`` tab-separated) or JSON Lines (``.jsonl``, ``.ndjson``; ``.json``: a
  list of objects) file of texts, with a text column and a label column;
- a :class:`gdacil.data.Dataset` (its ``train`` split, or ``all``);
- in-memory ``inputs`` and ``labels`` (strings, image files, PIL images, arrays).

Samples are loaded lazily, a batch at a time (:class:`LazySamples`), so a large folder is never
held in memory whole. Class names are strings (a label ``3`` is the class ``"3"``).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

__all__ = ["LazySamples", "Samples", "load_images", "load_texts", "read_samples"]

#: Longer side of loaded images (larger images are thumbnailed as they are read; every
#: backbone gdacil ships takes 224 pixels or fewer).
MAX_SIDE = 512
_TEXT_SUFFIXES = {".csv": ",", ".tsv": "\t"}
_JSON_SUFFIXES = (".jsonl", ".ndjson", ".json")


@dataclass(frozen=True)
class Samples:
    """Labelled raw samples, loaded on demand.

    Attributes
    ----------
    keys : tuple of str
        One key per sample, what ``load`` takes (a file path, a row number).
    labels : tuple of str
        The class name of each sample.
    load : callable
        ``load(keys) -> raw samples`` (strings or images), in order.
    modality : {"image", "text"} or None
        What the samples are; ``None`` for in-memory inputs (the backbone decides).
    source : str
        Where they come from, for messages.
    skipped : tuple of str
        Class folders left out because they hold no image.
    """

    keys: tuple[str, ...]
    labels: tuple[str, ...]
    load: Callable[[Sequence[str]], list]
    modality: str | None
    source: str
    skipped: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.keys)

    def subset(self, positions: Sequence[int]) -> Samples:
        return replace(self, keys=tuple(self.keys[i] for i in positions),
                       labels=tuple(self.labels[i] for i in positions))

    def limit_per_class(self, n: int, seed) -> Samples:
        """At most ``n`` samples of each class, drawn with ``seed`` (order kept)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"max_per_class must be a positive integer; got {n!r}")
        rng = np.random.default_rng(seed)
        labels = np.asarray(self.labels, dtype=object)
        keep: list[np.intp] = []
        for name in sorted(set(self.labels)):
            where = np.flatnonzero(labels == name)
            keep.extend(where if len(where) <= n else rng.choice(where, n, replace=False))
        return self.subset(sorted(int(i) for i in keep))

    def raws(self) -> LazySamples:
        return LazySamples(self.keys, self.load)


class LazySamples(Sequence):
    """The raw samples of ``keys``, loaded when indexed (what backbones and strategies take)."""

    def __init__(self, keys: Sequence[str], load: Callable[[Sequence[str]], list]):
        self.keys, self.load = list(keys), load

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.load(self.keys[index])
        return self.load([self.keys[index]])[0]


def read_samples(data, labels=None, *, text_column: str = "text",
                 label_column: str = "label") -> Samples:
    """The labelled samples of ``data`` (see the module docstring).

    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` naming the file (and line)
    for anything it cannot read: an unknown file type, a missing column, an empty label, a folder
    without images.
    """
    from ..data import Dataset

    if labels is None and isinstance(data, tuple) and len(data) == 2:
        data, labels = data
    if labels is not None:
        return _in_memory(data, labels)
    if isinstance(data, Dataset):
        return _dataset(data)
    if isinstance(data, (str, os.PathLike)):
        path = Path(data).expanduser()
        if path.is_dir():
            return _image_folder(path)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {path}")
        suffix = path.suffix.lower()
        if suffix in _TEXT_SUFFIXES:
            return _text_table(path, text_column, label_column)
        if suffix in _JSON_SUFFIXES:
            return _json_lines(path, text_column, label_column)
        raise ValueError(f"{path}: cannot tell what it holds; give a folder with one sub-folder "
                         "of images per class, a .csv/.tsv file or a .jsonl/.json file of texts")
    raise TypeError(f"learn() takes a folder or file path, a gdacil Dataset, or inputs with "
                    f"labels; got {type(data).__name__}")


def _in_memory(inputs, labels) -> Samples:
    inputs = list(inputs)
    names = [str(x) for x in (labels.tolist() if hasattr(labels, "tolist") else labels)]
    if len(names) != len(inputs):
        raise ValueError(f"{len(inputs)} inputs but {len(names)} labels")
    return Samples(tuple(map(str, range(len(inputs)))), tuple(names),
                   lambda keys: [inputs[int(k)] for k in keys], None, "the inputs given")


def _dataset(dataset) -> Samples:
    split = "train" if "train" in dataset.splits else dataset.splits[0]
    index = dataset.index(split)
    classes = dataset.classes
    return Samples(tuple(index.ids), tuple(classes[i] for i in index.labels.tolist()),
                   dataset.load, dataset.modality or None, f"{dataset.name} ({split})")


def _image_folder(root: Path) -> Samples:
    from ..data import ImageFolder

    dataset = ImageFolder(root, max_side=MAX_SIDE)
    samples = _dataset(dataset)
    present = set(samples.labels)
    skipped = tuple(c for c in dataset.classes if c not in present)
    return replace(samples, source=str(root), skipped=skipped)


def _check_columns(path: Path, columns: Sequence[str], text_column: str,
                   label_column: str) -> None:
    for option, column in (("text", text_column), ("label", label_column)):
        if column not in columns:
            raise ValueError(f"{path} has no column {column!r} (its columns: "
                             f"{', '.join(map(repr, columns)) or 'none'}); name the {option} "
                             f"column with --{option}-column or {option}_column=")


def _row(path: Path, line: int, row: dict, text_column: str, label_column: str
         ) -> tuple[str, str]:
    text, label = row.get(text_column), row.get(label_column)
    if text is None or label is None:
        missing = text_column if text is None else label_column
        raise ValueError(f"{path}, line {line}: no {missing!r} value")
    if not isinstance(text, str):
        raise ValueError(f"{path}, line {line}: the text {text!r} is not a string")
    label = str(label).strip()
    if not text.strip() or not label:
        raise ValueError(f"{path}, line {line}: empty {'text' if not text.strip() else 'label'}")
    return text, label


def _texts(path: Path, rows: list[tuple[str, str]]) -> Samples:
    if not rows:
        raise ValueError(f"{path} holds no samples")
    texts = [t for t, _ in rows]
    return Samples(tuple(map(str, range(len(rows)))), tuple(label for _, label in rows),
                   lambda keys: [texts[int(k)] for k in keys], "text", str(path))


def _text_table(path: Path, text_column: str, label_column: str) -> Samples:
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh, delimiter=_TEXT_SUFFIXES[path.suffix.lower()])
        _check_columns(path, reader.fieldnames or [], text_column, label_column)
        rows = [_row(path, reader.line_num, row, text_column, label_column) for row in reader]
    return _texts(path, rows)


def _json_lines(path: Path, text_column: str, label_column: str) -> Samples:
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".json":
        try:
            records = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        numbered = list(enumerate(records, 1))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    numbered.append((n, json.loads(line)))
                except ValueError as exc:
                    raise ValueError(f"{path}, line {n}: not valid JSON ({exc})") from None
    rows: list[tuple[str, str]] = []
    for n, record in numbered:
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {n}: expected a JSON object")
        if not rows:
            _check_columns(path, list(record), text_column, label_column)
        rows.append(_row(path, n, record, text_column, label_column))
    return _texts(path, rows)


# ---------------------------------------------------------------------- inputs to classify
def load_images(items: Sequence) -> list:
    """Raw samples for image backbones: image files (paths) are opened (thumbnailed to
    :data:`MAX_SIDE`), images and arrays pass through. A path that is not a readable image
    raises a ``ValueError`` (``FileNotFoundError`` when it does not exist) naming it."""
    from .._optional import require
    from ..data.images import open_image

    Image = require("PIL.Image", feature="image inputs", install="pip install pillow")
    out = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            out.append(item)
            continue
        path = Path(item).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"no such image file: {str(item)!r} (this model classifies "
                                    "images: give image files, PIL images or arrays)")
        try:
            out.append(open_image(path, max_side=MAX_SIDE))
        except (Image.UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"{path} is not an image file that can be read ({exc})") from None
    return out


def load_texts(items: Sequence) -> list:
    """Raw samples for text backbones: strings pass, anything else is refused."""
    bad = next((x for x in items if not isinstance(x, str)), None)
    if bad is not None:
        raise ValueError(f"this model classifies texts; got a {type(bad).__name__}")
    return list(items)
