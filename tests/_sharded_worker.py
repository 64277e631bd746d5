"""Run under torchrun by tests/torchrun/test_sharded_head.py: ``_sharded_worker.py OUT``.

Two ranks split the classes of :func:`data` (rank 0 holds classes 0-6, rank 1 classes 7-9), fit
one :class:`ShardedHead` per head kind, answer the same queries, add classes 10-15 where
``assign`` puts them, refit, and answer again. Each rank writes what it got to
``OUT/rank<r>.safetensors`` (errors raised by bad calls in its metadata); the test compares
with one process holding every class.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from gdacil import ClassGaussians, distributed
from gdacil.heads import LDA, LRRGDA, NCM, QDA, RGDA, SGDHead, ShardedHead
from gdacil.io import save_tensors

DIM, FIRST, LATER = 8, range(10), range(10, 16)


def heads() -> dict:
    return {"lr_rgda": LRRGDA(rank=3), "rgda": RGDA(), "lda": LDA(), "qda": QDA(),
            "ncm": NCM(priors="empirical")}


def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X, y, queries): 16 classes of 30 to 45 samples with their own means and covariances."""
    g = torch.Generator().manual_seed(0)
    Xs, ys = [], []
    for c in range(16):
        n = 30 + (c % 4) * 5
        mix = torch.randn(DIM, DIM, generator=g, dtype=torch.float64) / DIM**0.5
        Xs.append(torch.randn(n, DIM, generator=g, dtype=torch.float64) @ mix
                  + 1.5 * torch.randn(DIM, generator=g, dtype=torch.float64))
        ys.append(torch.full((n,), c))
    queries = torch.randn(50, DIM, generator=g, dtype=torch.float64) * 1.2
    return torch.cat(Xs), torch.cat(ys), queries


def stats_of(classes, X, y) -> ClassGaussians:
    keep = torch.isin(y, torch.tensor(list(classes), dtype=y.dtype))
    return ClassGaussians(DIM, ddof=1).update(X[keep], y[keep])


def main(out: Path) -> None:
    rank = distributed.rank()
    X, y, queries = data()
    tensors, errors = {}, {}
    first = [c for c in FIRST if (c >= 7) == (rank == 1)]
    for name, head in heads().items():
        sharded = ShardedHead(head).fit(stats_of(first, X, y))
        scores, labels, proba = sharded.top_k(queries, 3, proba=True)
        tensors |= {f"{name}/first/scores": scores, f"{name}/first/labels": labels,
                    f"{name}/first/proba": proba, f"{name}/first/predict": sharded.predict(queries)}
        owners = sharded.assign(list(LATER))
        tensors[f"{name}/owners"] = torch.tensor(owners)
        mine = first + [c for c, r in zip(LATER, owners) if r == rank]
        sharded.fit(stats_of(mine, X, y))
        scores, labels, proba = sharded.top_k(queries, 4, proba=True)
        tensors |= {f"{name}/later/scores": scores, f"{name}/later/labels": labels,
                    f"{name}/later/proba": proba, f"{name}/classes": sharded.classes_}
    for what, call in {"duplicate": lambda: ShardedHead(LDA()).fit(stats_of([3, 4 + rank], X, y)),
                       "sgd": lambda: ShardedHead(SGDHead()).fit(stats_of(first, X, y)),
                       "priors": lambda: ShardedHead(LDA(priors=[0.5, 0.5])).fit(
                           stats_of(first, X, y))}.items():
        try:
            call()
        except (ValueError, TypeError) as exc:
            errors[what] = f"{type(exc).__name__}: {exc}"
    save_tensors(out / f"rank{rank}.safetensors",
                 {k: v.contiguous() for k, v in tensors.items()}, errors)


if __name__ == "__main__":
    with distributed.process_group("cpu"):
        main(Path(sys.argv[1]))
