"""Stage-1 backbone adaptation strategies, by name.

"The paper" below is the LR-RGDA paper [LR-RGDA], whose strategies these are; they build on
feature distillation [FeatKD], null-space projection [NSP] and LoRA [LoRA] (see
docs/references.md).

==============  ================================================================================
name            what (paper defaults)
==============  ================================================================================
``frozen``      no training
``seqft``       MLP weights of every block (biases frozen), SGD m=0.9, lr 5e-6, head 5e-5, 1000 st.
``seqkd``       seqft + feature distillation (kd_weight 1.0), 1500 steps
``nsp_seqft``   seqft with null-space gradient projection (eps 0.05, soft 0.02), 1500 steps
``nsp_seqkd``   nsp_seqft + distillation (kd_weight 0.5), 1500 steps
``lora_seqft``  fresh rank-4 LoRA (q/k/v, MLP) per task, merged after it; AdamW lr 1e-4, head
                1e-3, 1500 steps
``lora_seqkd``  lora_seqft + distillation (kd_weight 1.0)
``randproj``    LoRA on the first task only (cross-entropy, AdamW 1e-4 / 1e-3, 2000 steps, cosine
                to 0.3 lr: the reference code's recipe; the paper gives none), then frozen; the
                random ReLU projection on top is :class:`gdacil.backbones.RandomProjection`
==============  ================================================================================

Every strategy uses the SCE loss [SCE] (lambda1 = lambda2 = 0.5) on a temporary head over the task's
classes, 10 % linear warmup then cosine to lr / 3, batch size 16, weight decay 3e-5.
``build_strategy(name, defaults="reference")`` applies the reference code's departures from the
paper (:data:`REFERENCE_OVERRIDES`): AdamW with head lr 1e-3 for full fine-tuning, and 1000 steps
for NSP-SeqFT and LoRA-SeqFT.

>>> from gdacil.adapt import build_strategy
>>> s = build_strategy("seqkd", train={"steps": 300})
>>> (s.config.kd_weight, s.config.train.steps, s.config.train.optimizer)
(1.0, 300, 'sgd')

Per task (see :class:`Strategy`)::

    strategy.begin_task(backbone, t, generator=g)
    log = strategy.train_task(backbone, train_raw, train_labels, generator=g)
    strategy.end_task(backbone, train_raw)
"""

from __future__ import annotations

from functools import partial

from ..registry import Registry
from .augment import AugmentConfig, augment_images
from .base import Strategy, minibatches, trained_backbone
from .config import PARAMS, StrategyConfig, TrainConfig
from .distill import Teacher
from .lora import LoRAConfig, attach_lora, lora_layers, merge_lora
from .loss import LOSSES, cross_entropy, feature_distillation, symmetric_cross_entropy
from .nullspace import (
    NullSpaceConfig,
    input_moment_sums,
    input_second_moments,
    null_space_split,
    soft_projector,
)
from .optim import OPTIMIZERS, lr_factor, make_optimization
from .params import ROLES, block_linears, mlp_weight_names

__all__ = [
    "DEFAULTS",
    "LOSSES",
    "OPTIMIZERS",
    "PARAMS",
    "PRESETS",
    "REFERENCE_OVERRIDES",
    "ROLES",
    "STRATEGIES",
    "AugmentConfig",
    "LoRAConfig",
    "NullSpaceConfig",
    "Strategy",
    "StrategyConfig",
    "Teacher",
    "TrainConfig",
    "attach_lora",
    "augment_images",
    "block_linears",
    "build_strategy",
    "cross_entropy",
    "feature_distillation",
    "input_moment_sums",
    "input_second_moments",
    "lora_layers",
    "lr_factor",
    "make_optimization",
    "merge_lora",
    "minibatches",
    "mlp_weight_names",
    "null_space_split",
    "soft_projector",
    "strategy_config",
    "symmetric_cross_entropy",
    "trained_backbone",
]

_FULL_FT = {"optimizer": "sgd", "lr": 5e-6, "head_lr": 5e-5, "momentum": 0.9}
_LORA = {"optimizer": "adamw", "lr": 1e-4, "head_lr": 1e-3}

