"""Convert the original files of a text-table preset into the layout of
:class:`gdacil.data.text_table.TextTable`.

Usage::

    python scripts/text_tables.py PRESET SOURCE OUT_DIR

writes ``OUT_DIR/train.tsv`` and ``OUT_DIR/test.tsv`` (``banking77``, ``clinc150``: their
official split) or ``OUT_DIR/all.tsv`` (``hwu64``, ``stackoverflow20``), each atomically, and
prints the class and sample counts. Point gdacil at it with ``GDACIL_DATA`` (``OUT_DIR`` =
``$GDACIL_DATA/<preset>``) or ``root=``. ``SOURCE`` is:

- ``banking77``: a checkout of github.com/PolyAI-LDN/task-specific-datasets, whose
  ``banking_data/train.csv`` and ``banking_data/test.csv`` have columns ``text,category``;
- ``clinc150``: ``data/data_full.json`` of github.com/clinc/oos-eval (lists of ``[text,
  intent]``): train is its ``train`` and ``val``, test its ``test``; the out-of-scope queries
  (``oos_*`` and intent ``oos``) are left out;
- ``hwu64``: a checkout of github.com/xliuhw/NLU-Evaluation-Data (or any folder above its
  ``KFold_1`` .. ``KFold_10``): the union of the ten ``KFold_<k>/testset/csv/*.csv`` files
  (``;``-separated), labelled ``<scenario>_<intent>``; the text is ``answer_from_anno`` (the
  annotated utterance without its slot markup; ``answer_from_user`` is the raw answer, with
  typos and placeholders such as ``<insert city>``);
- ``stackoverflow20``: the ``rawText/`` folder of github.com/jacoxu/StackOverflow, with
  ``title_StackOverflow.txt`` and ``label_StackOverflow.txt`` (one title and one label 1..20 a
  line); the labels are named by the tags in that repository's README.

In every file, whitespace in a text is collapsed to single spaces, and rows with an empty text
and exact repeats of a (label, text) row are dropped.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from gdacil.data.base import DataNotFoundError, require_file
from gdacil.data.text_table import HEADER, TEXT_TABLE_PRESETS
from gdacil.io import atomic_write_text

#: (label, text) rows of one output file
Rows = list[tuple[str, str]]

#: StackOverflow-20's labels 1..20, as its README names them
STACKOVERFLOW_TAGS = (
    "wordpress", "oracle", "svn", "apache", "excel", "matlab", "visual-studio", "cocoa", "osx",
    "bash", "spring", "hibernate", "scala", "sharepoint", "ajax", "qt", "drupal", "linq",
    "haskell", "magento",
)
_HWU_COLUMNS = ("scenario", "intent", "answer_from_anno")


def _source_file(path: Path, preset: str) -> Path:
    return require_file(path, f"{preset} source file",
                        f"Expected as SOURCE: {TEXT_TABLE_PRESETS[preset]['source']}.")


def _csv_rows(path: Path, columns: Sequence[str], delimiter: str = ",") -> list[list[str]]:
    """The values of ``columns`` in each row of a CSV file with a header line."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        header = next(reader, [])
        missing = [c for c in columns if c not in header]
        if missing:
            raise ValueError(f"{path}:1: no column {', '.join(missing)} in the header {header}")
        where = [header.index(c) for c in columns]
        out = []
        for row in reader:
            if len(row) != len(header):
                raise ValueError(f"{path}:{reader.line_num}: {len(row)} fields, the header has "
                                 f"{len(header)}")
            out.append([row[i] for i in where])
        return out


def banking77(source: Path) -> dict[str, Rows]:
    """``{"train", "test"}`` rows of ``SOURCE/banking_data/{train,test}.csv``."""
    paths = {s: _source_file(source / "banking_data" / f"{s}.csv", "banking77")
             for s in ("train", "test")}
    return {s: [(label, text) for text, label in _csv_rows(p, ("text", "category"))]
            for s, p in paths.items()}


def clinc150(source: Path) -> dict[str, Rows]:
    """``{"train", "test"}`` rows of ``data_full.json``: train + val, test; no out-of-scope."""
    path = _source_file(source, "clinc150")
    if not path.is_file():
        raise DataNotFoundError(f"{path} is a folder; clinc150 needs its data_full.json as SOURCE")
    data = json.loads(path.read_text(encoding="utf-8"))
    missing = [k for k in ("train", "val", "test") if k not in data]
    if missing:
        raise ValueError(f"{path} has no {', '.join(missing)} lists; is it data_full.json?")
    parts = {"train": ("train", "val"), "test": ("test",)}
    return {s: [(label, text) for k in keys for text, label in data[k] if label != "oos"]
            for s, keys in parts.items()}


def _fold(path: Path) -> int:
    return int(path.parts[-4].removeprefix("KFold_"))


def hwu64(source: Path) -> dict[str, Rows]:
    """``{"all"}`` rows of the ten cross-validation test folds under ``source``."""
    paths = sorted((p for p in source.glob("**/KFold_*/testset/csv/*.csv")
                    if re.fullmatch(r"KFold_\d+", p.parts[-4])), key=lambda p: (_fold(p), p))
    folds = {_fold(p) for p in paths}
    if folds != set(range(1, 11)):
        have = f"folds {sorted(folds)}" if folds else "no such files"
        raise DataNotFoundError(
            f"hwu64: expected KFold_1 .. KFold_10/testset/csv/*.csv under {source}; found "
            f"{have}. Expected as SOURCE: {TEXT_TABLE_PRESETS['hwu64']['source']}.")
    return {"all": [(f"{scenario}_{intent}", text) for p in paths
                    for scenario, intent, text in _csv_rows(p, _HWU_COLUMNS, delimiter=";")]}


