"""FeCAM: per-class Mahalanobis distance with shrunk, correlation-normalised covariances.

FeCAM (Goswami et al., NeurIPS 2023 [FeCAM]) classifies by the smallest squared Mahalanobis distance
``(x - mu_c)^T R_c^{-1} (x - mu_c)``, with ``R_c`` built from the class covariance ``Sigma_c``:

1. shrink: ``Sigma_c + alpha1 v_c I + alpha2 o_c (1 1^T - I)``, with ``v_c`` the mean diagonal
   and ``o_c`` the mean off-diagonal entry of ``Sigma_c``;
2. normalise (``normalize=True``): ``R_c = D^{-1/2} Sigma_shrunk D^{-1/2}`` with ``D`` its
   diagonal, i.e. divide by the outer product of the standard deviations.

Optional transforms run before the statistics and at prediction: the Tukey power transform
(``x -> sign(x) |x|^tukey``) and L2 normalisation of each sample (``l2=True``).

What differs from the published code, and why:

- ``R_c^{-1}`` is factored once when the head is built, in float64, instead of a ``pinv`` per
  class per evaluation batch: a Cholesky factor ``L_c^{-1}`` where ``R_c`` is clearly positive
  definite, and where it is not, the pseudo-inverse factor ``diag(s^{-1/2}) U^T`` of its
  eigendecomposition, with the eigenvalues below ``rcond`` times the largest treated as zero
  (the published ``pinv``, with a cut-off decided once, in float64).
- Why a pseudo-inverse and not a small diagonal floor: with ``alpha1 = alpha2`` and features
  that sum to zero per sample (LayerNorm-like), ``Sigma_c 1 = 0`` and ``o_c = -v_c / (d - 1)``,
  so the shrunk matrix is exactly singular along ``1``; after normalisation the null vector is
  ``D^{1/2} 1``, which differences ``x - mu_c`` (orthogonal to ``1``) do NOT avoid. A floor
  ``eps`` then adds ``~ (1^T D^{1/2}(x - mu_c))^2 / eps`` to every distance and swamps it: on
  LayerNorm-like test data a relative floor of ``1e-6`` gave 14% accuracy against 64% for the
  pseudo-inverse (and 64% for ``alpha2 = 0``). The pseudo-inverse ignores that component, as the
  published ``pinv`` does when its cut-off catches the round-off eigenvalue (when it does not,
  float32 ``pinv`` collapses the same way).
- The Tukey transform is the signed power, so negative features (LayerNorm outputs, most
  transformer embeddings) give ``-|x|^beta`` instead of NaN; on non-negative features it is the
  published ``x^beta``. ``beta = 0`` (the log transform) is not supported.
- A class whose covariance is zero (a single sample) gets ``R_c = I`` (Euclidean distance).
- ``o_c`` is the mean over all off-diagonal entries (the published code skips entries that are
  exactly zero, which real covariances do not have).
- ``l2=True`` normalises samples before the statistics, so the class means are the means of
  normalised samples (the published ViT code also re-normalises the means at distance time).
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import torch

from .._validation import as_device, as_dtype, as_features, as_labels, check_nonnegative
from ..state import State, json_params, nest, part
from ..stats import ClassGaussians, ClassStatistics
from .base import GaussianHead, NotFittedError, classes_to_forget, stack_rows
from .mapped import DEFAULT_MAX_BYTES, check_budget

__all__ = ["FECAM_PRESETS", "FeCAM", "fecam_covariances", "inverse_factors"]

FECAM_PRESETS: dict[str, dict] = {
    # ViT scripts: diagonal shrinkage only, L2-normalised features
    "vit": {"alpha1": 1.0, "alpha2": 0.0, "l2": True},
    # ImageNet-R script
    "imagenet_r": {"alpha1": 10.0, "alpha2": 10.0, "l2": True},
    # ResNet configuration: Tukey 0.5, the FeCAM paper's unit shrinkage [FeCAM]
    "resnet": {"alpha1": 1.0, "alpha2": 1.0, "tukey": 0.5},
}


def fecam_covariances(covs: torch.Tensor, alpha1: float, alpha2: float, *,
                      normalize: bool = True) -> torch.Tensor:
    """FeCAM's matrices ``R_c`` for a block of covariances ``(k, d, d)`` (see the module docstring)."""
    d = covs.shape[-1]
    eye = torch.eye(d, dtype=covs.dtype, device=covs.device)
    diag = covs.diagonal(dim1=-2, dim2=-1)
    v = diag.mean(-1)
    o = (covs.sum((-2, -1)) - diag.sum(-1)) / (d * (d - 1)) if d > 1 else torch.zeros_like(v)
    out = covs + (alpha1 * v - alpha2 * o)[:, None, None] * eye
    out += (alpha2 * o)[:, None, None]
    degenerate = ~(v > 0)
    if degenerate.any():
        out[degenerate] = eye
    if normalize:
        sd = out.diagonal(dim1=-2, dim2=-1).sqrt()
        out = out / (sd[:, :, None] * sd[:, None, :])
    return out


