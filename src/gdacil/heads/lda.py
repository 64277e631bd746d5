"""Linear discriminant analysis with a shared, spherically shrunk covariance."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .._validation import check_nonnegative
from ..stats.linalg import psd_cholesky
from .base import GaussianHead, stack_rows

__all__ = ["LDA"]


class LDA(GaussianHead):
    """LDA on the unweighted average class covariance, in closed form.

    ``Sigma = (1 - shrinkage) Sigma_avg + shrinkage * t * I`` with ``t = tr(Sigma_avg) / d``
    (``shrinkage_target="scaled_identity"``, scikit-learn's ``shrinkage=float`` and gdacil's
    default: predictions do not depend on the features' units) or ``t = 1`` (the LR-RGDA paper's
    appendix, ``"identity"``, :meth:`paper`). Scores are
    ``w_c^T x + b_c`` with ``w_c = Sigma^{-1} mu_c`` and
    ``b_c = -1/2 mu_c^T Sigma^{-1} mu_c + log pi_c``: log-posteriors up to the per-sample
    constant ``-1/2 x^T Sigma^{-1} x``.

    Parameters
    ----------
    shrinkage : float in [0, 1], default 0.1
        The LR-RGDA paper's gamma (chosen by cross-validation from {0, 0.1, 0.2, 0.3}).
    shrinkage_target : {"scaled_identity", "identity"}, default "scaled_identity"
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    References
    ----------
    [Fisher] R. A. Fisher. The Use of Multiple Measurements in Taxonomic Problems. Annals of
    Eugenics 7(2):179-188, 1936.

    [LR-RGDA] X. Rao, M. Ha, B. Zhao, D. Liu and C. Alippi. Scalable Analytic Classifiers with
    Associative Drift Compensation for Class-Incremental Learning of Vision Transformers.
    arXiv:2602.00144, 2026 (the LDA baseline and its gamma).

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import LDA
    >>> g = torch.Generator().manual_seed(0)
    >>> X = torch.randn(200, 5, generator=g) + 3 * (torch.arange(200) % 2)[:, None]
    >>> head = LDA().fit(ClassGaussians(5).update(X, torch.arange(200) % 2))
    >>> head.score(X, torch.arange(200) % 2) > 0.9
    True
    """

    def __init__(self, shrinkage=0.1, *, shrinkage_target="scaled_identity", priors=None,
                 device=None, dtype="float64", class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.shrinkage = shrinkage
        self.shrinkage_target = shrinkage_target

    #: ``paper``: the LR-RGDA paper's gamma = 0.1 towards the (absolute) identity
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "paper": {"shrinkage": 0.1, "shrinkage_target": "identity"}}

    @classmethod
    def paper(cls, **params):
        """The LR-RGDA paper's setting (``from_preset("paper", **params)``)."""
        return cls.from_preset("paper", **params)

    def _check_params(self) -> None:
        super()._check_params()
        if not 0.0 <= check_nonnegative(self.shrinkage, "shrinkage") <= 1.0:
            raise ValueError(f"shrinkage must lie in [0, 1]; got {self.shrinkage!r}")
        if self.shrinkage_target not in ("identity", "scaled_identity"):
            raise ValueError("shrinkage_target must be 'identity' or 'scaled_identity'; "
                             f"got {self.shrinkage_target!r}")

    def shared_covariance(self, stats) -> torch.Tensor:
        """The shrunk shared covariance this head inverts."""
        avg = self._average_covariance(stats).to(self.device_)
        d = avg.shape[0]
        target = 1.0 if self.shrinkage_target == "identity" else float(avg.trace()) / d
        eye = torch.eye(d, dtype=avg.dtype, device=avg.device)
        return (1.0 - self.shrinkage) * avg + (self.shrinkage * target) * eye

    def _build(self, stats, log_priors):
        L = psd_cholesky(self.shared_covariance(stats), name="LDA shared covariance")
        mu = stats.means.to(self.device_)
        W = torch.cholesky_solve(mu.T, L).T
        b = -0.5 * (mu * W).sum(1) + log_priors.to(self.device_)
        return (*stack_rows(W, b), 1.0)