def _lines(path: Path) -> list[str]:
    """The lines of a text file, split at newlines only (a title may hold other line breaks,
    such as a form feed, which ``str.splitlines`` would split at too)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def stackoverflow20(source: Path) -> dict[str, Rows]:
    """``{"all"}`` rows of the title and label files in ``source``, labels named by tag."""
    titles = _lines(_source_file(source / "title_StackOverflow.txt", "stackoverflow20"))
    label_path = _source_file(source / "label_StackOverflow.txt", "stackoverflow20")
    labels = _lines(label_path)
    if len(titles) != len(labels):
        raise ValueError(f"{source}: {len(titles)} titles but {len(labels)} labels")
    rows = []
    for n, (title, label) in enumerate(zip(titles, labels), 1):
        if label.strip() not in {str(i) for i in range(1, 21)}:
            raise ValueError(f"{label_path}:{n}: expected a label 1..20; got {label!r}")
        rows.append((STACKOVERFLOW_TAGS[int(label) - 1], title))
    return {"all": rows}


#: Converters by preset: ``SOURCE`` path -> rows per output file (split)
CONVERTERS: dict[str, Callable[[Path], dict[str, Rows]]] = {
    "banking77": banking77,
    "clinc150": clinc150,
    "hwu64": hwu64,
    "stackoverflow20": stackoverflow20,
}


def clean(rows: Iterable[tuple[str, str]]) -> tuple[Rows, Counter[str]]:
    """``rows`` with whitespace collapsed to single spaces, without empty texts or repeated
    rows (the first is kept), and the number of rows dropped for each reason."""
    kept: dict[tuple[str, str], None] = {}
    dropped: Counter[str] = Counter()
    for label, text in rows:
        row = (" ".join(label.split()), " ".join(text.split()))
        if not row[0]:
            raise ValueError(f"empty label for the text {text!r}")
        if not row[1]:
            dropped["empty"] += 1
        elif row in kept:
            dropped["duplicate"] += 1
        else:
            kept[row] = None
    return list(kept), dropped


def write_tables(tables: dict[str, Rows], out_dir: Path) -> dict[str, Path]:
    """Write ``out_dir/<split>.tsv`` for each split, atomically; refuse (before writing any)
    where ``out_dir`` holds a table of a layout other than these splits, which would leave it
    unreadable."""
    stale = sorted(p.name for p in out_dir.glob("*.tsv") if p.stem in {"train", "test", "all"}
                   and p.stem not in tables)
    if stale:
        raise FileExistsError(f"{out_dir} holds {', '.join(stale)} of another layout; remove it "
                              f"or choose another OUT_DIR")
    return {split: atomic_write_text(out_dir / f"{split}.tsv",
                                     "".join(f"{line}\n" for line in
                                             [HEADER, *(f"{lb}\t{tx}" for lb, tx in rows)]))
            for split, rows in tables.items()}


def summary(split: str, rows: Rows, dropped: Counter[str]) -> str:
    """One line: samples, classes and samples per class (min / median / max), rows dropped."""
    per_class = sorted(Counter(label for label, _ in rows).values())
    drops = ", ".join(f"{n} {why}" for why, n in sorted(dropped.items())) or "none"
    return (f"{split}: {len(rows)} samples, {len(per_class)} classes, per class min "
            f"{per_class[0]} / median {statistics.median(per_class):g} / max {per_class[-1]}; "
            f"dropped {drops}")


def convert(preset: str, source: Path, out_dir: Path) -> list[str]:
    """Convert ``source`` into ``out_dir``; returns the :func:`summary` lines."""
    cleaned = {split: clean(rows) for split, rows in CONVERTERS[preset](source).items()}
    empty = [split for split, (rows, _) in cleaned.items() if not rows]
    if empty:
        raise ValueError(f"{preset}: {source} gave no {' or '.join(empty)} samples")
    write_tables({split: rows for split, (rows, _) in cleaned.items()}, out_dir)
    lines = [summary(split, rows, dropped) for split, (rows, dropped) in cleaned.items()]
    if "train" in cleaned and "test" in cleaned:
        shared = set(cleaned["train"][0]) & set(cleaned["test"][0])
        if shared:
            lines.append(f"train and test share {len(shared)} rows (kept in both, as the "
                         "official split has them)")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Convert a text-table preset's original files into OUT_DIR/*.tsv.")
    parser.add_argument("preset", choices=sorted(CONVERTERS))
    parser.add_argument("source", type=Path, help="the original files (see the module docstring)")
    parser.add_argument("out_dir", type=Path, help="where to write the .tsv files")
    args = parser.parse_args(argv)
    try:
        lines = convert(args.preset, args.source, args.out_dir)
    except (OSError, ValueError, csv.Error) as err:  # DataNotFoundError is an OSError
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.preset} -> {args.out_dir}")
    print("\n".join(f"  {line}" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
