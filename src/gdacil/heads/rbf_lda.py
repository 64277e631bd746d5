"""LDA on random Fourier features with one OAS-shrunk covariance (KLDA, RanDumb).

The RBF-LDA anchor head: KLDA [KLDA] and RanDumb [RanDumb] (see docs/references.md).

``z = sqrt(2/D) cos(x Omega + b)`` (:class:`~gdacil.stats.feature_maps.RandomFourier`) approximates
an RBF kernel; LDA in that space is a kernel classifier with closed-form, exactly incremental
statistics: class counts and means and one pooled within-class scatter
(:class:`~gdacil.stats.PooledGaussians`).
"""

from __future__ import annotations

from typing import cast

import torch

from .._validation import check_positive_int
from ..stats import PooledGaussians
from ..stats.feature_maps import RandomFourier
from ..stats.linalg import psd_cholesky
from .base import GaussianHead
from .mapped import DEFAULT_MAX_BYTES, MappedLinearHead

__all__ = ["RBFLDA", "oas_covariance"]


def oas_covariance(cov: torch.Tensor, n_samples: int) -> tuple[torch.Tensor, float]:
    """Oracle Approximating Shrinkage (Chen, Wiesel, Eldar and Hero 2010, eq. 23) of ``cov``.

    With ``p`` the dimension, ``m = tr(S) / p`` and ``a = mean(S_ij^2)`` (``= tr(S^2) / p^2``)::

        rho = min(1, (a + m^2) / ((n + 1) (a - m^2 / p)))
        OAS(S) = (1 - rho) S + rho m I

    (the form scikit-learn's ``OAS`` uses, with the eq.'s factor ``2/p`` dropped; ``rho = 1`` when
    the denominator is zero). Returns ``(shrunk, rho)``.

    Examples
    --------
    >>> import torch
    >>> from gdacil.heads.rbf_lda import oas_covariance
    >>> shrunk, rho = oas_covariance(torch.eye(3, dtype=torch.float64) * 2, 10)
    >>> rho, torch.equal(shrunk, 2 * torch.eye(3, dtype=torch.float64))
    (1.0, True)
    """
    cov = cov.to(torch.float64)
    p = cov.shape[0]
    m = float(cov.diagonal().sum()) / p
    a = float(cov.square().mean())
    den = (n_samples + 1) * (a - m * m / p)
    rho = 1.0 if den == 0 else min((a + m * m) / den, 1.0)
    shrunk = (1.0 - rho) * cov
    shrunk.diagonal().add_(rho * m)
    return shrunk, rho


