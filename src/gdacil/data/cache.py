"""Content-addressed feature cache (safetensors files, atomic writes, no pickles).

A cache entry is keyed by the sha256 of: the backbone's :meth:`~gdacil.backbones.Backbone.
fingerprint` (its weights, including any adaptation, and its preprocessing), the ordered sample
ids, the samples' content hashes (:meth:`gdacil.data.Dataset.content_hashes`: a sample whose
bytes change under the same id gets a new key, so it is extracted again, never served stale),
and an optional ``namespace`` (e.g. the dataset identity). Change any weight, preprocessing
option or sample, and the key changes. Entries live in ``<root>/<key[:2]>/<key>.safetensors``
with the key's inputs stored as metadata and checked on load.

Every entry carries a checksum (:func:`gdacil.io.save_tensors`). :meth:`FeatureCache.get` raises
:class:`~gdacil.io.CorruptFileError` for an entry that does not match it (or its key, or cannot be
read); :meth:`FeatureCache.get_or_compute` then warns, deletes the entry and computes the features
again, so a damaged entry is never used. A cache also removes the temporary files that writers
killed mid-write left in it (:func:`gdacil.io.remove_stale_temp_files`, older than an hour).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .._optional import require
from ..hashing import sha256_json, sha256_strings
from ..io import CorruptFileError, load_tensors, remove_stale_temp_files, save_tensors

__all__ = ["FeatureCache", "extract_features"]


def extract_features(
    backbone,
    ids: Sequence[str],
    load: Callable[[Sequence[str]], list],
    *,
    batch_size: int = 64,
    progress: bool = False,
    load_batches: int = 16,
    num_workers: int = 0,
) -> torch.Tensor:
    """Features ``(len(ids), backbone.dim)`` of the samples ``ids``, loading ``load_batches``
    batches of raw samples at a time (the backbone orders each load, e.g. text by length, before
    cutting it into forward passes of ``batch_size``).

    With ``num_workers > 0`` a ``torch.utils.data.DataLoader`` loads and preprocesses the next
    loads in that many worker processes (:meth:`Backbone.prepare`) while this process runs the
    forward passes, with page-locked memory when the backbone is on a GPU; the batches and so
    the features are identical to ``num_workers=0``. Workers are forked (POSIX); where ``fork``
    is not available they are not used.

    Parameters
    ----------
    backbone : Backbone
    ids : sequence of str
    load : callable
        ``load(ids) -> raw samples`` (e.g. ``TaskSequence.load`` or ``Dataset.load``).
    batch_size : int
    progress : bool
        Show a tqdm progress bar.
    load_batches : int
        Batches of raw samples loaded (and ordered by the backbone) at a time.
    num_workers : int
        Worker processes for loading and preprocessing (0: all in this process).
    """
    step = batch_size * load_batches
    chunks = [ids[s : s + step] for s in range(0, len(ids), step)]
    prepared = _prepared_chunks(backbone, chunks, load, batch_size, num_workers)
    if not progress:
        parts = [backbone.extract_prepared(p) for p in prepared]
    else:  # counted in samples, after every forward pass: a bar that moves, with a rate and ETA
        tqdm = require("tqdm.auto", feature="progress bars",
                       install="pip install 'gdacil[cli]'").tqdm
        with tqdm(total=len(ids), unit="sample",
                  desc=f"features ({getattr(backbone, 'name', 'backbone')})") as bar:
            parts = [backbone.extract_prepared(p, on_batch=bar.update) for p in prepared]
    return torch.cat(parts) if parts else torch.empty(0, backbone.dim)


def _prepared_chunks(backbone, chunks, load, batch_size: int, num_workers: int):
    """:meth:`Backbone.prepare` of every chunk, in order: in this process, or prefetched by
    ``num_workers`` forked workers (:func:`prefetched`)."""
    return prefetched(lambda c: backbone.prepare(load(c), batch_size=batch_size), chunks,
                      num_workers=min(num_workers, len(chunks)), device=backbone.device)


class _Mapped(torch.utils.data.Dataset):
    """Item ``key``: ``fn(key)`` (runs in a worker process)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __getitem__(self, key):
        return self.fn(key)


def prefetched(fn: Callable, items: Iterable, *, num_workers: int, device) -> Iterable:
    """``fn(item)`` for every item of ``items``, in order: in this process, or computed ahead by
    a ``torch.utils.data.DataLoader`` with ``num_workers`` forked worker processes (two items
    ahead per worker; page-locked memory when ``device`` is a GPU). ``items`` is iterated in
    this process, lazily and in order, so it may draw from a generator; only ``fn`` runs in the
    workers. Where ``fork`` is not available, no worker is used. An exception in a worker is
    raised here, with the worker's traceback in its message."""
    import multiprocessing

    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0; got {num_workers}")
    if not num_workers or "fork" not in multiprocessing.get_all_start_methods():
        return map(fn, items)
    loader = torch.utils.data.DataLoader(
        _Mapped(fn), sampler=items, batch_size=None, num_workers=num_workers,
        prefetch_factor=2, pin_memory=torch.device(device).type == "cuda",
        multiprocessing_context="fork",
        generator=torch.Generator())  # the workers' seeds (unused): not from the global RNG
    return _until_done(loader)


def _until_done(loader) -> Iterator:
    """The items of ``loader``; its workers stop as soon as the items are consumed, the
    consumer stops, or a worker fails (not when the last reference to the iterator goes: a
    worker's exception keeps one in its traceback)."""
    batches = iter(loader)
    try:
        yield from batches
    finally:
        batches._shutdown_workers()


