"""Find the linear layers of every transformer block, for Stage-1 strategies.

A backbone says which of its layers play which role through ``Backbone.blocks()``: a list of
:class:`BlockLinears`, one per block. Transformers find theirs with :func:`find_blocks`; a CNN
gives its inverted-bottleneck blocks, whose 1x1 (pointwise) expansion and projection
convolutions play the MLP's roles (a 1x1 convolution is a linear map applied to every pixel's
channel vector), with no attention.

Fine-tuning strategies (SeqFT on the MLPs, LoRA, null-space projection, ...) need each block's
MLP input/output projections (``fc1``/``fc2`` in ViT, CLIP, DINOv2 and timm; ``intermediate.dense``
/``output.dense`` in BERT and in older ``transformers`` ViTs) and its attention projections. The
module names differ between model families and library versions, so they are matched against the
table below, relative to each block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

__all__ = ["BlockLinears", "find_blocks", "linear_input", "linear_weight"]

#: (MLP input, MLP output) names relative to a block.
MLP_NAMES = (
    ("mlp.fc1", "mlp.fc2"),  # transformers ViT/CLIP/DINOv2 (>= 5), timm
    ("intermediate.dense", "output.dense"),  # BERT, transformers ViT (< 5)
    ("mlp.weights_in", "mlp.weights_out"),  # DINOv2 SwiGLU variant
)
#: Attention input projections (q, k, v or a fused qkv) relative to a block.
ATTENTION_NAMES = (
    ("attention.q_proj", "attention.k_proj", "attention.v_proj"),
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("attention.attention.query", "attention.attention.key", "attention.attention.value"),
    ("attention.self.query", "attention.self.key", "attention.self.value"),
    ("attn.qkv",),
)
#: Attention output projection relative to a block.
ATTENTION_OUT_NAMES = (
    "attention.o_proj",
    "self_attn.out_proj",
    "attention.output.dense",
    "attn.proj",
)


@dataclass(frozen=True)
class BlockLinears:
    """The linear layers of one transformer block.

    Attributes
    ----------
    index : int
        Position of the block (0 = closest to the input).
    prefix : str
        Module path of the block inside the backbone's ``model``.
    mlp_in, mlp_out : torch.nn.Linear or torch.nn.Conv2d
        The MLP's expansion and projection layers (in a CNN block: its 1x1 expansion and
        projection convolutions).
    attention : tuple of torch.nn.Linear
        Query, key, value projections (or one fused ``qkv``); empty in a CNN.
    attention_out : torch.nn.Linear or None
        Attention output projection.
    """

    index: int
    prefix: str
    mlp_in: nn.Module
    mlp_out: nn.Module
    attention: tuple[nn.Module, ...]
    attention_out: nn.Module | None

    def linears(self) -> dict[str, nn.Module]:
        """The block's linear layers by role: ``mlp_in``, ``mlp_out``, ``attention.<i>``,
        ``attention_out``."""
        found = {"mlp_in": self.mlp_in, "mlp_out": self.mlp_out}
        found.update({f"attention.{i}": m for i, m in enumerate(self.attention)})
        if self.attention_out is not None:
            found["attention_out"] = self.attention_out
        return found


def linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """A role layer's weight as the (out, in) matrix of its linear map: a 1x1 convolution's
    ``(out, in, 1, 1)`` weight viewed as ``(out, in)`` (a view: writes go to the weight)."""
    return weight if weight.ndim == 2 else weight.flatten(1)


def linear_input(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The inputs of a role layer as rows of its linear map: ``(..., in)`` tokens of a linear
    layer as they are, ``(batch, in, h, w)`` feature maps of a 1x1 convolution as one row per
    pixel ``(batch, h, w, in)``."""
    return x.movedim(1, -1) if isinstance(module, nn.Conv2d) else x


def _get(block: nn.Module, name: str) -> nn.Module | None:
    try:
        mod = block.get_submodule(name)
    except AttributeError:
        return None
    return mod if isinstance(mod, nn.Linear) else None


def _match_block(block: nn.Module) -> tuple | None:
    for in_name, out_name in MLP_NAMES:
        mlp_in, mlp_out = _get(block, in_name), _get(block, out_name)
        if mlp_in is not None and mlp_out is not None:
            break
    else:
        return None
    attention: tuple = ()
    for names in ATTENTION_NAMES:
        mods = tuple(_get(block, n) for n in names)
        if all(m is not None for m in mods):
            attention = mods
            break
    outs = (_get(block, n) for n in ATTENTION_OUT_NAMES)
    attention_out = next((m for m in outs if m is not None), None)
    return mlp_in, mlp_out, attention, attention_out


def find_blocks(model: nn.Module) -> list[BlockLinears]:
    """Return the :class:`BlockLinears` of every transformer block of ``model``, in order.

    The blocks are the elements of the first ``nn.ModuleList`` (in module order) whose every
    element has an MLP from :data:`MLP_NAMES`. Raises ``ValueError`` when there is none.
    """
    for prefix, mod in model.named_modules():
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        matches = [_match_block(b) for b in mod]
        if all(m is not None for m in matches):
            return [
                BlockLinears(i, f"{prefix}.{i}" if prefix else str(i), *cast(tuple, m))
                for i, m in enumerate(matches)
            ]
    raise ValueError(
        f"no transformer blocks found in {type(model).__name__}: no ModuleList whose elements all "
        f"have an MLP named {' or '.join('/'.join(p) for p in MLP_NAMES)}"
    )
