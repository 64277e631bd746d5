"""Anchor sets: unlabelled samples for drift compensation (HopDC, SDC, ...), drawn with a seed.

Anchors should come from outside the task classes, as the paper's ImageNet anchors do:

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
"""

from __future__ import annotations

import numpy as np

from .protocol import TaskSequence

__all__ = ["ANCHOR_POOLS", "anchor_pool", "draw_anchors"]

ANCHOR_POOLS = ("outside", "unused", "both")


def anchor_pool(tasks: TaskSequence, pool: str = "outside") -> tuple[str, ...]:
    """All candidate anchor ids (global ``"<dataset>:<id>"``), sorted."""
    if pool not in ANCHOR_POOLS:
        raise ValueError(f"unknown anchor pool {pool!r}; known: {', '.join(ANCHOR_POOLS)}")
    used_classes = set(tasks.class_names)
    in_splits = {i for t in tasks for i in (*t.train.ids, *t.test.ids)}
    out = set()
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

    Raises ``ValueError`` when the pool holds fewer than ``n`` samples.
    """
    candidates = anchor_pool(tasks, pool)
    if n > len(candidates):
        raise ValueError(
            f"asked for {n} anchors but the {pool!r} pool holds {len(candidates)} "
            f"samples; ask for fewer or use pool='both'"
        )
    pick = np.random.default_rng(seed).choice(len(candidates), size=n, replace=False)
    return tuple(candidates[i] for i in np.sort(pick))