def inverse_factors(R: torch.Tensor, rcond: float = 1e-10) -> torch.Tensor:
    """Factors ``A_c`` with ``A_c^T A_c = R_c^+`` for symmetric PSD ``R`` ``(k, d, d)``, float64.

    ``L_c^{-1}`` (Cholesky) where ``R_c`` factors and ``1 / ||L_c^{-1}||_F^2``, a lower bound of
    its smallest eigenvalue, exceeds ``rcond tr(R_c)``, an upper bound of ``rcond`` times its
    largest; otherwise ``diag(s^{-1/2}) U^T`` from ``R_c = U diag(s) U^T`` with the eigenvalues
    ``s <= rcond max(s)`` dropped (their rows are zero): the pseudo-inverse.
    """
    eye = torch.eye(R.shape[-1], dtype=R.dtype, device=R.device)
    L, info = torch.linalg.cholesky_ex(R)
    A = torch.linalg.solve_triangular(L, eye.expand_as(L), upper=False)
    bound = 1.0 / A.square().sum((-2, -1))
    ok = (info == 0) & torch.isfinite(bound) & (bound > rcond * R.diagonal(dim1=-2, dim2=-1).sum(-1))
    bad = (~ok).nonzero(as_tuple=True)
    if bad[0].numel():
        s, U = torch.linalg.eigh(R[bad])
        keep = s > rcond * s[..., -1:].clamp_min(0.0)
        scale = torch.where(keep, s.clamp_min(torch.finfo(s.dtype).tiny).rsqrt(), torch.zeros_like(s))
        A[bad] = scale[..., :, None] * U.transpose(-1, -2)
    return A


