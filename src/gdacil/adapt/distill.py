"""The distillation teacher: the backbone as it was at the start of the task.

Only the tensors that the task trains can differ between teacher and student, so the teacher is a
copy of those tensors alone (the MLP weights for SeqKD; for LoRA-SeqKD the fresh adapters, whose
``B = 0`` makes the teacher exactly the merged model of the previous task), not a deep copy of the
network as in the reference code. Teacher features are computed by the same module with those
tensors swapped in through :func:`torch.func.functional_call`, without gradients.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..backbones import Backbone

__all__ = ["Teacher"]


class _BackboneCall(nn.Module):
    """``backbone.forward`` as a module whose parameters are ``backbone.model``'s (prefixed
    ``model.``), so that :func:`torch.func.functional_call` can substitute some of them."""

    def __init__(self, backbone: Backbone):
        super().__init__()
        self.model = backbone.model
        self.backbone = backbone  # not an nn.Module: a plain attribute

    def forward(self, inputs):
        return self.backbone.forward(inputs)


class Teacher:
    """Frozen copies of some parameters of a backbone's model; see :meth:`capture`.

    Parameters
    ----------
    tensors : dict of str to torch.Tensor
        Parameter name (inside ``backbone.model``) -> frozen value.
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    @classmethod
    def capture(cls, model: nn.Module, names: Sequence[str]) -> Teacher:
        """Copy the current values of the parameters ``names`` of ``model``."""
        params = dict(model.named_parameters())
        missing = sorted(set(names) - set(params))
        if missing:
            raise ValueError(f"the model has no parameter(s) {missing}")
        return cls({name: params[name].detach().clone() for name in names})

    def nbytes(self) -> int:
        """Memory held by the copies, in bytes."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def features(self, backbone: Backbone, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """``backbone.forward(inputs)`` with the captured tensors in place of the current ones,
        without gradients. The backbone's own parameters are not touched."""
        swapped = {f"model.{name}": t for name, t in self.tensors.items()}
        with torch.no_grad():
            return torch.func.functional_call(_BackboneCall(backbone), swapped, (inputs,))
