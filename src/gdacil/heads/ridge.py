"""Ridge regression on one-hot targets over a random feature map: RanPAC and ACIL.

Both heads solve ``W_o = (G + lam I)^{-1} Q`` with ``G = sum_i h_i h_i^T`` and
``Q[:, c] = sum_{i in c} h_i`` over every (mapped) sample seen, and score ``h^T W_o``. ``G`` and
``Q`` follow exactly from :class:`~gdacil.stats.PooledGaussians` (``gram()``, ``cross()``),
so task-by-task training, and merging heads trained on shards, both give the joint ridge on all the
data: ACIL's recursive least squares and RanPAC's accumulated ``G, Q`` are this closed form. The
solve is one float64 Cholesky of ``G + lam I``.

The scores are ridge outputs (targets 0/1), not log-probabilities; ``predict_proba`` is their
softmax, a monotone squashing that keeps the ranking.
"""

from __future__ import annotations

import math

import torch

from .._validation import check_nonnegative, check_positive_int
from ..stats import PooledGaussians
from ..stats.feature_maps import Identity, RandomBuffer, RandomReLU
from ..stats.linalg import psd_cholesky
from .mapped import DEFAULT_MAX_BYTES, MappedLinearHead
from .ridge_lambda import DEFAULT_LAMBDA_GRID, lambda_floor, select_ridge_lambda

__all__ = ["ACIL", "RanPAC", "RidgeHead", "ridge_weights"]


def ridge_weights(stats, lam: float) -> tuple[torch.Tensor, float]:
    """``(W_o^T, lam_used)``: ridge weights ``(C, M)`` from pooled statistics, by Cholesky.

    ``lam_used = max(lam, eps M tr(G))`` (see :func:`~gdacil.heads.ridge_lambda.lambda_floor`).
    """
    G = stats.gram()
    M = G.shape[0]
    lam = max(float(lam), lambda_floor(G.diagonal().sum(), M))
    G.diagonal().add_(lam)
    L, info = torch.linalg.cholesky_ex(G)  # peak memory: G and L (psd_cholesky copies G first)
    if info != 0:
        L = psd_cholesky(G, name="ridge matrix G + lam I")
    del G
    return torch.cholesky_solve(stats.cross(), L).T, lam


class RidgeHead(MappedLinearHead):
    """Ridge on one-hot targets over a feature map, with a penalty chosen by the subclass.

    Fitted attributes: ``lam_`` (the penalty of the current solve, after the round-off floor),
    ``coef_`` ``(C, M)`` (``W_o^T``), ``intercept_`` (zeros), ``stats_``, ``feature_map_``.
    """

    def _penalty(self) -> float:
        raise NotImplementedError  # intended: RanPAC and ACIL choose their own penalty

    def _start_state(self) -> None:
        self.lam_ = self._penalty()

    def _solve(self, stats):
        if self.lam_ is None:
            raise ValueError(f"{type(self).__name__}: no penalty chosen yet (lam='auto' chooses "
                             "it in partial_fit from a batch of samples; pass a numeric lam)")
        W, self.lam_ = ridge_weights(stats, self.lam_)
        return W, torch.zeros(W.shape[0], dtype=torch.float64)

    def _state_bytes(self, dim, n_classes):
        # statistics; G + lam I and its Cholesky factor; Q and the weights
        return PooledGaussians.estimate_bytes(dim, n_classes) + 8 * (2 * dim * dim + 2 * dim * n_classes)

    def _fitted_state(self):
        return {"lam_": self.lam_}

    def _restore_state(self, state):
        self.lam_ = state.get("lam_", self.lam_)


