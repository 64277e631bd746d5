"""Reading image files into PIL images, and listing image files in sorted order."""

from __future__ import annotations

import contextlib
import io
import os
import struct
import threading
import warnings
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .._optional import require

__all__ = ["DEEP_MODES", "IMAGE_EXTENSIONS", "ImageReadError", "ImageTooLargeError",
           "image_size", "list_images", "open_image", "to_8bit", "too_many_pixels"]

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


#: Pillow modes with more than 8 bits per channel, mapped to 8-bit gray by :func:`to_8bit`.
DEEP_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
#: EXIF orientation -> the ``Image.Transpose`` name that undoes it (as ``ImageOps.exif_transpose``).
_ORIENTATIONS = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
                 6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}


class ImageReadError(ValueError):
    """An image that cannot be read: the message names the input and the reason, on one line."""


class ImageTooLargeError(ImageReadError):
    """An image with more pixels than allowed (found from its header, before decoding)."""


def _pil():
    return require("PIL.Image", feature="image datasets", install="pip install pillow")


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def uint16_to_uint8(arr: np.ndarray) -> np.ndarray:
    """16-bit values ``0..65535`` scaled to 8-bit ``0..255`` (``round(v / 257)``)."""
    return np.rint(np.asarray(arr, dtype=np.float64) / 257.0).astype(np.uint8)


def float_to_uint8(arr: np.ndarray, what: str = "float image arrays") -> np.ndarray:
    """Finite floats in ``[0, 1]`` scaled to ``0..255`` (``round(v * 255)``); anything else is
    refused with a ``ValueError`` that says what was found."""
    arr = np.asarray(arr, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} must be finite; got NaN or infinite values")
    low, high = float(arr.min()), float(arr.max())
    if low < 0.0 or high > 1.0:
        hint = ": divide by 255 or pass uint8" if high > 1.0 and low >= 0.0 else ""
        got = f"values up to {high}" if high > 1.0 else f"values down to {low}"
        raise ValueError(f"{what} must lie in [0, 1]; got {got}{hint}")
    return np.rint(arr * 255.0).astype(np.uint8)


def to_8bit(im):
    """``im`` in an 8-bit mode: the 16-bit modes (``I;16*``) and ``I`` (taken as 16-bit,
    ``0..65535``, as Pillow reads 16-bit PNG/PGM/TIFF files) scaled to gray ``L``; ``F`` (floats,
    which must be finite and in ``[0, 1]``) scaled to ``L``; ``CMYK`` converted to ``RGB``. Other
    modes are returned as they are (palette, ``LA``, ``RGBA`` and ``PA`` keep their alpha).
    Pillow's own ``convert("L")`` clips these deep modes at 255 (white); this scales them.
    Raises ``ValueError`` for ``I`` values outside ``0..65535`` or bad ``F`` values."""
    Image = _pil()
    if im.mode == "CMYK":
        return im.convert("RGB")
    if im.mode not in DEEP_MODES:
        return im
    arr = np.asarray(im)
    if im.mode == "F":
        out = float_to_uint8(arr, "float (mode F) images")
    else:
        if im.mode == "I" and arr.size and (int(arr.min()) < 0 or int(arr.max()) > 65535):
            raise ValueError(f"32-bit integer (mode I) images are read as 16-bit and must lie in "
                             f"0..65535; got values from {int(arr.min())} to {int(arr.max())}")
        out = uint16_to_uint8(arr)
    result = Image.fromarray(out)  # a 2-D uint8 array: mode "L"
    result.info = dict(im.info)
    return result


_trusted_lock = threading.Lock()
_trusted_count = 0
_trusted_saved: list = []


@contextlib.contextmanager
def _trusted_reads():
    """Pillow's decompression-bomb limit lifted and its warnings silenced while trusted large
    files are read. Both are process-wide settings: the first trusted read in flight changes them
    and the last one restores them (so concurrent reads cannot leave them changed)."""
    global _trusted_count
    Image: Any = _pil()
    with _trusted_lock:
        if _trusted_count == 0:
            catcher = warnings.catch_warnings()
            catcher.__enter__()
            warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
            warnings.filterwarnings("ignore", module=r"PIL(\.|$)")
            _trusted_saved[:] = [Image.MAX_IMAGE_PIXELS, catcher]
            Image.MAX_IMAGE_PIXELS = None
        _trusted_count += 1
    try:
        yield
    finally:
        with _trusted_lock:
            _trusted_count -= 1
            if _trusted_count == 0:
                Image.MAX_IMAGE_PIXELS, catcher = _trusted_saved
                _trusted_saved.clear()
                catcher.__exit__(None, None, None)


