"""Novelty scores: how typical a sample is of the classes learned so far.

Every head and estimator of gdacil offers ``score_samples(X, method=None)``: higher means more
typical of the known classes, as in scikit-learn's novelty detectors and ``GaussianMixture``.
The scores come from what the head already holds, so none needs stored samples:

=================================  =================================================================
``method``                         score
=================================  =================================================================
``"shrunk_relative_mahalanobis"``  ``0.98 d_0(x) - min_c d_c(x)`` (see below): the default
                                   of the other Gaussian heads
``"relative_mahalanobis"``         ``d_0(x) - min_c d_c(x)``: the squared Mahalanobis distance
                                   ``d_c`` to the nearest class mean less the one, ``d_0``, to
                                   the class-agnostic Gaussian of all known data [RelMaha]
``"mahalanobis"``                  ``-min_c d_c(x)`` [Mahalanobis]; fitted on L2-normalised
                                   features it is Mahalanobis++ [MahaPP]
``"cosine"``                       ``max_c cos(x - m, mu_c - m)`` around the mean ``m`` of all
                                   known data: the nearest-neighbour cosine score with class
                                   means in place of stored samples
``"relative_likelihood"``          ``1/2 (l_near - 0.98 l_0 + l_head - 0.98 l_mix)(x)``: two
                                   log-likelihoods of ``x`` under the known classes, each
                                   against a class-agnostic Gaussian (see below); the default of
                                   LR-RGDA and RGDA, offered by the heads whose class scores
                                   are Gaussian log-densities (also QDA, Euclidean NCM)
``"msp"``                          the largest class probability of the head [MSP]
``"energy"``                       ``logsumexp_c g_c(x)`` of the head's class scores [Energy]
=================================  =================================================================

The distances share one covariance, the base of the default LR-RGDA,
``S = alpha2 Sigma_avg + alpha3 u I`` with ``alpha2 = 2``, ``alpha3 = 0.6``: ``Sigma_avg`` the
unweighted mean of the class covariances and ``u = tr(Sigma_avg) / (N - C)`` for ``N`` samples
of ``C`` classes. The class-agnostic Gaussian has the count-weighted mean of the class means and
covariance ``S`` plus the count-weighted scatter of the class means around it. All of it is a
function of the class statistics alone, so it is exact under ``merge`` and forgets a class with
its statistics; every distance score is invariant to a positive rescaling of the features.

Why the distance default shrinks the background term: along directions in which the class
means do not differ, ``d_0`` and ``d_c`` grow alike and cancel in the relative score, so an
input far from every class in such a direction scores like a typical one. Weighting ``d_0`` by
:data:`BACKGROUND_WEIGHT` ``= 0.98`` keeps the relative score's strength on inputs near the
known classes and makes the score fall without bound as an input moves away from all of them.

``"relative_likelihood"``, the default of LR-RGDA and RGDA, averages two relative
log-likelihoods of ``x``, each model of the known classes against the Gaussian with its
mixture's mean and covariance, all in the whitened coordinates of ``S`` (a log-density plus
``1/2 logdet S``, so that a rescaling of the features changes none): the nearest class under
the shared covariance, ``l_near(x) = -1/2 min_c d_c(x)``, against ``l_0(x) = -1/2 d_0(x)``; and
the mixture of the head's own class Gaussians, ``l_head(x) = log sum_c pi_c N(x; mu_c,
Sigma_c)`` (LR-RGDA's low-rank class covariances), against ``l_mix(x) = -1/2 d_mix(x)``, the
Mahalanobis distance to the mean of all known data under the head's mean class covariance
(of its full-rank model, ``(alpha1 + alpha2) Sigma_avg + alpha3 u I``) plus the scatter of the
class means. The shared covariance keeps the score steady where per-sample norms vary (raw
MiniLM features); the head's class covariances add the shape of each class. Unlike the shrunk
relative score it can stop falling far out along a direction in which one class is wider
than the head's whole mixture (its mean class covariance plus the scatter of the means).

Both of gdacil's scores (:data:`TYPICAL_NORM_SCORES`) look at an input's direction more than
at its length: :func:`to_typical_norm` rescales it to the root mean square norm ``r`` of the
known data (``sqrt(sum_c pi_c |mu_c|^2 + tr Sigma_avg)``, from the statistics, so exact under
``merge``) when its norm is within a factor :data:`NORM_BAND` ``= 2`` of ``r``, and by that
factor otherwise. How long an embedding is varies with the input (the length of a text, the
contrast of an image) much more than the class Gaussians allow, and a known input that is
merely longer than usual then looks novel; beyond the band the excess length still counts,
so the scores keep falling without bound far from the known data. Features that are
LayerNorm- or L2-normalised have one norm already and are scored as before. On raw features
(``gdacil bench openset``'s final heads, 3 seeds) it lifted the relative likelihood's AUROC by
1.9 on Fashion-MNIST, 0.6 on WordNet hypernyms, 0.3 on supersenses and 0.2 on openclipart; the
classical scores keep their published definitions (on them it helped Mahalanobis and cosine
and hurt the relative Mahalanobis score and the logit scores).

Measured with a quarter of the classes held out as unknown on MiniLM text features (WordNet
hypernyms and supersenses) and EfficientNet-Lite0 image features (openclipart, Fashion-MNIST),
in three scalings, 3 seeds, classes learned in tasks (``gdacil bench openset``,
``benchmarks/openset.md``), the relative likelihood has the best mean AUROC, 77.26, of every
score there: the shrunk relative Mahalanobis score 76.23, the relative score 74.67, FeCAM's
Mahalanobis 74.40, RanPAC's max softmax 73.02, energy 70.12, cosine 69.52, max softmax 68.90,
Mahalanobis++ 68.75, Mahalanobis 65.94; and the lowest mean FPR at 95% TPR, 77.61. It is the
best score in 9 of the 12 (set, scaling) cells, ahead of the next by 0.5 to 1.6 (on WordNet
hypernyms and openclipart RanPAC's and LR-RGDA's own max softmax had led the distance scores),
and behind on Fashion-MNIST, 8 known classes of 1280-d features: by 1.2 to the shrunk
relative score (LN, L2) and by 1.8 to FeCAM (raw; 3.7 before the typical norm).

Held out, on six feature sets on which none of these constants was chosen (MiniLM on banking77,
CLINC150, HWU64 and StackOverflow-20, EfficientNet-Lite0 on Caltech-101 and CIFAR-10; the same
protocol's final heads, 3 seeds, RanPAC not run), the relative likelihood again has the best mean
AUROC, 86.38: the shrunk relative score 85.79, the relative score 85.10, FeCAM's Mahalanobis
83.44, cosine 82.52, energy 81.14, max softmax 78.67, Mahalanobis 78.38. It is within 1 of the
best score in 15 of those 18 cells and trails FeCAM by 1.3 to 1.5 on banking77, where FeCAM's
full class covariances lead. Giving the nearest-class term a weight of 0.7 instead of half
would bring the three Fashion-MNIST cells within 1 of the best (0.6: LN and L2) and cost text
sets up to 1.0 (HWU64 raw): over all ten sets the mean AUROC is 82.74 at a half, 82.74 at 0.6
and 82.67 at 0.7.

Examples
--------
>>> import torch
>>> from gdacil import ClassGaussians
>>> from gdacil.heads import LRRGDA
>>> g = torch.Generator().manual_seed(0)
>>> centres = 4.0 * torch.eye(3, 8, dtype=torch.float64)
>>> y = torch.arange(300) % 3
>>> X = centres[y] + torch.randn(300, 8, generator=g, dtype=torch.float64)
>>> head = LRRGDA(rank=4).fit(ClassGaussians(8).update(X, y))
>>> known = centres[:1] + 0.1                               # near class 0
>>> unknown = -4.0 * torch.ones(1, 8, dtype=torch.float64)  # far from every class
>>> bool(head.score_samples(known) > head.score_samples(unknown))
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from .stats import ClassStatistics
from .stats.linalg import psd_cholesky

__all__ = ["BACKGROUND_WEIGHT", "DEFAULT_SCORE", "DISTANCE_DEFAULT", "DISTANCE_SCORES",
           "LOGIT_SCORES", "MIXTURE_SCORES", "NORM_BAND", "NOVELTY_SCORES", "TYPICAL_NORM_SCORES",
           "ClassNovelty", "check_method", "logit_score", "to_typical_norm"]

#: Scores computed from the class statistics' distances (:class:`ClassNovelty`)
DISTANCE_SCORES = ("shrunk_relative_mahalanobis", "relative_mahalanobis", "mahalanobis",
                   "cosine")
#: Scores computed from the class statistics' distances and the head's own class densities
MIXTURE_SCORES = ("relative_likelihood",)
#: Scores computed from a head's class scores (:func:`logit_score`)
LOGIT_SCORES = ("msp", "energy")
NOVELTY_SCORES = DISTANCE_SCORES + MIXTURE_SCORES + LOGIT_SCORES
#: What ``score_samples`` computes when no method is named on the heads whose class scores are
#: Gaussian log-densities with scale-free covariances (LR-RGDA, gdacil's default head, and RGDA)
DEFAULT_SCORE = "relative_likelihood"
#: ... and on the other Gaussian heads (LDA, QDA, NCM, FeCAM, the SGD head)
DISTANCE_DEFAULT = "shrunk_relative_mahalanobis"
#: The weight of ``d_0`` in the default score (see the module docstring)
BACKGROUND_WEIGHT = 0.98
#: ``(alpha2, alpha3)`` of the shared covariance: those of the default LR-RGDA base
BASE_ALPHAS = (2.0, 0.6)
#: gdacil's own scores, which see every input rescaled towards the typical norm of the known
#: data (:func:`to_typical_norm`); the classical ones keep their published definitions
TYPICAL_NORM_SCORES = ("shrunk_relative_mahalanobis", "relative_likelihood")
#: Inputs whose norm is within this factor of the typical norm are scored at the typical norm;
#: farther out, the rest of the factor still counts (a 10x norm is scored at 5x)
NORM_BAND = 2.0
#: Classes per block when scoring distances (bounds the ``(n, block)`` buffer)
_CLASS_BLOCK = 1024


def check_method(method: str | None, allowed=NOVELTY_SCORES, default: str = DEFAULT_SCORE) -> str:
    """``method`` (``default`` when None), or a ``ValueError`` listing ``allowed``."""
    method = default if method is None else method
    if method not in allowed:
        raise ValueError(f"unknown novelty score {method!r}; this head offers "
                         f"{', '.join(map(repr, allowed))}")
    return method


def to_typical_norm(X: torch.Tensor, typical_norm: torch.Tensor | float) -> torch.Tensor:
    """Each row of ``X`` ``(n, d)`` rescaled by ``typical_norm / |x|`` clipped to
    ``[1 / NORM_BAND, NORM_BAND]``: to the typical norm when it is within that factor of it
    (how long an embedding is varies with its input and says little about its class), by
    that factor otherwise, so that inputs far longer or shorter than any known one still look
    unlike them. A zero row stays zero."""
    norms = X.norm(dim=1, keepdim=True)
    ratio = torch.as_tensor(typical_norm, dtype=X.dtype, device=X.device) / norms
    return X * torch.nan_to_num(ratio, nan=1.0).clamp(1.0 / NORM_BAND, NORM_BAND)


def _unit_exponent(X: torch.Tensor) -> torch.Tensor:
    """Each row of ``X`` scaled by the power of two that brings its largest magnitude into
    ``[0.5, 1)``: exact, so a direction is unchanged, and its norm cannot overflow."""
    _, exponent = torch.frexp(X.abs().amax(1, keepdim=True))
    return torch.ldexp(X, -exponent)


def logit_score(scores: torch.Tensor, method: str) -> torch.Tensor:
    """``"msp"`` or ``"energy"`` of class scores ``(n, C)`` that are log-posteriors up to a
    per-sample constant (``"energy"`` depends on that constant: it is the head's own)."""
    scores = scores.to(torch.float64)
    if method == "energy":
        return scores.logsumexp(1)
    if method == "msp":
        return torch.softmax(scores, 1).amax(1)
    raise ValueError(f"{method!r} is not a score of class scores (those are {LOGIT_SCORES})")


class ClassNovelty:
    """The distance scores of :data:`DISTANCE_SCORES`, fitted from class statistics.

    Fitted state (whitened by ``W``, the inverse Cholesky factor of the shared covariance
    ``S``): ``whitener_`` ``(d, d)``, ``means_`` ``(C, d)`` (whitened class means),
    ``mean_norms_`` ``(C,)`` (their squared norms), ``center_`` ``(d,)`` (the whitened mean of
    all known data), ``background_`` ``(d, d)`` (the inverse Cholesky factor of the
    class-agnostic covariance in whitened coordinates), ``raw_center_`` ``(d,)`` (the mean of all
    known data) and ``directions_`` ``(C, d)`` (unit vectors from it to each class mean, for
    ``"cosine"``), ``typical_norm_`` (0-d: the root mean square norm of the known data,
    :meth:`at_typical_norm`).
    """

    #: what a head stores of it, prefixed with ``novelty_`` (``mixture_background_`` only for
    #: heads whose class scores are Gaussian log-densities)
    attributes = ("whitener_", "means_", "mean_norms_", "center_", "background_", "raw_center_",
                  "directions_", "mixture_background_", "typical_norm_")
    whitener_: torch.Tensor
    means_: torch.Tensor
    mean_norms_: torch.Tensor
    center_: torch.Tensor
    background_: torch.Tensor
    raw_center_: torch.Tensor
    directions_: torch.Tensor
    mixture_background_: torch.Tensor | None = None
    typical_norm_: torch.Tensor | None = None  # None: a head saved before gdacil kept it

    def fit(self, stats: ClassStatistics, *, average_covariance: torch.Tensor | None = None,
            mixture_covariance: torch.Tensor | None = None, dtype: torch.dtype = torch.float64,
            device=None) -> ClassNovelty:
        """Fit from ``stats`` (float64 arithmetic; the fitted tensors in ``dtype``);
        ``average_covariance``: their ``Sigma_avg``, when the caller has it already;
        ``mixture_covariance``: the mean of a head's class covariances, for the background of
        its class mixture (``"relative_likelihood"``)."""
        from .heads.rgda import identity_scale  # the heads build on this module

        mu = stats.means.to(device=device, dtype=torch.float64)
        counts = stats.counts.to(device=device, dtype=torch.float64)
        C, d = mu.shape
        if average_covariance is None:
            average_covariance = stats.average_covariance()
        avg = average_covariance.to(device=device, dtype=torch.float64)
        unit = identity_scale(stats, avg, "samples", (C, float(counts.sum())))
        eye = torch.eye(d, dtype=torch.float64, device=mu.device)
        a2, a3 = BASE_ALPHAS
        L = psd_cholesky(a2 * avg + (a3 * unit) * eye, name="novelty covariance")
        W = torch.linalg.solve_triangular(L, eye, upper=False)
        weights = counts / counts.sum()
        raw_center = weights @ mu
        means = mu @ W.T
        center = raw_center @ W.T
        spread = (means - center) * weights.sqrt()[:, None]
        background = psd_cholesky(eye + spread.T @ spread, name="novelty background covariance")
        directions = torch.nn.functional.normalize(mu - raw_center, dim=1)
        # E ||x||^2 over the known data, with the classes' mean covariance for their spread
        typical_norm = (weights @ mu.square().sum(1) + avg.trace()).clamp_min(0.0).sqrt()
        fitted = {"whitener_": W, "means_": means, "mean_norms_": means.square().sum(1),
                  "center_": center,
                  "background_": torch.linalg.solve_triangular(background, eye, upper=False),
                  "raw_center_": raw_center, "directions_": directions,
                  "typical_norm_": typical_norm}
        if mixture_covariance is not None:  # the head mixture's covariance, whitened
            within = W @ mixture_covariance.to(device=mu.device, dtype=torch.float64) @ W.T
            mixture = psd_cholesky(within + spread.T @ spread,
                                   name="novelty mixture background covariance")
            fitted["mixture_background_"] = torch.linalg.solve_triangular(mixture, eye,
                                                                          upper=False)
        for name, value in fitted.items():
            setattr(self, name, value.to(dtype).contiguous())
        return self

    @classmethod
    def of(cls, owner) -> ClassNovelty:
        """The fitted state a head keeps as ``novelty_<name>`` attributes."""
        novelty = cls()
        for name in cls.attributes:
            setattr(novelty, name, getattr(owner, "novelty_" + name, None))
        return novelty

    def store(self, owner) -> None:
        """Set the fitted state on ``owner`` as ``novelty_<name>`` attributes."""
        for name in self.attributes:
            if getattr(self, name) is not None:
                setattr(owner, "novelty_" + name, getattr(self, name))

    def at_typical_norm(self, X: torch.Tensor) -> torch.Tensor:
        """``X`` ``(n, d)`` as :data:`TYPICAL_NORM_SCORES` see it (unchanged when the state
        predates :attr:`typical_norm_`): :func:`to_typical_norm`."""
        return X if self.typical_norm_ is None else to_typical_norm(X, self.typical_norm_)

    def _blocks(self) -> Iterator[slice]:
        C = self.means_.shape[0]
        for start in range(0, C, _CLASS_BLOCK):
            yield slice(start, min(C, start + _CLASS_BLOCK))

    def score(self, X: torch.Tensor, method: str,
              log_mixture: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """The score ``method`` (one of :data:`DISTANCE_SCORES` and :data:`MIXTURE_SCORES`) of
        features ``X`` ``(n, d)``, float64; those of :data:`TYPICAL_NORM_SCORES` at
        :meth:`at_typical_norm` of them. ``"relative_likelihood"`` needs ``log_mixture``, which
        maps those rescaled features to ``log sum_c pi_c N(x; mu_c, Sigma_c)`` ``(n,)`` of the
        head's class Gaussians, up to the ``-d/2 log 2 pi`` they share."""
        X = X.to(self.whitener_.dtype)
        if method in TYPICAL_NORM_SCORES:
            X = self.at_typical_norm(X)
        if method == "cosine":
            U = torch.nn.functional.normalize(_unit_exponent(X - self.raw_center_), dim=1)
            best = torch.stack([(U @ self.directions_[b].T).amax(1) for b in self._blocks()], 1)
            return best.amax(1).to(torch.float64)
        Z = X @ self.whitener_.T
        norms = Z.square().sum(1)
        nearest = torch.stack([
            (self.mean_norms_[b] - 2.0 * (Z @ self.means_[b].T)).amin(1) for b in self._blocks()
        ], 1).amin(1).add_(norms).clamp_min_(0.0).to(torch.float64)
        if method == "mahalanobis":
            return -nearest
        if method not in ("relative_mahalanobis", "shrunk_relative_mahalanobis",
                          "relative_likelihood"):
            raise ValueError(f"{method!r} is not a distance score (those are "
                             f"{DISTANCE_SCORES + MIXTURE_SCORES})")
        def from_center(inverse_factor: torch.Tensor) -> torch.Tensor:
            return ((Z - self.center_) @ inverse_factor.T).square().sum(1).to(torch.float64)

        background = from_center(self.background_)
        if method == "relative_likelihood":
            if log_mixture is None:
                raise ValueError("relative_likelihood needs the head's log-mixture density")
            log_density = log_mixture(X)  # raises for heads whose scores are no densities
            if self.mixture_background_ is None:
                raise ValueError("relative_likelihood needs the background of the head's mixture "
                                 "(a head saved before gdacil kept it: refit it)")
            mixture = from_center(self.mixture_background_)
            # 1/2 logdet S = -sum log diag W: the log-density in S-whitened coordinates
            half_logdet = -float(self.whitener_.diagonal().double().log().sum())
            head = log_density.to(torch.float64) + half_logdet
            # each model's log-likelihood against the Gaussian of its own mixture's moments
            return 0.5 * ((BACKGROUND_WEIGHT / 2) * background - 0.5 * nearest
                          + (BACKGROUND_WEIGHT / 2) * mixture + head)
        weight = 1.0 if method == "relative_mahalanobis" else BACKGROUND_WEIGHT
        return weight * background - nearest
