"""Class-incremental protocols: class order, tasks, per-class caps, and a verified manifest.

A :class:`Protocol` is a small serialisable description; :meth:`Protocol.build` turns it into a
:class:`TaskSequence` (the classes and the train/test sample ids of every task) and, given a
manifest path, writes the split there or checks it against the one written before.

Within-domain (one dataset): classes are ordered by ``numpy.random.RandomState(seed)
.permutation(C)``, the order PyCIL, PILOT [PILOT] and the reference code use for the same seed
(1993, 1996, 1997 in the LR-RGDA paper [LR-RGDA]), and cut into an ``initial`` task and
``increment``-sized tasks; the last task takes what remains (Cars-196 with 20/20: nine tasks of
20 and one of 16).

Cross-domain (several datasets): every dataset is split into two tasks, its classes shuffled
with ``RandomState(split_seed + dataset_index)`` (the reference code uses 42 whatever the run
seed), the first half taking the extra class when the count is odd; tasks follow the dataset
order. Use ``train_cap=128`` for the LR-RGDA paper's 128-shot cap. Train and test samples
always come from disjoint pools (the reference re-splitting script can leak train images into
test; this does not).

Per-class caps draw without replacement from each class's pool with
``numpy.random.default_rng([seed, dataset_index, class_index, split])``. For a dataset without
an official split, each class is shuffled with that generator and cut: with both caps and at
least ``train_cap + test_cap`` samples, ``test_cap`` go to test and ``train_cap`` to train; with
fewer, the class is divided in the ratio of the caps; with one cap or none, ``test_fraction`` of
the class goes to test (then capped). Sample ids are ``"<dataset>:<id>"``.

The manifest (JSON) records the protocol, each dataset's identity (options and a hash of its full
file listing), the class order and every task's sample ids, labels and content (a sha256 over the
per-sample content hashes of :meth:`Dataset.content_hashes`, in order, and the first 16 hex
digits of each, to name a changed sample), with a sha256 of all of it. Anchors drawn from the
protocol's datasets (:func:`~gdacil.data.draw_anchors`) are recorded there too. Rebuilding
against a manifest that differs in any of these (files added or removed, a sample whose bytes
changed under the same id, another class order, another seed...) is refused with
:class:`ManifestMismatchError`; a manifest edited by hand fails its checksum. A manifest written
before contents were hashed (format ``gdacil.protocol-manifest/1``) is checked for everything it
holds and then upgraded in place with the content hashes of the current data, with a warning.
"""

from __future__ import annotations

import itertools
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields
from pathlib import Path

import numpy as np

from .._validation import check_positive_int, check_range
from ..hashing import sha256_json, sha256_strings
from ..io import atomic_write_text
from ..registry import UnknownNameError
from ..typed_config import ConfigError, TypedConfig
from .base import Dataset, SampleIndex

__all__ = [
    "ManifestMismatchError", "Protocol", "ProtocolConfig", "Task", "TaskSequence", "split_id"
]

MANIFEST_FORMAT = "gdacil.protocol-manifest/2"
#: Manifests written before sample contents were hashed: accepted, then upgraded in place.
LEGACY_MANIFEST_FORMAT = "gdacil.protocol-manifest/1"
#: Hex digits of each sample's content hash kept in a manifest (to name a changed sample; the
#: split's full ``content_sha256`` is what is checked).
SHORT_HASH = 16
_SPLIT_CODES = {"train": 0, "test": 1}


class ManifestMismatchError(ValueError):
    """A protocol rebuilt now differs from its manifest (or the manifest was edited)."""


def split_id(sample_id: str) -> tuple[str, str]:
    """``"<dataset>:<local id>"`` to ``(dataset, local id)``."""
    name, sep, local = sample_id.partition(":")
    if not sep:
        raise UnknownNameError(f"sample id {sample_id!r} has no '<dataset>:' prefix")
    return name, local


