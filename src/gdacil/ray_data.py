"""Class statistics over a Ray Dataset (``pip install 'gdacil[ray]'``).

:class:`ClassStatisticsAggregation` is a Ray Data ``AggregateFnV2``: each block's rows become
:class:`~gdacil.ClassGaussians` (:meth:`~gdacil.ClassGaussians.update`), partial results are
combined with :meth:`~gdacil.ClassGaussians.merge` (Chan's exact pairwise update, the merge
``torchrun`` and :meth:`~gdacil.learner.Learner.learn_statistics` use), so the result equals the
statistics of all the rows in one process up to round-off, whatever the blocks and workers. It
runs over the whole dataset (classes by a label column) or per group
(``ds.groupby("label").aggregate(...)``, one class per group). :func:`class_statistics` runs it
and returns what :meth:`Learner.learn_statistics` takes; :class:`Extract` is a ``map_batches``
callable (an actor, on a GPU where Ray gives it one) that turns raw inputs into a gdacil
backbone's features first.

>>> import numpy as np, ray                                      # doctest: +SKIP
>>> from gdacil.ray_data import class_statistics                 # doctest: +SKIP
>>> ds = ray.data.read_parquet("embeddings.parquet")             # doctest: +SKIP
>>> stats, names = class_statistics(ds)                          # doctest: +SKIP
>>> learner.learn_statistics(stats, names)                       # doctest: +SKIP

The accumulator (names, counts, means, scatters: NumPy arrays) is what Ray moves between its
workers, with its own serialisation; nothing gdacil saves or loads is pickled.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._optional import require
from .stats import ClassGaussians

__all__ = ["ClassStatisticsAggregation", "Extract", "class_statistics", "grouped_statistics",  # noqa: F822
           "to_class_gaussians"]

INSTALL = "pip install 'gdacil[ray]'"
_SOURCE = "the Ray Dataset"


def _aggregate_base():
    return require("ray.data.aggregate", feature="Ray Data", install=INSTALL).AggregateFnV2


def _accumulator(stats: ClassGaussians, names: list[str]) -> dict[str, Any]:
    """The accumulator of ``stats`` (labels ``0..k-1`` are positions in ``names``)."""
    return {"names": list(names), "dim": stats.dim, "ddof": stats.ddof,
            "counts": stats.counts.numpy(), "means": stats.means.numpy(),
            "scatters": stats.scatters.numpy()}


def to_class_gaussians(accumulator: dict[str, Any]) -> tuple[ClassGaussians, list[str]]:
    """``(statistics, class names)`` of an accumulator (or of the aggregation's result):
    labels ``0..k-1``, label ``i`` named ``names[i]``."""
    names = list(accumulator["names"])
    tensors = {"labels": torch.arange(len(names), dtype=torch.int64),
               **{k: torch.from_numpy(np.array(accumulator[k], dtype=np.float64))
                  for k in ("counts", "means", "scatters")}}
    stats = ClassGaussians.from_tensors(tensors, {"dim": int(accumulator["dim"]),
                                                  "ddof": int(accumulator["ddof"])},
                                        source=_SOURCE)
    return stats, names


def _combined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` and ``b`` merged by :meth:`ClassGaussians.merge`, classes by name."""
    if not a or not a.get("names"):
        return b
    if not b or not b.get("names"):
        return a
    left, names = to_class_gaussians(a)
    right, theirs = to_class_gaussians(b)
    position = {n: i for i, n in enumerate(names)}
    for n in theirs:
        position.setdefault(n, len(position))
    tensors, meta = right.state_dict()
    tensors["labels"] = torch.tensor([position[n] for n in theirs], dtype=torch.int64)
    left.merge(ClassGaussians.from_state((tensors, meta), source=_SOURCE))
    order = list(position)
    return _accumulator(left.subset([position[n] for n in order]), order)


def _block_statistics(block, vector_column: str, label_column: str | None, ddof: int
                      ) -> dict[str, Any]:
    """The accumulator of one block's rows (vectors checked as Parquet files' are)."""
    pa = require("pyarrow", feature="Ray Data", install=INSTALL)
    from ray.data.block import BlockAccessor

    from .learner.vectors import _check_finite, _coded, _numeric, _parquet_rows

    table = BlockAccessor.for_block(block).to_arrow()
    if not table.num_rows:
        return {}
    for column, option in ((vector_column, "on"), (label_column, "label_column")):
        if column is not None and column not in table.column_names:
            raise ValueError(f"{_SOURCE} has no column {column!r} (its columns: "
                             f"{', '.join(map(repr, table.column_names))}); name it with "
                             f"{option}=")
    column = table.column(vector_column).combine_chunks()
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        dim = kind.list_size if pa.types.is_fixed_size_list(kind) else len(column[0].values)
        X = _parquet_rows(_SOURCE, column, 0, dim, vector_column, pa)
    else:  # Ray's tensor columns (what map_batches makes of 2-d arrays)
        where = f"{_SOURCE}, column {vector_column!r}"
        X = _numeric(np.asarray(BlockAccessor.for_block(table).to_numpy(vector_column)), where,
                     "the column")
        _check_finite(X, lambda _: where)
    names: tuple[str, ...]
    if label_column is None:
        names, codes = ("",), np.zeros(len(X), dtype=np.int64)
    else:
        labels = table.column(label_column).to_pylist()
        names, codes = _coded(labels, lambda i: f"{_SOURCE}, a row of column {label_column!r}")
    stats = ClassGaussians(X.shape[1], ddof=ddof).update(torch.from_numpy(X),
                                                        torch.from_numpy(codes))
    return _accumulator(stats.subset(list(range(len(names)))), list(names))


def _build():
    base = _aggregate_base()

    class _Aggregation(base):  # type: ignore[misc, valid-type]
        """Ray Data aggregation of gdacil's class statistics (``AggregateFnV2``).

        Parameters
        ----------
        on : str, default "vector"
            The column of vectors (lists or fixed-size lists of numbers).
        label_column : str or None, default "label"
            The column of class names; None: one class, named ``""`` (with
            ``ds.groupby(label).aggregate``, where each group is one class).
        ddof : {0, 1}, default 0
            As :class:`~gdacil.ClassGaussians`'s (a model's ``ddof``).
        name : str, default "class_statistics"
            The result's column.

        The result is an accumulator ``{"names", "dim", "ddof", "counts", "means",
        "scatters"}``: :func:`to_class_gaussians` makes it statistics.
        """

        def __init__(self, on: str = "vector", label_column: str | None = "label", *,
                     ddof: int = 0, name: str = "class_statistics"):
            self.vector_column, self.label_column, self.ddof = on, label_column, ddof
            # Ray gives a block only the column ``on`` names (and a group's keys); None: all
            super().__init__(name, zero_factory=dict, on=on if label_column is None else None,
                             ignore_nulls=False)

        def aggregate_block(self, block) -> dict[str, Any]:
            return _block_statistics(block, self.vector_column, self.label_column, self.ddof)

        def combine(self, current_accumulator: dict[str, Any], new: dict[str, Any]
                    ) -> dict[str, Any]:
            return _combined(current_accumulator, new)

        def finalize(self, accumulator: dict[str, Any]) -> dict[str, Any]:
            return accumulator

    _Aggregation.__name__ = _Aggregation.__qualname__ = "ClassStatisticsAggregation"
    _Aggregation.__module__ = __name__
    return _Aggregation


def __getattr__(name: str):
    if name == "ClassStatisticsAggregation":  # built when first asked for: needs Ray
        cls = _build()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def class_statistics(dataset, vector_column: str = "vector", label_column: str = "label", *,
                     ddof: int = 0) -> tuple[ClassGaussians, list[str]]:
    """``(statistics, class names)`` of the rows of a Ray Dataset: what
    :meth:`gdacil.learner.Learner.learn_statistics` takes (``learn_statistics(*result)``)."""
    aggregation = __getattr__("ClassStatisticsAggregation")
    result = dataset.aggregate(aggregation(vector_column, label_column, ddof=ddof))
    found = result["class_statistics"]
    if not found or not found.get("names"):
        raise ValueError(f"{_SOURCE} holds no rows")
    return to_class_gaussians(found)


def grouped_statistics(rows, key: str = "label", name: str = "class_statistics"
                       ) -> tuple[ClassGaussians, list[str]]:
    """``(statistics, class names)`` of the rows of
    ``ds.groupby(key).aggregate(ClassStatisticsAggregation(on, None))``: each group's
    statistics are one class, named by its key, merged as the aggregation merges."""
    from .learner.names import class_name

    merged: dict[str, Any] = {}
    for row in rows:
        part = dict(row[name])
        part["names"] = [class_name(row[key], f"{_SOURCE}, group {row[key]!r}")]
        merged = _combined(merged, part)
    if not merged:
        raise ValueError(f"{_SOURCE} holds no groups")
    return to_class_gaussians(merged)


class Extract:
    """A ``map_batches`` callable: the features of a gdacil backbone of each row's raw input.

    ``ds.map_batches(Extract, fn_constructor_kwargs={"backbone": "minilm"}, concurrency=2,
    batch_size=256)`` (with ``num_gpus=1`` the actors run on GPUs) adds a column ``output``
    (default ``vector``) of the backbone's features of column ``column`` (texts, or images as
    arrays); its output feeds :func:`class_statistics`.

    Parameters
    ----------
    backbone : str
        A :data:`gdacil.backbones.BACKBONES` name.
    column : str, default "text"
    output : str, default "vector"
    batch_size : int, default 32
        Inputs per forward pass.
    **options
        The backbone's options (``device="cuda"`` on a GPU actor).
    """

    def __init__(self, backbone: str, column: str = "text", output: str = "vector", *,
                 batch_size: int = 32, **options):
        from .backbones import build_backbone

        self.backbone = build_backbone(backbone, **options)
        self.column, self.output, self.batch_size = column, output, batch_size

    def __call__(self, batch: dict) -> dict:
        raw = list(batch[self.column])
        features = self.backbone.extract(raw, batch_size=self.batch_size)
        return {**batch, self.output: features.to(torch.float64).numpy()}
