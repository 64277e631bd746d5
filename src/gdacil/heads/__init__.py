"""Classifiers built from :class:`~gdacil.ClassGaussians`, and a registry of their names."""

from .base import GaussianHead, NotFittedError
from .lda import LDA
from .lowrank import LRRGDA
from .ncm import NCM
from .rgda import QDA, RGDA
from .sgd import SGDHead

HEADS: dict[str, type[GaussianHead]] = {
    "ncm": NCM,
    "lda": LDA,
    "qda": QDA,
    "rgda": RGDA,
    "lr_rgda": LRRGDA,
    "sgd": SGDHead,
}


def build_head(name: str, **params) -> GaussianHead:
    """Instantiate the head registered as ``name`` with ``params``."""
    try:
        cls = HEADS[name]
    except KeyError:
        raise ValueError(f"unknown head {name!r}; known heads: {', '.join(sorted(HEADS))}") from None
    return cls(**params)


__all__ = ["GaussianHead", "NotFittedError", "NCM", "LDA", "QDA", "RGDA", "LRRGDA", "SGDHead", "HEADS",
           "build_head"]
