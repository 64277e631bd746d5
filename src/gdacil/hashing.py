"""Stable content hashes (sha256) of JSON-able values, tensors, samples and files, for caches and
manifests.

File hashes are memoised on disk (:func:`file_sha256s`), keyed by the file's path, size,
modification and status-change times and inode, so a rerun reads no unchanged file again.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

__all__ = [
    "HASH_MEMO_ENV",
    "array_header",
    "canonical_json",
    "file_sha256",
    "file_sha256s",
    "hash_memo_dir",
    "sha256_bytes",
    "sha256_json",
    "sha256_sample",
    "sha256_strings",
    "sha256_tensors",
]


def canonical_json(obj, *, allow_nan: bool = False) -> str:
    """JSON text with sorted keys and no whitespace: equal values give equal text. NaN and
    infinities raise a ``ValueError`` unless ``allow_nan`` (then written as JSON's extension
    ``NaN``/``Infinity``)."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=allow_nan
    )


def sha256_json(obj, *, allow_nan: bool = False) -> str:
    """Hex sha256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj, allow_nan=allow_nan).encode("ascii")).hexdigest()


def sha256_strings(items: Iterable[str]) -> str:
    """Hex sha256 of a sequence of strings (order matters; each is length-prefixed)."""
    h = hashlib.sha256()
    for s in items:
        b = s.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def sha256_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Hex sha256 over names, dtypes, shapes and raw bytes of tensors, in the order given."""
    h = hashlib.sha256()
    for name, t in named:
        h.update(canonical_json([name, str(t.dtype), list(t.shape)]).encode("ascii"))
        t = t.detach().to("cpu").contiguous().reshape(-1)
        if t.numel() and t.stride() != (1,):  # "contiguous", yet with a stride-0 size-1 dimension
            t = torch.empty_like(t, memory_format=torch.contiguous_format).copy_(t)  # an expanded scalar
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)
    return h.hexdigest()


# ---------------------------------------------------------------- sample content


def sha256_bytes(data: bytes | bytearray | memoryview) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def array_header(dtype, shape: Sequence[int]) -> bytes:
    """What :func:`sha256_sample` hashes before an array's bytes: its dtype and shape."""
    return f"ndarray {dtype.str} {','.join(map(str, shape))}\n".encode("ascii")


def sha256_sample(raw) -> str:
    """Hex sha256 of one raw sample as a dataset's ``load`` returns it.

    A ``str`` hashes as its UTF-8 bytes and ``bytes`` as themselves; a ``numpy`` array or a
    ``PIL`` image hashes its dtype (mode) and shape (size) followed by its raw bytes.
    """
    if isinstance(raw, str):
        return sha256_bytes(raw.encode("utf-8"))
    if isinstance(raw, bytes | bytearray | memoryview):
        return sha256_bytes(raw)
    import numpy as np

    if isinstance(raw, np.ndarray):
        h = hashlib.sha256(array_header(raw.dtype, raw.shape))
        h.update(np.ascontiguousarray(raw).data)
        return h.hexdigest()
    if hasattr(raw, "mode") and hasattr(raw, "size") and hasattr(raw, "tobytes"):  # PIL image
        h = hashlib.sha256(canonical_json(["image", raw.mode, list(raw.size)]).encode())
        h.update(raw.tobytes())
        return h.hexdigest()
    raise TypeError(f"cannot hash a sample of type {type(raw).__name__}; give the dataset a "
                    "content_hashes() method")


#: Environment variable naming the folder of the file-hash memo (empty: no memo).
HASH_MEMO_ENV = "GDACIL_HASH_CACHE"
#: A file whose modification or status-change time is this recent (ns) when it is hashed is not
#: memoised: a second write within the file system's timestamp resolution could leave both
#: times unchanged ("racily clean", as git calls it).
RACY_WINDOW_NS = 2_000_000_000
_MEMO_FORMAT = "gdacil.file-hashes/1"
#: Parsed memo shards of this process: path -> (the shard file's stat signature, content).
_SHARDS: dict[Path, tuple[tuple | None, dict]] = {}
#: Memo folders whose stale temporary files this process removed.
_CLEANED: set[Path] = set()
#: How many files :func:`file_sha256s` read and hashed in this process (for tests and benchmarks).
FILES_READ = 0


