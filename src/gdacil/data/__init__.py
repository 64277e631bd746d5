"""Datasets, class-incremental protocols, anchor sets and the feature cache.

Datasets are built by name from :data:`DATASETS`:

=======================  ======================================================================
name                     what (and how to get it)
=======================  ======================================================================
``fashion-mnist``        10 classes, official split (``apt-get install -y dataset-fashion-mnist``)
``wordnet-hypernym``     gloss texts, 100 hypernym classes (``apt-get install -y wordnet-base``)
``wordnet-supersense``   gloss texts, 40 lexicographer-file classes (same package)
``openclipart``          clip-art images, 43 folder classes (``apt-get install -y openclipart-png``)
``cifar100``             CIFAR-100 python files (download yourself; read without unsafe pickle)
``imagenet-r``           image folder (download yourself; see :mod:`gdacil.data.image_folder`);
                         so are ``cub200``, ``cars196``, ``caltech101``, ``cifar10`` (image
                         files), ``flowers102``, ``food101``
``image-folder``         any image folder (``root=`` required)
``banking77``            77 banking intents, official split (convert with
                         ``scripts/text_tables.py``; see :mod:`gdacil.data.text_table`); so are
                         ``clinc150`` (150 intents, split), ``hwu64`` (64 intents) and
                         ``stackoverflow20`` (20 question-title tags)
``text-table``           any labelled texts in ``train.tsv``/``test.tsv`` or ``all.tsv``
=======================  ======================================================================

>>> from gdacil.data import Protocol
>>> tasks = Protocol("fashion-mnist", seed=1993, initial=2, increment=2,
...                  train_cap=20, test_cap=10).build()
>>> len(tasks), tasks[0].classes, len(tasks[0].train), len(tasks[0].test)
(5, (0, 1), 40, 20)
>>> tasks.class_names[:2]
('fashion-mnist:Coat', 'fashion-mnist:Pullover')
"""

from __future__ import annotations

from functools import partial

from ..registry import Registry
from .anchors import ANCHOR_POOLS, ExternalAnchors, anchor_pool, draw_anchors
from .base import DataNotFoundError, Dataset, SampleIndex
from .cache import FeatureCache, extract_features
from .cifar import CIFAR100, read_cifar_pickle
from .fashion_mnist import FashionMNIST
from .image_folder import IMAGE_FOLDER_PRESETS, ImageFolder
from .openclipart import Openclipart
from .protocol import (
    ManifestMismatchError,
    Protocol,
    ProtocolConfig,
    Task,
    TaskSequence,
    split_id,
)
from .text_table import TEXT_TABLE_PRESETS, TextTable
from .wordnet import WordNetHypernyms, WordNetSupersenses, read_wordnet

__all__ = [
    "ANCHOR_POOLS",
    "CIFAR100",
    "CROSS_DOMAIN_DATASETS",
    "DATASETS",
    "IMAGE_FOLDER_PRESETS",
    "TEXT_TABLE_PRESETS",
    "DataNotFoundError",
    "Dataset",
    "ExternalAnchors",
    "FashionMNIST",
    "FeatureCache",
    "ImageFolder",
    "ManifestMismatchError",
    "Openclipart",
    "Protocol",
    "ProtocolConfig",
    "SampleIndex",
    "Task",
    "TaskSequence",
    "TextTable",
    "WordNetHypernyms",
    "WordNetSupersenses",
    "anchor_pool",
    "build_dataset",
    "draw_anchors",
    "extract_features",
    "read_cifar_pickle",
    "read_wordnet",
    "split_id",
]

#: The LR-RGDA paper's cross-domain benchmark, in its task order.
CROSS_DOMAIN_DATASETS = (
    "cifar100",
    "imagenet-r",
    "cars196",
    "cub200",
    "caltech101",
    "flowers102",
    "food101",
)

#: Dataset factories by name; ``build_dataset(name, **options)`` calls them.
DATASETS = Registry("dataset")
DATASETS.register("fashion-mnist", FashionMNIST)
DATASETS.register("wordnet-hypernym", WordNetHypernyms)
DATASETS.register("wordnet-supersense", WordNetSupersenses)
DATASETS.register("openclipart", Openclipart)
DATASETS.register("cifar100", CIFAR100)
DATASETS.register("image-folder", ImageFolder)
for _name in IMAGE_FOLDER_PRESETS:
    DATASETS.register(_name, partial(ImageFolder, name=_name))
DATASETS.register("text-table", TextTable)
for _name in TEXT_TABLE_PRESETS:
    DATASETS.register(_name, partial(TextTable, name=_name))


def build_dataset(name: str, /, **options) -> Dataset:
    """Build the dataset registered as ``name``; unknown names list the known ones."""
    return DATASETS.build(name, **options)
