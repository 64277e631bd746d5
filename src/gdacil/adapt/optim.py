"""Optimiser and per-step learning-rate schedule of Stage-1 training.

Two parameter groups, the backbone's trained tensors (``lr``) and the temporary task head
(``head_lr``), one schedule for both: linear warmup over the first ``warmup_ratio`` of the steps,
then cosine from 1 down to ``final_lr_ratio`` (the 10 % warmup and decay to lr / 3 of the
LR-RGDA paper [LR-RGDA] and its reference code).

SGD's weight decay is added to the gradients *before* any gradient transform (this is exactly
what ``torch.optim.SGD(weight_decay=...)`` computes, only earlier), so a null-space projection
also projects the decay and the update stays in the protected null space. AdamW's decoupled decay
cannot be moved into the gradient and stays in the optimiser.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["OPTIMIZERS", "Optimization", "lr_factor", "make_optimization"]

#: Supported optimisers: ``"sgd"`` (with momentum; the LR-RGDA paper's choice for full
#: fine-tuning) and ``"adamw"`` (its choice for LoRA and the reference code's for everything).
OPTIMIZERS = ("sgd", "adamw")


def lr_factor(step: int, total: int, warmup_ratio: float, final_ratio: float) -> float:
    """Multiplier of the base learning rate for update ``step`` (0-based) of ``total``.

    Warmup: ``w = round(warmup_ratio * total)`` updates with factor ``(step + 1) / w`` (the first
    update is not wasted at lr 0). Then cosine from 1 at update ``w`` to ``final_ratio`` at the
    last update.
    """
    warm = round(warmup_ratio * total)
    if step < warm:
        return (step + 1) / warm
    span = max(total - warm - 1, 1)
    progress = min((step - warm) / span, 1.0)
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass
class Optimization:
    """The optimiser, the schedule and the SGD gradient decay of one task's training; build it
    with :func:`make_optimization`."""

    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    params: list[torch.nn.Parameter]
    grad_decay: float

    def step(self, grad_transform: Callable[[], None] | None = None) -> None:
        """Add the SGD decay to the gradients, run ``grad_transform`` (e.g. the null-space
        projection, in place on ``.grad``), update, advance the schedule, clear the gradients."""
        if self.grad_decay:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.grad.add_(p, alpha=self.grad_decay)
        if grad_transform is not None:
            grad_transform()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


def make_optimization(
    name: str,
    backbone_params: Sequence[torch.nn.Parameter],
    head_params: Sequence[torch.nn.Parameter],
    *,
    lr: float,
    head_lr: float,
    momentum: float,
    weight_decay: float,
    steps: int,
    warmup_ratio: float,
    final_lr_ratio: float,
) -> Optimization:
    """Optimiser over two groups (backbone at ``lr``, head at ``head_lr``) with the warmup-cosine
    schedule of :func:`lr_factor`.

    Parameters
    ----------
    name : {"sgd", "adamw"}
    backbone_params, head_params : sequence of torch.nn.Parameter
    lr, head_lr : float
        Base learning rates of the two groups.
    momentum : float
        SGD momentum (ignored by AdamW).
    weight_decay : float
        L2 decay for SGD (added to the gradients, see the module docstring), decoupled decay for
        AdamW; applied to both groups.
    steps, warmup_ratio, final_lr_ratio
        Schedule (see :func:`lr_factor`).
    """
    groups: list[dict[str, Any]] = [
        {"params": list(backbone_params), "lr": lr},
        {"params": list(head_params), "lr": head_lr},
    ]
    params = [p for g in groups for p in g["params"]]
    optimizer: torch.optim.Optimizer
    if name == "sgd":
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=0.0)
        grad_decay = weight_decay
    elif name == "adamw":
        optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
        grad_decay = 0.0
    else:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, steps, warmup_ratio, final_lr_ratio)
    )
    return Optimization(optimizer, scheduler, params, grad_decay)
