"""Training-time image augmentation: random resized crop, horizontal flip and brightness jitter
(PIL, no torchvision), every draw from an explicit ``torch.Generator``. The defaults are the
reference code's training transform (``RandomResizedCrop``, ``RandomHorizontalFlip``,
``ColorJitter(brightness=63/255)``); the LR-RGDA paper does not describe one.

The crop follows the usual ``RandomResizedCrop`` recipe: up to 10 tries of a box whose area is a
uniform fraction ``scale`` of the image and whose aspect ratio is log-uniform in ``ratio``; if no
try fits, the largest centred box with a clamped aspect ratio. Brightness is scaled by a factor
uniform in ``[max(0, 1 - brightness), 1 + brightness]``. The box is resized to the
backbone's input size with the backbone's interpolation and normalised like its evaluation
preprocessing (:class:`~gdacil.backbones.ImagePreprocess`).

The draws depend on nothing but the generator and the images' sizes (:func:`draw_augmentations`)
and applying them is deterministic (:func:`apply_augmentations`), so Stage-1 training draws them in
the main process and lets input-pipeline workers apply them, with the same result.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from .._validation import check_range
from ..backbones import ImagePreprocess, to_rgb
from ..backbones.preprocess import INTERPOLATIONS
from ..typed_config import TypedConfig

__all__ = [
    "AugmentConfig",
    "Augmentation",
    "apply_augmentations",
    "augment_images",
    "crop_box",
    "draw_augmentations",
    "image_size",
]


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


def image_size(raw) -> tuple[int, int]:
    """``(width, height)`` of ``to_rgb(raw)``, reading only the header of an image file."""
    from PIL import Image

    if isinstance(raw, (str, os.PathLike)):
        with Image.open(raw) as img:
            return img.size
    return raw.size if isinstance(raw, Image.Image) else to_rgb(raw).size


class Augmentation(NamedTuple):
    """The random draws of one image's augmentation: crop ``box`` ``(left, top, width,
    height)``, horizontal ``flip``, and ``brightness`` factor (``None``: no jitter)."""

    box: tuple[int, int, int, int]
    flip: bool
    brightness: float | None


def draw_augmentations(sizes: Sequence[tuple[int, int]], config: AugmentConfig,
                       generator: torch.Generator) -> list[Augmentation]:
    """The augmentations of images of ``sizes`` (``(width, height)`` each), drawn image by
    image from ``generator``: everything random in :func:`augment_images`."""
    out = []
    for width, height in sizes:
        box = crop_box(width, height, config, generator)
        flip = _uniform(generator, 0.0, 1.0) < config.flip
        factor = None
        if config.brightness > 0:
            factor = _uniform(generator, max(0.0, 1.0 - config.brightness), 1.0 + config.brightness)
        out.append(Augmentation(box, flip, factor))
    return out


def apply_augmentations(raws: Sequence, augmentations: Sequence[Augmentation],
                        transform: ImagePreprocess) -> torch.Tensor:
    """Normalised batch ``(n, 3, size, size)`` of ``raws`` under drawn ``augmentations`` (one
    per raw image); deterministic, so it may run in another process than the draws."""
    from PIL import Image, ImageEnhance

    resample = getattr(Image.Resampling, INTERPOLATIONS[transform.interpolation])
    size = transform.size
    out = []
    for raw, (box, flip, brightness) in zip(raws, augmentations, strict=True):
        left, top, w, h = box
        img = to_rgb(raw).resize((size, size), resample=resample,
                                 box=(left, top, left + w, top + h))
        if flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        if brightness is not None:
            img = ImageEnhance.Brightness(img).enhance(brightness)
        out.append(img)
    # the images are already size x size: resize=None leaves them as they are and normalises
    return replace(transform, resize=None)(out)


def augment_images(
    raws: Sequence,
    transform: ImagePreprocess,
    config: AugmentConfig,
    generator: torch.Generator,
) -> torch.Tensor:
    """Augmented, normalised batch ``(n, 3, size, size)`` of raw images: :func:`apply_augmentations`
    of :func:`draw_augmentations`.

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
    images = [to_rgb(raw) for raw in raws]
    draws = draw_augmentations([img.size for img in images], config, generator)
    return apply_augmentations(images, draws, transform)
