"""Identity, SDC, SLDC (linear, weak-nonlinear), Oracle, the shared resampler, the registry."""

import json
import math

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.drift import (
    COMPENSATORS,
    SDC,
    HopDC,
    Identity,
    LinearSLDC,
    NotFittedError,
    Oracle,
    WeakNonlinearSLDC,
    build_compensator,
    drift_report,
)
from gdacil.drift.pseudo import resample_moments, standard_noise

D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def stats_and_samples(d=5, n_classes=3, n=120, seed=0, offset=2.0):
    g = gen(seed)
    X = torch.randn(n * n_classes, d, generator=g, dtype=D) @ torch.randn(d, d, generator=g,
                                                                         dtype=D) + offset
    y = torch.arange(n * n_classes) % n_classes
    return ClassGaussians(d).update(X, y), X, y


def random_anchors(n=400, d=5, seed=1, offset=2.0):
    return torch.randn(n, d, generator=gen(seed), dtype=D) + offset


# ------------------------------------------------------------------------ shared resampler


def test_standard_noise_matched_moments_are_exact():
    E = standard_noise(40, 6, gen(0), match_moments=True)
    torch.testing.assert_close(E.mean(0), torch.zeros(6, dtype=D), rtol=0, atol=1e-14)
    torch.testing.assert_close(E.T @ E / 40, torch.eye(6, dtype=D), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="match_moments"):
        standard_noise(6, 6, gen(0), match_moments=True)


@pytest.mark.parametrize("shared", [True, False])
def test_resampler_reproduces_an_affine_push_exactly(shared):
    stats, _, _ = stats_and_samples()
    A = torch.randn(5, 5, generator=gen(3), dtype=D)
    b = torch.randn(5, generator=gen(4), dtype=D)
    out = resample_moments(stats, stats.classes, lambda Z: Z @ A + b, n_samples=30,
                           generator=gen(0), shared_noise=shared, match_moments=True,
                           class_batch=2)
    torch.testing.assert_close(out.means, stats.means @ A + b, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.covariances(), A.T @ stats.covariances() @ A,
                               rtol=1e-9, atol=1e-9)


def test_resampler_without_matching_has_sampling_error_of_the_right_size():
    stats, _, _ = stats_and_samples(d=4)
    M = 4000
    out = resample_moments(stats, stats.classes, lambda Z: Z, n_samples=M, generator=gen(1))
    # mean error ~ sqrt(tr(Sigma) / M); 5 standard errors
    tol = 5 * (stats.covariances().diagonal(dim1=1, dim2=2).sum(1) / M).sqrt()
    assert bool(((out.means - stats.means).norm(dim=1) < tol).all())
    assert not torch.equal(out.means, stats.means)


# ------------------------------------------------------------------------------ Identity


def test_identity_returns_an_unchanged_copy():
    stats, _, _ = stats_and_samples()
    old = random_anchors()
    out = Identity().fit(old, old * 2).transform(stats)
    assert torch.equal(out.means, stats.means) and torch.equal(out.scatters, stats.scatters)
    assert out is not stats


# ----------------------------------------------------------------------------------- SDC


def sdc_reference(means, old, new, sigma, normalize):
    """Independent numpy reference: exp(-||k - q||^2 / 2 sigma^2) weights, weighted drift."""
    K, Q, Dl = old.numpy(), means.numpy(), (new - old).numpy()
    if normalize:
        K = K / np.linalg.norm(K, axis=1, keepdims=True)
        Q = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    sq = ((Q[:, None, :] - K[None, :, :]) ** 2).sum(-1)
    w = np.exp(-sq / (2 * sigma**2))
    return torch.from_numpy(means.numpy() + (w @ Dl) / w.sum(1, keepdims=True))


@pytest.mark.parametrize("normalize,sigma", [(True, 0.3), (True, 1.0), (False, 3.0)])
def test_sdc_matches_gaussian_kernel_formula(normalize, sigma):
    stats, _, _ = stats_and_samples()
    old = random_anchors()
    new = old + torch.sin(old)
    out = SDC(sigma=sigma, normalize=normalize, chunk_size=2).fit(old, new).transform(stats)
    torch.testing.assert_close(out.means, sdc_reference(stats.means, old, new, sigma, normalize),
                               rtol=1e-10, atol=1e-10)
    assert torch.equal(out.scatters, stats.scatters)