class FeCAM(GaussianHead):
    """FeCAM's classifier as a gdacil head: ``g_c(x) = -1/2 (x - mu_c)^T R_c^{-1} (x - mu_c) + log pi_c``.

    The score is the squared Mahalanobis distance only, as FeCAM uses it: no log-determinant
    term, so ``predict_proba`` (a softmax of the scores) is not a Gaussian posterior. With the
    default uniform priors, ``predict`` is FeCAM's nearest class in Mahalanobis distance. See the
    module docstring for ``R_c`` and for what differs from the published code.

    Two ways to fit:

    - streaming: :meth:`partial_fit` / :meth:`fit` ``(X, y)`` take raw features, apply
      :meth:`transform` and keep :class:`~gdacil.ClassGaussians` (``stats_``); :meth:`merge`
      combines heads fitted on shards exactly;
    - from statistics: :meth:`fit_stats` (or ``fit(stats)``, like every
      :class:`~gdacil.heads.base.GaussianHead`) takes statistics of ALREADY transformed
      features (``head.transform(X)``; with the default ``tukey=None, l2=False`` the raw ones).

    Rows are rebuilt lazily at the next prediction, and only for classes whose statistics
    changed.

    Parameters
    ----------
    alpha1, alpha2 : float >= 0, default (1.0, 0.0)
    tukey : float > 0 or None, default None
        Tukey power ``beta`` (signed power ``sign(x) |x|^beta``).
    normalize : bool, default True
        Correlation normalisation of the shrunk covariance.
    l2 : bool, default False
        L2-normalise each sample (after Tukey), before statistics and at prediction.
    rcond : float in [0, 1), default 1e-10
        Eigenvalues of ``R_c`` below ``rcond`` times its largest are treated as zero
        (pseudo-inverse, see :func:`inverse_factors`); far above float64 round-off, far below
        any eigenvalue a shrunk covariance has.
    ddof : {0, 1}, default 1
        Covariance normalisation of the streaming statistics (FeCAM uses ``torch.cov``, 1);
        irrelevant when ``normalize=True``.
    max_bytes : int or None, default 16 GiB
        Refuse configurations whose statistics and rows would exceed it.
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    Notes
    -----
    Memory is ``C d^2`` numbers twice (the float64 statistics and the rows, in ``dtype``): at
    ``d = 768`` that is 4.7 GB + 4.7 GB (float64) for 1k classes and 47 GB + 47 GB for 10k,
    which the default ``max_bytes`` refuses; use :class:`~gdacil.heads.LRRGDA` there. Building
    costs ``C d^3`` flops (two triangular factorisations per class), scoring ``2 C d^2`` per
    sample.

    Use :meth:`FeCAM.preset` for the published settings: ``"vit"`` (``alpha1=1, alpha2=0``,
    L2), ``"imagenet_r"`` (``alpha1 = alpha2 = 10``, L2), ``"resnet"`` (Tukey 0.5,
    ``alpha1 = alpha2 = 1``).

    References
    ----------
    [FeCAM] D. Goswami, Y. Liu, B. Twardowski and J. van de Weijer. FeCAM: Exploiting the
    Heterogeneity of Class Distributions in Exemplar-Free Continual Learning. Advances in Neural
    Information Processing Systems 36 (NeurIPS 2023). arXiv:2309.14062;
    https://github.com/dipamgoswami/FeCAM

    Examples
    --------
    >>> import torch
    >>> from gdacil.heads import FeCAM
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.arange(300) % 3
    >>> X = torch.randn(300, 5, generator=g) + 3 * torch.nn.functional.one_hot(y, 5)
    >>> head = FeCAM().partial_fit(X[:150], y[:150]).partial_fit(X[150:], y[150:])
    >>> head.score(X, y) > 0.9
    True
    >>> FeCAM.preset("resnet").tukey
    0.5
    """

    _FORMAT: ClassVar[str] = "gdacil.FeCAM/1"

    def __init__(self, alpha1=1.0, alpha2=0.0, *, tukey=None, normalize=True, l2=False, rcond=1e-10,
                 ddof=1, priors=None, device=None, dtype="float64", class_batch_size="auto",
                 max_bytes=DEFAULT_MAX_BYTES):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.tukey = tukey
        self.normalize = normalize
        self.l2 = l2
        self.rcond = rcond
        self.ddof = ddof
        self.max_bytes = max_bytes

    #: the published settings (``"vit"``, ``"imagenet_r"``, ``"resnet"``)
    presets = FECAM_PRESETS

    @classmethod
    def preset(cls, name: str, **overrides) -> FeCAM:
        """A head with a published setting (``from_preset(name, **overrides)``)."""
        return cls.from_preset(name, **overrides)

    def _check_params(self) -> None:
        super()._check_params()
        check_nonnegative(self.alpha1, "alpha1")
        check_nonnegative(self.alpha2, "alpha2")
        if not 0.0 <= check_nonnegative(self.rcond, "rcond") < 1.0:
            raise ValueError(f"rcond must lie in [0, 1); got {self.rcond!r}")
        if self.tukey is not None and not check_nonnegative(self.tukey, "tukey") > 0:
            raise ValueError(f"tukey must be None or a power > 0 (the log transform, 0, is not "
                             f"supported); got {self.tukey!r}")
        if self.ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 or 1; got {self.ddof!r}")

    # ------------------------------------------------------------------ transform
    def transform(self, X) -> torch.Tensor:
        """The features FeCAM's statistics describe: signed Tukey power, then L2 (if enabled)."""
        X = as_features(X, dim=getattr(self, "n_features_in_", None), dtype=torch.float64)
        if self.tukey is not None:
            X = X.sign() * X.abs().pow(float(self.tukey))
        if self.l2:
            X = X / X.norm(dim=1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
        return X

    # ------------------------------------------------------------------ fitting
    def fit(self, stats, y=None, *, model_terms=None) -> FeCAM:
        """Build from statistics, as every head is (:meth:`fit_stats`). Returns ``self``.

        ``fit(X, y)`` on features is deprecated (features belong to the scikit-learn layer):
        it still forgets everything and takes them with a ``FutureWarning``; use
        ``FeCAM().partial_fit(X, y)`` or :class:`gdacil.sklearn.FeCAMClassifier`.
        """
        if y is None and isinstance(stats, ClassStatistics):
            return self.fit_stats(stats)
        if y is None:
            raise TypeError("FeCAM.fit takes statistics (a ClassStatistics)")
        warnings.warn("FeCAM.fit(X, y) is deprecated: heads are fitted on statistics; use "
                      "FeCAM().partial_fit(X, y) or gdacil.sklearn.FeCAMClassifier",
                      FutureWarning, stacklevel=2)
        self._reset()
        return self.partial_fit(stats, y)

    def fit_stats(self, stats: ClassStatistics) -> FeCAM:
        """Build from statistics of transformed features (kept by reference, copied before any
        later :meth:`partial_fit` or :meth:`merge` changes them). Returns ``self``.

        Refitting on statistics that changed only in some classes (the same object updated, or a
        :meth:`~gdacil.ClassStatistics.with_moments` copy) rebuilds only those classes.
        """
        if not isinstance(stats, ClassStatistics):
            raise TypeError(f"fit_stats expects ClassStatistics, got {type(stats).__name__}")
        if stats.n_classes == 0:
            raise ValueError("FeCAM.fit: the statistics hold no classes")
        self._check_params()
        check_budget(self, self._state_bytes(stats.dim, stats.n_classes))
        # built rows stay: the next build reuses those of classes whose revision is unchanged
        self.stats_, self._owns_stats = stats, False
        self.n_features_in_ = stats.dim
        return self

    def partial_fit(self, X, y) -> FeCAM:
        """Add a batch of raw features and integer labels (new classes allowed). Returns ``self``."""
        self._check_params()
        Z = self.transform(X)
        y = as_labels(y, n=Z.shape[0])
        stats = getattr(self, "stats_", None)
        if stats is not None and not isinstance(stats, ClassGaussians):
            raise ValueError(f"this FeCAM was fitted on {type(stats).__name__}, which cannot take "
                             "new samples exactly; fit it on ClassGaussians to add samples")
        n_classes = len(set(torch.unique(y).tolist()) | set(stats.classes if stats else []))
        check_budget(self, self._state_bytes(Z.shape[1], n_classes))
        own = self._own_stats(Z.shape[1])
        assert isinstance(own, ClassGaussians)  # checked above; a fresh one is dense
        own.update(Z, y)
        return self

    def merge(self, other: FeCAM) -> FeCAM:
        """Fold a FeCAM fitted on another shard (same parameters) into ``self``. Returns ``self``."""
        if not isinstance(other, FeCAM):
            raise TypeError(f"cannot merge a {type(other).__name__} into a FeCAM")
        if json_params(other.get_params()) != json_params(self.get_params()):
            raise ValueError(f"cannot merge heads with different parameters: {other!r} into {self!r}")
        if getattr(other, "stats_", None) is not None:
            if getattr(self, "stats_", None) is not None and self.stats_.dim != other.stats_.dim:
                raise ValueError(f"cannot merge features of dimension {other.stats_.dim} "
                                 f"into {self.stats_.dim}")
            own = self._own_stats(other.stats_.dim)
            own.merge(other.stats_)  # type: ignore[attr-defined]  # either storage merges
        return self

    def _own_stats(self, dim: int) -> ClassStatistics:
        if getattr(self, "stats_", None) is None:
            self.stats_, self._owns_stats = ClassGaussians(dim, ddof=self.ddof), True
            self.n_features_in_ = dim
        elif not self._owns_stats:
            self.stats_, self._owns_stats = self.stats_.copy(), True
        return self.stats_

    @property
    def classes_(self) -> torch.Tensor:
        """Class labels in the order of the score columns."""
        if getattr(self, "stats_", None) is None:
            raise NotFittedError("this FeCAM is not fitted yet")
        return torch.tensor(self.stats_.classes, dtype=torch.int64)

    @classes_.setter
    def classes_(self, value) -> None:
        """Set by ``GaussianHead.fit``; the statistics' order is the same."""

    def _reset(self) -> None:
        for name in ("stats_", "_owns_stats", "n_features_in_", "rows_", "bias_", "_built_"):
            self.__dict__.pop(name, None)

    def forget(self, classes, stats: ClassStatistics | None = None) -> FeCAM:
        """Forget ``classes``: out of the statistics, and rows rebuilt now, reusing those of the
        classes left (see :meth:`GaussianHead.forget <gdacil.heads.base.GaussianHead.forget>`).
        Returns ``self``.

        ``stats`` default to the head's own (``stats_``: what :meth:`partial_fit` and
        :meth:`merge` gathered, or a copy of those :meth:`fit_stats` took, which keep the
        classes). Its state, the statistics, then holds nothing of them.

        Examples
        --------
        >>> import torch
        >>> from gdacil.heads import FeCAM
        >>> g = torch.Generator().manual_seed(0)
        >>> X, y = torch.randn(90, 4, generator=g, dtype=torch.float64), torch.arange(90) % 3
        >>> head = FeCAM().partial_fit(X, y).forget(2)
        >>> head.classes_.tolist(), head.state_dict()[0]["stats.labels"].tolist()
        ([0, 1], [0, 1])
        """
        if stats is None:
            self._check_fitted()
            classes_to_forget(self, classes, self.stats_.classes)  # before taking a copy
            stats = self._own_stats(self.stats_.dim)
        super().forget(classes, stats)
        return self

    def _refit(self, stats: ClassStatistics) -> None:
        if stats is not getattr(self, "stats_", None):
            self.fit_stats(stats)
        self.build()

    # ------------------------------------------------------------------ building
    def _state_bytes(self, d: int, n_classes: int) -> int:
        itemsize = as_dtype(self.dtype).itemsize
        return n_classes * d * (8 * (d + 1) + itemsize * (d + 1) * 2)

    def _build_key(self) -> tuple:
        return (float(self.alpha1), float(self.alpha2), self.tukey, bool(self.normalize),
                bool(self.l2), float(self.rcond), as_dtype(self.dtype), as_device(self.device))

    def _ensure_built(self) -> None:
        stats = getattr(self, "stats_", None)
        if stats is None:
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")
        built = getattr(self, "_built_", None)
        current = (self._build_key(), stats.classes, [stats.revision(c) for c in stats.classes])
        if built is None or built != current:
            GaussianHead.fit(self, stats)
            self._built_ = current

    def _check_fitted(self) -> None:
        if getattr(self, "stats_", None) is None:
            raise NotFittedError("this FeCAM is not fitted yet; call fit(stats) first")

    def build(self) -> FeCAM:
        """Build the rows now (they are otherwise built on first use); returns ``self``."""
        self._ensure_built()
        return self

    def memory_report(self) -> dict[str, int]:
        self.build()
        return super().memory_report()

    def _prepare(self, X) -> torch.Tensor:
        self._ensure_built()
        return self.transform(X).to(dtype=self.dtype_, device=self.device_)

    def _novelty_features(self, X) -> torch.Tensor:
        self._ensure_built()
        return self.transform(X).to(device=self.device_)

    def _build(self, stats, log_priors):
        d = stats.dim
        reuse = self._reusable_rows(stats)
        todo = [c for c in stats.classes if c not in reuse]
        rows = torch.empty(stats.n_classes, 1 + d, d, dtype=self.dtype_, device=self.device_)
        bias = torch.empty(stats.n_classes, 1 + d, dtype=self.dtype_, device=self.device_)
        for c, (r, b) in reuse.items():
            p = stats.positions([c])[0]
            rows[p], bias[p] = r, b
        for labels, _, mu, covs in stats.iter_batches(self._block_size(d + 1), labels=todo):
            R = fecam_covariances(covs.to(self.device_), float(self.alpha1), float(self.alpha2),
                                  normalize=bool(self.normalize))
            A = inverse_factors(R, float(self.rcond))
            block, block_bias = stack_rows(torch.zeros(len(labels), d, dtype=torch.float64,
                                                       device=self.device_),
                                           torch.zeros(len(labels), dtype=torch.float64,
                                                       device=self.device_),
                                           A, -(A @ mu.to(self.device_)[:, :, None])[:, :, 0])
            pos = stats.positions(labels).to(self.device_)
            rows[pos], bias[pos] = block.to(self.dtype_), block_bias.to(self.dtype_)
        bias[:, 0] = log_priors.to(device=self.device_, dtype=self.dtype_)
        return rows, bias, -1.0

    def _reusable_rows(self, stats) -> dict:
        """Rows of classes unchanged since the last build (same parameters, same revision)."""
        built = getattr(self, "_built_", None)
        if built is None or built[0] != self._build_key() or not hasattr(self, "rows_"):
            return {}
        _, classes, revisions = built
        return {c: (self.rows_[i], self.bias_[i]) for i, (c, rev) in enumerate(zip(classes, revisions))
                if c in stats and stats.revision(c) == rev}

    def _extra_memory(self) -> dict[str, int]:
        return {"stats": self.stats_.nbytes}

    # ------------------------------------------------------------------ state
    def state_dict(self) -> State:
        """The parameters and the statistics (the rows are rebuilt from them on first use after
        :meth:`load_state_dict`)."""
        stats = getattr(self, "stats_", None)
        if stats is None:
            raise NotFittedError("this FeCAM is not fitted yet; it has no state")
        tensors, metadata = nest({"stats": stats.state_dict()})
        return tensors, {"format": self._FORMAT, "class": type(self).__name__,
                         "params": json_params(self.get_params()), **metadata}

    def load_state_dict(self, tensors, metadata, *, source: str = "the state") -> FeCAM:
        """Take the statistics of a :meth:`state_dict` (validated); returns ``self``."""
        if metadata.get("format") != self._FORMAT:
            raise ValueError(f"{source}: not a FeCAM state (format {metadata.get('format')!r})")
        self._reset()
        self.stats_ = ClassStatistics.from_state(part((tensors, metadata), "stats"),
                                                 source=source)
        self._owns_stats, self.n_features_in_ = True, self.stats_.dim
        return self
