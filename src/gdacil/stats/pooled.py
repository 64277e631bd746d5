"""Class counts and means plus ONE pooled within-class scatter: statistics for shared-covariance heads.

:class:`PooledGaussians` keeps, in float64, the count ``n_c`` and mean ``mu_c`` of every class and
the pooled within-class scatter ``S_w = sum_c S_c`` with ``S_c = sum_{i in c} (x_i - mu_c)(x_i -
mu_c)^T``; no per-class scatter is ever stored, so the memory is ``8 (C M + M^2)`` bytes in
dimension ``M`` (0.8 GB for ``M = 10000``, any ``C`` up to 1000; 1.6 GB at 10,000 classes)
instead of ``8 C M^2``.

A class cannot be taken out of ``S_w`` again, unless the statistics are ``removable``: they then
also keep each class's scatter as a factor ``F_c`` with ``S_c = F_c^T F_c`` (its centred samples,
plus one row per later batch of the class, and its ``M x M`` triangular QR factor once that has
fewer rows), and :meth:`PooledGaussians.remove_classes` subtracts ``F_c^T F_c`` from ``S_w``.

That is all that ridge regression on one-hot targets and LDA with one shared covariance need::

    G = sum_i x_i x_i^T = S_w + sum_c n_c mu_c mu_c^T          (gram)
    Q[:, c] = sum_{i in c} x_i = n_c mu_c                       (cross)
    Sigma_pooled = S_w / (N - ddof C)                           (pooled_covariance)

Batches and shards combine with the pairwise update of Chan, Golub and LeVeque (1979): a class
seen in both parts gets ``mu = mu_a + (mu_b - mu_a) n_b / n`` and adds
``n_a n_b / n (mu_b - mu_a)(mu_b - mu_a)^T`` to ``S_w``, which never forms raw sums of squares, so
shards merged in any order give the one-pass statistics up to round-off.
"""

from __future__ import annotations

import math
import os
from typing import ClassVar

import torch

from .._validation import (
    SYMMETRY_RTOL,
    all_finite,
    as_device,
    as_features,
    as_labels,
    check_positive_int,
)
from ..io import load_tensors, save_tensors
from ._index import ClassIndex
from .linalg import symmetrize

__all__ = ["PooledGaussians"]


