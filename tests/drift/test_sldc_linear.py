"""alpha1-SLDC's ridge toward the identity: unchanged with many anchors, no collapse with fewer
anchors than dimensions (the RandProj case), invariant to the features' scale."""

import math

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.drift import Identity, LinearSLDC, drift_report

D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def features(n, d, *, seed, rank=None):
    """Positive-mean features with a decaying spectrum; ``rank`` leading directions carry most of
    the variance (as after a random ReLU projection, whose anchors span few directions well)."""
    g = gen(seed)
    scales = torch.logspace(0, -2, d, dtype=D) if rank is None else torch.cat(
        [torch.ones(rank, dtype=D), torch.full((d - rank,), 0.05, dtype=D)])
    return 1.0 + torch.randn(n, d, generator=g, dtype=D) * scales


def class_samples(d, *, seed, rank=None, n_classes=4, per_class=200):
    X = torch.cat([features(per_class, d, seed=seed + c, rank=rank)
                   + 0.3 * torch.randn(d, generator=gen(100 + c), dtype=D)
                   for c in range(n_classes)])
    return X, torch.arange(n_classes).repeat_interleave(per_class)


def small_rotation(d, angle, seed):
    A = torch.randn(d, d, generator=gen(seed), dtype=D)
    return torch.linalg.matrix_exp(angle * (A - A.T) / math.sqrt(2 * d))


def null_space(X):
    """Orthonormal rows spanning the directions orthogonal to every row of ``X``."""
    _, s, Vh = torch.linalg.svd(X)
    return Vh[(s > 1e-10 * s[0]).sum():]


def test_many_anchors_change_little_and_exactly_by_the_closed_form():
    d, n = 8, 4000
    old = features(n, d, seed=0, rank=d)          # every direction well spanned
    new = old @ small_rotation(d, 0.3, seed=1) + 0.2 * torch.tanh(old)
    ours = LinearSLDC().fit(old, new)
    ref = LinearSLDC.from_preset("paper").fit(old, new)
    # the two ridges differ by exactly (1 - w) gamma s (X^T X + gamma s I)^-1 (numpy reference)
    X = (old / old.norm(dim=1, keepdim=True)).numpy()
    w = math.exp(-n / d)
    delta = torch.from_numpy((1 - w) * 0.1 * np.linalg.inv(X.T @ X + 0.1 * np.eye(d)))
    torch.testing.assert_close(ours.W_ - ref.W_, delta, rtol=1e-6, atol=1e-12)
    assert 1e-5 < delta.abs().max() < 1e-3
    # ... which moves the compensated statistics by under 1e-3 relative
    X, y = class_samples(d, seed=2, rank=d)
    stats = ClassGaussians(d).update(X, y)
    a, b = ours.transform(stats), ref.transform(stats)
    assert ((a.means - b.means).norm() / b.means.norm()).item() < 1e-3
    assert ((a.covariances() - b.covariances()).norm() / b.covariances().norm()).item() < 2e-3


@pytest.mark.parametrize("normalize", [True, False])
def test_fewer_anchors_than_dimensions_matches_a_dense_reference(normalize):
    d, n = 30, 12
    old = features(n, d, seed=3)
    new = old @ small_rotation(d, 0.2, seed=4)
    sldc = LinearSLDC(normalize=normalize).fit(old, new)
    X, Y = old.numpy(), new.numpy()
    if normalize:
        X = X / np.linalg.norm(X, axis=1, keepdims=True)
        Y = Y / np.linalg.norm(Y, axis=1, keepdims=True)
    ridge = 0.1 * (X**2).sum() / n
    # argmin ||X W - Y||^2 + ridge ||W - I||^2 as least squares on an augmented system
    Xa = np.vstack([X, math.sqrt(ridge) * np.eye(d)])
    Ya = np.vstack([Y, math.sqrt(ridge) * np.eye(d)])
    W = np.linalg.lstsq(Xa, Ya, rcond=None)[0]
    w = math.exp(-n / d)
    torch.testing.assert_close(sldc.W_, torch.from_numpy((1 - w) * W + w * np.eye(d)),
                               rtol=1e-9, atol=1e-11)
    assert sldc.ridge_ == pytest.approx(ridge, rel=1e-12)
    # the identity on every direction the anchors do not span; the reference ridge sends those
    # directions to w times themselves
    V = null_space(torch.from_numpy(X))
    assert V.shape[0] == d - n
    torch.testing.assert_close(V @ sldc.W_, V, rtol=0, atol=1e-12)
    paper = LinearSLDC.from_preset("paper", normalize=normalize).fit(old, new)
    torch.testing.assert_close(V @ paper.W_, paper.shrinkage_ * V, rtol=0, atol=1e-12)