def test_sdc_is_hopdc_at_the_mean_with_tau_sigma_squared():
    stats, _, _ = stats_and_samples()
    old = random_anchors()
    new = old + torch.cos(old)
    sdc = SDC(sigma=0.4).fit(old, new)
    hop = HopDC(tau=0.16, topk=None, dtype="float64", linear=False).fit(old, new)
    torch.testing.assert_close(sdc.drift_at(stats.means), hop.drift_at(stats.means))


def test_sdc_survives_far_away_classes():
    """Raw distances so large that every kernel weight underflows: nearest anchors, not NaN."""
    stats, _, _ = stats_and_samples(offset=1e3)
    old = random_anchors()
    out = SDC(sigma=0.1, normalize=False).fit(old, old + 1).transform(stats)
    torch.testing.assert_close(out.means, stats.means + 1)


# ---------------------------------------------------------------------------------- SLDC


def test_linear_sldc_recovers_a_linear_drift_to_round_off():
    stats, X, y = stats_and_samples()
    A = torch.randn(5, 5, generator=gen(7), dtype=D)
    old = random_anchors(n=300)
    sldc = LinearSLDC(gamma=0.0, normalize=False, shrink=False).fit(old, old @ A)
    torch.testing.assert_close(sldc.W_, A, rtol=1e-10, atol=1e-10)
    out = sldc.transform(stats)
    truth = ClassGaussians(5).update(X @ A, y)     # oracle: true new features of the samples
    torch.testing.assert_close(out.means, truth.means, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.covariances(), truth.covariances(), rtol=1e-9, atol=1e-9)
    report = drift_report(out, truth, before=stats)
    assert report["mean_error"] < 1e-9 and report["gain"]["cov_error"] > 1 - 1e-9


