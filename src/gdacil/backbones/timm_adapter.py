"""Optional adapter for ``timm`` vision transformers (the reference code's backbones).

``timm`` is imported only when this backbone is built; without it the error names the install
line. As in the reference code, the classifier is dropped (``num_classes=0``) and, with
``final_norm="nonaffine_ln"``, the final ``norm`` becomes a parameter-free LayerNorm; the feature
is the CLS token after it.
"""

from __future__ import annotations

import torch

from .._optional import require
from .base import (
    ImageBackbone,
    check_final_norm,
    make_final_layernorm_nonaffine,
    normalize_features,
    portable_location,
)
from .preprocess import ImagePreprocess

__all__ = ["TimmBackbone"]


class TimmBackbone(ImageBackbone):
    """A ``timm`` model (e.g. ``"vit_base_patch16_224.augreg2_in21k_ft_in1k"``,
    ``"vit_base_patch16_224.dino"``, ``"vit_base_patch16_clip_224.openai"``).

    Parameters
    ----------
    model_name : str
        ``timm.create_model`` name.
    pretrained : bool
        Download (or read from timm's cache) the pretrained weights.
    checkpoint_path : str, optional
        A local state dict to load strictly (e.g. MoCo v3 weights), read with
        ``weights_only=True``.
    final_norm : {"nonaffine_ln", "pretrained", "l2"}
    preprocess : ImagePreprocess or dict, optional
        Default: the LR-RGDA paper's evaluation transform (resize 256, crop 224, ImageNet
        statistics).
    device, name
    """

    def __init__(
        self,
        model_name: str = "vit_base_patch16_224",
        *,
        pretrained: bool = True,
        checkpoint_path: str | None = None,
        final_norm: str = "nonaffine_ln",
        preprocess: ImagePreprocess | dict | None = None,
        device: torch.device | str | None = None,
        name: str = "timm",
    ):
        timm = require(
            "timm",
            feature=f"the {name!r} backbone",
            install="pip install timm (it needs a torchvision build that matches your torch)",
        )
        self.model_name = model_name
        self.pretrained = bool(pretrained)
        self.checkpoint_path = checkpoint_path
        self.final_norm = check_final_norm(final_norm)
        model = timm.create_model(model_name, pretrained=pretrained, num_classes=0)
        if checkpoint_path is not None:
            state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
            model.load_state_dict(state, strict=True)
        if final_norm == "nonaffine_ln":
            make_final_layernorm_nonaffine(model, "norm")
        model.eval()
        super().__init__(
            model,
            model.num_features,
            transform=preprocess or ImagePreprocess(),
            name=name,
            device=device,
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        f = self.model(inputs["pixel_values"])
        return normalize_features(f, self.final_norm, in_model=True)

    def architecture(self) -> dict:
        return {"model_name": self.model_name}

    def config(self) -> dict:
        return {
            **super().config(),
            "pretrained": self.pretrained,
            "checkpoint_path": portable_location(self.checkpoint_path),
        }
