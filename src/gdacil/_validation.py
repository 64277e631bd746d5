"""Input checks with errors that name the problem."""

from __future__ import annotations

import numpy as np
import torch

ArrayLike = "torch.Tensor | np.ndarray | Sequence"


def as_features(
    X,
    *,
    dim: int | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    name: str = "features",
    allow_empty: bool = False,
) -> torch.Tensor:
    """Return ``X`` as a finite 2-D tensor of shape ``(n, dim)``.

    Raises ``ValueError`` naming the problem: wrong number of dimensions, wrong feature dimension,
    an empty batch, or NaN/inf values (with the index of the first offending row).
    """
    if not isinstance(X, torch.Tensor):
        X = torch.as_tensor(np.asarray(X))
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_samples, dim); got shape {tuple(X.shape)}")
    if not X.is_floating_point():
        X = X.to(torch.float64)
    if dim is not None and X.shape[1] != dim:
        raise ValueError(f"{name} have dimension {X.shape[1]}, expected {dim}")
    if X.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name}: empty batch (0 samples)")
    finite = torch.isfinite(X).all(dim=1)
    if not bool(finite.all()):
        row = int((~finite).nonzero()[0, 0])
        raise ValueError(f"{name} contain NaN or inf (first at row {row})")
    return X.to(dtype=dtype or X.dtype, device=device)


def as_labels(y, *, n: int | None = None, name: str = "labels") -> torch.Tensor:
    """Return ``y`` as a 1-D int64 tensor (on the CPU) of length ``n``."""
    if not isinstance(y, torch.Tensor):
        arr = np.asarray(y)
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "f" and arr.size and np.all(np.mod(arr, 1) == 0):
                arr = arr.astype(np.int64)
            else:
                raise ValueError(f"{name} must be integers; got dtype {arr.dtype}")
        y = torch.from_numpy(np.array(arr, dtype=np.int64))  # a copy: arr may be read-only
    elif y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{name} must be integers; got dtype {y.dtype}")
    y = y.to(dtype=torch.int64, device="cpu")
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {tuple(y.shape)}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"{name} have length {y.shape[0]} but there are {n} samples")
    return y


def check_positive_int(value, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def check_nonnegative(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number >= 0; got {value!r}") from None
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    return value
