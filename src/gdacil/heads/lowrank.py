"""LR-RGDA: RGDA whose class covariances are rank-r perturbations of a shared base.

The model of Rao et al., the LR-RGDA paper [LR-RGDA] (docs/references.md lists this and every
other work the docstrings cite by key), computed as follows.

With ``B = alpha2 Sigma_avg + alpha3 u I`` (``u`` the unit of ``identity_scale``) and the top-r eigenpairs ``(U_c, s_c)`` of ``Sigma_c``,
``Sigma_c^reg ~= B + Ut_c Ut_c^T`` where ``Ut_c = sqrt(alpha1) U_c diag(sqrt(s_c))``. Woodbury and
the matrix determinant lemma give, with ``M_c = I_r + Ut_c^T B^{-1} Ut_c``::

    g_c(x) = w_c^T x + b_c + 1/2 (x - mu_c)^T P_c^T M_c^{-1} P_c (x - mu_c),   P_c = Ut_c^T B^{-1}
    w_c = B^{-1} mu_c
    b_c = -1/2 mu_c^T B^{-1} mu_c - 1/2 (logdet B + logdet M_c) + log pi_c

which is the exact discriminant of the rank-r model plus ``1/2 x^T B^{-1} x`` (the same for every
class). We compute ``P_c = Ut_c^T B^{-1}`` with one GEMM against ``B^{-1}`` (from the Cholesky factor of
``B``), then ``M_c = I + P_c Ut_c``, an ``r x r`` product. Diagonalising
``P_c Ut_c = W_c diag(sigma_c^2) W_c^T`` folds ``M_c^{-1}`` into the projection,
``A_c = diag(1 + sigma_c^2)^{-1/2} W_c^T P_c``, so scoring is one GEMM against the stacked
``(C (r + 1), d)`` rows plus a squared norm: ``1/2 ||A_c (x - mu_c)||^2``.

Row ``i`` of ``A_c`` is ``sqrt(kappa_ci)`` times a unit direction in ``B``-whitened space, with
``kappa_ci = sigma_ci^2 / (1 + sigma_ci^2) < 1`` descending. That ordering is what exact pruned
inference (:meth:`LRRGDA.top_k`) uses: the first ``j`` rows give a lower bound of the quadratic
term and, with ``kappa_{c,j+1}`` times the rest of the ``B``-Mahalanobis distance, an upper bound.
Those first rows may be computed in a lower precision (bfloat16 under a float32 head): the bounds
widen by an a-priori bound of the rounding error, so the pruned result stays exact.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .._deprecation import renamed_parameters
from .._hardware import native_bfloat16
from .._validation import all_finite, check_positive_int, check_seed
from ..novelty import DEFAULT_SCORE
from ..state import State
from ..stats import ClassStatistics, LowRankGaussians
from ..stats.linalg import class_top_eigh, logdet_from_cholesky, psd_cholesky, symmetrize
from .base import GaussianHead
from .rgda import (
    DEFAULT_ALPHAS,
    PAPER_SETTING,
    base_covariance_terms,
    check_alphas,
    check_identity_scale,
    mean_regularized_covariance,
)

__all__ = ["LRRGDA"]

#: ``top_k(pruned="auto")``: samples in the pilot batch, and what one (sample, class, row)
#: product of the pruned rounds costs against one of dense scoring (gathered, padded GEMMs over
#: scattered pairs: 1.7-2.9 measured at 1,000-10,000 classes). The pilot is pruned with the
#: rows of a dense pass as its budget, the rounds' rows counted at that price; pruning goes on
#: if it finished within it. Whether pruning pays depends on how fast the rounds drop pairs,
#: not on how many pass the screening: with 90% passing, a pruned argmax still ran at 1.9x.
AUTO_PILOT = 64
ROUND_ROW_COST = 2.5
#: ... and a pilot stops right after its screening (about (j + 1) / (r + 1) of a dense pass)
#: when more than this share of its pairs passed: the rounds would then spend most of its
#: budget before dropping any (top-5 lists under the default regularisation: 99-100% pass)
AUTO_MAX_PASS = 0.9
#: ... and its verdict (prune or score densely) holds for this many later calls with the same
#: ``k`` and screening before a pilot runs again: it depends on the head and ``k`` far more than
#: on the queries, and a pilot that gives up costs up to a dense pass of its samples (a tenth of
#: a 1,024-sample top-5 call at 10,000 classes; all of a call of a few samples)
AUTO_VERDICT_CALLS = 32
#: From this many classes ``pruned="auto"`` tries pruning (and ``predict`` takes the exact
#: pruned argmax, ``top_k(X, 1)``): 3.7-4.8x dense at 1,000 classes in ``gdacil bench scale``,
#: while on small heads the screening costs more than it saves (0.1-0.3x dense at 60-120
#: classes); smaller heads score densely
AUTO_MIN_CLASSES = 1000
#: ``top_k(screen_rank="auto")``: the share of a head's rank that the screening computes for
#: every class (16 of 64 rows: the fastest exact argmax of ``gdacil bench scale`` at 2,000
#: classes under the default regularisation, in bfloat16 and in float32 screening)
SCREEN_SHARE = 0.25


def default_screen_rank(rank: int) -> int:
    """Rows screened for every class by ``top_k(screen_rank="auto")`` in a head of ``rank``."""
    return max(1, round(SCREEN_SHARE * rank))

#: Classes (of those with candidate pairs) per batched GEMM when the pruned top-k scores its pairs
_RESCORE_CLASSES = 16
#: ... scored against every sample (one plain GEMM, no gather) when one of them needs at least
#: this share of the samples: a padded, gathered GEMM then costs more
_DENSE_SHARE = 1 / 3


def _fast_screen_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The lower precision that screens faster than ``dtype`` on ``device``, else ``dtype``."""
    if device.type != "cpu":
        return dtype
    if dtype == torch.float64:
        return torch.float32
    return torch.bfloat16 if dtype == torch.float32 and native_bfloat16(device) else dtype


