"""SDC: semantic drift compensation of class means (Yu et al., CVPR 2020 [SDC]).

Each class mean moves by the Gaussian-kernel weighted average of the anchor drifts, weighted by
the old-space distance between the anchor and the class mean::

    w_i = exp(-||k_i - q_c||^2 / (2 sigma^2)),   mu_c <- mu_c + sum_i w_i d_i / sum_i w_i

Covariances are left unchanged. The weights are computed as a softmax over the logits (the
largest logit is subtracted first), so a class far from every anchor gets its nearest anchors'
drift instead of ``0 / 0``.

With ``normalize=True`` (the default, as SDC works with L2-normalised embeddings) ``k_i`` and
``q_c`` are the L2-normalised old anchor feature and class mean, and the weights are exactly a
softmax of cosine similarities with temperature ``sigma^2``: SDC is then HopDC applied to the class
mean only, with ``tau = sigma^2`` and no top-k.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from .._validation import check_positive_int
from .attention import retrieve
from .base import Compensator, check_positive_float, l2_normalize_rows, resolve_dtype

__all__ = ["SDC"]


@dataclasses.dataclass(eq=False, kw_only=True)
class SDC(Compensator):
    """Mean-only drift compensation with a Gaussian kernel over anchors (Yu et al. 2020).

    Parameters
    ----------
    sigma : float, default 0.3
        Kernel width (the SDC paper's value, for L2-normalised embeddings).
    normalize : bool, default True
        Measure distances between L2-normalised features. With ``False`` they are raw Euclidean
        distances, and ``sigma`` must be chosen on the features' scale.
    chunk_size : int, default 1024
        Class means per attention block.
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Precision of the kernel weights.

    References
    ----------
    [SDC] L. Yu, B. Twardowski, X. Liu, L. Herranz, K. Wang, Y. Cheng, S. Jui and J. van de
    Weijer. Semantic Drift Compensation for Class-Incremental Learning. IEEE/CVF Conference on
    Computer Vision and Pattern Recognition (CVPR), 2020.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.drift import SDC
    >>> g = torch.Generator().manual_seed(0)
    >>> old = torch.randn(200, 8, generator=g)
    >>> stats = ClassGaussians(8).update(torch.randn(60, 8, generator=g), torch.arange(60) % 3)
    >>> out = SDC().fit(old, old + 1.0).transform(stats)
    >>> torch.allclose(out.means, stats.means + 1.0), torch.equal(out.scatters, stats.scatters)
    (True, True)
    """

    _state_attributes = (*Compensator._state_attributes, "keys_", "key_bias_", "values_")
    name: ClassVar[str] = "sdc"

    sigma: float = 0.3
    normalize: bool = True
    chunk_size: int = 1024
    dtype: str | torch.dtype = "float64"

    @property
    def _normalized_sets(self) -> tuple[str, ...]:  # type: ignore[override]  # from self.normalize
        return ("old_features",) if self.normalize else ()

    def _check_params(self) -> None:
        check_positive_float(self.sigma, "sigma")
        check_positive_int(self.chunk_size, "chunk_size")
        resolve_dtype(self.dtype)

    def _fit(self, old, new) -> None:
        dtype = resolve_dtype(self.dtype)
        keys = l2_normalize_rows(old) if self.normalize else old
        self.keys_ = keys.to(dtype)
        # -||q - k||^2 / (2 s^2) = (q.k - ||k||^2 / 2) / s^2 - ||q||^2 / (2 s^2); the last term is
        # the same for every key, so it drops out of the softmax.
        self.key_bias_ = None if self.normalize else (-0.5 * keys.pow(2).sum(1)).to(dtype)
        self.values_ = (new - old).to(dtype)

    def drift_at(self, queries) -> torch.Tensor:
        """Kernel-weighted anchor drift at each query row (float64, ``(m, d)``)."""
        self._check_fitted()
        Q = torch.as_tensor(queries).to(device=self.keys_.device, dtype=self.keys_.dtype)
        if self.normalize:
            Q = l2_normalize_rows(Q)
        scale = 1.0 / self.sigma**2
        bias = None if self.key_bias_ is None else self.key_bias_ * scale
        return retrieve(Q, self.keys_, self.values_, scale=scale, key_bias=bias,
                        chunk_size=self.chunk_size).to(torch.float64)

    def _transform(self, stats, labels):
        means = stats.means[stats.positions(labels).to(stats.device)]
        shifted = means + self.drift_at(means).to(stats.device)
        return stats.copy().set_moments(labels, shifted)
