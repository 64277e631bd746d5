"""LoRA adapters through PEFT: a fresh rank-r adapter per task, merged into the base weights
after the task.

``W' = W + scale * B A`` with ``A`` (r x in) Kaiming-uniform (a = sqrt(5)) and ``B`` (out x r)
zero at the start of a task, which is PEFT's default initialisation (``init_lora_weights=True``)
and the LR-RGDA paper's [LR-RGDA] (LoRA itself: [LoRA]). That paper and the reference code use
r = 4 and scale 1 (PEFT ``lora_alpha = r``) on the QKV projections and both MLP linears of every
block, none on the attention output projection.

The reference code adapts timm's fused ``qkv`` (one rank-4 adapter for q, k and v together);
``transformers`` models have separate q, k, v projections, each of which gets its own rank-r
adapter here (on a timm backbone the fused ``qkv`` gets one, as in the reference).

Adapters are injected into ``backbone.model`` in place (``peft.inject_adapter_in_model``, no
``PeftModel`` wrapper), so ``backbone.forward`` trains through them unchanged; after the task
:func:`merge_lora` folds them into the base weights and puts the plain ``nn.Linear`` modules
back, so parameter names, count and memory are the same after every task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.autograd.graph import increment_version

from .._optional import require
from .._random import isolated_global_seed
from .._validation import check_positive_int, check_range
from ..backbones import Backbone
from ..typed_config import TypedConfig
from .params import ROLES, block_linears

__all__ = ["ADAPTER", "LoRAConfig", "attach_lora", "lora_layers", "merge_lora"]

#: Adapter name used inside PEFT layers.
ADAPTER = "gdacil"


def _peft():
    return require("peft", feature="LoRA strategies",
                   install="pip install peft (or pip install 'gdacil[peft]')")


@dataclass(frozen=True)
class LoRAConfig(TypedConfig):
    """LoRA adapter settings.

    Parameters
    ----------
    rank : int
        Adapter rank r (paper: 4).
    scale : float
        Multiplier of ``B A`` (paper and reference: 1, i.e. PEFT ``lora_alpha = scale * rank``).
    targets : tuple of str
        Block roles that get adapters (see :data:`gdacil.adapt.params.ROLES`); paper:
        q/k/v and both MLP linears.
    """

    rank: int = 4
    scale: float = 1.0
    targets: tuple[str, ...] = ("attention", "mlp_in", "mlp_out")

    def __post_init__(self):
        check_positive_int(self.rank, "lora rank")
        check_range(self.scale, "lora scale", low_open=True)
        targets = self.targets
        if isinstance(targets, str) or not isinstance(targets, (tuple, list)) or not targets:
            raise ValueError(f"lora targets must be a non-empty list of roles ({', '.join(ROLES)});"
                             f" got {targets!r}")
        unknown = sorted(set(targets) - set(ROLES))
        if unknown:
            raise ValueError(f"unknown lora target(s) {unknown}; known: {', '.join(ROLES)}")
        object.__setattr__(self, "targets", tuple(targets))


def lora_layers(model: nn.Module) -> dict[str, Any]:  # values: peft's BaseTunerLayer modules
    """The PEFT adapter layers inside ``model``, by module path."""
    base = _peft().tuners.tuners_utils.BaseTunerLayer
    return {name: m for name, m in model.named_modules() if isinstance(m, base)}


def attach_lora(backbone: Backbone, config: LoRAConfig, *, seed: int) -> list[str]:
    """Inject fresh adapters into ``backbone.model`` (in place); return the adapter parameter
    names.

    PEFT draws the ``A`` matrices from the global torch RNG; that happens inside a forked RNG
    seeded with ``seed``, so the initialisation is reproducible and the global RNG is left as it
    was.
    """
    peft = _peft()
    model = backbone.model
    if lora_layers(model):
        raise RuntimeError("the model already holds LoRA adapters; merge them first (merge_lora)")
    targets = list(block_linears(backbone, config.targets))
    peft_config = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.scale * config.rank,
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        init_lora_weights=True,
    )
    devices = [backbone.device] if backbone.device.type == "cuda" else []
    with isolated_global_seed(seed, devices):
        peft.inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER)
    return [
        f"{name}.{sub}"
        for name, layer in lora_layers(model).items()
        for sub, _ in layer.named_parameters()
        if sub.startswith(("lora_A.", "lora_B."))
    ]


def merge_lora(backbone: Backbone) -> int:
    """Fold every adapter into its base weight (``W += scale * B A``) and replace the adapter
    layer by its base ``nn.Linear``; return how many layers were merged."""
    model = backbone.model
    layers = lora_layers(model)
    for name, layer in layers.items():
        layer.merge(adapter_names=[ADAPTER])
        # PEFT writes the merge through ``weight.data``, which torch's version counter does not
        # see; without this, a weights hash cached before the task (the feature cache's key,
        # a model's recorded backbone identity) would still be taken for the merged weights
        increment_version(layer.get_base_layer().weight)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer.get_base_layer())
    if hasattr(model, "peft_config"):  # bookkeeping that inject_adapter_in_model may leave
        del model.peft_config
    return len(layers)
