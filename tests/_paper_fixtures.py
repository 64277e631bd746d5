"""Format-faithful miniatures of the paper's datasets, written by the tests into a temporary folder.

Each writer reproduces an on-disk layout that people actually have (the files as published, or
the reference code's ``train/<class>`` and ``test/<class>`` folders), with a few classes and a few
tiny images per class, so that :mod:`test_paper_configs` runs every shipped ``paper-*`` config
end to end through the same loaders a real run uses:

- CIFAR-100, "python version": ``cifar-100-python/{train,test,meta}``, pickled the way the
  published files were (Python 2 ``cPickle`` at protocol 2: every key and string a Python 2
  ``str``, labels Python ints, ``data`` a C-ordered ``uint8`` array ``(N, 3072)``, numpy's hooks
  under ``numpy.core.multiarray``), with the real class and superclass names;
- ImageNet-R as published (``imagenet-r/<wnid>/<style>_<k>.jpg``, no split) or as the
  reference code's split (``train/<wnid>/``, ``test/<wnid>/``);
- CUB-200-2011 as published (``CUB_200_2011/images/<NNN.Name>/...jpg`` with ``images.txt``,
  ``image_class_labels.txt``, ``train_test_split.txt``, ``classes.txt``) or as class folders;
- Stanford Cars as class folders (``train/<Make Model Year>/00001.jpg``: the by-class mirror
  most people download now that the original site is gone) or as published with its devkit
  (``cars_train/``, ``cars_test/``, ``devkit/*.mat``);
- Caltech-101 as published (``101_ObjectCategories/<class>/image_0001.jpg``, with
  ``BACKGROUND_Google``, no split);
- Oxford Flowers-102 as published (``jpg/image_00001.jpg`` with ``imagelabels.mat`` and
  ``setid.mat``, MATLAB v5 files written with ``scipy.io.savemat``);
- Food-101 as published (``food-101/images/<class>/<id>.jpg`` with ``meta/train.txt`` and
  ``meta/test.txt`` listing ``<class>/<id>`` without extension, and ``meta/classes.txt``).

Images are small JPEGs (PNG where noted) of varied sizes: a per-class tint plus noise.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image

# ---------------------------------------------------------------- CIFAR-100

#: CIFAR-100's superclasses and their fine classes, as published (Krizhevsky, 2009).
CIFAR100_SUPERCLASSES = {
    "aquatic_mammals": ["beaver", "dolphin", "otter", "seal", "whale"],
    "fish": ["aquarium_fish", "flatfish", "ray", "shark", "trout"],
    "flowers": ["orchid", "poppy", "rose", "sunflower", "tulip"],
    "food_containers": ["bottle", "bowl", "can", "cup", "plate"],
    "fruit_and_vegetables": ["apple", "mushroom", "orange", "pear", "sweet_pepper"],
    "household_electrical_devices": ["clock", "keyboard", "lamp", "telephone", "television"],
    "household_furniture": ["bed", "chair", "couch", "table", "wardrobe"],
    "insects": ["bee", "beetle", "butterfly", "caterpillar", "cockroach"],
    "large_carnivores": ["bear", "leopard", "lion", "tiger", "wolf"],
    "large_man-made_outdoor_things": ["bridge", "castle", "house", "road", "skyscraper"],
    "large_natural_outdoor_scenes": ["cloud", "forest", "mountain", "plain", "sea"],
    "large_omnivores_and_herbivores": ["camel", "cattle", "chimpanzee", "elephant", "kangaroo"],
    "medium_mammals": ["fox", "porcupine", "possum", "raccoon", "skunk"],
    "non-insect_invertebrates": ["crab", "lobster", "snail", "spider", "worm"],
    "people": ["baby", "boy", "girl", "man", "woman"],
    "reptiles": ["crocodile", "dinosaur", "lizard", "snake", "turtle"],
    "small_mammals": ["hamster", "mouse", "rabbit", "shrew", "squirrel"],
    "trees": ["maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"],
    "vehicles_1": ["bicycle", "bus", "motorcycle", "pickup_truck", "train"],
    "vehicles_2": ["lawn_mower", "rocket", "streetcar", "tank", "tractor"],
}
#: The 100 fine label names in label order (alphabetical, as in ``meta``).
CIFAR100_FINE = sorted(n for names in CIFAR100_SUPERCLASSES.values() for n in names)
CIFAR100_COARSE = sorted(CIFAR100_SUPERCLASSES)
_COARSE_OF = {n: CIFAR100_COARSE.index(s) for s, names in CIFAR100_SUPERCLASSES.items()
              for n in names}


class Python2Pickler(pickle._Pickler):
    """Writes protocol 2 as Python 2's ``cPickle`` wrote the CIFAR files: ``str`` and ``bytes``
    as Python 2 strings (``SHORT_BINSTRING``/``BINSTRING``, not Python 3's
    ``_codecs.encode`` calls), and numpy's hooks under their numpy 1 module ``numpy.core``."""

    dispatch: ClassVar[dict] = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        data = obj.encode("latin-1") if isinstance(obj, str) else bytes(obj)
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[str] = save_py2_str
    dispatch[bytes] = save_py2_str

    def save_global(self, obj, name=None):
        module = obj.__module__.replace("numpy._core.", "numpy.core.")
        self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode("ascii"))
        self.memoize(obj)


