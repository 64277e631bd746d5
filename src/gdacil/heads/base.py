"""What every head shares: fitting from statistics, priors, and one scoring kernel.

Every analytic head in gdacil scores a sample ``x`` against class ``c`` as

    g_c(x) = w_c^T x + b_c + sign * 1/2 || A_c x - a_c ||^2

with ``A_c`` of shape ``(k, d)``: ``k = 0`` for the linear heads (NCM, LDA), ``k = d`` for full
RGDA/QDA (``A_c = L_c^{-1}``, sign -1) and ``k = r`` for LR-RGDA (sign +1). The head stores the
rows ``[w_c; A_c]`` of all classes stacked as one ``(C, 1 + k, d)`` tensor, so scoring a block of
classes is a single GEMM of the batch against ``(block * (1 + k), d)``, a bias add, and a squared
norm over the ``k`` quadratic rows. Class blocks bound the peak memory of the score buffer.

Scoring never fails silently. Parameters that do not fit the head's dtype are refused at
``fit`` (after trying the exact fix of shifting every class's bias by one constant). Scores that
overflow the dtype at prediction time (one fused min/max check per class block) are recomputed
in float64 from the same parameters; ``decision_function`` then returns them shifted by their
per-sample maximum, which changes neither ``argmax`` nor the softmax, and scores that are NaN
or inf even in float64 raise a ``ValueError``: no class is ever predicted from a NaN row.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from .._params import Params
from .._presets import Presets
from .._validation import (
    all_finite,
    as_device,
    as_dtype,
    as_features,
    as_labels,
    check_positive_int,
    dtype_name,
    finite_flag,
    first_nonfinite,
)
from ..errors import NotFittedError
from ..novelty import (
    DISTANCE_DEFAULT,
    DISTANCE_SCORES,
    MIXTURE_SCORES,
    ClassNovelty,
    check_method,
    logit_score,
)
from ..state import State, Stateful, json_params
from ..stats import ClassStatistics

__all__ = ["GaussianHead", "ModelTerms", "NotFittedError", "checked_parameters", "finite_scores",
           "rescaled_scores", "warn_unless_normalised"]

#: Largest ``|sum(priors) - 1|`` that passes without a warning (scikit-learn's LDA tolerance)
PRIORS_SUM_TOL = 1e-5

# Scoring blocks small enough that the (samples, classes, rows) buffer stays in the last-level
# cache: the squared-norm pass then reads it from cache, and the GEMM runs near peak (see
# benchmarks/speed.md). Building works on covariances and may use larger blocks.
_SCORE_BUFFER_BYTES = 8 * 2**20
# On a GPU each block costs a few kernel launches, not cache misses: larger blocks
_GPU_SCORE_BUFFER_BYTES = 256 * 2**20
_BUILD_BUFFER_BYTES = 64 * 2**20


def warn_unless_normalised(total: float) -> None:
    """Warn, as scikit-learn's LDA does, that priors summing to ``total`` get renormalised.

    Parameters
    ----------
    total : float
        The sum of all the priors given (for a mapping, of all its entries).
    """
    if abs(total - 1.0) > PRIORS_SUM_TOL:
        warnings.warn(f"The priors do not sum to 1 (they sum to {total:.6g}). Renormalizing",
                      UserWarning, stacklevel=4)


def checked_parameters(owner, dtype: torch.dtype, device, weights: torch.Tensor,
                       bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weights`` and ``bias`` in ``dtype`` on ``device`` (contiguous), refusing non-finite values.

    A bias that overflows ``dtype`` only by its common magnitude is shifted by its maximum over
    classes (its column 0 when it is ``(C, 1 + k)``: the linear bias, which adds to the score):
    every score moves by the same constant, so ``argmax`` and the softmax are exact. Anything
    else that is NaN or inf raises a ``ValueError`` naming ``owner``'s class, the dtype and what
    to do.
    """
    name = type(owner).__name__
    w = weights.to(device=device, dtype=dtype).contiguous()
    b = bias.to(device=device, dtype=dtype).contiguous()
    w_ok = bool(finite_flag(w))
    if w_ok and bool(finite_flag(b)):
        return w, b
    if any(t.dtype == torch.float64 and not bool(finite_flag(t)) for t in (weights, bias)):
        raise ValueError(f"{name}: building the head gave NaN or inf parameters (the statistics "
                         "are too large or degenerate for it); rescale the features")
    if w_ok:
        b64 = bias.to(device=device, dtype=torch.float64)
        column = b64[:, 0] if b64.ndim == 2 else b64
        column -= column.max()
        b = b64.to(dtype).contiguous()
        if bool(finite_flag(b)):
            return w, b
    raise dtype_overflow(owner, dtype, "the head's parameters")