def test_linear_sldc_recovers_a_rotation_with_normalised_anchors():
    g = gen(8)
    Q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=D))
    old = random_anchors(n=2000)                     # N / d = 400: shrinkage weight e^-400 = 0
    sldc = LinearSLDC(gamma=0.0).fit(old, 3.0 * old @ Q)  # the scale is normalised away
    torch.testing.assert_close(sldc.W_, Q, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("preset", ["recommended", "paper"])
def test_linear_sldc_matches_closed_form(preset):
    old = random_anchors(n=12)
    new = old + torch.tanh(old)
    sldc = LinearSLDC.from_preset(preset, cov_jitter=1e-3).fit(old, new)
    X = (old / old.norm(dim=1, keepdim=True)).numpy()
    Y = (new / new.norm(dim=1, keepdim=True)).numpy()
    # ridge as least squares on the augmented system [X; sqrt(gamma) I] W = [Y; sqrt(gamma) W0],
    # W0 = I (gdacil's ridge toward the identity) or 0 (the reference code's)
    W0 = np.eye(5) if preset == "recommended" else np.zeros((5, 5))
    Xa = np.vstack([X, math.sqrt(0.1) * np.eye(5)])
    Ya = np.vstack([Y, math.sqrt(0.1) * W0])
    W = np.linalg.lstsq(Xa, Ya, rcond=None)[0]
    w = math.exp(-12 / 5)
    expected = torch.from_numpy((1 - w) * W + w * np.eye(5))
    torch.testing.assert_close(sldc.W_, expected, rtol=1e-10, atol=1e-12)
    assert sldc.shrinkage_ == pytest.approx(w) and sldc.ridge_ == pytest.approx(0.1, rel=1e-12)
    stats, _, _ = stats_and_samples()
    out = sldc.transform(stats)
    torch.testing.assert_close(out.means, stats.means @ expected)
    torch.testing.assert_close(out.covariances(), expected.T @ stats.covariances() @ expected
                               + 1e-3 * torch.eye(5, dtype=D))


def test_linear_sldc_singular_gram_is_a_clear_error():
    old = random_anchors(n=3)
    with pytest.raises(ValueError, match="singular"):
        LinearSLDC(gamma=0.0, normalize=False).fit(old, old)


def test_weak_sldc_learns_a_drift_and_is_seeded():
    stats, X, y = stats_and_samples(d=4, offset=2.0)
    A = torch.eye(4, dtype=D) + 0.3 * torch.randn(4, 4, generator=gen(2), dtype=D)
    old = random_anchors(n=256, d=4)
    sldc = WeakNonlinearSLDC(steps=120, lr=3e-3, n_samples=200, seed=3).fit(old, old @ A)
    out = sldc.transform(stats)
    truth = ClassGaussians(4).update(X @ A, y)
    report = drift_report(out, truth, before=stats)
    assert report["gain"]["mean_error"] > 0.3, report
    # the moments are those of the pseudo-samples pushed through the trained model
    ref = resample_moments(stats, stats.classes, sldc.map_points, n_samples=200,
                           generator=gen(3), class_batch=1)
    torch.testing.assert_close(out.means, ref.means, rtol=1e-6, atol=1e-6)
    assert sldc.map_points(old[:3]).shape == (3, 4)

    def run(seed):
        return WeakNonlinearSLDC(steps=10, n_samples=50, seed=seed).fit(old, old @ A)

    a, b = run(5), run(5)
    assert all(torch.equal(p, q) for p, q in zip(a.model_.parameters(), b.model_.parameters()))
    assert torch.equal(a.transform(stats).scatters, b.transform(stats).scatters)
    assert not torch.equal(run(6).transform(stats).means, a.transform(stats).means)


# -------------------------------------------------------------------------------- Oracle


@pytest.mark.parametrize("ddof", [0, 1])
def test_oracle_recomputes_statistics_from_true_new_features(ddof):
    stats, X, y = stats_and_samples()
    stats = ClassGaussians(5, ddof=ddof).update(X, y)
    new = torch.tanh(X) * 3
    truth = ClassGaussians(5, ddof=ddof).update(new, y)
    for oracle in (Oracle.from_features(new, y), Oracle().fit(X, new, y),
                   Oracle.from_stats(ClassGaussians(5, ddof=1 - ddof).update(new, y))):
        out = oracle.transform(stats)
        torch.testing.assert_close(out.means, truth.means)
        torch.testing.assert_close(out.covariances(), truth.covariances())
        torch.testing.assert_close(out.counts, stats.counts)
    report = drift_report(out, truth, before=stats)
    assert report["mean_error"] < 1e-12 and report["gain"]["w2"] == pytest.approx(1.0)


def test_oracle_errors():
    stats, X, y = stats_and_samples()
    with pytest.raises(ValueError, match="labels"):
        Oracle().fit(X, X)
    oracle = Oracle.from_features(X[y != 2], y[y != 2])
    with pytest.raises(ValueError, match=r"no statistics for classes \[2\]"):
        oracle.transform(stats)
    with pytest.raises(ValueError, match="same anchors"):
        Oracle().fit(X[:-1], X, y)


# ------------------------------------------------------------------------ registry/config


def test_registry_and_config_round_trip():
    assert set(COMPENSATORS) == {"identity", "hopdc", "sdc", "sldc_linear", "sldc_weak", "oracle"}
    for name, cls in COMPENSATORS.items():
        comp = build_compensator(name)
        assert type(comp) is cls
        config = comp.get_config()
        assert config["name"] == name
        json.dumps(config)
        assert build_compensator(json.loads(json.dumps(config))).get_config() == config
    assert build_compensator("hopdc", tau=0.2, topk=None).get_config()["topk"] is None
    assert build_compensator({"name": "hopdc", "tau": 0.2}, tau=0.3).tau == 0.3
    with pytest.raises(ValueError, match="unknown compensator 'hop'"):
        build_compensator("hop")
    with pytest.raises(ValueError, match="bad configuration"):
        build_compensator("sdc", tau=0.1)
    assert HopDC(seed=gen(0)).get_config()["seed"] == "torch.Generator"


# ------------------------------------------------------------------------------ bad input

FITTABLE = [
    Identity(), HopDC(topk=5, n_samples=20), HopDC(topk=5, n_samples=20, linear=True), SDC(),
    LinearSLDC(), WeakNonlinearSLDC(steps=2, n_samples=20),
]


def _comp_id(comp) -> str:
    return comp.name + ("_linear" if getattr(comp, "linear", False) else "")


@pytest.mark.parametrize("comp", FITTABLE, ids=_comp_id)
def test_bad_anchor_sets_are_clear_errors(comp):
    old = random_anchors(n=50)
    with pytest.raises(ValueError, match="same anchors"):
        comp.fit(old, old[:-1])
    with pytest.raises(ValueError, match="same dimension"):
        comp.fit(old, old[:, :-1])
    bad = old.clone()
    bad[7, 2] = float("nan")
    with pytest.raises(ValueError, match=r"old_features contain NaN or inf \(first at row 7\)"):
        comp.fit(bad, old)
    with pytest.raises(ValueError, match="new_features contain NaN"):
        comp.fit(old, bad)
    with pytest.raises(ValueError, match="empty"):
        comp.fit(old[:0], old[:0])
    with pytest.raises(ValueError, match="2-D"):
        comp.fit(old[0], old[0])


@pytest.mark.parametrize("comp", FITTABLE, ids=_comp_id)
def test_bad_statistics_and_order_are_clear_errors(comp):
    comp = type(comp)(**{k: v for k, v in comp.get_config().items() if k != "name"})
    stats, _, _ = stats_and_samples()
    with pytest.raises(NotFittedError, match="not fitted"):
        comp.transform(stats)
    assert issubclass(NotFittedError, ValueError)
    comp.fit(random_anchors(n=50), random_anchors(n=50, seed=2))
    with pytest.raises(ValueError, match="no old classes"):
        comp.transform(ClassGaussians(5))
    with pytest.raises(ValueError, match="no old classes"):
        comp.transform(stats, labels=[])
    with pytest.raises(ValueError, match="dimension 4 but .* 5-dimensional"):
        comp.transform(ClassGaussians(4).update(torch.randn(6, 4), [0, 0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"not present in the statistics: \[9\]"):
        comp.transform(stats, labels=[0, 9])
    with pytest.raises(ValueError, match="duplicates"):
        comp.transform(stats, labels=[0, 0])


@pytest.mark.parametrize("cls", [HopDC, SDC, LinearSLDC])
def test_zero_norm_anchors_are_rejected_where_normalised(cls):
    old = random_anchors(n=50)
    old[3] = 0.0
    with pytest.raises(ValueError, match="old_features row 3 has zero norm"):
        cls().fit(old, old + 1) if cls is not HopDC else cls(topk=5).fit(old, old + 1)
    Identity().fit(old, old + 1)                          # no normalisation: fine
    SDC(normalize=False).fit(old, old + 1)


@pytest.mark.parametrize("params,match", [
    ({"tau": 0.0}, "tau must be > 0"),
    ({"tau": float("nan")}, "tau"),
    ({"topk": 0}, "topk"),
    ({"n_samples": 0}, "n_samples"),
    ({"damping": 1.5}, "damping"),
    ({"dtype": "float16"}, "dtype"),
    ({"seed": None}, "seed must be an int or a torch.Generator"),
    ({"linear": "yes"}, "linear must be True or False"),
    ({"seed": 1.5}, "seed"),
])
def test_hopdc_bad_parameters(params, match):
    old = random_anchors(n=50)
    with pytest.raises(ValueError, match=match):
        HopDC(**params).fit(old, old + 1)


def test_match_moments_needs_more_samples_than_dimensions():
    stats, _, _ = stats_and_samples()
    old = random_anchors(n=50)
    with pytest.raises(ValueError, match="match_moments"):
        HopDC(topk=5, n_samples=5, match_moments=True).fit(old, old).transform(stats)


def test_queries_are_checked():
    old = random_anchors(n=50)
    hop = HopDC(topk=5)
    with pytest.raises(NotFittedError):
        hop.drift_at(old)
    hop.fit(old, old + 1)
    with pytest.raises(ValueError, match=r"queries must have shape \(m, 5\)"):
        hop.drift_at(old[:, :3])
    with pytest.raises(ValueError, match="queries contain NaN"):
        hop.drift_at(torch.full((2, 5), float("nan")))
