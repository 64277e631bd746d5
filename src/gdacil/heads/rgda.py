"""Full regularised Gaussian discriminant analysis (RGDA), and QDA as its special case.

RGDA is the full-rank classifier of the LR-RGDA paper [LR-RGDA] (see docs/references.md), whose
covariance belongs to the family of Friedman's regularized discriminant analysis [RDA].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch

from .._validation import check_nonnegative
from ..novelty import DEFAULT_SCORE, DISTANCE_DEFAULT
from ..stats.linalg import logdet_from_cholesky, psd_cholesky
from .base import GaussianHead, stack_rows

__all__ = ["DEFAULT_ALPHAS", "IDENTITY_SCALES", "QDA", "RGDA", "identity_scale", "regularized_covariances"]

PAPER_ALPHAS = (0.2, 2.0, 0.5)
#: The LR-RGDA paper's setting of RGDA and LR-RGDA: its alphas with an absolute identity term
PAPER_SETTING: dict[str, Any] = {"alpha1": PAPER_ALPHAS[0], "alpha2": PAPER_ALPHAS[1],
                                 "alpha3": PAPER_ALPHAS[2], "identity_scale": "absolute"}
#: gdacil's defaults (with ``identity_scale="samples"``), chosen by ``gdacil bench defaults``
#: over four offline feature sets in three scalings: a smaller class share than the LR-RGDA paper's
#: (``alpha1 / (alpha1 + alpha2)`` 0.048 against 0.091) and an identity term that shrinks as
#: samples accumulate
DEFAULT_ALPHAS = (0.1, 2.0, 0.6)

#: How the identity term ``alpha3 I`` is measured:
#:
#: - ``"samples"`` (gdacil's default): in units of ``tr(Sigma_avg) / (N - C)``, that is the mean
#:   per-dimension within-class variance ``tr(Sigma_avg) / d`` times ``d / (N - C)``, the ratio of
#:   dimensions to the degrees of freedom of the pooled covariance (``N`` samples of ``C``
#:   classes). That ratio sets how far the pooled covariance's small sample eigenvalues fall below
#:   the true ones (Marchenko-Pastur), which is what the ridge corrects: it shrinks as samples
#:   accumulate and grows with the dimension;
#: - ``"trace"``: in units of ``tr(Sigma_avg) / d`` alone;
#: - ``"absolute"`` (the LR-RGDA paper's): as given.
#:
#: The first two give the same predictions when every feature is multiplied by a constant.
IDENTITY_SCALES = ("samples", "trace", "absolute")


def check_identity_scale(value) -> str:
    if value not in IDENTITY_SCALES:
        raise ValueError(f"identity_scale must be one of {IDENTITY_SCALES}; got {value!r}")
    return value


def base_covariance_terms(stats, average_covariance: Callable[[], torch.Tensor],
                          model_size: tuple[int, float], alpha2: float, alpha3: float, how: str,
                          device):
    """``(Sigma_avg, alpha3 * unit, unit)``: the average class covariance of the model
    (``average_covariance()``, called only when a term needs it; zeros otherwise) and the
    identity term in the units of :func:`identity_scale` for a model of ``model_size``."""
    d = stats.dim
    if alpha2 or (alpha3 and how != "absolute"):
        avg = average_covariance().to(device)
    else:
        avg = torch.zeros(d, d, dtype=torch.float64, device=device)
    unit = identity_scale(stats, avg, how, model_size) if alpha3 else 1.0
    return avg, alpha3 * unit, unit


def mean_regularized_covariance(head, stats, alphas: tuple[float, float, float]) -> torch.Tensor:
    """``(alpha1 + alpha2) Sigma_avg + alpha3 u I``, the mean over classes of the regularised
    covariances ``alpha1 Sigma_c + alpha2 Sigma_avg + alpha3 u I`` of ``head`` fitted on ``stats``
    (``u``: its fitted ``identity_scale_``)."""
    a1, a2, a3 = alphas
    avg = head._average_covariance(stats).to(device=head.device_, dtype=torch.float64)
    eye = torch.eye(stats.dim, dtype=torch.float64, device=avg.device)
    return (a1 + a2) * avg + (a3 * head.identity_scale_) * eye


def identity_scale(stats, avg: torch.Tensor, how: str, model_size: tuple[int, float]) -> float:
    """The unit of the identity term (see :data:`IDENTITY_SCALES`) for the average class
    covariance ``avg`` of a model of ``model_size = (C, N)`` classes and samples.

    ``tr(Sigma_avg) / d``, times ``d / (N - C)`` for ``"samples"`` (``d`` when no class has two
    samples). Classes with no within-class variance (one sample each) fall back to the mean
    per-dimension variance of the class means, and a single point to 1. Every case is a
    function of the statistics alone, so it merges exactly."""
    if check_identity_scale(how) == "absolute":
        return 1.0
    d = avg.shape[0]
    scale = float(avg.trace()) / d
    if scale <= 0.0:
        mu = stats.means.to(torch.float64)
        scale = float((mu - mu.mean(0)).square().mean())
    scale = scale if scale > 0.0 else 1.0
    if how == "samples":
        n_classes, total = model_size
        scale *= d / max(total - n_classes, 1.0)
    return scale


def check_alphas(alpha1, alpha2, alpha3) -> tuple[float, float, float]:
    alphas = tuple(check_nonnegative(a, f"alpha{i}") for i, a in enumerate((alpha1, alpha2, alpha3), 1))
    if alphas[0] == 0.0 and alphas[1] == 0.0 and alphas[2] == 0.0:
        raise ValueError("alpha1, alpha2 and alpha3 are all zero: the covariance would be zero")
    return cast("tuple[float, float, float]", alphas)  # three alphas in, three out


def regularized_covariances(covs, avg, alpha1, alpha2, alpha3) -> torch.Tensor:
    """``alpha1 Sigma_c + alpha2 Sigma_avg + alpha3 I`` for a block of covariances ``(k, d, d)``."""
    eye = torch.eye(avg.shape[0], dtype=avg.dtype, device=avg.device)
    return alpha1 * covs + (alpha2 * avg + alpha3 * eye)


class RGDA(GaussianHead):
    """Regularised GDA: per-class ``Sigma_c^reg = alpha1 Sigma_c + alpha2 Sigma_avg + alpha3 u I``.

    Each regularised covariance is Cholesky-factored once, ``Sigma_c^reg = L_c L_c^T``, and the
    score is the exact log-posterior up to a class-independent constant::

        g_c(x) = -1/2 || L_c^{-1} (x - mu_c) ||^2 - sum log diag L_c + log pi_c

    Building costs ``O(C d^3)`` and scoring ``O(C d^2)`` per sample; :class:`LRRGDA` is the
    scalable form. Matrices that are not positive definite (e.g. QDA on a class with fewer samples
    than dimensions) get the smallest jitter that factors them and a ``NumericalWarning``.

    Parameters
    ----------
    alpha1, alpha2, alpha3 : float >= 0, default (0.1, 2.0, 0.6)
        gdacil's defaults (:data:`DEFAULT_ALPHAS`); the LR-RGDA paper's are (0.2, 2.0, 0.5) with an
        absolute identity term (:meth:`paper`).
    identity_scale : {"samples", "trace", "absolute"}, default "samples"
        The unit ``u`` of the identity term. ``"samples"`` is ``tr(Sigma_avg) / (N - C)``, a
        ridge that follows the features' units and shrinks as samples accumulate; ``"trace"``
        is ``tr(Sigma_avg) / d``; both give the same predictions on features in any units (raw,
        LayerNorm, L2-normalised). ``"absolute"`` is ``u = 1``, as in the LR-RGDA paper. See
        :data:`IDENTITY_SCALES`.
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    References
    ----------
    [LR-RGDA] X. Rao, M. Ha, B. Zhao, D. Liu and C. Alippi. Scalable Analytic Classifiers with
    Associative Drift Compensation for Class-Incremental Learning of Vision Transformers.
    arXiv:2602.00144, 2026.

    [RDA] J. H. Friedman. Regularized Discriminant Analysis. Journal of the American Statistical
    Association 84(405):165-175, 1989.

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

    _state_attributes = (*GaussianHead._state_attributes, "identity_scale_")
    default_novelty: ClassVar[str] = DEFAULT_SCORE

    def __init__(self, alpha1=DEFAULT_ALPHAS[0], alpha2=DEFAULT_ALPHAS[1],
                 alpha3=DEFAULT_ALPHAS[2], *, identity_scale="samples", priors=None, device=None,
                 dtype="float64", class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.alpha3 = alpha3
        self.identity_scale = identity_scale

    #: ``paper``: the LR-RGDA paper's alphas (0.2, 2.0, 0.5) with an absolute identity term
    presets: ClassVar[dict[str, dict[str, Any]]] = {"paper": PAPER_SETTING}

    @classmethod
    def paper(cls, **params):
        """The LR-RGDA paper's setting (``from_preset("paper", **params)``)."""
        return cls.from_preset("paper", **params)

    def _alphas(self) -> tuple[float, float, float]:
        return check_alphas(self.alpha1, self.alpha2, self.alpha3)

    def _check_params(self) -> None:
        super()._check_params()
        self._alphas()
        check_identity_scale(self.identity_scale)

    def _mixture_covariance(self, stats) -> torch.Tensor:
        """``(alpha1 + alpha2) Sigma_avg + alpha3 u I``: the mean regularised class covariance."""
        return mean_regularized_covariance(self, stats, self._alphas())

    def _density_offset(self, X: torch.Tensor) -> torch.Tensor:
        """Nothing: the scores are the class log-densities, log-determinants included."""
        return X.new_zeros(X.shape[0], dtype=torch.float64)

    def _build(self, stats, log_priors):
        a1, a2, a3 = self._alphas()
        d = stats.dim
        avg, a3, self.identity_scale_ = base_covariance_terms(
            stats, lambda: self._average_covariance(stats), self._model_size(stats), a2, a3,
            self.identity_scale, self.device_)
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
    regularisation matches scikit-learn's ``QuadraticDiscriminantAnalysis(reg_param=...)``, so
    ``reg_param`` is absolute (with the default ``reg_param = 0`` predictions do not depend on the
    features' units)
    (scikit-learn >= 1.8 estimates class covariances with ``1/n``, i.e. statistics with
    ``ddof=0``; older releases used ``1/(n-1)``).

    References
    ----------
    [RDA] J. H. Friedman. Regularized Discriminant Analysis. Journal of the American Statistical
    Association 84(405):165-175, 1989 (QDA and its regularisation).

    [sklearn] F. Pedregosa et al. Scikit-learn: Machine Learning in Python. Journal of Machine
    Learning Research 12:2825-2830, 2011 (``QuadraticDiscriminantAnalysis``).

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

    # reg_param is absolute: its class densities are not scale-free
    default_novelty: ClassVar[str] = DISTANCE_DEFAULT

    def __init__(self, reg_param=0.0, *, priors=None, device=None, dtype="float64",
                 class_batch_size="auto"):
        GaussianHead.__init__(self, priors=priors, device=device, dtype=dtype,
                              class_batch_size=class_batch_size)
        self.reg_param = reg_param
        self.identity_scale = "absolute"  # scikit-learn's reg_param, not a constructor argument

    def _alphas(self) -> tuple[float, float, float]:
        r = check_nonnegative(self.reg_param, "reg_param")
        if r > 1.0:
            raise ValueError(f"reg_param must lie in [0, 1]; got {self.reg_param!r}")
        return 1.0 - r, 0.0, r
