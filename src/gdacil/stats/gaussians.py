"""Per-class Gaussian statistics: the currency between backbones, compensators and heads.

:class:`ClassGaussians` keeps, for every class, the sample count ``n``, the mean ``mu`` and the
centred scatter matrix ``S = sum (x - mu)(x - mu)^T``, in float64. Batches and shards are combined
with the pairwise update of Chan, Golub and LeVeque (1979)::

    n  = n_a + n_b,   delta = mu_b - mu_a
    mu = mu_a + delta * n_b / n
    S  = S_a + S_b + delta delta^T * n_a n_b / n

which never forms raw sums of squares, so merging shards gives the statistics of the whole up to
round-off, in any order. The covariance is ``S / (n - ddof)``: ``ddof=0`` (the default) is the
paper's ``1/n``; ``ddof=1`` is the unbiased estimator the reference code uses.

:class:`ClassStatistics` is what heads and compensators rely on, shared by
:class:`ClassGaussians` and the compressed :class:`~gdacil.LowRankGaussians`: class bookkeeping
(labels, storage positions, revisions), counts and means, covariances in class blocks, the
average covariance, editing moments, sampling, persistence and a memory report.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .._deprecation import current_names
from .._validation import (
    all_finite,
    as_device,
    as_features,
    as_labels,
    check_covariances,
    check_nonnegative,
    check_positive_int,
    first_nonfinite,
)
from ..state import State, load_state, save_state
from ._index import ClassIndex
from .linalg import psd_factor, symmetrize

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = ["ClassGaussians", "ClassStatistics"]

_revision_counter = itertools.count(1)


def _next_revisions(k: int) -> list[int]:
    return [next(_revision_counter) for _ in range(k)]


class ClassStatistics(ClassIndex, abc.ABC):
    """Per-class Gaussian statistics as heads and compensators consume them.

    Holds the bookkeeping every storage shares (class labels in storage order, positions,
    revisions), the float64 counts ``(C,)`` and means ``(C, d)``, and the operations built on
    them. Subclasses decide how covariances are stored.

    Parameters
    ----------
    dim : int
        Feature dimension ``d``.
    ddof : {0, 1}, default 0
        Covariance normalisation ``1 / (n - ddof)`` the statistics were (or will be) built with.
    device : None, str or torch.device, default None
        Where the statistics live (None: the CPU).

    Notes
    -----
    A subclass keeps one row per class in each tensor named in ``_per_class`` (leading dimension:
    the allocated capacity, at least ``n_classes``), class-independent tensors in ``_shared``, and
    implements :meth:`covariances`, :meth:`average_covariance`, :meth:`sampling_factors`,
    ``_add_moments`` (new classes from dense moments), ``_write_covariances`` (replace
    covariances), ``_config`` (its constructor arguments, JSON-serialisable) and the sampling
    hooks ``_block_factors``, ``_check_factors``, ``_slice_factors`` and ``_deviations``.
    ``ClassStatistics.load`` reads a file of any registered storage.

    Examples
    --------
    >>> import os, tempfile, torch
    >>> from gdacil import ClassGaussians, ClassStatistics, LowRankGaussians
    >>> g = torch.Generator().manual_seed(0)
    >>> dense = ClassGaussians(6).update(torch.randn(60, 6, generator=g), torch.arange(60) % 3)
    >>> low = LowRankGaussians.from_dense(dense, rank=2)
    >>> isinstance(low, ClassStatistics), low.classes == dense.classes
    (True, True)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     low.save(os.path.join(tmp, "stats.safetensors"))
    ...     type(ClassStatistics.load(os.path.join(tmp, "stats.safetensors"))).__name__
    'LowRankGaussians'
    """

    _FORMAT: ClassVar[str] = ""
    _per_class: ClassVar[tuple[str, ...]] = ("_counts", "_means")
    _shared: ClassVar[tuple[str, ...]] = ()
    _growth: ClassVar[float] = 2.0  # capacity growth factor when classes are appended
    # True where _add_moments refuses indefinite covariances itself (from a decomposition it
    # computes anyway), so add_classes skips the Cholesky of check_covariances
    _decomposition_checks_psd: bool = False
    _formats: ClassVar[dict[str, type[ClassStatistics]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_FORMAT"):
            ClassStatistics._formats[cls._FORMAT] = cls

    def __init__(self, dim: int, *, ddof: int = 0, device: torch.device | str | None = None):
        self.dim = check_positive_int(dim, "dim")
        if ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 (1/n, the paper) or 1 (1/(n-1)); got {ddof!r}")
        self.ddof = ddof
        self.device = as_device(device)
        self._labels: list[int] = []
        self._index: dict[int, int] = {}
        self._revisions: list[int] = []
        self._counts = torch.zeros(0, dtype=torch.float64, device=self.device)
        self._means = torch.zeros(0, dim, dtype=torch.float64, device=self.device)

    # ------------------------------------------------------------------ views
    # classes, n_classes, len, in, counts, means, positions: ClassIndex's
    @property
    def capacity(self) -> int:
        """Classes the stacked tensors have room for (see :meth:`reserve`)."""
        return self._counts.shape[0]

    def revision(self, label: int) -> int:
        """A number that changes whenever the moments of ``label`` change (for caches)."""
        return self._revisions[self._position(label)]

    @abc.abstractmethod
    def covariances(self, labels: Sequence[int] | None = None) -> torch.Tensor:
        """Dense float64 covariances of ``labels`` (all classes by default), ``(k, d, d)``."""

    def covariance(self, label: int) -> torch.Tensor:
        return self.covariances([label])[0]

    def iter_batches(
        self, batch_size: int = 64, labels: Sequence[int] | None = None
    ) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(labels, counts, means, covariances)`` for consecutive blocks of classes.

        Peak memory is one block of ``batch_size`` covariances.
        """
        batch_size = check_positive_int(batch_size, "batch_size")
        labels = self.classes if labels is None else [int(c) for c in labels]
        for start in range(0, len(labels), batch_size):
            block = labels[start : start + batch_size]
            pos = self.positions(block).to(self.device)
            yield (block, self._counts[pos], self._means[pos], self.covariances(block))

    @abc.abstractmethod
    def average_covariance(self, batch_size: int = 64) -> torch.Tensor:
        """Unweighted mean of the class covariances, ``Sigma_avg = (1/C) sum_c Sigma_c``, float64."""

    # ------------------------------------------------------- building and editing
    def add_classes(self, labels: Sequence[int], means, covariances, counts) -> Self:
        """Add new classes from their moments: means ``(k, d)``, covariances ``(k, d, d)`` and
        counts ``(k,)``. Returns ``self``.

        Refused with a ``ValueError`` naming the class, before anything changes: counts that are
        not positive and finite, means or covariances with NaN or inf, covariances that are not
        symmetric and positive semi-definite within round-off (see
        :func:`~gdacil._validation.check_covariances`: one Cholesky per class), and what a
        storage cannot hold exactly (dense statistics: a non-zero covariance for a class with
        ``count <= ddof``, which they would store as zero).
        """
        labels = as_labels(labels, name="labels").tolist()
        means = as_features(means, dim=self.dim, dtype=torch.float64, device=self.device,
                            name="means")
        covs = torch.as_tensor(covariances, dtype=torch.float64).to(self.device)
        counts = torch.as_tensor(counts, dtype=torch.float64).to(self.device).reshape(-1)
        k = len(labels)
        if means.shape[0] != k or covs.shape != (k, self.dim, self.dim) or counts.shape[0] != k:
            raise ValueError(
                f"add_classes: expected {k} means (k, {self.dim}), covariances (k, {self.dim}, "
                f"{self.dim}) and counts (k,); got {tuple(means.shape)}, {tuple(covs.shape)}, "
                f"{tuple(counts.shape)}"
            )
        self._check_new(labels)
        _check_counts(counts, labels, "add_classes")
        check_covariances(covs, labels, source="add_classes",
                          psd=not self._decomposition_checks_psd)
        self._add_moments(labels, counts, means, covs)
        return self

    @abc.abstractmethod
    def _add_moments(self, labels: list[int], counts, means, covs) -> None:
        """Append new classes from validated float64 moments."""

    def with_moments(self, labels: Sequence[int], means, covariances=None) -> Self:
        """A copy whose ``labels`` have the given means and covariances (counts are kept).

        This is how drift compensators return transformed statistics; see :meth:`set_moments`.
        """
        return self.copy().set_moments(labels, means, covariances)

    def set_moments(self, labels: Sequence[int], means, covariances=None) -> Self:
        """Overwrite the means (and covariances) of ``labels`` in place. Returns ``self``.

        Counts are kept. With ``covariances=None`` only the means change (the covariances stay as
        they are). Covariances are symmetrised. In :class:`ClassGaussians`, a class with
        ``count <= ddof`` keeps its zero covariance whatever is given for it (its covariance is
        defined as zero), and covariances whose scatters would overflow float64 are refused
        before anything changes. Compensators write their results block by block
        with this, so peak memory is one block, not all classes.
        """
        labels = [int(c) for c in labels]
        pos = self.positions(labels).to(self.device)
        means = as_features(means, dim=self.dim, dtype=torch.float64, device=self.device,
                            name="means")
        if means.shape[0] != len(pos):
            raise ValueError(f"set_moments: {means.shape[0]} means for {len(pos)} labels")
        if covariances is not None:
            covs = torch.as_tensor(covariances, dtype=torch.float64).to(self.device)
            if covs.shape != (len(pos), self.dim, self.dim):
                raise ValueError(
                    f"set_moments: covariances must have shape ({len(pos)}, {self.dim}, "
                    f"{self.dim}); got {tuple(covs.shape)}"
                )
            if not torch.isfinite(covs).all():
                raise ValueError("set_moments: covariances contain NaN or inf")
            self._write_covariances(labels, pos, symmetrize(covs))
        self._means[pos] = means
        for p in pos.tolist():
            self._revisions[p] = _next_revisions(1)[0]
        return self

    @abc.abstractmethod
    def _write_covariances(self, labels: list[int], pos: torch.Tensor, covs: torch.Tensor) -> None:
        """Replace the covariances of existing classes (validated, symmetric, float64)."""

    def remove_classes(self, labels: Iterable[int]) -> Self:
        """Forget ``labels``. Returns ``self``."""
        drop = set(self.positions(labels).tolist())
        self._keep([i for i in range(self.n_classes) if i not in drop])
        return self

    def subset(self, labels: Sequence[int]) -> Self:
        """A new object holding only ``labels`` (in that order)."""
        out = self.copy()
        out._keep(out.positions(labels).tolist())
        return out

    def reserve(self, n_classes: int) -> Self:
        """Allocate room for ``n_classes`` classes in total (never shrinks). Returns ``self``.

        Appending grows the capacity geometrically; reserving the final size up front avoids
        both the spare capacity and the transient copy of a growth step.
        """
        n_classes = check_positive_int(n_classes, "n_classes", minimum=0)
        if n_classes > self.capacity:
            for name in self._per_class:
                setattr(self, name, _grow(getattr(self, name), n_classes))
        return self

    def _check_new(self, labels: list[int]) -> None:
        dup = [c for c in labels if c in self._index]
        if dup or len(set(labels)) != len(labels):
            raise ValueError(f"classes already present or repeated: {sorted(set(dup)) or labels}")

    def _make_room(self, k: int) -> None:
        """Room for ``k`` more classes, growing the capacity geometrically (by ``_growth``)."""
        if self.n_classes + k > self.capacity:
            self.reserve(max(self.n_classes + k, math.ceil(self._growth * self.capacity), 8))

    def _append_rows(self, labels: list[int], rows: dict[str, torch.Tensor]) -> None:
        """Append new classes; ``rows`` maps every name in ``_per_class`` to ``(k, ...)``."""
        self._check_new(labels)
        C, k = self.n_classes, len(labels)
        self._make_room(k)
        for name in self._per_class:
            getattr(self, name)[C : C + k] = rows[name]
        for offset, c in enumerate(labels):
            self._index[int(c)] = C + offset
        self._labels.extend(int(c) for c in labels)
        self._revisions.extend(_next_revisions(k))

    def _keep(self, keep: list[int]) -> None:
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        for name in self._per_class:
            setattr(self, name, getattr(self, name).index_select(0, idx))
        self._labels = [self._labels[i] for i in keep]
        self._revisions = [self._revisions[i] for i in keep]
        self._index = {c: i for i, c in enumerate(self._labels)}

    @abc.abstractmethod
    def _config(self) -> dict[str, Any]:
        """Constructor arguments (less ``device``), JSON-serialisable."""

    def copy(self) -> Self:
        out = type(self)(**self._config(), device=self.device)
        out._labels = list(self._labels)
        out._index = dict(self._index)
        out._revisions = list(self._revisions)
        for name in self._per_class:
            setattr(out, name, getattr(self, name)[: self.n_classes].clone())
        for name in self._shared:
            setattr(out, name, getattr(self, name).clone())
        return out

    def to(self, device: torch.device | str) -> Self:
        out = self.copy()
        out.device = as_device(device)
        for name in (*self._per_class, *self._shared):
            setattr(out, name, getattr(out, name).to(out.device))
        return out

    @contextlib.contextmanager
    def rollback_on_error(self, labels: Iterable[int]) -> Iterator[Self]:
        """Undo the ``with`` block's changes to the classes ``labels`` if the block raises.

        Saves the rows of those of ``labels`` already present (a copy of ``len(labels)``
        classes, not of all of them) and, on an exception, restores them with their revisions
        and forgets the classes the block appended; the exception propagates. Changes to other
        classes, and removals, are not undone.

        Examples
        --------
        >>> import torch
        >>> from gdacil import ClassGaussians
        >>> stats = ClassGaussians(2).update(torch.ones(3, 2), [0, 0, 1])
        >>> try:
        ...     with stats.rollback_on_error([0, 2]):
        ...         _ = stats.update(torch.zeros(2, 2), [0, 2])
        ...         raise RuntimeError("building the head failed")
        ... except RuntimeError:
        ...     pass
        >>> stats.classes, stats.counts.tolist()
        ([0, 1], [2.0, 1.0])
        """
        present = [int(c) for c in labels if int(c) in self._index]
        pos = self.positions(present).to(self.device)
        rows = {name: getattr(self, name).index_select(0, pos) for name in self._per_class}
        shared = {name: getattr(self, name).clone() for name in self._shared}
        n_classes, revisions = self.n_classes, list(self._revisions)
        try:
            yield self
        except BaseException:
            for c in self._labels[n_classes:]:
                del self._index[c]
            del self._labels[n_classes:]
            self._revisions = revisions
            for name, saved in rows.items():
                getattr(self, name)[pos] = saved
            for name, saved in shared.items():
                setattr(self, name, saved)
            raise

    # ----------------------------------------------------------------- sampling
    @abc.abstractmethod
    def sampling_factors(self, labels: Sequence[int] | None = None, *, jitter: float = 0.0,
                         batch_size: int = 64, dtype: torch.dtype = torch.float64):
        """Precomputed sampling factors of ``labels``, to pass to :meth:`sample` as ``factors``."""

    @abc.abstractmethod
    def _block_factors(self, labels: list[int], jitter: float, dtype: torch.dtype):
        """Sampling factors of one block of classes."""

    @abc.abstractmethod
    def _check_factors(self, factors, k: int) -> None:
        """Raise ``ValueError`` unless ``factors`` are sampling factors of ``k`` classes."""

    @abc.abstractmethod
    def _slice_factors(self, factors, start: int, stop: int):
        """The factors of classes ``start:stop``."""

    @abc.abstractmethod
    def _deviations(self, factors, noise: torch.Tensor) -> torch.Tensor:
        """``F_c e`` for standard-normal ``noise`` ``(k, n, d)``: deviations from the means."""

    def sample(
        self,
        n_per_class: int,
        *,
        generator: torch.Generator,
        labels: Sequence[int] | None = None,
        noise: torch.Tensor | None = None,
        jitter: float = 0.0,
        factors=None,
        batch_size: int = 64,
        dtype: torch.dtype = torch.float64,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n_per_class`` samples from ``N(mu_c, Sigma_c + jitter I)`` for every class in ``labels``.

        Parameters
        ----------
        generator : torch.Generator
            Required, so that every draw is reproducible.
        noise : tensor of shape ``(n_per_class, d)`` or ``(k, n_per_class, d)``, optional
            Standard-normal noise: one block shared by every class (common random numbers), or
            one block per class in ``labels`` order (``k = len(labels)``). Drawn from
            ``generator`` per class when omitted. Sample ``i`` of class ``c`` is
            ``mu_c + F_c noise_i`` with ``F_c F_c^T = Sigma_c + jitter I`` (see the storage's
            :meth:`sampling_factors`).
        jitter : float, default 0
            Added to the diagonal of every covariance.
        factors : optional
            Precomputed :meth:`sampling_factors` of ``labels`` (with the same ``jitter``), for
            callers that sample the same classes many times.

        Returns
        -------
        X : tensor ``(k * n_per_class, d)`` and y : int64 tensor of labels, grouped by class.
        """
        if not isinstance(generator, torch.Generator):
            raise TypeError("sample() needs an explicit torch.Generator (seeded) for reproducibility")
        n = check_positive_int(n_per_class, "n_per_class")
        jitter = check_nonnegative(jitter, "jitter")
        batch_size = check_positive_int(batch_size, "batch_size")
        labels = self.classes if labels is None else [int(c) for c in labels]
        if factors is not None:
            self._check_factors(factors, len(labels))
        if noise is not None and tuple(noise.shape) not in ((n, self.dim),
                                                            (len(labels), n, self.dim)):
            raise ValueError(f"noise must have shape ({n}, {self.dim}) or ({len(labels)}, {n}, "
                             f"{self.dim}); got {tuple(noise.shape)}")
        xs, ys = [], []
        for start in range(0, len(labels), batch_size):
            block = labels[start : start + batch_size]
            k = len(block)
            mu = self._means[self.positions(block).to(self.device)]
            F = (self._slice_factors(factors, start, start + k) if factors is not None
                 else self._block_factors(block, jitter, torch.float64))
            if noise is None:
                E = torch.randn((k, n, self.dim), dtype=torch.float64, generator=generator)
            elif noise.ndim == 2:
                E = noise.expand(k, n, self.dim)
            else:
                E = noise[start : start + k]
            E = E.to(dtype=torch.float64, device=self.device)
            xs.append((mu[:, None, :] + self._deviations(F, E)).reshape(-1, self.dim).to(dtype))
            ys.append(torch.tensor(block, dtype=torch.int64).repeat_interleave(n))
        if not xs:
            raise ValueError("sample: no classes to sample from")
        return torch.cat(xs), torch.cat(ys)

    # ---------------------------------------------------------------- persistence
    def memory_report(self) -> dict[str, int]:
        """Bytes held by each stored tensor (allocated capacity included) and their total."""
        report = {name.lstrip("_"): getattr(self, name).nbytes
                  for name in (*self._per_class, *self._shared)}
        report["total"] = sum(report.values())
        return report

    @property
    def nbytes(self) -> int:
        return self.memory_report()["total"]

    def state_dict(self) -> State:
        """``(tensors, metadata)``: the labels and every stored tensor (no spare capacity), and
        the format and configuration (:mod:`gdacil.state`)."""
        tensors = {"labels": torch.tensor(self._labels, dtype=torch.int64)}
        tensors.update({name.lstrip("_"): getattr(self, name)[: self.n_classes]
                        for name in self._per_class})
        tensors.update({name.lstrip("_"): getattr(self, name) for name in self._shared})
        return tensors, {"format": self._FORMAT, **self._config()}

    def load_state_dict(self, tensors: dict[str, torch.Tensor], metadata: dict, *,
                        source: str = "statistics") -> Self:
        """Replace these statistics by those of a state of the same storage; returns ``self``."""
        loaded = type(self).from_state((tensors, metadata), source=source, device=self.device)
        self.__dict__.update(loaded.__dict__)
        return self

    def save(self, path: str | os.PathLike) -> None:
        """Write the statistics to a safetensors file with JSON metadata (atomic; no pickle)."""
        save_state(path, self.state_dict())

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: torch.device | str | None = None):
        """Read statistics written by :meth:`save`.

        ``ClassStatistics.load`` accepts a file of any storage (dense or low-rank) and returns an
        object of the class that wrote it; ``ClassGaussians.load`` and friends accept only their
        own format.
        """
        return cls.from_state(load_state(path), source=str(path), device=device)

    @classmethod
    def from_state(cls, state: State, *, source: str = "statistics",
                   device: torch.device | str | None = None):
        """Statistics from a :meth:`state_dict` (of any storage for ``ClassStatistics``, of its
        own for a subclass), validated by :meth:`from_tensors`."""
        tensors, meta = state
        fmt: Any = meta.get("format")  # any JSON value in a file's metadata
        known = ClassStatistics._formats.get(fmt) if isinstance(fmt, str) else None
        target = known if cls is ClassStatistics else cls
        if target is None or fmt != target._FORMAT:
            raise ValueError(f"{source}: not a {cls.__name__} file (format {fmt!r})")
        return target.from_tensors(tensors, {k: v for k, v in meta.items() if k != "format"},
                                   source=source, device=device)

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], config: dict[str, Any], *,
                     source: str = "statistics", device: torch.device | str | None = None):
        """Rebuild and validate statistics from the tensors and configuration :meth:`save` writes.

        Every check names ``source`` (the file) and, where one is at fault, the class: the
        configuration (e.g. ``ddof`` must be 0 or 1), the tensors' presence, dtypes and shapes,
        unique labels, positive finite counts, finite means and the storage's own checks (dense:
        finite symmetric PSD scatters, zero for classes with ``count <= ddof``; low-rank: see
        :class:`~gdacil.LowRankGaussians`). Raises ``ValueError``.
        """
        ddof = config.get("ddof", 0)
        if isinstance(ddof, bool) or not isinstance(ddof, int) or ddof not in (0, 1):
            raise ValueError(f"{source}: ddof must be 0 or 1; got {ddof!r}")
        try:
            out = cls(**current_names(cls, config), device=device)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{source}: invalid {cls.__name__} configuration {config}: {err}") \
                from None
        names = [name.lstrip("_") for name in (*cls._per_class, *cls._shared)]
        missing = [n for n in ("labels", *names) if n not in tensors]
        if missing:
            raise ValueError(f"{source}: missing statistics tensors {missing}")
        label_tensor = tensors["labels"]
        if label_tensor.dtype != torch.int64 or label_tensor.ndim != 1:
            raise ValueError(f"{source}: labels must be a 1-D int64 tensor; got "
                             f"{label_tensor.dtype} of shape {tuple(label_tensor.shape)}")
        labels: list[int] = label_tensor.tolist()
        if len(set(labels)) != len(labels):
            raise ValueError(f"{source}: repeated class labels")
        for name in (*cls._per_class, *cls._shared):
            t, want = tensors[name.lstrip("_")], getattr(out, name)
            shape = (len(labels), *want.shape[1:]) if name in cls._per_class else tuple(want.shape)
            if tuple(t.shape) != shape or not t.is_floating_point():
                raise ValueError(f"{source}: {name.lstrip('_')} has dtype {t.dtype} and shape "
                                 f"{tuple(t.shape)}; expected a floating tensor of shape {shape}")
        rows = {name: tensors[name.lstrip("_")].to(device=out.device, dtype=getattr(out, name).dtype)
                for name in cls._per_class}
        _check_counts(rows["_counts"], labels, source)
        bad = first_nonfinite(rows["_means"]) if len(labels) else -1
        if bad >= 0:
            raise ValueError(f"{source}: the mean of class {labels[bad]} contains NaN or inf")
        shared = {name: tensors[name.lstrip("_")].to(device=out.device,
                                                      dtype=getattr(out, name).dtype)
                  for name in cls._shared}
        out._check_loaded(labels, rows, shared, source)
        if labels:
            out._append_rows(labels, rows)
        for name, t in shared.items():
            setattr(out, name, t)
        return out

    def _check_loaded(self, labels: list[int], rows: dict[str, torch.Tensor],
                      shared: dict[str, torch.Tensor], source: str) -> None:
        """Raise ``ValueError`` (naming ``source`` and the class) unless the storage-specific
        tensors read from a file are valid; counts and means are checked already."""


class ClassGaussians(ClassStatistics):
    """Streaming, mergeable per-class count, mean and covariance in float64.

    Parameters
    ----------
    dim : int
        Feature dimension ``d``.
    ddof : {0, 1}, default 0
        Covariance normalisation ``1 / (n - ddof)``. 0 is the LR-RGDA paper's
        maximum-likelihood estimate; 1 is the unbiased estimate of the reference code. A class
        with ``n <= ddof`` has a zero covariance (heads regularise it; see their docs).
    device : None, str or torch.device, default None
        Where the statistics live (None: the CPU).

    See Also
    --------
    gdacil.LowRankGaussians : the same interface with each covariance compressed to its top
        eigenpairs, for tens of thousands of classes.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(100, 8, generator=g), torch.arange(100) % 4
    >>> stats = ClassGaussians(8).update(X[:60], y[:60]).update(X[60:], y[60:])
    >>> stats.classes, stats.counts.tolist()
    ([0, 1, 2, 3], [25.0, 25.0, 25.0, 25.0])
    >>> torch.allclose(stats.means[1], X[y == 1].double().mean(0))
    True
    """

    _FORMAT: ClassVar[str] = "gdacil.ClassGaussians/1"
    _per_class: ClassVar[tuple[str, ...]] = ("_counts", "_means", "_scatters")

    def __init__(self, dim: int, *, ddof: int = 0, device: torch.device | str | None = None):
        super().__init__(dim, ddof=ddof, device=device)
        self._scatters = torch.zeros(0, dim, dim, dtype=torch.float64, device=self.device)

    def __repr__(self) -> str:
        return f"ClassGaussians(dim={self.dim}, n_classes={self.n_classes}, ddof={self.ddof})"

    def _config(self) -> dict[str, Any]:
        return {"dim": self.dim, "ddof": self.ddof}

    @property
    def scatters(self) -> torch.Tensor:
        """Centred scatter matrices ``sum (x - mu)(x - mu)^T``, shape ``(C, d, d)``."""
        return self._scatters[: self.n_classes]

    def covariances(self, labels: Sequence[int] | None = None) -> torch.Tensor:
        """Covariances ``S / (n - ddof)`` of ``labels`` (all classes by default), ``(k, d, d)``.

        Classes with ``n <= ddof`` get a zero matrix.
        """
        if labels is None:
            S, n = self.scatters, self.counts
        else:
            pos = self.positions(labels).to(self.device)
            S, n = self._scatters.index_select(0, pos), self._counts.index_select(0, pos)
        denom = n - self.ddof
        scale = torch.where(denom > 0, 1.0 / denom.clamp_min(1e-300), torch.zeros_like(denom))
        return S * scale[:, None, None]

    def average_covariance(self, batch_size: int = 64) -> torch.Tensor:
        """Unweighted mean of the class covariances, ``Sigma_avg = (1/C) sum_c Sigma_c``.

        Accumulated block by block so only ``batch_size`` covariances are materialised at once.
        """
        if self.n_classes == 0:
            raise ValueError("average_covariance: no classes")
        total = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=self.device)
        for _, _, _, covs in self.iter_batches(batch_size):
            total += covs.sum(0)
        total /= self.n_classes
        return 0.5 * (total + total.T)

    # ------------------------------------------------------------- accumulation
    def update(self, features, labels) -> ClassGaussians:
        """Add a batch of samples. New labels become new classes. Returns ``self``."""
        X = as_features(features, dim=self.dim, dtype=torch.float64, device=self.device)
        y = as_labels(labels, n=X.shape[0])
        uniq, inv = torch.unique(y, return_inverse=True)
        inv = inv.to(self.device)
        k = uniq.numel()
        n_b = torch.bincount(inv, minlength=k).to(torch.float64)
        mu_b = torch.zeros(k, self.dim, dtype=torch.float64, device=self.device)
        mu_b.index_add_(0, inv, X)
        mu_b /= n_b[:, None]
        Xc = X - mu_b[inv]
        order = torch.argsort(inv, stable=True)
        S_b = torch.stack([Xc_g.T @ Xc_g for Xc_g in torch.split(Xc[order], n_b.long().tolist())])
        self._combine(uniq.tolist(), n_b, mu_b, S_b)
        return self

    def merge(self, other: ClassGaussians) -> ClassGaussians:
        """Fold ``other``'s statistics into ``self`` exactly (per-class Chan merge). Returns ``self``."""
        if not isinstance(other, ClassGaussians):
            raise TypeError(f"can only merge ClassGaussians, got {type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"cannot merge statistics of dimension {other.dim} into {self.dim}")
        if other.n_classes:
            self._combine(
                other.classes,
                other.counts.to(self.device),
                other.means.to(self.device),
                other.scatters.to(self.device),
                "merge",
            )
        return self

    def _combine(self, labels: list[int], n_b, mu_b, S_b, what: str = "update") -> None:
        """Chan-merge a part (classes ``labels``, counts, means, scatters) into the statistics.

        Transactional: the merged moments of every class are computed first, and if any is
        NaN or inf (float64 overflow) a ``ValueError`` names the class and nothing changes.
        """
        known = [i for i, c in enumerate(labels) if c in self._index]
        fresh = [i for i, c in enumerate(labels) if c not in self._index]
        if known:
            sel = torch.tensor(known, device=self.device)
            pos = self.positions([labels[i] for i in known]).to(self.device)
            n_a, mu_a = self._counts[pos], self._means[pos]
            nb, mub = n_b[sel], mu_b[sel]
            n = n_a + nb
            delta = mub - mu_a
            means = mu_a + delta * (nb / n)[:, None]
            outer = delta[:, :, None] * delta[:, None, :]
            scatters = self._scatters[pos] + S_b[sel] + outer * (n_a * nb / n)[:, None, None]
            self._check_finite(what, [labels[i] for i in known], means, scatters)
        if fresh:
            sel_fresh = torch.tensor(fresh, device=self.device)
            self._check_finite(what, [labels[i] for i in fresh], mu_b[sel_fresh], S_b[sel_fresh])
        if known:
            self._means[pos] = means
            self._scatters[pos] = scatters
            self._counts[pos] = n
            for p in pos.tolist():
                self._revisions[p] = _next_revisions(1)[0]
        if fresh:
            self._append([labels[i] for i in fresh], n_b[sel_fresh], mu_b[sel_fresh],
                         S_b[sel_fresh])

    def _check_finite(self, what: str, labels: list[int], *moments: torch.Tensor) -> None:
        """Refuse a change that would store NaN or inf ``moments`` (per-class tensors, in
        ``labels`` order), naming the first such class."""
        if all(all_finite(t) for t in moments):
            return
        bad = min(i for i in map(first_nonfinite, moments) if i >= 0)
        raise ValueError(
            f"ClassGaussians.{what}: the statistics of class {labels[bad]} would become NaN or "
            "inf (float64 overflow: the values are too large for their squares to be summed); "
            "nothing was changed. Rescale the features")

    def _append(self, labels: list[int], counts, means, scatters) -> None:
        self._append_rows(labels, {"_counts": counts, "_means": means, "_scatters": scatters})

    # ------------------------------------------------------- building and editing
    @classmethod
    def from_moments(
        cls,
        labels: Sequence[int],
        means,
        covariances,
        counts,
        *,
        ddof: int = 0,
        device: torch.device | str | None = None,
    ) -> ClassGaussians:
        """Build statistics from given means ``(C, d)``, covariances ``(C, d, d)`` and counts ``(C,)``.

        Counts are needed so that later updates and merges weigh the classes correctly. The
        moments are validated as :meth:`~ClassStatistics.add_classes` does: positive finite
        counts, finite means, finite symmetric PSD covariances (within round-off), and a zero
        covariance for any class with ``count <= ddof`` (a non-zero one is refused, not
        dropped). ``ValueError`` names the first offending class.
        """
        means = as_features(means, name="means", dtype=torch.float64)
        stats = cls(means.shape[1], ddof=ddof, device=device)
        stats.add_classes(labels, means, covariances, counts)
        return stats

    def _add_moments(self, labels, counts, means, covs) -> None:
        self._append(labels, counts, means,
                     self._scatters_of(labels, counts, covs, "add_classes", strict=True))

    def _write_covariances(self, labels, pos, covs) -> None:
        self._scatters[pos] = self._scatters_of(labels, self._counts[pos], covs, "set_moments",
                                                strict=False)

    def _scatters_of(self, labels: list[int], counts, covs, what: str, *,
                     strict: bool) -> torch.Tensor:
        """Scatters ``(n - ddof) Sigma``, refusing, before any change, scatters that overflow
        float64. A class with ``n <= ddof`` has a zero scatter by definition: a non-zero
        covariance for it is refused when ``strict`` (new classes) and dropped otherwise
        (:meth:`set_moments` on existing classes, as documented there)."""
        denom = counts - self.ddof
        i = _nonzero_at_or_below_ddof(counts, covs, self.ddof) if strict else -1
        if i >= 0:
            raise ValueError(
                f"{what}: class {labels[i]} has count {float(counts[i]):g} <= ddof={self.ddof}, "
                "so its covariance is undefined (ClassGaussians hold it as zero), yet a non-zero "
                "covariance was given; give a zero covariance or a count above ddof")
        scatters = covs * denom.clamp_min(0.0)[:, None, None]
        self._check_finite(what, labels, scatters)
        return scatters

    def _check_loaded(self, labels, rows, shared, source) -> None:
        scatters, counts = rows["_scatters"], rows["_counts"]
        check_covariances(scatters, labels, what="scatter", source=source)
        i = _nonzero_at_or_below_ddof(counts, scatters, self.ddof)
        if i >= 0:
            raise ValueError(f"{source}: class {labels[i]} has count {float(counts[i]):g} <= "
                             f"ddof={self.ddof} but a non-zero scatter")

    # ----------------------------------------------------------------- sampling
    def sampling_factors(self, labels: Sequence[int] | None = None, *, jitter: float = 0.0,
                         batch_size: int = 64, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Factors ``F_c`` with ``F_c F_c^T = Sigma_c + jitter I`` (see :func:`~gdacil.stats.linalg.psd_factor`),
        shape ``(k, d, d)``, to pass to :meth:`sample` as ``factors``.

        The Cholesky factor, or an eigendecomposition factor for singular covariances (e.g.
        classes with fewer samples than dimensions).
        """
        jitter = check_nonnegative(jitter, "jitter")
        batch_size = check_positive_int(batch_size, "batch_size")
        labels = self.classes if labels is None else [int(c) for c in labels]
        return torch.cat([self._block_factors(labels[start : start + batch_size], jitter, dtype)
                          for start in range(0, len(labels), batch_size)])

    def _block_factors(self, labels, jitter, dtype) -> torch.Tensor:
        cov = self.covariances(labels)
        if jitter:
            cov = cov + jitter * torch.eye(self.dim, dtype=torch.float64, device=self.device)
        return psd_factor(cov).to(dtype)

    def _check_factors(self, factors, k: int) -> None:
        if not isinstance(factors, torch.Tensor) or tuple(factors.shape) != (k, self.dim, self.dim):
            raise ValueError(f"factors must have shape ({k}, {self.dim}, {self.dim}); got "
                             f"{tuple(getattr(factors, 'shape', ()))}")

    def _slice_factors(self, factors, start: int, stop: int) -> torch.Tensor:
        return factors[start:stop]

    def _deviations(self, factors, noise: torch.Tensor) -> torch.Tensor:
        return noise @ factors.to(device=self.device, dtype=torch.float64).transpose(1, 2)


def _nonzero_at_or_below_ddof(counts: torch.Tensor, mats: torch.Tensor, ddof: int) -> int:
    """Position of the first class with ``count <= ddof`` and a non-zero matrix (-1: none)."""
    for i in (counts <= ddof).nonzero().flatten().tolist():
        if bool(mats[i].any()):
            return i
    return -1


def _check_counts(counts: torch.Tensor, labels: list[int], source: str) -> None:
    """Refuse counts that are not positive and finite, naming the first such class."""
    bad = ~(torch.isfinite(counts) & (counts > 0))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{source}: counts must be positive and finite; class {labels[i]} has "
                         f"count {float(counts[i])!r}")


def _grow(t: torch.Tensor, capacity: int) -> torch.Tensor:
    out = torch.zeros((capacity, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out
