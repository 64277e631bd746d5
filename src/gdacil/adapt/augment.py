"""Training-time image augmentation: random resized crop, horizontal flip and brightness jitter
(PIL, no torchvision), every draw from an explicit ``torch.Generator``. The defaults are the
reference code's training transform (``RandomResizedCrop``, ``RandomHorizontalFlip``,
``ColorJitter(brightness=63/255)``); the paper does not describe one.

The crop follows the usual ``RandomResizedCrop`` recipe: up to 10 tries of a box whose area is a
uniform fraction ``scale`` of the image and whose aspect ratio is log-uniform in ``ratio``; if no
try fits, the largest centred box with a clamped aspect ratio. Brightness is scaled by a factor
uniform in ``[max(0, 1 - brightness), 1 + brightness]``. The box is resized to the
backbone's input size with the backbone's interpolation and normalised like its evaluation
preprocessing (:class:`~gdacil.backbones.ImagePreprocess`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from .._validation import check_range
from ..backbones import ImagePreprocess, to_rgb
from ..backbones.preprocess import INTERPOLATIONS
from ..typed_config import TypedConfig

__all__ = ["AugmentConfig", "augment_images", "crop_box"]


@dataclass(frozen=True)
class AugmentConfig(TypedConfig):
    """Random resized crop, horizontal flip and brightness jitter.

    Parameters
    ----------
    scale : (float, float)
        Range of the crop's area as a fraction of the image's.
    ratio : (float, float)
        Range of the crop's aspect ratio (width / height), sampled log-uniformly.
    flip : float
        Probability of a horizontal flip.
    brightness : float
        Brightness jitter strength (0 = none).
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip: float = 0.5
    brightness: float = 63.0 / 255.0

    def __post_init__(self):
        for name in ("scale", "ratio"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                raise ValueError(f"augment {name} must be a pair (low, high); got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        lo, hi = self.scale
        check_range(lo, "augment scale[0]", low=0.0, high=1.0, low_open=True)
        check_range(hi, "augment scale[1]", low=lo, high=1.0)
        lo, hi = self.ratio
        check_range(lo, "augment ratio[0]", low=0.0, low_open=True)
        check_range(hi, "augment ratio[1]", low=lo)
        check_range(self.flip, "augment flip", high=1.0)
        check_range(self.brightness, "augment brightness")


def _uniform(generator: torch.Generator, low: float, high: float) -> float:
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return low + (high - low) * u


def crop_box(
    width: int, height: int, config: AugmentConfig, generator: torch.Generator
) -> tuple[int, int, int, int]:
    """A random crop ``(left, top, width, height)`` of a ``width x height`` image."""
    area = width * height
    log_lo, log_hi = math.log(config.ratio[0]), math.log(config.ratio[1])
    for _ in range(10):
        target = area * _uniform(generator, *config.scale)
        aspect = math.exp(_uniform(generator, log_lo, log_hi))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=generator))
            left = int(torch.randint(0, width - w + 1, (), generator=generator))
            return left, top, w, h
    aspect = width / height
    if aspect < config.ratio[0]:
        w, h = width, round(width / config.ratio[0])
    elif aspect > config.ratio[1]:
        w, h = round(height * config.ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def augment_images(
    raws: Sequence,
    transform: ImagePreprocess,
    config: AugmentConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """Augmented, normalised batch ``(n, 3, size, size)`` of raw images.

    Parameters
    ----------
    raws : sequence
        Anything :func:`~gdacil.backbones.to_rgb` reads (PIL images, arrays, paths).
    transform : ImagePreprocess
        The backbone's evaluation preprocessing: gives the output size, interpolation and
        normalisation.
    config : AugmentConfig
    generator : torch.Generator
        Source of every random draw.
    """
    from PIL import Image, ImageEnhance

    resample = getattr(Image.Resampling, INTERPOLATIONS[transform.interpolation])
    size = transform.size
    out = []
    for raw in raws:
        img = to_rgb(raw)
        left, top, w, h = crop_box(img.width, img.height, config, generator)
        img = img.resize((size, size), resample=resample, box=(left, top, left + w, top + h))
        if _uniform(generator, 0.0, 1.0) < config.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if config.brightness > 0:
            factor = _uniform(generator, max(0.0, 1.0 - config.brightness), 1.0 + config.brightness)
            img = ImageEnhance.Brightness(img).enhance(factor)
        out.append(img)
    # the images are already size x size: resize=None leaves them as they are and normalises
    return replace(transform, resize=None)(out)
