"""Fashion-MNIST (Zalando; 10 classes, 60k train + 10k test, 28x28 gray) from its idx files.

Debian ships it: ``apt-get install -y dataset-fashion-mnist`` puts the four ``*-ubyte.gz`` files in
``/usr/share/datasets/fashion-mnist``. Sample ids are ``"train/00042"`` and ``"test/00042"``.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from .base import ArrayDataset, require_file

__all__ = ["FashionMNIST", "read_idx"]

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FILES = {"train": "train", "test": "t10k"}
_FIX = (
    "Install it with: apt-get install -y dataset-fashion-mnist (or pass root= a directory "
    "holding {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz)"
)


def read_idx(path: Path) -> np.ndarray:
    """Read an (optionally gzipped) idx file of unsigned bytes into an array of its shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    zero, dtype_code, ndim = data[0:2], data[2], data[3]
    if zero != b"\x00\x00" or dtype_code != 0x08:
        raise ValueError(f"{path} is not an idx file of unsigned bytes")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape} but holds {arr.size} bytes")
    return arr.reshape(shape)


class FashionMNIST(ArrayDataset):
    """Fashion-MNIST with its official train/test split.

    Parameters
    ----------
    root : str or os.PathLike, optional
        Directory of the idx files (default ``/usr/share/datasets/fashion-mnist``).
    """

    name = "fashion-mnist"
    splits = ("train", "test")

    def __init__(self, root: str | os.PathLike | None = None):
        super().__init__()
        self.root = Path(root).expanduser() if root is not None else DEFAULT_ROOT

    @property
    def classes(self) -> tuple[str, ...]:
        return CLASSES

    def _read(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        stem = _FILES[split]
        images = read_idx(
            require_file(self.root / f"{stem}-images-idx3-ubyte.gz", "Fashion-MNIST", _FIX)
        )
        labels = read_idx(
            require_file(self.root / f"{stem}-labels-idx1-ubyte.gz", "Fashion-MNIST", _FIX)
        )
        return images, labels
