"""The compensator interface, shared input checks, and the :class:`Identity` compensator.

A compensator is fitted on the features that the old and the new backbone give for the same
unlabelled anchors, then maps class statistics collected under the old backbone into the new
feature space::

    comp = HopDC().fit(old_anchor_features, new_anchor_features)
    stats = comp.transform(stats, labels=old_classes)   # a new ClassGaussians

Compensators are dataclasses: the constructor only stores the arguments (checked in ``fit``),
fitted state ends with ``_``, ``fit`` returns ``self``, and :meth:`Compensator.get_config` gives a
JSON-serialisable dict that :func:`gdacil.drift.build_compensator` turns back into a compensator.

Each compensator has named presets (:attr:`Compensator.presets`): ``recommended`` is what the
constructor's defaults give; ``HopDC`` and ``LinearSLDC`` also have ``paper``, the setting of the
HopDC paper and its reference code. :meth:`Compensator.from_preset` builds one with overrides.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch

from .._params import Params
from .._presets import Presets
from .._random import make_generator
from .._validation import as_dtype, as_features, check_nonnegative, dtype_name
from ..errors import NotFittedError
from ..state import Stateful
from ..stats import ClassStatistics

if TYPE_CHECKING:
    pass  # typing.Self from Python 3.11

__all__ = [
    "Compensator",
    "Identity",
    "NotFittedError",
    "check_anchor_pairs",
    "l2_normalize_rows",
    "make_generator",
]

#: Statistics of either storage: a compensator returns the kind it is given.
_Stats = TypeVar("_Stats", bound=ClassStatistics)


def resolve_dtype(value) -> torch.dtype:
    """A compensator's ``dtype`` (``"float64"``, ``"float32"`` or the ``torch.dtype``)."""
    return as_dtype(value, allowed=("float64", "float32"))


def check_anchor_pairs(old_features, new_features, *, normalized: tuple[str, ...] = ()):
    """Validate a pair of anchor feature sets; return them as float64 tensors.

    Both must be finite 2-D arrays with the same number of rows (the same anchors, in the same
    order) and the same dimension. Zero-norm rows are rejected in the sets named in
    ``normalized`` (``"old_features"``, ``"new_features"``: those the compensator L2-normalises).
    """
    old = as_features(old_features, name="old_features", dtype=torch.float64)
    new = as_features(new_features, name="new_features", dtype=torch.float64)
    if old.shape[1] != new.shape[1]:
        raise ValueError(f"old_features and new_features must have the same dimension; got "
                         f"{old.shape[1]} and {new.shape[1]}")
    if old.shape[0] != new.shape[0]:
        raise ValueError(f"old_features and new_features must hold the same anchors (same number "
                         f"of rows); got {old.shape[0]} and {new.shape[0]}")
    new = new.to(old.device)
    for name, X in (("old_features", old), ("new_features", new)):
        if name in normalized:
            zero = X.norm(dim=1) == 0
            if zero.any():
                raise ValueError(f"{name} row {int(zero.nonzero()[0, 0])} has zero norm and "
                                 f"cannot be L2-normalised ({int(zero.sum())} such anchors)")
    return old, new


def l2_normalize_rows(X: torch.Tensor) -> torch.Tensor:
    """Rows divided by their Euclidean norm (a zero row stays zero)."""
    return X / X.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)


