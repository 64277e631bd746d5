"""Null-space projection (NSP) of the gradients of trained linear weights.

For every trained linear ``y = W x`` (``W``: out x in; a 1x1 convolution is one, applied to every
pixel's channel vector, whose inputs are then the pixels) we keep the accumulated *uncentred*
second moment of its inputs over the earlier tasks' training samples,

    S_new = X^T X / n     (over all non-padding tokens of the task's training samples),
    S_acc <- decay * S_acc + S_new + accumulate_jitter * I          (reference: decay 0.9),

and during later tasks replace the gradient ``G`` of ``W`` by ``G P`` with the soft projector

    P = (1 - soft) V V^T + soft * I,

``V`` the eigenvectors of ``S_acc + eigen_jitter * I`` of smallest eigenvalue that together
carry less than a fraction ``eps`` of the energy (sum of eigenvalues): the approximate null space
of the earlier inputs (Adam-NSCL [NSP], as the LR-RGDA paper [LR-RGDA] cites it for NSP-SeqFT).
Paper and reference: ``eps = 0.05``, ``soft = 0.02``.

With SGD (the LR-RGDA paper's optimiser for full fine-tuning) every update is a combination of
projected gradients, so with ``soft = 0`` the change of ``W`` is exactly orthogonal to the protected
high-energy directions and the outputs on earlier inputs' principal subspace are unchanged; with
``soft > 0`` a fraction ``soft`` of the gradient in those directions leaks through. With AdamW
(the reference code's default) the per-coordinate scaling of Adam breaks this: the projected
gradient is not the update. The first task trains unconstrained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from .._validation import check_positive_int, check_range
from ..backbones import Backbone
from ..backbones.blocks import linear_input, linear_weight
from ..typed_config import TypedConfig

__all__ = [
    "NullSpaceConfig",
    "accumulate_moments",
    "input_moment_sums",
    "input_second_moments",
    "null_space_split",
    "soft_projector",
]


@dataclass(frozen=True)
class NullSpaceConfig(TypedConfig):
    """NSP settings (defaults: the LR-RGDA paper's and the reference code's).

    Parameters
    ----------
    eps : float
        Energy fraction: the null space is spanned by the smallest eigenvectors carrying jointly
        less than ``eps`` of the energy.
    soft : float
        Identity interpolation ``lambda`` of the soft projector (0 = hard projection).
    decay : float
        Weight of the previous accumulated moment when a task's moment is added.
    accumulate_jitter, eigen_jitter : float
        Multiples of the identity added when accumulating (reference 1e-7) and before the
        eigendecomposition (reference 1e-6).
    batch_size : int
        Batch size of the forward passes that collect the input moments.
    """

    eps: float = 0.05
    soft: float = 0.02
    decay: float = 0.9
    accumulate_jitter: float = 1e-7
    eigen_jitter: float = 1e-6
    batch_size: int = 64

    def __post_init__(self):
        check_range(self.eps, "null_space eps", high=1.0, low_open=True, high_open=True)
        check_range(self.soft, "null_space soft", high=1.0)
        check_range(self.decay, "null_space decay")
        check_range(self.accumulate_jitter, "null_space accumulate_jitter")
        check_range(self.eigen_jitter, "null_space eigen_jitter")
        check_positive_int(self.batch_size, "null_space batch_size")


def input_moment_sums(
    backbone: Backbone, linears: Mapping[str, nn.Module], raws: Sequence, *, batch_size: int
) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Uncentred input sums ``X^T X`` (float64) of each linear and the number of rows of ``X``,
    over every token (every pixel, for a 1x1 convolution) of ``raws`` (positions where the inputs' ``attention_mask`` is 0 are left
    out), with the model in evaluation mode and without gradients. ``raws`` may be empty (zero
    sums and counts), so the sums of shards add up to the sums of the whole."""
    sums: dict[str, torch.Tensor] = {}
    counts = dict.fromkeys(linears, 0)
    mask: list[torch.Tensor | None] = [None]

    def hook_for(name):
        def hook(module, args):
            x = linear_input(module, args[0].detach())  # a 1x1 convolution: one row per pixel
            x = x.reshape(-1, x.shape[-1]) if mask[0] is None else x[mask[0]]
            xx = (x.T @ x).double()
            sums[name] = xx if name not in sums else sums[name] + xx
            counts[name] += x.shape[0]

        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in linears.items()]
    was_training = backbone.model.training
    backbone.model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(raws), batch_size):
                inputs = backbone.preprocess(raws[start : start + batch_size])
                inputs = {k: v.to(backbone.device) for k, v in inputs.items()}
                am = inputs.get("attention_mask")
                mask[0] = None if am is None else am.bool()
                backbone.forward(inputs)
    finally:
        for h in handles:
            h.remove()
        backbone.model.train(was_training)
    for name, m in linears.items():
        if name not in sums:
            weight = linear_weight(cast(torch.Tensor, m.weight))
            sums[name] = torch.zeros(weight.shape[1], weight.shape[1], dtype=torch.float64,
                                     device=weight.device)
    return sums, counts


def input_second_moments(
    backbone: Backbone, linears: Mapping[str, nn.Module], raws: Sequence, *, batch_size: int
) -> dict[str, torch.Tensor]:
    """Uncentred second moments ``X^T X / n`` (float64) of the inputs of each linear, over every
    token of ``raws`` (see :func:`input_moment_sums`)."""
    if len(raws) == 0:
        raise ValueError("input_second_moments needs at least one sample")
    sums, counts = input_moment_sums(backbone, linears, raws, batch_size=batch_size)
    return {name: sums[name] / counts[name] for name in linears}


def accumulate_moments(
    accumulated: torch.Tensor | None, new: torch.Tensor, config: NullSpaceConfig
) -> torch.Tensor:
    """``decay * accumulated + new + accumulate_jitter * I`` (``accumulated`` None: nothing yet),
    computed in float64, returned as float32 on the CPU (the stored state)."""
    new = new.detach().to("cpu", torch.float64)
    total = new if accumulated is None else config.decay * accumulated.to(torch.float64) + new
    eye = torch.eye(total.shape[0], dtype=torch.float64)
    return (total + config.accumulate_jitter * eye).float()


def null_space_split(
    moment: torch.Tensor, eps: float, *, jitter: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthonormal bases ``(V_null, V_protected)`` (float64, columns) of the eigenvectors of
    ``moment + jitter * I``: the smallest ones carrying jointly less than ``eps`` of the energy
    (sum of absolute eigenvalues), and the rest."""
    s = moment.to(torch.float64)
    s = 0.5 * (s + s.T) + jitter * torch.eye(s.shape[0], dtype=s.dtype, device=s.device)
    evals, evecs = torch.linalg.eigh(s)  # ascending
    energy = evals.abs()
    ratio = torch.cumsum(energy, 0) / energy.sum()
    m = int((ratio < eps).sum())
    return evecs[:, :m], evecs[:, m:]


def soft_projector(v_null: torch.Tensor, soft: float) -> torch.Tensor:
    """``P = (1 - soft) V V^T + soft I`` (``v_null``: orthonormal columns), same dtype."""
    eye = torch.eye(v_null.shape[0], dtype=v_null.dtype, device=v_null.device)
    return (1.0 - soft) * (v_null @ v_null.T) + soft * eye
