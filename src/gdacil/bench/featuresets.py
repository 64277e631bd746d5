"""Real feature sets that gdacil builds offline, in three scalings, for the accuracy benchmarks.

A feature set is a dataset, a frozen pretrained backbone and a per-class sample budget. Its
features are extracted once with the backbone's shipped output (``final_norm="pretrained"``,
the "raw" scaling) and cached; the other two scalings follow from the raw features exactly:

- ``"raw"``: as the backbone returns them;
- ``"ln"``: a parameter-free LayerNorm per sample (zero mean, unit variance; the LR-RGDA paper's);
- ``"l2"``: unit Euclidean norm per sample (what sentence-transformers and CLIP return).

Every seed draws its own class order and its own split of each class's samples into train and
test (:func:`split`), so seeds differ in data as well as in task composition.

The benchmarks run :data:`DEFAULT_FEATURE_SETS` unless told otherwise: MiniLM on WordNet
hypernyms and supersenses, EfficientNet-Lite0 on openclipart and Fashion-MNIST, whose data
Debian packages ship. Six more come from public repositories: MiniLM on four intent and topic
sets (``banking77``, ``clinc150``, ``hwu64``, ``stackoverflow20``:
:mod:`gdacil.data.text_table`) and EfficientNet-Lite0 on Caltech-101's 101 object classes
(``caltech101``, an image folder without its background class) and on CIFAR-10 (``cifar10``, its
32-pixel images as files). ``bash scripts/feature_set_data.sh SOURCES OUT`` lays out their data
from checkouts of those repositories (the script names them); then ``GDACIL_DATA=OUT`` and
``--features banking77 ...`` take them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..backbones.base import normalize_features

__all__ = ["DEFAULT_FEATURE_SETS", "FEATURE_SETS", "SCALINGS", "FeatureSet", "load_features", "scale_features", "split"]

SCALINGS = ("raw", "ln", "l2")


@dataclass(frozen=True)
class FeatureSet:
    """A dataset seen through a frozen pretrained backbone."""

    dataset: str
    backbone: str
    per_class: int                 #: most samples taken from each class (train + test)
    test_fraction: float = 1 / 3
    dataset_options: dict = field(default_factory=dict)
    backbone_options: dict = field(default_factory=dict)
    batch_size: int = 64


FEATURE_SETS: dict[str, FeatureSet] = {
    "wordnet-hypernym": FeatureSet("wordnet-hypernym", "minilm", per_class=150,
                                   dataset_options={"n_classes": 100}),
    "wordnet-supersense": FeatureSet("wordnet-supersense", "minilm", per_class=240),
    "openclipart": FeatureSet("openclipart", "efficientnet-lite0", per_class=80,
                              test_fraction=0.3, backbone_options={"size": 160}),
    "fashion-mnist": FeatureSet("fashion-mnist", "efficientnet-lite0", per_class=360,
                                backbone_options={"size": 96}),
    # text tables: their data is converted from public repositories first
    # (scripts/text_tables.py, gdacil.data.text_table)
    "banking77": FeatureSet("banking77", "minilm", per_class=150),
    "clinc150": FeatureSet("clinc150", "minilm", per_class=100),
    "hwu64": FeatureSet("hwu64", "minilm", per_class=150),
    "stackoverflow20": FeatureSet("stackoverflow20", "minilm", per_class=500),
    # image folder of Caltech-101's 101 object classes (no background class)
    "caltech101": FeatureSet("caltech101", "efficientnet-lite0", per_class=40,
                             test_fraction=0.3, backbone_options={"size": 160}),
    # CIFAR-10's 32-pixel images as files in train/<class>/ and test/<class>/
    "cifar10": FeatureSet("cifar10", "efficientnet-lite0", per_class=400,
                          backbone_options={"size": 128}),
}

#: What the benchmarks run by default: the sets whose data installs offline (Debian packages)
DEFAULT_FEATURE_SETS = ("wordnet-hypernym", "wordnet-supersense", "openclipart", "fashion-mnist")


def scale_features(X: torch.Tensor, scaling: str) -> torch.Tensor:
    """``X`` in one of :data:`SCALINGS` (see the module docstring)."""
    if scaling == "raw":
        return X
    if scaling == "ln":
        return normalize_features(X, "nonaffine_ln", eps=1e-5)
    if scaling == "l2":
        return normalize_features(X, "l2")
    raise ValueError(f"unknown scaling {scaling!r}; known: {', '.join(SCALINGS)}")


def _pool(ds, per_class: int) -> tuple[list[str], np.ndarray]:
    """Up to ``per_class`` ids of every class (all splits pooled), drawn with a fixed seed."""
    id_list: list[str] = []
    label_list: list[int] = []
    for split in ds.splits:
        index = ds.index(split)
        id_list.extend(index.ids)
        label_list.extend(index.labels.tolist())
    ids, labels = np.asarray(id_list), np.asarray(label_list, dtype=np.int64)
    rng = np.random.default_rng(0)
    picked: list[np.intp] = []
    for c in range(len(ds.classes)):
        members = np.flatnonzero(labels == c)
        picked.extend(np.sort(rng.permutation(members)[:per_class]))
    keep = np.asarray(picked, dtype=np.int64)
    return ids[keep].tolist(), labels[keep]


def load_features(name: str, *, cache_dir: str = "~/.cache/gdacil/features",
                  progress: bool = False) -> tuple[torch.Tensor, np.ndarray]:
    """Raw features ``(n, d)`` (float32) and class labels ``(n,)`` of the feature set ``name``."""
    from ..backbones import build_backbone
    from ..data import FeatureCache, build_dataset

    if name not in FEATURE_SETS:
        raise ValueError(f"unknown feature set {name!r}; known: {', '.join(FEATURE_SETS)}")
    fs = FEATURE_SETS[name]
    ds = build_dataset(fs.dataset, **fs.dataset_options)
    ids, labels = _pool(ds, fs.per_class)
    backbone = build_backbone(fs.backbone, final_norm="pretrained", **fs.backbone_options)
    X = FeatureCache(cache_dir).get_or_compute(backbone, ids, ds.load, namespace=name,
                                               batch_size=fs.batch_size, progress=progress)
    return X.float(), labels


def split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test positions: each class's samples shuffled with ``seed`` and cut."""
    rng = np.random.default_rng([seed, 1])
    train: list[np.intp] = []
    test: list[np.intp] = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        n_test = max(1, round(test_fraction * len(members)))
        test.extend(members[:n_test])
        train.extend(members[n_test:])
    return np.sort(np.asarray(train)), np.sort(np.asarray(test))
