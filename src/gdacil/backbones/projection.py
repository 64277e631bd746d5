"""Random ReLU projection on top of a frozen backbone (RanPAC-style "RandProj").

``phi(x) = relu(f(x) W)`` with ``W`` a ``(d, M)`` matrix of independent standard normal entries
drawn from a ``torch.Generator`` seeded with ``seed``.
"""

from __future__ import annotations

import torch

from ..hashing import sha256_tensors
from .base import Backbone

__all__ = ["RandomProjection"]


class RandomProjection(Backbone):
    """Wrap ``base`` with a fixed random ReLU projection to ``dim`` features.

    Parameters
    ----------
    base : Backbone
        The feature extractor (its :attr:`model` and preprocessing are shared, not copied).
    dim : int
        Projection dimension ``M`` (RanPAC uses 10,000).
    seed : int
        Seed of the projection matrix.
    """

    def __init__(self, base: Backbone, dim: int = 10_000, *, seed: int = 0):
        if not isinstance(base, Backbone):
            raise TypeError(f"base must be a Backbone; got {type(base).__name__}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer; got {dim!r}")
        self.base = base
        self.seed = int(seed)
        gen = torch.Generator().manual_seed(self.seed)
        self.weight = torch.randn(base.dim, dim, generator=gen)
        self._weight_sha256 = sha256_tensors([("weight", self.weight)])  # fixed: hashed once
        self.modality = base.modality
        super().__init__(base.model, dim, name="random-projection", device=base.device)
        self.weight = self.weight.to(self.device)

    def to(self, device) -> RandomProjection:
        self.base.to(device)
        self.weight = self.weight.to(device)
        return super().to(device)

    def set_precision(self, precision: str) -> RandomProjection:
        self.base.set_precision(precision)  # strategies train the base
        return super().set_precision(precision)

    def preprocess(self, raw):
        return self.base.preprocess(raw)

    def extraction_order(self, raw):
        return self.base.extraction_order(raw)

    def forward(self, inputs):
        f = self.base.forward(inputs)
        return torch.relu(f @ self.weight.to(f.dtype))

    def extraction_config(self) -> dict:
        return {
            "class": type(self).__name__,
            "base": self.base.extraction_config(),
            "seed": self.seed,
            "weight_sha256": self._weight_sha256,
        }

    def config(self) -> dict:
        return {**super().config(), "base": self.base.config(), "seed": self.seed}

    def blocks(self):
        return self.base.blocks()
