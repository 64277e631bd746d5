"""Small deterministic image files of every kind gdacil decodes specially (for the tests of the
shared input path: CLI, ``Learner.predict`` and the HTTP server must answer alike on them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

OPENCLIPART = Path("/usr/share/openclipart/png")


def _gradient(width: int, height: int) -> np.ndarray:
    """An asymmetric RGB gradient ``(height, width, 3)`` uint8 (rotations are visible)."""
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1),
                     (x + 2 * y) % 256], axis=-1).astype(np.uint8)


def partial_alpha_clipart(limit: int = 200_000) -> Path | None:
    """The first openclipart PNG (sorted paths) under ``limit`` bytes that is RGBA with partial
    transparency (an alpha strictly between 0 and 255); ``None`` without openclipart."""
    if not OPENCLIPART.is_dir():
        return None
    from PIL import Image

    for path in sorted(OPENCLIPART.rglob("*.png")):
        if path.stat().st_size > limit:
            continue
        with Image.open(path) as im:
            if im.mode != "RGBA":
                continue
            alpha = np.asarray(im.getchannel("A"))
        if ((alpha > 0) & (alpha < 255)).any():
            return path
    return None


def write_image_fixtures(folder) -> list[Path]:
    """Write the fixture images into ``folder`` (created if needed); returns their paths, sorted
    by name. Same bytes on every call (no randomness, no timestamps)."""
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rgb = _gradient(24, 16)
    out: list[Path] = []

    def save(image, name: str, **kwargs) -> None:
        path = folder / name
        image.save(path, **kwargs)
        out.append(path)

    alpha = np.tile(np.linspace(0, 255, 24).astype(np.uint8), (16, 1))  # 0 .. 255: partial
    save(Image.fromarray(np.concatenate([rgb, alpha[..., None]], axis=-1)), "rgba_partial.png")
    pal = Image.fromarray(rgb).quantize(colors=8, method=Image.Quantize.MEDIANCUT, dither=0)
    save(pal, "palette_transparency.png", transparency=0)
    gray = rgb[..., 0]
    save(Image.merge("LA", [Image.fromarray(gray), Image.fromarray(alpha)]), "gray_alpha.png")
    deep = np.full((16, 24), 32768, np.uint16)
    deep[:, :8] = 0
    deep[:, 16:] = 65535
    save(Image.fromarray(deep), "gray16.png")  # mode I;16
    cmyk = np.zeros((16, 24, 4), np.uint8)
    cmyk[:, :8, 0] = 255            # cyan
    cmyk[:, 8:16, 1] = 255          # magenta
    cmyk[:, 16:, 3] = 128           # half black
    save(Image.frombytes("CMYK", (24, 16), cmyk.tobytes()), "cmyk.jpg", quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    save(Image.fromarray(rgb), "exif_orientation6.jpg", quality=95, exif=exif.tobytes())
    save(Image.fromarray(gray), "gray.png")
    save(Image.fromarray(rgb), "rgb.jpg", quality=95)
    save(Image.fromarray(gray).convert("1", dither=Image.Dither.NONE), "bilevel.png")
    clipart = partial_alpha_clipart()
    if clipart is not None:
        target = folder / f"openclipart_{clipart.name}"
        shutil.copyfile(clipart, target)
        out.append(target)
    return sorted(out)
