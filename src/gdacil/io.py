"""Atomic file writes and safetensors + JSON persistence (no pickles anywhere)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from ._optional import require

__all__ = ["atomic_write_bytes", "atomic_write_text", "load_tensors", "save_tensors"]

_META_KEY = "gdacil"
_SAFETENSORS = {"feature": "saving and loading tensors", "install": "pip install 'gdacil[io]'"}


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` so readers see either the old file or the new one, never half.

    The bytes go to a temporary file in the same directory, are flushed to disk, and the file is
    renamed over ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results and caches are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict) -> Path:
    """Save tensors with safetensors and ``metadata`` as JSON inside the same file, atomically."""
    save = require("safetensors.torch", **_SAFETENSORS).save

    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    blob = save(tensors, metadata={_META_KEY: json.dumps(metadata, sort_keys=True)})
    return atomic_write_bytes(path, blob)


def load_tensors(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """Load what :func:`save_tensors` wrote; raises ``FileNotFoundError`` naming the path."""
    safe_open = require("safetensors", **_SAFETENSORS).safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if _META_KEY not in meta:
            raise ValueError(f"{path} is a safetensors file but was not written by gdacil")
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (a safetensors handle)
    return tensors, json.loads(meta[_META_KEY])
