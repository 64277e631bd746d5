"""Hugging Face vision transformers: ViT (supervised IN-21K), CLIP vision, DINO and DINOv2.

Features are the CLS token after the final LayerNorm. With ``final_norm="nonaffine_ln"`` (the
default, as in the reference code for every backbone) that LayerNorm is replaced by a
parameter-free one, so every feature has zero mean and unit (biased) variance over its
coordinates and norm ``sqrt(dim)``; the regularisation constants of the LR-RGDA paper
[LR-RGDA] assume that scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from .._deprecation import renamed_parameters
from .base import (
    ImageBackbone,
    check_final_norm,
    make_final_layernorm_nonaffine,
    normalize_features,
)
from .blocks import find_blocks
from .hf import HFOrigin, transformers_module
from .preprocess import ImagePreprocess

__all__ = ["HF_VISION_FAMILIES", "HFVisionBackbone", "HFVisionFamily"]


@dataclass(frozen=True)
class HFVisionFamily:
    """How one ``transformers`` vision model family is built and read.

    Attributes
    ----------
    model_class, config_class : str
        ``transformers`` class names.
    final_norm : tuple of str
        Candidate module paths of the final LayerNorm (the first that exists is used).
    cls_from_pooler : bool
        Read the CLS feature from ``pooler_output`` (CLIP, DINOv2) instead of
        ``last_hidden_state[:, 0]`` (ViT, DINO).
    default_source : str
        Hub id used when neither ``source`` nor ``config`` is given.
    preprocess : ImagePreprocess
        The checkpoint's own evaluation preprocessing.
    model_kwargs : dict
        Extra constructor arguments.
    interpolate_argument : bool
        The model resizes its position embeddings to another input size only when called
        with ``interpolate_pos_encoding=True`` (ViT, DINO, CLIP); DINOv2 always resizes them.
    """

    model_class: str
    config_class: str
    final_norm: tuple[str, ...]
    cls_from_pooler: bool
    default_source: str
    preprocess: ImagePreprocess
    model_kwargs: dict = field(default_factory=dict)
    interpolate_argument: bool = True


HF_VISION_FAMILIES: dict[str, HFVisionFamily] = {
    "vit": HFVisionFamily(
        "ViTModel",
        "ViTConfig",
        ("layernorm",),
        False,
        "google/vit-base-patch16-224-in21k",
        ImagePreprocess(224, None, "bilinear", "half"),
        {"add_pooling_layer": False},
    ),
    "dino": HFVisionFamily(
        "ViTModel",
        "ViTConfig",
        ("layernorm",),
        False,
        "facebook/dino-vitb16",
        ImagePreprocess(224, 256, "bicubic", "imagenet"),
        {"add_pooling_layer": False},
    ),
    "clip": HFVisionFamily(
        "CLIPVisionModel",
        "CLIPVisionConfig",
        ("post_layernorm", "vision_model.post_layernorm"),
        True,
        "openai/clip-vit-base-patch16",
        ImagePreprocess(224, 224, "bicubic", "clip"),
    ),
    "dinov2": HFVisionFamily(
        "Dinov2Model",
        "Dinov2Config",
        ("layernorm",),
        True,
        "facebook/dinov2-base",
        ImagePreprocess(224, 256, "bicubic", "imagenet"),
        interpolate_argument=False,
    ),
}


class HFVisionBackbone(ImageBackbone):
    """A ``transformers`` vision transformer giving CLS features.

    Parameters
    ----------
    family : {"vit", "dino", "clip", "dinov2"}
        See :data:`HF_VISION_FAMILIES`.
    source : str, optional
        Hub id or local checkpoint directory (default: the family's ``default_source``).
    config : dict, optional
        Model config keyword arguments: build a randomly initialised model instead of loading
        weights (used for tests, e.g. ``dict(hidden_size=32, num_hidden_layers=2, ...)``).
    final_norm : {"nonaffine_ln", "pretrained", "l2"}
        See :data:`~gdacil.backbones.base.FINAL_NORMS`.
    preprocess : ImagePreprocess or dict, optional
        Defaults to the family's, at the model's ``image_size``.
    device : None, str or torch.device, default None
        Where the model runs (None: the CPU).
    seed : int, default 0
        Seed of the random initialisation when ``config`` is given: every random choice takes
        this seed. The former name ``init_seed`` is a deprecated alias.
    revision : str, optional
        Hub revision (pin it for reproducible downloads).
    local_files_only : bool
        Never contact the hub.
    name : str, optional
        Registry name to record (default: the family).
    layers : int, optional
        Keep only the first ``layers`` transformer blocks (1-based count; None: all): the
        feature is then the CLS token after block ``layers``, through the final norm, which must
        be ``"nonaffine_ln"`` or ``"l2"`` (both apply a LayerNorm without affine parameters:
        the learned final LayerNorm belongs to the last block). The dropped blocks cost
        nothing and no strategy trains them.
    """

    @renamed_parameters(init_seed="seed")
    def __init__(
        self,
        family: str = "vit",
        source: str | None = None,
        *,
        config: dict | None = None,
        final_norm: str = "nonaffine_ln",
        preprocess: ImagePreprocess | dict | None = None,
        device: torch.device | str | None = None,
        seed: int = 0,
        revision: str | None = None,
        local_files_only: bool = False,
        name: str | None = None,
        layers: int | None = None,
    ):
        if family not in HF_VISION_FAMILIES:
            raise ValueError(
                f"unknown Hugging Face vision family {family!r}; "
                f"known: {', '.join(sorted(HF_VISION_FAMILIES))}"
            )
        spec = HF_VISION_FAMILIES[family]
        self.family = family
        self.origin = HFOrigin.resolve(source, config, spec.default_source, revision, seed)
        self.final_norm = check_final_norm(final_norm)
        tf = transformers_module(f"the Hugging Face '{family}' backbone")
        model_class = getattr(tf, spec.model_class)
        model = self.origin.load(
            model_class,
            getattr(tf, spec.config_class),
            model_class,
            local_files_only=local_files_only,
            **spec.model_kwargs,
        )
        self.image_size = int(model.config.image_size)
        self.layers = _truncate(model, layers, self.final_norm)
        self._norm_path = next((p for p in spec.final_norm if _has_module(model, p)), None)
        if self._norm_path is None:
            raise ValueError(f"{spec.model_class} has no final LayerNorm at {spec.final_norm}")
        if self.final_norm == "nonaffine_ln" or self.layers is not None:
            make_final_layernorm_nonaffine(model, self._norm_path)
        model.eval()
        super().__init__(
            model,
            model.config.hidden_size,
            transform=preprocess or spec.preprocess.scaled_to(self.image_size),
            name=name or family,
            device=device,
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        x = inputs["pixel_values"]
        spec = HF_VISION_FAMILIES[self.family]
        resize = spec.interpolate_argument and tuple(x.shape[-2:]) != (self.image_size,) * 2
        out = self.model(pixel_values=x, **({"interpolate_pos_encoding": True} if resize else {}))
        f = out.pooler_output if spec.cls_from_pooler else out.last_hidden_state[:, 0]
        return normalize_features(f, self.final_norm, in_model=True)

    def architecture(self) -> dict:
        return {
            "family": self.family,
            "model_class": type(self.model).__name__,
            "final_norm_module": self._norm_path,
            **({"layers": self.layers} if self.layers is not None else {}),
        }

    def config(self) -> dict:
        return {**super().config(), **self.origin.to_dict()}


def _truncate(model: nn.Module, layers: int | None, final_norm: str) -> int | None:
    """Drop the blocks of ``model`` after the first ``layers`` (in place); returns ``layers``,
    or None when it keeps them all."""
    blocks = find_blocks(model)
    if layers is None or layers == len(blocks):
        return None
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= len(blocks):
        raise ValueError(f"layers must be an integer from 1 to {len(blocks)} (the model's "
                         f"blocks); got {layers!r}")
    if final_norm == "pretrained":
        raise ValueError(f"final_norm='pretrained' applies the learned final LayerNorm of block "
                         f"{len(blocks)}, not of block {layers}: use 'nonaffine_ln' or 'l2'")
    path = blocks[0].prefix.rpartition(".")[0]
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    kept = cast(nn.ModuleList, model.get_submodule(path))[:layers]
    setattr(parent, attr, nn.ModuleList(list(kept)))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "num_hidden_layers"):
        config.num_hidden_layers = layers
    return layers


def _has_module(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True
