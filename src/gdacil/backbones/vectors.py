"""The backbone of vectors: the identity of a fixed dimension.

A model for embeddings computed elsewhere (a hosted embedding API, a vector database, a nightly
Spark job) is a model whose backbone is :class:`VectorBackbone`: its inputs are its features. It
has what every backbone has (a record with ``modality`` ``"vector"`` and ``dim``, a weights
fingerprint, :meth:`extract`), so a model's versions, compatibility checks, rejection and
calibration work as for images and texts. Features stay float64 (the statistics are accumulated
in float64 anyway), so a vectors model scores exactly the numbers it was given.

>>> from gdacil.backbones import build_backbone
>>> bb = build_backbone("vectors", dim=3)
>>> bb.extract([[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]]).dtype
torch.float64
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .base import Backbone, PreparedInputs

__all__ = ["VectorBackbone"]


class VectorBackbone(Backbone):
    """Vectors of ``dim`` numbers in, the same vectors (float64) out.

    Parameters
    ----------
    dim : int
        The vectors' dimension (a :class:`~gdacil.learner.Learner` fixes it at its first learn).
    device : None, str or torch.device, default None
    """

    modality = "vector"

    def __init__(self, dim: int, *, device=None):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"a vectors backbone needs a dimension >= 1; got {dim!r}")
        super().__init__(nn.Identity(), dim, name="vectors", device=device)

    def preprocess(self, raw: Sequence) -> dict[str, torch.Tensor]:
        x = torch.from_numpy(np.array(raw, dtype=np.float64).reshape(len(raw), -1))
        if x.shape[1] != self.dim:
            raise ValueError(f"expected vectors of {self.dim} numbers; got {x.shape[1]}")
        return {"vectors": x}

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["vectors"]

    def extract_prepared(self, prepared: PreparedInputs, *, on_batch=None) -> torch.Tensor:
        """The vectors themselves, float64 (no forward pass rounds them to float32)."""
        parts = [b["vectors"].to(torch.float64) for b in prepared.batches]
        for part in parts:
            if on_batch is not None:
                on_batch(len(part))
        return torch.cat(parts) if parts else torch.empty(0, self.dim, dtype=torch.float64)

    def extraction_config(self) -> dict:
        return {"class": type(self).__name__}
