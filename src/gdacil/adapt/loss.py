"""Losses of Stage-1 training: symmetric cross-entropy on the new task's logits, plain
cross-entropy, and feature distillation."""

from __future__ import annotations

import torch
from torch.nn import functional as F

__all__ = ["LOSSES", "cross_entropy", "feature_distillation", "symmetric_cross_entropy"]


def symmetric_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    lambda1: float = 0.5,
    lambda2: float = 0.5,
    p_min: float = 1e-7,
    label_min: float = 1e-4,
) -> torch.Tensor:
    """Symmetric cross-entropy (SCE), mean over the batch.

    With ``p = clamp(softmax(logits), p_min, 1)`` and ``y = clamp(onehot(targets), label_min, 1)``::

        loss = lambda1 * CE + lambda2 * RCE,   CE = -sum_k y_k log p_k,   RCE = -sum_k p_k log y_k

    ``RCE = -log(label_min) * (1 - p_y)`` (9.21 * (1 - p_y) at the defaults) is bounded, which
    is what makes SCE [SCE] robust. Defaults are the LR-RGDA paper's and the reference code's
    (lambda1 = lambda2 = 0.5).

    Parameters
    ----------
    logits : torch.Tensor
        ``(n, k)`` logits over the current task's classes.
    targets : torch.Tensor
        ``(n,)`` class indices in ``[0, k)``.
    """
    p = torch.softmax(logits, dim=1).clamp(p_min, 1.0)
    y = F.one_hot(targets, logits.shape[1]).to(p.dtype).clamp(label_min, 1.0)
    ce = -(y * p.log()).sum(1)
    rce = -(p * y.log()).sum(1)
    return (lambda1 * ce + lambda2 * rce).mean()


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, **_) -> torch.Tensor:
    """Plain softmax cross-entropy (the reference code's RandProj first-task training); extra
    keyword arguments (the SCE weights) are ignored."""
    return F.cross_entropy(logits, targets)


def feature_distillation(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Feature distillation: mean of ``(student - teacher)**2`` over batch and dimensions (the
    reference code's ``feat`` KD on the final feature, after the backbone's final norm; the
    LR-RGDA paper cites [FeatKD] for it)."""
    return F.mse_loss(student, teacher.detach())


#: Task losses by name: ``fn(logits, targets, lambda1=, lambda2=)``.
LOSSES = {"sce": symmetric_cross_entropy, "ce": cross_entropy}
