"""Atomic file writes and safetensors + JSON persistence (no pickles anywhere), with checksums.

Every tensor file gdacil writes (:func:`save_tensors`) carries a sha256 over its tensors (names,
dtypes, shapes and bytes, in sorted name order) and its JSON metadata, and :func:`load_tensors`
verifies it: a file that was modified, truncated or is not safetensors at all raises
:class:`CorruptFileError` naming the file. Files written before checksums existed (no checksum in
their metadata) still load, unverified. See docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch

from ._optional import require
from .hashing import sha256_json, sha256_tensors

__all__ = [
    "TEMP_NAME",
    "CorruptFileError",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "entries_of",
    "load_tensors",
    "read_json",
    "remove_stale_temp_files",
    "save_tensors",
    "tensors_checksum",
    "write_error",
]

_META_KEY = "gdacil"
_CHECKSUM_KEY = "gdacil.sha256"
_SAFETENSORS = {"feature": "saving and loading tensors", "install": "pip install 'gdacil[io]'"}
#: The names ``atomic_write_bytes`` gives its temporary files: ``.NAME.<8 random characters>.tmp``
#: (the random part is what :func:`tempfile.mkstemp` draws: 8 characters of ``[a-z0-9_]``).
TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
#: Default age (seconds) after which :func:`remove_stale_temp_files` takes a temporary file for
#: the leftover of a killed writer.
STALE_TEMP_AGE = 3600.0


class CorruptFileError(ValueError):
    """A stored file is damaged: its checksum does not match, or it cannot be parsed.

    ``path`` is the file, ``problem`` what is wrong with it; the message adds what to do, which a
    caller may replace (``advice``) with what fits its use of the file.
    """

    def __init__(self, path: str | os.PathLike, problem: str, advice: str | None = None):
        self.path, self.problem = Path(path), problem
        self.advice = advice if advice is not None else (
            "Delete the file (or restore a good copy) and rerun whatever wrote it.")
        super().__init__(f"{self.path}: {problem}. {self.advice}")


def read_json(path: str | os.PathLike, advice: str | None = None, *,
              allow_nan: bool = False) -> Any:
    """The JSON value stored in ``path``, parsed strictly: a file that is not UTF-8, not JSON,
    nested beyond Python's recursion limit or (unless ``allow_nan``) holding ``NaN`` or
    ``Infinity``, which JSON does not define and gdacil's checksums refuse, raises
    :class:`CorruptFileError` naming ``path`` (with ``advice``). ``FileNotFoundError`` is
    left to the caller."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"),
                          parse_constant=None if allow_nan else _no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        problem = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise CorruptFileError(path, f"not valid JSON ({problem})", advice) from None


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


