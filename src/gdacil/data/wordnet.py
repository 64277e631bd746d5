"""WordNet 3.0 as a text classification source: gloss texts labelled by hypernym subtree or by
lexicographer file ("supersense").

Debian ships the database: ``apt-get install -y wordnet-base`` (``/usr/share/wordnet/data.*``).
Each line of ``data.{noun,verb,adj,adv}`` (header lines start with two spaces) reads::

    offset lexfile pos w_cnt (word lex_id)* p_cnt (symbol offset pos src/tgt)* [frames] | gloss

with ``w_cnt`` in hexadecimal. Hypernym pointers are ``@`` and ``@i`` (instance). A sample is one
synset, its id ``"<pos>:<offset>"`` (pos ``n``, ``v``, ``a``, ``r``), its text the gloss.

Hypernym classes (:class:`WordNetHypernyms`): a synset whose descendants (hyponyms, transitively,
instances included) number between ``min_size`` and ``max_size`` is a candidate; candidates are
taken from the smallest up, skipping any that shares a synset (itself or a descendant) with one
already taken, which gives disjoint, fairly specific classes. The class's samples are the
descendants (the root synset itself is left out of both samples and anchors). With the defaults
(150 to 1,500, nouns and verbs) there are 131 such classes; the ``n_classes`` largest are used.

Supersense classes (:class:`WordNetSupersenses`): the 45 lexicographer files, keeping those with
at least ``min_size`` synsets (40 with the default 300).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..hashing import sha256_sample
from ..registry import UnknownNameError
from .base import ListedDataset, SampleIndex, require_file

__all__ = ["LEXNAMES", "WordNet", "WordNetHypernyms", "WordNetSupersenses", "read_wordnet"]

DEFAULT_ROOT = Path("/usr/share/wordnet")
_FIX = (
    "Install it with: apt-get install -y wordnet-base (or pass root= a WordNet 3.0 dict directory)"
)
_POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
_POINTER_POS = {"n": "n", "v": "v", "a": "a", "s": "a", "r": "r"}

#: Lexicographer file names by number (WordNet's lexnames(5WN)).
LEXNAMES = (
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
)


@dataclass(frozen=True)
class Synset:
    key: str
    lexfile: int
    words: tuple[str, ...]
    gloss: str


class WordNet:
    """The parsed database: synsets by key, hypernym and hyponym links.

    Use :func:`read_wordnet` (cached per directory) rather than the constructor.
    """

    def __init__(self, synsets: dict[str, Synset], parents: dict[str, tuple[str, ...]]):
        self.synsets = synsets
        self.parents = parents
        children: dict[str, list[str]] = {}
        for child, ps in parents.items():
            for p in ps:
                children.setdefault(p, []).append(child)
        self.children = {k: tuple(sorted(v)) for k, v in children.items()}

    @functools.cached_property
    def descendants(self) -> dict[str, frozenset[str]]:
        """Every synset's transitive hyponyms (instances included), itself excluded."""
        out: dict[str, frozenset[str]] = {}
        for start in sorted(self.synsets):
            stack = [(start, False)]
            while stack:  # iterative post-order
                key, expanded = stack.pop()
                if key in out:
                    continue
                kids = self.children.get(key, ())
                if expanded:
                    acc: set[str] = set(kids)
                    for c in kids:
                        acc |= out[c]
                    out[key] = frozenset(acc)
                else:
                    stack.append((key, True))
                    stack.extend((c, False) for c in kids if c not in out)
        return out

    def label(self, key: str) -> str:
        """A readable unique name, e.g. ``"bird.n.01503061"``."""
        syn = self.synsets[key]
        pos, offset = key.split(":")
        return f"{syn.words[0]}.{pos}.{offset}"


def _parse_line(line: str, pos: str) -> tuple[Synset, tuple[str, ...]]:
    head, _, gloss = line.partition(" | ")
    tok = head.split()
    offset, lexfile = tok[0], int(tok[1])
    n_words = int(tok[3], 16)
    words = tuple(tok[4 : 4 + 2 * n_words : 2])
    i = 4 + 2 * n_words
    n_pointers = int(tok[i])
    parents = []
    for j in range(n_pointers):
        symbol, target, target_pos = tok[i + 1 + 4 * j : i + 4 + 4 * j]
        if symbol in ("@", "@i"):
            parents.append(f"{_POINTER_POS[target_pos]}:{target}")
    key = f"{pos}:{offset}"
    return Synset(key, lexfile, words, gloss.strip()), tuple(parents)


@functools.lru_cache(maxsize=4)
def _read(root: Path) -> WordNet:
    synsets: dict[str, Synset] = {}
    parents: dict[str, tuple[str, ...]] = {}
    for name, pos in _POS.items():
        path = require_file(root / f"data.{name}", "WordNet", _FIX)
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("  ") or not line.strip():
                    continue
                syn, ps = _parse_line(line, pos)
                synsets[syn.key] = syn
                if ps:
                    parents[syn.key] = ps
    return WordNet(synsets, parents)


