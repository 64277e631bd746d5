"""What a learner learns from and classifies: labelled samples from folders, files or memory.

:func:`read_samples` accepts

- a folder with one sub-folder of images per class (any layout
  :class:`gdacil.data.ImageFolder` reads; with an official split, its ``train`` part);
- a CSV (``.csv``; ``.tsv`` tab-separated) or JSON Lines (``.jsonl``, ``.ndjson``; ``.json``: a
  list of objects) file of texts, with a text column and a label column;
- a :class:`gdacil.data.Dataset` (its ``train`` split, or ``all``);
- in-memory ``inputs`` and ``labels`` (strings, image files, PIL images, arrays).

Samples are loaded lazily, a batch at a time (:class:`LazySamples`), so a large folder is never
held in memory whole. Class names are strings (a label ``3`` is the class ``"3"``), checked and
normalised by :func:`gdacil.learner.names.class_name`.

Inputs to classify or learn from go through :func:`load_image` / :func:`load_images` (image
models) and :func:`load_texts` (text models), the functions the CLI, :class:`Learner` and the
HTTP server share; what they cannot read raises a one-line ``ValueError`` naming the input.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

__all__ = ["LazySamples", "Samples", "load_image", "load_images", "load_texts", "read_samples"]

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
        return self.subset(per_class_positions(self.labels, n, seed).tolist())

    def raws(self) -> LazySamples:
        return LazySamples(self.keys, self.load)


def per_class_positions(labels: Sequence, n: int, seed) -> np.ndarray:
    """The sorted positions of at most ``n`` of each class's ``labels``, drawn with ``seed``
    (classes taken in sorted order; what ``max_per_class`` keeps)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"max_per_class must be a positive integer; got {n!r}")
    rng = np.random.default_rng(seed)
    values = np.asarray(labels, dtype=object)
    keep: list[np.intp] = []
    for name in sorted(set(values.tolist())):
        where = np.flatnonzero(values == name)
        keep.extend(where if len(where) <= n else rng.choice(where, n, replace=False))
    return np.array(sorted(int(i) for i in keep), dtype=np.int64)


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
    from .names import class_name

    inputs = list(inputs)
    if isinstance(labels, (str, bytes)):
        raise ValueError("labels must be a sequence of class names, one per input; got a "
                         f"single {type(labels).__name__}")
    names = [class_name(x, f"labels[{i}]") for i, x in enumerate(labels)]
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
    if not text.strip():
        raise ValueError(f"{path}, line {line}: empty text")
    from .names import class_name

    return text, class_name(label, f"{path}, line {line}")


def _texts(path: Path, rows: list[tuple[str, str]]) -> Samples:
    if not rows:
        raise ValueError(f"{path} holds no samples")
    texts = [t for t, _ in rows]
    return Samples(tuple(map(str, range(len(rows)))), tuple(label for _, label in rows),
                   lambda keys: [texts[int(k)] for k in keys], "text", str(path))


