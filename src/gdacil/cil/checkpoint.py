"""Per-seed checkpoints: the class statistics after a task plus every evaluation so far.

A checkpoint is two files in the seed's directory: ``stats_task<k>.safetensors`` and
``state.json``, written in that order, each atomically. ``state.json`` names the statistics file it
belongs to, so a run killed between the two writes resumes from the previous, complete
checkpoint. Heads are not stored: they are rebuilt from the statistics, deterministically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..io import atomic_write_text
from ..stats import ClassGaussians
from .metrics import TaskEvaluation

__all__ = ["SeedState", "save_checkpoint", "load_checkpoint"]

_FORMAT = "gdacil.checkpoint/1"


@dataclass
class SeedState:
    """What a seed's run has done: tasks completed, statistics, evaluations per head."""

    completed: int  # number of tasks done
    stats: ClassGaussians
    evaluations: dict[str, list[TaskEvaluation]] = field(default_factory=dict)
    timings: list[dict] = field(default_factory=list)


def _eval_to_json(e: TaskEvaluation) -> dict:
    return {"y_true": e.y_true.tolist(), "y_pred": e.y_pred.tolist(),
            "task_of_sample": e.task_of_sample.tolist()}


def save_checkpoint(directory: Path, state: SeedState, fingerprint: str) -> None:
    """Write ``state`` (atomically) and drop older statistics files."""
    directory.mkdir(parents=True, exist_ok=True)
    stats_name = f"stats_task{state.completed}.safetensors"
    state.stats.save(directory / stats_name)
    payload = {
        "format": _FORMAT,
        "fingerprint": fingerprint,
        "completed": state.completed,
        "stats_file": stats_name,
        "evaluations": {k: [_eval_to_json(e) for e in v] for k, v in state.evaluations.items()},
        "timings": state.timings,
    }
    atomic_write_text(directory / "state.json", json.dumps(payload))
    for old in directory.glob("stats_task*.safetensors"):
        if old.name != stats_name:
            old.unlink(missing_ok=True)


def load_checkpoint(directory: Path, fingerprint: str) -> SeedState | None:
    """The checkpoint in ``directory``, or ``None`` if there is none.

    Raises ``ValueError`` when the checkpoint belongs to a different experiment configuration.
    """
    path = directory / "state.json"
    if not path.is_file():
        return None
    payload = json.loads(path.read_text())
    if payload.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a gdacil checkpoint")
    if payload["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} was written by a different configuration; refusing to resume from it. "
            "Use another output_dir, or delete the directory to start over."
        )
    evaluations = {
        k: [TaskEvaluation(np.asarray(e["y_true"]), np.asarray(e["y_pred"]),
                           np.asarray(e["task_of_sample"])) for e in v]
        for k, v in payload["evaluations"].items()
    }
    stats = ClassGaussians.load(directory / payload["stats_file"])
    return SeedState(payload["completed"], stats, evaluations, payload["timings"])
