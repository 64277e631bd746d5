"""Which tensors a Stage-1 strategy trains: named block linears and the MLP weights (SeqFT).

SeqFT, as in the reference code, trains only the weight matrices of the two MLP linears of every
transformer block (ViT ``mlp.fc1``/``mlp.fc2``, BERT ``intermediate.dense``/``output.dense``);
their biases, attention, norms and embeddings stay frozen. Which layers those are, the backbone
says (``Backbone.blocks()``): in EfficientNet-Lite0 they are the 1x1 expansion and projection
convolutions of its inverted-bottleneck blocks (docs/backbones.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from ..backbones import Backbone

__all__ = ["ROLES", "block_linears", "mlp_weight_names", "restore_trainable", "set_trainable"]

#: Roles of a block's linears (see :meth:`gdacil.backbones.BlockLinears.linears`):
#: ``attention`` means all of the block's q/k/v (or fused qkv) projections.
ROLES = ("attention", "attention_out", "mlp_in", "mlp_out")


def block_linears(backbone: Backbone, roles: Sequence[str]) -> dict[str, nn.Module]:
    """The linears (``nn.Linear``, or 1x1 ``nn.Conv2d`` in a CNN) with the given roles in every
    block, by module path inside ``backbone.model`` (block order, then the order of
    ``roles``)."""
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown block role(s) {unknown}; known: {', '.join(ROLES)}")
    path_of = {id(m): name for name, m in backbone.model.named_modules()}
    found: dict[str, nn.Module] = {}
    for block in backbone.blocks():
        by_role = block.linears()
        for role in roles:
            keys = [k for k in by_role if k == role or k.startswith(f"{role}.")]
            for key in keys:
                found[path_of[id(by_role[key])]] = by_role[key]
    return found


def mlp_weight_names(backbone: Backbone) -> list[str]:
    """Parameter names of the MLP weight matrices of every block (what SeqFT trains)."""
    return [f"{name}.weight" for name in block_linears(backbone, ("mlp_in", "mlp_out"))]


def set_trainable(model: nn.Module, names: Sequence[str]) -> None:
    """Let exactly the parameters ``names`` of ``model`` require gradients."""
    params = dict(model.named_parameters())
    missing = sorted(set(names) - set(params))
    if missing:
        raise ValueError(f"the model has no parameter(s) {missing}")
    wanted = set(names)
    for name, p in params.items():
        p.requires_grad_(name in wanted)


def restore_trainable(model: nn.Module, flags: Mapping[str, bool]) -> None:
    """Set ``requires_grad`` back to ``flags`` (parameters not named there are left alone)."""
    for name, p in model.named_parameters():
        if name in flags:
            p.requires_grad_(flags[name])
