"""Full regularised Gaussian discriminant analysis (RGDA), and QDA as its special case."""

from __future__ import annotations

import torch

from .._validation import check_nonnegative
from ..linalg import logdet_from_cholesky, psd_cholesky
from .base import GaussianHead, stack_rows

__all__ = ["RGDA", "QDA", "regularized_covariances"]

PAPER_ALPHAS = (0.2, 2.0, 0.5)


def check_alphas(alpha1, alpha2, alpha3) -> tuple[float, float, float]:
    alphas = tuple(check_nonnegative(a, f"alpha{i}") for i, a in enumerate((alpha1, alpha2, alpha3), 1))
    if alphas[0] == 0.0 and alphas[1] == 0.0 and alphas[2] == 0.0:
        raise ValueError("alpha1, alpha2 and alpha3 are all zero: the covariance would be zero")
    return alphas


def regularized_covariances(covs, avg, alpha1, alpha2, alpha3) -> torch.Tensor:
    """``alpha1 Sigma_c + alpha2 Sigma_avg + alpha3 I`` for a block of covariances ``(k, d, d)``."""
    eye = torch.eye(avg.shape[0], dtype=avg.dtype, device=avg.device)
    return alpha1 * covs + (alpha2 * avg + alpha3 * eye)


class RGDA(GaussianHead):
    """Regularised GDA: per-class ``Sigma_c^reg = alpha1 Sigma_c + alpha2 Sigma_avg + alpha3 I``.

    Each regularised covariance is Cholesky-factored once, ``Sigma_c^reg = L_c L_c^T``, and the
    score is the exact log-posterior up to a class-independent constant::

        g_c(x) = -1/2 || L_c^{-1} (x - mu_c) ||^2 - sum log diag L_c + log pi_c

    Building costs ``O(C d^3)`` and scoring ``O(C d^2)`` per sample; :class:`LRRGDA` is the
    scalable form. Matrices that are not positive definite (e.g. QDA on a class with fewer samples
    than dimensions) get the smallest jitter that factors them and a ``NumericalWarning``.

    Parameters
    ----------
    alpha1, alpha2, alpha3 : float >= 0, default (0.2, 2.0, 0.5) (the paper's)
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import RGDA
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(300, 4, generator=g), torch.arange(300) % 3
    >>> X[y == 1] *= 3.0
    >>> RGDA().fit(ClassGaussians(4).update(X, y)).decision_function(X[:2]).shape
    torch.Size([2, 3])
    """

    def __init__(self, alpha1=PAPER_ALPHAS[0], alpha2=PAPER_ALPHAS[1], alpha3=PAPER_ALPHAS[2], *,
                 priors=None, device=None, dtype=torch.float64, class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.alpha3 = alpha3

    def _alphas(self) -> tuple[float, float, float]:
        return check_alphas(self.alpha1, self.alpha2, self.alpha3)

    def _check_params(self) -> None:
        super()._check_params()
        self._alphas()

    def _build(self, stats, log_priors):
        a1, a2, a3 = self._alphas()
        d = stats.dim
        avg = stats.average_covariance().to(self.device_) if a2 else torch.zeros(
            d, d, dtype=torch.float64, device=self.device_)
        eye = torch.eye(d, dtype=torch.float64, device=self.device_)
        quads, quad_biases, biases = [], [], []
        for _, _, mu, covs in stats.iter_batches(self._block_size(d + 1)):
            mu, covs = mu.to(self.device_), covs.to(self.device_)
            L = psd_cholesky(regularized_covariances(covs, avg, a1, a2, a3),
                             name="RGDA regularised class covariance")
            A = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
            quads.append(A)
            quad_biases.append(-(A @ mu[:, :, None])[:, :, 0])
            biases.append(-0.5 * logdet_from_cholesky(L))
        bias = torch.cat(biases) + log_priors.to(self.device_)
        zeros = torch.zeros(stats.n_classes, d, dtype=torch.float64, device=self.device_)
        return (*stack_rows(zeros, bias, torch.cat(quads), torch.cat(quad_biases)), -1.0)


class QDA(RGDA):
    """Quadratic discriminant analysis: RGDA with ``Sigma_c^reg = (1 - reg_param) Sigma_c + reg_param I``.

    With ``reg_param = 0`` this is plain QDA (``alpha1 = 1, alpha2 = alpha3 = 0``); the
    regularisation matches scikit-learn's ``QuadraticDiscriminantAnalysis(reg_param=...)``
    (scikit-learn >= 1.8 estimates class covariances with ``1/n``, i.e. statistics with
    ``ddof=0``; older releases used ``1/(n-1)``).

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import QDA
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(300, 3, generator=g), torch.arange(300) % 2
    >>> QDA(reg_param=0.1).fit(ClassGaussians(3).update(X, y)).predict(X[:3]).shape
    torch.Size([3])
    """

    def __init__(self, reg_param=0.0, *, priors=None, device=None, dtype=torch.float64,
                 class_batch_size="auto"):
        GaussianHead.__init__(self, priors=priors, device=device, dtype=dtype,
                              class_batch_size=class_batch_size)
        self.reg_param = reg_param

    def _alphas(self) -> tuple[float, float, float]:
        r = check_nonnegative(self.reg_param, "reg_param")
        if r > 1.0:
            raise ValueError(f"reg_param must lie in [0, 1]; got {self.reg_param!r}")
        return 1.0 - r, 0.0, r
