"""The continual classifier: learn classes from raw samples, predict, forget, save versions.

A :class:`Learner` wires the pieces an experiment task uses (:mod:`gdacil.cil.runner`) into one
object that keeps learning: a backbone built by registry name, an optional Stage-1 strategy that
trains it, a compensator that then moves the old classes' statistics into the new feature
space (fitted on a reservoir of raw anchor samples, :mod:`gdacil.learner.reservoir`), per-class
Gaussian statistics, and a head rebuilt from them after every change. Class names are strings;
the learner maps them to internal integer ids, which are never reused.

``learn`` is a transaction: when it fails, the learner (statistics, head, backbone weights,
strategy state, anchors, calibration) is as it was before the call.

Each ``learn`` calibrates the model on its own samples (:mod:`gdacil.calibration`), cross-fitted:
each fold of them (a ``calibration_share`` of each class) is scored by the head refitted without
it. ``predict(..., reject=True)`` then says which
inputs are of no known class, probabilities are calibrated, and :meth:`Learner.predict_set` gives
conformal sets (docs/learner.md, "Saying I don't know").

A saved version (:meth:`Learner.save`, see :mod:`gdacil.learner.bundle`) holds:

===========================  =======================================================================
file                         what
===========================  =======================================================================
``learner.json``             format, the full :class:`LearnerConfig`, the classes in the order of
                             the statistics and the head (name, id, samples), the next free id,
                             the number of learns, what the backbone was (registry name, config,
                             modality, dimension, sha256 of its weights), the history
``statistics/<id>``          dense statistics, one file per class (``<id>.safetensors``, written by
                             :meth:`gdacil.ClassStatistics.save`), so versions share the files of
                             unchanged classes; ``statistics.safetensors`` for other storages.
                             Read when first needed (to learn or forget), not to predict
``head.safetensors``         the fitted head's state (:meth:`~gdacil.heads.GaussianHead.state_dict`,
                             with LR-RGDA's eigenpairs), so loading does not refit it (models saved
                             before FeCAM stored its state have none: refitted on load)
``backbone.safetensors``     the backbone's weights, when a strategy trains it (or
                             ``store_backbone``)
``strategy.safetensors``     the strategy's state between tasks (null-space moments), when it trains
``anchors.json``             the anchor reservoir: size, samples seen, each anchor's class and text
                             or image file; image anchors are ``anchors/<sha256>.png``
``calibration.safetensors``  the open-set calibration (:class:`~gdacil.calibration.Calibration`'s
                             state: the records of the latest learns' samples), when
                             there is one; versions saved before have none
===========================  =======================================================================
"""

from __future__ import annotations

import copy as _copy
import dataclasses
import difflib
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from .. import __version__, distributed
from .._validation import check_fraction
from ..backbones.base import check_precision, resolve_precision
from ..calibration import (
    CALIBRATION_SHARE,
    MIN_RECORDS,
    Calibration,
    calibration_folds,
    held_out_calibration,
    least_rate,
    new_input_calibration,
    records_for_rate,
)
from ..cil.config import ConfigError
from ..cil.model import IncrementalModel, TaskData, backbone_weights, task_seed
from ..cil.progress import format_duration
from ..data import extract_features
from ..io import CorruptFileError, entries_of, read_json
from ..novelty import NOVELTY_SCORES
from ..registry import UnknownNameError
from ..state import load_state, restore, save_state
from ..stats import ClassGaussians, ClassStatistics
from . import bundle
from .config import LearnerConfig
from .data import (
    LazySamples,
    Samples,
    load_images,
    load_texts,
    per_class_positions,
    read_samples,
)
from .reservoir import AnchorReservoir
from .vectors import (
    VECTOR_SUFFIXES,
    VectorTable,
    as_vectors,
    read_vectors,
    table_of,
    table_statistics,
)

if TYPE_CHECKING:
    from ..heads import GaussianHead

__all__ = ["LearnReport", "Learner", "Prediction", "UnknownClassError"]

LEARNER_FORMAT = "gdacil.learner/1"
#: Least seconds between two progress lines of a learn or predict without progress bars
PROGRESS_SECONDS = 5.0
logger = logging.getLogger(__name__)
_clock = time.monotonic
_PLURAL = {"image": "images", "text": "texts", "vector": "vectors"}
# purposes of the seeds drawn per learn (with gdacil.cil.model.task_seed; 0 trains the backbone)
_CAP, _RESERVOIR, _CALIBRATION, _RECORDS = 101, 102, 103, 104
#: Most calibration records a learn of vectors keeps (drawn with the seed beyond): they are held
#: in memory while the statistics stream, so a learn's memory does not grow with its size
MAX_RECORDS = 20_000
#: The format of exported class statistics (``Learner.export_statistics``): a ClassGaussians
#: file whose metadata also names the classes and the features' backbone
STATISTICS_FORMAT = "gdacil.statistics/1"
#: Most elements of one block of class scores when predicting with a calibration
_SCORE_BLOCK = 1 << 22
#: the learner's one compensator track and head, in its IncrementalModel
_TRACK, _HEAD = "model", "head"


class UnknownClassError(UnknownNameError):
    """A class name the model does not hold; the message suggests close names."""


@dataclass(frozen=True)
class Prediction:
    """The ``top_k`` classes of one input, best first, with their scores (log-posteriors up to
    a per-input constant) and probabilities (softmax over all classes; those of
    :meth:`gdacil.calibration.Calibration.calibrated` when the model is calibrated; None when
    not asked).

    With ``predict(..., reject=True)``: ``novelty``, the input's novelty score (higher: more
    typical of the known classes), ``threshold``, the score below which an input is rejected,
    and ``unknown``, whether it was (``novelty < threshold``). With ``predict(...,
    sets=alpha)``: ``prediction_set``, the input's conformal set of classes, best first.
    """

    classes: tuple[str, ...]
    scores: tuple[float, ...]
    probabilities: tuple[float, ...] | None
    novelty: float | None = None
    unknown: bool = False
    threshold: float | None = None
    prediction_set: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        """The predicted class (the best known class, also when ``unknown``)."""
        return self.classes[0]

    def to_list(self) -> list[dict]:
        """The ranked classes: ``[{"class", "score", "probability"}, ...]``."""
        if self.probabilities is None:
            return [{"class": c, "score": s} for c, s in zip(self.classes, self.scores)]
        return [{"class": c, "score": s, "probability": p}
                for c, s, p in zip(self.classes, self.scores, self.probabilities)]

    def to_dict(self) -> dict:
        """``{"predictions": to_list()}``, with ``"unknown"``, ``"novelty"`` and
        ``"threshold"`` when rejection was asked, and ``"set"`` when a conformal set was
        (what ``gdacil predict`` prints per input)."""
        out: dict = {"predictions": self.to_list()}
        if self.novelty is not None:
            out.update(unknown=self.unknown, novelty=self.novelty, threshold=self.threshold)
        if self.prediction_set is not None:
            out["set"] = list(self.prediction_set)
        return out


@dataclass(frozen=True)
class LearnReport:
    """What one :meth:`Learner.learn` did."""

    source: str
    samples: int
    classes: tuple[str, ...]
    new: tuple[str, ...]
    updated: tuple[str, ...]
    skipped: tuple[str, ...] = ()
    adapted: bool = False
    compensated: bool = False

    def __str__(self) -> str:
        parts = [f"learned {self.samples} samples of {len(self.classes)} classes "
                 f"({len(self.new)} new, {len(self.updated)} updated)"]
        if self.adapted:
            parts.append("trained the backbone" + (" and moved the old classes' statistics"
                                                   if self.compensated else ""))
        if self.skipped:
            parts.append(f"skipped {len(self.skipped)} folders without images: "
                         f"{', '.join(self.skipped)}")
        return "; ".join(parts)


def _single(inputs) -> bool:
    """Whether ``inputs`` is one input rather than a sequence of them."""
    if isinstance(inputs, (str, os.PathLike)) or hasattr(inputs, "getpixel"):  # PIL image
        return True
    return getattr(inputs, "ndim", 4) <= 3 and not isinstance(inputs, (list, tuple))


#: The fields of a learn's history event that :meth:`Learner.learn` writes itself
_LEARN_EVENT_FIELDS = frozenset({"action", "source", "samples", "new", "updated", "version"})

