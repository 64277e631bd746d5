"""Class-incremental metrics from per-task predictions.

After task ``t`` (of ``T``) a head is evaluated on the test samples of every class seen so far.
From those predictions:

- ``accuracy_matrix[t, j]``: accuracy on the test samples of task ``j``'s classes (``j <= t``;
  NaN above the diagonal).
- ``pooled[t]``: accuracy on all test samples seen so far (sample-weighted), the quantity the
  paper averages. **Last-Acc** is ``pooled[T-1]``; **Inc-Acc** is the mean of ``pooled`` over all
  tasks, task 1 included.
- ``class_balanced[t]``: mean over seen classes of per-class accuracy (the cross-domain tables'
  "class-wise average accuracy").
- **forgetting**: mean over tasks ``j < T-1`` of ``max_{t < T-1} acc[t, j] - acc[T-1, j]``
  (Chaudhry et al. 2018).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["IncrementalMetrics", "TaskEvaluation", "summarize_seeds", "t_quantile_975"]


@dataclass
class TaskEvaluation:
    """Predictions of one head after one task, on the test samples of all seen classes."""

    y_true: np.ndarray
    y_pred: np.ndarray
    task_of_sample: np.ndarray  # index of the task that introduced each sample's class

    def __post_init__(self):
        self.y_true = np.asarray(self.y_true)
        self.y_pred = np.asarray(self.y_pred)
        self.task_of_sample = np.asarray(self.task_of_sample)
        n = len(self.y_true)
        if n == 0:
            raise ValueError("TaskEvaluation: no test samples")
        if len(self.y_pred) != n or len(self.task_of_sample) != n:
            raise ValueError("TaskEvaluation: y_true, y_pred and task_of_sample differ in length")

    @property
    def pooled(self) -> float:
        return float(np.mean(self.y_true == self.y_pred))

    @property
    def class_balanced(self) -> float:
        correct = self.y_true == self.y_pred
        return float(np.mean([correct[self.y_true == c].mean() for c in np.unique(self.y_true)]))

    def per_task(self, n_tasks: int) -> np.ndarray:
        out = np.full(n_tasks, np.nan)
        correct = self.y_true == self.y_pred
        for j in np.unique(self.task_of_sample):
            out[j] = correct[self.task_of_sample == j].mean()
        return out


@dataclass
class IncrementalMetrics:
    """Accumulates :class:`TaskEvaluation` s of one head over a run and derives the metrics."""

    n_tasks: int
    evaluations: list[TaskEvaluation] = field(default_factory=list)

    def add(self, evaluation: TaskEvaluation) -> None:
        if len(self.evaluations) >= self.n_tasks:
            raise ValueError(f"already evaluated {self.n_tasks} tasks")
        self.evaluations.append(evaluation)

    @property
    def accuracy_matrix(self) -> np.ndarray:
        rows = [e.per_task(self.n_tasks) for e in self.evaluations]
        return np.array(rows).reshape(len(rows), self.n_tasks)

    @property
    def pooled(self) -> list[float]:
        return [e.pooled for e in self.evaluations]

    @property
    def class_balanced(self) -> list[float]:
        return [e.class_balanced for e in self.evaluations]

    @property
    def last_acc(self) -> float:
        return self.pooled[-1]

    @property
    def inc_acc(self) -> float:
        return float(np.mean(self.pooled))

    @property
    def forgetting(self) -> float:
        A = self.accuracy_matrix
        last = len(A) - 1
        if last < 1:
            return 0.0
        drops = [np.nanmax(A[:last, j]) - A[last, j] for j in range(last)]
        return float(np.mean(drops))

    def to_dict(self) -> dict:
        """JSON-ready summary (NaN above the diagonal becomes ``None``)."""
        matrix = [[None if math.isnan(v) else float(v) for v in row] for row in self.accuracy_matrix]
        return {
            "last_acc": self.last_acc,
            "inc_acc": self.inc_acc,
            "forgetting": self.forgetting,
            "final_class_balanced_acc": self.class_balanced[-1],
            "pooled_acc_per_task": self.pooled,
            "class_balanced_acc_per_task": self.class_balanced,
            "accuracy_matrix": matrix,
        }


# two-sided 95% Student t quantiles for 1..30 degrees of freedom
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t_quantile_975(dof: int) -> float:
    if dof < 1:
        raise ValueError("need at least one degree of freedom")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def summarize_seeds(values) -> dict:
    """Mean, sample standard deviation and 95% t-interval half-width over seeds.

    With one seed the spread is unknown and reported as ``None``.
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("summarize_seeds: no values")
    if v.size == 1:
        return {"mean": float(v[0]), "std": None, "ci95": None, "n": 1}
    std = float(v.std(ddof=1))
    return {"mean": float(v.mean()), "std": std,
            "ci95": t_quantile_975(v.size - 1) * std / math.sqrt(v.size), "n": int(v.size)}