@dataclass(frozen=True)
class ProtocolConfig(TypedConfig):
    """A class-incremental protocol less its run seed: the ``protocol`` section of an
    experiment config. :meth:`with_seed` makes it a :class:`Protocol`.

    Parameters
    ----------
    datasets : tuple of str
        Dataset registry names (one for within-domain; several for cross-domain).
    initial : int, optional
        Classes in the first task (default ``increment``). Within-domain only.
    increment : int
        Classes per later task. Within-domain only.
    train_cap, test_cap : int, optional
        Most samples per class in train / test.
    cross_domain : bool
        Two tasks per dataset (see the module docstring).
    split_seed : int
        Seed of the cross-domain class halves.
    test_fraction : float
        Share of a class that goes to test for datasets without an official split.
    dataset_options : dict
        ``{dataset name: keyword arguments of its factory}`` (e.g. ``{"cifar100": {"root": ...}}``).
    """

    datasets: tuple[str, ...]
    _: KW_ONLY
    initial: int | None = None
    increment: int = 10
    train_cap: int | None = None
    test_cap: int | None = None
    cross_domain: bool = False
    split_seed: int = 42
    test_fraction: float = 0.3
    dataset_options: dict = field(default_factory=dict)

    def __post_init__(self):
        names = (self.datasets,) if isinstance(self.datasets, str) else tuple(self.datasets)
        object.__setattr__(self, "datasets", names)
        if not names or len(set(names)) != len(names) or any(":" in n for n in names):
            raise ValueError(f"datasets must be distinct names without ':'; got {names!r}")
        if not self.cross_domain and len(names) != 1:
            raise ValueError(
                "a within-domain protocol takes exactly one dataset "
                "(set cross_domain=True for several)"
            )
        unknown = sorted(set(dict(self.dataset_options)) - set(names))
        if unknown:
            raise ValueError(
                f"dataset_options for datasets not in the protocol: {unknown}. dataset_options "
                f"maps a dataset name to its options: write dataset_options.<name>.<option>, "
                f"e.g. --set protocol.dataset_options.{names[0]}.root=PATH"
                + (" (one per dataset: " + ", ".join(names) + ")" if len(names) > 1 else "")
            )
        for name, opts in dict(self.dataset_options).items():
            if not isinstance(opts, Mapping):
                raise ValueError(
                    f"dataset_options.{name}: expected a mapping of options, got {opts!r}; "
                    f"for a folder write dataset_options.{name}.root=PATH"
                )
        object.__setattr__(
            self, "dataset_options", {k: dict(v) for k, v in dict(self.dataset_options).items()}
        )
        for attr in ("increment", "initial", "train_cap", "test_cap"):
            if attr == "increment" or getattr(self, attr) is not None:
                check_positive_int(getattr(self, attr), attr)
        check_range(self.test_fraction, "test_fraction", high=1.0, low_open=True, high_open=True)

    @classmethod
    def from_dict(cls, data, *, where: str = ""):
        """As :meth:`TypedConfig.from_dict`; a ``seed`` in an experiment's protocol section is
        refused with a pointer to the experiment's ``seeds``."""
        if cls is ProtocolConfig and isinstance(data, Mapping) and "seed" in data:
            raise ConfigError("the run seeds are the top-level `seeds` list of the experiment",
                              path=f"{where}.seed" if where else "seed")
        return super().from_dict(data, where=where)

    def with_seed(self, seed: int) -> Protocol:
        """The :class:`Protocol` of this configuration for run seed ``seed``."""
        settings = {f.name: getattr(self, f.name) for f in fields(ProtocolConfig)}
        return Protocol(**settings, seed=seed)


