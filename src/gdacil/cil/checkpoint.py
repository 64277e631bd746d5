"""Per-seed checkpoints: everything a run needs to continue after a task.

A checkpoint after task ``k`` is, in the seed's directory:

- ``stats_task<k>_<track>.safetensors``: the class statistics of every compensator track
  (:class:`~gdacil.ClassGaussians` or :class:`~gdacil.LowRankGaussians`, as configured);
- ``head_task<k>_<label>.safetensors``: every streaming head (its statistics of mapped
  features, solved weights and fitted scalars; :meth:`~gdacil.heads.MappedLinearHead.save`);
- ``backbone_task<k>.safetensors`` and ``strategy_task<k>.safetensors``: the adapted weights
  and the strategy's state (only when the strategy trains the backbone);
- ``state.json``: evaluations, timings and diagnostics so far, naming the files above, and the
  sha256 of its own content (``"sha256"``, over the canonical JSON of everything else).

Every file is written atomically and ``state.json`` last, so a run killed in between resumes from
the previous complete checkpoint. Other heads are not stored: they are rebuilt from the statistics.
Every file is checksummed (the tensor files by :func:`gdacil.io.save_tensors`), and
:func:`load_checkpoint` refuses a checkpoint whose files do not match their checksums, cannot be
parsed or are missing, with a :class:`~gdacil.io.CorruptFileError` naming the file and suggesting
``--overwrite``. A ``state.json`` without a checksum (written before they existed) is accepted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..heads import MappedLinearHead
from ..io import CorruptFileError, atomic_write_text, load_tensors, save_tensors
from ..stats import ClassStatistics
from .metrics import TaskEvaluation

__all__ = ["SeedState", "load_checkpoint", "save_checkpoint"]

_FORMAT = "gdacil.checkpoint/2"
_STATE_KEYS = {"format", "fingerprint", "completed", "files", "evaluations", "timings",
               "diagnostics"}
ADVICE = ("The checkpoint cannot be resumed: rerun with --overwrite to start this run over (or "
          "set another output_dir).")


@dataclass
class SeedState:
    """What a seed's run has done so far."""

    completed: int  # number of tasks done
    tracks: dict[str, ClassStatistics]  # compensator label -> statistics (dense or low-rank)
    evaluations: dict[str, list[TaskEvaluation]] = field(default_factory=dict)
    timings: list[dict] = field(default_factory=list)
    diagnostics: list[dict] = field(default_factory=list)
    backbone: dict[str, torch.Tensor] | None = None  # adapted weights, when the backbone trains
    strategy: tuple[dict[str, torch.Tensor], dict] | None = None
    streaming: dict[str, MappedLinearHead] = field(default_factory=dict)  # head label -> head


def _eval_to_json(e: TaskEvaluation) -> dict:
    return {"y_true": e.y_true.tolist(), "y_pred": e.y_pred.tolist(),
            "task_of_sample": e.task_of_sample.tolist()}


def _eval_from_json(e: dict) -> TaskEvaluation:
    return TaskEvaluation(np.asarray(e["y_true"]), np.asarray(e["y_pred"]),
                          np.asarray(e["task_of_sample"]))


def save_checkpoint(directory: Path, state: SeedState, fingerprint: str) -> None:
    """Write ``state`` (atomically, ``state.json`` last) and drop the previous checkpoint's files."""
    directory.mkdir(parents=True, exist_ok=True)
    k = state.completed
    files: dict[str, Any] = {"tracks": {}, "streaming": {}}
    for label, stats in state.tracks.items():
        name = f"stats_task{k}_{label}.safetensors"
        stats.save(directory / name)
        files["tracks"][label] = name
    for label, head in state.streaming.items():
        name = f"head_task{k}_{label}.safetensors"
        head.save(directory / name)
        files["streaming"][label] = name
    if state.backbone is not None:
        files["backbone"] = f"backbone_task{k}.safetensors"
        save_tensors(directory / files["backbone"], state.backbone, {"task": k})
    if state.strategy is not None:
        files["strategy"] = f"strategy_task{k}.safetensors"
        save_tensors(directory / files["strategy"], *state.strategy)
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
    """sha256 of ``payload`` without its ``"sha256"``: JSON with sorted keys and no whitespace
    (NaN allowed: timings and diagnostics may hold it), so it survives a load and a dump."""
    body = {k: v for k, v in payload.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _read_state(path: Path) -> dict:
    """``state.json``, verified against its checksum; :class:`CorruptFileError` if it does not
    parse or match."""
    try:
        payload = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError: truncated or damaged
        raise CorruptFileError(path, f"not valid JSON ({exc})", ADVICE) from None
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
    if payload.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a gdacil checkpoint of this version")
    if payload["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} was written by a different configuration; refusing to resume from it. "
            "Use another output_dir, or delete the directory to start over."
        )
    files = payload["files"]
    tracks = {label: _load_file(directory / name, ClassStatistics.load)
              for label, name in files["tracks"].items()}
    backbone = (_load_file(directory / files["backbone"], load_tensors)[0]
                if "backbone" in files else None)
    strategy = _load_file(directory / files["strategy"], load_tensors) if "strategy" in files else None
    streaming = {label: _load_file(directory / name, MappedLinearHead.load)
                 for label, name in files.get("streaming", {}).items()}
    evaluations = {label: [_eval_from_json(e) for e in v]
                   for label, v in payload["evaluations"].items()}
    return SeedState(payload["completed"], tracks, evaluations, payload["timings"],
                     payload["diagnostics"], backbone, strategy, streaming)