class RanPAC(RidgeHead):
    """RanPAC's analytic head: a random ReLU projection, then ridge with a data-chosen penalty.

    ``h = relu(x W)`` with ``W`` ``(d, M)`` standard normal (:class:`~gdacil.stats.feature_maps.RandomReLU`;
    ``dim_out=0``: ``h = x``, plain ridge), then ``W_o = (G + lam I)^{-1} Q`` over everything seen.

    With ``lam="auto"``, every :meth:`partial_fit` chooses ``lam`` from THAT batch only, as RanPAC
    does per task: a seeded 80/20 split, a ridge on the 80% for every value of ``lam_grid``, the
    lowest mean squared error of one-hot targets (one column per class seen so far) on the 20%
    wins (:func:`~gdacil.heads.ridge_lambda.select_ridge_lambda`: one eigendecomposition serves the
    whole grid). The head then solves with the accumulated ``G, Q``. ``lam`` never goes below the
    round-off floor ``eps M tr(G)`` of a float64 solve. Scale: both maps are positively
    homogeneous, so multiplying the features by ``10^k`` multiplies ``G`` by ``10^{2k}``, and the
    holdout curve (and the floor) shift by exactly ``2k`` grid steps; as long as the chosen values
    stay inside the grid, ``lam`` follows and the predictions do not change.

    Parameters
    ----------
    dim_out : int >= 0, default 10000
        Projection dimension ``M``; 0 means no projection (ridge on the raw features).
    lam : "auto" or float > 0, default "auto"
    seed : int, default 0
        Seeds the projection and the holdout splits.
    lam_grid : sequence of float, default ``10^-8, 10^-7, ..., 10^8``
    train_fraction : float, default 0.8
    dtype, max_bytes, forgettable
        See :class:`~gdacil.heads.mapped.MappedLinearHead`. A forgettable RanPAC needs a
        numeric ``lam``: a penalty chosen on batches holding a class stays chosen after the
        class is forgotten, so ``lam="auto"`` cannot give the head that never saw it.

    Attributes
    ----------
    lam_ : float
        The penalty of the current solve.
    lam_history_ : list of dict
        One entry per ``partial_fit`` with ``lam="auto"``: the chosen value, the floor, and the
        holdout MSE of every grid value.

    Notes
    -----
    Memory is ``8 M^2`` bytes for ``G`` whatever the number of classes, plus ``8 M C`` for the
    class means and the weights, plus ``16 M^2`` transiently for the solve. At ``M = 10000``:
    0.8 GB of statistics, 0.08 GB (1k classes) or 0.8 GB (10k classes) of means and as much of
    weights, and 1.6 GB during a solve. Time: accumulating ``G`` is ``n M^2`` flops per batch,
    a solve ``M^3 / 3`` (tens of seconds at ``M = 10000`` on one core), choosing ``lam``
    ``n_train^2 M`` plus one ``min(M, n_train)``-order eigendecomposition.

    References
    ----------
    [RanPAC] M. D. McDonnell, D. Gong, A. Parvaneh, E. Abbasnejad and A. van den Hengel. RanPAC:
    Random Projections and Pre-trained Models for Continual Learning. Advances in Neural
    Information Processing Systems 36 (NeurIPS 2023). arXiv:2307.02251;
    https://github.com/McDonnell-Research-Lab/RanPAC

    Examples
    --------
    >>> import torch
    >>> from gdacil.heads import RanPAC
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.arange(300) % 3
    >>> X = torch.randn(300, 8, generator=g) + 2 * torch.nn.functional.one_hot(y, 8)
    >>> head = RanPAC(dim_out=200).partial_fit(X[:200], y[:200]).partial_fit(X[200:], y[200:])
    >>> head.score(X, y) > 0.9, len(head.lam_history_)
    (True, 2)
    """

    _FORMAT = "gdacil.RanPAC/1"

    def __init__(self, dim_out=10_000, lam="auto", *, seed=0, lam_grid=DEFAULT_LAMBDA_GRID,
                 train_fraction=0.8, dtype="float64", max_bytes=DEFAULT_MAX_BYTES,
                 forgettable=False):
        super().__init__(dtype=dtype, max_bytes=max_bytes, forgettable=forgettable)
        self.dim_out = dim_out
        self.lam = lam
        self.seed = seed
        self.lam_grid = lam_grid
        self.train_fraction = train_fraction

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.dim_out, "dim_out", minimum=0)
        if self.lam != "auto" and not check_nonnegative(self.lam, "lam") > 0:
            raise ValueError(f"lam must be 'auto' or a number > 0; got {self.lam!r}")
        if self.lam == "auto" and (not len(self.lam_grid)
                                   or any(not (math.isfinite(v) and v > 0) for v in self.lam_grid)):
            raise ValueError(f"lam_grid must hold positive finite values; got {self.lam_grid!r}")

    def _make_map(self, dim_in):
        return Identity(dim_in) if self.dim_out == 0 else RandomReLU(dim_in, self.dim_out, self.seed)

    def _penalty(self):
        return None if self.lam == "auto" else float(self.lam)

    def _chosen_from_data(self):
        return "lam" if self.lam == "auto" else None

    def _start_state(self) -> None:
        super()._start_state()
        self.lam_history_: list[dict] = []

    def _needs_batch(self) -> bool:
        return self.lam == "auto"

    def _observe(self, H, y) -> None:
        pos = self.stats_.positions(y.tolist())
        Y = torch.zeros(H.shape[0], self.stats_.n_classes, dtype=torch.float64)
        Y[torch.arange(H.shape[0]), pos] = 1.0
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + len(self.lam_history_))
        sel = select_ridge_lambda(H, Y, self.lam_grid, generator=generator,
                                  train_fraction=self.train_fraction)
        self.lam_ = sel.lam
        self.lam_history_.append(sel.to_dict())

    def _fitted_state(self):
        return {**super()._fitted_state(), "lam_history_": self.lam_history_}

    def _restore_state(self, state):
        super()._restore_state(state)
        self.lam_history_ = list(state.get("lam_history_", []))

    def _merge_state(self, other) -> None:
        # the penalty stays self's; the other's choices are kept in the history
        if self.lam_ is None:
            self.lam_ = other.lam_
        self.lam_history_ = self.lam_history_ + other.lam_history_


