"""Reading image files into PIL images, and listing image files in sorted order."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, BinaryIO

from .._optional import require

__all__ = ["IMAGE_EXTENSIONS", "image_size", "list_images", "open_image"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")


def list_images(folder: Path, *, follow_links: bool = True) -> list[str]:
    """Names of the image files directly in ``folder``, sorted (never filesystem order).

    ``follow_links=False`` skips symbolic links (some collections link duplicates).
    """
    names = []
    with os.scandir(folder) as it:
        for entry in it:
            if not follow_links and entry.is_symlink():
                continue
            if entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS):
                names.append(entry.name)
    return sorted(names)


@contextlib.contextmanager
def _pixel_limit(max_pixels):
    Image: Any = require("PIL.Image", feature="image datasets", install="pip install pillow")
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        yield Image
    finally:
        Image.MAX_IMAGE_PIXELS = old


def open_image(
    path: str | os.PathLike | BinaryIO, *, max_side: int | None = None,
    trusted_large: bool = False
):
    """Open and decode an image file; optionally shrink it so its longer side is ``max_side``.

    Parameters
    ----------
    path : str or os.PathLike
    max_side : int, optional
        Thumbnail bound (keeps the aspect ratio; memory stays small for huge images).
    trusted_large : bool
        Lift Pillow's decompression-bomb limit while this file is opened (for trusted
        collections with very large images, such as openclipart). The limit is restored after.
    """
    Image = require("PIL.Image", feature="image datasets", install="pip install pillow")
    ctx = _pixel_limit(None) if trusted_large else contextlib.nullcontext(Image)
    with ctx as Image, Image.open(path) as im:
        if max_side is not None and max(im.size) > max_side:
            im.thumbnail((max_side, max_side), resample=Image.Resampling.BICUBIC)
        else:
            im.load()
        return im.copy()


def image_size(path: str | os.PathLike) -> tuple[int, int]:
    """``(width, height)`` of an image file, read from its header (nothing is decoded)."""
    with _pixel_limit(None) as Image, Image.open(path) as im:
        return im.size
