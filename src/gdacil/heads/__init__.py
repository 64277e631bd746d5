"""Classifiers built from :class:`~gdacil.ClassGaussians` or fitted on features, and one registry
of their names (:func:`build_head` builds either kind)."""

from .base import GaussianHead, NotFittedError
from .fecam import FeCAM
from .lda import LDA
from .lowrank import LRRGDA
from .mapped import MappedLinearHead
from .ncm import NCM
from .rbf_lda import RBFLDA
from .rgda import QDA, RGDA
from .ridge import ACIL, RanPAC
from .sgd import SGDHead

HEADS: dict[str, type[GaussianHead]] = {
    "ncm": NCM,
    "lda": LDA,
    "qda": QDA,
    "rgda": RGDA,
    "lr_rgda": LRRGDA,
    "sgd": SGDHead,
    "fecam": FeCAM,
}

# Heads that learn from features, not from ClassGaussians: they map the features with a seeded
# random map and keep pooled statistics of the mapped features (partial_fit(X, y), merge, save).
STREAMING_HEADS: dict[str, type[MappedLinearHead]] = {
    "ranpac": RanPAC,
    "acil": ACIL,
    "rbf_lda": RBFLDA,
}

#: Every registered name, the heads built from statistics and the streaming ones
ALL_HEADS: dict[str, type] = {**HEADS, **STREAMING_HEADS}


def head_class(name: str) -> type:
    """The class registered as ``name`` in :data:`ALL_HEADS`."""
    cls = ALL_HEADS.get(name)
    if cls is None:
        raise ValueError(f"unknown head {name!r}; known heads: {', '.join(sorted(HEADS))}; "
                         f"streaming heads (fitted on features): {', '.join(sorted(STREAMING_HEADS))}")
    return cls


def build_head(name: str, **params) -> GaussianHead | MappedLinearHead:
    """Instantiate the head registered as ``name`` (either kind) with ``params``."""
    return head_class(name)(**params)


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
    "NotFittedError",
    "RanPAC",
    "SGDHead",
    "build_head",
    "head_class",
]
