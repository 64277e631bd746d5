"""How far compensated statistics are from the truth: per-class errors and the gain over Identity.

For every class the reference is the oracle (statistics of the true new features). Errors:

- ``mean_error``: ``||mu_hat - mu||``; ``mean_rel_error``: divided by ``||mu||``;
  ``mean_cosine``: cosine similarity of ``mu_hat`` and ``mu``;
- ``cov_error``: ``||Sigma_hat - Sigma||_F``; ``cov_rel_error``: divided by ``||Sigma||_F``;
- ``w2``: the 2-Wasserstein distance between the Gaussians,
  ``W2^2 = ||mu1 - mu2||^2 + tr(S1 + S2 - 2 (S1^{1/2} S2 S1^{1/2})^{1/2})``.

:func:`drift_report` averages them over classes and, given the uncompensated statistics, reports
the same for Identity and the compensation gain ``1 - error / identity_error`` per metric (1: the
compensator removes all the drift error; 0: no better than doing nothing; negative: worse).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..stats import ClassGaussians, ClassStatistics
from ..stats.linalg import symmetrize

__all__ = ["class_errors", "drift_report", "gaussian_w2"]

_ERRORS = ("mean_error", "mean_rel_error", "cov_error", "cov_rel_error", "w2")


def _psd_sqrt(S: torch.Tensor) -> torch.Tensor:
    s, V = torch.linalg.eigh(symmetrize(S))
    return (V * s.clamp_min(0.0).sqrt()[..., None, :]) @ V.transpose(-1, -2)


def gaussian_w2(mu1, cov1, mu2, cov2) -> torch.Tensor:
    """2-Wasserstein distance between ``N(mu1, cov1)`` and ``N(mu2, cov2)``, batched.

    Shapes ``(..., d)`` and ``(..., d, d)``; returns ``(...)`` in float64. Uses one eigen-
    decomposition of ``cov1`` and the eigenvalues of ``cov1^{1/2} cov2 cov1^{1/2}`` (negative
    round-off eigenvalues are clamped at 0), so ``cov1`` and ``cov2`` may be singular.
    """
    mu1, mu2 = torch.as_tensor(mu1, dtype=torch.float64), torch.as_tensor(mu2, dtype=torch.float64)
    S1, S2 = torch.as_tensor(cov1, dtype=torch.float64), torch.as_tensor(cov2, dtype=torch.float64)
    R = _psd_sqrt(S1)
    cross = torch.linalg.eigvalsh(symmetrize(R @ S2 @ R)).clamp_min(0.0).sqrt().sum(-1)
    trace = S1.diagonal(dim1=-2, dim2=-1).sum(-1) + S2.diagonal(dim1=-2, dim2=-1).sum(-1)
    w2_sq = (mu1 - mu2).pow(2).sum(-1) + (trace - 2.0 * cross).clamp_min(0.0)
    return w2_sq.sqrt()


def class_errors(estimate: ClassGaussians, reference: ClassGaussians,
                 labels: Sequence[int] | None = None, *, w2: bool = True,
                 batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Per-class errors of ``estimate`` against ``reference`` (tensors of shape ``(k,)``).

    ``labels`` defaults to every class of ``estimate``; all must exist in both. ``w2=False``
    skips the 2-Wasserstein distance (two ``d x d`` eigenproblems per class).
    """
    labels = _labels(estimate, reference, labels)
    out: dict[str, list[torch.Tensor]] = {}
    ref_batches = reference.iter_batches(batch_size, labels)
    for (_, _, mu_e, cov_e), (_, _, mu_r, cov_r) in zip(
        estimate.iter_batches(batch_size, labels), ref_batches
    ):
        mu_e, cov_e = mu_e.to(mu_r.device), cov_e.to(mu_r.device)
        mean_err = (mu_e - mu_r).norm(dim=1)
        cov_err = torch.linalg.matrix_norm(cov_e - cov_r)
        parts = {
            "mean_error": mean_err,
            "mean_rel_error": mean_err / mu_r.norm(dim=1).clamp_min(1e-300),
            "mean_cosine": torch.nn.functional.cosine_similarity(mu_e, mu_r, dim=1),
            "cov_error": cov_err,
            "cov_rel_error": cov_err / torch.linalg.matrix_norm(cov_r).clamp_min(1e-300),
        }
        if w2:
            parts["w2"] = gaussian_w2(mu_e, cov_e, mu_r, cov_r)
        for key, value in parts.items():
            out.setdefault(key, []).append(value.cpu())
    return {key: torch.cat(values) for key, values in out.items()}