def _read_utf8(path: Path) -> str:
    """The text of ``path`` (UTF-8, an optional BOM), or a ``ValueError`` naming the file and
    the line of the first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text (byte {exc.object[exc.start]:#04x} "
                         f"at offset {exc.start}); save the file as UTF-8") from None


@contextlib.contextmanager
def _csv_field_limit():
    """Python's csv field limit (131,072 characters) lifted while a file is read: long texts
    are clipped later, by the backbone (``HFTextBackbone.max_chars``)."""
    old = csv.field_size_limit()
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        yield
    finally:
        csv.field_size_limit(old)


def _text_table(path: Path, text_column: str, label_column: str) -> Samples:
    text = _read_utf8(path)
    delimiter = _TEXT_SUFFIXES[path.suffix.lower()]
    shown = "a tab" if delimiter == "\t" else "a comma"
    with _csv_field_limit():
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
        try:
            columns = reader.fieldnames or []
            _check_columns(path, columns, text_column, label_column)
            rows = []
            for row in reader:
                line = reader.line_num
                if None in row or any(v is None for v in row.values()):
                    got = len(columns) + len(row.get(None) or ()) - sum(
                        v is None for k, v in row.items() if k is not None)
                    raise ValueError(
                        f"{path}, line {line}: {got} fields where the header has "
                        f"{len(columns)}; put double quotes around a text that holds {shown} "
                        "(and double any quote inside it)")
                rows.append(_row(path, line, row, text_column, label_column))
        except csv.Error as exc:
            line = reader.reader.line_num  # DictReader's own count lags on an error
            raise ValueError(f"{path}, line {line}: not valid CSV ({exc})") from None
    return _texts(path, rows)


def _json_value(path: Path, where: str, text: str):
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None


def _json_lines(path: Path, text_column: str, label_column: str) -> Samples:
    text = _read_utf8(path)
    if path.suffix.lower() == ".json":
        records = _json_value(path, str(path), text)
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        numbered = list(enumerate(records, 1))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                numbered.append((n, _json_value(path, f"{path}, line {n}", line)))
    rows: list[tuple[str, str]] = []
    for n, record in numbered:
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {n}: expected a JSON object")
        if not rows:
            _check_columns(path, list(record), text_column, label_column)
        rows.append(_row(path, n, record, text_column, label_column))
    return _texts(path, rows)


# ---------------------------------------------------------------------- inputs to classify
def load_image(item, *, max_pixels: int | None = None, name: str | None = None):
    """One input of an image model, as the backbone takes it.

    An image file (a path) or its bytes is decoded with :func:`gdacil.data.images.open_image`
    (thumbnailed to :data:`MAX_SIDE`, EXIF orientation applied, deep modes scaled to 8 bits,
    transparency kept for :func:`gdacil.backbones.to_rgb`), exactly as training folders are read.
    A PIL image, NumPy array or torch tensor is checked by the rules of
    :func:`~gdacil.backbones.to_rgb` (dtype ranges, NaN, empty images) and returned as it is.

    Parameters
    ----------
    item : str, os.PathLike, bytes, PIL.Image.Image, numpy.ndarray or torch.Tensor
    max_pixels : int, optional
        Refuse larger images (checked from a file's header before it is decoded).
    name : str, optional
        What messages call the input (e.g. ``"inputs[3]"``; default: the path, or "an input").

    Raises
    ------
    FileNotFoundError
        ``item`` is a path that does not exist (the message names it).
    ValueError
        Anything else that cannot be read (:class:`~gdacil.data.images.ImageReadError` for
        files and bytes); the message names the input.
    """
    from ..data.images import ImageReadError, ImageTooLargeError, open_image, too_many_pixels

    if isinstance(item, (str, os.PathLike)):
        path = Path(item).expanduser()
        label = name or str(item)
        if not path.is_file():
            kind = "a folder, not an image file" if path.is_dir() else "no such image file"
            raise FileNotFoundError(f"{kind}: {label!r} (this model classifies images: give "
                                    "image files, PIL images or arrays)")
        return open_image(path, max_side=MAX_SIDE, max_pixels=max_pixels, name=label)
    if isinstance(item, (bytes, bytearray, memoryview)):
        return open_image(bytes(item), max_side=MAX_SIDE, max_pixels=max_pixels,
                          name=name or "the image bytes")
    from ..backbones.preprocess import to_rgb
    from ..data.images import DEEP_MODES, to_8bit

    label = name or "an input"
    size = _in_memory_size(item)
    if size is not None and max_pixels is not None and size[0] * size[1] > max_pixels:
        raise ImageTooLargeError(too_many_pixels(label, size[0], size[1], max_pixels))
    try:
        if hasattr(item, "getbands") and hasattr(item, "mode"):  # a PIL image: cheap checks
            if item.width == 0 or item.height == 0:
                raise ValueError(f"the image has no pixel ({item.width}x{item.height})")
            if item.mode in DEEP_MODES:
                to_8bit(item)  # raises for values it cannot scale
        else:
            to_rgb(item)  # arrays and tensors: the backbone's own rules
        return item
    except ValueError as exc:
        raise ImageReadError(f"{label}: {exc}") from None
    except TypeError:
        raise ValueError(f"{label}: this model classifies images (image files, their bytes, "
                         f"PIL images or arrays); got a {type(item).__name__}") from None


def _in_memory_size(item) -> tuple[int, int] | None:
    """``(width, height)`` of an in-memory image, array ``(H, W, ...)`` or tensor
    ``(C, H, W)``; ``None`` for anything else."""
    size = getattr(item, "size", None)
    if isinstance(size, tuple) and len(size) == 2 and not hasattr(item, "shape"):
        return size  # a PIL image
    shape = tuple(getattr(item, "shape", ()))
    if len(shape) == 2:
        return shape[1], shape[0]
    if len(shape) == 3:
        channels_first = not isinstance(item, np.ndarray)
        return (shape[2], shape[1]) if channels_first else (shape[1], shape[0])
    return None


def load_images(items: Sequence, *, max_pixels: int | None = None,
                names: Sequence[str] | None = None) -> list:
    """:func:`load_image` of each item. ``names`` (one per item) is what messages call them;
    by default a path is named by itself and anything else ``inputs[i]`` (``i``: its position
    in ``items``)."""
    items = list(items)
    if names is None:
        names = [str(x) if isinstance(x, (str, os.PathLike)) else f"inputs[{i}]"
                 for i, x in enumerate(items)]
    return [load_image(item, max_pixels=max_pixels, name=n) for item, n in zip(items, names)]


def load_texts(items: Sequence, *, names: Sequence[str] | None = None) -> list:
    """Raw samples for text backbones: strings pass, anything else is refused (a
    ``ValueError`` naming it: ``inputs[i]`` by default, or its entry of ``names``)."""
    items = list(items)
    for i, x in enumerate(items):
        if not isinstance(x, str):
            where = names[i] if names is not None else f"inputs[{i}]"
            raise ValueError(f"{where}: this model classifies texts; got a {type(x).__name__}")
    return items