class Compensator(Params, Presets, Stateful, abc.ABC):
    """Maps class statistics from the old backbone's feature space into the new one's.

    Subclasses are dataclasses whose fields are the hyperparameters. They implement
    :meth:`_fit` (on validated float64 anchor pairs) and :meth:`_transform` (on validated,
    non-empty labels), and list in ``_normalized_sets`` the anchor sets they L2-normalise.
    """

    name: ClassVar[str] = ""
    #: Named hyperparameter sets (:mod:`gdacil._presets`): preset name -> the field values it
    #: sets (the others keep the constructor's defaults). ``recommended`` is the defaults.
    presets: ClassVar[dict[str, dict[str, Any]]] = {"recommended": {}}
    _normalized_sets: ClassVar[tuple[str, ...]] = ()
    #: fitted attributes: what :meth:`state_dict` stores (:mod:`gdacil.state`)
    _state_attributes: ClassVar[tuple[str, ...]] = ("n_anchors_", "dim_")
    if TYPE_CHECKING:  # every subclass is a dataclass, which dataclasses.fields accepts
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    # ---------------------------------------------------------------- public API
    def fit(self, old_features, new_features) -> Compensator:
        """Fit on the old and new features ``(N, d)`` of the same ``N`` unlabelled anchors.

        Returns ``self``. Raises ``ValueError`` naming the problem for anchor sets of different
        length or dimension, NaN/inf, empty sets, zero-norm anchors (for compensators that
        normalise) and invalid hyperparameters.
        """
        self._check_params()
        old, new = check_anchor_pairs(old_features, new_features,
                                      normalized=self._normalized_sets)
        self._fit(old, new)
        self.n_anchors_, self.dim_ = old.shape
        return self

    def transform(self, stats: _Stats, labels: Sequence[int] | None = None) -> _Stats:
        """Return a copy of ``stats`` with the classes in ``labels`` (all by default) moved into
        the new feature space. Other classes, and every count, are unchanged."""
        self._check_fitted()
        labels = self._target_labels(stats, labels)
        return self._transform(stats, labels)

    def fit_transform(self, old_features, new_features, stats: _Stats,
                      labels: Sequence[int] | None = None) -> _Stats:
        return self.fit(old_features, new_features).transform(stats, labels)

    def get_config(self) -> dict[str, Any]:
        """The hyperparameters as a JSON-serialisable dict, with the registry ``name`` (a
        ``torch.dtype`` as its name, a ``torch.Generator`` as ``"torch.Generator"``)."""
        config: dict[str, Any] = {"name": self.name}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.dtype):
                value = dtype_name(value)
            config[f.name] = "torch.Generator" if isinstance(value, torch.Generator) else value
        return config

    @property
    def is_fitted(self) -> bool:
        return hasattr(self, "dim_")

    # ------------------------------------------------------------- for subclasses
    def _check_params(self) -> None:
        """Validate hyperparameters (called by ``fit``); raise ``ValueError``."""

    @abc.abstractmethod
    def _fit(self, old: torch.Tensor, new: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def _transform(self, stats: _Stats, labels: list[int]) -> _Stats: ...

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFittedError(f"{type(self).__name__} is not fitted: call "
                                 "fit(old_features, new_features) before transform")

    def _target_labels(self, stats, labels) -> list[int]:
        if not isinstance(stats, ClassStatistics):
            raise TypeError(f"stats must be ClassGaussians or LowRankGaussians; "
                            f"got {type(stats).__name__}")
        if stats.dim != self.dim_:
            raise ValueError(f"the statistics have dimension {stats.dim} but the compensator was "
                             f"fitted on {self.dim_}-dimensional anchors")
        labels = stats.classes if labels is None else [int(c) for c in labels]
        if not labels:
            raise ValueError("no old classes to compensate (the statistics or `labels` are empty)")
        if len(set(labels)) != len(labels):
            raise ValueError(f"labels contain duplicates: {labels}")
        missing = [c for c in labels if c not in stats]
        if missing:
            raise ValueError(f"labels not present in the statistics: {missing[:20]}")
        return labels


def check_probability(value, name: str) -> float:
    value = check_nonnegative(value, name)
    if value > 1:
        raise ValueError(f"{name} must lie in [0, 1]; got {value!r}")
    return value


def check_positive_float(value, name: str) -> float:
    value = check_nonnegative(value, name)
    if value == 0:
        raise ValueError(f"{name} must be > 0; got {value!r}")
    return value


@dataclasses.dataclass(eq=False, kw_only=True)
class Identity(Compensator):
    """No compensation: the statistics are returned unchanged (the "SeqFT" baseline).

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.drift import Identity
    >>> g = torch.Generator().manual_seed(0)
    >>> stats = ClassGaussians(4).update(torch.randn(30, 4, generator=g), torch.arange(30) % 3)
    >>> old = torch.randn(10, 4, generator=g)
    >>> out = Identity().fit(old, old + 1).transform(stats)
    >>> torch.equal(out.means, stats.means)
    True
    """

    name: ClassVar[str] = "identity"

    def _fit(self, old, new) -> None:
        pass

    def _transform(self, stats, labels):
        return stats.copy()