def dtype_overflow(owner, dtype: torch.dtype, what: str) -> ValueError:
    """The error for ``what`` (of ``owner``, a head) that does not fit the head's ``dtype``."""
    return ValueError(
        f"{type(owner).__name__}: {what} overflow {dtype} (its largest value is "
        f"{torch.finfo(dtype).max:.3g}); fit it with dtype='float64' or rescale the features")


def finite_scores(owner, scores: torch.Tensor, what: str = "scores") -> torch.Tensor:
    """``scores`` (float64, the fallback of an overflowing dtype), or a ``ValueError`` naming the
    first sample whose ``what`` (class scores, or novelty scores ``(n,)``) are NaN or inf even
    so."""
    if not bool(finite_flag(scores)):
        raise ValueError(
            f"{type(owner).__name__}: the {what} of sample {first_nonfinite(scores)} are NaN or "
            "inf even in float64: its features are too large for this head; rescale them")
    return scores


def rescaled_scores(owner, scores: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Float64 ``scores`` ``(n, C)`` shifted by their per-sample maximum, in ``dtype``.

    The shift changes neither ``argmax`` nor the softmax; scores more than the dtype's range
    below the best are clamped to its lowest finite value (their probability is 0 either way).
    Raises ``ValueError`` if ``scores`` hold NaN or inf (:func:`finite_scores`).
    """
    scores = finite_scores(owner, scores)
    scores = scores - scores.amax(1, keepdim=True)
    return scores.clamp_min_(torch.finfo(dtype).min).to(dtype)


def classes_to_forget(owner, classes, known) -> list[int]:
    """``classes`` (one integer label or a sequence of them) as distinct ints in the order
    given; a ``ValueError`` naming ``owner``'s class and the first label not in ``known`` (the
    labels held) otherwise."""
    if (isinstance(classes, str) or not isinstance(classes, Iterable)
            or getattr(classes, "ndim", None) == 0):
        classes = [classes]
    given = classes if isinstance(classes, (np.ndarray, torch.Tensor)) else list(classes)
    if not len(given):
        return []
    labels = list(dict.fromkeys(as_labels(given, name="classes").tolist()))
    held = set(known)
    unknown = [c for c in labels if c not in held]
    if unknown:
        listing = sorted(held)
        raise ValueError(f"{type(owner).__name__}.forget: unknown class {unknown[0]}; it holds "
                         f"classes {listing[:20]}{' ...' if len(listing) > 20 else ''}")
    return labels


def refit_or_unfit(obj, refit, classes_left: bool) -> None:
    """``refit()`` when ``classes_left``, else leave ``obj`` unfitted (:func:`drop_fitted_state`);
    a refit that fails leaves it unfitted too: what forgetting leaves behind."""
    try:
        if classes_left:
            refit()
        else:
            drop_fitted_state(obj)
    except BaseException:
        drop_fitted_state(obj)
        raise


def drop_fitted_state(obj) -> None:
    """Make ``obj`` unfitted: delete its fitted attributes (``name_``) and private state and
    caches (``_name``); its constructor parameters stay."""
    for name in [n for n in vars(obj) if n.startswith("_") or n.endswith("_")]:
        del obj.__dict__[name]


@dataclass(frozen=True)
class ModelTerms:
    """What a head's rows depend on beyond the classes it is fitted on.

    A head fitted on some of a model's classes (one shard of :class:`~gdacil.heads.ShardedHead`)
    with the terms of the whole model builds, for its classes, the rows a head fitted on every
    class would build: the shared covariance terms (LDA; the base ``B`` of RGDA and LR-RGDA) and
    the priors are the model's, everything else is per class.

    Attributes
    ----------
    average_covariance : torch.Tensor
        ``(d, d)`` float64, the unweighted mean of every class's covariance, ``Sigma_avg``.
    n_classes : int
        Classes in the whole model (uniform priors are ``1 / n_classes``).
    total_count : float
        Samples of the whole model (empirical priors are ``n_c / total_count``).
    """

    average_covariance: torch.Tensor
    n_classes: int
    total_count: float

    @classmethod
    def of(cls, stats: ClassStatistics) -> ModelTerms:
        """The terms of ``stats`` alone (one process holding every class)."""
        return cls(stats.average_covariance(), stats.n_classes, float(stats.counts.sum()))


class GaussianHead(Params, Presets, Stateful, ABC):
    """Base class of the classifiers built from :class:`~gdacil.ClassGaussians`.

    Subclasses implement ``_build(stats, log_priors)`` returning ``(rows, bias, sign)``:
    ``rows`` of shape ``(C, 1 + k, d)``, ``bias`` of shape ``(C, 1 + k)`` and ``sign`` in
    ``{-1, +1}`` (ignored when ``k = 0``), and optionally a fourth item: a dict of further fitted
    attributes, set once the parameters pass their checks.

    Parameters shared by every head
    -------------------------------
    priors : None, "empirical", array of shape (C,), or mapping label -> prior
        Class priors. ``None`` (the LR-RGDA paper's choice) means uniform; "empirical" uses the
        counts. A mapping may also name classes still to come; the priors of the classes present are
        renormalised. Priors (for a mapping, all its entries) that do not sum to 1 within
        ``1e-5`` are renormalised with a ``UserWarning``, as scikit-learn's LDA does.
    device : None, str or torch.device, default None
        Where the head is built and scores are computed (None: the CPU).
    dtype : str or torch.dtype, default "float64"
        Dtype of the inference tensors: ``"float64"``, ``"float32"``, ``"float16"`` or
        ``"bfloat16"``, or the ``torch.dtype``. Building runs in float64 (LR-RGDA: see its notes).
        ``fit`` sets ``dtype_`` and ``device_``, the ``torch.dtype`` and ``torch.device`` in use.
    class_batch_size : int or "auto", default "auto"
        Classes per block, in building and in scoring; "auto" keeps the score buffer near 8 MiB
        (cache-sized) and the build buffers near 64 MiB.
    """

    #: The novelty score ``score_samples`` computes when none is named (:mod:`gdacil.novelty`)
    default_novelty: ClassVar[str] = DISTANCE_DEFAULT
    _state_attributes: ClassVar[tuple[str, ...]] = (
        "classes_", "n_features_in_", "rows_", "bias_", "sign_", "dtype_", "device_",
        *("novelty_" + name for name in ClassNovelty.attributes))

    def __init__(self, *, priors=None, device=None, dtype="float64", class_batch_size="auto"):
        self.priors = priors
        self.device = device
        self.dtype = dtype
        self.class_batch_size = class_batch_size

    # ------------------------------------------------------------------ fitting
    def fit(self, stats: ClassStatistics, *, model_terms: ModelTerms | None = None) -> GaussianHead:
        """Build the head from class statistics. Returns ``self``.

        ``model_terms``: the :class:`ModelTerms` of a model of which ``stats`` hold some classes
        (default: ``stats`` are the whole model). Priors must then be None or "empirical".
        """
        if not isinstance(stats, ClassStatistics):
            raise TypeError(f"fit expects ClassGaussians or LowRankGaussians (ClassStatistics), "
                            f"got {type(stats).__name__}")
        if stats.n_classes == 0:
            raise ValueError(f"{type(self).__name__}.fit: the statistics hold no classes")
        self._check_params()
        self.dtype_, self.device_ = as_dtype(self.dtype), as_device(self.device)
        if self.dtype_ != torch.float64 and not all_finite(stats.means.to(self.dtype_)):
            raise dtype_overflow(self, self.dtype_, "the class means (inputs of their scale "
                                 "cannot be scored in it)")
        self.classes_ = torch.tensor(stats.classes, dtype=torch.int64)
        self.n_features_in_ = stats.dim
        self._model_terms = model_terms
        self._fit_average: torch.Tensor | None = None  # Sigma_avg, at most once per fit
        try:
            log_priors = self._log_priors(stats)
            rows, bias, sign, *fitted = self._build(stats, log_priors)
            novelty = None
            if model_terms is None:  # a shard's classes alone do not describe the whole model
                novelty = ClassNovelty().fit(
                    stats, average_covariance=self._average_covariance(stats),
                    mixture_covariance=self._mixture_covariance(stats),
                    dtype=torch.float64 if self.dtype_ == torch.float64 else torch.float32,
                    device=self.device_)
        finally:
            del self._model_terms, self._fit_average
        self.rows_, self.bias_ = checked_parameters(self, self.dtype_, self.device_, rows, bias)
        self.sign_ = float(sign)
        for name, value in (fitted[0] if fitted else {}).items():
            setattr(self, name, value)
        if novelty is not None:
            novelty.store(self)
        return self

    def _check_params(self) -> None:
        if self.class_batch_size != "auto":
            check_positive_int(self.class_batch_size, "class_batch_size")
        as_dtype(self.dtype)
        as_device(self.device)

    @abstractmethod
    def _build(self, stats: ClassStatistics, log_priors: torch.Tensor):
        """Return ``(rows, bias, sign)`` for the statistics (see the class docstring)."""

    def _block_size(self, n_rows_per_class: int, n_samples: int | None = None) -> int:
        """Classes per block: scoring ``n_samples`` samples, or building when ``n_samples`` is None."""
        if self.class_batch_size != "auto":
            return int(self.class_batch_size)
        if n_samples is None:
            return max(1, _BUILD_BUFFER_BYTES // (1024 * n_rows_per_class * 8))
        itemsize = self.dtype_.itemsize
        budget = _SCORE_BUFFER_BYTES if self.device_.type == "cpu" else _GPU_SCORE_BUFFER_BYTES
        block = max(1, budget // (n_samples * n_rows_per_class * max(itemsize, 4)))
        # GEMM kernels slow down by a third on odd column counts (31 x 65 rows against 32 x 65)
        return block - block % 8 if block >= 8 else block

    def _average_covariance(self, stats: ClassStatistics) -> torch.Tensor:
        """``Sigma_avg`` of the model being fitted: of ``model_terms`` when given, else of
        ``stats``."""
        terms = getattr(self, "_model_terms", None)
        if terms is not None:
            return terms.average_covariance
        if "_fit_average" not in self.__dict__:  # called outside fit
            return stats.average_covariance()
        average = self._fit_average
        if average is None:
            average = self._fit_average = stats.average_covariance()
        return average

    def _model_size(self, stats: ClassStatistics) -> tuple[int, float]:
        """``(classes, samples)`` of the model being fitted: of ``model_terms`` when given, else
        of ``stats``."""
        terms = getattr(self, "_model_terms", None)
        if terms is None:
            return stats.n_classes, float(stats.counts.sum())
        return terms.n_classes, terms.total_count

    def _log_priors(self, stats: ClassStatistics) -> torch.Tensor:
        terms = getattr(self, "_model_terms", None)
        if terms is not None:
            if self.priors is None:
                return torch.full((stats.n_classes,), -float(np.log(terms.n_classes)),
                                  dtype=torch.float64)
            if self.priors == "empirical":
                return (stats.counts.cpu().to(torch.float64) / terms.total_count).log()
            raise ValueError("a head fitted with model_terms takes priors None or 'empirical'; "
                             f"got {self.priors!r}")
        C = stats.n_classes
        p, total = self.priors, None
        if p is None:
            return torch.full((C,), -float(np.log(C)), dtype=torch.float64)
        if isinstance(p, str):
            if p != "empirical":
                raise ValueError(f"priors must be None, 'empirical', an array or a mapping; got {p!r}")
            counts = stats.counts.cpu()
            return (counts / counts.sum()).log()
        if isinstance(p, Mapping):
            missing = [c for c in stats.classes if c not in p]
            if missing:
                raise ValueError(f"priors mapping lacks classes {missing[:10]}")
            total = float(sum(p.values()))    # a mapping may also cover classes to come
            p = [p[c] for c in stats.classes]
        p = torch.as_tensor(np.asarray(p, dtype=np.float64))
        if p.shape != (C,):
            raise ValueError(f"priors must have one entry per class ({C}); got shape {tuple(p.shape)}")
        if not torch.isfinite(p).all() or (p <= 0).any():
            raise ValueError("priors must be positive and finite")
        warn_unless_normalised(total if total is not None else float(p.sum()))
        return (p / p.sum()).log()

    # ------------------------------------------------------------------ scoring
    def _check_fitted(self) -> None:
        if not hasattr(self, "rows_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit(stats) first")

    def _prepare(self, X) -> torch.Tensor:
        self._check_fitted()
        return as_features(X, dim=self.n_features_in_, dtype=self.dtype_, device=self.device_)

    def _score_blocks(self, X: torch.Tensor):
        """Yield ``(start, stop, scores)`` for consecutive blocks of classes."""
        C, rows_per_class, _ = self.rows_.shape
        block = self._block_size(rows_per_class, X.shape[0])
        for start in range(0, C, block):
            stop = min(C, start + block)
            yield start, stop, self._score_rows(X, self.rows_[start:stop], self.bias_[start:stop])

    def _score_rows(self, X: torch.Tensor, rows: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Scores ``(n, k)`` of ``X`` against the stacked rows ``(k, 1 + q, d)`` of ``k`` classes."""
        k, rows_per_class, d = rows.shape
        Z = torch.addmm(bias.reshape(-1), X, rows.reshape(-1, d).T).view(X.shape[0], k, rows_per_class)
        scores = Z[:, :, 0]
        if rows_per_class > 1:
            Q = Z[:, :, 1:]
            scores = scores + (0.5 * self.sign_) * torch.linalg.vecdot(Q, Q)
        return scores

    def _sample_offset(self, X: torch.Tensor) -> torch.Tensor | None:
        """A per-sample term ``(n, 1)`` that ``decision_function`` adds to every class's score
        (``None``: none). It changes neither ``argmax`` nor the softmax."""
        return None

    def _dense_scores(self, X: torch.Tensor) -> torch.Tensor:
        """Scores ``(n, C)`` in the head's dtype with the per-sample offset (may overflow)."""
        out = torch.empty(X.shape[0], self.rows_.shape[0], dtype=self.dtype_, device=self.device_)
        for start, stop, scores in self._score_blocks(X):
            out[:, start:stop] = scores
        return self._offset(X, out)

    def _offset(self, X: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` with :meth:`_sample_offset` added (in place)."""
        offset = self._sample_offset(X)
        if offset is not None:
            scores += offset.to(scores.dtype)
        return scores

    def _decision(self, X: torch.Tensor) -> torch.Tensor:
        out = self._dense_scores(X)
        if not bool(finite_flag(out)):  # overflow in the head's dtype: rescale in float64
            out = rescaled_scores(self, self._scores64(X), self.dtype_)
        return out

    def _scores64(self, X: torch.Tensor) -> torch.Tensor:
        """Scores ``(n, C)`` in float64 from the head's parameters (upcast exactly): what scoring
        falls back to when the head's dtype overflows. No per-sample offset."""
        X = X.to(torch.float64)
        C, rows_per_class, _ = self.rows_.shape
        out = torch.empty(X.shape[0], C, dtype=torch.float64, device=self.device_)
        block = self._block_size(rows_per_class, X.shape[0])
        for start in range(0, C, block):
            stop = min(C, start + block)
            out[:, start:stop] = self._score_rows(X, self.rows_[start:stop].double(),
                                                  self.bias_[start:stop].double())
        return out

    def decision_function(self, X) -> torch.Tensor:
        """Class scores ``(n, C)``, columns in the order of ``classes_``.

        Scores are log-posteriors up to a per-sample constant (see each head), so ``argmax`` and
        ``softmax`` are exact.
        """
        return self._decision(self._prepare(X))

    def predict(self, X) -> torch.Tensor:
        """Predicted class labels, without materialising the full score matrix.

        Where a block's scores overflow the head's dtype, the labels come from float64 scores;
        scores that are NaN or inf even then raise a ``ValueError``.
        """
        X = self._prepare(X)
        best = torch.full((X.shape[0],), -torch.inf, dtype=self.dtype_, device=self.device_)
        arg = torch.zeros(X.shape[0], dtype=torch.long, device=self.device_)
        finite = torch.ones((), dtype=torch.bool, device=self.device_)
        for start, _, scores in self._score_blocks(X):
            finite &= finite_flag(scores)
            val, idx = scores.max(1)
            better = val > best
            best = torch.where(better, val, best)
            arg = torch.where(better, idx + start, arg)
        if not bool(finite):
            arg = finite_scores(self, self._scores64(X)).argmax(1)
        return self.classes_[arg.cpu()]

    def top_k(self, X, k: int = 5, *, proba: bool = False):
        """The ``k`` best classes of every sample, best first, as :meth:`decision_function`
        ranks them, scored one block of classes at a time (no ``(n, C)`` score matrix).

        Returns ``(scores, labels)``, each ``(n, k)``, and with ``proba`` also the
        probabilities of those classes under the softmax over every class. Heads with a faster
        exact ranking (LR-RGDA's pruned scoring) override it.
        """
        X = self._prepare(X)
        k = check_positive_int(k, "k")
        C = self.rows_.shape[0]
        if k > C:
            raise ValueError(f"k = {k} exceeds the number of classes ({C})")
        offset = self._sample_offset(X)
        best = torch.empty(X.shape[0], 0, dtype=self.dtype_, device=self.device_)
        where = torch.empty(X.shape[0], 0, dtype=torch.long, device=self.device_)
        total = torch.full((X.shape[0],), -torch.inf, dtype=self.dtype_, device=self.device_)
        finite = torch.ones((), dtype=torch.bool, device=self.device_)
        for start, stop, scores in self._score_blocks(X):
            if offset is not None:
                scores = scores + offset
            finite &= finite_flag(scores)
            columns = torch.arange(start, stop, device=self.device_).expand(X.shape[0], -1)
            best, at = torch.cat([best, scores], 1).topk(min(k, best.shape[1] + stop - start), 1)
            where = torch.cat([where, columns], 1).gather(1, at)
            if proba:
                total = torch.logaddexp(total, scores.logsumexp(1))
        if not bool(finite):  # overflow in the head's dtype: the float64 fallback, densely
            scores = self._decision(X)
            best, where = scores.topk(k, dim=1)
            total = scores.logsumexp(1)
        labels = self.classes_[where.cpu()]
        if not proba:
            return best, labels
        return best, labels, (best - total[:, None]).exp()

    def score_samples(self, X, method: str | None = None) -> torch.Tensor:
        """Novelty scores ``(n,)``, float64: higher means more typical of the classes learned
        so far (:mod:`gdacil.novelty`).

        Parameters
        ----------
        X : array-like of shape (n, d)
            Features, as the head takes them.
        method : str, optional
            One of :data:`gdacil.novelty.NOVELTY_SCORES`; default the head's
            ``default_novelty`` (``"relative_likelihood"`` for LR-RGDA and RGDA,
            ``"shrunk_relative_mahalanobis"`` for the others). The distance scores come from
            the class statistics the head was fitted on (a head fitted with ``model_terms``,
            one shard of a model, has only ``"msp"`` and ``"energy"``). gdacil's own scores
            (the two defaults) see every input rescaled towards the root mean square norm of
            the known data (:func:`gdacil.novelty.to_typical_norm`).

        Raises
        ------
        ValueError
            Naming the first sample whose score is NaN or inf (finite features so large that
            its distances overflow float64), as :meth:`predict` does for class scores: no such
            score is ever compared with a threshold.

        Examples
        --------
        >>> import torch
        >>> from gdacil import ClassGaussians
        >>> from gdacil.heads import LDA
        >>> g = torch.Generator().manual_seed(0)
        >>> X, y = torch.randn(200, 4, generator=g) + 3 * torch.eye(2, 4)[torch.arange(200) % 2], \\
        ...     torch.arange(200) % 2
        >>> head = LDA().fit(ClassGaussians(4).update(X, y))
        >>> scores = head.score_samples(torch.tensor([[3.0, 0, 0, 0], [-9.0, -9, 9, 9]]))
        >>> bool(scores[0] > scores[1])
        True
        """
        method = check_method(method, default=self.default_novelty)
        if method in DISTANCE_SCORES or method in MIXTURE_SCORES:
            features = self._novelty_features(X)
            if not hasattr(self, "novelty_means_"):
                raise ValueError(
                    f"{type(self).__name__} has no class statistics' novelty state (fitted with "
                    f"model_terms, or saved before gdacil kept it): refit it on statistics, or "
                    f"use method='msp' or 'energy'")
            # heads with class densities take their input as the statistics describe it
            scores = ClassNovelty.of(self).score(features, method, log_mixture=self._log_mixture)
        else:
            scores = logit_score(self.decision_function(X), method)
        return finite_scores(self, scores, "novelty scores")

    def _mixture_covariance(self, stats: ClassStatistics) -> torch.Tensor | None:
        """The mean ``(d, d)`` float64 of the class covariances of the head's model (called at
        the end of ``fit``), for the class-agnostic Gaussian of its mixture; ``None`` for a head
        whose scores are no Gaussian log-densities."""
        return None

    def _density_offset(self, X: torch.Tensor) -> torch.Tensor | None:
        """What the class scores of ``X`` (before any rescaling, :meth:`_dense_scores`) hold
        beyond ``log N(x; mu_c, Sigma_c) + log pi_c`` (up to ``-d/2 log 2 pi``), the same for
        every class: ``(n,)``, or ``None`` when the scores are no Gaussian log-densities (no
        ``"relative_likelihood"``)."""
        return None

    def _log_mixture(self, X) -> torch.Tensor:
        """``log sum_c pi_c N(x; mu_c, Sigma_c)`` ``(n,)`` of the head's class Gaussians, float64
        (what ``"relative_likelihood"`` needs besides the statistics' distances)."""
        X = self._prepare(X)
        offset = self._density_offset(X)
        if offset is None:
            raise ValueError(f"{type(self).__name__}'s class scores are not Gaussian "
                             "log-densities, so it offers no 'relative_likelihood'; use "
                             f"{self.default_novelty!r} (its default) or another score")
        scores = self._dense_scores(X)
        if not bool(finite_flag(scores)):  # overflow in the head's dtype: float64, unshifted
            scores = self._offset(X, self._scores64(X))
        return scores.to(torch.float64).logsumexp(1) - offset.to(torch.float64)

    def _novelty_features(self, X) -> torch.Tensor:
        """``X`` as the statistics describe it (heads that transform their input override)."""
        self._check_fitted()
        return as_features(X, dim=self.n_features_in_, dtype=torch.float64, device=self.device_)

    def predict_log_proba(self, X) -> torch.Tensor:
        return torch.log_softmax(self.decision_function(X), dim=1)

    def predict_proba(self, X) -> torch.Tensor:
        return torch.softmax(self.decision_function(X), dim=1)

    def score(self, X, y) -> float:
        """Mean accuracy of ``predict(X)`` against labels ``y``."""
        y = torch.as_tensor(np.asarray(y)).reshape(-1)
        pred = self.predict(X)
        if y.shape[0] != pred.shape[0]:
            raise ValueError(f"y has {y.shape[0]} labels for {pred.shape[0]} samples")
        return float((pred == y).double().mean())

    # ------------------------------------------------------------------ memory
    def memory_report(self) -> dict[str, int]:
        """Bytes of the inference state (and of any build cache the head keeps)."""
        self._check_fitted()
        report = {"rows": self.rows_.nbytes, "bias": self.bias_.nbytes}
        report.update(self._extra_memory())
        report["total"] = sum(report.values())
        return report

    def _extra_memory(self) -> dict[str, int]:
        return {}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> State:
        """The fitted head: ``(tensors, metadata)`` with its parameters (:mod:`gdacil.state`).
        A head loaded with it scores exactly as this one does."""
        self._check_fitted()
        tensors, metadata = super().state_dict()
        return tensors, {**metadata, "params": json_params(self.get_params())}

    def load_state_dict(self, tensors, metadata, *, source: str = "the state") -> GaussianHead:
        attributes = dict(metadata.get("attributes", {}))
        if "rows_" in tensors and "dtype_" not in attributes:  # stored before heads kept dtype_
            attributes["dtype_"] = {"__torch_dtype__": dtype_name(tensors["rows_"].dtype)}
        super().load_state_dict(tensors, {**metadata, "attributes": attributes}, source=source)
        return self

    def bind(self, stats: ClassStatistics) -> GaussianHead:
        """Tell a loaded head that ``stats`` (just loaded) are the statistics it was fitted on,
        so the caches its state keeps apply to them at the next :meth:`fit`. Returns ``self``."""
        return self

    # ------------------------------------------------------------------ forgetting
    def forget(self, classes, stats: ClassStatistics) -> GaussianHead:
        """Forget ``classes``: remove them from ``stats`` (in place) and refit on the rest.
        Returns ``self``.

        The head is then the head fitted on statistics that never held the classes: bit for bit
        the one ``fit(stats.subset(rest))`` gives, and, with :class:`~gdacil.ClassGaussians`,
        to round-off the one fitted on the samples of the other classes only (per-class
        moments do not depend on other classes; ``Sigma_avg`` sums the same covariances). Its
        state (``state_dict``, caches, LR-RGDA's eigenpairs, FeCAM's statistics) then holds
        nothing of them.

        Parameters
        ----------
        classes : int or sequence of int
            Labels held by ``stats``.
        stats : ClassStatistics
            The statistics the head was fitted on (or since updated); they lose ``classes``.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before anything changes: a label ``stats`` do not hold (named), or priors given as
            an array, one per class in the statistics' order, which would no longer match (give
            a mapping label -> prior; one keeps its entries and uses those of the classes left).

        Notes
        -----
        Forgetting every class empties ``stats`` and leaves the head unfitted. If the refit
        fails (an interrupt, a remaining model that cannot be built), ``stats`` have lost the
        classes already and the head is left unfitted, holding nothing of them either: fit it
        again. :class:`~gdacil.LowRankGaussians` do not remove a class exactly: their running
        sum behind ``Sigma_avg`` keeps its compression error (see :mod:`gdacil.stats.lowrank`).
        The shard of a :class:`~gdacil.heads.ShardedHead` forgets through
        :meth:`ShardedHead.forget <gdacil.heads.ShardedHead.forget>`.

        Examples
        --------
        >>> import torch
        >>> from gdacil import ClassGaussians
        >>> from gdacil.heads import LDA
        >>> g = torch.Generator().manual_seed(0)
        >>> X, y = torch.randn(90, 3, generator=g, dtype=torch.float64), torch.arange(90) % 3
        >>> stats = ClassGaussians(3).update(X, y)
        >>> head = LDA().fit(stats).forget(1, stats)
        >>> head.classes_.tolist(), stats.classes
        ([0, 2], [0, 2])
        >>> never = LDA().fit(ClassGaussians(3).update(X[y != 1], y[y != 1]))
        >>> bool((head.decision_function(X) - never.decision_function(X)).abs().max() < 1e-12)
        True
        """
        self._check_fitted()
        labels = classes_to_forget(self, classes, stats.classes)
        if not (self.priors is None or isinstance(self.priors, (str, Mapping))):
            raise ValueError(f"{type(self).__name__}.forget: priors given as an array (one per "
                             "class, in the statistics' order) would no longer match the "
                             "classes; give them as a mapping label -> prior")
        if not labels:
            return self
        stats.remove_classes(labels)
        refit_or_unfit(self, lambda: self._refit(stats), stats.n_classes > 0)
        return self

    def _refit(self, stats: ClassStatistics) -> None:
        """Fit on ``stats``, which just lost classes (:meth:`forget`)."""
        self.fit(stats)


def stack_rows(linear: torch.Tensor, linear_bias: torch.Tensor, quad=None, quad_bias=None):
    """Stack per-class linear rows ``(C, d)`` and optional quadratic rows ``(C, k, d)``."""
    rows = linear[:, None, :]
    bias = linear_bias[:, None]
    if quad is not None:
        rows = torch.cat([rows, quad], dim=1)
        bias = torch.cat([bias, quad_bias], dim=1)
    return rows, bias
