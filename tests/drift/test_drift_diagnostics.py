"""Drift diagnostics: the Gaussian 2-Wasserstein distance and the JSON report."""

import json

import numpy as np
import pytest
import scipy.linalg
import torch

from gdacil import ClassGaussians
from gdacil.drift import class_errors, drift_report, gaussian_w2

D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def random_psd(d, rank=None, seed=0):
    B = torch.randn(d, rank or d, generator=gen(seed), dtype=D)
    return B @ B.T


def w2_scipy(mu1, S1, mu2, S2):
    """Independent reference with scipy's matrix square root."""
    mu1, S1, mu2, S2 = (np.asarray(t) for t in (mu1, S1, mu2, S2))
    R = scipy.linalg.sqrtm(S1)
    cross = scipy.linalg.sqrtm(R @ S2 @ R)
    val = np.sum((mu1 - mu2) ** 2) + np.trace(S1 + S2 - 2 * np.real(cross))
    return float(np.sqrt(max(val, 0.0)))


@pytest.mark.parametrize("d,rank", [(1, None), (4, None), (7, None), (7, 3)])
def test_w2_matches_scipy(d, rank):
    mu1 = torch.randn(d, generator=gen(1), dtype=D)
    mu2 = torch.randn(d, generator=gen(2), dtype=D)
    S1, S2 = random_psd(d, seed=3), random_psd(d, rank, seed=4)
    got = float(gaussian_w2(mu1, S1, mu2, S2))
    assert got == pytest.approx(w2_scipy(mu1, S1, mu2, S2), rel=1e-7, abs=1e-9)
    # symmetric in its arguments
    assert float(gaussian_w2(mu2, S2, mu1, S1)) == pytest.approx(got, rel=1e-7, abs=1e-9)


def test_w2_closed_forms_and_batching():
    a = torch.tensor([1.0, 4.0, 9.0], dtype=D)
    b = torch.tensor([4.0, 1.0, 0.0], dtype=D)
    # commuting (diagonal) covariances: W2^2 = ||dmu||^2 + sum (sqrt a - sqrt b)^2
    expected = np.sqrt(3.0**2 + 1 + 1 + 9)
    got = gaussian_w2(torch.zeros(3, dtype=D), torch.diag(a), torch.tensor([3.0, 0, 0]),
                      torch.diag(b))
    assert float(got) == pytest.approx(expected, rel=1e-12)
    S = random_psd(5, seed=9)  # W2 = sqrt(round-off) for equal Gaussians
    assert float(gaussian_w2(torch.ones(5), S, torch.ones(5), S)) == pytest.approx(0, abs=1e-6)
    mus = torch.randn(3, 5, generator=gen(5), dtype=D)
    covs = torch.stack([random_psd(5, seed=s) for s in range(3)])
    batched = gaussian_w2(mus, covs, mus.flip(0), covs.flip(0))
    for i in range(3):
        assert float(batched[i]) == pytest.approx(
            float(gaussian_w2(mus[i], covs[i], mus[2 - i], covs[2 - i])), rel=1e-10, abs=1e-6)


def make_stats(shift=0.0, seed=0):
    g = gen(seed)
    X = torch.randn(200, 4, generator=g, dtype=D)
    y = torch.arange(200) % 4
    return ClassGaussians(4).update(X + shift, y)


def test_report_values_gains_and_json():
    old = make_stats()
    true = old.with_moments(old.classes, old.means + 2.0, 2.25 * old.covariances())
    half = old.with_moments(old.classes, old.means + 1.0, old.covariances())
    report = drift_report(half, true, before=old, per_class=True)
    json.dumps(report, allow_nan=False)
    assert report["n_classes"] == 4
    errors = class_errors(half, true)
    for key in ("mean_error", "mean_rel_error", "mean_cosine", "cov_error", "cov_rel_error", "w2"):
        assert report[key] == pytest.approx(float(errors[key].mean()))
        assert len(report["per_class"][key]) == 4
    assert report["per_class"]["labels"] == [0, 1, 2, 3]
    expected_mean = float((half.means - true.means).norm(dim=1).mean())
    assert report["mean_error"] == pytest.approx(expected_mean)
    expected_cov = float(torch.linalg.matrix_norm(half.covariances() - true.covariances()).mean())
    assert report["cov_error"] == pytest.approx(expected_cov)
    # the mean moved half-way; the covariance did not move at all
    assert report["gain"]["mean_error"] == pytest.approx(0.5, abs=1e-12)
    assert report["gain"]["cov_error"] == pytest.approx(0.0, abs=1e-12)
    assert 0 < report["gain"]["w2"] < 1
    assert "mean_cosine" not in report["gain"]
    # perfect compensation: gain 1; doing nothing: gain 0
    assert drift_report(true, true, before=old)["gain"]["w2"] == pytest.approx(1.0)
    assert drift_report(old, true, before=old)["gain"]["mean_error"] == 0.0
    # no drift at all: gains undefined, reported as None
    assert drift_report(old, old, before=old)["gain"]["mean_error"] is None


def test_report_label_subsets_and_errors():
    old, true = make_stats(), make_stats(shift=1.0)
    sub = drift_report(old, true, labels=[2, 0], w2=False, per_class=True)
    assert sub["n_classes"] == 2 and "w2" not in sub
    assert sub["per_class"]["labels"] == [2, 0]
    with pytest.raises(ValueError, match=r"missing from the estimate or the reference: \[7\]"):
        drift_report(old, true, labels=[0, 7])
    with pytest.raises(ValueError, match="dimensions differ"):
        drift_report(old, ClassGaussians(3).update(torch.randn(4, 3), [0, 0, 1, 1]))
    with pytest.raises(ValueError, match="no classes"):
        drift_report(ClassGaussians(4), true)
