"""Vectors a vectors model learns from and classifies: files, arrays and JSON, checked.

:func:`read_vectors` reads a table of vectors and (optionally) labels:

- Parquet (``.parquet``; ``pip install 'gdacil[vectors]'``): a list or fixed-size-list column of
  numbers (``vector_column``, default ``vector``) and a label column, read in batches of rows so
  that a large file is never held whole;
- NumPy ``.npz`` (no pickles): an array named ``vector_column`` ``(n, d)`` and one named
  ``label_column`` ``(n,)``;
- CSV/TSV (the vector cell a JSON list, ``"[0.1, 0.2]"``) and JSON Lines / JSON (the vector a
  list of numbers), with the same column names.

:func:`as_vectors` checks in-memory vectors (arrays, tensors, lists of lists: what
``Learner.learn``, ``Learner.predict`` and ``POST /predict`` take). Anything that is not a finite
number, a row of another length than the others, a string where a number belongs, or a missing
column raises a one-line ``ValueError`` naming the file (or ``inputs[i]``), the row (counted
from 1 in files) and the column.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from .._optional import require

__all__ = ["CHUNK_ROWS", "VECTOR_SUFFIXES", "VectorTable", "as_vectors", "read_vectors",
           "table_of", "table_statistics"]

#: Rows of a vectors file read (and learned) at a time: what bounds a learn's memory
CHUNK_ROWS = 65_536
#: Files that can only hold vectors (CSV and JSON files hold texts or vectors: the model says)
VECTOR_SUFFIXES = (".parquet", ".npz")
INSTALL = "pip install 'gdacil[vectors]'"


@dataclass(frozen=True)
class VectorTable:
    """A checked table of ``n`` vectors of ``dim`` numbers, read a chunk at a time.

    Attributes
    ----------
    source : str
        Where the vectors come from, for messages.
    n, dim : int
    names : tuple of str or None
        The class names, in order of first appearance (None: the table has no labels).
    codes : numpy.ndarray or None
        ``(n,)`` int64: the position in ``names`` of each row's label.
    read : callable
        ``read(start, stop, rows)`` yields ``(first_row, float64 (m, dim))`` chunks of at most
        ``rows`` rows of ``[start, stop)``, each checked.
    """

    source: str
    n: int
    dim: int
    names: tuple[str, ...] | None
    codes: np.ndarray | None
    read: Callable[[int, int, int], Iterator[tuple[int, np.ndarray]]]

    def chunks(self, start: int = 0, stop: int | None = None,
               rows: int = CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, vectors)`` of rows ``[start, stop)``, ``rows`` at a time."""
        return self.read(start, self.n if stop is None else stop, rows)

    def array(self) -> np.ndarray:
        """All the vectors, ``(n, dim)`` float64 (for tables that fit in memory)."""
        parts = [x for _, x in self.chunks()]
        return np.concatenate(parts) if parts else np.empty((0, self.dim))

    def labels(self) -> list[str]:
        """The class name of each row."""
        assert self.names is not None and self.codes is not None
        return [self.names[c] for c in self.codes.tolist()]