@contextlib.contextmanager
def entries_of(path: str | os.PathLike, advice: str | None = None) -> Iterator[None]:
    """While the parsed content of ``path`` is read inside this block, an entry that is missing
    (``KeyError``) or of another type than expected (``TypeError``, ``AttributeError``,
    ``IndexError``) raises :class:`CorruptFileError` naming ``path`` and the entry, not a
    bare ``KeyError`` that names no file (a file edited and its checksum recomputed)."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CorruptFileError(path, f"lacks or mistypes an entry ({type(exc).__name__}: "
                                     f"{exc})", advice) from None


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see either the old file or the new one, never half.

    The bytes go to a temporary file ``.NAME.<8 random characters>.tmp`` in the same directory, are flushed to
    disk, and the file is renamed over ``path``. A process killed before the rename leaves the
    temporary file behind; :func:`remove_stale_temp_files` removes such leftovers.
    """
    return atomic_write_with(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """:func:`atomic_write_bytes` for a writer that takes a path: ``write(tmp)`` fills the
    temporary file ``tmp``, which is then flushed to disk and renamed over ``path``.

    A write that fails (a full disk, a file-size limit, no permission) raises an ``OSError``
    naming ``path``, with the errno where known (``ENOSPC``, ``EFBIG``, ...), also when the
    writer raised something else for it (safetensors' ``SafetensorError``); the temporary file
    is removed and ``path`` is as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise write_error(exc, path) from None
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results and caches are meant to be shared
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception) and (isinstance(exc, OSError) or _os_error_code(exc)):
            raise write_error(exc, path) from None
        raise
    return path


_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)|\bcode: (\d+)")


def _os_error_code(exc: BaseException) -> int | None:
    """The errno of a writer's error that wraps an operating-system error without being an
    ``OSError`` (safetensors' ``SafetensorError``: "I/O error: File too large (os error 27)")."""
    if isinstance(exc, OSError):
        return exc.errno
    if type(exc).__name__ != "SafetensorError":
        return None
    found = _OS_ERROR_CODE.search(str(exc))
    return int(found.group(1) or found.group(2)) if found else None


def write_error(exc: BaseException, path: str | os.PathLike) -> OSError:
    """An ``OSError`` for a failed write of ``path`` (the file the caller meant, never a
    temporary one), with the errno of ``exc`` where known (``ENOSPC``, ``EFBIG``, ``EACCES``,
    ...): ``[Errno 28] No space left on device: 'path'``. Its type is the ``OSError``
    subclass of that errno (``PermissionError`` for ``EACCES``)."""
    code = _os_error_code(exc)
    if code is None:
        return OSError(f"could not write {path}: {exc}")
    strerror = getattr(exc, "strerror", None) if isinstance(exc, OSError) else None
    return OSError(code, strerror or os.strerror(code), str(path))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def remove_stale_temp_files(directory: str | os.PathLike, *, max_age: float = STALE_TEMP_AGE,
                            recursive: bool = False) -> list[Path]:
    """Remove the temporary files of interrupted :func:`atomic_write_bytes` calls in ``directory``.

    Only regular files named exactly as ``atomic_write_bytes`` names them (``.NAME.<8 random characters>.tmp``)
    and last modified more than ``max_age`` seconds ago are removed: a writer updates its file's
    modification time with every write and renames it within seconds, so a younger file may belong
    to another live process (two runs sharing a feature cache) and is kept. ``recursive`` also
    looks one level down (the feature cache's ``<key[:2]>/`` folders). A missing or unreadable
    directory, and a file another process removes first or this one may not remove, are skipped,
    not errors. Returns the removed paths.
    """
    directory = Path(directory)
    folders = [directory]
    if recursive:
        folders += [Path(e.path) for e in _entries(directory) if e.is_dir(follow_symlinks=False)]
    cutoff = time.time() - max_age
    removed = []
    for folder in folders:
        for entry in _entries(folder):
            if not TEMP_NAME.fullmatch(entry.name):
                continue
            try:
                if (entry.is_file(follow_symlinks=False)
                        and entry.stat(follow_symlinks=False).st_mtime < cutoff):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
            except OSError:  # removed by another process first, or not ours to remove
                continue
    return removed


def _entries(folder: Path) -> list[os.DirEntry]:
    """The entries of ``folder``; none when it is missing, not a folder, or unreadable."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def tensors_checksum(tensors: dict[str, torch.Tensor], metadata_json: str) -> str:
    """Hex sha256 over ``tensors`` (names, dtypes, shapes and bytes, in sorted name order) and the
    metadata JSON text: what :func:`save_tensors` stores and :func:`load_tensors` verifies.

    The bytes are hashed in place (contiguous CPU tensors are not copied)."""
    return sha256_json({"tensors": sha256_tensors(sorted(tensors.items())),
                        "metadata": metadata_json})


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict) -> Path:
    """Save tensors with safetensors and ``metadata`` as JSON inside the same file, atomically,
    with a checksum (:func:`tensors_checksum`) that :func:`load_tensors` verifies."""
    save_file = require("safetensors.torch", **_SAFETENSORS).save_file

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    meta = json.dumps(metadata, sort_keys=True)
    header = {_META_KEY: meta, _CHECKSUM_KEY: tensors_checksum(tensors, meta)}
    # written from the tensors' memory: no copy of the whole file is built in memory first
    return atomic_write_with(path, lambda tmp: save_file(tensors, tmp, metadata=header))


def load_tensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """Load what :func:`save_tensors` wrote, verifying its checksum.

    Raises ``FileNotFoundError`` naming the path when there is no file, :class:`CorruptFileError`
    when the file is truncated, empty, not safetensors, or its content does not match its
    checksum, and ``ValueError`` for a safetensors file gdacil did not write. A file without a
    checksum (written before gdacil stored them) is loaded without verification.
    """
    safetensors = require("safetensors", **_SAFETENSORS)

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with safetensors.safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (a safetensors handle)
    except safetensors.SafetensorError as exc:
        size = path.stat().st_size
        what = "empty" if size == 0 else f"not a readable safetensors file ({size} bytes: {exc})"
        raise CorruptFileError(path, f"{what}; it is truncated or damaged") from None
    if _META_KEY not in meta and _CHECKSUM_KEY not in meta:
        raise ValueError(f"{path} is a safetensors file but was not written by gdacil")
    unknown = sorted(set(meta) - {_META_KEY, _CHECKSUM_KEY})
    if unknown or _META_KEY not in meta:
        raise CorruptFileError(path, f"unexpected metadata keys {unknown or sorted(meta)}; the "
                                     "file was modified since gdacil wrote it")
    if _CHECKSUM_KEY in meta and tensors_checksum(tensors, meta[_META_KEY]) != meta[_CHECKSUM_KEY]:
        raise CorruptFileError(path, "content does not match its sha256 checksum; the file was "
                                     "modified or damaged since gdacil wrote it")
    try:
        return tensors, json.loads(meta[_META_KEY])
    except ValueError:
        raise CorruptFileError(path, "its metadata is not valid JSON") from None
