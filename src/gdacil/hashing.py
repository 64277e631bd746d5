"""Stable content hashes (sha256) of JSON-able values and of tensors, for caches and manifests."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import torch

__all__ = ["canonical_json", "sha256_json", "sha256_strings", "sha256_tensors"]


def canonical_json(obj) -> str:
    """JSON text with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def sha256_json(obj) -> str:
    """Hex sha256 of :func:`canonical_json` of ``obj``."""
    return hashlib.sha256(canonical_json(obj).encode("ascii")).hexdigest()


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
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)
    return h.hexdigest()