class PooledGaussians(ClassIndex):
    """Streaming, mergeable class counts and means and one pooled within-class scatter (float64).

    The class views (``classes``, ``n_classes``, ``len``, ``in``, ``counts``, ``means``,
    ``positions``) are those of :class:`~gdacil.ClassStatistics`.

    Parameters
    ----------
    dim : int
        Feature dimension ``M``.
    removable : bool, default False
        Also keep each class's scatter, so that :meth:`remove_classes` can take a class out
        exactly: a factor of ``min(n_c + b_c, M)`` rows of ``M`` float64 numbers per class
        (``b_c`` the later batches or merges that added samples to it), at most ``8 M^2``
        bytes, on top of the pooled ``8 M^2``. Merging needs both sides removable.
    device : None, str or torch.device, default None
        Where the statistics live (None: the CPU).

    Examples
    --------
    >>> import torch
    >>> from gdacil.stats import PooledGaussians
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(90, 4, generator=g, dtype=torch.float64), torch.arange(90) % 3
    >>> a = PooledGaussians(4).update(X[:50], y[:50])
    >>> b = PooledGaussians(4).update(X[50:], y[50:])
    >>> a.merge(b).counts.tolist()
    [30.0, 30.0, 30.0]
    >>> torch.allclose(a.gram(), X.T @ X)
    True
    """

    _FORMAT: ClassVar[str] = "gdacil.PooledGaussians/1"

    def __init__(self, dim: int, *, removable: bool = False,
                 device: torch.device | str | None = None):
        self.dim = check_positive_int(dim, "dim")
        if removable not in (False, True):
            raise ValueError(f"removable must be True or False; got {removable!r}")
        self.removable = bool(removable)
        self.device = as_device(device)
        self._labels: list[int] = []
        self._index: dict[int, int] = {}
        self._counts = torch.zeros(0, dtype=torch.float64, device=self.device)
        self._means = torch.zeros(0, self.dim, dtype=torch.float64, device=self.device)
        self._scatter = torch.zeros(self.dim, self.dim, dtype=torch.float64, device=self.device)
        self._factors: dict[int, torch.Tensor] = {}  # removable: label -> F_c, S_c = F_c^T F_c

    def __repr__(self) -> str:
        removable = ", removable=True" if self.removable else ""
        return f"PooledGaussians(dim={self.dim}, n_classes={self.n_classes}{removable})"

    # ------------------------------------------------------------------ views
    @property
    def n_samples(self) -> int:
        """Total number of samples ``N``."""
        return round(float(self.counts.sum())) if self.n_classes else 0

    @property
    def scatter(self) -> torch.Tensor:
        """The pooled within-class scatter ``S_w`` ``(M, M)``, symmetrised (a new tensor)."""
        return symmetrize(self._scatter)

    def gram(self) -> torch.Tensor:
        """``G = S_w + sum_c n_c mu_c mu_c^T = sum_i x_i x_i^T`` ``(M, M)``."""
        mu = self.means
        return symmetrize(torch.addmm(self._scatter, mu.T, mu * self.counts[:, None]))

    def class_scatter(self, label: int) -> torch.Tensor:
        """The within-class scatter ``S_c`` ``(M, M)`` of one class (removable statistics)."""
        self._check_removable("class_scatter")
        F = self._factors[self._labels[self._position(label)]]  # KeyError naming an unknown one
        return symmetrize(F.T @ F)

    def cross(self) -> torch.Tensor:
        """``Q`` ``(M, C)`` with ``Q[:, c] = n_c mu_c = sum_{i in c} x_i`` (one-hot targets)."""
        return (self.means * self.counts[:, None]).T

    def pooled_covariance(self, ddof: int = 0) -> torch.Tensor:
        """``S_w / (N - ddof C)``: ``ddof=0`` is scikit-learn's LDA covariance (empirical priors),
        ``ddof=1`` the unbiased pooled estimate."""
        if ddof not in (0, 1):
            raise ValueError(f"ddof must be 0 or 1; got {ddof!r}")
        if self.n_classes == 0:
            raise ValueError("pooled_covariance: no classes")
        dof = float(self.counts.sum()) - ddof * self.n_classes
        if dof <= 0:
            raise ValueError(f"pooled_covariance(ddof={ddof}): {self.n_samples} samples in "
                             f"{self.n_classes} classes leave no degrees of freedom")
        return self.scatter / dof

    # ------------------------------------------------------------- accumulation
    def update(self, features, labels) -> PooledGaussians:
        """Add a batch ``(n, M)`` with integer labels ``(n,)``; new labels become new classes.
        Returns ``self``."""
        X = as_features(features, dim=self.dim, dtype=torch.float64, device=self.device)
        y = as_labels(labels, n=X.shape[0])
        uniq, inv = torch.unique(y, return_inverse=True)
        inv = inv.to(self.device)
        n_b = torch.bincount(inv, minlength=uniq.numel()).to(torch.float64)
        mu_b = torch.zeros(uniq.numel(), self.dim, dtype=torch.float64, device=self.device)
        mu_b.index_add_(0, inv, X)
        mu_b /= n_b[:, None]
        Xc = X - mu_b[inv]
        # every entry of Xc^T Xc is at most the sum over samples of their largest squared entry
        reach = float(Xc.abs().amax(1).square().sum()) if Xc.numel() else 0.0
        parts = None
        if self.removable:  # each class's centred samples factor its scatter
            order = torch.argsort(inv, stable=True)
            parts = torch.split(Xc[order], n_b.long().tolist())
        self._combine("update", uniq.tolist(), n_b, mu_b, lambda S: S.addmm_(Xc.T, Xc), reach,
                      parts)
        return self

    def merge(self, other: PooledGaussians) -> PooledGaussians:
        """Fold ``other`` into ``self`` exactly (Chan merge of every shared class). Returns ``self``."""
        if not isinstance(other, PooledGaussians):
            raise TypeError(f"can only merge PooledGaussians, got {type(other).__name__}")
        if other.dim != self.dim:
            raise ValueError(f"cannot merge statistics of dimension {other.dim} into {self.dim}")
        if self.removable and not other.removable and other.n_classes:
            raise ValueError("cannot merge statistics that are not removable into removable ones: "
                             "their classes' scatters are not kept; build both removable")
        if other.n_classes:
            S_other = other._scatter.to(self.device)
            parts = ([other._factors[c].to(self.device) for c in other.classes]
                     if self.removable else None)
            self._combine("merge", other.classes, other.counts.to(self.device),
                          other.means.to(self.device), lambda S: S.add_(S_other),
                          _largest_entry(S_other), parts)
        return self

    def _combine(self, what: str, labels: list[int], n_b, mu_b, add_scatter, reach: float,
                 parts=None) -> None:
        """Combine a part with classes ``labels``, counts, means and a function adding its ``S_w``
        (whose entries are at most ``reach`` in magnitude), and, for removable statistics, the
        factors ``parts`` of its classes' scatters (in ``labels`` order).

        Transactional: a part that would make any statistic NaN or inf is refused (``ValueError``)
        and nothing changes. The scatter is updated in place when a bound on its new entries
        shows it cannot overflow; only near the float64 limit is it built in a copy and checked.
        """
        factors = self._grown_factors(labels, n_b, mu_b, parts) if parts is not None else {}
        known = [i for i, c in enumerate(labels) if c in self._index]
        fresh = [i for i, c in enumerate(labels) if c not in self._index]
        means = mu_b
        if known:
            sel = torch.tensor(known, device=self.device)
            pos = self.positions([labels[i] for i in known]).to(self.device)
            n_a, mu_a, nb = self._counts[pos], self._means[pos], n_b[sel]
            n = n_a + nb
            delta = mu_b[sel] - mu_a
            weights = n_a * nb / n
            means = torch.cat([mu_b, mu_a + delta * (nb / n)[:, None]])
            reach += float((weights * delta.abs().amax(1).square()).sum())
        if not all_finite(means):
            raise self._overflow(what)
        # S_w is PSD (a sum of scatters): its largest entry is on the diagonal
        reach += 2.0 * float(self._scatter.diagonal().abs().max())
        in_place = reach < _SAFE_MAGNITUDE
        S = self._scatter if in_place else self._scatter.clone()
        add_scatter(S)
        if known:
            S.addmm_(delta.T, delta * weights[:, None])
        if not in_place:
            if not all_finite(S):
                raise self._overflow(what)
            self._scatter = S
        if known:
            self._means[pos] = means[len(mu_b):]
            self._counts[pos] = n
        if fresh:
            sel = torch.tensor(fresh, device=self.device)
            self._append([labels[i] for i in fresh], n_b[sel], mu_b[sel])
        self._factors.update(factors)

    def _grown_factors(self, labels: list[int], n_b, mu_b, parts) -> dict[int, torch.Tensor]:
        """The scatter factors of ``labels`` once a part with counts ``n_b``, means ``mu_b`` and
        scatter factors ``parts`` joins them: a class already held stacks its factor, the part's
        and the Chan term's row ``sqrt(n_a n_b / n) (mu_b - mu_a)``."""
        out = {}
        for i, c in enumerate(labels):
            rows = [parts[i]]
            if c in self._index:
                p = self._index[c]
                n_a = self._counts[p]
                weight = (n_a * n_b[i] / (n_a + n_b[i])).sqrt()
                rows = [self._factors[c], parts[i], (weight * (mu_b[i] - self._means[p]))[None]]
            out[c] = _compressed(torch.cat(rows))
        return out

    # ------------------------------------------------------------------ removal
    def remove_classes(self, labels) -> PooledGaussians:
        """Take ``labels`` out of the statistics exactly: their counts and means, and their
        scatters out of ``S_w`` (removable statistics only). Returns ``self``.

        ``S_w`` loses ``F_c^T F_c`` for each class (round-off of ``S_w``'s magnitude remains);
        once no class is left it is zero. An unknown label raises a ``KeyError`` naming it and
        nothing changes.
        """
        self._check_removable("remove_classes")
        drop = set(self.positions(labels).tolist())
        keep = [i for i in range(self.n_classes) if i not in drop]
        for i in sorted(drop):
            F = self._factors.pop(self._labels[i])
            self._scatter.addmm_(F.T, F, alpha=-1.0)
        if not keep:
            self._scatter.zero_()
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self._counts = self._counts.index_select(0, idx)
        self._means = self._means.index_select(0, idx)
        self._labels = [self._labels[i] for i in keep]
        self._index = {c: i for i, c in enumerate(self._labels)}
        return self

    def _check_removable(self, what: str) -> None:
        if not self.removable:
            raise ValueError(f"PooledGaussians.{what}: these statistics pool every class's "
                             "scatter into one matrix and keep no class's own, so no class can "
                             "be taken out of it; build them with removable=True")

    @staticmethod
    def _overflow(what: str) -> ValueError:
        return ValueError(f"PooledGaussians.{what}: this would make the statistics NaN or inf "
                          "(float64 overflow: the values are too large for their squares to be "
                          "summed); nothing was changed. Rescale the features")

    def _append(self, labels: list[int], counts, means) -> None:
        C, k = self.n_classes, len(labels)
        if C + k > self._counts.shape[0]:
            capacity = max(C + k, math.ceil(1.5 * self._counts.shape[0]), 8)
            self._counts = _grow(self._counts, capacity)
            self._means = _grow(self._means, capacity)
        self._counts[C : C + k] = counts
        self._means[C : C + k] = means
        for offset, c in enumerate(labels):
            self._index[int(c)] = C + offset
        self._labels.extend(int(c) for c in labels)

    def copy(self) -> PooledGaussians:
        out = PooledGaussians(self.dim, removable=self.removable, device=self.device)
        out._labels, out._index = list(self._labels), dict(self._index)
        out._counts, out._means = self.counts.clone(), self.means.clone()
        out._scatter = self._scatter.clone()
        out._factors = {c: F.clone() for c, F in self._factors.items()}
        return out

    # ---------------------------------------------------------------- persistence
    def memory_report(self) -> dict[str, int]:
        """Bytes of each stored tensor (allocated capacity included) and their total."""
        report = {"counts": self._counts.nbytes, "means": self._means.nbytes,
                  "scatter": self._scatter.nbytes}
        if self.removable:
            report["class_factors"] = sum(F.nbytes for F in self._factors.values())
        report["total"] = sum(report.values())
        return report

    @property
    def nbytes(self) -> int:
        return self.memory_report()["total"]

    @staticmethod
    def estimate_bytes(dim: int, n_classes: int) -> int:
        """Bytes of the statistics of ``n_classes`` classes in dimension ``dim`` (float64)."""
        return 8 * (dim * dim + n_classes * (dim + 1))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors that :meth:`from_state_dict` rebuilds the statistics from; removable
        statistics add the factors of the classes' scatters, stacked in class order
        (``class_factors``), and their numbers of rows (``class_factor_rows``)."""
        tensors = {"labels": torch.tensor(self._labels, dtype=torch.int64), "counts": self.counts,
                   "means": self.means, "scatter": self._scatter}
        if self.removable:
            factors = [self._factors[c] for c in self._labels]
            tensors["class_factors"] = (torch.cat(factors) if factors else
                                        self._scatter.new_zeros(0, self.dim))
            tensors["class_factor_rows"] = torch.tensor([len(F) for F in factors],
                                                        dtype=torch.int64)
        return tensors

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], *,
                        device: torch.device | str | None = None, source: str = "state") -> PooledGaussians:
        """Rebuild and validate statistics from :meth:`state_dict` (``source`` names it in errors)."""
        missing = [k for k in ("labels", "counts", "means", "scatter") if k not in tensors]
        if missing:
            raise ValueError(f"{source}: missing tensors {missing}")
        labels, counts = tensors["labels"], tensors["counts"].to(torch.float64)
        means, scatter = tensors["means"].to(torch.float64), tensors["scatter"].to(torch.float64)
        C, M = means.shape if means.ndim == 2 else (-1, -1)
        if (labels.ndim != 1 or labels.dtype != torch.int64 or counts.shape != (labels.numel(),)
                or labels.numel() != C or scatter.shape != (M, M)):
            raise ValueError(f"{source}: inconsistent shapes: labels {tuple(labels.shape)}, counts "
                             f"{tuple(counts.shape)}, means {tuple(means.shape)}, scatter "
                             f"{tuple(scatter.shape)}")
        if len(set(labels.tolist())) != C:
            raise ValueError(f"{source}: repeated class labels")
        if not (torch.isfinite(means).all() and torch.isfinite(scatter).all()
                and torch.isfinite(counts).all()) or (counts <= 0).any():
            raise ValueError(f"{source}: counts must be positive and all values finite")
        _check_scatter(scatter, source)
        out = cls(M, removable="class_factors" in tensors, device=device)
        if C:
            out._append(labels.tolist(), counts.to(out.device), means.to(out.device))
        out._scatter = scatter.to(out.device).clone()
        if out.removable:
            out._factors = _loaded_factors(tensors, labels.tolist(), scatter, source, out.device)
        return out

    def save(self, path: str | os.PathLike) -> None:
        """Write the statistics to a safetensors file with JSON metadata (atomic; no pickle)."""
        save_tensors(path, self.state_dict(), {"format": self._FORMAT, "dim": self.dim})

    @classmethod
    def load(cls, path: str | os.PathLike, *, device: torch.device | str | None = None) -> PooledGaussians:
        """Read and validate statistics written by :meth:`save`."""
        tensors, meta = load_tensors(path)
        if meta.get("format") != cls._FORMAT:
            raise ValueError(f"{path}: not a PooledGaussians file (format {meta.get('format')!r})")
        out = cls.from_state_dict(tensors, device=device, source=str(path))
        if out.dim != meta.get("dim"):
            raise ValueError(f"{path}: dimension {out.dim} does not match the metadata {meta.get('dim')}")
        return out

    # ------------------------------------------------------------------ builders
    @classmethod
    def from_class_statistics(cls, stats, *, removable: bool = False) -> PooledGaussians:
        """Pool per-class statistics (:class:`~gdacil.ClassGaussians` or any
        :class:`~gdacil.ClassStatistics`): ``S_w = sum_c (n_c - ddof) Sigma_c``. ``removable``
        also keeps each class's ``(n_c - ddof) Sigma_c`` as the factor
        ``diag(sqrt(s)) U^T`` of its eigendecomposition (rows of zero eigenvalues dropped)."""
        out = cls(stats.dim, removable=removable, device=stats.device)
        if stats.n_classes:
            for labels, counts, _, covs in stats.iter_batches(64):
                weight = (counts - stats.ddof).clamp_min(0.0)
                scatters = covs * weight[:, None, None]
                out._scatter += scatters.sum(0)
                if removable:
                    out._factors.update(zip(labels, map(_eigen_factor, scatters)))
            if not all_finite(out._scatter):
                raise PooledGaussians._overflow("from_class_statistics")
            out._append(stats.classes, stats.counts.clone(), stats.means.clone())
        return out


#: Entries below this bound leave room for the round-off of a few more additions in float64
_SAFE_MAGNITUDE = torch.finfo(torch.float64).max / 16


def _largest_entry(t: torch.Tensor) -> float:
    if not t.numel():
        return 0.0
    lo, hi = torch.aminmax(t)
    return max(-float(lo), float(hi))


def _check_scatter(S: torch.Tensor, source: str, block: int = 512) -> None:
    """Cheap necessary conditions of a PSD scatter (``O(M^2)`` in row blocks, no factorisation):
    symmetric within :data:`~gdacil._validation.SYMMETRY_RTOL`, a non-negative diagonal and
    ``|S_ij| <= sqrt(S_ii S_jj)`` (Cauchy-Schwarz) up to the same relative tolerance."""
    scale = _largest_entry(S)
    if not scale:
        return
    diag = S.diagonal()
    if bool((diag < 0).any()):
        raise ValueError(f"{source}: the pooled scatter has a negative variance on its diagonal")
    root, tol = diag.sqrt(), SYMMETRY_RTOL * scale
    for a in range(0, S.shape[0], block):
        rows = S[a:a + block]
        if float((rows - S[:, a:a + block].T).abs().max()) > tol:
            raise ValueError(f"{source}: the pooled scatter is not symmetric")
        if bool((rows.abs() > torch.outer(root[a:a + block], root) + tol).any()):
            raise ValueError(f"{source}: the pooled scatter is not positive semi-definite (a "
                             "covariance larger than its variances allow)")


def _compressed(F: torch.Tensor) -> torch.Tensor:
    """``F`` ``(k, M)``, or where ``k > M`` its triangular QR factor ``R`` ``(M, M)``: the same
    ``F^T F = R^T R`` in fewer rows."""
    return torch.linalg.qr(F, mode="r").R if F.shape[0] > F.shape[1] else F.contiguous()


def _eigen_factor(S: torch.Tensor) -> torch.Tensor:
    """``F`` with ``F^T F = S`` for a symmetric PSD ``S``: ``diag(sqrt(s)) U^T`` over its
    positive eigenvalues (round-off below zero clamped)."""
    s, U = torch.linalg.eigh(symmetrize(S))
    keep = s > 0
    return (U[:, keep] * s[keep].sqrt()).T.contiguous()


def _loaded_factors(tensors: dict[str, torch.Tensor], labels: list[int], scatter: torch.Tensor,
                    source: str, device) -> dict[int, torch.Tensor]:
    """The class factors of a removable state, checked: shapes, finite values, and a trace that
    sums to ``S_w``'s (within round-off)."""
    rows, stacked = tensors.get("class_factor_rows"), tensors["class_factors"]
    M = scatter.shape[0]
    if (rows is None or rows.dtype != torch.int64 or rows.shape != (len(labels),)
            or bool((rows < 0).any()) or stacked.ndim != 2 or stacked.shape[1] != M
            or int(rows.sum()) != stacked.shape[0]):
        raise ValueError(f"{source}: the class factors do not match {len(labels)} classes in "
                         f"dimension {M}")
    stacked = stacked.to(device=device, dtype=torch.float64)
    if not all_finite(stacked):
        raise ValueError(f"{source}: the class factors contain NaN or inf")
    trace, total = float(stacked.square().sum()), float(scatter.diagonal().sum())
    if abs(trace - total) > 1e-6 * abs(total):
        raise ValueError(f"{source}: the class factors' scatters do not add up to the pooled "
                         f"scatter (traces {trace:.6g} and {total:.6g})")
    return {c: F.clone() for c, F in zip(labels, torch.split(stacked, rows.tolist()))}


def _grow(t: torch.Tensor, capacity: int) -> torch.Tensor:
    out = torch.zeros((capacity, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out

