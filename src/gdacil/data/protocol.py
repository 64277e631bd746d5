"""Class-incremental protocols: class order, tasks, per-class caps, and a verified manifest.

A :class:`Protocol` is a small serialisable description; :meth:`Protocol.build` turns it into a
:class:`TaskSequence` (the classes and the train/test sample ids of every task) and, given a
manifest path, writes the split there or checks it against the one written before.

Within-domain (one dataset): classes are ordered by ``numpy.random.RandomState(seed)
.permutation(C)``, the order PyCIL, PILOT and the reference code use for the same seed (1993,
1996, 1997 in the paper), and cut into an ``initial`` task and ``increment``-sized tasks; the last
task takes what remains (Cars-196 with 20/20: nine tasks of 20 and one of 16).

Cross-domain (several datasets): every dataset is split into two tasks, its classes shuffled
with ``RandomState(split_seed + dataset_index)`` (the reference code uses 42 whatever the run
seed), the first half taking the extra class when the count is odd; tasks follow the dataset
order. Use ``train_cap=128`` for the paper's 128-shot cap. Train and test samples always come
from disjoint pools (the reference re-splitting script can leak train images into test; this
does not).

Per-class caps draw without replacement from each class's pool with
``numpy.random.default_rng([seed, dataset_index, class_index, split])``. For a dataset without
an official split, each class is shuffled with that generator and cut: with both caps and at
least ``train_cap + test_cap`` samples, ``test_cap`` go to test and ``train_cap`` to train; with
fewer, the class is divided in the ratio of the caps; with one cap or none, ``test_fraction`` of
the class goes to test (then capped). Sample ids are ``"<dataset>:<id>"``.

The manifest (JSON) records the protocol, each dataset's identity (options and a hash of its full
file listing), the class order and every task's sample ids and labels, with a sha256 of all of
it. Rebuilding against a manifest that differs in any of these (files added or removed, another
class order, another seed...) is refused with :class:`ManifestMismatchError`; a manifest edited by
hand fails its checksum.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ..hashing import sha256_json
from ..io import atomic_write_text
from ..registry import UnknownNameError
from .base import Dataset, SampleIndex

__all__ = ["ManifestMismatchError", "Protocol", "Task", "TaskSequence", "split_id"]

MANIFEST_FORMAT = "gdacil.protocol-manifest/1"
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
class Protocol:
    """A class-incremental protocol.

    Parameters
    ----------
    datasets : tuple of str
        Dataset registry names (one for within-domain; several for cross-domain).
    seed : int
        Run seed: class order (within-domain) and per-class sampling.
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
    seed: int = 1993
    initial: int | None = None
    increment: int = 10
    train_cap: int | None = None
    test_cap: int | None = None
    cross_domain: bool = False
    split_seed: int = 42
    test_fraction: float = 0.3
    dataset_options: Mapping[str, Mapping] = field(default_factory=dict)

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
            v = getattr(self, attr)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{attr} must be a positive integer or None; got {v!r}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1); got {self.test_fraction!r}")

    def to_dict(self) -> dict:
        """JSON-able form; :meth:`from_dict` inverts it."""
        d = asdict(self)
        d["datasets"] = list(self.datasets)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Protocol:
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ValueError(f"unknown protocol fields {extra}; known: {sorted(known)}")
        return cls(**d)

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
            The split differs from ``manifest``, or ``manifest`` fails its checksum.
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
        class_names, class_datasets, tasks = [], [], []
        for t, pairs in enumerate(self._task_classes(built)):
            split_ids = {"train": ([], []), "test": ([], [])}
            labels = []
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

    def load(self, ids: Sequence[str]) -> list:
        """Raw samples for global ids ``"<dataset>:<id>"``, in order."""
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
            for pos, raw in zip(positions, self.datasets[name].load([local[p] for p in positions])):
                out[pos] = raw
        return out

    def manifest(self) -> dict:
        """The manifest content (without its checksum)."""
        return {
            "format": MANIFEST_FORMAT,
            "protocol": self.protocol.identity(),
            "datasets": [self.datasets[n].identity() for n in self.protocol.datasets],
            "classes": list(self.class_names),
            "tasks": [
                {
                    "classes": list(t.classes),
                    **{
                        s: {"ids": list(getattr(t, s).ids), "labels": getattr(t, s).labels.tolist()}
                        for s in ("train", "test")
                    },
                }
                for t in self.tasks
            ],
        }

    @property
    def checksum(self) -> str:
        """sha256 of :meth:`manifest`."""
        return sha256_json(self.manifest())

    def check_or_write_manifest(self, path: str | os.PathLike) -> Path:
        """Write the manifest to ``path`` if absent; otherwise raise
        :class:`ManifestMismatchError` unless it describes exactly this split."""
        path = Path(path)
        content = self.manifest()
        if not path.exists():
            body = json.dumps({**content, "sha256": sha256_json(content)}, indent=1, sort_keys=True)
            return atomic_write_text(path, body + "\n")
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            checksum = stored.pop("sha256")
        except (ValueError, KeyError, AttributeError) as err:
            raise ManifestMismatchError(f"{path} is not a protocol manifest ({err})") from None
        if sha256_json(stored) != checksum:
            raise ManifestMismatchError(
                f"{path} was modified after it was written (its sha256 does not match its "
                f"content); restore it, or delete it to record a new split"
            )
        problem = _first_difference(stored, content)
        if problem:
            raise ManifestMismatchError(
                f"refusing to use a split that differs from the manifest {path}: {problem}. "
                f"Restore the data / protocol it was written for, or delete it to record a new "
                f"split"
            )
        return path


def _first_difference(old: dict, new: dict) -> str | None:
    if old.get("format") != new["format"]:
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
            if o[split] != n[split] or o["classes"] != n["classes"]:
                was, now = set(o[split]["ids"]), set(n[split]["ids"])
                return (
                    f"task {t} {split} samples differ ({len(was - now)} only in the manifest, "
                    f"{len(now - was)} only now, e.g. {sorted(was ^ now)[:2]})"
                )
    return None
