"""The dataset interface: class names, sample ids per split, and loading raw samples by id."""

from __future__ import annotations

import abc
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..hashing import array_header, file_sha256s, sha256_json, sha256_sample, sha256_strings
from ..registry import UnknownNameError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = [
    "ArrayDataset",
    "DataNotFoundError",
    "Dataset",
    "ListedDataset",
    "SampleIndex",
    "data_root",
    "require_file",
]


class DataNotFoundError(FileNotFoundError):
    """Data files are missing; the message names the path and how to obtain them."""


def require_file(path: Path, what: str, fix: str) -> Path:
    """Return ``path`` if it exists, else raise :class:`DataNotFoundError` naming ``fix``."""
    if not path.exists():
        raise DataNotFoundError(f"{what} not found: {path} does not exist. {fix}")
    return path


def data_root(name: str, root: str | os.PathLike | None) -> Path:
    """``root`` if given, else ``$GDACIL_DATA/<name>``, else ``~/.cache/gdacil/data/<name>``."""
    if root is not None:
        return Path(root).expanduser()
    base = os.environ.get("GDACIL_DATA")
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "gdacil" / "data") / name


@dataclass(frozen=True)
class SampleIndex:
    """Sample ids and integer labels of one split, in a fixed (sorted) order.

    Attributes
    ----------
    ids : tuple of str
        Dataset-local sample ids (a file path relative to the root, ``"train/00042"``, ...).
    labels : numpy.ndarray
        int64 class index of each id (into the dataset's ``classes``); read-only.
    """

    ids: tuple[str, ...]
    labels: np.ndarray

    if TYPE_CHECKING:  # the dataclass's __init__: __post_init__ converts any array-like labels
        def __init__(self, ids: tuple[str, ...], labels: npt.ArrayLike) -> None: ...

    def __post_init__(self):
        labels = np.array(self.labels, dtype=np.int64)  # a read-only copy: indices are shared
        labels.setflags(write=False)
        if labels.shape != (len(self.ids),):
            raise ValueError(f"{len(self.ids)} ids but labels of shape {labels.shape}")
        object.__setattr__(self, "labels", labels)

    def __len__(self) -> int:
        return len(self.ids)

    def of_class(self, label: int) -> tuple[str, ...]:
        """The ids with ``label``, in index order."""
        return tuple(self.ids[i] for i in np.flatnonzero(self.labels == label))


class Dataset(abc.ABC):
    """A labelled dataset with named classes.

    Subclasses implement :meth:`classes`, :meth:`index` and :meth:`load`, set :attr:`name`,
    :attr:`modality` and :attr:`splits`, and may override :meth:`unlabelled` (samples outside
    every class: a pool of anchors), :meth:`config` and :meth:`content_hashes` (the default
    loads every sample to hash it; file-backed datasets hash the files instead).
    """

    #: Registry name.
    name: str = ""
    #: ``"image"`` (``load`` returns ``PIL.Image``) or ``"text"`` (``load`` returns ``str``).
    modality: str = ""
    #: ``("train", "test")`` for datasets with an official split, ``("all",)`` otherwise (then a
    #: protocol splits each class itself).
    splits: tuple[str, ...] = ("train", "test")

    @property
    @abc.abstractmethod
    def classes(self) -> tuple[str, ...]:
        """Class names; label ``i`` is ``classes[i]``."""

    @abc.abstractmethod
    def index(self, split: str) -> SampleIndex:
        """All samples of ``split`` (one of :attr:`splits`)."""

    @abc.abstractmethod
    def load(self, ids: Sequence[str]) -> list:
        """Raw samples (PIL images or strings) for ``ids``, in order."""

    def unlabelled(self) -> tuple[str, ...]:
        """Ids of samples outside every class (for anchors); none by default."""
        return ()

    def content_hashes(self, ids: Sequence[str]) -> list[str]:
        """Hex sha256 of the content behind each id, in order: what manifests and feature-cache
        keys record, so that a sample whose bytes change under the same id is noticed.

        The default loads the samples (in batches of 64) and hashes each
        (:func:`gdacil.hashing.sha256_sample`: a text's UTF-8 bytes, an image's mode, size and
        pixels). Datasets override it with something cheaper: the bytes of the sample's file,
        memoised by size and modification time (:meth:`file_hashes`), the text in memory, or
        the sample's bytes in an array.
        """
        ids = list(ids)
        return [sha256_sample(raw) for s in range(0, len(ids), 64)
                for raw in self.load(ids[s : s + 64])]

    def file_hashes(self, root: Path, ids: Sequence[str]) -> list[str]:
        """:meth:`content_hashes` of samples stored one per file, ``root / id``: the sha256 of
        each file's bytes, memoised on disk (:func:`gdacil.hashing.file_sha256s`)."""
        return file_sha256s([root / sid for sid in ids])

    def config(self) -> dict:
        """JSON-able options that define this dataset's content (not where it is stored)."""
        return {}

    def identity(self) -> dict:
        """Name, config and a hash of the full listing (every split's ids and labels, and the
        unlabelled ids): any added, removed, renamed or relabelled file changes it."""
        listing: dict[str, list[str] | str] = {
            s: [
                sha256_strings(self.index(s).ids),
                sha256_strings(map(str, self.index(s).labels.tolist())),
            ]
            for s in self.splits
        }
        listing["unlabelled"] = sha256_strings(self.unlabelled())
        listing["classes"] = sha256_strings(self.classes)
        return {"name": self.name, "config": self.config(), "listing_sha256": sha256_json(listing)}

    def check_split(self, split: str) -> str:
        if split not in self.splits:
            raise ValueError(f"{self.name} has splits {', '.join(self.splits)}; got {split!r}")
        return split

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, classes={len(self.classes)})"