class RBFLDA(MappedLinearHead):
    """Random Fourier features, then LDA with one shared, shrunk covariance.

    ``Sigma = shrink(S_w / N)``: the pooled within-class covariance (scikit-learn's LDA estimate
    with empirical class weights), shrunk by OAS (:func:`oas_covariance`, with ``n = N``) or by a
    fixed ``shrinkage`` towards ``tr(Sigma)/M I``. Scores are ``g_c = w_c^T z + b_c`` with
    ``w_c = Sigma^{-1} mu_c`` and ``b_c = -1/2 mu_c^T Sigma^{-1} mu_c + log pi_c``: the LDA
    log-posterior up to a per-sample constant, so ``predict_proba`` is the LDA posterior.
    With ``priors="empirical"`` this is scikit-learn's ``LinearDiscriminantAnalysis`` (solver
    "lsqr") given the same shrunk covariance.

    Parameters
    ----------
    dim_out : int, default 5000
        Number of random Fourier features ``D``.
    bandwidth : float > 0 or "auto", default "auto"
        RBF width; "auto" is the root-mean-square distance between the samples of the first
        batch (scale-equivariant, see :func:`~gdacil.stats.feature_maps.auto_bandwidth`). Heads
        fitted on shards merge only when their bandwidths are equal: pass a number for sharded
        fitting.
    shrinkage : "oas", float in [0, 1] or None, default "oas"
        None means no shrinkage.
    seed : int, default 0
    priors : None, "empirical", array or mapping, default None (uniform)
        As in :class:`~gdacil.heads.base.GaussianHead`.
    dtype, max_bytes, forgettable
        See :class:`~gdacil.heads.mapped.MappedLinearHead`. A forgettable RBF-LDA needs a
        numeric ``bandwidth``: "auto" sets the map from the first batch's samples, which may
        hold the class to forget.

    Attributes
    ----------
    shrinkage_ : float
        The shrinkage of the current solve.

    Notes
    -----
    Memory: ``8 D^2`` bytes of pooled scatter (0.2 GB at ``D = 5000``) whatever the number of
    classes, ``8 D C`` of means and as much of weights (0.04 GB each at 1k classes, 0.4 GB at
    10k), and ``16 D^2`` transiently per solve (``D^3 / 3`` flops).

    References
    ----------
    [KLDA] S. Momeni, S. Mazumder and B. Liu. Continual Learning Using a Kernel-Based Method Over
    Foundation Models. AAAI 2025. arXiv:2412.15571

    [RanDumb] A. Prabhu, S. Sinha, P. Kumaraguru, P. H. S. Torr, O. Sener and P. K. Dokania.
    Random Representations Outperform Online Continually Learned Representations. Advances in
    Neural Information Processing Systems (NeurIPS 2024). arXiv:2402.08823

    [RFF] A. Rahimi and B. Recht. Random Features for Large-Scale Kernel Machines. Advances in
    Neural Information Processing Systems 20 (NIPS 2007).

    [OAS] Y. Chen, A. Wiesel, Y. C. Eldar and A. O. Hero. Shrinkage Algorithms for MMSE
    Covariance Estimation. IEEE Transactions on Signal Processing 58(10):5016-5029, 2010.

    Examples
    --------
    >>> import torch
    >>> from gdacil.heads import RBFLDA
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.arange(300) % 3
    >>> X = torch.randn(300, 4, generator=g) + 3 * torch.nn.functional.one_hot(y, 4)
    >>> head = RBFLDA(dim_out=300).fit(X, y)
    >>> head.score(X, y) > 0.9, 0.0 <= head.shrinkage_ <= 1.0
    (True, True)
    """

    _FORMAT = "gdacil.RBFLDA/1"

    def __init__(self, dim_out=5000, bandwidth="auto", shrinkage="oas", *, seed=0, priors=None,
                 dtype="float64", max_bytes=DEFAULT_MAX_BYTES, forgettable=False):
        super().__init__(dtype=dtype, max_bytes=max_bytes, forgettable=forgettable)
        self.dim_out = dim_out
        self.bandwidth = bandwidth
        self.shrinkage = shrinkage
        self.seed = seed
        self.priors = priors

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.dim_out, "dim_out")
        s = self.shrinkage
        if s is not None and s != "oas" and not (isinstance(s, (int, float)) and 0.0 <= s <= 1.0):
            raise ValueError(f"shrinkage must be 'oas', a number in [0, 1] or None; got {s!r}")

    def _make_map(self, dim_in):
        return RandomFourier(dim_in, self.dim_out, self.bandwidth, self.seed)

    def _chosen_from_data(self):
        return "bandwidth" if self.bandwidth == "auto" else None

    def shared_covariance(self, stats: PooledGaussians) -> torch.Tensor:
        """The shrunk covariance this head inverts (sets ``shrinkage_``)."""
        cov = stats.pooled_covariance(ddof=0)
        if self.shrinkage == "oas":
            cov, self.shrinkage_ = oas_covariance(cov, stats.n_samples)
            return cov
        rho = float(self.shrinkage or 0.0)
        target = float(cov.diagonal().mean())
        cov = (1.0 - rho) * cov
        cov.diagonal().add_(rho * target)
        self.shrinkage_ = rho
        return cov

    def _solve(self, stats):
        L = psd_cholesky(self.shared_covariance(stats), name="RBF-LDA shared covariance")
        mu = stats.means
        W = torch.cholesky_solve(mu.T, L).T
        # the priors rule of every gdacil head (it reads only `priors` and the class counts)
        log_priors = GaussianHead._log_priors(cast(GaussianHead, self), stats)
        return W, -0.5 * (mu * W).sum(1) + log_priors

    def _state_bytes(self, dim, n_classes):
        # statistics; covariance and its Cholesky factor; weights
        return PooledGaussians.estimate_bytes(dim, n_classes) + 8 * (2 * dim * dim + dim * n_classes)

    def _fitted_state(self):
        return {"shrinkage_": getattr(self, "shrinkage_", None)}

    def _restore_state(self, state):
        if state.get("shrinkage_") is not None:
            self.shrinkage_ = float(state["shrinkage_"])
