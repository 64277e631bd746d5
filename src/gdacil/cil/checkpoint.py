"""Per-seed checkpoints: everything a run needs to continue after a task.

A checkpoint after task ``k`` is the state of the seed's :class:`~gdacil.cil.IncrementalModel`
(:meth:`~gdacil.cil.IncrementalModel.state_parts`, without the track heads, which are rebuilt
from the statistics), one file per part in the seed's directory, each written by
:func:`gdacil.state.save_state`:

- ``stats_task<k>_<track>.safetensors``: the class statistics of every compensator track
  (:class:`~gdacil.ClassGaussians` or :class:`~gdacil.LowRankGaussians`, as configured);
- ``head_task<k>_<label>.safetensors``: every streaming head (its statistics of mapped
  features, solved weights and fitted scalars);
- ``backbone_task<k>.safetensors`` and ``strategy_task<k>.safetensors``: the adapted weights
  and the strategy's state (only when the strategy trains the backbone);
- ``state.json``: evaluations, timings and diagnostics so far, naming the files above, and the
  sha256 of its own content (``"sha256"``, over the canonical JSON of everything else).

Every file is written atomically and ``state.json`` last, so a run killed in between resumes from
the previous complete checkpoint. Every file is checksummed, and :func:`load_checkpoint` refuses
a checkpoint whose files do not match their checksums, cannot be parsed or are missing, with a
:class:`~gdacil.io.CorruptFileError` naming the file and suggesting ``--overwrite``. A
``state.json`` without a checksum (written before they existed) is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..hashing import sha256_json
from ..heads import MappedLinearHead
from ..io import CorruptFileError, atomic_write_text, entries_of, read_json
from ..state import State, load_state, save_state
from ..stats import ClassStatistics
from .metrics import TaskEvaluation

__all__ = ["SeedState", "load_checkpoint", "save_checkpoint"]

_FORMAT = "gdacil.checkpoint/2"
_STATE_KEYS = {"format", "fingerprint", "completed", "files", "evaluations", "timings",
               "diagnostics"}
ADVICE = ("The checkpoint cannot be resumed: rerun with --overwrite to start this run over (or "
          "set another output_dir).")


#: the file of each kind of part of a model's state, after task ``k``
_FILES = {"tracks": "stats_task{k}_{label}.safetensors",
          "streaming": "head_task{k}_{label}.safetensors",
          "backbone": "backbone_task{k}.safetensors", "strategy": "strategy_task{k}.safetensors"}


@dataclass
class SeedState:
    """What a seed's run has done so far."""

    completed: int  # number of tasks done
    #: the model's state (:meth:`IncrementalModel.state_parts` without the track heads)
    parts: dict[str, State] = field(default_factory=dict)
    evaluations: dict[str, list[TaskEvaluation]] = field(default_factory=dict)
    timings: list[dict] = field(default_factory=list)
    diagnostics: list[dict] = field(default_factory=list)

    @property
    def tracks(self) -> dict[str, ClassStatistics]:
        """The statistics of every compensator track, by label."""
        return {name.partition("/")[2]: ClassStatistics.from_state(state, source=name)
                for name, state in self.parts.items() if name.startswith("tracks/")}

    @property
    def backbone(self) -> dict[str, torch.Tensor] | None:
        """The adapted backbone weights (None when the strategy does not train it)."""
        return self.parts["backbone"][0] if "backbone" in self.parts else None

    @property
    def strategy(self) -> State | None:
        """The strategy's state between tasks (None when it does not train the backbone)."""
        return self.parts.get("strategy")

    @property
    def streaming(self) -> dict[str, MappedLinearHead]:
        """The streaming heads, by label."""
        return {name.partition("/")[2]: MappedLinearHead.from_state(state, source=name)
                for name, state in self.parts.items() if name.startswith("streaming/")}


def _eval_to_json(e: TaskEvaluation) -> dict:
    return {"y_true": e.y_true.tolist(), "y_pred": e.y_pred.tolist(),
            "task_of_sample": e.task_of_sample.tolist()}


def _eval_from_json(e: dict) -> TaskEvaluation:
    arrays = [np.asarray(e[key]) for key in ("y_true", "y_pred", "task_of_sample")]
    if any(a.ndim != 1 or a.dtype.kind not in "iu" or len(a) != len(arrays[0]) for a in arrays):
        raise TypeError("an evaluation needs y_true, y_pred and task_of_sample: integer lists "
                        "of one length")
    return TaskEvaluation(*arrays)


def save_checkpoint(directory: Path, state: SeedState, fingerprint: str) -> None:
    """Write ``state`` (atomically, ``state.json`` last) and drop the previous checkpoint's files."""
    directory.mkdir(parents=True, exist_ok=True)
    k = state.completed
    files: dict[str, Any] = {"tracks": {}, "streaming": {}}
    for name, part in state.parts.items():
        kind, _, label = name.partition("/")
        file = _FILES[kind].format(k=k, label=label)
        save_state(directory / file, part)
        if label:
            files[kind][label] = file
        else:
            files[kind] = file
    payload = {
        "format": _FORMAT,
        "fingerprint": fingerprint,
        "completed": k,
        "files": files,
        "evaluations": {label: [_eval_to_json(e) for e in v] for label, v in state.evaluations.items()},
        "timings": state.timings,
        "diagnostics": state.diagnostics,
    }
    payload = json.loads(json.dumps(payload))  # as load_checkpoint will see it (str keys, lists)
    payload["sha256"] = _state_checksum(payload)
    atomic_write_text(directory / "state.json", json.dumps(payload))
    keep = {*files["tracks"].values(), *files["streaming"].values(), files.get("backbone"),
            files.get("strategy")}
    for old in directory.glob("*_task*.safetensors"):
        if old.name not in keep:
            old.unlink(missing_ok=True)