def python2_pickle(obj) -> bytes:
    import io

    buf = io.BytesIO()
    Python2Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _cifar_image(rng, tint) -> np.ndarray:
    """One 32x32 image as CIFAR stores it: 1024 red, then 1024 green, then 1024 blue bytes."""
    hwc = np.clip(tint + rng.normal(0, 30, (32, 32, 3)), 0, 255).astype(np.uint8)
    return hwc.transpose(2, 0, 1).reshape(3072)


def write_cifar100(root: Path, n_classes: int = 20, n_train: int = 2, n_test: int = 1,
                   seed: int = 0) -> Path:
    """``root/cifar-100-python/{train,test,meta}`` with the first ``n_classes`` fine classes;
    returns ``root`` (what ``protocol.dataset_options.cifar100.root`` takes)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    names = CIFAR100_FINE[:n_classes]
    tints = rng.uniform(0, 255, (n_classes, 3))
    for split, per_class, batch in (("train", n_train, "training batch 1 of 1"),
                                    ("test", n_test, "testing batch 1 of 1")):
        labels = [int(c) for c in rng.permutation(np.repeat(np.arange(n_classes), per_class))]
        record = {
            "filenames": [f"{names[c]}_s_{rng.integers(0, 10**6):06d}.png" for c in labels],
            "batch_label": batch,
            "fine_labels": labels,
            "coarse_labels": [_COARSE_OF[names[c]] for c in labels],
            "data": np.stack([_cifar_image(rng, tints[c]) for c in labels]),
        }
        (folder / split).write_bytes(python2_pickle(record))
    meta = {"fine_label_names": list(names), "coarse_label_names": list(CIFAR100_COARSE)}
    (folder / "meta").write_bytes(python2_pickle(meta))
    return root


# ---------------------------------------------------------------- images


def _save_image(path: Path, rng, tint, fmt: str = "JPEG") -> str:
    """A small image of random size (16 to 40 px a side) with a class tint; returns its name."""
    w, h = (int(v) for v in rng.integers(16, 41, 2))
    pixels = np.clip(tint + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return path.name


def _tints(rng, n: int) -> np.ndarray:
    return rng.uniform(0, 255, (n, 3))


def write_split_folders(root: Path, classes: list[str], n_train: int = 2, n_test: int = 1,
                        seed: int = 0, name=lambda c, k: f"{k:05d}.jpg") -> Path:
    """``root/train/<class>/`` and ``root/test/<class>/`` (the reference code's layout)."""
    rng = np.random.default_rng(seed)
    tints = _tints(rng, len(classes))
    k = 0
    for split, n in (("train", n_train), ("test", n_test)):
        for c, cls in enumerate(classes):
            for _ in range(n):
                k += 1
                _save_image(root / split / cls / name(cls, k), rng, tints[c])
    return root


def _write_flat(folder: Path, classes: list[str], per_class: int, seed: int, name) -> Path:
    """``folder/<class>/<name(k)>``, no split; returns ``folder``."""
    rng = np.random.default_rng(seed)
    tints = _tints(rng, len(classes))
    for c, cls in enumerate(classes):
        for k in range(per_class):
            _save_image(folder / cls / name(k), rng, tints[c])
    return folder


def imagenet_r_classes(n: int) -> list[str]:
    """WordNet ids in ImageNet-R's folder-name form (``n01443537``)."""
    return [f"n{1443537 + 104729 * k:08d}" for k in range(n)]


_STYLES = ("art", "cartoon", "deviantart", "embroidery", "graffiti", "origami", "painting",
           "sketch", "tattoo", "toy")


def write_imagenet_r(root: Path, n_classes: int = 4, per_class: int = 4, seed: int = 0) -> Path:
    """``root/imagenet-r/<wnid>/<style>_<k>.jpg`` as ``imagenet-r.tar`` unpacks (no split);
    returns the folder to pass as root."""
    return _write_flat(root / "imagenet-r", imagenet_r_classes(n_classes), per_class, seed,
                       lambda k: f"{_STYLES[k % len(_STYLES)]}_{k}.jpg")


def cub_classes(n: int) -> list[str]:
    first = ["Black_footed_Albatross", "Laysan_Albatross", "Sooty_Albatross",
             "Groove_billed_Ani", "Crested_Auklet", "Least_Auklet"]
    return [f"{k + 1:03d}.{first[k] if k < len(first) else f'Bird_{k + 1}'}" for k in range(n)]


def write_cub200(root: Path, n_classes: int = 4, n_train: int = 2, n_test: int = 1,
                 seed: int = 0) -> Path:
    """``root/CUB_200_2011/`` as ``CUB_200_2011.tgz`` unpacks: ``images/<NNN.Name>/<Name>_<k>.jpg``
    and the index files (``images.txt``, ``image_class_labels.txt``, ``train_test_split.txt``
    and ``classes.txt``, 1-based ids). Returns the ``CUB_200_2011`` folder."""
    rng = np.random.default_rng(seed)
    folder = root / "CUB_200_2011"
    classes = cub_classes(n_classes)
    tints = _tints(rng, n_classes)
    images, labels, split = [], [], []
    for c, cls in enumerate(classes):
        stem = cls.split(".", 1)[1].title()
        flags = [1] * n_train + [0] * n_test
        for f in rng.permutation(flags):
            image_id = len(images) + 1
            name = f"{stem}_{image_id:04d}_{rng.integers(1, 800000)}.jpg"
            _save_image(folder / "images" / cls / name, rng, tints[c])
            images.append(f"{image_id} {cls}/{name}")
            labels.append(f"{image_id} {c + 1}")
            split.append(f"{image_id} {int(f)}")
    for fname, lines in (("images.txt", images), ("image_class_labels.txt", labels),
                         ("train_test_split.txt", split),
                         ("classes.txt", [f"{c + 1} {cls}" for c, cls in enumerate(classes)])):
        (folder / fname).write_text("\n".join(lines) + "\n")
    (folder / "README").write_text("CUB-200-2011 miniature\n")
    (folder / "parts").mkdir()
    (folder / "attributes").mkdir()
    return folder


def cars_classes(n: int, *, devkit: bool = False) -> list[str]:
    """Stanford Cars class names; one has a slash in the devkit (``Ram C/V``), which the by-class
    folder mirror writes ``Ram C-V``."""
    first = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012",
             "Ram C/V Cargo Van Minivan 2012", "Acura TSX Sedan 2012", "Acura Integra Type R 2001"]
    names = [first[k] if k < len(first) else f"Make{k} Model {k} Coupe 20{k % 13:02d}"
             for k in range(n)]
    return names if devkit else [c.replace("/", "-") for c in names]