class ListedDataset(Dataset):
    """A dataset without an official split (``splits = ("all",)``) whose listing is made once,
    in the constructor, by :meth:`_set_listing`."""

    splits = ("all",)

    def _set_listing(
        self, classes: Sequence[str], index: SampleIndex, unlabelled: Sequence[str] = ()
    ) -> None:
        self._classes = tuple(classes)
        self._index = index
        self._unlabelled = tuple(unlabelled)

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def index(self, split: str) -> SampleIndex:
        self.check_split(split)
        return self._index

    def unlabelled(self) -> tuple[str, ...]:
        return self._unlabelled


class ArrayDataset(Dataset):
    """Images held as one uint8 array per split (read lazily, once); ids ``"<split>/<number>"``.

    Subclasses implement :meth:`_read`.
    """

    modality = "image"

    def __init__(self) -> None:
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._indices: dict[str, SampleIndex] = {}
        self._hashes: dict[str, str] = {}

    @abc.abstractmethod
    def _read(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """Images ``(n, H, W)`` or ``(n, H, W, 3)`` uint8 and int64 labels ``(n,)`` of ``split``."""

    def _split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if split not in self._arrays:
            images, labels = self._read(self.check_split(split))
            if len(images) != len(labels):
                raise ValueError(f"{self.name} {split}: {len(images)} images, {len(labels)} labels")
            self._arrays[split] = (images, np.asarray(labels, dtype=np.int64))
        return self._arrays[split]

    def index(self, split: str) -> SampleIndex:
        if split not in self._indices:
            labels = self._split(split)[1]
            ids = tuple(f"{split}/{i:05d}" for i in range(len(labels)))
            self._indices[split] = SampleIndex(ids, labels)
        return self._indices[split]

    def _image(self, sid: str) -> np.ndarray:
        split, _, num = sid.partition("/")
        if split not in self.splits or not num.isdigit():
            raise UnknownNameError(
                f"not a {self.name} sample id: {sid!r} (expected '<split>/<number>')"
            )
        return self._split(split)[0][int(num)]

    def load(self, ids: Sequence[str]) -> list:
        from PIL import Image

        return [Image.fromarray(np.ascontiguousarray(self._image(sid))) for sid in ids]

    def content_hashes(self, ids: Sequence[str]) -> list[str]:
        """The sha256 of each sample's bytes in the split's array, with its dtype and shape
        (:func:`gdacil.hashing.sha256_sample`): the array :meth:`load` reads from, held in
        memory once read, so this costs a few microseconds per sample, memoised per id."""
        out: list[str] = []
        headers: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}
        for sid in ids:
            digest = self._hashes.get(sid)
            if digest is None:
                image = self._image(sid)
                if not image.flags.c_contiguous:
                    digest = sha256_sample(image)
                else:
                    key = (image.dtype, image.shape)
                    header = headers.get(key) or headers.setdefault(key, array_header(*key))
                    h = hashlib.sha256(header)
                    h.update(image.data)
                    digest = h.hexdigest()
                self._hashes[sid] = digest
            out.append(digest)
        return out
