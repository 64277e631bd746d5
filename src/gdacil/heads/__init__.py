"""Classifiers built from :class:`~gdacil.ClassGaussians`, and a registry of their names."""

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


def build_head(name: str, **params) -> GaussianHead:
    """Instantiate the head registered as ``name`` with ``params``."""
    try:
        cls = HEADS[name]
    except KeyError:
        raise ValueError(f"unknown head {name!r}; known heads: {', '.join(sorted(HEADS))}") from None
    return cls(**params)


__all__ = ["GaussianHead", "NotFittedError", "NCM", "LDA", "QDA", "RGDA", "LRRGDA", "SGDHead", "HEADS",
           "build_head", "FeCAM", "MappedLinearHead", "RanPAC", "ACIL", "RBFLDA", "STREAMING_HEADS"]