#: The LR-RGDA paper's strategies: ``StrategyConfig`` fields (nested configs as dicts).
PRESETS: dict[str, dict] = {
    "frozen": {"params": "none"},
    "seqft": {"params": "mlp", "train": {**_FULL_FT, "steps": 1000}},
    "seqkd": {"params": "mlp", "kd_weight": 1.0, "train": {**_FULL_FT, "steps": 1500}},
    "nsp_seqft": {"params": "mlp", "null_space": {}, "train": {**_FULL_FT, "steps": 1500}},
    "nsp_seqkd": {"params": "mlp", "null_space": {}, "kd_weight": 0.5,
                  "train": {**_FULL_FT, "steps": 1500}},
    "lora_seqft": {"params": "lora", "train": {**_LORA, "steps": 1500}},
    "lora_seqkd": {"params": "lora", "kd_weight": 1.0, "train": {**_LORA, "steps": 1500}},
    "randproj": {"params": "lora", "first_task_only": True,
                 "train": {**_LORA, "steps": 2000, "loss": "ce", "final_lr_ratio": 0.3}},
}

_REF_FULL_FT = {"optimizer": "adamw", "head_lr": 1e-3}
#: Where the reference code departs from the LR-RGDA paper (applied by ``defaults="reference"``):
#: AdamW (head lr 1e-3) instead of SGD for full fine-tuning, 1000 steps instead of 1500 for
#: NSP-SeqFT and LoRA-SeqFT. (CUB-200 runs use 500 / 1000 steps there; set ``train.steps``.)
REFERENCE_OVERRIDES: dict[str, dict] = {
    "seqft": {"train": _REF_FULL_FT},
    "seqkd": {"train": _REF_FULL_FT},
    "nsp_seqft": {"train": {**_REF_FULL_FT, "steps": 1000}},
    "nsp_seqkd": {"train": _REF_FULL_FT},
    "lora_seqft": {"train": {"steps": 1000}},
}

#: Default sets accepted by :func:`build_strategy`.
DEFAULTS = ("paper", "reference")


def _merge(base: dict, overrides: dict) -> dict:
    """``base`` updated by ``overrides``; dict values of nested configs are merged key by key."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _preset(name: str, *, defaults: str = "paper", **overrides) -> StrategyConfig:
    if defaults not in DEFAULTS:
        raise ValueError(f"unknown defaults {defaults!r}; known: {', '.join(DEFAULTS)}")
    fields = PRESETS[name]
    if defaults == "reference":
        fields = _merge(fields, REFERENCE_OVERRIDES.get(name, {}))
    return StrategyConfig.from_dict(_merge({"name": name, **fields}, overrides), where="strategy")


#: Strategy config factories by name: ``STRATEGIES[name](defaults=..., **overrides)``.
STRATEGIES = Registry("strategy")
for _name in PRESETS:
    STRATEGIES.register(_name, partial(_preset, _name))


def strategy_config(name: str, /, *, defaults: str = "paper", **overrides) -> StrategyConfig:
    """The :class:`StrategyConfig` of preset ``name`` with ``overrides``.

    Parameters
    ----------
    name : str
        A key of :data:`STRATEGIES` (unknown names raise ``ValueError`` listing the known ones).
    defaults : {"paper", "reference"}
        The LR-RGDA paper's hyperparameters, or the reference code's
        (:data:`REFERENCE_OVERRIDES`).
    **overrides
        :class:`StrategyConfig` fields; nested configs (``train``, ``lora``, ``null_space``)
        as dicts update the preset's key by key, e.g. ``train={"steps": 300}``;
        ``null_space=None`` switches the projection off.
    """
    return STRATEGIES.build(name, defaults=defaults, **overrides)


def build_strategy(name: str | dict | StrategyConfig, /, *, defaults: str = "paper",
                   **overrides) -> Strategy:
    """A :class:`Strategy` from a preset name (see :func:`strategy_config`), a saved config dict
    (``StrategyConfig.to_dict()``; ``overrides`` update it), or a :class:`StrategyConfig`."""
    if isinstance(name, StrategyConfig):
        if overrides:
            name = name.to_dict()
        else:
            return Strategy(name)
    if isinstance(name, dict):
        return Strategy(StrategyConfig.from_dict(_merge(name, overrides)))
    return Strategy(strategy_config(name, defaults=defaults, **overrides))