def _describe(source, name: str | None) -> str:
    if name is not None:
        return _one_line(name)
    if isinstance(source, (str, os.PathLike)):
        return str(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "the image bytes"
    return str(getattr(source, "name", "the image stream"))


def _reason(exc: BaseException, Image) -> str:
    if isinstance(exc, Image.UnidentifiedImageError):
        return "not a format Pillow recognises"
    text = _one_line(exc) or type(exc).__name__
    if isinstance(exc, ValueError) and "decompressed data too large" in text.lower():
        return f"{text} (a compressed metadata chunk expands too far)"
    if isinstance(exc, (SyntaxError, struct.error)):
        return f"damaged or not an image ({text})"
    return text


def open_image(
    source: str | os.PathLike | bytes | BinaryIO, *, max_side: int | None = None,
    max_pixels: int | None = None, trusted_large: bool = False, name: str | None = None,
):
    """Open and decode an image; optionally shrink it so its longer side is ``max_side``.

    Ordinary 8-bit images (``RGB``, ``RGBA``, ``P``, ``L``, ``LA``, ``1``, ...) keep their mode
    (transparency included; :func:`gdacil.backbones.to_rgb` composites it on white later) and
    are thumbnailed in that mode, so their pixels are what earlier versions gave. In addition:

    - an EXIF orientation tag (2..8) is applied, as ``PIL.ImageOps.exif_transpose`` does;
    - 16-bit and 32-bit modes become 8-bit gray and CMYK becomes RGB (:func:`to_8bit`);
    - with ``max_pixels``, the pixel count is checked from the header, before decoding;
    - an image with no pixel is refused.

    Parameters
    ----------
    source : str, os.PathLike, bytes or binary file object
    max_side : int, optional
        Thumbnail bound (keeps the aspect ratio; memory stays small for huge images).
    max_pixels : int, optional
        Refuse images with more pixels (:class:`ImageTooLargeError`).
    trusted_large : bool
        Lift Pillow's decompression-bomb limit and silence Pillow's warnings while this file is
        read (for trusted collections with very large images, such as openclipart).
    name : str, optional
        What messages call the input (default: the path, or "the image bytes").

    Raises
    ------
    FileNotFoundError
        ``source`` is a path that does not exist.
    ImageReadError
        (a ``ValueError``) anything else that stops the image from being read: not an image, a
        truncated or damaged file, a decompression bomb, too many pixels, an empty image. The
        message names the input and the reason, on one line.
    """
    Image = _pil()
    label = _describe(source, name)
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = io.BytesIO(bytes(source))
    elif isinstance(source, (str, os.PathLike)) and not os.path.exists(source):
        raise FileNotFoundError(f"no such image file: {label}")
    ctx = _trusted_reads() if trusted_large else contextlib.nullcontext()
    try:
        with ctx, Image.open(source) as im:
            width, height = im.size
            if width * height == 0:
                raise ImageReadError(f"{label}: the image has no pixel ({width}x{height})")
            if max_pixels is not None and width * height > max_pixels:
                raise ImageTooLargeError(too_many_pixels(label, width, height, max_pixels))
            orientation = im.getexif().get(0x0112, 1)
            img = im
            if img.mode in DEEP_MODES:
                img.load()
                img = to_8bit(img)
            if max_side is not None and max(img.size) > max_side:
                img.thumbnail((max_side, max_side), resample=Image.Resampling.BICUBIC)
            else:
                img.load()
            img = to_8bit(img)  # CMYK (converted after the thumbnail: JPEG draft decoding)
            if orientation in _ORIENTATIONS:
                img = img.transpose(getattr(Image.Transpose, _ORIENTATIONS[orientation]))
            return img.copy() if img is im else img
    except ImageReadError:
        raise
    except FileNotFoundError:
        raise FileNotFoundError(f"no such image file: {label}") from None
    except (OSError, ValueError, SyntaxError, struct.error, Image.DecompressionBombError,
            MemoryError, EOFError, IndexError, TypeError, KeyError, ZeroDivisionError) as exc:
        raise ImageReadError(
            f"{label} is not an image file that can be read ({_reason(exc, Image)})") from None


def too_many_pixels(label: str, width: int, height: int, max_pixels: int) -> str:
    """The message of :class:`ImageTooLargeError`."""
    return (f"{label}: the image is {width}x{height} pixels; at most {max_pixels} pixels are "
            "accepted")


def image_size(path: str | os.PathLike) -> tuple[int, int]:
    """``(width, height)`` of an image file, read from its header (nothing is decoded)."""
    with _trusted_reads(), _pil().open(path) as im:
        return im.size
