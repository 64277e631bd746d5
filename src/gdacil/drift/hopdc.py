"""HopDC: Hopfield-based distribution compensation (a training-free drift compensator).

HopDC is the compensator of the LR-RGDA paper [LR-RGDA]; its retrieval is one update of a modern
continuous Hopfield network [Hopfield] (see docs/references.md).

Keys are the L2-normalised old anchor features, values the raw anchor drifts::

    K = normalize(F_old),   D = F_new - F_old                      (N, d)
    delta_hat(z) = softmax_topk(normalize(z) K^T / tau) D           (one Hopfield retrieval step)

Each old class is represented by ``M`` pseudo-samples from ``N(mu_c, Sigma_c)``; every sample is
shifted by its retrieved drift and the mean and covariance are re-estimated from the shifted
samples (:mod:`gdacil.drift.pseudo`).

Proposition 2 of the LR-RGDA paper bounds the per-query error by ``L * sum_i p_i ||k_i - z||``
for a drift field with Lipschitz constant ``L``, and (normalised keys and query) by
``L * (min_i ||k_i - z|| + sqrt(2 tau log k))``; :meth:`HopDC.drift_at` and
:meth:`HopDC.attention` expose the retrieval so both can be checked.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar

import torch

from .._validation import check_positive_int
from .attention import attention_weights, retrieve
from .base import (
    Compensator,
    check_positive_float,
    check_probability,
    l2_normalize_rows,
    resolve_dtype,
)
from .pseudo import PseudoSampling
from .sldc import LinearSLDC

__all__ = ["SHRINK_FOLDS", "HopDC"]

#: Interleaved folds of anchors (anchor ``i`` in fold ``i mod 5``) that ``shrink`` holds out
SHRINK_FOLDS = 5


@dataclasses.dataclass(eq=False, kw_only=True)
class HopDC(PseudoSampling, Compensator):
    """Training-free drift compensation by top-k Hopfield retrieval of anchor drifts.

    Two presets: :meth:`recommended` (the constructor's defaults, what ``{name: hopdc}`` in a
    config builds) and :meth:`paper` (exactly as the LR-RGDA paper [LR-RGDA] specifies:
    ``{name: hopdc, defaults: paper}``). They differ in three values. ``match_moments``: the
    pseudo-samples are centred and whitened so that they carry each class's stored moments
    exactly; the paper's fresh samples re-estimate every covariance at every task, and that
    sampling error compounds. ``linear``: only what alpha1-SLDC's linear map leaves of the drift
    is retrieved, so the map moves every class, also those far from the anchors. ``shrink``: the
    retrieval is scaled by a factor cross-validated on the anchors, so where the anchors' drifts
    are not predictable from their neighbours HopDC falls back towards that map. The
    measurements behind each choice, on text and on images, are in ``docs/compensators.md``.

    Parameters
    ----------
    tau : float, default 0.05
        Softmax temperature (the LR-RGDA paper's value).
    topk : int or None, default 400
        Softmax over each query's ``topk`` largest logits only (the LR-RGDA paper's value);
        ``None`` uses all anchors. With fewer anchors than ``topk``, ``fit`` warns and all
        anchors are used (as the reference code does).
    n_samples : int, default 2000
        ``M``, pseudo-samples per class. The LR-RGDA paper does not state it; 2000 is the
        reference code's value. The covariance is re-estimated from ``M`` samples, so its
        relative sampling error is about ``sqrt((r_eff + 1) / M)`` for a class of effective rank
        ``r_eff = tr(Sigma)^2 / tr(Sigma^2)`` (about 0.1 to 0.16 for ``r_eff`` 20 to 50); cost is
        linear in ``M``. ``match_moments`` removes the sampling error of the affine part.
    damping : float, default 0
        Fraction of the old moments kept after re-estimation. The LR-RGDA paper has none (0); the
        reference code uses 0.1 (``0.9 new + 0.1 old``).
    shared_noise : bool, default True
        One standard-normal block for all classes (common random numbers, as the reference code
        does) or one per class.
    match_moments : {"auto", True, False}, default "auto"
        Centre and whiten the noise so the pseudo-samples reproduce the stored moments exactly
        (see :mod:`gdacil.drift.pseudo`); then a drift that is locally affine moves the moments
        without sampling error. gdacil's choice, not in the LR-RGDA paper (whose preset has
        ``False``). It needs ``n_samples > d``: ``True`` raises at ``fit`` otherwise, ``"auto"``
        (the recommended preset) then falls back to plain samples, as in that paper, with a
        ``UserWarning``. The fitted ``match_moments_`` says which was used.
    linear : bool, default True
        Retrieve what is left of the drift after a linear map: fit alpha1-SLDC's map ``W``
        (:class:`~gdacil.drift.LinearSLDC`, its recommended preset) on the same anchors, store
        the residual drifts ``F_new - F_old W`` as values, and push every pseudo-sample ``z``
        to ``z W + delta_hat(z)``. What of the drift is linear is then carried by ``W``
        everywhere, also far from the anchors, and the retrieval corrects only the rest.
        gdacil's choice, not in the LR-RGDA paper (whose preset has ``False``). A translation
        is then no longer reproduced exactly (``W``, fitted on normalised anchors, is not the
        identity); with ``linear=False`` it is.
    shrink : bool, default True
        Scale the retrieved drift by ``gamma_`` in ``[0, 1]``, chosen on the anchors alone: each
        of :data:`SHRINK_FOLDS` interleaved folds of anchors has its values retrieved from the
        other folds, and ``gamma_ = <R_hat, R> / ||R_hat||^2`` (clipped to ``[0, 1]``) is the
        least-squares factor between the retrieved values ``R_hat`` and the held-out ones
        ``R``. Where the anchors' (residual) drifts are not predictable from their neighbours,
        the retrieval then adds little of them (with ``linear``, HopDC falls back towards
        alpha1-SLDC's map); where they are, ``gamma_`` is near 1. gdacil's choice, not in the
        LR-RGDA paper (whose preset has ``False``).
    jitter : float, default 0
        Sample from ``N(mu, Sigma + jitter I)``. The reference code uses 1e-4 (on LayerNorm
        features). With 0, rank-deficient covariances (classes with ``n <= d``) are sampled
        exactly, through an eigendecomposition factor (:func:`gdacil.stats.linalg.psd_factor`).
    chunk_size : int, default 1024
        Queries per attention block; peak attention memory is ``chunk_size x N``.
    class_batch : int, default 8
        Classes sampled and re-estimated together (memory ``class_batch x M x d`` float64).
    dtype : {"float32", "float64"} or torch.dtype, default "float32"
        Precision of the attention (keys, values, logits). Sampling and re-estimation are float64.
    seed : int or torch.Generator, default 0
        Source of the pseudo-sample noise. An int gives the same draws on every ``transform``.

    Attributes
    ----------
    keys_ : tensor (N, d)
        L2-normalised old anchor features.
    values_ : tensor (N, d)
        Anchor drifts ``F_new - F_old`` (with ``linear``: ``F_new - F_old W``).
    linear_map_ : tensor (d, d), float64
        ``W``, only with ``linear``.
    gamma_ : float
        The factor of the retrieved drift (1 without ``shrink``); ``values_`` hold the drifts
        times ``gamma_``.
    match_moments_ : bool
        Whether the pseudo-samples are moment-matched.

    References
    ----------
    [LR-RGDA] X. Rao, M. Ha, B. Zhao, D. Liu and C. Alippi. Scalable Analytic Classifiers with
    Associative Drift Compensation for Class-Incremental Learning of Vision Transformers.
    arXiv:2602.00144, 2026 (HopDC, its defaults and Proposition 2).

    [Hopfield] H. Ramsauer et al. Hopfield Networks is All You Need. International Conference on
    Learning Representations (ICLR), 2021. arXiv:2008.02217

    [UHN] B. Millidge, T. Salvatori, Y. Song, T. Lukasiewicz and R. Bogacz. Universal Hopfield
    Networks: A General Framework for Single-Shot Associative Memory Models. ICML 2022,
    PMLR 162:15561-15583.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.drift import HopDC
    >>> g = torch.Generator().manual_seed(0)
    >>> old = torch.randn(500, 8, generator=g)
    >>> new = old + 0.5                      # every anchor moves by +0.5
    >>> stats = ClassGaussians(8).update(torch.randn(60, 8, generator=g), torch.arange(60) % 3)
    >>> hop = HopDC(topk=50, n_samples=64, linear=False)   # moment-matched: 64 samples > d = 8
    >>> out = hop.fit(old, new).transform(stats)   # a translation: moments reproduced exactly
    >>> torch.allclose(out.means, stats.means + 0.5), torch.allclose(out.covariances(),
    ...                                                              stats.covariances())
    (True, True)
    >>> torch.allclose(hop.drift_at(old[:3]), torch.full((3, 8), 0.5, dtype=torch.float64))
    True
    """

    _state_attributes = (*Compensator._state_attributes, "match_moments_", "keys_", "values_",
                         "linear_map_", "gamma_")
    name: ClassVar[str] = "hopdc"
    #: ``recommended``: the constructor's defaults; ``paper``: the LR-RGDA paper's HopDC.
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "recommended": {},
        "paper": {"tau": 0.05, "topk": 400, "damping": 0.0, "match_moments": False,
                  "linear": False, "shrink": False},
    }
    _normalized_sets: ClassVar[tuple[str, ...]] = ("old_features",)

    tau: float = 0.05
    topk: int | None = 400
    damping: float = 0.0
    match_moments: bool | str = "auto"
    linear: bool = True
    shrink: bool = True
    chunk_size: int = 1024
    dtype: str | torch.dtype = "float32"

    @classmethod
    def recommended(cls, **overrides) -> HopDC:
        """gdacil's HopDC (the constructor's defaults): the LR-RGDA paper's values, with
        moment-matched pseudo-samples where ``n_samples > d`` (``match_moments="auto"``), the
        drift retrieved around alpha1-SLDC's linear map (``linear=True``) and the retrieval
        shrunk by a factor cross-validated on the anchors (``shrink=True``)."""
        return cls.from_preset("recommended", **overrides)

    @classmethod
    def paper(cls, **overrides) -> HopDC:
        """HopDC exactly as the LR-RGDA paper specifies it: ``tau = 0.05``, ``topk = 400``,
        plain pseudo-samples (``match_moments=False``), the whole drift retrieved
        (``linear=False``) and not shrunk (``shrink=False``), no damping."""
        return cls.from_preset("paper", **overrides)

    def _check_params(self) -> None:
        check_positive_float(self.tau, "tau")
        if self.topk is not None:
            check_positive_int(self.topk, "topk")
        check_probability(self.damping, "damping")
        for name in ("linear", "shrink"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")
        check_positive_int(self.chunk_size, "chunk_size")
        resolve_dtype(self.dtype)
        self._check_sampling_params()

    def _fit(self, old, new) -> None:
        n, d = old.shape
        if self.topk is not None and self.topk > n:
            warnings.warn(f"topk={self.topk} exceeds the number of anchors N={n}: the softmax "
                          f"runs over all {n} anchors (as with topk=None)", UserWarning,
                          stacklevel=3)
        self.match_moments_ = self._resolve_match_moments(d)
        dtype = resolve_dtype(self.dtype)
        self.keys_ = l2_normalize_rows(old).to(dtype)
        self.__dict__.pop("linear_map_", None)
        if self.linear:
            # contiguous: the products then round as they will after a state round trip
            sldc = LinearSLDC()
            sldc.fit(old, new)
            self.linear_map_ = sldc.W_.contiguous()
            old = sldc.map_points(old)
        values = (new - old).to(dtype)
        self.gamma_ = self._cross_validated_gain(values) if self.shrink else 1.0
        self.values_ = values * self.gamma_

    def _cross_validated_gain(self, values: torch.Tensor) -> float:
        """``gamma`` of the ``shrink`` parameter: the least-squares factor, clipped to [0, 1],
        between each fold's values retrieved from the other folds and its own values."""
        n = values.shape[0]
        if n < 2 * SHRINK_FOLDS:
            return 1.0  # too few anchors to hold any out: retrieve as fitted
        fold = torch.arange(n, device=values.device) % SHRINK_FOLDS
        dot = norm = 0.0
        for f in range(SHRINK_FOLDS):
            out, kept = fold == f, fold != f
            retrieved = retrieve(self.keys_[out], self.keys_[kept], values[kept],
                                 scale=1.0 / self.tau, topk=self.topk,
                                 chunk_size=self.chunk_size).double()
            dot += float((retrieved * values[out].double()).sum())
            norm += float(retrieved.square().sum())
        return min(max(dot / norm, 0.0), 1.0) if norm > 0.0 else 1.0

    def load_state_dict(self, tensors, metadata, *, source: str = "the state") -> HopDC:
        super().load_state_dict(tensors, metadata, source=source)
        # states saved before ``shrink`` existed hold unscaled values: their factor was 1
        self.__dict__.setdefault("gamma_", 1.0)
        return self

    # ------------------------------------------------------------------ retrieval
    def _queries(self, queries) -> torch.Tensor:
        self._check_fitted()
        Q = torch.as_tensor(queries)
        if Q.ndim != 2 or Q.shape[1] != self.dim_:
            raise ValueError(f"queries must have shape (m, {self.dim_}); got {tuple(Q.shape)}")
        if not torch.isfinite(Q).all():
            raise ValueError("queries contain NaN or inf")
        return l2_normalize_rows(Q.to(device=self.keys_.device, dtype=self.keys_.dtype))

    def attention(self, queries) -> torch.Tensor:
        """Dense weights ``p (m, N)`` of each query over the anchors (zero outside its top-k).

        Materialises ``m x N``; for diagnostics and tests. :meth:`drift_at` is chunked.
        """
        return attention_weights(self._queries(queries), self.keys_, scale=1.0 / self.tau,
                                 topk=self.topk)

    def drift_at(self, queries) -> torch.Tensor:
        """Retrieved drift ``delta_hat(z) = sum_i p_i(z) (F_new - F_old)_i`` for each query row.

        Queries are L2-normalised first; the result is float64, shape ``(m, d)``, on the queries'
        device.
        """
        device = torch.as_tensor(queries).device
        return retrieve(self._queries(queries), self.keys_, self.values_, scale=1.0 / self.tau,
                        topk=self.topk, chunk_size=self.chunk_size).to(device, torch.float64)

    # ------------------------------------------------------------------ statistics
    def _transform(self, stats, labels):
        W = self.__dict__.get("linear_map_")
        W = None if W is None else W.to(stats.device)

        def push(Z: torch.Tensor) -> torch.Tensor:
            return (Z if W is None else Z @ W) + self.drift_at(Z)

        return self._resample(stats, labels, push, damping=self.damping)
