"""Input checks with errors that name the problem."""

from __future__ import annotations

import math

import numpy as np
import torch

ArrayLike = "torch.Tensor | np.ndarray | Sequence"


#: Integers beyond this magnitude are not all exactly representable in float64
_EXACT_FLOAT64_INT = 2**53
#: Labels are stored as int64: they must lie in [-2**63, 2**63)
_INT64_BOUND = 2.0**63

#: Relative tolerances of :func:`check_covariances`: the largest ``|S - S^T|`` over the largest
#: ``|S|`` of a matrix, and the most negative eigenvalue over its trace. Float32 round-off of a
#: covariance (rounding every entry, or accumulating it in float32) stays two orders of magnitude
#: inside both; a corrupted or edited matrix does not.
SYMMETRY_RTOL = 1e-6
PSD_RTOL = 1e-5


#: The floating dtypes gdacil computes in, by the name configs and saved metadata use
FLOAT_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def as_dtype(value, name: str = "dtype", *, allowed=tuple(FLOAT_DTYPES)) -> torch.dtype:
    """``value`` as a ``torch.dtype``: a dtype, its name (``"float64"``, ``"torch.float64"``) or a
    numpy floating dtype, one of ``allowed`` (names); else a ``ValueError`` naming ``name`` and the
    accepted values.

    >>> as_dtype("float32"), as_dtype(torch.float64)
    (torch.float32, torch.float64)
    >>> as_dtype("int8")
    Traceback (most recent call last):
    ...
    ValueError: dtype must be a torch dtype or its name, one of 'float64', 'float32', 'float16', 'bfloat16'; got 'int8'
    """
    key = value
    if isinstance(value, torch.dtype):
        key = dtype_name(value)
    elif isinstance(value, str):
        key = value.removeprefix("torch.")
    elif isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        key = np.dtype(value).name
    if not isinstance(key, str) or key not in allowed:
        names = ", ".join(repr(n) for n in allowed)
        raise ValueError(f"{name} must be a torch dtype or its name, one of {names}; got {value!r}")
    return FLOAT_DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a torch dtype as configs and saved metadata write it (``"float64"``)."""
    return str(dtype).removeprefix("torch.")


def as_device(value, name: str = "device") -> torch.device:
    """``value`` (None for the CPU, a name such as ``"cuda:0"``, or a ``torch.device``) as a
    ``torch.device``; else a ``ValueError`` naming ``name`` and the accepted values.

    >>> as_device(None), as_device("cpu")
    (device(type='cpu'), device(type='cpu'))
    """
    if value is None:
        return torch.device("cpu")
    if isinstance(value, (str, torch.device)):
        try:
            return torch.device(value)
        except RuntimeError:
            pass
    raise ValueError(f"{name} must be None (the CPU), a device name such as 'cpu' or 'cuda:0', "
                     f"or a torch.device; got {value!r}")


def finite_flag(t: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: whether every value of the floating tensor ``t`` is finite.

    One fused min/max pass (NaN propagates through both), many times faster than
    ``torch.isfinite(t).all()``, and it does not synchronise a GPU.
    """
    if t.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=t.device)
    lo, hi = torch.aminmax(t)
    return torch.isfinite(lo) & torch.isfinite(hi)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of the floating tensor ``t`` is finite (see :func:`finite_flag`)."""
    return bool(finite_flag(t))


def first_nonfinite(t: torch.Tensor) -> int:
    """Index along the first dimension of the first slice of ``t`` holding NaN or inf (-1: none)."""
    bad = ~torch.isfinite(t.reshape(t.shape[0], -1)).all(1)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else -1


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
    an empty batch, NaN/inf values (with the index of the first offending row), or a conversion
    that would lose information: complex values (the imaginary part), integers that float64
    would round (:func:`check_exact_integers`, naming the sample and feature), values beyond the
    range of ``dtype`` (they would become inf).
    """
    if not isinstance(X, torch.Tensor):
        X = np.asarray(X)
        if X.dtype.kind == "c":
            raise ValueError(f"{name} must be real; got complex values (dtype {X.dtype}), whose "
                             "imaginary part would be lost")
        X = torch.as_tensor(X)
    if X.is_complex():
        raise ValueError(f"{name} must be real; got complex values (dtype {X.dtype}), whose "
                         "imaginary part would be lost")
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_samples, dim); got shape {tuple(X.shape)}")
    if not X.is_floating_point():
        check_exact_integers(X, name)
        X = X.to(torch.float64)
    if dim is not None and X.shape[1] != dim:
        raise ValueError(f"{name} have dimension {X.shape[1]}, expected {dim}")
    if X.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name}: empty batch (0 samples)")
    if not all_finite(X):
        raise ValueError(f"{name} contain NaN or inf (first at row {first_nonfinite(X)})")
    out = X.to(dtype=dtype or X.dtype, device=device)
    if out.dtype != X.dtype and torch.finfo(out.dtype).max < torch.finfo(X.dtype).max \
            and not all_finite(out):
        raise ValueError(
            f"{name} exceed the range of {out.dtype} (largest magnitude "
            f"{float(X.abs().max()):.3g}, the dtype's largest {torch.finfo(out.dtype).max:.3g}; "
            f"first at row {first_nonfinite(out)}): use a wider dtype (torch.float64) or "
            "rescale the features")
    return out


