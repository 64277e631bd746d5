"""Per-seed checkpoints: everything a run needs to continue after a task.

A checkpoint after task ``k`` is, in the seed's directory:

- ``stats_task<k>_<track>.safetensors``: the class statistics of every compensator track
  (:class:`~gdacil.ClassGaussians` or :class:`~gdacil.LowRankGaussians`, as configured);
- ``head_task<k>_<label>.safetensors``: every streaming head (its statistics of mapped
  features, solved weights and fitted scalars; :meth:`~gdacil.heads.MappedLinearHead.save`);
- ``backbone_task<k>.safetensors`` and ``strategy_task<k>.safetensors``: the adapted weights
  and the strategy's state (only when the strategy trains the backbone);
- ``state.json``: evaluations, timings and diagnostics so far, naming the files above.

Every file is written atomically and ``state.json`` last, so a run killed in between resumes from
the previous complete checkpoint. Other heads are not stored: they are rebuilt from the statistics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..heads import MappedLinearHead
from ..io import atomic_write_text, load_tensors, save_tensors
from ..stats import ClassStatistics
from .metrics import TaskEvaluation

__all__ = ["SeedState", "load_checkpoint", "save_checkpoint"]

_FORMAT = "gdacil.checkpoint/2"


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
    files = {"tracks": {}, "streaming": {}}
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
    atomic_write_text(directory / "state.json", json.dumps(payload))
    keep = {*files["tracks"].values(), *files["streaming"].values(), files.get("backbone"),
            files.get("strategy")}
    for old in directory.glob("*_task*.safetensors"):
        if old.name not in keep:
            old.unlink(missing_ok=True)


def load_checkpoint(directory: Path, fingerprint: str) -> SeedState | None:
    """The checkpoint in ``directory``, or ``None`` if there is none.

    Raises ``ValueError`` when it belongs to a different experiment configuration.
    """
    path = directory / "state.json"
    if not path.is_file():
        return None
    payload = json.loads(path.read_text())
    if payload.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a gdacil checkpoint of this version")
    if payload["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} was written by a different configuration; refusing to resume from it. "
            "Use another output_dir, or delete the directory to start over."
        )
    files = payload["files"]
    tracks = {label: ClassStatistics.load(directory / name) for label, name in files["tracks"].items()}
    backbone = load_tensors(directory / files["backbone"])[0] if "backbone" in files else None
    strategy = load_tensors(directory / files["strategy"]) if "strategy" in files else None
    streaming = {label: MappedLinearHead.load(directory / name)
                 for label, name in files.get("streaming", {}).items()}
    evaluations = {label: [_eval_from_json(e) for e in v]
                   for label, v in payload["evaluations"].items()}
    return SeedState(payload["completed"], tracks, evaluations, payload["timings"],
                     payload["diagnostics"], backbone, strategy, streaming)