def _state_checksum(payload: dict) -> str:
    """sha256 of ``payload`` without its ``"sha256"`` (canonical JSON, NaN allowed: timings
    and diagnostics may hold it), so it survives a load and a dump."""
    return sha256_json({k: v for k, v in payload.items() if k != "sha256"}, allow_nan=True)


def _read_state(path: Path) -> dict:
    """``state.json``, verified against its checksum; :class:`CorruptFileError` if it does not
    parse or match."""
    payload = read_json(path, ADVICE, allow_nan=True)  # timings may hold NaN
    if not isinstance(payload, dict):
        raise CorruptFileError(path, "not a JSON object", ADVICE)
    if "sha256" in payload:
        if payload["sha256"] != _state_checksum(payload):
            raise CorruptFileError(path, "content does not match its sha256 checksum; the file "
                                         "was edited or damaged since gdacil wrote it", ADVICE)
    elif set(payload) - _STATE_KEYS:  # a damaged "sha256" key, not a file of an older gdacil
        raise CorruptFileError(path, f"unexpected keys {sorted(set(payload) - _STATE_KEYS)}",
                               ADVICE)
    return payload


def _load_file(path: Path, load: Callable):
    """``load(path)`` for a file a checkpoint names; a missing, corrupt or invalid file raises
    :class:`CorruptFileError` with :data:`ADVICE`."""
    try:
        return load(path)
    except CorruptFileError as exc:
        raise CorruptFileError(exc.path, exc.problem, ADVICE) from None
    except FileNotFoundError:
        raise CorruptFileError(path, "missing, though state.json names it", ADVICE) from None
    except ValueError as exc:
        raise CorruptFileError(path, f"not a valid checkpoint file ({exc})", ADVICE) from None


def load_checkpoint(directory: Path, fingerprint: str) -> SeedState | None:
    """The checkpoint in ``directory``, or ``None`` if there is none.

    Raises ``ValueError`` when it belongs to a different experiment configuration, and
    :class:`~gdacil.io.CorruptFileError` (a ``ValueError``) naming the file when ``state.json`` or
    a file it names is missing, damaged or does not match its checksum.
    """
    path = directory / "state.json"
    if not path.is_file():
        return None
    payload = _read_state(path)
    with entries_of(path, ADVICE):  # edited, with its checksum recomputed
        return _seed_state(directory, path, payload, fingerprint)


def _seed_state(directory: Path, path: Path, payload: dict, fingerprint: str) -> SeedState:
    if payload.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a gdacil checkpoint of this version")
    if payload["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} was written by a different configuration; refusing to resume from it. "
            "Use another output_dir, or delete the directory to start over."
        )
    files, completed, timings = payload["files"], payload["completed"], payload["timings"]
    if isinstance(completed, bool) or not isinstance(completed, int) or completed < 1 \
            or not isinstance(timings, list) or len(timings) != completed \
            or any(len(v) != completed for v in payload["evaluations"].values()):
        raise CorruptFileError(path, f"completed ({completed!r}) must be a count of tasks "
                                     "that its timings and every head's evaluations have",
                               ADVICE)
    if not all(isinstance(t, dict) for t in timings + payload["diagnostics"]):
        raise CorruptFileError(path, "timings and diagnostics must be lists of mappings", ADVICE)
    names = [*files["tracks"].values(), *files.get("streaming", {}).values(),
             *(files[kind] for kind in ("backbone", "strategy") if kind in files)]
    if not all(isinstance(n, str) and Path(n).name == n for n in names):
        raise CorruptFileError(path, "names a file that is not in its own folder", ADVICE)
    parts = {f"tracks/{label}": _load_file(directory / name, _checked(ClassStatistics))
             for label, name in files["tracks"].items()}
    parts.update({f"streaming/{label}": _load_file(directory / name, _checked(MappedLinearHead))
                  for label, name in files.get("streaming", {}).items()})
    parts.update({kind: _load_file(directory / files[kind], load_state)
                  for kind in ("backbone", "strategy") if kind in files})
    evaluations = {label: [_eval_from_json(e) for e in v]
                   for label, v in payload["evaluations"].items()}
    return SeedState(completed, parts, evaluations, timings, payload["diagnostics"])


def _checked(kind) -> Callable[[Path], State]:
    """Reads a state file and checks that it rebuilds a ``kind`` (``ValueError`` otherwise)."""
    def read(path: Path) -> State:
        state = load_state(path)
        kind.from_state(state, source=str(path))
        return state

    return read
