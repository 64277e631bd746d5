"""Anchor sets: unlabelled samples for drift compensation (HopDC, SDC, ...), drawn with a seed.

Anchors should come from outside the task classes, as the ImageNet anchors of the LR-RGDA paper
[LR-RGDA] do:

- ``pool="outside"`` (default): every sample of the protocol's datasets that belongs to no class
  used by the protocol: the dataset's unlabelled pool (WordNet synsets outside the chosen
  classes, openclipart folders that are not classes) and the samples of classes the protocol
  does not use;
- ``pool="unused"``: samples of the protocol's own classes from the dataset's training split
  (``train`` or ``all``) that are in no task (for datasets whose every class is used, such as
  Fashion-MNIST);
- ``pool="both"``: the union.

No sample that the protocol evaluates on, and no official test sample of a used class, is ever
an anchor.

:class:`ExternalAnchors` draws them from a dataset outside the protocol instead, as that paper
adds 1024 ImageNet images to every benchmark.
"""

from __future__ import annotations

import numpy as np

from ..hashing import sha256_json
from .base import Dataset
from .protocol import TaskSequence

__all__ = ["ANCHOR_POOLS", "ExternalAnchors", "anchor_pool", "content_hashes", "draw_anchors"]

ANCHOR_POOLS = ("outside", "unused", "both")


def anchor_pool(tasks: TaskSequence, pool: str = "outside") -> tuple[str, ...]:
    """All candidate anchor ids (global ``"<dataset>:<id>"``), sorted."""
    if pool not in ANCHOR_POOLS:
        raise ValueError(f"unknown anchor pool {pool!r}; known: {', '.join(ANCHOR_POOLS)}")
    used_classes = set(tasks.class_names)
    in_splits = {i for t in tasks for i in (*t.train.ids, *t.test.ids)}
    out: set[str] = set()
    for name, ds in tasks.datasets.items():
        if pool in ("outside", "both"):
            out.update(f"{name}:{i}" for i in ds.unlabelled())
        for split in ds.splits:
            idx = ds.index(split)
            for sid, label in zip(idx.ids, idx.labels.tolist()):
                gid = f"{name}:{sid}"
                used = f"{name}:{ds.classes[label]}" in used_classes
                spare = split != "test" and gid not in in_splits
                if (not used and pool in ("outside", "both")) or (
                    used and spare and pool in ("unused", "both")
                ):
                    out.add(gid)
    return tuple(sorted(out))


def draw_anchors(
    tasks: TaskSequence, n: int = 1024, *, seed: int = 0, pool: str = "outside"
) -> tuple[str, ...]:
    """Draw ``n`` anchor ids without replacement from :func:`anchor_pool`, with
    ``numpy.random.default_rng(seed)``; returned sorted. Load them with ``tasks.load(ids)``.

    When ``tasks`` was built against a manifest, the anchors' content is recorded there (under
    their pool, count and seed) or, on a rerun, checked against it
    (:meth:`TaskSequence.check_or_record_anchors`): an anchor whose content changed under the
    same id raises :class:`~gdacil.data.ManifestMismatchError`.

    Raises ``ValueError`` when the pool holds fewer than ``n`` samples.
    """
    candidates = anchor_pool(tasks, pool)
    if n > len(candidates):
        raise ValueError(
            f"asked for {n} anchors but the {pool!r} pool holds {len(candidates)} "
            f"samples; ask for fewer or use pool='both'"
        )
    pick = np.random.default_rng(seed).choice(len(candidates), size=n, replace=False)
    ids = tuple(candidates[i] for i in np.sort(pick))
    tasks.check_or_record_anchors(ids, f"pool={pool} n={n} seed={seed}")
    return ids


class ExternalAnchors:
    """``n`` anchors drawn with ``seed`` from a dataset that is not part of the protocol.

    Every sample of the chosen ``splits`` (default: all of the dataset's) and of its unlabelled
    pool is a candidate; labels are ignored. Ids are global, ``"external/<dataset>:<id>"``, so
    they never collide with the protocol's ``"<dataset>:<id>"``.

    Parameters
    ----------
    dataset : Dataset
    n : int
        How many anchors to draw (without replacement, ``numpy.random.default_rng(seed)``).
    seed : int
    splits : sequence of str, optional
        Which of ``dataset.splits`` to draw from.
    """

    PREFIX = "external/"

    def __init__(self, dataset: Dataset, n: int, *, seed: int = 0, splits=None):
        splits = tuple(dataset.splits if splits is None else splits)
        unknown = sorted(set(splits) - set(dataset.splits))
        if unknown:
            raise ValueError(f"anchor dataset {dataset.name!r} has no split(s) {unknown}; its "
                             f"splits: {', '.join(dataset.splits)}")
        self.dataset, self.splits = dataset, splits
        candidates = sorted({*(i for s in splits for i in dataset.index(s).ids),
                             *dataset.unlabelled()})
        if n > len(candidates):
            raise ValueError(f"asked for {n} anchors but {dataset.name!r} ({', '.join(splits)}) "
                             f"holds {len(candidates)} samples; ask for fewer")
        pick = np.sort(np.random.default_rng(seed).choice(len(candidates), size=n, replace=False))
        self.ids = tuple(f"{self.PREFIX}{dataset.name}:{candidates[i]}" for i in pick)

    @classmethod
    def owns(cls, sample_id: str) -> bool:
        """Whether ``sample_id`` is an external anchor's id."""
        return sample_id.startswith(cls.PREFIX)

    @property
    def cache_namespace(self) -> str:
        """What defines the raw samples behind the ids (the dataset and its options)."""
        return sha256_json(["external anchors", self.dataset.name, self.dataset.config()])

    def _local(self, ids) -> list[str]:
        prefix = f"{self.PREFIX}{self.dataset.name}:"
        bad = [i for i in ids if not i.startswith(prefix)]
        if bad:
            raise ValueError(f"not anchors of {self.dataset.name!r}: {bad[:5]}")
        return [i[len(prefix):] for i in ids]

    def load(self, ids) -> list:
        """Raw samples of external anchor ids, in order."""
        return self.dataset.load(self._local(ids))

    def content_hashes(self, ids) -> list[str]:
        """:meth:`Dataset.content_hashes` of external anchor ids, in order."""
        return self.dataset.content_hashes(self._local(ids))


def per_source(ids, external: ExternalAnchors | None, for_external, for_tasks) -> list:
    """``for_external`` of the ``external`` anchor ids among ``ids`` and ``for_tasks`` of the
    others (each a function of a list of ids returning one item per id), in the order of ``ids``."""
    if external is None:
        return for_tasks(ids)
    out: list = [None] * len(ids)
    for owner, fn in ((True, for_external), (False, for_tasks)):
        positions = [k for k, i in enumerate(ids) if external.owns(i) == owner]
        for k, item in zip(positions, fn([ids[k] for k in positions]) if positions else ()):
            out[k] = item
    return out


def content_hashes(ids, tasks: TaskSequence, external: ExternalAnchors | None = None) -> list[str]:
    """Content hashes of a mix of task ids and ``external`` anchor ids, in order (what the
    runner puts in its feature-cache keys)."""
    return per_source(ids, external, external and external.content_hashes, tasks.content_hashes)
