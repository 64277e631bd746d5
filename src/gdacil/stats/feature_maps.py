"""Fixed, seeded random feature maps applied before statistics and at prediction.

A feature map sends features ``x`` of dimension ``dim_in`` to ``phi(x)`` of dimension ``dim_out``.
Its weights are drawn on the CPU, in float64, from a ``torch.Generator`` seeded with ``seed``, so a
map is fully described by :meth:`FeatureMap.to_dict` (a few numbers): nothing else is saved, and
:meth:`FeatureMap.from_dict` regenerates the same weights. The dict also carries the sha256 of the
weights; regenerating weights that do not match it (another torch release drawing differently)
raises instead of silently giving another map.

========================  ======================================================  ==============
map                       ``phi(x)``                                              used by
========================  ======================================================  ==============
:class:`Identity`         ``x``                                                   ridge on raw x
:class:`RandomReLU`       ``relu(x W)``, ``W_ij ~ N(0, 1)``                       RanPAC
:class:`RandomBuffer`     ``relu(x W)``, ``W_ij ~ U(-1/sqrt(d), 1/sqrt(d))``      ACIL
:class:`RandomFourier`    ``sqrt(2/D) cos(x Omega + b)``, ``Omega ~ N(0, s^-2)``  RBF-LDA
========================  ======================================================  ==============

Maps are applied in row chunks, so the temporaries of one call stay near 32 MiB whatever the batch.
:class:`RandomReLU`, :class:`RandomBuffer` and :class:`Identity` are positively homogeneous
(``phi(t x) = t phi(x)`` for ``t > 0``); :class:`RandomFourier` with ``bandwidth="auto"`` is
scale-equivariant (its bandwidth scales with the data).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .._validation import as_dtype, as_features, check_positive_int, check_seed
from ..errors import NotFittedError
from ..hashing import sha256_tensors

__all__ = ["FeatureMap", "Identity", "RandomBuffer", "RandomFourier", "RandomReLU", "auto_bandwidth"]

_CHUNK_BYTES = 32 * 2**20


class FeatureMap:
    """Base class: a fixed map ``phi`` from ``dim_in`` to ``dim_out`` features.

    Subclasses set ``name`` and implement ``_draw()`` (the weights, from the seed) and
    ``_apply(X, weights)`` (one chunk of rows). Maps with data-dependent settings (the RBF
    bandwidth) resolve them in :meth:`fit`; the others are ready as constructed.
    """

    name: ClassVar[str] = ""
    _registry: ClassVar[dict[str, type[FeatureMap]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            FeatureMap._registry[cls.name] = cls

    def __init__(self, dim_in: int, dim_out: int, seed: int = 0):
        self.dim_in = check_positive_int(dim_in, "dim_in")
        self.dim_out = check_positive_int(dim_out, "dim_out")
        self.seed = check_seed(seed)
        self._weights: dict[torch.dtype, tuple[torch.Tensor, ...]] = {}
        self._expected_sha256: str | None = None

    # ------------------------------------------------------------ configuration
    @property
    def is_fitted(self) -> bool:
        """Whether the map can be applied (data-dependent settings are resolved)."""
        return True

    def fit(self, X) -> FeatureMap:
        """Resolve data-dependent settings from a batch (no-op for most maps). Returns ``self``."""
        return self

    def _config(self) -> dict[str, Any]:
        return {"dim_in": self.dim_in, "dim_out": self.dim_out, "seed": self.seed}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable description from which :meth:`from_dict` rebuilds the same map."""
        out = {"name": self.name, **self._config()}
        if self.is_fitted and self._has_weights():
            out["weights_sha256"] = self.weights_sha256()
        return out

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> FeatureMap:
        """Rebuild a map from :meth:`to_dict`; ``FeatureMap.from_dict`` accepts any registered map."""
        config = dict(config)
        name = config.pop("name", None)
        target = FeatureMap._registry.get(name)
        if target is None or (cls is not FeatureMap and target is not cls):
            raise ValueError(f"not a {cls.__name__} description (name {name!r}); known maps: "
                             f"{', '.join(sorted(FeatureMap._registry))}")
        sha = config.pop("weights_sha256", None)
        out = target._from_config(config)
        out._expected_sha256 = sha
        return out

    @classmethod
    def _from_config(cls, config: dict[str, Any]) -> FeatureMap:
        return cls(**config)

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and self._config() == other._config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self._config().items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._config().items())})"

    # ------------------------------------------------------------------ weights
    def _has_weights(self) -> bool:
        return True

    def _draw(self) -> tuple[torch.Tensor, ...]:
        """The weights in float64 on the CPU, drawn from ``torch.Generator().manual_seed(seed)``."""
        raise NotImplementedError  # intended: each feature map draws its own weights

    def weights(self, dtype: torch.dtype | str = "float64") -> tuple[torch.Tensor, ...]:
        """The map's weights (cached per dtype), regenerated from the seed on first use."""
        dtype = as_dtype(dtype)
        if dtype not in self._weights:
            if torch.float64 not in self._weights:
                drawn = tuple(w.contiguous() for w in self._draw())
                self._weights[torch.float64] = drawn
                if self._expected_sha256 is not None:
                    self._verify(drawn)
            self._weights[dtype] = tuple(w.to(dtype) for w in self._weights[torch.float64])
        return self._weights[dtype]

    def _verify(self, drawn) -> None:
        got = sha256_tensors((str(i), w) for i, w in enumerate(drawn))
        if got != self._expected_sha256:
            self._weights.clear()
            raise ValueError(
                f"{self!r}: the weights regenerated from the seed differ from the saved ones "
                "(sha256 mismatch); this torch release draws random numbers differently from the "
                "one that saved the map"
            )

    def weights_sha256(self) -> str:
        """sha256 of the float64 weights (what :meth:`to_dict` records)."""
        return sha256_tensors((str(i), w) for i, w in enumerate(self.weights()))

    @property
    def nbytes(self) -> int:
        """Bytes of the cached weights (all dtypes)."""
        return sum(w.nbytes for ws in self._weights.values() for w in ws)

    # ---------------------------------------------------------------- applying
    def chunk_rows(self) -> int:
        """Rows per chunk, so that one chunk of output holds about 32 MiB."""
        return max(1, _CHUNK_BYTES // (8 * max(self.dim_out, self.dim_in)))

    def iter_chunks(self, X, *, dtype: torch.dtype | str = "float64"):
        """Yield ``(start, stop, phi(X[start:stop]))`` over row chunks of ``X`` (validated:
        2-D, ``dim_in`` columns, finite)."""
        X = self._validate(X, dtype)
        yield from self._chunks(X)

    def __call__(self, X, *, dtype: torch.dtype | str = "float64") -> torch.Tensor:
        """``phi(X)``, shape ``(n, dim_out)``, in ``dtype`` (float64 by default)."""
        X = self._validate(X, dtype)
        out = torch.empty(X.shape[0], self.dim_out, dtype=X.dtype)
        for start, stop, Z in self._chunks(X):
            out[start:stop] = Z
        return out

    def _validate(self, X, dtype) -> torch.Tensor:
        if not self.is_fitted:
            raise NotFittedError(f"{self!r} is not fitted: call fit(X) on a first batch")
        return as_features(X, dim=self.dim_in, dtype=as_dtype(dtype))

    def _chunks(self, X: torch.Tensor):
        weights = self.weights(X.dtype)
        step = self.chunk_rows()
        for start in range(0, X.shape[0], step):
            stop = min(X.shape[0], start + step)
            yield start, stop, self._apply(X[start:stop], weights)

    def _apply(self, X: torch.Tensor, weights) -> torch.Tensor:
        raise NotImplementedError  # intended: each feature map applies its own weights


class Identity(FeatureMap):
    """``phi(x) = x``: heads on the raw features.

    Examples
    --------
    >>> import torch
    >>> from gdacil.stats.feature_maps import Identity
    >>> Identity(3)(torch.ones(2, 3)).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    """

    name = "identity"

    def __init__(self, dim_in: int):
        super().__init__(dim_in, dim_in, 0)

    def _config(self) -> dict[str, Any]:
        return {"dim_in": self.dim_in}

    def _has_weights(self) -> bool:
        return False

    def _draw(self):
        return ()

    def _apply(self, X, weights):
        return X.clone()


class RandomReLU(FeatureMap):
    """RanPAC's random projection: ``phi(x) = relu(x W)``, ``W`` of shape ``(dim_in, dim_out)``
    with independent standard normal entries.

    Parameters
    ----------
    dim_in : int
        Input feature dimension ``d``.
    dim_out : int, default 10000
        Projection dimension ``M`` (RanPAC's default).
    seed : int, default 0

    Notes
    -----
    The weights cost ``8 d M`` bytes in float64 (31 MB for ``d = 384, M = 10000``), and applying
    the map ``2 n d M`` flops.

    Examples
    --------
    >>> import torch
    >>> from gdacil.stats.feature_maps import FeatureMap, RandomReLU
    >>> phi = RandomReLU(4, 16, seed=1)
    >>> X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    >>> H = phi(X)
    >>> H.shape, bool((H >= 0).all())
    (torch.Size([3, 16]), True)
    >>> torch.equal(FeatureMap.from_dict(phi.to_dict())(X), H)
    True
    """

    name = "random_relu"

    def __init__(self, dim_in: int, dim_out: int = 10_000, seed: int = 0):
        super().__init__(dim_in, dim_out, seed)

    def _draw(self):
        g = torch.Generator().manual_seed(self.seed)
        return (torch.randn(self.dim_in, self.dim_out, generator=g, dtype=torch.float64),)

    def _apply(self, X, weights):
        return torch.relu_(X @ weights[0])


class RandomBuffer(FeatureMap):
    """ACIL's buffer layer: ``phi(x) = relu(x W)``, ``W_ij ~ U(-1/sqrt(d), 1/sqrt(d))``, no bias.

    The uniform bound is ``torch.nn.Linear``'s default initialisation (Kaiming-uniform with
    ``a = sqrt(5)``), which is how ACIL draws its frozen buffer. The bias is left out (ACIL's buffer
    has none by default), so the map is positively homogeneous like :class:`RandomReLU`.

    Parameters
    ----------
    dim_in : int
    dim_out : int, default 8192
        Buffer width (ACIL's default).
    seed : int, default 0

    Examples
    --------
    >>> import torch
    >>> from gdacil.stats.feature_maps import RandomBuffer
    >>> W, = RandomBuffer(4, 8).weights()
    >>> bool(W.abs().max() <= 0.5)
    True
    """

    name = "random_buffer"

    def __init__(self, dim_in: int, dim_out: int = 8192, seed: int = 0):
        super().__init__(dim_in, dim_out, seed)

    def _draw(self):
        g = torch.Generator().manual_seed(self.seed)
        bound = 1.0 / math.sqrt(self.dim_in)
        U = torch.rand(self.dim_in, self.dim_out, generator=g, dtype=torch.float64)
        return (U.mul_(2.0 * bound).sub_(bound),)

    def _apply(self, X, weights):
        return torch.relu_(X @ weights[0])


def auto_bandwidth(X) -> float:
    """The RBF bandwidth ``sqrt(mean_{i != j} ||x_i - x_j||^2)``: the root-mean-square distance
    between two samples of the batch, ``sqrt(2 tr(Cov))`` with the unbiased covariance.

    Computed from the count, the sum and the sum of squared norms (``O(n d)``, no random draw),
    so it is reproducible, merges across chunks, and scales with the data: multiplying ``X`` by
    ``t > 0`` multiplies the bandwidth by ``t``.
    """
    X = as_features(X, dtype=torch.float64)
    n = X.shape[0]
    if n < 2:
        raise ValueError("bandwidth='auto' needs a first batch of at least 2 samples")
    total = X.sum(0)
    mean_sq = (2.0 * n * X.square().sum() - 2.0 * total.square().sum()) / (n * (n - 1))
    value = math.sqrt(max(float(mean_sq), 0.0))
    if not value > 0.0:
        raise ValueError("bandwidth='auto': all samples of the first batch are identical; "
                         "pass a positive bandwidth")
    return value


class RandomFourier(FeatureMap):
    """Random Fourier features of the RBF kernel ``exp(-||x - y||^2 / (2 s^2))``:
    ``phi(x) = sqrt(2 / D) cos(x Omega + b)``, ``Omega_ij ~ N(0, s^-2)``, ``b_j ~ U[0, 2 pi)``.

    Parameters
    ----------
    dim_in : int
    dim_out : int, default 5000
        Number of features ``D`` (KLDA's default; RanDumb uses up to 25,000).
    bandwidth : float > 0 or "auto", default "auto"
        The kernel width ``s``. "auto" is resolved by :meth:`fit` on the first batch as the
        root-mean-square distance between its samples (:func:`auto_bandwidth`): cheap,
        deterministic and proportional to the features' scale. The resolved value is
        ``bandwidth_`` and is saved by :meth:`to_dict`.
    seed : int, default 0

    Notes
    -----
    ``Omega`` is drawn standard normal and divided by ``s`` when the map is applied, so the
    drawn weights do not depend on the bandwidth.

    Examples
    --------
    >>> import torch
    >>> from gdacil.stats.feature_maps import RandomFourier
    >>> X = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    >>> phi = RandomFourier(3, 2000, seed=0).fit(X)
    >>> K = phi(X[:2]) @ phi(X[:2]).T   # approximates the RBF kernel
    >>> exact = torch.exp(-torch.cdist(X[:2], X[:2]).square() / (2 * phi.bandwidth_ ** 2))
    >>> bool((K - exact.double()).abs().max() < 0.1)
    True
    """

    name = "random_fourier"

    def __init__(self, dim_in: int, dim_out: int = 5000, bandwidth="auto", seed: int = 0):
        super().__init__(dim_in, dim_out, seed)
        if bandwidth != "auto":
            try:
                bandwidth = float(bandwidth)
            except (TypeError, ValueError):
                raise ValueError(f"bandwidth must be 'auto' or a number > 0; got {bandwidth!r}") from None
            if not (math.isfinite(bandwidth) and bandwidth > 0):
                raise ValueError(f"bandwidth must be a finite number > 0; got {bandwidth!r}")
        self.bandwidth = bandwidth
        self._resolved: float | None = None

    @property
    def bandwidth_(self) -> float:
        """The bandwidth in use: the given number, or the value "auto" resolved in :meth:`fit`."""
        if self.bandwidth != "auto":
            return self.bandwidth
        if self._resolved is None:
            raise AttributeError("bandwidth_: bandwidth='auto' is resolved by fit(X)")
        return self._resolved

    @property
    def is_fitted(self) -> bool:
        return self.bandwidth != "auto" or self._resolved is not None

    def fit(self, X) -> RandomFourier:
        """Resolve ``bandwidth="auto"`` from ``X`` (once; later calls keep it). Returns ``self``."""
        if not self.is_fitted:
            self._resolved = auto_bandwidth(as_features(X, dim=self.dim_in))
        return self

    def _config(self) -> dict[str, Any]:
        out = {**super()._config(), "bandwidth": self.bandwidth}
        if self.is_fitted:
            out["bandwidth_"] = self.bandwidth_
        return out

    @classmethod
    def _from_config(cls, config):
        config = dict(config)
        resolved = config.pop("bandwidth_", None)
        out = cls(**config)
        if resolved is not None and out.bandwidth == "auto":
            out._resolved = float(resolved)
        return out

    def _draw(self):
        g = torch.Generator().manual_seed(self.seed)
        omega = torch.randn(self.dim_in, self.dim_out, generator=g, dtype=torch.float64)
        phase = torch.rand(self.dim_out, generator=g, dtype=torch.float64).mul_(2.0 * math.pi)
        return omega, phase

    def _apply(self, X, weights):
        omega, phase = weights
        Z = torch.addmm(phase, X, omega, alpha=1.0 / self.bandwidth_)
        return Z.cos_().mul_(math.sqrt(2.0 / self.dim_out))