def hash_memo_dir() -> Path | None:
    """The folder of the file-hash memo: ``$GDACIL_HASH_CACHE`` if set (empty: no memo), else
    ``~/.cache/gdacil/hashes``."""
    value = os.environ.get(HASH_MEMO_ENV)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    return Path.home() / ".cache" / "gdacil" / "hashes"


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (read in chunks, never memoised)."""
    global FILES_READ
    digest = hashlib.sha256()
    with open(path, "rb") as fh:  # hashlib.file_digest needs Python 3.11; gdacil supports 3.10
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    FILES_READ += 1
    return digest.hexdigest()


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def file_sha256s(paths: Sequence[str | os.PathLike], *, memo: bool = True) -> list[str]:
    """Hex sha256 of each file's bytes, memoised on disk by (path, size, mtime, ctime, inode).

    A file whose size, modification time, status-change time and inode are those it had when
    it was last hashed is not read again. The memo is JSON, in :func:`hash_memo_dir` (unless
    ``memo=False``), in 256 shards by the hash of the file's folder. A shard is rewritten
    atomically, merged with what other processes wrote to it since it was read, and pruned of
    folders that no longer exist. A shard that cannot be read or written
    (damaged, a read-only folder) is ignored: the files are hashed again, never trusted blindly.
    Files changed less than :data:`RACY_WINDOW_NS` before they were hashed are not memoised.
    Temporary files that writers killed mid-write left in the memo folder more than an hour ago
    are removed on the first write of a process.
    """
    memo_dir = hash_memo_dir() if memo else None
    folders: dict[str, list[tuple[int, str]]] = {}
    for k, p in enumerate(paths):
        folder, name = os.path.split(os.path.abspath(p))
        folders.setdefault(folder, []).append((k, name))
    out: list[str] = [""] * len(paths)
    shards: dict[Path, dict[str, dict]] = {}  # shard path -> {folder: {name: entry}} added
    for folder, members in folders.items():
        shard = None if memo_dir is None else memo_dir / f"{sha256_strings([folder])[:2]}.json"
        known = _read_shard(shard).get(folder, {}) if shard is not None else {}
        for k, name in members:
            path = os.path.join(folder, name)
            sig = _signature(os.stat(path))
            entry = known.get(name)
            if entry is not None and entry[:-1] == sig:
                out[k] = entry[-1]
                continue
            started = time.time_ns()
            out[k] = file_sha256(path)
            if shard is not None and started - max(sig[1], sig[2]) > RACY_WINDOW_NS:
                shards.setdefault(shard, {}).setdefault(folder, {})[name] = [*sig, out[k]]
    for shard, added in shards.items():
        _write_shard(shard, added)
    return out


def _shard_signature(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _read_shard(path: Path) -> dict[str, dict]:
    """``{folder: {file name: [size, mtime_ns, ctime_ns, inode, sha256]}}`` of a memo shard;
    empty when it is missing or unreadable (then it is rewritten on the next write)."""
    sig = _shard_signature(path)
    if sig is None:
        return {}
    cached = _SHARDS.get(path)
    if cached is not None and cached[0] == sig:
        return cached[1]
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        folders = body["folders"] if body.get("format") == _MEMO_FORMAT else {}
        valid = {
            folder: {name: e for name, e in files.items()
                     if isinstance(e, list) and len(e) == 5 and isinstance(e[-1], str)
                     and len(e[-1]) == 64}
            for folder, files in folders.items() if isinstance(files, dict)
        }
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        valid = {}
    _SHARDS[path] = (sig, valid)
    return valid


def _write_shard(path: Path, added: dict[str, dict]) -> None:
    """Merge ``added`` into the shard as it is on disk now, drop folders that no longer exist,
    and replace the shard atomically. Another process's entries written between this read and
    the rename can be lost: they are only hashed again later."""
    from .io import atomic_write_text, remove_stale_temp_files  # gdacil.io imports this module

    if path.parent not in _CLEANED:  # what writers killed mid-write left, once per process
        _CLEANED.add(path.parent)
        remove_stale_temp_files(path.parent)
    merged = {folder: dict(files) for folder, files in _read_shard(path).items()
              if os.path.isdir(folder)}
    for folder, files in added.items():
        merged.setdefault(folder, {}).update(files)
    try:
        atomic_write_text(path, json.dumps({"format": _MEMO_FORMAT, "folders": merged},
                                           sort_keys=True, separators=(",", ":")))
    except OSError:  # a read-only or full disk: the memo is an optimisation only
        return
    _SHARDS[path] = (_shard_signature(path), merged)
