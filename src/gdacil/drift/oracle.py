"""Oracle: statistics recomputed from the true new-backbone features of the old classes' samples.

Not a compensator one can use in exemplar-free learning (it needs the old samples); it gives the
target every compensator is measured against (:mod:`gdacil.drift.diagnostics`) and an upper bound
on what compensation can achieve.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .._validation import as_features, as_labels, check_positive_int
from ..state import State, nest, part
from ..stats import ClassGaussians
from .base import Compensator, check_anchor_pairs

__all__ = ["Oracle"]


@dataclasses.dataclass(eq=False, kw_only=True)
class Oracle(Compensator):
    """Replaces the moments of old classes by those of their true new-backbone features.

    Fit it on labelled samples of the old classes, with :meth:`fit` (``old_features`` may be
    ``None``; if given, it is only checked to pair with ``new_features``), :meth:`from_features`, or
    from statistics collected under the new backbone with :meth:`from_stats`. The covariances are
    expressed with the ``ddof`` of the statistics being transformed; counts are kept.

    Parameters
    ----------
    class_batch : int, default 16
        Classes written together.

    Attributes
    ----------
    stats_ : ClassGaussians
        The statistics of the true new features.

    Examples
    --------
    >>> import torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.drift import Oracle
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(60, 4, generator=g), torch.arange(60) % 3
    >>> stats = ClassGaussians(4).update(X, y)             # old backbone
    >>> oracle = Oracle.from_features(2 * X + 1, y)        # the same samples, new backbone
    >>> out = oracle.transform(stats)
    >>> torch.allclose(out.means, 2 * stats.means + 1)
    True
    """

    name: ClassVar[str] = "oracle"

    class_batch: int = 16

    def fit(self, old_features, new_features, labels=None) -> Oracle:
        """Fit on the new features ``(n, d)`` of labelled old-class samples. Returns ``self``."""
        check_positive_int(self.class_batch, "class_batch")
        if labels is None:
            raise ValueError("Oracle.fit needs the class labels of the samples: "
                             "fit(old_features, new_features, labels)")
        if old_features is None:
            new = as_features(new_features, name="new_features")
        else:
            _, new = check_anchor_pairs(old_features, new_features)
        y = as_labels(labels, n=new.shape[0])
        return self._set_reference(ClassGaussians(new.shape[1], device=new.device).update(new, y))

    @classmethod
    def from_features(cls, new_features, labels, **config) -> Oracle:
        """An oracle fitted on the new features of labelled old-class samples."""
        return cls(**config).fit(None, new_features, labels)

    @classmethod
    def from_stats(cls, new_stats: ClassGaussians, **config) -> Oracle:
        """An oracle whose reference is ``new_stats`` (collected under the new backbone)."""
        if not isinstance(new_stats, ClassGaussians):
            raise TypeError(f"new_stats must be a ClassGaussians; got {type(new_stats).__name__}")
        if new_stats.n_classes == 0:
            raise ValueError("new_stats holds no classes")
        oracle = cls(**config)
        check_positive_int(oracle.class_batch, "class_batch")
        return oracle._set_reference(new_stats.copy())

    def _set_reference(self, stats: ClassGaussians) -> Oracle:
        self.stats_ = stats
        self.n_anchors_ = int(stats.counts.sum())
        self.dim_ = stats.dim
        return self

    def state_dict(self) -> State:
        """The reference statistics (``stats_``, nested) and the fitted scalars."""
        tensors, metadata = super().state_dict()
        if "stats_" in self.__dict__:
            nested, meta = nest({"stats_": self.stats_.state_dict()})
            tensors, metadata = {**tensors, **nested}, {**metadata, **meta}
        return tensors, metadata

    def load_state_dict(self, tensors, metadata, *, source: str = "the state") -> Oracle:
        own = {k: v for k, v in tensors.items() if not k.startswith("stats_.")}
        super().load_state_dict(own, {k: v for k, v in metadata.items() if k != "stats_"},
                                source=source)
        if "stats_" in metadata:
            stats = ClassGaussians.from_state(part((tensors, metadata), "stats_"), source=source)
            self._set_reference(stats)
        return self

    def _fit(self, old, new) -> None:  # pragma: no cover - fit is overridden
        raise NotImplementedError  # intended: the oracle is fitted on statistics, not anchors

    def _transform(self, stats, labels):
        missing = [c for c in labels if c not in self.stats_]
        if missing:
            raise ValueError(f"the oracle has no statistics for classes {missing[:20]}")
        ref = self.stats_
        if ref.ddof != stats.ddof:
            ref = ref.copy()
            ref.ddof = stats.ddof
        out = stats.copy()
        for block, _, means, covs in ref.iter_batches(self.class_batch, labels):
            out.set_moments(block, means.to(stats.device), covs.to(stats.device))
        return out