class Learner:
    """A continual classifier over raw images or texts, or vectors (``Learner("vectors")``).

    ``Learner(backbone, **settings)``: the settings are the fields of :class:`LearnerConfig`
    (``head``, ``head_params``, ``strategy``, ``compensator``, ``statistics``, ``anchors``,
    ``seed``, ...). The backbone is built when first needed.

    Examples
    --------
    >>> import os, tempfile
    >>> from gdacil.learner import Learner
    >>> learner = Learner("minilm")
    >>> print(learner.learn(["a purring cat", "a barking dog"], ["cat", "dog"]))
    learned 2 samples of 2 classes (2 new, 0 updated)
    >>> learner.predict("a kitten", top_k=2)[0].label
    'cat'
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     learner.save(os.path.join(tmp, "pets"))
    'v1'

    Saying "I don't know": each learn scores its own samples with heads refitted without them
    (ten folds of each class) to calibrate the rejection threshold (here 20 records):

    >>> cats = [f"the cat {v} on the sofa" for v in ("sleeps", "purrs", "naps", "stretches",
    ...         "yawns", "sits", "rests", "curls up", "meows", "lies")]
    >>> dogs = [f"the dog {v} in the park" for v in ("barks", "runs", "fetches", "plays", "digs",
    ...         "jumps", "sniffs", "chases a ball", "wags", "howls")]
    >>> pets = Learner("minilm")
    >>> print(pets.learn(cats + dogs, ["cat"] * 10 + ["dog"] * 10))
    learned 20 samples of 2 classes (2 new, 0 updated)
    >>> answers = pets.predict(["a kitten purrs on the sofa", "the quarterly tax filing deadline"],
    ...                        reject=True, reject_rate=0.25)
    >>> [(a.label, a.unknown) for a in answers]
    [('cat', False), ('cat', True)]
    >>> pets.predict_set("the dog barks in the park", alpha=0.25)
    [['dog']]
    """

    def __init__(self, backbone: str | None = None, **settings):
        if backbone is not None:
            settings["backbone"] = backbone
        self._setup(LearnerConfig(**settings))

    @classmethod
    def from_config(cls, config: LearnerConfig | dict, *, device=None,
                    precision: str | None = None) -> Learner:
        """A learner of ``config``; ``precision`` overrides ``config.precision`` in this process
        only (it is not saved: what ``gdacil predict --precision`` does)."""
        learner = cls.__new__(cls)
        if not isinstance(config, LearnerConfig):
            config = LearnerConfig.from_dict(config)
        learner._setup(config, device)
        if precision is not None:
            learner._precision = check_precision(precision, config.strategy.name)
        return learner

    def _setup(self, config: LearnerConfig, device=None) -> None:
        self.config = config
        self.device = device
        self._precision: str | None = None  # this process's override of config.precision
        self._backbone = None
        self._weights: dict[str, torch.Tensor] | None = None  # to load when the backbone is built
        self._record: dict | None = None  # what the backbone was when the model last learned
        self._order: list[int] = []  # class ids in the order of the statistics and the head
        self._counts: list[int] = []  # samples learned per class, in that order
        self._lazy: bundle.OpenedVersion | None = None  # where unread statistics are
        self._saved: dict[int, int] = {}  # class id -> its revision in the version of origin
        self._ids: dict[str, int] = {}
        self._next_id = 0
        self._steps = 0
        strategy = config.build_strategy()
        self._strategy = strategy if strategy.config.params != "none" else None
        # the statistics, the head, the compensator and the task step (its backbone and
        # strategy are set when it learns: the backbone is built when first needed)
        self._model = IncrementalModel(
            None, config.statistics, compensators={_TRACK: config.build_compensator()},
            heads={_HEAD: config.build_head}, ddof=config.ddof, seed=config.seed)
        keep = (self._strategy is not None and self._strategy.trains_on(1)
                and config.compensator.name != "identity")
        self._reservoir = AnchorReservoir(config.anchors if keep else 0)
        self._history: list[dict] = []
        self._pending: list[dict] = []
        self._origin: tuple[Path, str] | None = None
        # the records of the latest learns' samples (None: not calibrated)
        self._calibration: Calibration | None = None

    @property
    def _stats(self) -> ClassStatistics | None:
        """The statistics held (None before any class, or not read yet: see ``_lazy``)."""
        return self._model.tracks.get(_TRACK)

    @_stats.setter
    def _stats(self, stats: ClassStatistics | None) -> None:
        if stats is None:
            self._model.tracks.pop(_TRACK, None)
        else:
            self._model.tracks[_TRACK] = stats

    @property
    def _head(self) -> GaussianHead | None:
        """The fitted head (None before any class is learned)."""
        head = self._model.heads[_TRACK][_HEAD]
        return head if hasattr(head, "classes_") else None

    @_head.setter
    def _head(self, head: GaussianHead | None) -> None:
        self._model.heads[_TRACK][_HEAD] = head if head is not None else self.config.build_head()

    def copy(self) -> Learner:
        """An independent copy, to learn on while this learner keeps predicting (what
        ``gdacil serve`` does). A backbone that no strategy trains is shared, not copied."""
        frozen = self._strategy is None and self._backbone is not None
        return _copy.deepcopy(self, {id(self._backbone): self._backbone} if frozen else {})

    def __repr__(self) -> str:
        return (f"Learner(backbone={self.config.backbone!r}, head={self.config.head!r}, "
                f"strategy={self.config.strategy.name!r}, classes={len(self._ids)})")

    # ------------------------------------------------------------------ views
    @property
    def backbone(self):
        """The backbone (built, with any stored weights, on first use)."""
        if self._backbone is None:
            bb = self.config.build_backbone(self.device, self._precision)
            if self._weights is not None:
                try:
                    bb.model.load_state_dict(self._weights)
                except RuntimeError as exc:
                    raise ValueError(f"the stored backbone weights do not fit the backbone "
                                     f"{self.config.backbone!r}: "
                                     f"{' '.join(str(exc).split())[:300]}") from None
            self._check_backbone(bb)
            self._backbone, self._weights = bb, None
        return self._backbone

    def _check_backbone(self, bb) -> None:
        record = self._record
        if not record:
            return
        if bb.dim != record["dim"] or bb.modality != record["modality"]:
            where = (f"{self._origin[0] / bundle.VERSIONS / self._origin[1] / 'learner.json'}: "
                     if self._origin else "")
            raise ValueError(f"{where}the backbone {self.config.backbone!r} gives {bb.dim}-d "
                             f"{bb.modality} features, but this model was built on "
                             f"{record['dim']}-d {record['modality']} features")
        if bb.weights_fingerprint() != record["weights_sha256"]:
            location = str((record.get("config") or {}).get("source") or "")
            if getattr(bb, "strict", False) or location.startswith("local:"):
                raise ValueError(
                    f"the backbone {self.config.backbone!r} is not the encoder this model learned "
                    f"with: its weights (identity) hash to {bb.weights_fingerprint()[:12]}, the "
                    f"model's to {str(record['weights_sha256'])[:12]}; its features would differ. "
                    "Give it the encoder it was learned with")
            warnings.warn(f"the weights of the backbone {self.config.backbone!r} differ from "
                          "those this model learned with (a different installed version?); "
                          "its features, and so its predictions, may differ", UserWarning,
                          stacklevel=3)

    @property
    def precision(self) -> str:
        """The precision the backbone's forward passes run in here: the model's
        ``config.precision`` (or this process's override), "auto" resolved for its device;
        "fp32" for a vectors model, which runs no forward pass (its vectors stay float64)."""
        if self.modality == "vector":
            return "fp32"
        if self._backbone is not None:
            return self._backbone.precision
        device = self.device or self.config.backbone_options.get("device")
        return resolve_precision(self._precision or self.config.precision, device)

    @property
    def modality(self) -> str:
        """``"image"``, ``"text"`` or ``"vector"``: what the backbone takes."""
        if self._record:
            return self._record["modality"]
        return "vector" if self.config.backbone == "vectors" else self.backbone.modality

    def _dim(self) -> int | None:
        """The features' dimension when it is known without building the backbone (a vectors
        model's is fixed by its first learn)."""
        if self._record:
            return int(self._record["dim"])
        if self.config.backbone == "vectors":
            return self.config.backbone_options.get("dim")
        return self.backbone.dim

    @property
    def classes(self) -> list[str]:
        """The class names, in the order of the statistics and the head."""
        return self._names(self._order)

    def class_counts(self) -> dict[str, int]:
        """Samples learned per class."""
        return dict(zip(self.classes, self._counts))

    @property
    def statistics(self) -> ClassStatistics | None:
        """The class statistics (internal integer labels; see :meth:`class_ids`). A loaded
        model reads them when first needed: predicting does not."""
        return self._loaded_statistics()

    def _loaded_statistics(self) -> ClassStatistics | None:
        if self._stats is None and self._lazy is not None:
            stats = _read_statistics(self._lazy, self._order)
            if stats.classes != self._order or [int(n) for n in stats.counts.tolist()] \
                    != self._counts:
                raise CorruptFileError(self._lazy.file("learner.json"), "lists other classes "
                                       "or counts than the statistics hold", bundle.ADVICE)
            if self._head is not None:
                self._head.bind(stats)  # its stored eigenpairs are those of these statistics
            self._stats, self._lazy = stats, None
            self._saved = {c: stats.revision(c) for c in stats.classes}
        return self._stats

    def _set_statistics(self, stats: ClassStatistics | None) -> None:
        self._stats = stats
        self._order = stats.classes if stats is not None else []
        self._counts = [int(n) for n in stats.counts.tolist()] if stats is not None else []

    @property
    def head(self):
        """The fitted head (None before any class is learned)."""
        return self._head

    def class_ids(self) -> dict[str, int]:
        """Class name -> the internal label used by the statistics and the head."""
        return dict(self._ids)

    @property
    def version(self) -> str | None:
        """The saved version this learner was loaded from or last saved as."""
        return self._origin[1] if self._origin else None

    @property
    def history(self) -> list[dict]:
        """What changed the model, oldest first: the events of the saved versions it continues
        (each names its ``version``), then those :meth:`save` has not written yet (a copy)."""
        return _copy.deepcopy([*self._history, *self._pending])

    def _names(self, ids: Iterable[int]) -> list[str]:
        names = {i: n for n, i in self._ids.items()}
        return [names[int(i)] for i in ids]

    # ------------------------------------------------------------------ learning
    def learn(self, data, labels=None, *, text_column: str = "text", label_column: str = "label",
              vector_column: str = "vector", max_per_class: int | None = None,
              progress: bool = False, event: dict | None = None) -> LearnReport:
        """Add the classes of ``data`` and update those the model already holds.

        Parameters
        ----------
        data : path, Dataset, inputs, or (inputs, labels)
            A folder with one sub-folder of images per class, a CSV/TSV or JSONL/JSON file of
            texts, a :class:`gdacil.data.Dataset`, or in-memory inputs (texts, image files,
            PIL images, arrays) with ``labels`` (see :mod:`gdacil.learner.data`). A vectors
            model (``Learner("vectors")``) takes a Parquet, ``.npz``, CSV or JSONL file of
            vectors and labels, or a 2-d array of vectors with ``labels``
            (:mod:`gdacil.learner.vectors`); its dimension is fixed by its first learn.
        labels : sequence, optional
            Class names of in-memory ``data`` (converted with ``str``).
        text_column, label_column, vector_column : str
            Column (key) names in CSV, JSON and Parquet files (``.npz``: array names).
        max_per_class : int, optional
            Learn at most this many samples per class (drawn with the learner's seed).
        progress : bool
            Progress bars for feature extraction.
        event : dict, optional
            More JSON-able fields for this learn's event in the :attr:`history` (what
            ``gdacil serve`` records of the inbox items it learns).

        Returns
        -------
        LearnReport
        """
        event = dict(event or {})
        if own := sorted(set(event) & _LEARN_EVENT_FIELDS):
            raise ValueError(f"event fields {own} are the history's own; name yours otherwise")
        if self.modality == "vector":
            return self._learn_vectors(self._vector_table(data, labels, vector_column,
                                                          label_column), max_per_class, event)
        samples = self._read_samples(data, labels, text_column, label_column)
        t = self._steps
        if max_per_class is not None:
            samples = samples.limit_per_class(max_per_class, task_seed(self.config.seed, t, _CAP))
        if not len(samples):
            raise ValueError(f"{samples.source}: no samples to learn from")
        bb = self.backbone
        load = self._loader(samples.load)
        self._loaded_statistics()
        learned = list(dict.fromkeys(samples.labels))
        ids, fresh, updated = self._class_ids_after(learned)
        y = torch.tensor([ids[n] for n in samples.labels], dtype=torch.int64)
        old = self._stats.classes if self._stats is not None else []
        trains = self._strategy is not None and self._strategy.trains_on(t)
        compensate = trains and bool(old) and self.config.compensator.name != "identity"
        snapshot = self._snapshot() if trains else None
        try:
            reservoir, calibration = self._learn_task(t, samples, load, y, compensate, progress)
        except BaseException as exc:
            if snapshot is not None:
                self._restore(snapshot)
            if isinstance(exc, NotImplementedError):
                raise ValueError(f"strategy {self.config.strategy.name!r} cannot train the "
                                 f"backbone {self.config.backbone!r}: {exc}") from None
            raise
        self._reservoir, self._calibration = reservoir, calibration
        return self._learned(bb, ids, LearnReport(
            samples.source, len(samples), tuple(learned), tuple(fresh), tuple(updated),
            samples.skipped, trains, compensate), **event)

    def _read_samples(self, data, labels, text_column: str, label_column: str) -> Samples:
        """The samples of ``data`` for this (text or image) model, of its modality."""
        if isinstance(data, (str, os.PathLike)) and Path(data).suffix.lower() in VECTOR_SUFFIXES:
            raise ValueError(f"{data} holds vectors, but this model's backbone "
                             f"{self.config.backbone!r} takes {_PLURAL[self.modality]}; learn "
                             "vectors with a vectors model (Learner('vectors'), gdacil learn "
                             "--backbone vectors)")
        samples = read_samples(data, labels, text_column=text_column, label_column=label_column)
        self._check_modality(samples)
        return samples

    def _class_ids_after(self, learned: list[str]) -> tuple[dict[str, int], list[str], list[str]]:
        """``(ids, fresh, updated)``: the class ids once the classes ``learned`` are held (new
        ones numbered from the next free id), the new classes and those held already."""
        ids = dict(self._ids)
        fresh = [n for n in learned if n not in ids]
        ids.update({n: self._next_id + k for k, n in enumerate(fresh)})
        updated = [n for n in learned if n not in fresh]
        if updated and self.config.statistics.storage != "dense":
            raise ValueError(f"this model keeps low-rank statistics, which cannot take new "
                             f"samples of classes they hold ({', '.join(updated[:5])}); learn "
                             "only new classes, or use dense statistics")
        return ids, fresh, updated

    def _learned(self, bb, ids: dict[str, int], report: LearnReport, **event) -> LearnReport:
        """What a learn that succeeded records: the classes, the step, the backbone, the
        event for the history."""
        self._set_statistics(self._stats)
        self._ids, self._next_id, self._steps = ids, self._next_id + len(report.new), \
            self._steps + 1
        self._record = {"name": bb.name, "config": _portable(_jsonable(bb.config())),
                        "modality": bb.modality, "dim": bb.dim,
                        "weights_sha256": bb.weights_fingerprint()}
        self._pending.append({"action": "learn", "source": report.source,
                              "samples": report.samples, "new": list(report.new),
                              "updated": list(report.updated), **event})
        return report

    # ------------------------------------------------------------------ vectors and statistics
    def _vector_table(self, data, labels, vector_column: str, label_column: str,
                      need_labels: bool = True) -> VectorTable:
        """The vectors of ``data`` (a file, or in-memory vectors with ``labels``), checked to
        have this vectors model's dimension."""
        if labels is None and isinstance(data, tuple) and len(data) == 2:
            data, labels = data
        if isinstance(data, (str, os.PathLike)):
            table = read_vectors(data, vector_column=vector_column, label_column=label_column,
                                 labels=need_labels)
        else:
            table = table_of(data, labels)
        if need_labels and table.names is None:
            raise ValueError("learning vectors in memory needs their labels: "
                             "learn(vectors, labels)")
        dim = self._dim()
        if dim is not None and table.dim != dim:
            column = f" (column {vector_column!r})" if isinstance(data, (str, os.PathLike)) else ""
            raise ValueError(f"{table.source}: vectors of {table.dim} numbers{column}, but this "
                             f"model takes {dim}-d vectors")
        return table

    def _vector_backbone(self, dim: int):
        """The vectors backbone, of dimension ``dim`` when the model has none yet."""
        if self.config.backbone_options.get("dim") is None and not self._record:
            return _vectors_backbone(dim, self.device)
        return self.backbone

    def _learn_vectors(self, table: VectorTable, max_per_class: int | None,
                       event: dict) -> LearnReport:
        """Learn a table of vectors a chunk at a time (:data:`~gdacil.learner.vectors.CHUNK_ROWS`
        rows): their class statistics are accumulated as they are read, and only the
        calibration records (at most :data:`MAX_RECORDS`) are kept. Under ``torchrun`` each
        process reads its contiguous share of the rows and the statistics are merged exactly
        (:func:`gdacil.distributed.all_reduce_stats`)."""
        if self._strategy is not None:
            raise ValueError(f"a vectors model has no backbone to train; strategy "
                             f"{self.config.strategy.name!r} needs one (use strategy frozen)")
        t, cfg = self._steps, self.config
        assert table.names is not None and table.codes is not None  # read with labels
        keep = np.ones(table.n, dtype=bool)
        if max_per_class is not None:
            chosen = per_class_positions(table.labels(), max_per_class,
                                         task_seed(cfg.seed, t, _CAP))
            keep[:] = False
            keep[chosen] = True
        # names are numbered by first appearance in the table
        learned = [table.names[c] for c in np.unique(table.codes[keep]).tolist()]
        self._loaded_statistics()
        ids, fresh, updated = self._class_ids_after(learned)
        y = torch.from_numpy(np.array([ids.get(n, -1) for n in table.names],
                                      dtype=np.int64)[table.codes])
        folds = torch.full((table.n,), -1, dtype=torch.int64)
        kept = torch.from_numpy(np.flatnonzero(keep))
        folds[kept] = self._record_folds(t, y[kept])
        bb = self._vector_backbone(table.dim)
        stats, X_records = table_statistics(table, y, bb, keep=torch.from_numpy(keep),
                                            records=folds >= 0, ddof=cfg.ddof)
        at = torch.nonzero(folds >= 0)[:, 0]
        n = int(keep.sum())
        report = LearnReport(table.source, n, tuple(learned), tuple(fresh), tuple(updated))
        self._learn_moments(bb, stats, X_records, y[at], folds[at])
        if self.config.backbone_options.get("dim") is None:
            self.config = dataclasses.replace(
                self.config, backbone_options={**self.config.backbone_options, "dim": table.dim})
        self._backbone = bb
        return self._learned(bb, ids, report, **event)

    def _record_folds(self, t: int, y: torch.Tensor) -> torch.Tensor:
        """The calibration fold of each sample of learn ``t`` (``-1``: not a record), as
        :meth:`_held_out` deals them, at most :data:`MAX_RECORDS` records kept (drawn with the
        seed); all ``-1`` when the learn does not calibrate."""
        cfg = self.config
        if not cfg.calibration_share or cfg.statistics.storage != "dense":
            return torch.full_like(y, -1)
        folds = calibration_folds(y, cfg.calibration_share, task_seed(cfg.seed, t, _CALIBRATION))
        chosen = torch.nonzero(folds >= 0)[:, 0]
        if len(chosen) > MAX_RECORDS:
            g = torch.Generator().manual_seed(task_seed(cfg.seed, t, _RECORDS))
            dropped = chosen[torch.randperm(len(chosen), generator=g)[MAX_RECORDS:]]
            folds[dropped] = -1
        return folds

    def _learn_moments(self, bb, new: ClassGaussians, X: torch.Tensor, y: torch.Tensor,
                       folds: torch.Tensor) -> None:
        """Merge the statistics ``new`` into the model's and refit the head, then calibrate on
        the records ``X``, ``y`` (their ``folds``; none: the calibration stays as it was), as
        one transaction: on failure the statistics, head and calibration are as before."""
        cfg = self.config
        dim = new.dim
        if cfg.statistics.storage != "dense":
            new = cfg.statistics.empty(dim, cfg.ddof).merge(new)
        tracks = dict(self._model.tracks) or {_TRACK: cfg.statistics.empty(dim, cfg.ddof)}
        calibration = self._calibration
        t = self._steps

        def finish(records: torch.Tensor) -> None:
            nonlocal calibration
            if len(records):
                calibration = self._held_out(t, records, y, tracks[_TRACK], folds)

        self._model.backbone = bb
        self._model._merge_and_fit(tracks, new, X, y, {}, finish)
        self._calibration = calibration

    def learn_statistics(self, statistics, names=None, *, source: str | None = None
                         ) -> LearnReport:
        """Add (or update) classes from their statistics, computed elsewhere: exactly as if
        their samples had been learned (the same merge, the same head).

        Parameters
        ----------
        statistics : ClassGaussians or path
            Dense statistics of this model's features (same dimension and ``ddof``), or a file
            written by :meth:`export_statistics` or :meth:`gdacil.ClassGaussians.save`.
        names : sequence or mapping, optional
            The class name of each label (a sequence in the order of ``statistics.classes``, or
            ``{label: name}``); default: the names an exported file holds, else each label's
            decimal string.
        source : str, optional
            What the history calls them (default: the file, or "statistics").

        Notes
        -----
        Statistics carry no samples, so they cannot calibrate the model: the calibration
        stays as it was (as after a learn in which no class has 3 samples), its records scored
        by a head without these classes; calibrate on held-out samples of them
        (:meth:`calibrate`) for rates that cover them. A file of statistics of another
        backbone (its record differs from this model's) is refused.

        Examples
        --------
        >>> import torch
        >>> from gdacil import ClassGaussians
        >>> g = torch.Generator().manual_seed(0)
        >>> site = ClassGaussians(4).update(torch.randn(30, 4, generator=g), torch.arange(30) % 3)
        >>> model = Learner("vectors")
        >>> print(model.learn_statistics(site, ["cat", "dog", "owl"]))
        learned 30 samples of 3 classes (3 new, 0 updated)
        >>> model.predict([0.1, 0.0, -0.2, 0.3])[0].label in {"cat", "dog", "owl"}
        True
        """
        if isinstance(statistics, (str, os.PathLike)):
            source = source or str(statistics)
            statistics, stored, record = read_statistics(statistics)
            names = stored if names is None else names
            self._check_record(record, source)
        if not isinstance(statistics, ClassGaussians):
            raise TypeError(f"learn_statistics takes dense ClassGaussians (or their file); got "
                            f"{type(statistics).__name__}")
        source = source or "statistics"
        if self._strategy is not None:
            raise ValueError("statistics computed elsewhere cannot be learned by a model whose "
                             "strategy trains the backbone (the features would move)")
        dim = self._dim()  # None: a vectors model whose dimension these statistics fix
        if dim is not None and statistics.dim != dim:
            raise ValueError(f"{source}: statistics of {statistics.dim}-d features, but this "
                             f"model's are {dim}-d")
        if statistics.ddof != self.config.ddof:
            raise ValueError(f"{source}: statistics with ddof={statistics.ddof}, but this model "
                             f"keeps ddof={self.config.ddof}")
        if not statistics.n_classes:
            raise ValueError(f"{source}: no classes to learn")
        labels = statistics.classes
        learned = _statistics_names(labels, names, source)
        self._loaded_statistics()
        ids, fresh, updated = self._class_ids_after(learned)
        tensors, meta = statistics.state_dict()
        tensors["labels"] = torch.tensor([ids[n] for n in learned], dtype=torch.int64)
        new = ClassGaussians.from_state((tensors, meta), source=source)
        bb = (self._vector_backbone(statistics.dim) if self.config.backbone == "vectors"
              else self.backbone)
        empty = torch.empty(0, dtype=torch.int64)
        self._learn_moments(bb, new, torch.empty(0, statistics.dim, dtype=torch.float64), empty,
                            empty)
        if self.config.backbone == "vectors" and "dim" not in self.config.backbone_options:
            self.config = dataclasses.replace(
                self.config, backbone_options={**self.config.backbone_options,
                                               "dim": statistics.dim})
        self._backbone = bb
        report = LearnReport(source, int(new.counts.sum()), tuple(learned), tuple(fresh),
                             tuple(updated))
        return self._learned(bb, ids, report, statistics=True)

    def export_statistics(self, path: str | os.PathLike) -> Path:
        """Write the model's class statistics to ``path`` (a safetensors file, atomically):
        what :meth:`learn_statistics` of another model (of the same backbone) takes. The file
        is a :meth:`gdacil.ClassGaussians.save` file whose metadata also holds the class
        names (``gdacil.classes``, in label order) and the backbone record
        (``gdacil.backbone``); labels are this model's internal ids."""
        stats = self._loaded_statistics()
        if stats is None:
            raise ValueError("the model has learned no classes yet: nothing to export")
        if not isinstance(stats, ClassGaussians):
            raise ValueError(f"only dense statistics can be exported; this model's are "
                             f"{self.config.statistics.storage}")
        tensors, meta = stats.state_dict()
        meta = {**meta, "gdacil.format": STATISTICS_FORMAT,
                "gdacil.classes": self._names(stats.classes), "gdacil.backbone": self._record}
        return save_state(path, (tensors, meta))

    def _check_record(self, record: dict | None, source: str) -> None:
        """Refuse statistics whose features came from another backbone than this model's."""
        mine = self._record
        if not record or not mine:
            return
        for key in ("name", "modality", "dim", "weights_sha256"):
            if record.get(key) != mine.get(key):
                raise ValueError(f"{source}: statistics of features of backbone "
                                 f"{record.get('name')!r} ({record.get('dim')}-d, weights "
                                 f"{str(record.get('weights_sha256'))[:12]}), but this model's "
                                 f"are of {mine['name']!r} ({mine['dim']}-d, weights "
                                 f"{str(mine['weights_sha256'])[:12]}): they differ in {key}")

    def _learn_task(self, t: int, samples: Samples, load, y: torch.Tensor, compensate: bool,
                    progress: bool) -> tuple[AnchorReservoir, Calibration | None]:
        """Task ``t`` through the model's task step (as the experiment runner takes it); returns
        the reservoir after it was offered the samples and the calibration (see
        :meth:`_held_out`), both made inside the task's transaction. On failure the model's
        statistics and head are as they were; the backbone and strategy are :meth:`learn`'s to
        restore."""
        cfg, bb = self.config, self.backbone
        raws = self._reservoir.raws() if compensate else []
        if compensate and not raws and not cfg.include_current:
            raise ValueError("drift compensation needs anchors: set anchors > 0 or "
                             "include_current=True")
        anchors = ([("anchor", i) for i in range(len(raws))]
                   + (list(samples.keys) if compensate and cfg.include_current else []))
        reservoir, calibration = self._reservoir, self._calibration
        moved: dict[str, ClassStatistics] = {}  # the compensated statistics, merged into next

        def offer(X: torch.Tensor) -> None:  # inside the task's transaction: a failure undoes it
            nonlocal reservoir, calibration
            if reservoir.size:
                rng = np.random.default_rng(task_seed(cfg.seed, t, _RESERVOIR))
                reservoir = reservoir.offered(samples, load, rng, _anchor_side(bb), bb.modality)
            calibration = self._held_out(t, X, y, moved.get(_TRACK))

        self._model.backbone, self._model.strategy = bb, self._strategy
        self._model.learn_task(t, TaskData(
            keys=samples.keys, labels=y, samples=LazySamples(samples.keys, load),
            features=self._task_features(samples, load, raws, progress), anchors=anchors),
            on_compensated=lambda track, _before, after: moved.__setitem__(track, after),
            finish=offer)
        return reservoir, calibration

    def _held_out(self, t: int, X: torch.Tensor, y: torch.Tensor,
                  moved: ClassStatistics | None, folds: torch.Tensor | None = None
                  ) -> Calibration | None:
        """The calibration after learn ``t``, called by the task step once the statistics hold
        the task's samples and the head is refitted on them: fitted on records of this learn's
        own samples (``X``, the features the task step extracted, and ``y``), each fold of them
        scored by the head refitted without it (:func:`~gdacil.calibration.calibration_folds`),
        joined by the newest records of earlier learns when they are fewer than
        :data:`~gdacil.calibration.MIN_RECORDS`. The previous
        calibration when none can be made: calibration disabled, statistics that are not dense
        (samples cannot be taken out of them exactly), or no class of the learn with 3 samples
        or more. ``folds``: the records' folds when ``X`` holds the records only
        (:meth:`_record_folds`)."""
        cfg = self.config
        if not cfg.calibration_share or cfg.statistics.storage != "dense":
            return self._calibration
        if folds is None:
            folds = calibration_folds(y, cfg.calibration_share,
                                      task_seed(cfg.seed, t, _CALIBRATION))
        if not bool((folds >= 0).any()):
            return self._calibration
        # the statistics the head was just refitted on: the compensated ones, those held (merged
        # in place), or, at the first learn, the task's own
        stats = moved if moved is not None else self._model.tracks.get(_TRACK)
        if stats is None:
            stats = ClassGaussians(X.shape[1], ddof=cfg.ddof).update(X, y)
        head = self._model.heads[_TRACK][_HEAD]
        return held_out_calibration(head, stats, X, y, folds=folds, method=cfg.novelty,
                                    previous=self._calibration)

    def _task_features(self, samples: Samples, load, raws: list, progress: bool):
        """``features(keys)`` of the task's samples (their keys) and the reservoir's anchors
        (``("anchor", i)``), each kind extracted in one pass."""
        def features(keys: list) -> torch.Tensor:
            own = [k for k in keys if not isinstance(k, tuple)]
            anchors = [k for k in keys if isinstance(k, tuple)]
            parts = []
            if own:
                parts.append((own, self._extract(own, load, progress)))
            if anchors:
                parts.append((anchors, self._features([raws[i] for _, i in anchors])))
            ordered = [k for group, _ in parts for k in group]
            X = torch.cat([rows for _, rows in parts]) if len(parts) > 1 else parts[0][1]
            if ordered == keys:
                return X
            where = {k: i for i, k in enumerate(ordered)}
            return X[torch.tensor([where[k] for k in keys], dtype=torch.long)]

        return features

    def _snapshot(self) -> tuple[dict, dict]:
        assert self._strategy is not None  # taken only when the strategy trains
        return backbone_weights(self.backbone), dict(self._strategy.moments_)

    def _restore(self, snapshot: tuple[dict, dict]) -> None:
        """The backbone and strategy as they were (rebuilt: a failed task may have left
        adapters attached or a task open)."""
        self._backbone, self._weights = None, snapshot[0]
        self._strategy = self.config.build_strategy()
        self._strategy.moments_ = snapshot[1]

    def _check_modality(self, samples: Samples) -> None:
        modality = self.modality
        if samples.modality is not None and samples.modality != modality:
            raise ValueError(f"{samples.source} holds {_PLURAL[samples.modality]}, but this "
                             f"model's backbone {self.config.backbone!r} takes "
                             f"{_PLURAL.get(modality, modality)}")

    def _vector_inputs(self, inputs) -> np.ndarray:
        """The vectors to classify, checked, ``(n, dim)``: one vector (a 1-d array or a list
        of numbers) or several."""
        one = getattr(inputs, "ndim", None) == 1 or (
            isinstance(inputs, (list, tuple)) and len(inputs) > 0
            and not any(isinstance(v, (list, tuple, str, bytes)) or hasattr(v, "__len__")
                        for v in inputs))
        return as_vectors([inputs] if one else inputs, self._dim())

    def _loader(self, load):
        """``load`` checked for this model's modality; messages name an input by its path, or
        as ``inputs[key]`` (its position among all the inputs, not within the batch). Vectors
        are checked before (:meth:`_vector_inputs`)."""
        if self.modality == "vector":
            return load
        texts = self.modality == "text"
        check = load_texts if texts else load_images

        def loaded(keys):
            items = load(keys)
            return check(items, names=[
                str(x) if not texts and isinstance(x, (str, os.PathLike)) else f"inputs[{k}]"
                for k, x in zip(keys, items)])

        return loaded

    def _extract(self, keys: list[str], load, progress: bool = False,
                 what: str = "learn") -> torch.Tensor:
        """Features of ``keys`` (:meth:`_extract_here`); under ``torchrun`` each process
        extracts its contiguous share of them and every process gets all the features back
        (:func:`gdacil.distributed.all_gather_rows`), as ``gdacil run`` shards extraction."""
        if distributed.world_size() == 1:
            return self._extract_here(keys, load, progress, what)
        mine = distributed.shard(keys)
        X = self._extract_here(list(mine), load, progress, what) if len(mine) else \
            torch.empty(0, self.backbone.dim, dtype=self._feature_dtype())
        return distributed.all_gather_rows(X)

    def _feature_dtype(self) -> torch.dtype:
        return torch.float64 if self.modality == "vector" else torch.float32

    def _extract_here(self, keys: list[str], load, progress: bool = False,
                      what: str = "learn") -> torch.Tensor:
        """Features of ``keys`` in this process: with a progress bar (``progress``), else with a progress line
        on the ``gdacil.learner`` logger (INFO) at most every :data:`PROGRESS_SECONDS` while it
        runs, so that a user whose output is not a terminal sees it is alive. The chunks are
        :func:`extract_features`' own, so the features are the same either way."""
        bb, batch = self.backbone, self.config.batch_size
        step = batch * 4
        if progress or len(keys) <= step or not logger.isEnabledFor(logging.INFO):
            return extract_features(bb, keys, load, batch_size=batch, progress=progress,
                                    load_batches=4)
        noun = _PLURAL.get(bb.modality, "samples")
        start = last = _clock()
        parts = []
        for done in range(0, len(keys), step):
            parts.append(extract_features(bb, keys[done:done + step], load, batch_size=batch,
                                          load_batches=4))
            now, done = _clock(), min(done + step, len(keys))
            if now - last >= PROGRESS_SECONDS and done < len(keys):
                left = (now - start) / done * (len(keys) - done)
                logger.info("%s: extracted %s of %s %s (%d%%), about %s left", what,
                            f"{done:,}", f"{len(keys):,}", noun, 100 * done // len(keys),
                            format_duration(left))
                last = now
        return torch.cat(parts)

    def _features(self, raws: list) -> torch.Tensor:
        return self._extract([str(i) for i in range(len(raws))],
                             lambda keys: [raws[int(k)] for k in keys])

    # ------------------------------------------------------------------ prediction
    def predict(self, inputs, top_k: int = 1, *, probabilities: bool = True,
                reject: bool = False, reject_rate: float | None = None,
                sets: float | None = None, progress: bool = False) -> list[Prediction]:
        """The ``top_k`` classes of each input, best first.

        ``inputs`` is a sequence of texts (text models) or of image files, PIL images or arrays
        (image models); one string, path or image is taken as one input. Returns one
        :class:`Prediction` per input. The head ranks the classes with its ``top_k``, one block
        of classes at a time; ``probabilities=False`` leaves out the probabilities, whose
        normaliser needs every class's score, so that LR-RGDA may rank by its exact pruned
        scoring (faster from thousands of classes on). A calibrated model (see
        :attr:`calibration`) gives calibrated probabilities (temperature-scaled,
        :meth:`gdacil.calibration.Calibration.calibrated`).

        ``reject=True`` also scores how typical each input is of the known classes and calls it
        ``unknown`` when its novelty score is below :meth:`rejection_threshold` for
        ``reject_rate`` (default: the config's ``reject_rate``), the target share of inputs of
        known classes called unknown. ``sets=alpha`` gives each input's conformal set of
        classes (see :meth:`predict_set`). Both need a calibration: a ``ValueError`` says why
        the model has none.
        """
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer; got {top_k!r}")
        if not isinstance(reject, bool):
            raise ValueError(f"reject must be True or False; got {reject!r}")
        if reject_rate is not None and not reject:
            raise ValueError("reject_rate applies to predict(..., reject=True) only")
        if self._head is None:
            raise ValueError("the model has learned no classes yet: learn some first")
        threshold = self.rejection_threshold(reject_rate) if reject else None
        if sets is not None:
            check_fraction(sets, "sets (the conformal sets' miscoverage alpha)")
            self._calibrated_for("conformal prediction sets")
        items = (self._vector_inputs(inputs) if self.modality == "vector"
                 else [inputs] if _single(inputs) else list(inputs))
        if not len(items):
            return []
        load = self._loader(lambda keys: [items[int(k)] for k in keys])
        X = self._extract([str(i) for i in range(len(items))], load, progress, what="predict")
        head = self._head
        k = min(top_k, len(self._order))
        calibration = self._calibration
        members: list[list[int]] | None = None
        if calibration is not None and (probabilities or sets is not None):
            scores, labels, found, members = _calibrated_top_k(head, X, k, calibration,
                                                               probabilities, sets)
            proba = found.tolist() if found is not None else None
        else:
            top = head.top_k(X, k, proba=probabilities)
            scores, labels = top[0].to(torch.float64).cpu(), top[1].tolist()
            proba = top[2].to(torch.float64).cpu().tolist() if probabilities else None
        # the records' score: a model saved under an earlier default keeps it
        novelty = (head.score_samples(X, cast(Calibration, calibration).method_).cpu().tolist()
                   if reject else None)
        out = []
        for i, (s, row) in enumerate(zip(scores.tolist(), labels)):
            extra: dict = {}
            if novelty is not None:
                extra.update(novelty=novelty[i], unknown=novelty[i] < cast(float, threshold),
                             threshold=threshold)
            if members is not None:
                extra["prediction_set"] = tuple(self._names(members[i]))
            out.append(Prediction(tuple(self._names(row)), tuple(s),
                                  tuple(proba[i]) if proba else None, **extra))
        return out

    def predict_set(self, inputs, alpha: float = 0.1, *, progress: bool = False) -> list[list[str]]:
        """The conformal prediction set of each input: the classes whose temperature-scaled
        probability is at least ``1 - q``, best first, with ``q`` the split-conformal quantile
        of the calibration's records for miscoverage ``alpha``
        (:meth:`gdacil.calibration.Calibration.prediction_sets`). For a new input exchangeable
        with those records (one of the classes of the learn that calibrated the model), its
        set holds its true class with probability at least ``1 - alpha``. A set may hold
        several classes (the model hesitates) or every class (too few records for ``alpha``).
        Needs a calibration, as :meth:`predict` with ``reject=True`` does."""
        predictions = self.predict(inputs, probabilities=False, sets=alpha, progress=progress)
        return [list(cast(tuple, p.prediction_set)) for p in predictions]

    @property
    def calibration(self) -> Calibration | None:
        """The open-set calibration (:class:`gdacil.calibration.Calibration`): the records of
        the latest learns' samples (None: not calibrated)."""
        return self._calibration

    def rejection_threshold(self, rate: float | None = None) -> float:
        """The novelty score below which ``predict(..., reject=True)`` calls an input unknown,
        for a target false-rejection rate ``rate`` (default: the config's ``reject_rate``):
        the ``floor(rate (n + 1))``-th smallest novelty score of the ``n`` records,
        so that an input of a known class exchangeable with them is rejected with probability
        at most ``rate``. A ``ValueError`` when the model has no calibration or too few records
        for ``rate``."""
        rate = self.config.reject_rate if rate is None else rate
        check_fraction(rate, "reject_rate")
        calibration = self._calibrated_for("rejection")
        threshold = calibration.threshold(rate)
        if threshold == -math.inf:
            n, need = calibration.n_records, records_for_rate(rate)
            takes = ("more than 1e308" if need is None else f"at least {need}"
                     if need < 10**15 else f"at least {float(need):.3g}")
            raise ValueError(
                f"the model's calibration holds {n} records, too few for a false-rejection "
                f"rate of {rate:g} (that takes {takes}); ask a larger reject_rate (at "
                f"least {least_rate(n):.3f}), or learn more samples at once (each sample of a "
                "learn's classes with 3 samples or more is a record; a learn with fewer than "
                f"{MIN_RECORDS} is joined by the newest records of earlier learns)")
        return threshold

    def _calibrated_for(self, what: str) -> Calibration:
        """The calibration, or a ``ValueError`` saying why there is none and what to do."""
        if self._calibration is not None:
            return self._calibration
        cfg = self.config
        if not cfg.calibration_share:
            why = "calibration_share is 0, so no learn calibrates it"
            fix = f"make a model with calibration_share > 0 (default {CALIBRATION_SHARE:g})"
        elif cfg.statistics.storage != "dense":
            why = (f"its statistics are {cfg.statistics.storage}, from which held-out samples "
                   "cannot be taken out exactly")
            fix = "use a model with dense statistics"
        else:
            forgot = any(e.get("action") == "forget" for e in [*self._history, *self._pending])
            why = ("forgetting classes dropped the records that a head holding them scored, "
                   "and no learn has calibrated it since" if forgot else
                   "no learn has calibrated it (a model saved before gdacil calibrated, or "
                   "every learn had fewer than 3 samples of each class)")
            fix = "learn at least 3 samples of a class in one learn"
        raise ValueError(f"{what} needs a calibrated model, and this one has no calibration: "
                         f"{why}; {fix}, calibrate it on held-out samples "
                         "(Learner.calibrate, gdacil calibrate), or predict without it")

    def calibrate(self, data, labels=None, *, text_column: str = "text",
                  label_column: str = "label", vector_column: str = "vector",
                  progress: bool = False) -> int:
        """Calibrate the model again on labelled samples of classes it holds that it has
        **not** learned (a held-out set), and return the number of records.

        Each sample is scored by the current head as a new input would be, and these records
        replace the calibration (the rejection threshold, the temperature, the conformal
        quantiles): split conformal in its textbook form, so the stated rates hold for inputs
        exchangeable with these samples, of whichever classes they cover. Use it after
        :meth:`forget` (which drops the records a head holding the forgotten classes scored),
        for models whose learns do not calibrate (``calibration_share=0`` or low-rank
        statistics), or to calibrate on samples more like what the model will meet. Samples the
        model learned would look more typical than new inputs and make the rates optimistic.
        The model is unchanged otherwise; the next :meth:`learn` calibrates on its own records
        again. ``data`` and ``labels`` are read as :meth:`learn` reads them; a class the model
        does not hold raises :class:`UnknownClassError` and nothing changes.
        """
        if self._head is None:
            raise ValueError("the model has learned no classes yet: learn some first")
        if self.modality == "vector":
            table = self._vector_table(data, labels, vector_column, label_column)
            names, source = table.labels(), table.source
            X = self.backbone.extract(table.array())
        else:
            samples = self._read_samples(data, labels, text_column, label_column)
            if not len(samples):
                raise ValueError(f"{samples.source}: no samples to calibrate on")
            names, source = list(samples.labels), samples.source
        for name in dict.fromkeys(names):
            if name not in self._ids:
                raise self._unknown(name)
        if self.modality != "vector":
            X = self._extract(list(samples.keys), self._loader(samples.load), progress,
                              what="calibrate")
        y = torch.tensor([self._ids[n] for n in names], dtype=torch.int64)
        self._calibration = new_input_calibration(self._head, X, y, method=self.config.novelty)
        self._pending.append({"action": "calibrate", "source": source, "samples": len(names)})
        return len(names)

    # ------------------------------------------------------------------ forgetting
    def forget(self, classes: str | Iterable[str]) -> list[str]:
        """Remove ``classes`` (names): their statistics, their place in the head, their raw
        anchors and their names in the history. Returns the names removed.

        Names are normalised as labels are (:func:`~gdacil.learner.names.class_name`: NFC,
        surrounding whitespace stripped, integers as their decimal string); an unknown name
        raises :class:`UnknownClassError` and nothing changes.

        With a backbone that no strategy trains and dense statistics (the default), the model is
        then the one that learned the same samples less those of the classes, to round-off
        (each class's statistics come from its own samples alone, and the head is refitted on
        those of the classes left), and the version :meth:`save` writes next holds nothing of
        them: no statistics file, no rows of the head (LR-RGDA's eigenpairs included), no
        anchors, no calibration record that a head holding them scored
        (:meth:`gdacil.calibration.Calibration.forget`: usually every record, so the model has
        no calibration until the next learn or :meth:`calibrate`), and no name: the history's
        learn events lose it and the forget event records only how many classes went. What
        stays: the totals of samples in the history's learn events and the reservoir's count
        of samples seen (sums over every class); the sources the learns name (a file or folder
        name); with a strategy, the backbone it
        trained on the classes, its state, and the other classes' statistics as the compensator
        moved them with anchors that included theirs; with low-rank statistics, the running sum
        behind ``Sigma_avg``, which keeps each forgotten class's compression error
        (:mod:`gdacil.stats.lowrank`).

        Earlier saved versions keep the classes: that is what :func:`~gdacil.learner.rollback`
        brings back. To purge them, delete the folders of the versions saved before the
        forget (``MODEL/versions/v1`` up to the one before the new version): every version
        folder is complete on its own (the files it shares with others are hard links), so the
        current version still loads, and later saves continue from it."""
        from .names import class_name

        given = [classes] if isinstance(classes, str) else list(classes)
        names = [c if isinstance(c, str) and c in self._ids  # a name saved before normalising
                 else class_name(c, "classes" if isinstance(classes, str) else f"classes[{i}]")
                 for i, c in enumerate(given)]
        for name in names:
            if name not in self._ids:
                raise self._unknown(name)
        names = list(dict.fromkeys(names))
        drop = {self._ids[n] for n in names}
        old = self._loaded_statistics()
        assert old is not None  # the classes to forget are known, so statistics exist
        keep = [c for c in old.classes if c not in drop]
        stats = old.subset(keep)
        head = None
        if keep:
            head = self._head
            assert head is not None  # fitted on the classes held
            try:
                head.fit(stats)
            except BaseException:
                head.fit(old)
                raise
        self._set_statistics(stats)
        self._head = head
        self._ids = {n: i for n, i in self._ids.items() if i not in drop}
        self._reservoir = self._reservoir.without(names)
        if self._calibration is not None:  # records a head holding them scored go too
            self._calibration = self._calibration.forget(sorted(drop))
        self._history = _without_names(self._history, names)
        self._pending = [*_without_names(self._pending, names),
                         {"action": "forget", "count": len(names)}]
        return names

    def _unknown(self, name: str) -> UnknownClassError:
        close = difflib.get_close_matches(name, list(self._ids), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        known = sorted(self._ids)
        listing = ", ".join(known[:20]) + (" ..." if len(known) > 20 else "")
        return UnknownClassError(f"unknown class {name!r}{hint} (the model's "
                                 f"{len(known)} classes: {listing or 'none'})")

    # ------------------------------------------------------------------ summary
    def info(self) -> dict:
        """What the model is and holds, JSON-able."""
        cfg = self.config
        counts = self.class_counts()
        return {
            "version": self.version,
            "backbone": {"name": cfg.backbone, "options": cfg.backbone_options,
                         **({"modality": self._record["modality"], "dim": self._record["dim"]}
                            if self._record else {})},
            "head": {"name": cfg.head, "params": cfg.head_params},
            "strategy": cfg.strategy.to_dict(),
            "compensator": cfg.compensator.to_dict() if self._strategy is not None else None,
            "statistics": cfg.statistics.storage,
            "precision": {"model": cfg.precision, "runs": self.precision},
            "learns": self._steps,
            "samples": sum(counts.values()),
            "anchors": {"kept": len(self._reservoir), "size": self._reservoir.size},
            "calibration": self._calibration_info(),
            "classes": counts,
        }

    def _calibration_info(self) -> dict | None:
        """The calibration's records, how many classes they come from, their novelty score,
        temperature and threshold at the config's reject rate (None when its records are too
        few for that rate), or None without a calibration."""
        calibration = self._calibration
        if calibration is None:
            return None
        rate = self.config.reject_rate
        threshold = calibration.threshold(rate)
        return {"records": calibration.n_records,
                "record_classes": calibration.n_record_classes,
                "novelty": calibration.method_,
                "temperature": calibration.temperature_,
                "reject_rate": rate,
                "threshold": threshold if math.isfinite(threshold) else None}

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike, *, force: bool = False) -> str:
        """Save a new version of this model in ``directory`` and make it current; returns its
        name (``"v1"``, ``"v2"``, ...). Earlier versions are kept.

        A learner loaded from (or last saved to) ``directory`` continues it; if another writer
        changed the current version meanwhile, :class:`~gdacil.learner.bundle.BundleError` is
        raised and nothing is written. Saving another learner into a directory that already
        holds a model is refused unless ``force`` (which adds it as the next version).
        """
        directory = Path(directory).expanduser()
        resolved = directory.resolve()
        expect: object  # a version name, bundle.ANY or None: see bundle.write_version
        parent: str | None
        if self._origin is not None and self._origin[0] == resolved:
            expect = parent = self._origin[1]
        elif (directory / bundle.CURRENT).exists():
            if not force:
                raise bundle.BundleError(
                    f"{directory} already holds a model (version "
                    f"{bundle.current_version(directory)}); continue it with Learner.load, or "
                    "save(..., force=True) to add this learner to it as its next version")
            expect, parent = bundle.ANY, None
        else:
            expect, parent = None, None
        continues = self._origin is not None and self._origin[0] == resolved
        if not continues:  # every file is written afresh: the statistics are needed
            self._loaded_statistics()
        name = bundle.write_version(directory, partial(self._write, continues),
                                    expect_current=expect, parent=parent)
        self._history += [{**event, "version": name} for event in self._pending]
        self._pending = []
        self._origin = (resolved, name)
        if self._stats is not None:
            self._saved = {c: self._stats.revision(c) for c in self._stats.classes}
        return name

    def _write(self, continues: bool, writer: bundle.VersionWriter) -> dict:
        """Write this learner's files; ``continues``: the parent is the version of origin, so
        files of what has not changed since (classes, the backbone) are linked to it."""
        history = self._history + [{**e, "version": writer.name} for e in self._pending]
        self._write_statistics(writer, continues)
        untouched = continues and self._stats is None  # neither learned nor forgot since load
        if (head := self._head) is not None and not (untouched and writer.link("head.safetensors")):
            writer.write_with("head.safetensors", lambda p: save_state(p, head.state_dict()))
        as_loaded = self._backbone is None and self._weights is not None  # never built since
        if (self._strategy is not None or self.config.store_backbone) and not (
                continues and as_loaded and writer.link("backbone.safetensors")):
            weights = cast(dict, self._weights) if as_loaded else backbone_weights(self.backbone)
            writer.write_with("backbone.safetensors", lambda p: save_state(
                p, (weights, {"backbone": self.config.backbone})))
        if (strategy := self._strategy) is not None:
            writer.write_with("strategy.safetensors",
                              lambda p: save_state(p, strategy.state_dict()))
        if (calibration := self._calibration) is not None:
            writer.write_with("calibration.safetensors",
                              lambda p: save_state(p, calibration.state_dict()))
        if self._reservoir.size:
            writer.write_json("anchors.json", self._reservoir.to_json())
            for relative, png in self._reservoir.files().items():
                writer.write_bytes(relative, png)
        writer.write_json("learner.json", {
            "format": LEARNER_FORMAT, "gdacil": __version__, "config": self.config.to_dict(),
            "classes": [{"name": n, "id": i, "samples": k}
                        for n, i, k in zip(self.classes, self._order, self._counts)],
            "next_id": self._next_id, "learns": self._steps, "backbone": self._record,
            "history": history})
        return {"actions": [e["action"] for e in self._pending] or ["save"],
                "events": self._pending, "classes": len(self._order),
                "samples": sum(self._counts)}

    def _write_statistics(self, writer: bundle.VersionWriter, continues: bool) -> None:
        """Dense statistics: one file per class, ``statistics/<id>.safetensors``, linked to the
        parent's where the class has not changed; other storages: ``statistics.safetensors``."""
        if not self._order:
            return
        stats = self._stats

        def unchanged(c: int) -> bool:
            return stats is None or self._saved.get(c) == stats.revision(c)

        if self.config.statistics.storage != "dense":
            if not (continues and all(map(unchanged, self._order))
                    and writer.link("statistics.safetensors")):
                loaded = cast(ClassStatistics, self._loaded_statistics())  # classes are held
                writer.write_with("statistics.safetensors", loaded.save)
            return
        for c in self._order:
            relative = f"statistics/{c}.safetensors"
            if not (continues and unchanged(c) and writer.link(relative)):
                loaded = cast(ClassStatistics, self._loaded_statistics())  # classes are held
                writer.write_with(relative, loaded.subset([c]).save)

    @classmethod
    def load(cls, directory: str | os.PathLike, version: str | int | None = None, *,
             device=None, precision: str | None = None) -> Learner:
        """The model saved in ``directory``: its current version (``CURRENT``, read once), or
        ``version``. Every file is verified against the manifest's sha256 first; nothing is
        unpickled or executed (JSON and safetensors only). The class statistics are read when
        first needed (to learn or forget), not to predict.

        Raises ``FileNotFoundError`` when there is no model there,
        :class:`~gdacil.io.CorruptFileError` naming any file that is missing, altered or
        invalid, and :class:`~gdacil.learner.bundle.BundleError` for an unknown version.
        ``precision`` overrides the model's ``precision`` in this process (not saved).
        """
        opened = bundle.open_version(directory, version)
        meta_path = _required(opened, "learner.json")
        meta = read_json(meta_path, bundle.ADVICE)
        found = meta.get("format") if isinstance(meta, dict) else None
        if found != LEARNER_FORMAT:
            raise CorruptFileError(meta_path, f"not a learner of format {LEARNER_FORMAT!r} "
                                              f"(found {found!r})", bundle.ADVICE)
        try:  # a model saved before models kept their precision ran fp32
            config = LearnerConfig.from_dict({"precision": "fp32", **meta["config"]})
        except (ConfigError, KeyError, TypeError) as exc:
            raise ValueError(f"{meta_path}: cannot rebuild the learner from its config: "
                             f"{exc}") from None
        learner = cls.from_config(config, device=device, precision=precision)
        with entries_of(meta_path, bundle.ADVICE):
            learner._restore_state(opened, meta)
        learner._origin = (Path(directory).expanduser().resolve(), opened.name)
        return learner

    def _restore_state(self, opened: bundle.OpenedVersion, meta: dict) -> None:
        where = opened.file("learner.json")

        def corrupt(problem: str) -> CorruptFileError:
            return CorruptFileError(where, problem, bundle.ADVICE)

        def count(value, what: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise corrupt(f"{what} must be an integer >= 0; got {value!r}")
            return value

        classes = meta["classes"]
        if not isinstance(classes, list) or not all(isinstance(c, dict) for c in classes):
            raise corrupt("classes must be a list of {name, id, samples}")
        for c in classes:
            if not isinstance(c["name"], str) or not c["name"]:
                raise corrupt(f"a class name must be a non-empty string; got {c['name']!r}")
        self._ids = {c["name"]: count(c["id"], f"the id of class {c['name']!r}")
                     for c in classes}
        self._order = [c["id"] for c in classes]
        self._counts = [count(c["samples"], f"the samples of class {c['name']!r}")
                        for c in classes]
        if len(self._ids) != len(classes) or len(set(self._order)) != len(classes):
            raise corrupt("repeats a class name or id")
        self._next_id = count(meta["next_id"], "next_id")
        self._steps = count(meta["learns"], "learns")
        if self._order and self._next_id <= max(self._order):
            # the next learn would give a new class the id of one held: two classes merged
            raise corrupt(f"next_id {self._next_id} is not above the largest class id "
                          f"{max(self._order)}")
        self._lazy = opened if classes else None
        record = meta["backbone"]
        if record is not None and not isinstance(record, dict):
            raise corrupt(f"backbone must be a mapping; got {record!r}")
        if record and (count(record["dim"], "backbone.dim") < 1
                       or not isinstance(record["modality"], str)):
            raise corrupt(f"backbone.dim must be >= 1 and backbone.modality a name; got "
                          f"{record['dim']!r} and {record['modality']!r}")
        self._record = _portable(record) if record else record  # no path of the machine
        self._history = list(meta.get("history", []))
        if opened.has("head.safetensors"):
            self._head = restore(self.config.build_head(), opened.file("head.safetensors"))
            if self._head.classes_.tolist() != self._order:
                raise CorruptFileError(opened.file("head.safetensors"), "holds a head of other "
                                       "classes than learner.json lists", bundle.ADVICE)
        elif classes:  # a head whose state is not stored (FeCAM): fitted again
            self._head = self.config.build_head().fit(self._loaded_statistics())
        if opened.has("calibration.safetensors"):  # versions saved before have none
            self._calibration = _read_calibration(opened.file("calibration.safetensors"),
                                                  self._order)
        if opened.has("backbone.safetensors"):
            self._weights = load_state(opened.file("backbone.safetensors"))[0]
        if self._strategy is not None and opened.has("strategy.safetensors"):
            restore(self._strategy, opened.file("strategy.safetensors"))
        if opened.has("anchors.json"):
            anchors = opened.file("anchors.json")
            with entries_of(anchors, bundle.ADVICE):
                self._reservoir = AnchorReservoir.from_json(
                    read_json(anchors, bundle.ADVICE),
                    lambda rel: _required(opened, rel).read_bytes())


def _vectors_backbone(dim: int, device=None):
    from ..backbones import build_backbone

    return build_backbone("vectors", dim=dim, device=device)


def read_statistics(path: str | os.PathLike) -> tuple[ClassGaussians, list[str] | None,
                                                     dict | None]:
    """``(statistics, class names, backbone record)`` of a file written by
    :meth:`Learner.export_statistics` (names and record None for a plain
    :meth:`ClassGaussians.save` file)."""
    tensors, meta = load_state(path)
    extra = {k: meta.pop(k) for k in list(meta) if k.startswith("gdacil.")}
    try:
        stats = ClassStatistics.from_state((tensors, meta), source=str(path))
    except ValueError as exc:
        raise ValueError(f"{exc} (expected class statistics: Learner.export_statistics or "
                         "ClassGaussians.save writes them)") from None
    if not isinstance(stats, ClassGaussians):
        raise ValueError(f"{path}: {type(stats).__name__} statistics; only dense "
                         "ClassGaussians can be learned (their samples' moments are exact)")
    names = extra.get("gdacil.classes")
    if names is not None and (not isinstance(names, list) or len(names) != stats.n_classes):
        raise ValueError(f"{path}: gdacil.classes must list one name per class "
                         f"({stats.n_classes}); got {names!r:.80}")
    record = extra.get("gdacil.backbone")
    return stats, names, record if isinstance(record, dict) else None


def _statistics_names(labels: list[int], names, source: str) -> list[str]:
    """The class name of each of ``labels`` (see :meth:`Learner.learn_statistics`)."""
    from .names import class_name

    if names is None:
        values = list(labels)
    elif isinstance(names, dict):
        missing = [c for c in labels if c not in names]
        if missing:
            raise ValueError(f"{source}: names gives no name for labels {missing[:5]}")
        values = [names[c] for c in labels]
    else:
        values = list(names)
        if len(values) != len(labels):
            raise ValueError(f"{source}: {len(values)} names for {len(labels)} classes")
    out = [class_name(v, f"{source}, class {c}") for c, v in zip(labels, values)]
    if len(set(out)) != len(out):
        twice = next(n for n in out if out.count(n) > 1)
        raise ValueError(f"{source}: two classes are named {twice!r}")
    return out


def _read_calibration(path: Path, order: list[int]) -> Calibration:
    """The calibration stored in ``path``, checked to be whole and of the classes ``order``."""
    def corrupt(problem: str) -> CorruptFileError:
        return CorruptFileError(path, problem, bundle.ADVICE)

    try:
        calibration = restore(Calibration(), path)
    except ValueError as exc:
        raise corrupt(f"not a calibration ({exc})") from None
    missing = [a for a in Calibration._state_attributes if a not in calibration.__dict__]
    if missing:
        raise corrupt(f"lacks the calibration's {', '.join(missing)}")
    n = calibration.labels_.numel()
    tensors = (calibration.novelty_, calibration.labels_, calibration.nonconformity_)
    temperature = calibration.temperature_
    if (not n or any(t.shape != (n,) for t in tensors)
            or calibration.scores_.ndim != 2 or calibration.scores_.shape[0] != n
            or calibration.score_classes_.shape != calibration.scores_.shape
            or isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not 0 < temperature < math.inf or calibration.method_ not in NOVELTY_SCORES):
        raise corrupt("holds a calibration whose parts do not fit together")
    if not set(calibration.labels_.tolist()) <= set(order):
        raise corrupt("holds calibration records of classes the model does not hold")
    return calibration


def _without_names(events: list[dict], names: list[str]) -> list[dict]:
    """History ``events`` whose lists of class names (a learn's ``new`` and ``updated``, a
    forget's ``classes`` in models saved before forgets were anonymous) lack ``names``."""
    gone = set(names)
    return [{key: [n for n in value if n not in gone]
             if key in ("new", "updated", "classes") and isinstance(value, list) else value
             for key, value in event.items()} for event in events]


def _read_statistics(opened: bundle.OpenedVersion, order: list[int]) -> ClassStatistics:
    """The statistics of a saved version, in fresh aligned storage (tensors read from
    safetensors may sit at unaligned offsets; see gdacil.state). One file per class: their rows
    are stacked and validated at once (:meth:`ClassStatistics.from_tensors`)."""
    if opened.has("statistics.safetensors"):
        return ClassStatistics.load(opened.file("statistics.safetensors")).copy()
    paths = [_required(opened, f"statistics/{c}.safetensors") for c in order]
    parts = [load_state(path) for path in paths]
    config = parts[0][1]
    for path, (tensors, meta) in zip(paths, parts):
        if meta != config or set(tensors) != set(parts[0][0]):
            raise CorruptFileError(path, "holds another kind of statistics than "
                                         f"{paths[0].name}", bundle.ADVICE)
    kind = type(ClassStatistics.load(paths[0]))  # checks the format
    rows = {name: torch.cat([tensors[name] for tensors, _ in parts]) for name in parts[0][0]}
    return kind.from_tensors(rows, {k: v for k, v in config.items() if k != "format"},
                             source=str(paths[0].parent))


def _calibrated_top_k(head, X: torch.Tensor, k: int, calibration: Calibration,
                      probabilities: bool, alpha: float | None):
    """``(scores, labels, probabilities, sets)`` of features ``X`` under a calibrated model:
    the ``k`` best classes by the head's scores (``scores`` float64 ``(n, k)``, ``labels`` a
    list of rows of class ids), their calibrated probabilities (float64 ``(n, k)``,
    when ``probabilities``) and, with ``alpha``, each input's conformal set (class ids, best
    first). The scores of every class are needed (the normaliser), so they are computed in
    blocks of inputs that bound the ``(inputs, classes)`` matrix to :data:`_SCORE_BLOCK`
    elements."""
    classes = head.classes_
    n, C = X.shape[0], len(classes)
    rows = max(1, _SCORE_BLOCK // max(C, 1))
    scores, where, proba = [], [], []
    sets: list[list[int]] | None = [] if alpha is not None else None
    for start in range(0, n, rows):
        D = head.decision_function(X[start:start + rows]).to(torch.float64).cpu()
        best, at = D.topk(k, dim=1)
        scores.append(best)
        where.append(at)
        if probabilities:
            proba.append(calibration.calibrated(D).gather(1, at))
        if sets is not None:
            inside = calibration.prediction_sets(D, cast(float, alpha))
            for i in range(D.shape[0]):
                members = torch.nonzero(inside[i])[:, 0]
                ranked = members[D[i, members].argsort(descending=True, stable=True)]
                sets.append(classes[ranked].tolist())
    labels = classes[torch.cat(where)].tolist()
    return (torch.cat(scores), labels, torch.cat(proba) if probabilities else None, sets)


def _required(opened: bundle.OpenedVersion, relative: str) -> Path:
    if not opened.has(relative):
        raise CorruptFileError(opened.path / relative, "missing from manifest.json, which "
                                                       "must list it", bundle.ADVICE)
    return opened.file(relative)


def _anchor_side(bb) -> int | None:
    """The shorter side image anchors are stored at: what the backbone's preprocessing resizes
    to (None: keep them as they are)."""
    transform = getattr(bb, "transform", None) or getattr(getattr(bb, "base", None),
                                                          "transform", None)
    if transform is None:
        return None
    return int(getattr(transform, "resize", None) or transform.size)


#: Keys of a backbone's record (its ``config()``) that name where its weights came from.
_LOCATIONS = ("source", "tokenizer", "checkpoint_path")


def _portable(value):
    """A backbone record (or its config) with no path of this machine: the locations of
    weights and tokenizers as :func:`gdacil.backbones.base.portable_location` writes them.
    Records of models saved before are rewritten the same way when loaded."""
    from ..backbones.base import portable_location

    if isinstance(value, dict):
        return {k: portable_location(v) if k in _LOCATIONS and isinstance(v, str)
                else _portable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v) for v in value]
    return value


def _jsonable(value):
    """``value`` with anything JSON cannot hold written as its string."""
    return json.loads(json.dumps(value, default=str))