def _lowered_gemm_error(dtype: torch.dtype, exact: torch.dtype, dim: int) -> float:
    """``eps`` with ``|fl(a^T x) - a^T x| <= eps ||a|| ||x||`` for a dot product of length ``dim``
    computed from ``exact``-precision inputs rounded to ``dtype``, accumulated in float32 and
    rounded to ``dtype``, where ``x`` itself was rounded once in ``exact`` precision (centring).

    Input rounding, accumulation (``gamma_dim``) and output rounding compose to
    ``(1 + u)^3 (1 + gamma) - 1`` of ``sum |a_i x_i| <= ||a|| ||x||``; the 1% on top covers
    the computed norms."""
    u, v = torch.finfo(dtype).eps / 2, torch.finfo(exact).eps / 2
    gamma = dim * 2.0 ** -24 / (1.0 - dim * 2.0 ** -24)
    return 1.01 * ((1.0 + u) ** 3 * (1.0 + gamma) - 1.0 + 2.0 * v)


def _row_products(rows: torch.Tensor, x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``rows @ x`` for rows ``(C, j, d)``, accumulated in float64, in the rows' dtype."""
    out = torch.empty(rows.shape[:2], dtype=rows.dtype, device=rows.device)
    for a in range(0, rows.shape[0], block):
        out[a:a + block] = (rows[a:a + block].double() @ x.double()).to(rows.dtype)
    return out


def _mahalanobis(sq_norm: torch.Tensor, lin: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``(x-mu)^T B^-1 (x-mu) = x^T B^-1 x - 2 (lin - b) + mu^T B^-1 mu`` from the linear score
    ``lin`` and ``offset = mu^T B^-1 mu + 2 b`` (clamped at 0 against rounding)."""
    return torch.add(offset, lin, alpha=-2.0).add_(sq_norm).clamp_min_(0.0)


_EIG_U, _EIG_S = "_eig_cache.U", "_eig_cache.s"  # names kept from the first stored heads


class LRRGDA(GaussianHead):
    """Low-rank regularised Gaussian discriminant analysis (LR-RGDA, Rao et al. [LR-RGDA]).

    Parameters
    ----------
    rank : int, default 64
        Rank ``r`` of each class's covariance perturbation (``r = d`` reproduces :class:`RGDA`).
    alpha1, alpha2, alpha3 : float >= 0, default (0.1, 2.0, 0.6)
        gdacil's defaults (:data:`~gdacil.heads.rgda.DEFAULT_ALPHAS`; the LR-RGDA paper's are
        (0.2, 2.0, 0.5) with an absolute identity term, :meth:`paper`).
        ``alpha2 Sigma_avg + alpha3 u I`` must be positive definite (``alpha3 > 0`` guarantees it).
    identity_scale : {"samples", "trace", "absolute"}, default "samples"
        The unit ``u`` of the identity term: ``tr(Sigma_avg) / (N - C)`` for ``N`` samples of
        ``C`` classes (a ridge that shrinks as samples accumulate), ``tr(Sigma_avg) / d``, or 1
        (the LR-RGDA paper's). The first two make predictions independent of the features' units
        (raw, LayerNorm or L2-normalised). See :data:`~gdacil.heads.rgda.IDENTITY_SCALES`.
    decomposition : {"eigh", "randomized"}, default "eigh"
        How the top-r eigenpairs of each ``Sigma_c`` are found: an exact symmetric
        eigendecomposition, or seeded randomized subspace iteration with ``oversample`` extra
        columns, checked for convergence (rounds of ``n_iter`` power iterations until every
        top-r Ritz pair has a residual below ``1e-10`` of the top eigenvalue, an exact
        decomposition after 32), so both give the exact rank-r model. ``gdacil bench
        decomposition`` measured ``eigh`` as fast or faster at ``d`` = 384 and 768, ``r`` = 64:
        sample covariances of about ``d`` samples have nearly equal eigenvalues around ``r``,
        where four unchecked power iterations left the rank-r model 30-50% off.
    oversample : int, default 16
    n_iter : int, default 4
        Power iterations per round of the randomized decomposition.
    seed : int, default 0
        Seed of the randomized decomposition: every random choice takes this seed. Each class
        draws its own test matrix from ``(seed, label)``, so results do not depend on class
        order or batching. The former name ``random_state`` is a deprecated alias.
    priors, device, dtype, class_batch_size
        See :class:`~gdacil.heads.base.GaussianHead`.

    Notes
    -----
    Refitting after classes were added (or changed) decomposes only the new or changed classes:
    the head caches each class's eigenpairs keyed by the statistics' revision of that class. The
    terms that depend on ``B`` (which moves with ``Sigma_avg``) are recomputed for all classes,
    which costs ``O(C d^2 r)`` in GEMMs: in float64 for float64 heads, in float32 (twice as
    fast) for heads stored in a lower precision. Eigendecompositions always run in float64.

    References
    ----------
    [LR-RGDA] X. Rao, M. Ha, B. Zhao, D. Liu and C. Alippi. Scalable Analytic Classifiers with
    Associative Drift Compensation for Class-Incremental Learning of Vision Transformers.
    arXiv:2602.00144, 2026.

    [Woodbury] W. W. Hager. Updating the Inverse of a Matrix. SIAM Review 31(2):221-239, 1989.

    [RSVD] N. Halko, P.-G. Martinsson and J. A. Tropp. Finding Structure with Randomness.
    SIAM Review 53(2):217-288, 2011 (``decomposition="randomized"``).

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.heads import LRRGDA
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(600, 16, generator=g), torch.arange(600) % 3
    >>> X[y == 2] += 2.0
    >>> stats = ClassGaussians(16).update(X, y)
    >>> head = LRRGDA(rank=4).fit(stats)
    >>> head.predict(X[:5]).shape, head.rows_.shape
    (torch.Size([5]), torch.Size([3, 5, 16]))
    """

    default_novelty: ClassVar[str] = DEFAULT_SCORE
    # set by fit (from what _build returns): what the pruned search of top_k bounds scores with
    kappa_: torch.Tensor
    mean_precision_: torch.Tensor
    base_whitener_: torch.Tensor
    center_: torch.Tensor

    @renamed_parameters(random_state="seed")
    def __init__(self, rank=64, alpha1=DEFAULT_ALPHAS[0], alpha2=DEFAULT_ALPHAS[1],
                 alpha3=DEFAULT_ALPHAS[2], *, identity_scale="samples", decomposition="eigh",
                 oversample=16, n_iter=4, seed=0, priors=None, device=None,
                 dtype="float64", class_batch_size="auto"):
        super().__init__(priors=priors, device=device, dtype=dtype, class_batch_size=class_batch_size)
        self.rank = rank
        self.alpha1 = alpha1
        self.alpha2 = alpha2
        self.alpha3 = alpha3
        self.identity_scale = identity_scale
        self.decomposition = decomposition
        self.oversample = oversample
        self.n_iter = n_iter
        self.seed = seed

    #: ``paper``: the LR-RGDA paper's alphas (0.2, 2.0, 0.5) with an absolute identity term
    presets: ClassVar[dict[str, dict[str, Any]]] = {"paper": PAPER_SETTING}

    @classmethod
    def paper(cls, rank=64, **params):
        """The LR-RGDA paper's setting (``from_preset("paper", rank=rank, **params)``)."""
        return cls.from_preset("paper", rank=rank, **params)

    _state_attributes = (*GaussianHead._state_attributes, "identity_scale_", "n_decomposed_",
                         "kappa_", "mean_precision_", "base_whitener_", "center_",
                         "linear_bias_")

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.rank, "rank")
        check_alphas(self.alpha1, self.alpha2, self.alpha3)
        check_identity_scale(self.identity_scale)
        if self.decomposition not in ("randomized", "eigh"):
            raise ValueError(f"decomposition must be 'randomized' or 'eigh'; got {self.decomposition!r}")
        check_positive_int(self.oversample, "oversample", minimum=0)
        check_positive_int(self.n_iter, "n_iter", minimum=0)
        check_seed(self.seed)

    # ------------------------------------------------------------ state
    def state_dict(self) -> State:
        """The fitted head and, when current, the eigenpairs of every class (recomputing them is
        what makes a refit slow: stored, the first fit after loading decomposes only the classes
        that changed)."""
        tensors, metadata = super().state_dict()
        cache, key = self.__dict__.get("_eig_cache"), self.__dict__.get("_eig_cache_key")
        if (isinstance(cache, dict) and key and key[0] in ("eigh", "randomized")
                and list(cache) == self.classes_.tolist()):
            pairs = list(cache.values())
            tensors[_EIG_U] = torch.stack([p[1] for p in pairs]).cpu().contiguous()
            tensors[_EIG_S] = torch.stack([p[2] for p in pairs]).cpu().contiguous()
            metadata["eigenpairs"] = list(key)
        return tensors, metadata

    def load_state_dict(self, tensors, metadata, *, source: str = "the state") -> LRRGDA:
        tensors = dict(tensors)
        U, s = tensors.pop(_EIG_U, None), tensors.pop(_EIG_S, None)
        super().load_state_dict(tensors, metadata, source=source)
        key = metadata.get("eigenpairs")
        self._stored_eigenpairs = (U, s, tuple(key)) if U is not None and s is not None and key \
            else None
        return self

    def bind(self, stats: ClassStatistics) -> LRRGDA:
        """Take the stored eigenpairs as those of ``stats``, the statistics this head was fitted
        on (unless they were computed another way: another rank or method)."""
        stored = self.__dict__.pop("_stored_eigenpairs", None)
        if stored is None:
            return self
        U, s, key = stored
        if (key != self._decomposition_key(stats.dim) or stats.classes != self.classes_.tolist()
                or not U.shape[0] == s.shape[0] == stats.n_classes):
            return self
        U, s = U.to(self.device_, copy=True), s.to(self.device_, copy=True)
        self._eig_cache = {c: (stats.revision(c), U[i], s[i])
                           for i, c in enumerate(stats.classes)}
        self._eig_cache_key = key
        return self

    def forget(self, classes, stats: ClassStatistics) -> LRRGDA:
        """Forget ``classes`` (see :meth:`GaussianHead.forget
        <gdacil.heads.base.GaussianHead.forget>`): the refit decomposes no class, keeps the
        cached eigenpairs of the classes left and drops those of the classes forgotten, and a
        loaded head's stored eigenpairs not yet bound (:meth:`bind`) go too.

        Examples
        --------
        >>> import torch
        >>> from gdacil import ClassGaussians
        >>> from gdacil.heads import LRRGDA
        >>> g = torch.Generator().manual_seed(0)
        >>> X, y = torch.randn(300, 8, generator=g, dtype=torch.float64), torch.arange(300) % 3
        >>> stats = ClassGaussians(8).update(X, y)
        >>> head = LRRGDA(rank=2).fit(stats).forget([0], stats)
        >>> head.n_decomposed_, head.state_dict()[0]["_eig_cache.U"].shape
        (0, torch.Size([2, 8, 2]))
        """
        super().forget(classes, stats)
        self.__dict__.pop("_stored_eigenpairs", None)
        return self

    # ------------------------------------------------------------ eigenpairs
    def _decomposition_key(self, dim: int) -> tuple:
        r = min(self.rank, dim)
        if self.decomposition == "eigh" or r + self.oversample >= dim:
            return ("eigh", r)
        return ("randomized", r, self.oversample, self.n_iter, self.seed)

    def _eigenpairs(self, stats: ClassStatistics, block: int):
        """``(U, s)`` of every class, reusing cached pairs of unchanged classes.

        :class:`~gdacil.LowRankGaussians` of rank ``q >= r`` already hold the top eigenpairs:
        the cache then holds views of their storage (no decomposition, no copy;
        ``n_decomposed_ = 0``) and ``decomposition`` is not used.
        """
        key = self._decomposition_key(stats.dim)
        if isinstance(stats, LowRankGaussians):
            if stats.rank < key[1]:
                raise ValueError(
                    f"LR-RGDA rank {self.rank} exceeds the rank q = {stats.rank} of the low-rank "
                    f"statistics; use rank <= {stats.rank}, or compress with rank >= {key[1]}")
            # views of the statistics' storage (copied only to reach another device)
            U, s = (t.to(self.device_) for t in stats.eigenpairs(rank=key[1]))
            self._eig_cache = {c: (stats.revision(c), U[i], s[i])
                               for i, c in enumerate(stats.classes)}
            self._eig_cache_key = ("stored", key[1])
            self.n_decomposed_ = 0
            return
        # a new dict: a failed fit leaves the previous cache as it was
        cache = dict(getattr(self, "_eig_cache", {}))
        if getattr(self, "_eig_cache_key", None) != key:
            cache = {}
        stale = [c for c in stats.classes if cache.get(c, (None,))[0] != stats.revision(c)]
        for start in range(0, len(stale), block):
            labels = stale[start : start + block]
            covs = stats.covariances(labels).to(self.device_)
            U, s = self._decompose(covs, labels, key)
            for i, c in enumerate(labels):
                cache[c] = (stats.revision(c), U[i], s[i])
        self._eig_cache = {c: cache[c] for c in stats.classes}
        self._eig_cache_key = key
        self.n_decomposed_ = len(stale)

    def _decompose(self, covs, labels, key):
        return class_top_eigh(covs, key[1], labels, decomposition=key[0],
                              oversample=self.oversample, n_iter=self.n_iter,
                              seed=self.seed)

    # ----------------------------------------------------------------- build
    def _build(self, stats, log_priors):
        a1, a2, a3 = check_alphas(self.alpha1, self.alpha2, self.alpha3)
        if a2 == 0.0 and a3 == 0.0:
            raise ValueError("LR-RGDA needs alpha2 > 0 or alpha3 > 0: its base "
                             "B = alpha2 Sigma_avg + alpha3 I must be positive definite")
        d = stats.dim
        eye = torch.eye(d, dtype=torch.float64, device=self.device_)
        avg, a3, self.identity_scale_ = base_covariance_terms(
            stats, lambda: self._average_covariance(stats), self._model_size(stats), a2, a3,
            self.identity_scale, self.device_)
        L_B = psd_cholesky(a2 * avg + a3 * eye, name="LR-RGDA base B = alpha2 Sigma_avg + alpha3 I")
        L_B_inv = torch.linalg.solve_triangular(L_B, eye, upper=False)
        logdet_B = logdet_from_cholesky(L_B)
        r = min(self.rank, d)
        block = self._block_size(r + 1)
        self._eigenpairs(stats, block)

        mu = stats.means.to(self.device_)
        B_inv = symmetrize(L_B_inv.T @ L_B_inv)
        B_inv_mu = mu @ B_inv
        # heads stored below float64 run the per-class products in float32: twice the GEMM rate,
        # on Ut / u and u^2 B^-1, u a power of two near the features' scale, which keeps them
        # inside float32's range at any scale (exactly: the products are those of Ut and B^-1
        # scaled by powers of two; 1e25-scale features had B^-1 flush to 0)
        work = torch.float64 if self.dtype_ == torch.float64 else torch.float32
        u = 1.0 if work == torch.float64 else math.ldexp(1.0, int(torch.frexp(
            L_B.diagonal().amax()).exponent))
        B_inv_work = (B_inv * (u * u)).to(work)
        labels = stats.classes
        C = len(labels)
        # rows are written block by block in the head's dtype: no float64 copy of all of them
        rows = torch.empty(C, r + 1, d, dtype=self.dtype_, device=self.device_)
        bias = torch.empty(C, r + 1, dtype=torch.float64, device=self.device_)
        logdet_M = torch.empty(C, dtype=torch.float64, device=self.device_)
        kappa = torch.empty(C, r, dtype=torch.float64, device=self.device_)
        rows[:, 0] = B_inv_mu.to(self.dtype_)
        for start in range(0, C, block):
            stop = min(C, start + block)
            pairs = [self._eig_cache[c] for c in labels[start:stop]]
            U = torch.stack([p[1] for p in pairs])
            s = torch.stack([p[2] for p in pairs])
            Ut = (U.to(torch.float64) * ((a1 * s).sqrt() / u)[:, None, :]).to(work)
            # the only O(d^2 r) product per class; it is all a refit must redo when B moves
            P = Ut.transpose(1, 2) @ B_inv_work                          # Ut^T B^{-1}, (k, r, d)
            # M_c - I = Ut^T B^{-1} Ut = W diag(sigma^2) W^T, sigma^2 descending
            sigma2, W = torch.linalg.eigh(symmetrize((P @ Ut).to(torch.float64)))
            sigma2, W = sigma2.flip(-1).clamp_min(0.0), W.flip(-1)
            A = (W.transpose(1, 2).to(work) @ P) / (1.0 + sigma2).sqrt()[:, :, None].to(work)
            A = A.to(torch.float64) / u                                  # A^T A = P^T M^-1 P
            rows[start:stop, 1:] = A.to(self.dtype_)
            bias[start:stop, 1:] = -(A @ mu[start:stop, :, None])[:, :, 0]
            logdet_M[start:stop] = torch.log1p(sigma2).sum(-1)
            kappa[start:stop] = sigma2 / (1.0 + sigma2)
        mean_precision = (mu * B_inv_mu).sum(1)
        bias[:, 0] = (-0.5 * mean_precision - 0.5 * (logdet_B + logdet_M)
                      + log_priors.to(self.device_))
        bounds = {"kappa_": kappa, "mean_precision_": mean_precision,
                  "base_whitener_": L_B_inv, "center_": mu.mean(0)}
        return rows, bias, 1.0, {name: value.to(device=self.device_, dtype=self.dtype_)
                                 for name, value in bounds.items()}

    def fit(self, stats: ClassStatistics, *, model_terms=None) -> LRRGDA:
        self.__dict__.pop("_screen_cache", None)
        self.__dict__.pop("_auto_modes", None)
        super().fit(stats, model_terms=model_terms)
        self.linear_bias_ = self.bias_[:, 0].contiguous()
        return self

    def predict(self, X) -> torch.Tensor:
        """Predicted class labels. On the CPU from :data:`AUTO_MIN_CLASSES` classes on, the
        exact pruned argmax of :meth:`top_k` (``pruned="auto"``: it falls back to dense scoring
        where pruning would not pay); the dense argmax otherwise, and always on a GPU. Both
        give the dense argmax (up to exact ties between classes)."""
        if getattr(self, "rows_", None) is not None and self._auto_prunes():  # else unfitted
            return self.top_k(X, 1)[1][:, 0]
        return super().predict(X)

    def _auto_prunes(self) -> bool:
        """Whether ``pruned="auto"`` tries pruning: on the CPU, from ``AUTO_MIN_CLASSES``
        classes. A GPU scores every class faster than it gathers the pairs that pass the
        screening (on an H100, 2,000-8,000 classes: the pruned argmax took 2.4-9x as long as
        the dense one), so there it always scores densely."""
        return self.device_.type == "cpu" and self.rows_.shape[0] >= AUTO_MIN_CLASSES

    # ------------------------------------------------------- pruned inference
    def top_k(self, X, k: int = 5, *, proba: bool = False, pruned="auto", screen_rank="auto",
              screen_dtype="auto", sample_batch: int = 2048):
        """The ``k`` best classes of every sample and their scores, exactly as the dense scores rank them.

        With ``pruned=True`` the full quadratic term is computed only where it can matter. A
        screening pass computes every class's linear score and its first ``screen_rank``
        (``j``) quadratic rows, which give, with ``m_c`` the ``B``-Mahalanobis distance of
        ``x`` to ``mu_c`` (which follows from the linear score)::

            lower_c = w_c^T x + b_c + 1/2 ||A_c[:j] (x - mu_c)||^2
            upper_c = lower_c + 1/2 kappa_{c,j+1} m_c

        The ``k`` classes with the best lower bounds are scored exactly; the ``k``-th best of
        those scores is a floor that the ``k``-th best class reaches. Every (sample, class) pair
        whose upper bound reaches the floor (less a margin for rounding) then gets its remaining
        rows in rounds (``j -> 3j -> ... -> r`` rows), and after each round the pairs whose
        tightened bounds fall short are dropped. Rounds run class by class in batched GEMMs
        over just the samples that need each class.

        The screening's quadratic rows may run in a lower precision than the head
        (``screen_dtype``): their rounding error is bounded a priori (input rounding, float32
        accumulation and output rounding, with Cauchy-Schwarz over the centred sample) and the
        bounds widen by it, so the result stays exact; every score that decides the output is
        computed in the head's dtype. On CPUs with native bfloat16 dot products this halves the
        cost of screening a float32 head.

        Parameters
        ----------
        X : array-like ``(n, d)``
        k : int, default 5
        proba : bool, default False
            Also return the probabilities of the ``k`` classes (softmax over every class). Their
            normaliser needs every class's exact score, so this scores densely
            (:meth:`GaussianHead.top_k`), whatever ``pruned`` says.
        pruned : "auto" or bool, default "auto"
            ``True`` prunes every sample batch, ``False`` scores every class densely. "auto"
            scores densely on a GPU and, on the CPU, heads of fewer than ``AUTO_MIN_CLASSES``
            classes; on larger ones it prunes the first batch (at most ``AUTO_PILOT`` samples)
            with the cost of scoring it densely as a budget (rows of the rounds counted at ``ROUND_ROW_COST`` dense
            rows each), and goes on pruning only if the pilot finished within it; otherwise
            the pilot stops where it ran out (right after its screening if more than
            ``AUTO_MAX_PASS`` of its pairs passed) and everything is scored densely (see
            ``benchmarks/scale.md``). The pilot's verdict holds for the next
            ``AUTO_VERDICT_CALLS`` calls with the same ``k`` and screening (until the next
            ``fit``), which then run no pilot. Either way the result is exact.
        screen_rank : int or "auto", default "auto"
            Quadratic rows per class in the screening pass; "auto" takes a quarter of the
            head's rank (``SCREEN_SHARE``; 16 of 64). On ``gdacil bench scale``'s 2,000 classes
            under the default regularisation the pruned argmax ran at 3.1x dense with 16 rows
            screened in bfloat16 (2.0x with 8) and at 2.0x in float32 (1.6x with 8): with
            fewer rows the bound ``kappa_{c,j+1}`` is too loose to drop most classes, with more
            the screening itself costs more than it saves.
        screen_dtype : "auto", torch.dtype or str, default "auto"
            Precision of the screening's quadratic rows: the head's dtype, or on CPU a lower one
            (``float32`` under a float64 head, ``bfloat16`` under a float32 head). "auto" picks
            the lower one on CPU where it is fast (bfloat16 needs AVX512-BF16 or AMX).
        sample_batch : int, default 2048
            Samples screened at a time (the bounds take a few ``(sample_batch, C)`` buffers).

        Returns
        -------
        scores : tensor ``(n, k)``, labels : int64 tensor ``(n, k)``; best first (and the
        probabilities ``(n, k)`` with ``proba``).
        ``last_pruning_`` reports the fraction of (sample, class) pairs that passed screening,
        of classes any sample needed, of the dense pass's (sample, class, row) products
        computed, the screening rank and dtype, the mode ("pruned" or "dense"), and whether
        this call ran a pilot.

        Notes
        -----
        Where a bound or a score overflows the head's dtype, the samples concerned are scored
        densely as :meth:`decision_function` does (in float64, scores then shifted by their
        per-sample maximum; a ``ValueError`` if even those are NaN or inf).
        """
        if proba:
            return super().top_k(X, k, proba=True)
        X = self._prepare(X)
        k = check_positive_int(k, "k")
        C, rows_per_class, _ = self.rows_.shape
        if k > C:
            raise ValueError(f"k = {k} exceeds the number of classes ({C})")
        if isinstance(screen_rank, str) and screen_rank == "auto":
            screen_rank = default_screen_rank(rows_per_class - 1)
        j = min(check_positive_int(screen_rank, "screen_rank", minimum=0), rows_per_class - 1)
        screen = self._screen_dtype(screen_dtype) if j else self.dtype_
        if pruned not in ("auto", True, False):
            raise ValueError(f"pruned must be 'auto', True or False; got {pruned!r}")
        if (not pruned or (pruned == "auto" and not self._auto_prunes())
                or j == rows_per_class - 1 or not X.shape[0]):
            scores, idx = self._decision(X).topk(k, dim=1)
            self.last_pruning_ = {"pairs_scored_fraction": 1.0, "classes_scored_fraction": 1.0,
                                  "rows_fraction": 1.0, "screen_rank": 0, "screen_dtype": None,
                                  "mode": "dense", "piloted": False}
            return scores, self.classes_[idx.cpu()]
        sample_batch = check_positive_int(sample_batch, "sample_batch")
        parts: list[tuple] = []
        starts = list(range(0, X.shape[0], sample_batch))
        mode, piloted = "pruned", False
        if pruned == "auto":
            key = (k, j, screen)
            remembered = self._remembered_mode(key)
            if remembered is not None:
                mode = remembered
            else:  # a pilot batch decides for the rest and the next calls
                piloted, pilot = True, min(AUTO_PILOT, X.shape[0])
                result = self._pruned_top_k(X[:pilot], k, j, screen, AUTO_MAX_PASS,
                                            row_budget=pilot * C * rows_per_class)
                if result is None or not all_finite(result[0]):
                    mode = "dense"
                else:
                    parts.append(result)
                    starts = list(range(pilot, X.shape[0], sample_batch))
                self._auto_verdicts()[key] = [mode, AUTO_VERDICT_CALLS]
        if mode == "dense":
            # every sample in one pass, the pilot's too: a dense pass reads every class's rows,
            # about as slow for the pilot's few samples as for all of them
            parts.append(self._dense_part(X, k))
        else:
            parts += [self._pruned_or_dense(X[a:a + sample_batch], k, j, screen) for a in starts]
        out_scores = [p[0] for p in parts]
        out_idx = [p[1] for p in parts]
        pairs = sum(p[2] for p in parts)
        classes = sum(p[3] * len(p[0]) for p in parts)
        rows = sum(p[4] for p in parts)
        self.last_pruning_ = {"pairs_scored_fraction": pairs / (X.shape[0] * C),
                              "classes_scored_fraction": classes / (X.shape[0] * C),
                              "rows_fraction": rows / (X.shape[0] * C * rows_per_class),
                              "screen_rank": j,
                              "screen_dtype": str(screen).removeprefix("torch."),
                              "mode": mode, "piloted": piloted}
        return torch.cat(out_scores), self.classes_[torch.cat(out_idx).cpu()]

    def _remembered_mode(self, key) -> str | None:
        """The mode a recent pilot chose for ``key`` (k, screening rank and dtype), this call
        counted; None when none did within ``AUTO_VERDICT_CALLS`` calls."""
        entry = self._auto_verdicts().get(key)
        if entry is None or entry[1] == 0:
            return None
        entry[1] -= 1
        return entry[0]

    def _auto_verdicts(self) -> dict:
        """This fit's pilot verdicts: (k, screening rank, dtype) -> [mode, calls left]."""
        return self.__dict__.setdefault("_auto_modes", {})

    def _pruned_or_dense(self, X, k: int, j: int, screen):
        """``(scores, idx, pairs scored, classes scored, rows)`` of the pruned top-k of ``X``, or
        of the dense scores where a bound or score overflows the head's dtype (rescaled in
        float64, or refused)."""
        result = self._pruned_top_k(X, k, j, screen)
        if result is None or not all_finite(result[0]):
            return self._dense_part(X, k)
        return result

    def _dense_part(self, X, k: int):
        """:meth:`_pruned_or_dense`'s tuple for dense scores of ``X``: every pair and row."""
        C, rows_per_class, _ = self.rows_.shape
        n = X.shape[0]
        return (*self._decision(X).topk(k, dim=1), n * C, C, n * C * rows_per_class)

    def _screen_dtype(self, requested) -> torch.dtype:
        if isinstance(requested, str) and requested == "auto":
            return _fast_screen_dtype(self.dtype_, self.device_)
        dtype = getattr(torch, requested, None) if isinstance(requested, str) else requested
        if dtype == self.dtype_:
            return dtype
        if dtype not in (torch.float32, torch.bfloat16) or \
                torch.finfo(dtype).eps <= torch.finfo(self.dtype_).eps:
            raise ValueError(f"screen_dtype must be 'auto', the head's dtype ({self.dtype_}) or a "
                             f"lower precision of float32 and bfloat16; got {requested!r}")
        if self.device_.type != "cpu":
            raise ValueError(f"screen_dtype {dtype} is only certified on CPU, where products "
                             f"accumulate in float32; on {self.device_.type} use the head's dtype")
        return dtype

    def _screening(self, j: int, dtype: torch.dtype) -> dict:
        """Rows and per-class constants of the screening pass, kept for reuse until the next ``fit``.

        In a lowered precision the quadratic rows act on the centred sample ``x - x0`` (``x0``
        the mean of the class means): the rounding error scales with its norm.
        """
        cached = getattr(self, "_screen_cache", None)
        if cached is not None and cached["key"] == (j, dtype):
            return cached
        quad = self.rows_[:, 1:1 + j]
        lowered = dtype != self.dtype_
        bias = self.bias_[:, 1:1 + j]
        if lowered:
            bias = bias + _row_products(quad, self.center_)
        cached = {"key": (j, dtype),
                  "linear": self.rows_[:, 0].contiguous(),
                  "quad": quad.to(dtype).contiguous(), "quad_bias": bias.contiguous(),
                  # what the Mahalanobis distance needs besides x^T B^-1 x and lin
                  "offset": self.mean_precision_ + 2.0 * self.linear_bias_,
                  # kappa_{c,i+1} / 2 bounds the rest after i rows (0 after all r rows)
                  "half_kappa": 0.5 * torch.nn.functional.pad(self.kappa_, (0, 1))}
        if lowered:
            # |computed - exact| <= eps ||a|| ||x - x0|| per row, plus the rounding of the
            # centred bias: over the j rows, ||error|| <= eps ||x - x0|| ||A_c[:j]||_F + beta_c
            cached["eps"] = _lowered_gemm_error(dtype, self.dtype_, self.rows_.shape[2])
            cached["frobenius"] = torch.linalg.vector_norm(quad, dim=(1, 2))
            # the centred bias is accurate to float64 products, then rounded to the head's dtype
            scale = (torch.linalg.vector_norm(bias, dim=1) + torch.linalg.vector_norm(
                self.bias_[:, 1:1 + j], dim=1) + cached["frobenius"] * self.center_.norm())
            cached["beta"] = torch.finfo(self.dtype_).eps * scale
            cached["center"] = self.center_
        self._screen_cache = cached
        return cached

    def _mixture_covariance(self, stats) -> torch.Tensor:
        """The mean class covariance of the full-rank model, ``(alpha1 + alpha2) Sigma_avg +
        alpha3 u I`` (the truncation to rank r leaves out a little of each class's spread)."""
        return mean_regularized_covariance(self, stats,
                                           check_alphas(self.alpha1, self.alpha2, self.alpha3))

    def _density_offset(self, X: torch.Tensor) -> torch.Tensor:
        """``1/2 x^T B^{-1} x``: what the scores hold beyond the class log-densities."""
        # contiguous: a loaded head (whose tensors are) then scores bit for bit alike
        whitened = X.to(torch.float64) @ self.base_whitener_.to(torch.float64).contiguous().T
        return 0.5 * whitened.square().sum(1)

    def _bounds(self, X: torch.Tensor, j: int, dtype: torch.dtype):
        """Linear scores, lower and upper bounds of the scores (each ``(n, C)``, the upper ones
        after ``j`` rows), ``x^T B^-1 x`` ``(n, 1)`` and a per-sample rounding margin ``(n, 1)``
        that covers every bound built from them."""
        screen = self._screening(j, dtype)
        (n, d), C = X.shape, self.rows_.shape[0]
        lowered = "eps" in screen
        offset, half_kappa = screen["offset"], screen["half_kappa"][:, j]
        lin = torch.addmm(self.linear_bias_, X, screen["linear"].T)
        lower, upper = torch.empty_like(lin), torch.empty_like(lin)
        sq_norm = (X @ self.base_whitener_.T).square().sum(1, keepdim=True)   # x^T B^{-1} x
        centred = X - screen["center"] if lowered else X
        Xs = centred.to(dtype)
        if lowered:
            reach = screen["eps"] * torch.linalg.vector_norm(centred, dim=1, keepdim=True)
        size = torch.zeros(n, 1, dtype=X.dtype, device=X.device)
        block = self._block_size(max(j, 1), n)
        for a in range(0, C, block):
            b = min(C, a + block)
            score = lin[:, a:b]
            if j:
                G = (Xs @ screen["quad"][a:b].reshape(-1, d).T).view(n, b - a, j)
                bias = screen["quad_bias"][a:b]
                # lowered: one pass widens G exactly to the head's dtype and adds the bias
                Q = torch.add(G, bias) if lowered else G.add_(bias)
                half_sq = torch.linalg.vecdot(Q, Q).mul_(0.5)
                score = half_sq + score                       # lin + 1/2 ||A_c[:j] (x - mu_c)||^2
            distance = _mahalanobis(sq_norm, lin[:, a:b], offset[a:b])
            torch.addcmul(score, half_kappa[a:b], distance, out=upper[:, a:b])
            if lowered and j:
                # with e bounding the error of q = A_c[:j] (x - mu_c), 1/2 (||q|| -/+ e)^2
                # bound 1/2 ||q_exact||^2; expanded: 1/2 ||q||^2 -/+ e ||q|| (+ e^2 / 2)
                err = torch.addcmul(screen["beta"][a:b], reach, screen["frobenius"][a:b])
                spread = half_sq.mul_(2.0).sqrt_().mul_(err)
                torch.sub(score, spread, out=lower[:, a:b])
                upper[:, a:b] += spread.add_(err.square_().mul_(0.5))
            else:
                lower[:, a:b] = score
            # every term above is a sum of terms no larger than these magnitudes
            size = torch.maximum(size, score.abs().amax(1, keepdim=True)
                                 + 2.0 * lin[:, a:b].abs().amax(1, keepdim=True)
                                 + offset[a:b].abs().max())
        margin = 64 * torch.finfo(self.dtype_).eps * (size + sq_norm)
        return lin, lower, upper, sq_norm, margin

    def _pruned_top_k(self, X: torch.Tensor, k: int, j: int, dtype: torch.dtype,
                      max_pass: float | None = None, row_budget: float | None = None):
        """Screen with ``j`` rows, then add rows in rounds (``j -> 3j -> ... -> r``) to the
        pairs whose upper bound still reaches the ``k``-th best lower bound of their sample.
        Returns ``(scores, idx, pairs scored, classes scored, rows)``, ``rows`` counting the
        (sample, class, row) products with the rounds' at ``ROUND_ROW_COST`` each. ``None``
        where a bound overflows the head's dtype, where more than ``max_pass`` of the pairs
        pass the screening, or where the next round would take ``rows`` past ``row_budget``
        (dense scoring is then cheaper)."""
        lin, lower, upper, sq_norm, margin = self._bounds(X, j, dtype)
        if not (all_finite(lower) and all_finite(upper) and all_finite(margin)):
            return None  # a bound overflowed, so pairs could be dropped wrongly: score densely
        screen = self._screening(j, dtype)
        r, half_kappa = self.rows_.shape[1] - 1, screen["half_kappa"]
        # the exact scores of the k best lower bounds: k classes score at least their minimum
        floor = self._exact_scores(X, lin, lower.topk(k, dim=1).indices).amin(1, keepdim=True)
        threshold = floor - 2.0 * margin        # bounds and threshold carry one margin each
        cls, smp = (upper >= threshold).T.nonzero(as_tuple=True)        # sorted by class
        if max_pass is not None and len(smp) > max_pass * upper.numel():
            return None
        scored, classes = len(smp), len(torch.unique_consecutive(cls))
        rows = upper.numel() * (j + 1) + ROUND_ROW_COST * X.shape[0] * k * r  # screen, floor
        # a pair's score is base + screened + rest: its linear score, its first j rows (a lower
        # bound of them after a lowered screening, open by at most `width`) and the rows after
        dist = _mahalanobis(sq_norm[smp, 0], lin[smp, cls], screen["offset"][cls])
        base = lin[smp, cls]
        screened = lower[smp, cls] - base
        lowered = "eps" in screen
        width = ((upper[smp, cls] - lower[smp, cls]).sub_(half_kappa[cls, j] * dist).clamp_min_(0.0)
                 if lowered else torch.zeros_like(base))
        del upper
        rest = torch.zeros_like(base)
        done = stop = j
        while done < r:
            stop = min(r, max(4, 3 * stop))
            rows += ROUND_ROW_COST * len(smp) * (stop - done)
            if row_budget is not None and rows > row_budget:
                return None
            rest += 0.5 * self._row_norms(X, cls, smp, done, stop)
            done = stop
            low = base + screened + rest
            lower[smp, cls] = low                          # still lower bounds, now tighter
            threshold = torch.maximum(lower.topk(k, dim=1).values[:, -1:], floor) - 2.0 * margin
            keep = (low + width).addcmul_(half_kappa[cls, done], dist) >= threshold[smp, 0]
            cls, smp, base, screened, rest, width, dist = (
                t[keep] for t in (cls, smp, base, screened, rest, width, dist))
        if lowered:                 # the first j rows of the pairs still in, in the head's dtype
            screened = 0.5 * self._row_norms(X, cls, smp, 0, j)
            rows += ROUND_ROW_COST * len(smp) * j
        scores = torch.full_like(lower, -torch.inf)
        scores[smp, cls] = base + screened + rest
        best, idx = scores.topk(k, dim=1)
        return best, idx, scored, classes, rows

    def _exact_scores(self, X: torch.Tensor, lin: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Scores ``(n, k)`` of the classes ``idx`` ``(n, k)``, from their linear scores ``lin``."""
        smp = torch.arange(len(idx), device=idx.device).repeat_interleave(idx.shape[1])
        order = torch.argsort(idx.reshape(-1), stable=True)
        cls, smp = idx.reshape(-1)[order], smp[order]
        quad = self._row_norms(X, cls, smp, 0, self.rows_.shape[1] - 1)
        out = torch.empty(idx.numel(), dtype=lin.dtype, device=lin.device)
        out[order] = lin[smp, cls] + 0.5 * quad
        return out.view_as(idx)

    def _row_norms(self, X: torch.Tensor, cls: torch.Tensor, smp: torch.Tensor, start: int,
                   stop: int) -> torch.Tensor:
        """``sum_{start < i <= stop} (A_ci x + b_ci)^2`` of the pairs ``(cls, smp)``, sorted by class.

        The classes that have pairs go ``_RESCORE_CLASSES`` at a time: one batched GEMM of
        their rows against their samples, gathered into a block padded to the largest count
        among them. The rows are a view of the head's (no copy) when the classes are mostly
        consecutive; copying them costs more than the products, so only the rows of scattered
        classes are gathered, where a view would read every class in between.
        """
        (n, d), P = X.shape, len(cls)
        out = torch.empty(P, dtype=X.dtype, device=X.device)
        present, counts = torch.unique_consecutive(cls, return_counts=True)
        local = torch.arange(len(present), device=cls.device).repeat_interleave(counts)
        ends = torch.cumsum(counts, 0)
        rank = torch.arange(P, device=cls.device) - (ends - counts)[local]   # place in its class
        rows, bias = self.rows_[:, 1 + start:1 + stop], self.bias_[:, 1 + start:1 + stop]
        present_l, counts_l, ends_l = present.tolist(), counts.tolist(), [0, *ends.tolist()]
        for g0 in range(0, len(present_l), _RESCORE_CLASSES):
            g1 = min(len(present_l), g0 + _RESCORE_CLASSES)
            c0, c1, p0, p1 = present_l[g0], present_l[g1 - 1] + 1, ends_l[g0], ends_l[g1]
            if c1 - c0 <= 2 * (g1 - g0):
                R, bR, slot = rows[c0:c1], bias[c0:c1], cls[p0:p1] - c0
            else:
                R, bR = rows.index_select(0, present[g0:g1]), bias.index_select(0, present[g0:g1])
                slot = local[p0:p1] - g0
            span, samples, most = len(R), smp[p0:p1], max(counts_l[g0:g1])
            if most >= _DENSE_SHARE * n:         # every sample against the block's rows
                Z = torch.addmm(bR.reshape(-1), X, R.reshape(-1, d).T)
                Z = Z.view(n * span, -1).index_select(0, samples * span + slot)
            else:                                 # padded batched GEMM of the needed samples
                at = slot * most + rank[p0:p1]
                pick = samples.new_zeros(span * most).index_copy_(0, at, samples)
                Z = torch.baddbmm(bR[:, None], X.index_select(0, pick).view(span, most, d),
                                  R.transpose(1, 2))
                Z = Z.view(span * most, -1).index_select(0, at)
            out[p0:p1] = torch.linalg.vecdot(Z, Z)
        return out

    def _extra_memory(self) -> dict[str, int]:
        cache = getattr(self, "_eig_cache", {})
        borrowed = getattr(self, "_eig_cache_key", ("",))[0] == "stored"  # views of the statistics
        report: dict[str, int] = {"eigenpair_cache": 0 if borrowed else
                                  sum(u.nbytes + s.nbytes for _, u, s in cache.values())}
        if hasattr(self, "_screen_cache"):
            report["screening_rows"] = sum(t.nbytes for t in self._screen_cache.values()
                                           if isinstance(t, torch.Tensor))
        if hasattr(self, "kappa_"):
            report["pruning_bounds"] = sum(t.nbytes for t in (
                self.kappa_, self.mean_precision_, self.base_whitener_, self.linear_bias_,
                self.center_))
        return report
