"""Openclipart: real clip-art images in category folders (public domain).

Debian ships them: ``apt-get install -y openclipart-png`` (131 MB, ``/usr/share/openclipart/png``).
A class is a folder holding at least ``min_images`` PNG files directly (not counting symbolic
links, which duplicate files of other folders); folders whose path contains a name in
``exclude`` (icon themes, abstract shapes, flags, unsorted, templates and playing cards, which are
styles rather than objects) are not classes, and neither are smaller folders: their images form
the unlabelled pool for anchors. With the defaults there are 43 classes and about 2,400 images.
There is no official split. A few files are huge (up to 623 megapixels, half a minute to decode):
files above ``max_pixels`` are left out (17 with the default), and the others are thumbnailed to
``max_side`` when loaded, with Pillow's decompression-bomb limit lifted for this trusted
collection only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .base import ListedDataset, SampleIndex, require_file
from .images import image_size, list_images, open_image

__all__ = ["Openclipart"]

DEFAULT_ROOT = Path("/usr/share/openclipart/png")
DEFAULT_EXCLUDE = ("icons", "shapes", "flags", "unsorted", "special", "cards")
_FIX = "Install it with: apt-get install -y openclipart-png (or pass root= its png directory)"


class Openclipart(ListedDataset):
    """Openclipart category folders as classes.

    Parameters
    ----------
    min_images : int
        Smallest folder that is a class.
    exclude : tuple of str
        Folder names that disqualify a path.
    max_side : int
        Loaded images are shrunk so that their longer side is at most this.
    max_pixels : int
        Files with more pixels than this (read from their header) are left out.
    root : str, optional
        The ``png`` directory (default ``/usr/share/openclipart/png``).
    """

    name = "openclipart"
    modality = "image"

    def __init__(
        self,
        min_images: int = 20,
        *,
        exclude: Sequence[str] = DEFAULT_EXCLUDE,
        max_side: int = 512,
        max_pixels: int = 20_000_000,
        root: str | os.PathLike | None = None,
    ):
        self.root = Path(root).expanduser() if root is not None else DEFAULT_ROOT
        self.min_images = int(min_images)
        self.exclude = tuple(exclude)
        self.max_side = int(max_side)
        self.max_pixels = int(max_pixels)
        require_file(self.root, "Openclipart", _FIX)
        classes: list[str] = []
        ids: list[str] = []
        labels: list[int] = []
        pool: list[str] = []
        for folder in sorted(p for p in self.root.rglob("*") if p.is_dir() and not p.is_symlink()):
            rel = folder.relative_to(self.root).as_posix()
            files = [
                f"{rel}/{n}"
                for n in list_images(folder, follow_links=False)
                if self._small_enough(folder / n)
            ]
            if set(rel.split("/")) & set(self.exclude) or len(files) < self.min_images:
                pool.extend(files)
                continue
            ids.extend(files)
            labels.extend([len(classes)] * len(files))
            classes.append(rel)
        top = [
            n
            for n in list_images(self.root, follow_links=False)
            if self._small_enough(self.root / n)
        ]
        self._set_listing(classes, SampleIndex(tuple(ids), labels), sorted(pool + top))

    def _small_enough(self, path: Path) -> bool:
        width, height = image_size(path)
        return width * height <= self.max_pixels

    def load(self, ids: Sequence[str]) -> list:
        return [
            open_image(self.root / sid, max_side=self.max_side, trusted_large=True) for sid in ids
        ]

    def content_hashes(self, ids: Sequence[str]) -> list[str]:
        """The sha256 of each PNG file, memoised by size and modification time."""
        return self.file_hashes(self.root, ids)

    def config(self) -> dict:
        return {
            "min_images": self.min_images,
            "exclude": list(self.exclude),
            "max_side": self.max_side,
            "max_pixels": self.max_pixels,
        }
