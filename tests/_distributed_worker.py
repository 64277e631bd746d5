"""Run under torchrun by tests/torchrun/test_distributed.py: ``_distributed_worker.py OUT
CHECK...``.

Every rank runs the named checks (``stats``, ``rows``, ``train``) and writes what it got to
``OUT/rank<r>.safetensors`` (error messages in its metadata); the test compares the ranks with
each other and with one process. The data and the training run are functions, so the test
computes the one-process references with the same code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from gdacil import ClassGaussians, distributed
from gdacil.io import save_tensors

DIM = 6


def stats_data() -> tuple[torch.Tensor, torch.Tensor]:
    """90 samples: rows 0-59 hold classes 0-3, rows 60-89 classes 2-5 (overlapping sets)."""
    g = torch.Generator().manual_seed(0)
    X = 3.0 * torch.randn(90, DIM, generator=g, dtype=torch.float64) + 1.0
    y = torch.cat([torch.arange(60) % 4, 2 + torch.arange(30) % 4])
    return X, y


def rank_rows(rank: int) -> slice:
    """Rank 0 holds rows 0-59, rank 1 rows 60-89."""
    return slice(0, 60) if rank == 0 else slice(60, 90)


def _stats_tensors(prefix: str, stats: ClassGaussians) -> dict[str, torch.Tensor]:
    return {f"{prefix}/labels": torch.tensor(stats.classes), f"{prefix}/counts": stats.counts,
            f"{prefix}/means": stats.means, f"{prefix}/scatters": stats.scatters}


def check_stats(rank: int) -> tuple[dict, dict]:
    """all_reduce_stats of the ranks' shards, of a shard and an empty one, and the errors of
    statistics that differ in dim or ddof."""
    X, y = stats_data()
    rows = rank_rows(rank)
    mine = ClassGaussians(DIM, ddof=1).update(X[rows], y[rows])
    tensors = _stats_tensors("stats", distributed.all_reduce_stats(mine))
    lonely = mine if rank == 0 else ClassGaussians(DIM, ddof=1)
    tensors.update(_stats_tensors("lonely", distributed.all_reduce_stats(lonely)))
    errors = {}
    mismatched = {"dim": ClassGaussians(DIM + rank), "ddof": ClassGaussians(DIM, ddof=rank)}
    for what, bad in mismatched.items():
        try:
            distributed.all_reduce_stats(bad)
        except ValueError as exc:
            errors[what] = str(exc)
    return tensors, errors


def row_data() -> torch.Tensor:
    return torch.arange(7 * 3, dtype=torch.float32).reshape(7, 3)


def check_rows(rank: int) -> dict:
    """all_gather_rows of shards of 4 and 3 rows, of 1 and 0 rows, and of int64 blocks of
    different lengths."""
    full = row_data()
    return {
        "rows/seven": distributed.all_gather_rows(distributed.shard(full)),
        "rows/one": distributed.all_gather_rows(distributed.shard(full[:1])),
        "rows/ints": distributed.all_gather_rows(torch.arange(rank + 1) + 10 * rank),
    }


def train_nsp() -> dict:
    """Two NSP-SeqFT tasks on the tiny ViT, global batches of 5 (shares of 3 and 2 rows):
    the final weights, the accumulated moments after each task, the loss logs and what
    ``on_step`` got (step index and total loss per call)."""
    from gdacil.adapt import build_strategy
    from gdacil.backbones import build_backbone

    from _assets import TINY_VIT, random_images

    bb = build_backbone("vit", config=TINY_VIT)
    strategy = build_strategy("nsp_seqft",
                              train={"steps": 3, "batch_size": 5, "lr": 0.05, "head_lr": 0.05})
    out = {}
    for t in range(2):
        labels = np.repeat([3 * t, 3 * t + 1, 3 * t + 2], 4)
        steps = []
        log = strategy.adapt_task(bb, t, random_images(12, seed=t), labels, generator=t,
                                  on_step=lambda i, losses, s=steps: s.append([i, losses["loss"]]))
        out[f"loss{t}"] = torch.tensor(log["loss"])
        out[f"steps{t}"] = torch.tensor(steps, dtype=torch.float64)
        out.update({f"moments{t}/{k}": v.clone() for k, v in strategy.moments_.items()})
    out.update({f"weights/{k}": v.detach().clone() for k, v in bb.model.state_dict().items()})
    return out


def main(out: Path, checks: list[str]) -> None:
    torch.set_num_threads(1)
    with distributed.process_group():
        rank = distributed.rank()
        tensors, errors = check_stats(rank) if "stats" in checks else ({}, {})
        if "rows" in checks:
            tensors.update(check_rows(rank))
        if "train" in checks:
            tensors.update(train_nsp())
        from gdacil.backbones.base import resolve_precision

        meta = {"errors": errors, "world": distributed.world_size(),
                "auto_precision": resolve_precision("auto", "cpu")}
        save_tensors(out / f"rank{rank}.safetensors", tensors, meta)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
