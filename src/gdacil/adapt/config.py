"""Configuration of a Stage-1 strategy: what trains, with which regularisers, and how.

A strategy is composed of orthogonal parts, as in the LR-RGDA paper [LR-RGDA]:

* ``params``: what the task trains: ``"none"`` (frozen backbone), ``"mlp"`` (the MLP weight
  matrices of every block: SeqFT) or ``"lora"`` (a fresh LoRA adapter per task, merged after it);
* ``kd_weight``: feature distillation to the previous task's model (SeqKD, NSP-SeqKD, LoRA-SeqKD);
* ``null_space``: null-space gradient projection (NSP-SeqFT, NSP-SeqKD; ``params="mlp"`` only);
* ``first_task_only``: adapt on the first task, then freeze (RandProj's first-session adaptation);
* ``train``: optimiser, schedule, steps, batch size, task loss and augmentation.

The named presets (``gdacil.adapt.STRATEGIES``) fill these in with that paper's values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._validation import check_choice, check_positive_int, check_range
from ..typed_config import TypedConfig
from .augment import AugmentConfig
from .lora import LoRAConfig
from .loss import LOSSES
from .nullspace import NullSpaceConfig
from .optim import OPTIMIZERS

__all__ = ["PARAMS", "StrategyConfig", "TrainConfig"]

#: What a strategy trains: nothing, the blocks' MLP weights, or LoRA adapters.
PARAMS = ("none", "mlp", "lora")


#: ``train.augment`` value: the default augmentation on image backbones, none on the others
AUTO = "auto"


def _augment(value: Any, path: str) -> AugmentConfig | str | None:
    """``augment`` as a config: ``True`` is the default augmentation, ``False`` none, ``"auto"``
    the default augmentation for images and none for other inputs."""
    if isinstance(value, bool):
        return AugmentConfig() if value else None
    if value == AUTO:
        return AUTO
    return None if value is None else AugmentConfig.from_dict(value, where=path)


@dataclass(frozen=True)
class TrainConfig(TypedConfig):
    """How one task is trained. Defaults: the LR-RGDA paper's full fine-tuning recipe (SeqFT).

    Every task trains the backbone jointly with a temporary bias-free linear head over the
    task's classes (initialised uniformly in +-1/sqrt(dim) from the task's generator, discarded
    after the task) for a fixed number of optimiser ``steps``, cycling over the task's samples in
    shuffled minibatches. The model runs in evaluation mode (dropout off), so training is
    deterministic given the generator.

    Parameters
    ----------
    steps : int
        Optimiser steps per task (paper: 1000 for SeqFT, 1500 with distillation, NSP or LoRA;
        reference code: 1000 for NSP-SeqFT and LoRA-SeqFT too). 0 trains nothing.
    batch_size : int
        Minibatch size (reference code: 16; the LR-RGDA paper does not say).
    optimizer : {"sgd", "adamw"}
        Paper: SGD with momentum 0.9 for full fine-tuning, AdamW for LoRA. Reference code:
        AdamW for everything.
    lr : float
        Backbone learning rate (paper: 5e-6 full fine-tuning, 1e-4 LoRA).
    head_lr : float
        Head learning rate (paper: 5e-5 full fine-tuning, 1e-3 LoRA; reference code: 1e-3
        whenever the optimiser is AdamW).
    momentum : float
        SGD momentum (paper 0.9).
    weight_decay : float
        Reference code: 3e-5 (the LR-RGDA paper does not say). With SGD it is an L2 term added
        to the gradients before the null-space projection; with AdamW it is decoupled.
    warmup_ratio : float
        Fraction of the steps with linear warmup (10 %).
    final_lr_ratio : float
        The cosine decays the learning rate to this fraction of its base value (1/3).
    loss : {"sce", "ce"}
        Task loss: symmetric cross-entropy (paper) or cross-entropy (reference RandProj).
    sce_lambda1, sce_lambda2 : float
        SCE weights of CE and reverse CE (0.5, 0.5).
    augment : AugmentConfig, "auto" or None
        Random resized crop, flip and brightness jitter for image backbones (the reference
        code's training transform; the LR-RGDA paper does not describe one). ``"auto"``: the
        default :class:`~gdacil.adapt.AugmentConfig` when the trained backbone takes images,
        none for other inputs (what ``gdacil learn --strategy`` sets). None (the default, so
        that runs and models saved before ``"auto"`` existed resume as they were) feeds the
        evaluation preprocessing; an explicit config on a text backbone is refused.
        ``True``/``False`` are accepted for the default augmentation / none.
    """

    steps: int = 1000
    batch_size: int = 16
    optimizer: str = "sgd"
    lr: float = 5e-6
    head_lr: float = 5e-5
    momentum: float = 0.9
    weight_decay: float = 3e-5
    warmup_ratio: float = 0.1
    final_lr_ratio: float = 1.0 / 3.0
    loss: str = "sce"
    sce_lambda1: float = 0.5
    sce_lambda2: float = 0.5
    augment: AugmentConfig | str | None = field(default=None, metadata={"parse": _augment})

    def __post_init__(self):
        self._coerce_nested()
        check_positive_int(self.steps, "steps", minimum=0)
        check_positive_int(self.batch_size, "batch_size")
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        check_range(self.lr, "lr")
        check_range(self.head_lr, "head_lr")
        check_range(self.momentum, "momentum", high=1.0, high_open=True)
        check_range(self.weight_decay, "weight_decay")
        check_range(self.warmup_ratio, "warmup_ratio", high=1.0)
        check_range(self.final_lr_ratio, "final_lr_ratio", high=1.0)
        check_choice(self.loss, "loss", tuple(LOSSES))
        if isinstance(self.augment, str) and self.augment != AUTO:
            raise ValueError(f"augment must be a mapping, true, false, null or {AUTO!r}; "
                             f"got {self.augment!r}")
        check_range(self.sce_lambda1, "sce_lambda1")
        check_range(self.sce_lambda2, "sce_lambda2")


@dataclass(frozen=True)
class StrategyConfig(TypedConfig):
    """A Stage-1 strategy (see the module docstring for the parts).

    Parameters
    ----------
    name : str
        Label recorded with the results (the preset's name).
    params : {"none", "mlp", "lora"}
    kd_weight : float
        Weight of the feature-distillation MSE to the previous task's model (paper: 1.0 for
        SeqKD and LoRA-SeqKD, 0.5 for NSP-SeqKD). Not applied on the first task.
    null_space : NullSpaceConfig or None
        Null-space gradient projection (``params="mlp"`` only).
    lora : LoRAConfig
        Adapter settings, used when ``params="lora"``.
    first_task_only : bool
        Train on the first task only (task index 0), frozen afterwards.
    train : TrainConfig
    """

    name: str = "custom"
    params: str = "mlp"
    kd_weight: float = 0.0
    null_space: NullSpaceConfig | None = None
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    first_task_only: bool = False
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        self._coerce_nested()
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string; got {self.name!r}")
        check_choice(self.params, "params", PARAMS)
        check_range(self.kd_weight, "kd_weight")
        if not isinstance(self.first_task_only, bool):
            raise ValueError(
                f"first_task_only must be true or false; got {self.first_task_only!r}")
        if self.lora is None or self.train is None:
            raise ValueError("lora and train must be configs or mappings, not None")
        if self.null_space is not None and self.params != "mlp":
            raise ValueError(f"null_space projection needs params='mlp'; got {self.params!r}")
        if self.kd_weight > 0 and self.params == "none":
            raise ValueError("kd_weight > 0 needs a trained backbone (params 'mlp' or 'lora')")