class FeatureCache:
    """Features on disk, keyed by backbone fingerprint, sample ids and sample contents.

    Parameters
    ----------
    root : str or os.PathLike
        Cache directory (created on first write). Temporary files that interrupted writes left
        in it more than an hour ago are removed when the cache is made.

    Examples
    --------
    >>> import tempfile
    >>> from gdacil.backbones import build_backbone
    >>> from gdacil.data import FeatureCache, Protocol
    >>> tasks = Protocol("fashion-mnist", seed=0, initial=2, increment=2, train_cap=5,
    ...                  test_cap=5).build()
    >>> backbone = build_backbone("vit", config=dict(hidden_size=32, num_hidden_layers=2,
    ...     num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8))
    >>> with tempfile.TemporaryDirectory() as root:     # usually "~/.cache/gdacil/features"
    ...     cache = FeatureCache(root)
    ...     for _ in range(2):                           # computed, then read back
    ...         X = cache.get_or_compute(backbone, tasks[0].train.ids, tasks.load,
    ...                                  namespace=tasks.cache_namespace)
    >>> X.shape, cache.misses, cache.hits
    (torch.Size([10, 32]), 1, 1)
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).expanduser()
        #: How many entries were computed / read since this object was made.
        self.misses = 0
        self.hits = 0
        remove_stale_temp_files(self.root, recursive=True)

    def key(self, fingerprint: str, ids: Sequence[str], namespace: str = "",
            content: Sequence[str] | None = None) -> str:
        """The entry key for a backbone ``fingerprint``, ordered ``ids``, ``namespace`` and the
        samples' ``content`` hashes (one per id; ``None``: the ids alone, as before content was
        hashed)."""
        return sha256_json(self._key_inputs(fingerprint, ids, namespace, content))

    @staticmethod
    def _key_inputs(fingerprint: str, ids: Sequence[str], namespace: str,
                    content: Sequence[str] | None = None) -> dict:
        inputs = {
            # entries written before 2 may hold the features of LoRA-merged weights under the
            # hash of the weights before the merge (fixed in gdacil.adapt.lora.merge_lora)
            "format": 2,
            "backbone": fingerprint,
            "ids_sha256": sha256_strings(ids),
            "n": len(ids),
            "namespace": namespace,
        }
        if content is not None:
            content = list(content)
            if len(content) != len(ids):
                raise ValueError(f"{len(content)} content hashes for {len(ids)} ids")
            inputs["content_sha256"] = sha256_strings(content)
        return inputs

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.safetensors"

    def get(self, key: str) -> torch.Tensor | None:
        """The cached features for ``key``, or ``None``.

        Raises :class:`~gdacil.io.CorruptFileError` when the entry is damaged (it does not match
        its checksum, cannot be read, or holds another key's entry).
        """
        path = self.path(key)
        if not path.is_file():
            return None
        tensors, meta = load_tensors(path)
        if sha256_json(meta.get("key_inputs")) != key or set(tensors) != {"features"}:
            raise CorruptFileError(path, "does not hold the entry for its key (corrupt cache?)")
        return tensors["features"]

    def put(self, key: str, features: torch.Tensor, key_inputs: dict) -> Path:
        """Store ``features`` under ``key`` (atomically)."""
        if sha256_json(key_inputs) != key:
            raise ValueError("key_inputs do not hash to key")
        return save_tensors(self.path(key), {"features": features}, {"key_inputs": key_inputs})

    def get_or_compute(
        self,
        backbone,
        ids: Sequence[str],
        load: Callable[[Sequence[str]], list],
        *,
        namespace: str = "",
        content: Any = "auto",
        batch_size: int = 64,
        progress: bool = False,
        load_batches: int = 16,
        num_workers: int = 0,
    ) -> torch.Tensor:
        """Cached features of ``ids`` under ``backbone``, computing and storing them if absent.

        Parameters
        ----------
        backbone : Backbone
        ids : sequence of str
            Sample ids, in the order of the returned rows.
        load : callable
            ``load(ids) -> raw samples``.
        namespace : str
            Extra key text, e.g. a dataset identity hash when ids alone are ambiguous.
        content : sequence of str, callable, None or "auto"
            The samples' content hashes, one per id, or ``content(ids)`` returning them, so that
            a sample whose bytes changed under the same id is extracted again. ``"auto"``
            (default): ``load.__self__.content_hashes`` when ``load`` is a bound method of an
            object that has one (``Dataset.load``, ``TaskSequence.load``,
            ``ExternalAnchors.load``), else none. ``None``: the key covers the ids only.
        batch_size, progress, load_batches, num_workers
            See :func:`extract_features` (the workers change no feature, so not the key).
        """
        ids = list(ids)
        if isinstance(content, str) and content == "auto":
            content = getattr(getattr(load, "__self__", None), "content_hashes", None)
        if callable(content):
            content = content(ids)
        inputs = self._key_inputs(backbone.fingerprint(), ids, namespace, content)
        key = sha256_json(inputs)
        try:
            cached = self.get(key)
        except CorruptFileError as exc:
            warnings.warn(f"feature cache: {exc.path}: {exc.problem}; deleting the entry and "
                          "computing the features again", UserWarning, stacklevel=2)
            exc.path.unlink(missing_ok=True)
            cached = None
        if cached is not None:
            self.hits += 1
            return cached
        features = extract_features(backbone, ids, load, batch_size=batch_size, progress=progress,
                                    load_batches=load_batches, num_workers=num_workers)
        self.put(key, features, inputs)
        self.misses += 1
        return features