def check_exact_integers(X, name: str = "features") -> None:
    """Refuse integer features ``X`` ``(n, d)`` (a torch tensor or numpy array) that float64
    would round: beyond ``2**53`` not every integer is a float64 (``2**53 + 1`` would become
    ``2**53``, two different inputs one). A ``ValueError`` names the first such sample and
    feature; integers that float64 holds exactly (``2**60``) pass.

    >>> check_exact_integers(np.array([[1, 2**60], [3, -(2**53) - 1]]))
    Traceback (most recent call last):
    ...
    ValueError: features: sample 1, feature 1: the integer -9007199254740993 is not exact in float64 (it would become -9007199254740992.0); convert the features to floats yourself if rounding them is intended
    """
    if isinstance(X, torch.Tensor):
        integers = not (X.dtype == torch.bool or X.is_floating_point() or X.is_complex())
    else:
        integers = X.dtype.kind in "iu"
    if not integers or 0 in X.shape:
        return
    lo, hi = _integer_range(X)
    if max(-lo, hi) <= _EXACT_FLOAT64_INT:  # every integer up to 2**53 is a float64
        return
    exact = (X.cpu().numpy() if isinstance(X, torch.Tensor) else X).astype(object)  # Python ints
    rounded = np.frompyfunc(lambda v: float(v) != v, 1, 1)(exact).astype(bool)  # exact compare
    if rounded.any():
        i, j = (int(k) for k in np.argwhere(rounded.reshape(X.shape[0], -1))[0])
        value = exact.reshape(X.shape[0], -1)[i, j]
        raise ValueError(f"{name}: sample {i}, feature {j}: the integer {value} is not exact in "
                         f"float64 (it would become {float(value)!r}); convert the features to "
                         "floats yourself if rounding them is intended")


def _integer_range(X) -> tuple[int, int]:
    """``(min, max)`` of an integer tensor or array (unsigned 64-bit tensors through numpy)."""
    if isinstance(X, torch.Tensor) and X.dtype in (torch.int8, torch.int16, torch.int32,
                                                   torch.int64, torch.uint8):
        lo, hi = torch.aminmax(X)
        return int(lo), int(hi)
    arr = X.cpu().numpy() if isinstance(X, torch.Tensor) else X
    return int(arr.min()), int(arr.max())


def as_labels(y, *, n: int | None = None, name: str = "labels") -> torch.Tensor:
    """Return ``y`` as a 1-D int64 tensor (on the CPU) of length ``n``.

    Conversions that could merge or change labels are refused: floats must be integral and in
    ``[-2**63, 2**63)`` (so ``1e20`` and ``2e20`` do not both become one int64), unsigned labels
    must be below ``2**63`` (they would wrap to negative numbers).
    """
    if isinstance(y, torch.Tensor):
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"{name} must be integers; got dtype {y.dtype}")
        if y.dtype not in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            y = y.cpu().numpy()  # wider unsigned tensors: checked below like numpy arrays
    if not isinstance(y, torch.Tensor):
        arr = np.asarray(y)
        if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= _INT64_BOUND:
            raise ValueError(f"{name}: {int(arr.max())} does not fit an int64 label (labels must "
                             f"be below 2**63); it would wrap to a negative number")
        if arr.dtype.kind == "f":
            arr = _integral_floats(arr, name)
        elif arr.dtype.kind not in "iu":
            raise ValueError(f"{name} must be integers; got dtype {arr.dtype}")
        y = torch.from_numpy(np.array(arr, dtype=np.int64))  # a copy: arr may be read-only
    y = y.to(dtype=torch.int64, device="cpu")
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {tuple(y.shape)}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"{name} have length {y.shape[0]} but there are {n} samples")
    return y