def read_wordnet(root: str | os.PathLike | None = None) -> WordNet:
    """Parse (once per directory) the WordNet data files under ``root``."""
    return _read(Path(root).expanduser().resolve() if root is not None else DEFAULT_ROOT)


class _WordNetClasses(ListedDataset):
    """Shared machinery: classes as sets of synsets, gloss texts, no official split."""

    modality = "text"

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = root
        self.wordnet = read_wordnet(root)
        self._hashes: dict[str, str] = {}
        names, members, excluded = self._build()
        order = np.argsort(names, kind="stable")
        ids, labels = [], []
        for label, i in enumerate(order):
            ids.extend(members[i])
            labels.extend([label] * len(members[i]))
        perm = np.argsort(ids, kind="stable")
        taken = set(ids) | excluded
        self._set_listing(
            [names[i] for i in order],
            SampleIndex(tuple(ids[i] for i in perm), np.asarray(labels)[perm]),
            [k for k in sorted(self.wordnet.synsets) if k not in taken],
        )

    def _build(self) -> tuple[list[str], list[tuple[str, ...]], set[str]]:
        """Class names, sorted member keys per class, and keys that are neither (roots)."""
        raise NotImplementedError  # intended: each WordNet protocol builds its own classes

    def load(self, ids: Sequence[str]) -> list[str]:
        syn = self.wordnet.synsets
        try:
            return [syn[k].gloss for k in ids]
        except KeyError as err:
            raise UnknownNameError(f"not a WordNet synset id: {err.args[0]!r}") from None

    def content_hashes(self, ids: Sequence[str]) -> list[str]:
        """The sha256 of each gloss (UTF-8), as :meth:`load` returns it; memoised per id (the
        database is parsed once per process, so the texts cannot change under this object)."""
        syn, memo, out = self.wordnet.synsets, self._hashes, []
        for k in ids:
            digest = memo.get(k)
            if digest is None:
                if k not in syn:
                    raise UnknownNameError(f"not a WordNet synset id: {k!r}")
                digest = memo[k] = sha256_sample(syn[k].gloss)
            out.append(digest)
        return out


class WordNetHypernyms(_WordNetClasses):
    """Disjoint hypernym-subtree classes (see the module docstring).

    Parameters
    ----------
    n_classes : int or None
        Keep the ``n_classes`` classes with the most members (ties by id); ``None`` keeps all.
    min_size, max_size : int
        Allowed number of member synsets per class.
    pos : tuple of str
        Parts of speech whose synsets may root a class (``"n"``, ``"v"``).
    root : str, optional
        WordNet directory (default ``/usr/share/wordnet``).
    """

    name = "wordnet-hypernym"

    def __init__(
        self,
        n_classes: int | None = 100,
        *,
        min_size: int = 150,
        max_size: int = 1500,
        pos: Sequence[str] = ("n", "v"),
        root: str | os.PathLike | None = None,
    ):
        if min_size < 1 or max_size < min_size:
            raise ValueError(f"need 1 <= min_size <= max_size; got {min_size}, {max_size}")
        self.n_classes = n_classes
        self.min_size, self.max_size, self.pos = int(min_size), int(max_size), tuple(pos)
        super().__init__(root)

    def _build(self):
        desc = self.wordnet.descendants
        cands = sorted(
            (
                k
                for k, d in desc.items()
                if k[0] in self.pos and self.min_size <= len(d) <= self.max_size
            ),
            key=lambda k: (len(desc[k]), k),
        )
        used: set[str] = set()
        chosen = []
        for k in cands:
            if k in used or not used.isdisjoint(desc[k]):
                continue
            chosen.append(k)
            used |= desc[k] | {k}
        if self.n_classes is not None:
            if self.n_classes > len(chosen):
                raise ValueError(
                    f"only {len(chosen)} disjoint hypernym classes have "
                    f"{self.min_size}..{self.max_size} members; asked for {self.n_classes}"
                )
            chosen = sorted(chosen, key=lambda k: (-len(desc[k]), k))[: self.n_classes]
        names = [self.wordnet.label(k) for k in chosen]
        return names, [tuple(sorted(desc[k])) for k in chosen], set(chosen)

    def config(self) -> dict:
        return {
            "n_classes": self.n_classes,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "pos": list(self.pos),
        }


class WordNetSupersenses(_WordNetClasses):
    """Lexicographer-file classes ("supersenses") with at least ``min_size`` synsets.

    Parameters
    ----------
    min_size : int
    root : str, optional
    """

    name = "wordnet-supersense"

    def __init__(self, min_size: int = 300, *, root: str | os.PathLike | None = None):
        self.min_size = int(min_size)
        super().__init__(root)

    def _build(self):
        by_file: dict[int, list[str]] = {}
        for key, syn in self.wordnet.synsets.items():
            by_file.setdefault(syn.lexfile, []).append(key)
        kept = sorted(f for f, keys in by_file.items() if len(keys) >= self.min_size)
        return ([LEXNAMES[f] for f in kept], [tuple(sorted(by_file[f])) for f in kept], set())

    def config(self) -> dict:
        return {"min_size": self.min_size}
