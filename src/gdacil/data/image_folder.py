"""Image-folder datasets (ImageNet-R, CUB-200, Cars-196, Caltech-101, Flowers-102, Food-101, or
your own), read from one of three on-disk layouts under ``root``:

1. ``train/<class>/<image>`` and ``test/<class>/<image>``: the official split (the layout the
   reference code and PILOT use);
2. ``<class>/<image>`` plus split files ``train.txt`` and ``test.txt``, one image path relative to
   ``root`` per line (``#`` starts a comment); the class is the first path component;
3. ``<class>/<image>`` alone: no official split (a protocol then splits each class with its seed).

Class folders and files are listed in sorted order, never in filesystem order. Sample ids are
paths relative to ``root``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from .base import DataNotFoundError, Dataset, SampleIndex, data_root
from .images import list_images, open_image

__all__ = ["IMAGE_FOLDER_PRESETS", "ImageFolder"]

_LAYOUTS = (
    "Expected under the root either train/<class>/<image> and test/<class>/<image>, or "
    "<class>/<image> with optional split files train.txt and test.txt (one relative "
    "image path per line)."
)

#: Known datasets: expected class counts and where the data comes from.
IMAGE_FOLDER_PRESETS: dict[str, dict] = {
    "imagenet-r": {
        "classes": (200,),
        "source": "ImageNet-R (Hendrycks et al., 2021), imagenet-r.tar",
    },
    "cub200": {"classes": (200,), "source": "CUB-200-2011 (Wah et al., 2011)"},
    "cars196": {"classes": (196,), "source": "Stanford Cars (Krause et al., 2013)"},
    "caltech101": {"classes": (101, 102), "source": "Caltech-101 (Fei-Fei et al., 2004)"},
    "flowers102": {
        "classes": (102,),
        "source": "Oxford Flowers-102 (Nilsback and Zisserman, 2008)",
    },
    "food101": {"classes": (101,), "source": "Food-101 (Bossard et al., 2014)"},
}


def _class_dirs(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _read_split_file(path: Path, root: Path) -> list[str]:
    ids = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        rel = Path(line).as_posix()
        if rel.startswith("/") or ".." in rel.split("/") or "/" not in rel:
            raise ValueError(f"{path}:{n}: expected a relative path <class>/<image>; got {line!r}")
        if not (root / rel).is_file():
            raise DataNotFoundError(f"{path}:{n} lists {rel}, which is not a file under {root}")
        ids.append(rel)
    return sorted(ids)


class ImageFolder(Dataset):
    """Images in class folders, with an optional official split (see the module docstring).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Dataset directory; default ``$GDACIL_DATA/<name>`` or ``~/.cache/gdacil/data/<name>``.
    name : str
        Dataset name; one of :data:`IMAGE_FOLDER_PRESETS` checks the class count and improves
        the error message when the data is missing.
    max_side : int, optional
        Shrink loaded images so that their longer side is at most this.
    """

    modality = "image"

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        *,
        name: str = "image-folder",
        max_side: int | None = None,
    ):
        if root is None and name not in IMAGE_FOLDER_PRESETS:
            raise ValueError("image-folder needs root=")
        self.name = name
        self.root = data_root(name, root)
        self.max_side = max_side
        preset = IMAGE_FOLDER_PRESETS.get(name, {})
        if not self.root.is_dir():
            what = preset.get("source", f"the {name!r} images")
            raise DataNotFoundError(
                f"{name} not found: {self.root} is not a directory. Download "
                f"{what} and arrange it there (or pass root=). {_LAYOUTS}"
            )
        self._indices = self._scan()
        all_ids = [i for idx in self._indices.values() for i in idx.ids]
        if not all_ids:
            raise DataNotFoundError(f"no images found under {self.root}. {_LAYOUTS}")
        counts = preset.get("classes")
        if counts and len(self._classes) not in counts:
            warnings.warn(
                f"{name}: found {len(self._classes)} classes under {self.root}, "
                f"expected {' or '.join(map(str, counts))}",
                stacklevel=2,
            )

    def _scan(self) -> dict[str, SampleIndex]:
        root = self.root
        if (root / "train").is_dir() and (root / "test").is_dir():
            self.splits = ("train", "test")
            per_split = {
                s: {
                    c: [f"{s}/{c}/{f}" for f in list_images(root / s / c)]
                    for c in _class_dirs(root / s)
                }
                for s in self.splits
            }
            self._classes = tuple(sorted(set().union(*(d.keys() for d in per_split.values()))))
            pos = {c: i for i, c in enumerate(self._classes)}
            return {
                s: SampleIndex(tuple(i for c in d for i in d[c]), [pos[c] for c in d for _ in d[c]])
                for s, d in per_split.items()
            }
        self._classes = tuple(_class_dirs(root))
        pos = {c: i for i, c in enumerate(self._classes)}
        files = {(root / "train.txt").is_file(), (root / "test.txt").is_file()}
        if files == {True}:
            self.splits = ("train", "test")
            lists = {s: _read_split_file(root / f"{s}.txt", root) for s in self.splits}
            overlap = set(lists["train"]) & set(lists["test"])
            if overlap:
                raise ValueError(
                    f"{root}: train.txt and test.txt share {len(overlap)} images, "
                    f"e.g. {min(overlap)}"
                )
        elif files == {True, False}:
            raise DataNotFoundError(f"{root} has only one of train.txt and test.txt")
        else:
            self.splits = ("all",)
            lists = {"all": [f"{c}/{f}" for c in self._classes for f in list_images(root / c)]}
        out = {}
        for s, ids in lists.items():
            unknown = sorted({i.split("/", 1)[0] for i in ids} - set(pos))
            if unknown:
                raise ValueError(f"{root}/{s}.txt names unknown classes: {unknown[:5]}")
            out[s] = SampleIndex(tuple(ids), [pos[i.split("/", 1)[0]] for i in ids])
        return out

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def index(self, split: str) -> SampleIndex:
        return self._indices[self.check_split(split)]

    def load(self, ids: Sequence[str]) -> list:
        return [open_image(self.root / sid, max_side=self.max_side) for sid in ids]

    def config(self) -> dict:
        return {"layout": "/".join(self.splits)}
