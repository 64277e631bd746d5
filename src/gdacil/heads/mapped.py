"""Streaming linear heads on a fixed feature map and pooled statistics (RanPAC, ACIL, RBF-LDA).

A :class:`MappedLinearHead` maps features ``x`` (the backbone's, dimension ``d``) through a seeded
:class:`~gdacil.stats.feature_maps.FeatureMap` ``phi`` to ``z = phi(x)`` (dimension ``M``),
accumulates :class:`~gdacil.stats.PooledGaussians` of ``z`` (class counts and means, one pooled
scatter), and scores ``g_c(x) = w_c^T z + b_c`` with ``(W, b)`` solved from the statistics alone.
The statistics are sums, so training task by task, or on shards merged afterwards, gives the head
trained on everything at once. The solve is lazy: it runs at the first prediction after the
statistics changed, so many small ``partial_fit`` calls cost one solve.

Persistence is one safetensors file: the statistics, the solved weights, and JSON metadata (the
constructor arguments, the feature map's description and the fitted scalars). The map's weights
are regenerated from its seed; nothing is pickled.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from .._params import Params
from .._presets import Presets
from .._validation import (
    all_finite,
    as_dtype,
    as_features,
    as_labels,
    check_positive_int,
    finite_flag,
)
from ..novelty import LOGIT_SCORES, check_method, logit_score
from ..state import State, Stateful, json_params
from ..stats import PooledGaussians
from ..stats.feature_maps import FeatureMap
from .base import (
    NotFittedError,
    checked_parameters,
    classes_to_forget,
    drop_fitted_state,
    finite_scores,
    rescaled_scores,
)

__all__ = ["DEFAULT_MAX_BYTES", "MappedLinearHead", "check_budget"]

DEFAULT_MAX_BYTES = 16 * 2**30
#: The dtypes a mapped head predicts in
_DTYPES = ("float64", "float32")


def check_budget(head, needed: int) -> None:
    """Refuse a state of ``needed`` bytes above ``head.max_bytes``, naming what to change."""
    limit = head.max_bytes
    if limit is not None and needed > limit:
        raise ValueError(
            f"{type(head).__name__}: this configuration needs about {needed / 2**30:.2f} GiB "
            f"(statistics and solve), more than max_bytes={limit / 2**30:.2f} GiB; reduce the "
            "feature dimension or the number of classes, or raise max_bytes"
        )


class MappedLinearHead(Params, Presets, Stateful, ABC):
    """Base class of the streaming heads ``g_c(x) = w_c^T phi(x) + b_c``.

    Subclasses implement ``_make_map(dim_in)``, ``_solve(stats)`` returning ``(W, b)`` (float64,
    ``(C, M)`` and ``(C,)``) and ``_state_bytes(M, C)``; they may override ``_observe(H, y)``
    (sees each mapped batch, when ``_needs_batch()``), ``_fitted_state()`` /
    ``_restore_state(state)`` (JSON-serialisable fitted scalars) and ``_merge_state(other)``.

    Parameters shared by every mapped head
    --------------------------------------
    dtype : {"float64", "float32"} or torch.dtype, default "float64"
        Dtype of prediction (the map and the weights). Statistics and solves are float64. The
        solve sets ``dtype_``, the ``torch.dtype`` in use.
    max_bytes : int or None, default 16 GiB
        Largest state (statistics plus the solve's work space) the head accepts; larger
        configurations are refused with a message before any memory is allocated. ``None``
        disables the check.
    forgettable : bool, default False
        Keep what :meth:`forget` needs to take a class out exactly: each class's within-class
        scatter besides the pooled one (``PooledGaussians(removable=True)``), as a factor of
        ``min(n_c + b_c, M)`` rows of ``M`` float64 numbers (``b_c`` the later batches that
        added samples to class ``c``): up to ``8 M^2`` bytes more per class, as much as the
        pooled scatter (0.8 GB per class at ``M = 10000``, 80 kB per class of 1 sample),
        which ``max_bytes`` does not count. Settings chosen from the samples themselves
        (RanPAC's ``lam="auto"``, RBF-LDA's ``bandwidth="auto"``) cannot be un-chosen, so a
        forgettable head needs them numeric.
    """

    _FORMAT: ClassVar[str] = ""
    #: The novelty score ``score_samples`` computes when none is named
    default_novelty: ClassVar[str] = "msp"

    def __init__(self, *, dtype="float64", max_bytes=DEFAULT_MAX_BYTES, forgettable=False):
        self.dtype = dtype
        self.max_bytes = max_bytes
        self.forgettable = forgettable

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def _make_map(self, dim_in: int) -> FeatureMap:
        """The (unfitted) feature map for inputs of dimension ``dim_in``."""

    @abstractmethod
    def _solve(self, stats: PooledGaussians) -> tuple[torch.Tensor, torch.Tensor]:
        """``(W, b)``: float64 weights ``(C, M)`` and biases ``(C,)`` from the statistics."""

    @abstractmethod
    def _state_bytes(self, dim: int, n_classes: int) -> int:
        """Bytes of statistics plus the solve's work space for ``n_classes`` classes."""

    def _needs_batch(self) -> bool:
        return False

    def _observe(self, H: torch.Tensor, y: torch.Tensor) -> None:
        """See one mapped batch ``H`` ``(n, M)`` (after the statistics were updated with it)."""

    def _start_state(self) -> None:
        """Initialise fitted scalars when the first batch (or statistics) arrives."""

    def _fitted_state(self) -> dict[str, Any]:
        return {}

    def _restore_state(self, state: dict[str, Any]) -> None:
        """Inverse of ``_fitted_state``."""

    def _merge_state(self, other: MappedLinearHead) -> None:
        """Combine fitted scalars when ``other`` is merged into ``self``."""

    def _chosen_from_data(self) -> str | None:
        """The parameter whose value the samples choose (set to "auto"), if any."""
        return None

    def _check_params(self) -> None:
        as_dtype(self.dtype, allowed=_DTYPES)
        if self.max_bytes is not None:
            check_positive_int(self.max_bytes, "max_bytes")
        if self.forgettable not in (False, True):
            raise ValueError(f"forgettable must be True or False; got {self.forgettable!r}")
        chosen = self._chosen_from_data()
        if self.forgettable and chosen:
            raise ValueError(
                f"{type(self).__name__}(forgettable=True) needs a numeric {chosen}: "
                f"{chosen}='auto' is chosen from the samples, those of any class it may forget "
                "included, and forget cannot undo that choice")

    # ------------------------------------------------------------------ fitting
    def fit(self, X, y) -> MappedLinearHead:
        """Forget everything, then :meth:`partial_fit`. Returns ``self``."""
        self._reset()
        return self.partial_fit(X, y)

    def partial_fit(self, X, y) -> MappedLinearHead:
        """Add a batch of features ``(n, d)`` with integer labels; unseen labels become new classes.

        The features are mapped and folded into the statistics; the weights are re-solved at the
        next prediction. Returns ``self``.
        """
        self._check_params()
        X = as_features(X, dim=getattr(self, "n_features_in_", None), dtype=torch.float64)
        y = as_labels(y, n=X.shape[0])
        if not hasattr(self, "stats_"):
            fmap = self._make_map(X.shape[1]).fit(X)
            check_budget(self, self._state_bytes(fmap.dim_out, len(torch.unique(y))))
            self._adopt(fmap, PooledGaussians(fmap.dim_out, removable=bool(self.forgettable)))
        else:
            fresh = {int(c) for c in torch.unique(y).tolist()} - set(self.stats_.classes)
            check_budget(self, self._state_bytes(self.stats_.dim, self.stats_.n_classes + len(fresh)))
        if self._needs_batch():
            H = self.feature_map_(X)
            self.stats_.update(H, y)
            self._observe(H, y)
        else:
            for start, stop, Z in self.feature_map_.iter_chunks(X):
                self.stats_.update(Z, y[start:stop])
        self._invalidate()
        return self

    def fit_stats(self, stats: PooledGaussians, feature_map: FeatureMap | None = None) -> MappedLinearHead:
        """Build the head from statistics of mapped features (replacing any state). Returns ``self``.

        ``stats`` are :class:`~gdacil.stats.PooledGaussians` of ``feature_map(x)`` (a
        :class:`~gdacil.ClassStatistics` is pooled first). ``feature_map`` must be the map this
        head would build (same kind, size and seed); omit it for heads without a random map.
        The statistics are copied.
        """
        self._check_params()
        if self._needs_batch():
            raise ValueError(f"{type(self).__name__}.fit_stats: this configuration learns from the "
                             "samples themselves (e.g. lam='auto'); fix it (a numeric lam) or use "
                             "partial_fit")
        if not isinstance(stats, PooledGaussians):
            stats = PooledGaussians.from_class_statistics(stats,
                                                          removable=bool(self.forgettable))
        if self.forgettable and not stats.removable:
            raise ValueError(f"{type(self).__name__}(forgettable=True).fit_stats: these pooled "
                             "statistics keep no class's own scatter; build them with "
                             "PooledGaussians(removable=True), or pass the ClassStatistics")
        if stats.n_classes == 0:
            raise ValueError(f"{type(self).__name__}.fit_stats: the statistics hold no classes")
        fmap = feature_map
        if fmap is None:
            fmap = self._make_map(stats.dim)
            if fmap.dim_out != stats.dim or fmap.name != "identity":
                raise ValueError(f"{type(self).__name__}.fit_stats: this head maps its features "
                                 "randomly; pass the feature_map the statistics were computed with")
        else:
            expected = self._make_map(fmap.dim_in)
            if type(fmap) is not type(expected) or _settings(fmap) != _settings(expected):
                raise ValueError(f"feature_map {fmap!r} is not the map of {self!r}")
            if not fmap.is_fitted:
                raise ValueError(f"feature_map {fmap!r} is not fitted")
            if fmap.dim_out != stats.dim:
                raise ValueError(f"statistics of dimension {stats.dim} do not match the map's "
                                 f"output dimension {fmap.dim_out}")
        check_budget(self, self._state_bytes(stats.dim, stats.n_classes))
        self._reset()
        self._adopt(fmap, stats.copy())
        self._invalidate()
        return self

    def merge(self, other: MappedLinearHead) -> MappedLinearHead:
        """Fold ``other`` (same class, same parameters, same fitted feature map) into ``self``.

        The statistics merge exactly, so heads fitted on shards and merged equal one head fitted
        on all the data. Returns ``self``.
        """
        if type(other) is not type(self):
            raise TypeError(f"cannot merge a {type(other).__name__} into a {type(self).__name__}")
        if json_params(other.get_params()) != json_params(self.get_params()):
            raise ValueError(f"cannot merge heads with different parameters: {other!r} into {self!r}")
        if not hasattr(other, "stats_"):
            return self
        if not hasattr(self, "stats_"):
            self._adopt(FeatureMap.from_dict(other.feature_map_.to_dict()), other.stats_.copy())
            self._restore_state(other._fitted_state())
        else:
            if self.n_features_in_ != other.n_features_in_ or self.feature_map_ != other.feature_map_:
                raise ValueError(
                    f"cannot merge heads with different feature maps ({other.feature_map_!r} into "
                    f"{self.feature_map_!r}); fix data-dependent settings such as the bandwidth")
            n_classes = len(set(self.stats_.classes) | set(other.stats_.classes))
            check_budget(self, self._state_bytes(self.stats_.dim, n_classes))
            self.stats_.merge(other.stats_)
            self._merge_state(other)
        self._invalidate()
        return self

    def forget(self, classes) -> MappedLinearHead:
        """Take ``classes`` out of the statistics exactly (counts, means and their scatters out
        of the pooled one); the weights are solved again at the next prediction. Returns
        ``self``.

        The head is then the head fitted on the samples of the other classes only, to the
        round-off of the pooled scatter: its statistics, fitted scalars (RanPAC's and ACIL's
        penalty floor, RBF-LDA's shrinkage) and weights are recomputed from what is left, and
        its state holds nothing of the classes. The feature map is the same (it depends on the
        seed alone: data-chosen settings are refused with ``forgettable=True``). Forgetting every
        class leaves the head unfitted.

        Parameters
        ----------
        classes : int or sequence of int
            Labels the head holds.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Before anything changes: the head was not built ``forgettable=True`` (one pooled
            ``M x M`` scatter cannot give a class back), or a label it does not hold.

        Examples
        --------
        >>> import torch
        >>> from gdacil.heads import ACIL
        >>> g = torch.Generator().manual_seed(0)
        >>> X, y = torch.randn(90, 4, generator=g, dtype=torch.float64), torch.arange(90) % 3
        >>> head = ACIL(buffer_size=32, forgettable=True).fit(X, y).forget(1)
        >>> never = ACIL(buffer_size=32).fit(X[y != 1], y[y != 1])
        >>> head.classes_.tolist(), bool(torch.allclose(head.decision_function(X),
        ...                                             never.decision_function(X)))
        ([0, 2], True)
        """
        if not hasattr(self, "stats_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet")
        name = type(self).__name__
        if not self.forgettable:
            raise ValueError(f"{name}.forget: this head pools every class's scatter into one "
                             "M x M matrix, from which no class can be taken out; build it "
                             f"{name}(..., forgettable=True) to keep each class's scatter too")
        if not self.stats_.removable:
            raise ValueError(f"{name}.forget: its statistics were gathered while forgettable "
                             "was False, so they keep no class's own scatter; fit it again")
        labels = classes_to_forget(self, classes, self.stats_.classes)
        if len(labels) == self.stats_.n_classes:
            drop_fitted_state(self)
        elif labels:
            self.stats_.remove_classes(labels)
            self._start_state()  # the fitted scalars of a fit on the classes left
            self._invalidate()
        return self

    def _adopt(self, fmap: FeatureMap, stats: PooledGaussians) -> None:
        self.feature_map_ = fmap
        self.n_features_in_ = fmap.dim_in
        self.stats_ = stats
        self._start_state()

    def _reset(self) -> None:
        for name in ("feature_map_", "n_features_in_", "stats_", "coef_", "intercept_", "dtype_"):
            self.__dict__.pop(name, None)

    def _invalidate(self) -> None:
        for name in ("coef_", "intercept_", "dtype_"):
            self.__dict__.pop(name, None)

    def solve(self) -> MappedLinearHead:
        """Solve the weights now, if the statistics changed since the last solve (otherwise the
        first prediction does). Returns ``self``."""
        self._ensure_solved()
        return self

    def _ensure_solved(self) -> None:
        if not hasattr(self, "stats_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")
        if not hasattr(self, "coef_"):
            self._set_weights(*self._solve(self.stats_))

    def _set_weights(self, W: torch.Tensor, b: torch.Tensor) -> None:
        self.dtype_ = as_dtype(self.dtype, allowed=_DTYPES)
        self.coef_, self.intercept_ = checked_parameters(self, self.dtype_, W.device, W, b)

    @property
    def classes_(self) -> torch.Tensor:
        """Class labels in the order of the score columns."""
        if not hasattr(self, "stats_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet")
        return torch.tensor(self.stats_.classes, dtype=torch.int64)

    # ------------------------------------------------------------------ scoring
    def _score_chunks(self, X):
        self._ensure_solved()
        for start, stop, Z in self.feature_map_.iter_chunks(X, dtype=self.dtype_):
            yield start, stop, torch.addmm(self.intercept_, Z, self.coef_.T)

    def _scores64(self, X) -> torch.Tensor:
        """Scores in float64 (map and weights upcast): the fallback when ``dtype`` overflows."""
        W, b = self.coef_.double().T, self.intercept_.double()
        return torch.cat([torch.addmm(b, Z, W) for _, _, Z in
                          self.feature_map_.iter_chunks(X, dtype=torch.float64)])

    def decision_function(self, X) -> torch.Tensor:
        """Scores ``(n, C)``, columns in the order of ``classes_``.

        Where they overflow the head's dtype, they are recomputed in float64 and shifted by
        their per-sample maximum (``argmax`` and the softmax unchanged); scores that are NaN or
        inf even then raise a ``ValueError``.
        """
        self._ensure_solved()
        out = torch.cat([scores for _, _, scores in self._score_chunks(X)])
        if not all_finite(out):
            out = rescaled_scores(self, self._scores64(X), self.dtype_)
        return out

    def predict(self, X) -> torch.Tensor:
        """Predicted labels ``(n,)`` (int64), computed chunk by chunk (from float64 scores where
        the head's dtype overflows; a ``ValueError`` where even those are NaN or inf)."""
        self._ensure_solved()
        finite, idx = torch.ones((), dtype=torch.bool), []
        for _, _, scores in self._score_chunks(X):
            finite &= finite_flag(scores)
            idx.append(scores.argmax(1))
        if not bool(finite):
            return self.classes_[finite_scores(self, self._scores64(X)).argmax(1)]
        return self.classes_[torch.cat(idx)]

    def predict_proba(self, X) -> torch.Tensor:
        """``softmax`` of :meth:`decision_function` (see each head for what the scores mean)."""
        return torch.softmax(self.decision_function(X), dim=1)

    def score_samples(self, X, method: str | None = None) -> torch.Tensor:
        """Novelty scores ``(n,)``, float64, higher meaning more typical of the classes learned
        so far: ``"msp"`` (the default: the largest softmax probability of the scores, the
        score users of these heads compare against) or ``"energy"`` (their ``logsumexp``). A
        mapped head keeps no per-class Gaussians of the features, so the distance scores of
        :mod:`gdacil.novelty` are not offered.

        Examples
        --------
        >>> import torch
        >>> from gdacil.heads import RanPAC
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.arange(200) % 2
        >>> X = torch.randn(200, 4, generator=g, dtype=torch.float64) + 3 * torch.eye(2, 4)[y]
        >>> head = RanPAC(dim_out=64, lam=1.0).partial_fit(X, y)
        >>> head.score_samples(X[:3]).shape
        torch.Size([3])
        """
        method = check_method(method, LOGIT_SCORES, default=self.default_novelty)
        return finite_scores(self, logit_score(self.decision_function(X), method),
                             "novelty scores")

    def score(self, X, y) -> float:
        """Mean accuracy of :meth:`predict` against labels ``y``."""
        pred = self.predict(X)
        y = as_labels(y, n=pred.shape[0])
        return float((pred == y).double().mean())

    # ------------------------------------------------------------------ memory
    def memory_report(self) -> dict[str, int]:
        """Bytes held: statistics, solved weights and the feature map's cached weights."""
        if not hasattr(self, "stats_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet")
        report = {"stats": self.stats_.nbytes, "feature_map": self.feature_map_.nbytes}
        if hasattr(self, "coef_"):
            report["coef"] = self.coef_.nbytes
            report["intercept"] = self.intercept_.nbytes
        report["total"] = sum(report.values())
        return report

    # ------------------------------------------------------------------ state
    def state_dict(self) -> State:
        """The pooled statistics of the mapped features, the solved weights, the map and the
        fitted scalars (:mod:`gdacil.state`)."""
        if not hasattr(self, "stats_"):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; it has no state")
        self._ensure_solved()
        tensors = {f"stats.{k}": v for k, v in self.stats_.state_dict().items()}
        tensors.update({"coef": self.coef_, "intercept": self.intercept_})
        return tensors, {"format": self._FORMAT, "class": type(self).__name__,
                         "params": json_params(self.get_params()),
                         "feature_map": self.feature_map_.to_dict(),
                         "state": self._fitted_state()}

    def load_state_dict(self, tensors, metadata, *,
                        source: str = "the state") -> MappedLinearHead:
        """Set a :meth:`state_dict` (validated) on this head; returns ``self``."""
        if metadata.get("format") != self._FORMAT:
            raise ValueError(f"{source}: not a {type(self).__name__} state (format "
                             f"{metadata.get('format')!r})")
        stats = PooledGaussians.from_state_dict(
            {k.removeprefix("stats."): v for k, v in tensors.items() if k.startswith("stats.")},
            source=source)
        fmap = FeatureMap.from_dict(metadata["feature_map"])
        if fmap.dim_out != stats.dim:
            raise ValueError(f"{source}: the feature map's dimension {fmap.dim_out} does not match the "
                             f"statistics' {stats.dim}")
        coef, intercept = tensors["coef"], tensors["intercept"]
        if coef.shape != (stats.n_classes, stats.dim) or intercept.shape != (stats.n_classes,):
            raise ValueError(f"{source}: solved weights of shape {tuple(coef.shape)} do not match "
                             f"{stats.n_classes} classes in dimension {stats.dim}")
        if not (all_finite(coef) and all_finite(intercept)):
            raise ValueError(f"{source}: the solved weights contain NaN or inf")
        self._reset()
        self._adopt(fmap, stats)
        self._restore_state(metadata.get("state", {}))
        self._set_weights(coef, intercept)
        return self


def _settings(fmap: FeatureMap) -> dict:
    """A map's configuration without its data-dependent resolved values (``name_``)."""
    return {k: v for k, v in fmap._config().items() if not k.endswith("_")}