def test_fewer_anchors_than_dimensions_no_drift_leaves_statistics_unchanged():
    # RandProj: the backbone is frozen after the first task, so anchors do not move, yet the
    # reference ridge shrinks every direction the N < d anchors do not span, task after task
    d, n = 64, 40
    anchors = features(n, d, seed=5, rank=8)
    X, y = class_samples(d, seed=6, rank=8)
    stats = ClassGaussians(d).update(X, y)
    ours, paper = stats, stats
    for _ in range(9):
        ours = LinearSLDC().fit(anchors, anchors).transform(ours)
        paper = LinearSLDC.from_preset("paper").fit(anchors, anchors).transform(paper)
    torch.testing.assert_close(ours.means, stats.means, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(ours.covariances(), stats.covariances(), rtol=1e-12, atol=1e-13)
    lost = 1 - (paper.covariances().norm() / stats.covariances().norm()).item()
    assert lost > 0.3      # the collapse this preset fixes (about 0.6 here)


def test_fewer_anchors_than_dimensions_beats_no_compensation_on_a_small_rotation():
    d, n = 64, 40
    Q = small_rotation(d, 0.3, seed=7)
    anchors = features(n, d, seed=8, rank=8)
    X, y = class_samples(d, seed=9, rank=8)
    stats = ClassGaussians(d).update(X, y)
    truth = ClassGaussians(d).update(X @ Q, y)   # the same samples under the new backbone
    errors = {name: drift_report(comp.fit(anchors, anchors @ Q).transform(stats), truth)
              for name, comp in (("none", Identity()), ("ours", LinearSLDC()),
                                 ("paper", LinearSLDC.from_preset("paper")))}
    ours, none, paper = errors["ours"], errors["none"], errors["paper"]
    # measured: mean error 1.28 / 2.13 / 1.56, covariance 0.74 / 1.17 / 0.87 (ours/none/paper)
    assert ours["mean_error"] < 0.7 * none["mean_error"], errors
    assert ours["cov_error"] < 0.75 * none["cov_error"], errors
    assert ours["mean_error"] < 0.9 * paper["mean_error"], errors
    assert ours["cov_error"] < 0.9 * paper["cov_error"], errors


@pytest.mark.parametrize("preset", ["recommended", "paper"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_rescaled_features_give_rescaled_statistics(preset, normalize, scale):
    d, n = 32, 20                      # fewer anchors than dimensions: the ridge matters
    old = features(n, d, seed=10)
    new = old @ small_rotation(d, 0.2, seed=11) + 0.1 * torch.tanh(old)
    X, y = class_samples(d, seed=12)

    def compensated(c):
        comp = LinearSLDC.from_preset(preset, normalize=normalize).fit(c * old, c * new)
        return comp.transform(ClassGaussians(d).update(c * X, y))

    base, scaled = compensated(1.0), compensated(scale)
    torch.testing.assert_close(scaled.means / scale, base.means, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(scaled.covariances() / scale**2, base.covariances(),
                               rtol=1e-9, atol=1e-12)