@dataclass(frozen=True)
class Protocol(ProtocolConfig):
    """A class-incremental protocol: a :class:`ProtocolConfig` (see there for the parameters)
    and the run ``seed`` (default 1993), which draws the class order (within-domain) and the
    per-class samples. ``Protocol(datasets, seed, *, initial=..., ...)``."""

    seed: int = 1993

    def __post_init__(self):
        super().__post_init__()
        check_positive_int(self.seed, "seed", minimum=0)

    def identity(self) -> dict:
        """:meth:`to_dict` without storage locations (``root`` options): what defines the split."""
        d = self.to_dict()
        d["dataset_options"] = {
            k: {o: v for o, v in opts.items() if o != "root"}
            for k, opts in d["dataset_options"].items()
        }
        return d

    def build(
        self,
        manifest: str | os.PathLike | None = None,
        *,
        datasets: Mapping[str, Dataset] | None = None,
    ) -> TaskSequence:
        """Build the task sequence; write ``manifest`` if it does not exist, else verify it.

        Parameters
        ----------
        manifest : path, optional
            JSON manifest to write (atomically) or to check against.
        datasets : mapping, optional
            Already-built datasets by name (default: built from the registry with
            ``dataset_options``).

        Raises
        ------
        ManifestMismatchError
            The split, or the content of a sample in it, differs from ``manifest``, or
            ``manifest`` fails its checksum.
        """
        from . import build_dataset

        given = dict(datasets or {})
        built = {
            n: given[n] if n in given else build_dataset(n, **self.dataset_options.get(n, {}))
            for n in self.datasets
        }
        seq = TaskSequence(self, built, *self._assign(built))
        if manifest is not None:
            seq.check_or_write_manifest(manifest)
        return seq

    def _task_classes(self, built: dict[str, Dataset]) -> list[list[tuple[int, int]]]:
        """Per task, ``(dataset index, dataset-local class)`` pairs in class order."""
        if not self.cross_domain:
            n = len(built[self.datasets[0]].classes)
            order = np.random.RandomState(self.seed).permutation(n).tolist()
            first = self.initial or self.increment
            if first > n:
                raise ValueError(f"initial={first} but {self.datasets[0]} has {n} classes")
            cuts = [0, first]
            while cuts[-1] < n:
                cuts.append(min(cuts[-1] + self.increment, n))
            return [[(0, c) for c in order[a:b]] for a, b in itertools.pairwise(cuts)]
        tasks = []
        for i, name in enumerate(self.datasets):
            n = len(built[name].classes)
            if n < 2:
                raise ValueError(
                    f"cross-domain needs at least 2 classes per dataset; {name} has {n}"
                )
            perm = np.random.RandomState(self.split_seed + i).permutation(n).tolist()
            half = (n + 1) // 2
            tasks += [[(i, c) for c in perm[:half]], [(i, c) for c in perm[half:]]]
        return tasks

    def _split_class(self, ds: Dataset, ds_index: int, label: int) -> tuple[list[str], list[str]]:
        """Train and test local ids of one class, each in index order."""

        def rng(split: str):
            return np.random.default_rng([self.seed, ds_index, label, _SPLIT_CODES[split]])

        def cap(pool: tuple[str, ...], k: int | None, split: str) -> list[str]:
            if k is None or len(pool) <= k:
                return list(pool)
            return [pool[i] for i in np.sort(rng(split).choice(len(pool), size=k, replace=False))]

        if ds.splits == ("train", "test"):
            return (
                cap(ds.index("train").of_class(label), self.train_cap, "train"),
                cap(ds.index("test").of_class(label), self.test_cap, "test"),
            )
        pool = ds.index(ds.splits[0]).of_class(label)
        n = len(pool)
        if self.train_cap is not None and self.test_cap is not None:
            if n >= self.train_cap + self.test_cap:
                n_test = self.test_cap
            else:
                n_test = round(n * self.test_cap / (self.train_cap + self.test_cap))
        else:
            n_test = min(round(n * self.test_fraction), self.test_cap or n)
        n_train = min(n - n_test, self.train_cap or n)
        perm = rng("train").permutation(n)
        test = np.sort(perm[:n_test])
        train = np.sort(perm[n_test : n_test + n_train])
        return [pool[i] for i in train], [pool[i] for i in test]

    def _assign(self, built: dict[str, Dataset]):
        names = self.datasets
        class_names: list[str] = []
        class_datasets: list[str] = []
        tasks: list[Task] = []
        for t, pairs in enumerate(self._task_classes(built)):
            split_ids: dict[str, tuple[list[str], list[int]]] = {
                "train": ([], []), "test": ([], [])}
            labels: list[int] = []
            for ds_index, local in pairs:
                ds = built[names[ds_index]]
                g = len(class_names)
                class_names.append(f"{names[ds_index]}:{ds.classes[local]}")
                class_datasets.append(names[ds_index])
                labels.append(g)
                for split, local_ids in zip(
                    ("train", "test"), self._split_class(ds, ds_index, local)
                ):
                    if not local_ids:
                        raise ValueError(f"class {class_names[-1]!r} has no {split} samples")
                    split_ids[split][0].extend(f"{names[ds_index]}:{i}" for i in local_ids)
                    split_ids[split][1].extend([g] * len(local_ids))
            tasks.append(
                Task(
                    t,
                    tuple(labels),
                    *(SampleIndex(tuple(ids), lab) for ids, lab in split_ids.values()),
                )
            )
        return tuple(class_names), tuple(class_datasets), tuple(tasks)


