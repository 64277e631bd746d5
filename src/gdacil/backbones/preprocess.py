"""Input preprocessing for backbones: images (PIL/numpy/torch, no torchvision) and text.

An :class:`ImagePreprocess` turns a batch of raw images into a normalised float tensor
``(n, 3, size, size)``: convert to RGB (transparent images are composited on white, gray images
replicated), resize (bicubic by default, with PIL's antialiasing), centre-crop, scale to [0, 1]
and normalise with a named mean/std from :data:`NORMALIZATIONS`. It is the evaluation transform
of the LR-RGDA paper [LR-RGDA] ("Resize(256), CenterCrop(224)") when ``resize=256, size=224``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from .._optional import require

__all__ = ["INTERPOLATIONS", "NORMALIZATIONS", "ImagePreprocess", "to_rgb"]

#: Named (mean, std) pairs per RGB channel, in [0, 1] pixel units.
NORMALIZATIONS: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "half": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "cifar": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
}

#: Interpolation names and their PIL resampling filters' names.
INTERPOLATIONS = {"bicubic": "BICUBIC", "bilinear": "BILINEAR", "nearest": "NEAREST"}


def _pil():
    return require(
        "PIL.Image", feature="image preprocessing", install="pip install 'gdacil[vision]'"
    )


def _array_to_uint8(arr: np.ndarray) -> np.ndarray:
    """An image array as uint8, by the rules of :func:`to_rgb` (``ValueError`` otherwise)."""
    from ..data.images import float_to_uint8, uint16_to_uint8

    if arr.dtype == np.uint8:
        return arr
    if arr.dtype == np.bool_:
        return arr.astype(np.uint8) * np.uint8(255)
    if arr.dtype == np.uint16:
        return uint16_to_uint8(arr)
    if np.issubdtype(arr.dtype, np.integer):
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high > 255:
            raise ValueError(f"integer image arrays ({arr.dtype}) must lie in 0..255 (uint16: "
                             f"0..65535); got values from {low} to {high}")
        return arr.astype(np.uint8)
    if np.issubdtype(arr.dtype, np.floating):
        return float_to_uint8(arr)
    raise ValueError(f"image arrays must be uint8, uint16, another integer type, bool or float; "
                     f"got {arr.dtype}")


def to_rgb(raw, background: tuple[int, int, int] = (255, 255, 255)):
    """Return ``raw`` as an RGB ``PIL.Image``.

    Array values, by dtype (anything else raises ``ValueError`` saying what it found):

    - ``uint8``: ``0..255``, as they are;
    - ``uint16``: ``0..65535``, scaled to ``0..255`` (``round(v / 257)``);
    - other integer types: must lie in ``0..255`` (the message gives the min and max found);
    - ``bool``: ``False`` is 0 (black) and ``True`` 255 (white), as a 1-bit image;
    - floating point: must be finite and in ``[0, 1]``, scaled by 255 (float arrays in
      ``0..255`` are refused rather than clipped to white: divide by 255 or pass uint8).

    Images, arrays and tensors with a zero dimension are refused. PIL images in the 16-bit,
    32-bit (``I``, ``F``) and ``CMYK`` modes are converted as files are
    (:func:`gdacil.data.images.to_8bit`). Transparency (``RGBA``, ``LA``, ``PA``, palette or
    ``transparency`` info) is composited on ``background``; gray is replicated.

    Parameters
    ----------
    raw : PIL.Image.Image, numpy.ndarray, torch.Tensor, str or os.PathLike
        An image object, an array ``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` or ``(H, W, 4)``
        (numpy) or ``(C, H, W)`` (torch, the same rules), or the path of an image file (read
        with :func:`gdacil.data.images.open_image`, as datasets read files).
    background : tuple of int
        Colour that transparent pixels are composited on.
    """
    Image = _pil()
    if isinstance(raw, (str, os.PathLike)):
        from ..data.images import open_image

        raw = open_image(raw)
    elif isinstance(raw, torch.Tensor):
        t = raw.detach().cpu()
        if t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        arr = t.numpy()
        raw = np.moveaxis(arr, 0, -1) if arr.ndim == 3 else arr
    if isinstance(raw, np.ndarray):
        arr = raw
        if arr.ndim == 3 and arr.shape[-1] == 1:
            arr = arr[..., 0]
        if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (3, 4)):
            raise ValueError(
                f"image arrays must be (H, W), (H, W, 3) or (H, W, 4); got {arr.shape}"
            )
        if arr.size == 0:
            raise ValueError(f"the image array is empty (shape {arr.shape})")
        raw = Image.fromarray(np.ascontiguousarray(_array_to_uint8(arr)))
    if not isinstance(raw, Image.Image):
        raise TypeError(f"cannot read an image from {type(raw).__name__}")
    if raw.width == 0 or raw.height == 0:
        raise ValueError(f"the image has no pixel ({raw.width}x{raw.height})")
    if raw.mode == "RGB":
        return raw
    from ..data.images import to_8bit

    raw = to_8bit(raw)
    if raw.mode == "RGB":
        return raw
    if raw.mode == "P":
        raw = raw.convert("RGBA")
    if raw.mode in ("RGBA", "LA", "PA") or "transparency" in raw.info:
        rgba = raw.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, (*background, 255))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return raw.convert("RGB")


@dataclass(frozen=True)
class ImagePreprocess:
    """Deterministic (evaluation) image preprocessing.

    Parameters
    ----------
    size : int
        Output side length (square crop).
    resize : int or None
        Shorter side after resizing, before the centre crop. ``None`` resizes straight to
        ``size x size`` (aspect ratio not kept, like Hugging Face's ViT processor).
    interpolation : {"bicubic", "bilinear", "nearest"}
    normalization : str
        A key of :data:`NORMALIZATIONS`.
    """

    size: int = 224
    resize: int | None = 256
    interpolation: str = "bicubic"
    normalization: str = "imagenet"

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size must be a positive integer; got {self.size!r}")
        if self.resize is not None and (
            not isinstance(self.resize, int) or self.resize < self.size
        ):
            raise ValueError(
                f"resize must be None or an integer >= size ({self.size}); got {self.resize!r}"
            )
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"unknown interpolation {self.interpolation!r}; known: {', '.join(INTERPOLATIONS)}"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"unknown normalization {self.normalization!r}; "
                f"known: {', '.join(sorted(NORMALIZATIONS))}"
            )

    def scaled_to(self, size: int) -> ImagePreprocess:
        """The same recipe at another output size (``resize`` keeps its ratio to ``size``)."""
        resize = None if self.resize is None else max(size, round(self.resize * size / self.size))
        return replace(self, size=size, resize=resize)

    def to_dict(self) -> dict:
        """Serialisable description, with the resolved mean and std."""
        mean, std = NORMALIZATIONS[self.normalization]
        return {**asdict(self), "mean": list(mean), "std": list(std)}

    def image(self, raw) -> np.ndarray:
        """One raw image to a float32 array ``(3, size, size)``, normalised."""
        Image = _pil()
        img = to_rgb(raw)
        resample = getattr(Image.Resampling, INTERPOLATIONS[self.interpolation])
        if self.resize is None:
            img = img.resize((self.size, self.size), resample=resample)
        else:
            w, h = img.size
            scale = self.resize / min(w, h)
            nw, nh = max(self.size, round(w * scale)), max(self.size, round(h * scale))
            img = img.resize((nw, nh), resample=resample)
            left, top = (nw - self.size) // 2, (nh - self.size) // 2
            img = img.crop((left, top, left + self.size, top + self.size))
        mean, std = NORMALIZATIONS[self.normalization]
        arr: np.ndarray = np.asarray(img, dtype=np.float32) / 255.0
        arr = (arr - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        return np.ascontiguousarray(arr.transpose(2, 0, 1))

    def __call__(self, raws: Sequence) -> torch.Tensor:
        """A batch of raw images to a tensor ``(n, 3, size, size)``."""
        if len(raws) == 0:
            return torch.empty(0, 3, self.size, self.size)
        return torch.from_numpy(np.stack([self.image(r) for r in raws]))
