"""Classifiers built from :class:`~gdacil.ClassGaussians` or fitted on features, and one registry
of their names (:func:`build_head` builds either kind)."""

from typing import cast

from ..registry import Registry, RegistryUnion
from .base import GaussianHead, ModelTerms, NotFittedError
from .fecam import FeCAM
from .lda import LDA
from .lowrank import LRRGDA
from .mapped import MappedLinearHead
from .ncm import NCM
from .rbf_lda import RBFLDA
from .rgda import QDA, RGDA
from .ridge import ACIL, RanPAC
from .sgd import SGDHead
from .sharded import ShardedHead

#: Heads built from class statistics (``fit(stats)``), so a drift compensator can move them
HEADS = Registry("head", {
    "ncm": NCM,
    "lda": LDA,
    "qda": QDA,
    "rgda": RGDA,
    "lr_rgda": LRRGDA,
    "sgd": SGDHead,
    "fecam": FeCAM,
})

#: Heads that learn from features, not from ClassGaussians: they map the features with a seeded
#: random map and keep pooled statistics of the mapped features (partial_fit(X, y), merge, save)
STREAMING_HEADS = Registry("streaming head", {
    "ranpac": RanPAC,
    "acil": ACIL,
    "rbf_lda": RBFLDA,
})

#: Every head name, either kind: what configs, ``gdacil list heads`` and :func:`build_head` use
ALL_HEADS = RegistryUnion("head", HEADS, STREAMING_HEADS)


def head_class(name: str) -> type[GaussianHead | MappedLinearHead]:
    """The class registered as ``name`` in :data:`ALL_HEADS` (``UnknownNameError`` otherwise)."""
    return cast("type[GaussianHead | MappedLinearHead]", ALL_HEADS[name])  # classes registered


def build_head(name: str, /, *, defaults: str | None = None,
               **params) -> GaussianHead | MappedLinearHead:
    """Instantiate the head registered as ``name`` (either kind) with ``params``, starting from
    its preset ``defaults`` (``cls.from_preset``, :mod:`gdacil._presets`; None: the
    constructor's defaults)."""
    if defaults is None:
        return ALL_HEADS.build(name, **params)
    cls = head_class(name)
    if defaults not in getattr(cls, "presets", {}):
        known = ", ".join(map(repr, getattr(cls, "presets", {}))) or "none"
        raise ValueError(f"head {name!r} has no preset {defaults!r} (its presets: {known})")
    return cls.from_preset(defaults, **params)


__all__ = [
    "ACIL",
    "ALL_HEADS",
    "HEADS",
    "LDA",
    "LRRGDA",
    "NCM",
    "QDA",
    "RBFLDA",
    "RGDA",
    "STREAMING_HEADS",
    "FeCAM",
    "GaussianHead",
    "MappedLinearHead",
    "ModelTerms",
    "NotFittedError",
    "RanPAC",
    "SGDHead",
    "ShardedHead",
    "build_head",
    "head_class",
]