@dataclass(frozen=True)
class Task:
    """One task: its classes (global labels) and train/test samples (global ids and labels)."""

    index: int
    classes: tuple[int, ...]
    train: SampleIndex
    test: SampleIndex


class TaskSequence:
    """The outcome of :meth:`Protocol.build`.

    Attributes
    ----------
    protocol : Protocol
    datasets : dict of str to Dataset
    class_names : tuple of str
        ``"<dataset>:<class>"`` for global labels ``0 .. C-1`` (tasks take them in order).
    class_datasets : tuple of str
        The dataset of each global class (for class-wise metrics across domains).
    tasks : tuple of Task
    """

    def __init__(
        self,
        protocol: Protocol,
        datasets: dict[str, Dataset],
        class_names: tuple[str, ...],
        class_datasets: tuple[str, ...],
        tasks: tuple[Task, ...],
    ):
        self.protocol = protocol
        self.datasets = datasets
        self.class_names = class_names
        self.class_datasets = class_datasets
        self.tasks = tasks
        #: The manifest this sequence was written to or checked against (``None``: none).
        self.manifest_path: Path | None = None

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        return iter(self.tasks)

    def __getitem__(self, t: int) -> Task:
        return self.tasks[t]

    @property
    def modality(self) -> str:
        kinds = {d.modality for d in self.datasets.values()}
        if len(kinds) != 1:
            raise ValueError(f"datasets mix modalities {sorted(kinds)}")
        return kinds.pop()

    @property
    def cache_namespace(self) -> str:
        """Hash of the datasets' names and options, to pass as the feature cache's ``namespace``
        (options such as openclipart's ``max_side`` change the raw samples behind an id)."""
        return sha256_json([[n, self.datasets[n].config()] for n in self.protocol.datasets])

    def seen_test(self, t: int) -> SampleIndex:
        """Test samples of tasks ``0 .. t`` (what is evaluated after task ``t``)."""
        parts = self.tasks[: t + 1]
        return SampleIndex(
            tuple(i for p in parts for i in p.test.ids),
            np.concatenate([p.test.labels for p in parts]),
        )

    def _per_dataset(self, ids: Sequence[str], method: str) -> list:
        """``dataset.<method>(local ids)`` for global ids, grouped by dataset, in ``ids`` order."""
        groups: dict[str, list[int]] = {}
        local: list[str] = []
        for pos, sid in enumerate(ids):
            name, lid = split_id(sid)
            if name not in self.datasets:
                raise UnknownNameError(
                    f"sample {sid!r} is from {name!r}, not one of {sorted(self.datasets)}"
                )
            groups.setdefault(name, []).append(pos)
            local.append(lid)
        out: list = [None] * len(ids)
        for name, positions in groups.items():
            got = getattr(self.datasets[name], method)([local[p] for p in positions])
            for pos, value in zip(positions, got):
                out[pos] = value
        return out

    def load(self, ids: Sequence[str]) -> list:
        """Raw samples for global ids ``"<dataset>:<id>"``, in order."""
        return self._per_dataset(ids, "load")

    def content_hashes(self, ids: Sequence[str]) -> list[str]:
        """:meth:`Dataset.content_hashes` of global ids ``"<dataset>:<id>"``, in order."""
        return self._per_dataset(ids, "content_hashes")

    def manifest(self) -> dict:
        """The manifest content (without its checksum and the anchors recorded in it)."""
        every = [i for t in self.tasks for s in ("train", "test") for i in getattr(t, s).ids]
        hashes = iter(self.content_hashes(every))  # one call per dataset for the whole run

        def split(index: SampleIndex) -> dict:
            return {"ids": list(index.ids), "labels": index.labels.tolist(),
                    **_content_record([next(hashes) for _ in index.ids])}

        return {
            "format": MANIFEST_FORMAT,
            "protocol": self.protocol.identity(),
            "datasets": [self.datasets[n].identity() for n in self.protocol.datasets],
            "classes": list(self.class_names),
            "tasks": [
                {"classes": list(t.classes), "train": split(t.train), "test": split(t.test)}
                for t in self.tasks
            ],
        }

    @property
    def checksum(self) -> str:
        """sha256 of :meth:`manifest`."""
        return sha256_json(self.manifest())

    def check_or_write_manifest(self, path: str | os.PathLike) -> Path:
        """Write the manifest to ``path`` if absent; otherwise raise
        :class:`ManifestMismatchError` unless it describes exactly this split, sample contents
        included. A manifest of the format before content hashes that matches in everything it
        holds is upgraded in place (with a ``UserWarning``)."""
        path = Path(path)
        content = self.manifest()
        if not path.exists():
            _write_manifest(path, content)
            self.manifest_path = path
            return path
        stored = _read_manifest(path)
        problem = _first_difference(stored, content)
        if problem:
            raise ManifestMismatchError(
                f"refusing to use a split that differs from the manifest {path}: {problem}. "
                f"Restore the data / protocol it was written for, or delete it to record a new "
                f"split"
            )
        if stored["format"] == LEGACY_MANIFEST_FORMAT:
            _write_manifest(path, content)
            warnings.warn(
                f"{path} was written before sample contents were hashed; its split matches, and "
                f"the content hashes of the data as it is now were added to it. From now on a "
                f"sample whose content changes is refused; a change made before this run cannot "
                f"be detected", UserWarning, stacklevel=2)
        self.manifest_path = path
        return path

    def check_or_record_anchors(self, ids: Sequence[str], label: str) -> None:
        """Record the content of anchors drawn from this sequence's datasets in its manifest
        under ``label`` (e.g. the pool, count and seed they were drawn with), or, when that
        label is recorded already, raise :class:`ManifestMismatchError` unless they are the same
        samples with the same content. Nothing happens without a manifest."""
        path = self.manifest_path
        if path is None:
            return
        record = {"ids_sha256": sha256_strings(ids), "n": len(ids),
                  **_content_record(self.content_hashes(ids))}
        stored = _read_manifest(path)
        old = stored.get("anchors", {}).get(label)
        if old is None:
            stored.setdefault("anchors", {})[label] = record
            _write_manifest(path, stored)
            return
        if old == record:
            return
        if old.get("ids_sha256") != record["ids_sha256"]:
            problem = f"other samples were drawn ({old.get('n')} recorded, {len(ids)} now)"
        else:
            problem = _changed_content(old, record, ids)
        raise ManifestMismatchError(
            f"refusing anchors ({label}) that differ from those recorded in the manifest "
            f"{path}: {problem}. Restore the data they were drawn from, or delete the "
            f"manifest to record a new split"
        )