def read_vectors(path, *, vector_column: str = "vector", label_column: str = "label",
                 labels: bool = True) -> VectorTable:
    """The :class:`VectorTable` of file ``path`` (see the module docstring); ``labels=False``
    reads no label column (what ``gdacil predict --data`` needs)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    suffix = path.suffix.lower()
    label = label_column if labels else None
    if suffix == ".parquet":
        return _parquet(path, vector_column, label)
    if suffix == ".npz":
        return _npz(path, vector_column, label)
    if suffix in (".csv", ".tsv", ".jsonl", ".ndjson", ".json"):
        return _records(path, vector_column, label)
    raise ValueError(f"{path}: cannot read vectors from a {suffix or 'suffix-less'} file; give "
                     "a .parquet, .npz, .csv/.tsv or .jsonl/.json file")


def as_vectors(inputs, dim: int | None = None, *, names: Sequence[str] | None = None
               ) -> np.ndarray:
    """In-memory vectors as float64 ``(n, d)``: a 2-d array or tensor, or a sequence of
    sequences of numbers (``names``: what messages call each row, default ``inputs[i]``);
    ``dim``: the dimension they must have.

    Examples
    --------
    >>> from gdacil.learner.vectors import as_vectors
    >>> as_vectors([[1, 2], [3, 4.5]]).dtype
    dtype('float64')
    >>> as_vectors([[1, 2], [3, "4"]])
    Traceback (most recent call last):
    ...
    ValueError: inputs[1]: element 1 is str '4', not a number
    """
    if hasattr(inputs, "detach"):  # a torch tensor
        inputs = inputs.detach().cpu().numpy()
    rows = inputs if isinstance(inputs, np.ndarray) and inputs.ndim == 2 else list(inputs)
    if isinstance(rows, np.ndarray):
        X = _numeric(rows, "inputs", "the inputs")
    else:
        X = _stacked(rows, [names[i] if names else f"inputs[{i}]" for i in range(len(rows))])
    _check_finite(X, lambda r: names[r] if names else f"inputs[{r}]")
    if dim is not None and X.shape[1] != dim:
        where = names[0] if names else "inputs[0]"
        raise ValueError(f"{where}: a vector of {X.shape[1]} numbers, but this model takes "
                         f"{dim}-d vectors")
    return X


def table_of(inputs, labels=None) -> VectorTable:
    """The :class:`VectorTable` of in-memory vectors (see :func:`as_vectors`) and their
    ``labels`` (class names, one per vector; None: unlabelled)."""
    if isinstance(labels, (str, bytes)):
        raise ValueError("labels must be a sequence of class names, one per input; got a "
                         f"single {type(labels).__name__}")
    X = as_vectors(inputs)
    names = codes = None
    if labels is not None:
        labels = list(labels)
        if len(labels) != len(X):
            raise ValueError(f"{len(X)} inputs but {len(labels)} labels")
        names, codes = _coded(labels, lambda i: f"labels[{i}]")
    if not len(X):
        raise ValueError("the inputs given: no vectors")
    return VectorTable("the inputs given", len(X), X.shape[1], names, codes, partial(_rows_of, X))


def _rows_of(X: np.ndarray, start: int, stop: int, rows: int):
    """:attr:`VectorTable.read` of vectors in memory."""
    for s in range(start, stop, rows):
        yield s, X[s:min(s + rows, stop)]


def table_statistics(table: VectorTable, labels, backbone, *, keep=None, records=None,
                     ddof: int = 0):
    """``(statistics, record features)`` of a table, read a chunk at a time: the
    :class:`~gdacil.ClassGaussians` of the ``backbone``'s features of the rows ``keep`` (bool
    ``(n,)``, default all) with class ids ``labels`` (int64 ``(n,)``), and the features of the
    rows ``records`` (bool ``(n,)``, default none), in row order. Under ``torchrun`` each
    process reads its contiguous share of the rows; the statistics are merged exactly
    (:func:`gdacil.distributed.all_reduce_stats`) and the records gathered in row order, so
    every process gets the whole. Memory: the statistics, one chunk and the records."""
    import torch

    from .. import distributed
    from ..stats import ClassGaussians

    labels = torch.as_tensor(labels, dtype=torch.int64)
    stats = ClassGaussians(table.dim, ddof=ddof)
    kept: list = []
    start, stop = distributed.shard_bounds(table.n)
    for first, X in table.chunks(start, stop):
        rows = slice(first, first + len(X))
        features = backbone.extract(X, batch_size=len(X))
        mine = keep[rows] if keep is not None else None
        if mine is None:
            stats.update(features, labels[rows])
        elif bool(mine.any()):
            stats.update(features[mine], labels[rows][mine])
        if records is not None:
            kept.append(features[records[rows]])
    found = torch.cat(kept) if kept else torch.empty(0, table.dim, dtype=torch.float64)
    return distributed.all_reduce_stats(stats), distributed.all_gather_rows(found)


# ---------------------------------------------------------------------- checks
def _stacked(rows: list, where: list[str]) -> np.ndarray:
    """Rows (sequences of numbers) stacked, or a ``ValueError`` naming the first bad one."""
    if not rows:
        return np.empty((0, 0))
    dim = None
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):
            raise ValueError(f"{where[i]}: a vector must be a list of numbers; got "
                             f"{type(row).__name__} {_shown(row)}")
        for j, v in enumerate(row):
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(f"{where[i]}: element {j} is {type(v).__name__} {_shown(v)}, "
                                 "not a number")
        if dim is None:
            dim = len(row)
            if not dim:
                raise ValueError(f"{where[i]}: an empty vector")
        elif len(row) != dim:
            raise ValueError(f"{where[i]}: {len(row)} numbers where {where[0]} has {dim} "
                             "(every vector must have as many)")
        out.append(row)
    return np.asarray(out, dtype=np.float64)


def _numeric(X: np.ndarray, where: str, what: str) -> np.ndarray:
    if X.dtype.kind not in "iuf":
        kind = "strings" if X.dtype.kind in "USO" else f"{X.dtype} values"
        raise ValueError(f"{where}: {what} holds {kind}, not numbers")
    if X.ndim != 2 or X.shape[1] == 0:
        raise ValueError(f"{where}: {what} must be a 2-d array (one vector per row); got shape "
                         f"{X.shape}")
    return X.astype(np.float64, copy=False)


def _check_finite(X: np.ndarray, where: Callable[[int], str]) -> None:
    bad = ~np.isfinite(X)
    if bad.any():
        r, j = (int(k[0]) for k in np.nonzero(bad))
        raise ValueError(f"{where(r)}: element {j} is {X[r, j]} (vectors must be finite "
                         "numbers)")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _missing(path: Path, column: str, columns: Sequence[str], option: str) -> ValueError:
    return ValueError(f"{path} has no column {column!r} (its columns: "
                      f"{', '.join(map(repr, columns)) or 'none'}); name the {option} column "
                      f"with --{option}-column or {option}_column=")


def _coded(values: Sequence, where: Callable[[int], str]) -> tuple[tuple[str, ...], np.ndarray]:
    """Labels as ``(class names in order of first appearance, the position of each value's
    name)``, each distinct value checked by :func:`~gdacil.learner.names.class_name` once
    (``where(i)`` names value ``i``); two spellings of one name (3 and "3") are one class."""
    from .names import class_name

    positions: dict[str, int] = {}
    seen: dict = {}
    codes = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        key = (type(v), v) if isinstance(v, (str, int, np.integer)) else None
        code = seen.get(key) if key is not None else None
        if code is None:
            code = positions.setdefault(class_name(v, where(i)), len(positions))
            if key is not None:
                seen[key] = code
        codes[i] = code
    return tuple(positions), codes


def _table(path: Path, X: np.ndarray, where: Callable[[int], str], names, codes) -> VectorTable:
    if not len(X):
        raise ValueError(f"{path} holds no vectors")
    _check_finite(X, where)
    return VectorTable(str(path), len(X), X.shape[1], names, codes, partial(_rows_of, X))


# ---------------------------------------------------------------------- formats
def _npz(path: Path, vector_column: str, label_column: str | None) -> VectorTable:
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except ValueError as exc:  # object arrays need pickles: refused
        raise ValueError(f"{path}: not a NumPy .npz of plain arrays ({exc})") from None
    for column, option in ((vector_column, "vector"), (label_column, "label")):
        if column is not None and column not in arrays:
            raise _missing(path, column, list(arrays), option)
    X = _numeric(arrays[vector_column], f"{path}, array {vector_column!r}", "the array")
    names = codes = None
    if label_column is not None:
        y = arrays[label_column].reshape(-1)
        if len(y) != len(X):
            raise ValueError(f"{path}: {len(X)} vectors but {len(y)} labels (array "
                             f"{label_column!r})")
        names, codes = _coded(y.tolist(), lambda r: f"{path}, row {r + 1}, column "
                                                    f"{label_column!r}")
    return _table(path, X, lambda r: f"{path}, row {r + 1}, column {vector_column!r}", names,
                  codes)


def _records(path: Path, vector_column: str, label_column: str | None) -> VectorTable:
    from .data import _json_value, _read_utf8

    text = _read_utf8(path)
    suffix = path.suffix.lower()
    numbered: list[tuple[int, dict]] = []
    if suffix in (".csv", ".tsv"):
        reader = csv.DictReader(io.StringIO(text, newline=""),
                                delimiter="\t" if suffix == ".tsv" else ",")
        for row in reader:
            numbered.append((reader.line_num, row))
        columns = list(reader.fieldnames or [])
    elif suffix == ".json":
        records = _json_value(path, str(path), text)
        if not isinstance(records, list):
            raise ValueError(f"{path}: expected a JSON list of objects")
        numbered = list(enumerate(records, 1))
        columns = list(records[0]) if records and isinstance(records[0], dict) else []
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                numbered.append((n, _json_value(path, f"{path}, line {n}", line)))
        columns = list(numbered[0][1]) if numbered and isinstance(numbered[0][1], dict) else []
    for column, option in ((vector_column, "vector"), (label_column, "label")):
        if column is not None and column not in columns:
            raise _missing(path, column, columns, option)
    rows, labels, where = [], [], []
    for n, record in numbered:
        at = f"{path}, line {n}, column {vector_column!r}"
        if not isinstance(record, dict):
            raise ValueError(f"{path}, line {n}: expected a JSON object")
        value = record.get(vector_column)
        if isinstance(value, str):  # a CSV cell: the vector as a JSON list
            value = _json_value(path, at, value) if value.strip() else None
        if value is None:
            raise ValueError(f"{at}: no vector")
        rows.append(value)
        where.append(at)
        if label_column is not None:
            labels.append(record.get(label_column))
    X = _stacked(rows, where)
    names = codes = None
    if label_column is not None:
        lines = [n for n, _ in numbered]
        names, codes = _coded(labels, lambda r: f"{path}, line {lines[r]}, column "
                                                f"{label_column!r}")
    return _table(path, X, lambda r: where[r], names, codes)


def _parquet(path: Path, vector_column: str, label_column: str | None) -> VectorTable:
    pq = require("pyarrow.parquet", feature="Parquet files", install=INSTALL)
    pa = require("pyarrow", feature="Parquet files", install=INSTALL)
    try:
        # pre_buffer would buffer every column chunk of the file: memory grew with the file
        file = pq.ParquetFile(path, pre_buffer=False)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"{path}: not a Parquet file ({exc})") from None
    schema = file.schema_arrow
    for column, option in ((vector_column, "vector"), (label_column, "label")):
        if column is not None and column not in schema.names:
            raise _missing(path, column, schema.names, option)
    kind = schema.field(vector_column).type
    at = f"{path}, column {vector_column!r}"
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)):
        raise ValueError(f"{at}: holds {kind}, not lists of numbers (one vector per row)")
    value = kind.value_type
    if not (pa.types.is_integer(value) or pa.types.is_floating(value)):
        what = "strings" if pa.types.is_string(value) or pa.types.is_large_string(value) \
            else f"{value} values"
        raise ValueError(f"{at}: holds lists of {what}, not numbers")
    n = file.metadata.num_rows
    if not n:
        raise ValueError(f"{path} holds no vectors")
    names = codes = None
    if label_column is not None:
        column = file.read(columns=[label_column]).column(0).combine_chunks()
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"{path}, row {row + 1}, column {label_column!r}: no label")
        names, codes = _parquet_labels(path, column, label_column, pa)
    first = next(file.iter_batches(batch_size=1, columns=[vector_column])).column(0)
    dim = kind.list_size if pa.types.is_fixed_size_list(kind) else len(first[0].values or [])
    if first.null_count or not dim:
        raise ValueError(f"{path}, row 1, column {vector_column!r}: "
                         f"{'no vector' if first.null_count else 'an empty vector'}")

    def read(start: int, stop: int, rows: int):
        done = 0
        for batch in file.iter_batches(batch_size=rows, columns=[vector_column]):
            m = batch.num_rows
            lo, hi = max(start - done, 0), min(stop - done, m)
            if lo < hi:
                yield done + lo, _parquet_rows(path, batch.column(0).slice(lo, hi - lo),
                                               done + lo, dim, vector_column, pa)
            done += m
            if done >= stop:
                return

    return VectorTable(str(path), n, dim, names, codes, read)


def _parquet_labels(path: Path, column, label_column: str, pa):
    """The labels of a Parquet column, dictionary-encoded (each distinct value checked once,
    named by its first row)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    encoded = column.dictionary_encode()
    values = encoded.dictionary.to_pylist()
    index = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    firsts = np.full(len(values), len(index), dtype=np.int64)
    np.minimum.at(firsts, index, np.arange(len(index)))
    order = np.argsort(firsts, kind="stable")  # the distinct values by first appearance
    names, codes = _coded([values[k] for k in order.tolist()],
                          lambda k: f"{path}, row {firsts[order[k]] + 1}, column {label_column!r}")
    by_value = np.empty(len(values), dtype=np.int64)
    by_value[order] = codes
    return names, by_value[index]


def _parquet_rows(path: Path | str, array, first: int, dim: int, column: str, pa) -> np.ndarray:
    """One batch of a Parquet vector column as float64 ``(m, dim)``, checked: nulls, rows of
    another length, non-finite numbers."""
    def where(r: int) -> str:
        return f"{path}, row {first + r + 1}, column {column!r}"

    if array.null_count:
        r = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{where(r)}: no vector")
    if not pa.types.is_fixed_size_list(array.type):
        offsets = array.offsets.to_numpy()
        lengths = np.diff(offsets)
        bad = np.flatnonzero(lengths != dim)
        if bad.size:
            r = int(bad[0])
            raise ValueError(f"{where(r)}: {lengths[r]} numbers where row 1 has {dim} (every "
                             "vector must have as many)")
    values = array.flatten()
    if values.null_count:
        k = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{where(k // dim)}: element {k % dim} is null (vectors must be finite "
                         "numbers)")
    X = values.to_numpy(zero_copy_only=False).astype(np.float64, copy=False).reshape(-1, dim)
    _check_finite(X, where)
    return X
