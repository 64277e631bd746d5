"""A fitted head's state, stored so that a loaded model predicts without refitting its head.

Refitting is exact but not cheap: LR-RGDA decomposes every class covariance (a second per class
at 1280 dimensions on one CPU core). A head built from statistics keeps what it predicts with
in its public fitted attributes (scikit-learn's convention: names ending in ``_``): tensors
(``rows_``, ``bias_``, ...), numbers, strings, lists, a device and a dtype. :func:`head_state` collects
them, :func:`restore_head` sets them on a new head of the same class and parameters, which then
scores exactly as the saved one did. A head whose fitted state holds anything else (FeCAM keeps
its statistics object) has no stored state, and is refitted on load instead.

Other private attributes (caches) are not stored, with one exception: LR-RGDA's eigenpairs of
each class covariance (its ``_eig_cache``), whose recomputation is what makes a refit slow. They
are stored in class order and, on restore, bound to the loaded statistics' revisions, so the
next fit after loading (a learn or a forget) decomposes only the classes that changed, as it
would have without the round trip. Should that private cache ever change its form, it is simply
not stored (or not restored), and the first fit after loading decomposes every class again.
"""

from __future__ import annotations

import json

import torch

from .._validation import as_dtype, dtype_name

__all__ = ["bind_eigenpairs", "head_state", "restore_head"]

_DEVICE, _DTYPE = "__torch_device__", "__torch_dtype__"


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def head_state(head, stats=None) -> tuple[dict[str, torch.Tensor], dict] | None:
    """``(tensors, metadata)`` of the fitted ``head`` (for :func:`gdacil.io.save_tensors`), or
    ``None`` when its fitted state cannot be stored that way. ``stats``: the statistics it was
    fitted on (to store LR-RGDA's eigenpairs, when they are those of ``stats``)."""
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, object] = {}
    for name, value in vars(head).items():
        if name.startswith("_") or not name.endswith("_"):
            continue
        if isinstance(value, torch.Tensor):  # standard strides (safetensors and hashing need them)
            tensors[name] = value.detach().clone(memory_format=torch.contiguous_format)
        elif isinstance(value, torch.device):
            values[name] = {_DEVICE: str(value)}
        elif isinstance(value, torch.dtype):
            values[name] = {_DTYPE: dtype_name(value)}
        elif isinstance(value, (bool, int, float, str, list)) and _jsonable(value):
            values[name] = value
        else:
            return None
    if not tensors:
        return None
    metadata = {"class": type(head).__name__, "attributes": values}
    cache = _eigenpairs(head, stats)
    if cache is not None:
        U, s, key = cache
        tensors.update({_CACHE_U: U, _CACHE_S: s})
        metadata["eigenpairs"] = key
    return tensors, metadata


_CACHE_U, _CACHE_S = "_eig_cache.U", "_eig_cache.s"


def _eigenpairs(head, stats):
    """LR-RGDA's cached eigenpairs ``(U (C, d, r), s (C, r), key)`` of every class of
    ``stats``, in class order, or None (no such cache, or not current)."""
    cache, key = getattr(head, "_eig_cache", None), getattr(head, "_eig_cache_key", None)
    if stats is None or not isinstance(cache, dict) or not isinstance(key, tuple):
        return None
    if not key or key[0] not in ("eigh", "randomized") or list(cache) != stats.classes:
        return None
    entries = [cache[c] for c in stats.classes]
    if not all(isinstance(e, tuple) and len(e) == 3 and e[0] == stats.revision(c)
               and isinstance(e[1], torch.Tensor) and isinstance(e[2], torch.Tensor)
               for c, e in zip(stats.classes, entries)):
        return None
    try:
        U, s = torch.stack([e[1] for e in entries]), torch.stack([e[2] for e in entries])
    except RuntimeError:
        return None
    return U.cpu().contiguous(), s.cpu().contiguous(), list(key)


def restore_head(head, tensors: dict[str, torch.Tensor], metadata: dict):
    """``head`` (new, unfitted, built with the saved parameters) with the state of
    :func:`head_state` set on it, and the stored eigenpairs (or None) to hand to
    :func:`bind_eigenpairs` once the statistics are loaded. ``ValueError`` if the state is
    another class's."""
    if metadata.get("class") != type(head).__name__:
        raise ValueError(f"the stored head state is a {metadata.get('class')!r}, not a "
                         f"{type(head).__name__!r}")
    tensors = dict(tensors)
    U, s = tensors.pop(_CACHE_U, None), tensors.pop(_CACHE_S, None)
    attributes = dict(metadata["attributes"])
    if "rows_" in tensors and "dtype_" not in attributes:  # stored before heads recorded dtype_
        attributes["dtype_"] = {_DTYPE: dtype_name(tensors["rows_"].dtype)}
    for name, value in attributes.items():
        if isinstance(value, dict) and set(value) == {_DEVICE}:
            value = torch.device(value[_DEVICE])
        elif isinstance(value, dict) and set(value) == {_DTYPE}:
            value = as_dtype(value[_DTYPE])
        setattr(head, name, value)
    device = getattr(head, "device_", None)
    for name, t in tensors.items():
        # a fresh allocation: tensors read from safetensors may sit at unaligned offsets, where
        # BLAS kernels round differently (last-bit differences from the saved head's scores)
        setattr(head, name, t.to(device, copy=True) if device is not None
                else t.clone(memory_format=torch.contiguous_format))
    key = metadata.get("eigenpairs")
    eigenpairs = (U, s, tuple(key)) if U is not None and s is not None and key else None
    return head, eigenpairs


def bind_eigenpairs(head, eigenpairs, stats) -> bool:
    """Give ``head`` the eigenpairs :func:`restore_head` returned, as those of ``stats`` (the
    statistics it was fitted on, just loaded). Returns whether they were taken: not when the
    head would decompose otherwise (another rank or method) or the shapes do not fit."""
    U, s, key = eigenpairs
    current = getattr(head, "_decomposition_key", None)
    if (not callable(current) or key != current(stats.dim)
            or not U.shape[0] == s.shape[0] == stats.n_classes):
        return False
    device = getattr(head, "device_", None) or "cpu"
    U, s = U.to(device, copy=True), s.to(device, copy=True)
    head._eig_cache = {c: (stats.revision(c), U[i], s[i]) for i, c in enumerate(stats.classes)}
    head._eig_cache_key = key
    return True