class ACIL(RidgeHead):
    """ACIL's analytic head: a uniform random ReLU buffer, then ridge with a fixed penalty.

    ``h = relu(x W)`` with ``W_ij ~ U(-1/sqrt(d), 1/sqrt(d))``
    (:class:`~gdacil.stats.feature_maps.RandomBuffer`), then ``W_o = (G + gamma I)^{-1} Q``. ACIL
    reaches this with recursive least squares (a Woodbury update of ``(G + gamma I)^{-1}`` per
    batch); accumulating ``G, Q`` and solving once gives the same joint ridge, in less time when
    batches are many. ``gamma`` is absolute (ACIL's published 0.1), so unlike :class:`RanPAC`
    the predictions depend on the scale of the features.

    Parameters
    ----------
    buffer_size : int, default 8192
    gamma : float > 0, default 0.1
    seed : int, default 0
    dtype, max_bytes, forgettable
        See :class:`~gdacil.heads.mapped.MappedLinearHead`.

    Notes
    -----
    Memory: ``8 M^2`` bytes for ``G`` (0.54 GB at ``M = 8192``) whatever the number of classes,
    ``8 M C`` for the means and as much for the weights (0.07 GB each at 1k classes, 0.66 GB at
    10k), and ``16 M^2`` transiently per solve.

    References
    ----------
    [ACIL] H. Zhuang, Z. Weng, H. Wei, R. Xie, K.-A. Toh and Z. Lin. ACIL: Analytic
    Class-Incremental Learning with Absolute Memorization and Privacy Protection. Advances in
    Neural Information Processing Systems (NeurIPS 2022). arXiv:2205.14922;
    https://github.com/ZHUANGHP/Analytic-continual-learning

    [Woodbury] W. W. Hager. Updating the Inverse of a Matrix. SIAM Review 31(2):221-239, 1989.

    Examples
    --------
    >>> import torch
    >>> from gdacil.heads import ACIL
    >>> g = torch.Generator().manual_seed(0)
    >>> y = torch.arange(300) % 3
    >>> X = torch.randn(300, 8, generator=g) + 2 * torch.nn.functional.one_hot(y, 8)
    >>> ACIL(buffer_size=256).fit(X, y).score(X, y) > 0.9
    True
    """

    _FORMAT = "gdacil.ACIL/1"

    def __init__(self, buffer_size=8192, gamma=0.1, *, seed=0, dtype="float64",
                 max_bytes=DEFAULT_MAX_BYTES, forgettable=False):
        super().__init__(dtype=dtype, max_bytes=max_bytes, forgettable=forgettable)
        self.buffer_size = buffer_size
        self.gamma = gamma
        self.seed = seed

    def _check_params(self) -> None:
        super()._check_params()
        check_positive_int(self.buffer_size, "buffer_size")
        if not check_nonnegative(self.gamma, "gamma") > 0:
            raise ValueError(f"gamma must be > 0; got {self.gamma!r}")

    def _make_map(self, dim_in):
        return RandomBuffer(dim_in, self.buffer_size, self.seed)

    def _penalty(self):
        return float(self.gamma)
