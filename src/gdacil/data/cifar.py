"""CIFAR-100 from its standard "python version" files, read with a restricted unpickler.

The files (``cifar-100-python/{train,test,meta}``) are Python pickles, and unpickling a
downloaded file the ordinary way can run arbitrary code. :func:`read_cifar_pickle` therefore
uses an :class:`pickle.Unpickler` whose ``find_class`` admits only the four globals these files
reference, each replaced by an inert stand-in written here:

- ``numpy.core.multiarray._reconstruct`` / ``numpy.ndarray`` and ``numpy.dtype``: record the
  array's shape, dtype code (only bool, int, uint and float of 1 to 8 bytes), byte order and raw
  bytes; the array is then made with ``numpy.frombuffer``, never by calling numpy's pickle hooks;
- ``_codecs.encode`` (how Python 3 writes bytes at protocol 2): latin-1 only.

Dicts, lists, strings, bytes and integers need no globals. Anything else in the file is refused
with ``pickle.UnpicklingError``. The download itself (about 160 MB) is left to the user: fetch
``cifar-100-python.tar.gz`` from the CIFAR page (Krizhevsky, 2009) and unpack it under the root.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path

import numpy as np

from .base import ArrayDataset, data_root, require_file

__all__ = ["CIFAR100", "read_cifar_pickle"]

_DTYPE_SPEC = re.compile(r"^[biuf][1248]$")


def _text(x) -> str:
    return x.decode("latin-1") if isinstance(x, bytes) else str(x)


class _NDArrayType:
    """Stands for ``numpy.ndarray`` as the class argument of ``_reconstruct``."""


class _DtypeStub:
    def __init__(self, spec, align=False, copy=True):
        spec = _text(spec)
        if not _DTYPE_SPEC.match(spec):
            raise pickle.UnpicklingError(f"CIFAR reader refuses dtype {spec!r}")
        self.spec, self.byteorder = spec, "|"

    def __setstate__(self, state):
        self.byteorder = _text(state[1])
        if self.byteorder not in "<>|=":
            raise pickle.UnpicklingError(f"bad byte order {self.byteorder!r}")

    def resolve(self) -> np.dtype:
        dt = np.dtype(self.spec)
        return dt if self.byteorder in "|=" else dt.newbyteorder(self.byteorder)


class _ArrayStub:
    def __init__(self):
        self.state = None

    def __setstate__(self, state):
        if len(state) == 5:
            state = state[1:]
        shape, dtype, fortran, raw = state
        if not isinstance(dtype, _DtypeStub) or not isinstance(raw, bytes):
            raise pickle.UnpicklingError("CIFAR reader: unexpected array state")
        self.state = (tuple(int(s) for s in shape), dtype, bool(fortran), raw)

    def resolve(self) -> np.ndarray:
        if self.state is None:
            raise pickle.UnpicklingError("CIFAR reader: array without data")
        shape, dtype, fortran, raw = self.state
        arr = np.frombuffer(raw, dtype=dtype.resolve())
        return arr.reshape(shape, order="F" if fortran else "C")


def _reconstruct(cls, shape, typecode):
    if cls is not _NDArrayType:
        raise pickle.UnpicklingError("CIFAR reader: _reconstruct of something other than ndarray")
    return _ArrayStub()


def _encode(text, encoding="utf-8"):
    if _text(encoding).lower().replace("-", "") != "latin1":
        raise pickle.UnpicklingError(f"CIFAR reader refuses encoding {encoding!r}")
    return text.encode("latin-1")


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDArrayType,
    ("numpy", "dtype"): _DtypeStub,
    ("_codecs", "encode"): _encode,
}


class _CifarUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"CIFAR reader refuses global {module}.{name}: this is not a CIFAR data file"
            ) from None


def _resolve(obj):
    if isinstance(obj, _ArrayStub):
        return obj.resolve()
    if isinstance(obj, dict):
        return {_text(k): _resolve(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_resolve(v) for v in obj]
    return obj


def read_cifar_pickle(path: str | os.PathLike) -> dict:
    """Read one CIFAR "python version" file safely (see the module docstring).

    Returns a dict with ``str`` keys; arrays are read-only ``numpy`` arrays.
    """
    data = Path(path).read_bytes()
    obj = _CifarUnpickler(io.BytesIO(data), encoding="bytes").load()
    if not isinstance(obj, dict):
        raise pickle.UnpicklingError(f"{path}: expected a dict, got {type(obj).__name__}")
    return _resolve(obj)


class CIFAR100(ArrayDataset):
    """CIFAR-100 (100 fine classes; 50k train + 10k test, 32x32 RGB).

    Parameters
    ----------
    root : str, optional
        Directory holding ``cifar-100-python/`` (or its files ``train``, ``test``, ``meta``).
        Default ``$GDACIL_DATA/cifar100`` or ``~/.cache/gdacil/data/cifar100``.
    """

    name = "cifar100"
    splits = ("train", "test")

    def __init__(self, root: str | os.PathLike | None = None):
        super().__init__()
        base = data_root(self.name, root)
        self.root = base / "cifar-100-python" if (base / "cifar-100-python").is_dir() else base
        fix = (
            f"Download cifar-100-python.tar.gz (CIFAR-100, python version) and unpack it in "
            f"{base}, or pass root= the directory that holds it (in a config: --set "
            f"protocol.dataset_options.cifar100.root=PATH)"
        )
        for f in ("meta", "train", "test"):
            require_file(self.root / f, "CIFAR-100", fix)
        meta = read_cifar_pickle(self.root / "meta")
        self._classes = tuple(_text(n) for n in meta["fine_label_names"])

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def _read(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        d = read_cifar_pickle(self.root / split)
        images = np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        return images, np.asarray(d["fine_labels"], dtype=np.int64)