def _labels(estimate, reference, labels) -> list[int]:
    for name, stats in (("estimate", estimate), ("reference", reference)):
        if not isinstance(stats, ClassStatistics):
            raise TypeError(f"{name} must be ClassGaussians or LowRankGaussians; "
                            f"got {type(stats).__name__}")
    if estimate.dim != reference.dim:
        raise ValueError(f"dimensions differ: {estimate.dim} and {reference.dim}")
    labels = estimate.classes if labels is None else [int(c) for c in labels]
    if not labels:
        raise ValueError("no classes to compare")
    missing = [c for c in labels if c not in estimate or c not in reference]
    if missing:
        raise ValueError(f"classes missing from the estimate or the reference: {missing[:20]}")
    return labels


def _mean(values: torch.Tensor) -> float:
    return float(values.mean())


def drift_report(
    compensated: ClassGaussians,
    oracle: ClassGaussians,
    *,
    before: ClassGaussians | None = None,
    labels: Sequence[int] | None = None,
    per_class: bool = False,
    w2: bool = True,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Class-averaged errors of compensated statistics against the oracle, as a plain dict.

    Parameters
    ----------
    compensated : ClassGaussians
        Output of a compensator.
    oracle : ClassGaussians
        Statistics of the true new features of the same classes.
    before : ClassGaussians, optional
        The uncompensated statistics (what Identity returns). Adds ``"identity"`` (its errors)
        and ``"gain"`` (``1 - error / identity_error`` per error metric; ``None`` where Identity's
        error is 0).
    labels : sequence of int, optional
        Classes to evaluate (default: all classes of ``compensated``).
    per_class : bool, default False
        Add ``"per_class"``: the labels and every per-class value as lists.

    Returns
    -------
    dict
        JSON-serialisable (str keys; ints, floats, None and lists as values).

    Examples
    --------
    >>> import json, torch
    >>> from gdacil import ClassGaussians
    >>> from gdacil.drift import drift_report
    >>> g = torch.Generator().manual_seed(0)
    >>> X, y = torch.randn(90, 3, generator=g), torch.arange(90) % 3
    >>> old = ClassGaussians(3).update(X, y)
    >>> true = ClassGaussians(3).update(X + 1, y)
    >>> half = old.with_moments(old.classes, old.means + 0.5, old.covariances())
    >>> report = drift_report(half, true, before=old)
    >>> round(report["gain"]["mean_error"], 6), report["n_classes"]
    (0.5, 3)
    >>> _ = json.dumps(report, allow_nan=False)
    """
    errors = class_errors(compensated, oracle, labels, w2=w2, batch_size=batch_size)
    labels = _labels(compensated, oracle, labels)
    report: dict[str, Any] = {"n_classes": len(labels)}
    report.update({key: _mean(v) for key, v in errors.items()})
    if before is not None:
        base = class_errors(before, oracle, labels, w2=w2, batch_size=batch_size)
        report["identity"] = {key: _mean(v) for key, v in base.items()}
        identity = report["identity"]
        report["gain"] = {
            key: None if identity[key] == 0 else 1.0 - report[key] / identity[key]
            for key in _ERRORS if key in errors
        }
    if per_class:
        report["per_class"] = {"labels": labels, **{k: v.tolist() for k, v in errors.items()}}
    return report