def write_cars196_devkit(root: Path, n_classes: int = 4, n_train: int = 2, n_test: int = 1,
                         seed: int = 0) -> Path:
    """Stanford Cars as published: ``cars_train/00001.jpg``, ``cars_test/00001.jpg``,
    ``devkit/cars_meta.mat`` (``class_names``), ``devkit/cars_train_annos.mat`` and
    ``cars_test_annos_withlabels.mat`` (struct arrays ``annotations`` with ``bbox_x1`` ..
    ``bbox_y2``, ``class`` (1-based) and ``fname``). Returns ``root``."""
    import scipy.io

    rng = np.random.default_rng(seed)
    tints = _tints(rng, n_classes)
    fields = [(k, "O") for k in ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")]
    for split, per_class, mat in (("train", n_train, root / "devkit" / "cars_train_annos.mat"),
                                  ("test", n_test, root / "cars_test_annos_withlabels.mat")):
        labels = rng.permutation(np.repeat(np.arange(n_classes), per_class))
        annos = np.zeros((1, len(labels)), dtype=fields)
        for i, c in enumerate(labels):
            fname = f"{i + 1:05d}.jpg"
            _save_image(root / f"cars_{split}" / fname, rng, tints[c])
            box = [np.array([[v]], np.uint16) for v in (1, 1, 15, 15)]
            annos[0, i] = (*box, np.array([[c + 1]], np.uint8), np.array([fname]))
        mat.parent.mkdir(parents=True, exist_ok=True)
        scipy.io.savemat(mat, {"annotations": annos})
    names = np.empty((1, n_classes), dtype=object)
    names[0, :] = cars_classes(n_classes, devkit=True)
    scipy.io.savemat(root / "devkit" / "cars_meta.mat", {"class_names": names})
    return root


def caltech101_classes(n: int) -> list[str]:
    """The first of Caltech-101's folder names, ``BACKGROUND_Google`` among them."""
    first = ["BACKGROUND_Google", "Faces", "Faces_easy", "Leopards", "Motorbikes", "accordion",
             "airplanes", "anchor", "ant", "barrel"]
    return first[:n] + [f"category_{k}" for k in range(len(first), n)]


def write_caltech101(root: Path, n_classes: int = 4, per_class: int = 4, seed: int = 0) -> Path:
    """``root/101_ObjectCategories/<class>/image_0001.jpg`` (no split); returns that folder."""
    return _write_flat(root / "101_ObjectCategories", caltech101_classes(n_classes), per_class,
                       seed, lambda k: f"image_{k + 1:04d}.jpg")


def write_flowers102(root: Path, n_classes: int = 4, n_train: int = 1, n_val: int = 1,
                     n_test: int = 1, seed: int = 0) -> Path:
    """``root/jpg/image_00001.jpg`` with ``imagelabels.mat`` (``labels``: 1-based class of every
    image, 1 x N) and ``setid.mat`` (``trnid``, ``valid``, ``tstid``: 1-based image ids), as
    published. Returns ``root``."""
    import scipy.io

    rng = np.random.default_rng(seed)
    tints = _tints(rng, n_classes)
    per_class = n_train + n_val + n_test
    labels = rng.permutation(np.repeat(np.arange(1, n_classes + 1), per_class))
    sets: dict[str, list[int]] = {"trnid": [], "valid": [], "tstid": []}
    seen = dict.fromkeys(range(1, n_classes + 1), 0)
    for i, label in enumerate(labels, 1):
        _save_image(root / "jpg" / f"image_{i:05d}.jpg", rng, tints[label - 1])
        k = seen[label]
        seen[label] += 1
        sets["trnid" if k < n_train else "valid" if k < n_train + n_val else "tstid"].append(i)
    scipy.io.savemat(root / "imagelabels.mat", {"labels": labels.reshape(1, -1).astype(np.uint8)})
    scipy.io.savemat(root / "setid.mat",
                     {k: np.asarray(v, np.uint16).reshape(1, -1) for k, v in sets.items()})
    return root


def food101_classes(n: int) -> list[str]:
    first = ["apple_pie", "baby_back_ribs", "baklava", "beef_carpaccio", "beef_tartare",
             "beet_salad", "beignets", "bibimbap"]
    return first[:n] + [f"dish_{k}" for k in range(len(first), n)]


def write_food101(root: Path, n_classes: int = 4, n_train: int = 2, n_test: int = 1,
                  seed: int = 0) -> Path:
    """``root/food-101/`` as ``food-101.tar.gz`` unpacks: ``images/<class>/<id>.jpg`` and
    ``meta/{train,test,classes,labels}.txt`` (``<class>/<id>``, no extension). Returns the
    ``food-101`` folder."""
    rng = np.random.default_rng(seed)
    folder = root / "food-101"
    classes = food101_classes(n_classes)
    tints = _tints(rng, n_classes)
    lists: dict[str, list[str]] = {"train": [], "test": []}
    for c, cls in enumerate(classes):
        ids = rng.choice(4_000_000, n_train + n_test, replace=False)
        for k, image_id in enumerate(ids):
            _save_image(folder / "images" / cls / f"{image_id}.jpg", rng, tints[c])
            lists["train" if k < n_train else "test"].append(f"{cls}/{image_id}")
    (folder / "meta").mkdir()
    for split, lines in lists.items():
        (folder / "meta" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    (folder / "meta" / "classes.txt").write_text("\n".join(classes) + "\n")
    (folder / "meta" / "labels.txt").write_text(
        "\n".join(c.replace("_", " ").capitalize() for c in classes) + "\n")
    (folder / "README.txt").write_text("Food-101 miniature\n")
    return folder