def _content_record(hashes: Sequence[str]) -> dict:
    """What a manifest keeps of the content hashes of a list of samples: a sha256 over all of
    them, in order, and the first :data:`SHORT_HASH` hex digits of each."""
    return {"content_sha256": sha256_strings(hashes),
            "content": [h[:SHORT_HASH] for h in hashes]}


def _write_manifest(path: Path, content: dict) -> Path:
    content = {k: v for k, v in content.items() if k != "sha256"}
    body = json.dumps({**content, "sha256": sha256_json(content)}, indent=1, sort_keys=True)
    return atomic_write_text(path, body + "\n")


def _read_manifest(path: Path) -> dict:
    """The manifest at ``path`` without its checksum, verified against it."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        checksum = stored.pop("sha256")
    except (ValueError, KeyError, AttributeError, TypeError) as err:
        raise ManifestMismatchError(f"{path} is not a protocol manifest ({err})") from None
    if sha256_json(stored) != checksum:
        raise ManifestMismatchError(
            f"{path} was modified after it was written (its sha256 does not match its "
            f"content); restore it, or delete it to record a new split"
        )
    return stored


def _changed_content(old: dict, new: dict, ids: Sequence[str]) -> str:
    """How the content of the same samples differs between two :func:`_content_record` records."""
    changed = [i for i, (a, b) in enumerate(zip(old.get("content", []), new["content"]))
               if a != b]
    if not changed:
        return "the content of a sample changed (same ids)"
    return (f"the content of {len(changed)} of {len(ids)} samples changed since the manifest "
            f"was written (same ids), first {ids[changed[0]]!r}")


def _first_difference(old: dict, new: dict) -> str | None:
    if old.get("format") not in (new["format"], LEGACY_MANIFEST_FORMAT):
        return f"manifest format {old.get('format')!r}, expected {new['format']!r}"
    if old["protocol"] != new["protocol"]:
        keys = sorted(
            k
            for k in set(old["protocol"]) | set(new["protocol"])
            if old["protocol"].get(k) != new["protocol"].get(k)
        )
        return "the protocol differs in " + ", ".join(
            f"{k} ({old['protocol'].get(k)!r} -> {new['protocol'].get(k)!r})" for k in keys
        )
    for o, n in zip(old["datasets"], new["datasets"]):
        if o["config"] != n["config"]:
            return f"dataset {n['name']!r} options changed ({o['config']} -> {n['config']})"
        if o["listing_sha256"] != n["listing_sha256"]:
            return (
                f"the file list of dataset {n['name']!r} changed since the manifest was "
                f"written (files added, removed, renamed or relabelled)"
            )
    if old["classes"] != new["classes"]:
        if sorted(old["classes"]) == sorted(new["classes"]):
            i = next(i for i, (a, b) in enumerate(zip(old["classes"], new["classes"])) if a != b)
            return (
                f"the class order differs (position {i}: {old['classes'][i]!r} in the "
                f"manifest, {new['classes'][i]!r} now)"
            )
        gone = sorted(set(old["classes"]) - set(new["classes"]))
        added = sorted(set(new["classes"]) - set(old["classes"]))
        return f"the classes differ (missing now: {gone[:3]}, new: {added[:3]})"
    if len(old["tasks"]) != len(new["tasks"]):
        return f"{len(old['tasks'])} tasks in the manifest, {len(new['tasks'])} now"
    for t, (o, n) in enumerate(zip(old["tasks"], new["tasks"])):
        for split in ("train", "test"):
            same = all(o[split].get(k) == n[split][k] for k in ("ids", "labels"))
            if not same or o["classes"] != n["classes"]:
                was, now = set(o[split]["ids"]), set(n[split]["ids"])
                return (
                    f"task {t} {split} samples differ ({len(was - now)} only in the manifest, "
                    f"{len(now - was)} only now, e.g. {sorted(was ^ now)[:2]})"
                )
    for t, (o, n) in enumerate(zip(old["tasks"], new["tasks"])):  # ids first, then contents
        for split in ("train", "test"):
            hashed = "content_sha256" in o[split] or old["format"] != LEGACY_MANIFEST_FORMAT
            if hashed and o[split].get("content_sha256") != n[split]["content_sha256"]:
                return f"task {t} {split}: " + _changed_content(o[split], n[split],
                                                                n[split]["ids"])
    return None
