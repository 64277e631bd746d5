"""Class bookkeeping shared by the statistics classes: labels in storage order, their positions,
and the per-class counts and means (:class:`~gdacil.ClassStatistics`,
:class:`~gdacil.stats.PooledGaussians`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["ClassIndex"]


class ClassIndex:
    """Views of the classes a statistics object holds.

    A subclass keeps ``_labels`` (integer labels in storage order), ``_index`` (label ->
    position) and the float64 ``_counts`` ``(capacity,)`` and ``_means`` ``(capacity, d)``, of
    which the first ``n_classes`` rows are in use.
    """

    _labels: list[int]
    _index: dict[int, int]
    _counts: torch.Tensor
    _means: torch.Tensor

    @property
    def classes(self) -> list[int]:
        """Class labels in storage order (the order of every per-class tensor)."""
        return list(self._labels)

    @property
    def n_classes(self) -> int:
        return len(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __contains__(self, label) -> bool:
        return int(label) in self._index

    @property
    def counts(self) -> torch.Tensor:
        """Sample counts, shape ``(C,)``, float64."""
        return self._counts[: self.n_classes]

    @property
    def means(self) -> torch.Tensor:
        """Class means, shape ``(C, d)``, float64."""
        return self._means[: self.n_classes]

    def positions(self, labels: Iterable[int]) -> torch.Tensor:
        """Storage positions of ``labels``; ``KeyError`` names any unknown class."""
        return torch.tensor([self._position(c) for c in labels], dtype=torch.long)

    def _position(self, label) -> int:
        try:
            return self._index[int(label)]
        except KeyError:
            raise KeyError(f"unknown class {label!r}; known classes: {self._labels[:20]}"
                           f"{' ...' if self.n_classes > 20 else ''}") from None