def _integral_floats(arr: np.ndarray, name: str) -> np.ndarray:
    """Float labels as int64, refusing any that are not integers exactly representable in int64."""
    if not arr.size:
        raise ValueError(f"{name} must be integers; got dtype {arr.dtype}")
    with np.errstate(invalid="ignore"):
        integral = np.isfinite(arr) & (np.mod(arr, 1) == 0)
    if not integral.all():
        bad = arr.reshape(-1)[np.argmin(integral.reshape(-1))]
        raise ValueError(f"{name} must be integers; got dtype {arr.dtype} with the value {bad.item()!r}")
    inside = (arr >= -_INT64_BOUND) & (arr < _INT64_BOUND)
    if not inside.all():
        bad = arr.reshape(-1)[np.argmin(inside.reshape(-1))]
        raise ValueError(f"{name}: the float label {bad.item()!r} is outside the int64 range "
                         "[-2**63, 2**63): distinct labels that large could become one class; "
                         "encode the labels as integers yourself")
    ints = arr.astype(np.int64)
    if not np.array_equal(ints.astype(arr.dtype), arr):  # defensive: exact by the checks above
        raise ValueError(f"{name}: float labels do not convert to int64 exactly")
    return ints


def check_covariances(mats: torch.Tensor, labels, *, what: str = "covariance",
                      source: str = "", psd: bool = True) -> None:
    """Refuse class matrices ``(k, d, d)`` that are not finite, symmetric and PSD within tolerance.

    A matrix ``S`` passes when it is finite, ``max |S - S^T| <= SYMMETRY_RTOL * max |S|``, and
    ``S + PSD_RTOL * tr(S) I`` has a Cholesky factor (its smallest eigenvalue is at least
    ``-PSD_RTOL * tr(S)``). That is one Cholesky per class, of the matrix scaled to unit largest
    entry (no eigendecomposition), in two ``d x d`` work buffers; ``psd=False`` skips it (for a
    caller that decomposes the matrices anyway and checks their smallest eigenvalues). The
    error names ``source`` (a file), ``what`` and the first offending class of ``labels``.
    """
    prefix = f"{source}: " if source else ""
    d = mats.shape[-1]
    buf = torch.empty(d, d, dtype=mats.dtype, device=mats.device)
    factor = torch.empty_like(buf)
    info = torch.empty((), dtype=torch.int32, device=mats.device)
    for c, S in zip(labels, mats):
        lo, hi = (float(v) for v in torch.aminmax(S))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"{prefix}{what} of class {c} contains NaN or inf")
        scale = max(-lo, hi)
        if scale == 0.0:
            continue
        asym = float(torch.sub(S, S.T, out=buf).abs_().amax())
        if asym > SYMMETRY_RTOL * scale:
            raise ValueError(f"{prefix}{what} of class {c} is not symmetric: max |S - S^T| = "
                             f"{asym:.3g}, {asym / scale:.1e} of its largest entry (tolerance "
                             f"{SYMMETRY_RTOL:g})")
        if not psd:
            continue
        torch.mul(S, 1.0 / scale, out=buf)
        diag = buf.diagonal()
        diag.add_(PSD_RTOL * max(float(diag.sum()), 0.0))
        torch.linalg.cholesky_ex(buf, out=(factor, info))
        if int(info) != 0:
            raise not_psd_error(c, what=what, source=source)


def not_psd_error(label, *, what: str = "covariance", source: str = "") -> ValueError:
    """The error for a class matrix whose smallest eigenvalue is below ``-PSD_RTOL`` x its trace."""
    prefix = f"{source}: " if source else ""
    return ValueError(f"{prefix}{what} of class {label} is not positive semi-definite: its "
                      f"smallest eigenvalue is below -{PSD_RTOL:g} x its trace")


def check_positive_int(value, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def check_fraction(value, name: str) -> float:
    """``value`` if it is a number strictly between 0 and 1 (not a bool), else a ``ValueError``
    naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number strictly between 0 and 1; got {value!r}")
    return float(value)


def check_seed(value, name: str = "seed") -> int:
    """``value`` if it is an int seed (not a bool), else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int seed; got {value!r}")
    return int(value)


def check_nonnegative(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number >= 0; got {value!r}") from None
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    return value


def check_range(
    value,
    name: str,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float inside ``[low, high]`` (ends excluded where ``*_open``), else a
    ``ValueError`` naming ``name`` and the allowed interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        ok = above and below
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high_open or high == math.inf else "]"
        raise ValueError(f"{name} must be a finite number in {left}{low}, {high}{right}; "
                         f"got {value!r}")
    return float(value)


def check_choice(value, name: str, choices) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; known: {', '.join(map(str, choices))}")
    return value
