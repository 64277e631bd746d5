r"""Labelled texts read from tab-separated files: any text classification set, and presets for
four public intent and topic sets (:data:`TEXT_TABLE_PRESETS`) that ``scripts/text_tables.py``
converts from their original files.

The dataset directory holds either ``train.tsv`` and ``test.tsv`` (an official split) or
``all.tsv`` alone (no official split: a protocol splits each class with its seed). Each file is
UTF-8; its first line is exactly ``label<TAB>text``, then each line is one sample,
``<label><TAB><text>`` (texts hold no tabs or newlines)::

    label<TAB>text
    card_arrival<TAB>I am still waiting on my card?
    lost_or_stolen_card<TAB>I think my card was stolen

Classes are the label names found in any file, in sorted order. A sample's id is
``"<split>:<line number>"`` (the header is line 1, so the first sample is ``"train:2"``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from ..registry import UnknownNameError
from .base import DataNotFoundError, Dataset, SampleIndex, data_root

__all__ = ["HEADER", "TEXT_TABLE_PRESETS", "TextTable"]

#: The first line of every table file (without its newline).
HEADER = "label\ttext"
#: The accepted sets of table files, by the splits they give.
_LAYOUTS = (("train", "test"), ("all",))

#: Known sets: where the original files come from (the ``SOURCE`` that ``python
#: scripts/text_tables.py <name> SOURCE OUT_DIR`` converts) and how many classes they have.
TEXT_TABLE_PRESETS: dict[str, dict] = {
    "banking77": {
        "classes": 77,
        "source": "BANKING77 (Casanueva et al., 2020; CC BY 4.0): a checkout of "
                  "github.com/PolyAI-LDN/task-specific-datasets (banking_data/train.csv, test.csv)",
    },
    "clinc150": {
        "classes": 150,
        "source": "CLINC150 (Larson et al., 2019; CC BY 3.0): data/data_full.json of "
                  "github.com/clinc/oos-eval (out-of-scope queries left out)",
    },
    "hwu64": {
        "classes": 64,
        "source": "HWU64 (Liu et al., 2019; CC BY 4.0): a checkout of "
                  "github.com/xliuhw/NLU-Evaluation-Data (CrossValidation/.../KFold_<k>/testset/"
                  "csv/*.csv)",
    },
    "stackoverflow20": {
        "classes": 20,
        "source": "StackOverflow-20 (Xu et al., 2015; titles from a Kaggle challenge, Stack "
                  "Overflow content CC BY-SA): rawText/ of github.com/jacoxu/StackOverflow",
    },
}


def _how_to_get(name: str, root: Path) -> str:
    preset = TEXT_TABLE_PRESETS.get(name)
    if preset is None:
        return (f"Write them (see gdacil.data.text_table) or pass root= (in a config: --set "
                f"protocol.dataset_options.{name}.root=PATH).")
    return (f"Get {preset['source']} and convert it with: python scripts/text_tables.py {name} "
            f"SOURCE {root} (or pass root= the folder you converted it into)")


def _layout(root: Path, name: str) -> tuple[str, ...]:
    """The splits whose table files ``root`` holds; a :class:`DataNotFoundError` unless they
    are exactly those of one layout."""
    found = {s for layout in _LAYOUTS for s in layout if (root / f"{s}.tsv").is_file()}
    for layout in _LAYOUTS:
        if found == set(layout):
            return layout
    seen = f"found {', '.join(sorted(f'{s}.tsv' for s in found))}" if found else "found none"
    raise DataNotFoundError(
        f"{name} not found: expected {root / 'train.tsv'} and {root / 'test.tsv'}, or "
        f"{root / 'all.tsv'} alone; {seen}. {_how_to_get(name, root)}"
    )


def _read_table(path: Path) -> list[tuple[int, str, str]]:
    """``(line number, label, text)`` of each sample line of a table file.

    Raises ``ValueError`` naming the file and line for text that is not UTF-8, a first line
    that is not :data:`HEADER` (or a later line that repeats it), a line without exactly one
    tab, an empty label or text, and a file without samples.
    """
    data = path.read_bytes()
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as err:
        at = data[: err.start].count(b"\n") + 1
        raise ValueError(f"{path}:{at}: not UTF-8 ({err.reason})") from None
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if not lines or lines[0] != HEADER:
        got = repr(lines[0]) if lines else "an empty file"
        raise ValueError(f"{path}:1: expected the header 'label<TAB>text'; got {got}")
    rows = []
    for n, line in enumerate(lines[1:], 2):
        label, tab, text = line.partition("\t")
        problem = (
            "no tab between label and text" if not tab
            else "more than one tab (texts may hold none)" if "\t" in text
            else "the header again (two files joined?)" if line == HEADER
            else "an empty label" if not label.strip()
            else "an empty text" if not text.strip()
            else None
        )
        if problem:
            raise ValueError(f"{path}:{n}: {problem}; expected '<label><TAB><text>', got {line!r}")
        rows.append((n, label, text))
    if not rows:
        raise ValueError(f"{path} has a header but no samples")
    return rows


class TextTable(Dataset):
    r"""Labelled texts from ``train.tsv`` and ``test.tsv``, or ``all.tsv`` (module docstring).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Directory of the table files; default ``$GDACIL_DATA/<name>`` or
        ``~/.cache/gdacil/data/<name>``. In a config: ``protocol.dataset_options.<name>.root``.
    name : str
        Dataset name; one of :data:`TEXT_TABLE_PRESETS` checks the class count and says how to
        build the files when they are missing.

    Notes
    -----
    The files are read once, in the constructor, and the texts kept in memory.
    :meth:`config` is empty: the root says where the data is stored, not what it is (the
    listing and the content hashes say that).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "all.tsv").write_text(
    ...         "label\ttext\ngreet\thello there\nbye\tsee you\ngreet\thi\n", encoding="utf-8")
    ...     ds = TextTable(tmp)
    >>> ds.splits, ds.classes
    (('all',), ('bye', 'greet'))
    >>> index = ds.index("all")
    >>> index.ids, index.labels.tolist()
    (('all:2', 'all:3', 'all:4'), [1, 0, 1])
    >>> ds.load(["all:4", "all:2"])
    ['hi', 'hello there']
    """

    modality = "text"

    def __init__(self, root: str | os.PathLike | None = None, *, name: str = "text-table"):
        self.name = name
        self.root = data_root(name, root)
        self.splits = _layout(self.root, name)
        rows = {s: _read_table(self.root / f"{s}.tsv") for s in self.splits}
        self._classes = tuple(sorted({label for r in rows.values() for _, label, _ in r}))
        pos = {c: i for i, c in enumerate(self._classes)}
        self._texts = {f"{s}:{n}": text for s, r in rows.items() for n, _, text in r}
        self._indices = {
            s: SampleIndex(tuple(f"{s}:{n}" for n, _, _ in r), [pos[label] for _, label, _ in r])
            for s, r in rows.items()
        }
        expected = TEXT_TABLE_PRESETS.get(name, {}).get("classes")
        if expected is not None and len(self._classes) != expected:
            warnings.warn(f"{name}: found {len(self._classes)} classes in {self.root}, "
                          f"expected {expected}", stacklevel=2)

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    def index(self, split: str) -> SampleIndex:
        return self._indices[self.check_split(split)]

    def load(self, ids: Sequence[str]) -> list[str]:
        try:
            return [self._texts[sid] for sid in ids]
        except KeyError as err:
            raise UnknownNameError(f"not a {self.name} sample id: {err.args[0]!r} (expected "
                                   f"'<split>:<line number>' of a sample line)") from None
