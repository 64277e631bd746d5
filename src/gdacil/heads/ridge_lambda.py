"""Choosing the ridge penalty on a holdout of one batch, with one eigendecomposition for the grid.

RanPAC picks the ridge penalty ``lam`` of ``W = (H^T H + lam I)^{-1} H^T Y`` per task: the task's
(mapped) features ``H`` ``(n, M)`` and one-hot targets ``Y`` ``(n, C)`` are split 80/20, a ridge is
fitted on the 80% for every ``lam`` of a grid (``10^-8 ... 10^8``), and the ``lam`` whose
predictions on the 20% have the lowest mean squared error wins. Done literally that is one dense
``M x M`` solve per grid value. Here one symmetric eigendecomposition serves the whole grid:

- ``M <= n_train``: ``H_t^T H_t = V diag(s) V^T`` (``M x M``), and the holdout predictions are
  ``P(lam) = (H_v V) diag(1 / (s + lam)) (V^T H_t^T Y_t)``;
- ``n_train < M``: the kernel ``H_t H_t^T = U diag(s) U^T`` (``n_train x n_train``), and by the
  push-through identity ``(H^T H + lam I)^{-1} H^T = H^T (H H^T + lam I)^{-1}``,
  ``P(lam) = (H_v H_t^T U) diag(1 / (s + lam)) (U^T Y_t)``.

Each grid value then costs one ``(n_val, r) x (r, C)`` product with ``r = min(M, n_train)``.
Everything runs in float64.

Round-off floor: a float64 solve of ``G + lam I`` cannot resolve ``lam`` below the round-off of
``G``'s spectrum, about ``eps * M * ||G||`` (``eps = 2.2e-16``). Candidates below
:func:`lambda_floor` ``= eps * M * tr(G)`` (``tr(G) >= ||G||_2``) are raised to it, both when
scoring and when the head solves, so a grid value that exact scoring would favour but that no
solve can honour (the notes' ``1e-8`` on sentence embeddings) is never used. The floor scales like
``G``, so the selection stays scale-equivariant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DEFAULT_LAMBDA_GRID", "RidgeSelection", "holdout_mse", "holdout_split",
           "lambda_floor", "select_ridge_lambda"]

DEFAULT_LAMBDA_GRID: tuple[float, ...] = tuple(10.0**k for k in range(-8, 9))
_EPS = torch.finfo(torch.float64).eps


def lambda_floor(trace: float, dim: int) -> float:
    """``eps * dim * trace``: the smallest penalty a float64 solve of ``G + lam I`` resolves,
    for ``G`` of order ``dim`` and trace ``trace``."""
    return _EPS * dim * float(trace)


def holdout_split(n: int, *, generator: torch.Generator, train_fraction: float = 0.8):
    """Seeded split of ``n`` samples: ``(train_index, val_index)`` with ``int(train_fraction n)``
    training samples (at least one of each)."""
    if n < 2:
        raise ValueError(f"a holdout split needs at least 2 samples; got {n}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1); got {train_fraction!r}")
    n_train = min(max(int(train_fraction * n), 1), n - 1)
    perm = torch.randperm(n, generator=generator)
    return perm[:n_train], perm[n_train:]


def holdout_mse(H_train, Y_train, H_val, Y_val, lams) -> torch.Tensor:
    """Holdout MSE (mean over all entries of ``Y_val``) of the ridge fitted on the training part,
    for every penalty in ``lams``: one eigendecomposition, then a small product per penalty."""
    H_train, H_val = H_train.to(torch.float64), H_val.to(torch.float64)
    Y_train, Y_val = Y_train.to(torch.float64), Y_val.to(torch.float64)
    n_train, M = H_train.shape
    if n_train >= M:
        s, V = torch.linalg.eigh(H_train.T @ H_train)
        A, B = H_val @ V, V.T @ (H_train.T @ Y_train)
    else:
        s, U = torch.linalg.eigh(H_train @ H_train.T)
        A, B = (H_val @ H_train.T) @ U, U.T @ Y_train
    s = s.clamp_min(0.0)
    out = torch.empty(len(lams), dtype=torch.float64)
    for i, lam in enumerate(lams):
        P = (A / (s + float(lam))) @ B
        out[i] = (P - Y_val).square().mean()
    return out


@dataclass
class RidgeSelection:
    """The outcome of :func:`select_ridge_lambda`.

    ``lam`` is the chosen penalty (already at or above ``floor``); ``grid`` the candidates as given,
    ``effective`` each candidate raised to ``floor``, ``mse`` the holdout MSE of each.
    """

    lam: float
    floor: float
    grid: list[float]
    effective: list[float]
    mse: list[float]

    def to_dict(self) -> dict:
        return {"lam": self.lam, "floor": self.floor, "grid": self.grid,
                "effective": self.effective, "mse": self.mse}


def select_ridge_lambda(H, Y, grid=DEFAULT_LAMBDA_GRID, *, generator: torch.Generator,
                        train_fraction: float = 0.8) -> RidgeSelection:
    """RanPAC's choice of the ridge penalty from one batch, with one eigendecomposition.

    Parameters
    ----------
    H : tensor ``(n, M)``
        The batch's (mapped) features.
    Y : tensor ``(n, C)``
        Its one-hot targets (RanPAC: one column per class seen so far).
    grid : sequence of float > 0
        Candidate penalties (default ``10^-8 ... 10^8``).
    generator : torch.Generator
        Seeds the 80/20 split (:func:`holdout_split`).

    Returns
    -------
    RidgeSelection
        The first candidate with the lowest holdout MSE wins (ties go to the smaller penalty).

    Examples
    --------
    >>> import torch
    >>> from gdacil.heads.ridge_lambda import select_ridge_lambda
    >>> g = torch.Generator().manual_seed(0)
    >>> H = torch.randn(200, 20, generator=g, dtype=torch.float64)
    >>> Y = torch.nn.functional.one_hot((H[:, 0] > 0).long()).double()
    >>> sel = select_ridge_lambda(H, Y, generator=torch.Generator().manual_seed(0))
    >>> len(sel.mse), sel.lam in sel.effective
    (17, True)
    """
    grid = [float(v) for v in grid]
    if not grid or any(not v > 0 for v in grid):
        raise ValueError(f"the penalty grid must be non-empty and positive; got {grid}")
    H, Y = H.to(torch.float64), Y.to(torch.float64)
    train, val = holdout_split(H.shape[0], generator=generator, train_fraction=train_fraction)
    H_train = H[train]
    floor = lambda_floor(torch.linalg.vector_norm(H_train) ** 2, H.shape[1])
    effective = [max(v, floor) for v in grid]
    mse = holdout_mse(H_train, Y[train], H[val], Y[val], effective)
    best = int(torch.argmin(mse))  # the first minimum, like numpy's argmin
    return RidgeSelection(lam=effective[best], floor=floor, grid=grid, effective=effective,
                          mse=mse.tolist())
