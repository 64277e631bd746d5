"""HopDC: retrieval against dense references, the paper's bounds, determinism, chunking, quality."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdacil import ClassGaussians
from gdacil.drift import SDC, HopDC, Identity, LinearSLDC, drift_report
from gdacil.drift import attention as attention_module
from gdacil.drift.pseudo import resample_moments
from gdacil.drift.synthetic import sphere_drift_problem

D = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def unit(X):
    return X / X.norm(dim=1, keepdim=True)


def dense_drift(queries, old, new, tau, topk):
    """Independent reference: full logits, mask all but the top-k by sorting, softmax, @ D."""
    logits = unit(queries) @ unit(old).T / tau
    if topk is not None and topk < old.shape[0]:
        order = logits.argsort(dim=1, descending=True)
        mask = torch.full_like(logits, -math.inf)
        mask.scatter_(1, order[:, :topk], 0.0)
        logits = logits + mask
    return torch.softmax(logits, dim=1) @ (new - old)


def small_stats(d=6, n_classes=4, seed=0, offset=3.0):
    g = gen(seed)
    X = torch.randn(80 * n_classes, d, generator=g, dtype=D) + offset
    y = torch.arange(80 * n_classes) % n_classes
    return ClassGaussians(d).update(X, y)


def anchors(n=200, d=6, seed=1, offset=3.0):
    g = gen(seed)
    old = torch.randn(n, d, generator=g, dtype=D) + offset
    new = old + torch.sin(old) + 0.3 * old.roll(1, dims=1)
    return old, new


# ----------------------------------------------------------------------------- retrieval


@pytest.mark.parametrize("topk", [None, 1, 7, 199, 200])
@pytest.mark.parametrize("tau", [0.05, 1.0])
def test_drift_at_matches_dense_reference(topk, tau):
    old, new = anchors()
    Z = torch.randn(33, 6, generator=gen(2), dtype=D) + 3.0
    hop = HopDC(tau=tau, topk=topk, dtype="float64", chunk_size=8, linear=False,
                shrink=False).fit(old, new)
    torch.testing.assert_close(hop.drift_at(Z), dense_drift(Z, old, new, tau, topk),
                               rtol=1e-12, atol=1e-12)
    p = hop.attention(Z)
    torch.testing.assert_close(p.sum(1), torch.ones(33, dtype=D))
    expected_nonzero = 200 if topk is None else topk
    assert int((p > 0).sum(1).max()) <= expected_nonzero
    torch.testing.assert_close(p @ (new - old), hop.drift_at(Z))


def test_float32_attention_close_to_float64():
    old, new = anchors()
    Z = torch.randn(50, 6, generator=gen(3), dtype=D) + 3.0
    a = HopDC(topk=20).fit(old, new).drift_at(Z)
    b = HopDC(topk=20, dtype="float64").fit(old, new).drift_at(Z)
    assert a.dtype == torch.float64
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * float(b.abs().max()))


def test_tau_to_zero_is_nearest_anchor_drift():
    old, new = anchors(n=300)
    Z = torch.randn(60, 6, generator=gen(4), dtype=D) + 3.0
    top2 = (unit(Z) @ unit(old).T).topk(2, dim=1)
    Z = Z[top2.values[:, 0] - top2.values[:, 1] > 1e-5]  # an unambiguous nearest anchor
    assert Z.shape[0] >= 40
    nearest = (unit(Z) @ unit(old).T).argmax(dim=1)
    for topk in (None, 5):
        hop = HopDC(tau=1e-7, topk=topk, dtype="float64", linear=False,
                    shrink=False).fit(old, new)
        torch.testing.assert_close(hop.drift_at(Z), (new - old)[nearest], rtol=0, atol=1e-12)

    # the whole transform, too: identical to pushing the same pseudo-samples by their
    # nearest anchor's drift (moment-matched in the recommended preset, plain in the paper's)
    stats = small_stats()

    def nearest_push(Z):
        return Z + (new - old)[(unit(Z) @ unit(old).T).argmax(dim=1)]

    for preset, matched in (("recommended", True), ("paper", False)):
        hop = HopDC.from_preset(preset, tau=1e-7, topk=5, n_samples=300, dtype="float64", seed=9,
                               linear=False, shrink=False)
        out = hop.fit(old, new).transform(stats)
        ref = resample_moments(stats, stats.classes, nearest_push, n_samples=300,
                               generator=gen(9), match_moments=matched)
        # 1e-8: a pseudo-sample within ~1e-6 of a tie still splits its weight by ~1e-9
        torch.testing.assert_close(out.means, ref.means, rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(out.covariances(), ref.covariances(), rtol=1e-8, atol=1e-8)


def test_attention_is_computed_in_bounded_chunks(monkeypatch):
    rows = []
    original = attention_module.attention_weights

    def spy(queries, keys, **kw):
        rows.append(queries.shape[0])
        return original(queries, keys, **kw)

    monkeypatch.setattr(attention_module, "attention_weights", spy)
    old, new = anchors()
    HopDC(topk=10, n_samples=50, chunk_size=16, shrink=False).fit(old, new).transform(
        small_stats())
    assert rows and max(rows) <= 16
    assert sum(rows) == 4 * 50


# ---------------------------------------------------------------- Proposition 2, Corollary 2


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 120),
    d=st.integers(2, 10),
    tau=st.floats(1e-3, 3.0),
    topk=st.one_of(st.none(), st.integers(1, 120)),
    lip=st.floats(0.05, 5.0),
)
def test_error_bounds_of_proposition_2(seed, n, d, tau, topk, lip):
    """Per query, for delta(x) = A tanh(B x) with Lipschitz constant L = ||A||_2 ||B||_2:

    ||delta_hat(z) - delta(z)|| <= L sum_i p_i ||k_i - z||                  (Proposition 2)
                                <= L (min_i ||k_i - z|| + sqrt(2 tau log k))  (Corollary 2)
    """
    g = gen(seed)
    topk = None if topk is None else min(topk, n)
    A = torch.randn(d, d, generator=g, dtype=D)
    B = torch.randn(d, d, generator=g, dtype=D)
    A *= lip / torch.linalg.matrix_norm(A, ord=2)
    L = lip * float(torch.linalg.matrix_norm(B, ord=2))

    def delta(X):
        return torch.tanh(X @ B.T) @ A.T

    keys = unit(torch.randn(n, d, generator=g, dtype=D))
    z = unit(torch.randn(16, d, generator=g, dtype=D))
    hop = HopDC(tau=tau, topk=topk, dtype="float64", linear=False, shrink=False).fit(
        keys, keys + delta(keys))
    err = (hop.drift_at(z) - delta(z)).norm(dim=1)
    p = hop.attention(z)
    dist = torch.cdist(z, keys)
    slack = 1e-9 * (1 + L)
    general = L * (p * dist).sum(1)
    assert bool((err <= general + slack).all())
    k = n if topk is None else topk
    temperature = L * (dist.min(1).values + math.sqrt(2 * tau * math.log(k)))
    assert bool((general <= temperature + slack).all())
    # the step the corollary's proof rests on (Gibbs: E_p[a] <= min a + log k)
    assert bool(((p * dist**2).sum(1) <= dist.min(1).values ** 2 + 2 * tau * math.log(k)
                 + 1e-9).all())


# ------------------------------------------------------------------ statistics transform


@pytest.mark.parametrize("preset,matched", [("recommended", True), ("paper", False)])
def test_transform_matches_bruteforce_pipeline(preset, matched):
    old, new = anchors()
    stats = small_stats()
    hop = HopDC.from_preset(preset, tau=0.1, topk=25, n_samples=200, dtype="float64", seed=3,
                           linear=False)
    hop.fit(old, new)
    assert hop.match_moments_ is matched
    ref = resample_moments(
        stats, stats.classes, lambda Z: Z + dense_drift(Z, old, new, 0.1, 25),
        n_samples=200, generator=gen(3), match_moments=matched,
    )
    out = hop.transform(stats)
    torch.testing.assert_close(out.means, ref.means, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.covariances(), ref.covariances(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.counts, stats.counts)


def test_constant_drift_is_reproduced_exactly_with_matched_moments():
    old, _ = anchors()
    shift = torch.linspace(-1, 2, 6, dtype=D)
    stats = small_stats()
    for shared in (True, False):
        hop = HopDC(n_samples=50, topk=30, match_moments=True, shared_noise=shared, linear=False,
                    dtype="float64")
        out = hop.fit(old, old + shift).transform(stats)
        torch.testing.assert_close(out.means, stats.means + shift, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out.covariances(), stats.covariances(), rtol=1e-9, atol=1e-9)


def test_only_requested_classes_change():
    old, new = anchors()
    stats = small_stats()
    out = HopDC(n_samples=100, topk=30).fit(old, new).transform(stats, labels=[1, 3])
    for c in (0, 2):
        assert torch.equal(out.means[c], stats.means[c])
        assert torch.equal(out.scatters[c], stats.scatters[c])
    assert not torch.allclose(out.means[1], stats.means[1])
    assert stats.means.data_ptr() != out.means.data_ptr()


def test_damping_blends_old_and_new_moments():
    old, new = anchors()
    stats = small_stats()
    kw = {"n_samples": 100, "topk": 30, "seed": 5}
    plain = HopDC(**kw).fit(old, new).transform(stats)
    damped = HopDC(damping=0.1, **kw).fit(old, new).transform(stats)
    torch.testing.assert_close(damped.means, 0.9 * plain.means + 0.1 * stats.means)
    torch.testing.assert_close(damped.covariances(),
                               0.9 * plain.covariances() + 0.1 * stats.covariances())
    frozen = HopDC(damping=1.0, **kw).fit(old, new).transform(stats)
    torch.testing.assert_close(frozen.means, stats.means)


@pytest.mark.parametrize("shared_noise", [True, False])
def test_chunk_size_and_class_batch_do_not_change_the_estimate(shared_noise):
    old, new = anchors()
    stats = small_stats(n_classes=5)
    kw = {"n_samples": 120, "topk": 40, "shared_noise": shared_noise, "seed": 11}
    for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
        a = HopDC(chunk_size=7, class_batch=2, dtype=dtype, **kw).fit(old, new).transform(stats)
        b = HopDC(chunk_size=10_000, class_batch=5, dtype=dtype, **kw).fit(old, new)
        b = b.transform(stats)
        torch.testing.assert_close(a.means, b.means, rtol=tol, atol=tol)
        torch.testing.assert_close(a.covariances(), b.covariances(), rtol=tol, atol=tol)


def test_same_seed_is_bit_identical_and_seeds_matter():
    old, new = anchors()
    stats = small_stats()

    def run(seed, **kw):
        return HopDC(n_samples=100, topk=30, seed=seed, **kw).fit(old, new).transform(stats)

    a, b = run(7), run(7)
    assert torch.equal(a.means, b.means) and torch.equal(a.scatters, b.scatters)
    hop = HopDC(n_samples=100, topk=30, seed=7).fit(old, new)
    assert torch.equal(hop.transform(stats).means, hop.transform(stats).means)  # int seed
    assert not torch.equal(run(8).means, a.means)
    # a generator is advanced by each call; equal generators give equal results
    assert torch.equal(run(gen(7)).means, run(gen(7)).means)
    hop = HopDC(n_samples=100, topk=30, seed=gen(7)).fit(old, new)
    assert not torch.equal(hop.transform(stats).means, hop.transform(stats).means)


def test_presets_follow_the_paper_except_for_moment_matching_the_linear_part_and_shrinking():
    paper, recommended = HopDC.paper(), HopDC.recommended()
    assert (paper.tau, paper.topk, paper.n_samples, paper.damping) == (0.05, 400, 2000, 0.0)
    assert paper.match_moments is False and recommended.match_moments == "auto"
    assert recommended.get_config() == HopDC().get_config()     # the constructor's defaults
    differ = {k for k, v in paper.get_config().items() if recommended.get_config()[k] != v}
    assert differ == {"match_moments", "linear", "shrink"}
    assert HopDC.paper(tau=0.1).tau == 0.1 and HopDC.paper(tau=0.1).match_moments is False


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beats_identity_and_sdc_on_a_smooth_nonlinear_drift(seed):
    prob = sphere_drift_problem(5, 3000, 8, samples_per_class=1000, seed=seed)
    reports = {}
    for name, comp in (("identity", Identity()), ("sdc", SDC()), ("hopdc", HopDC(n_samples=1000))):
        out = comp.fit(prob.old_anchors, prob.new_anchors).transform(prob.stats)
        reports[name] = drift_report(out, prob.oracle, before=prob.stats)
    hop, sdc, ident = reports["hopdc"], reports["sdc"], reports["identity"]
    # SDC moves means only: its covariance error is Identity's
    assert sdc["cov_error"] == pytest.approx(ident["cov_error"])
    assert hop["mean_error"] < 0.9 * sdc["mean_error"] < 0.9 * ident["mean_error"]
    assert hop["cov_error"] < 0.7 * sdc["cov_error"]
    assert hop["w2"] < 0.8 * sdc["w2"] < 0.8 * ident["w2"]
    assert hop["gain"]["mean_error"] > 0.75 and hop["gain"]["cov_error"] > 0.3


# ---------------------------------------------------------------------- linear part


def test_linear_part_retrieves_the_residual_of_alpha1_sldc():
    old, new = anchors()
    hop = HopDC(topk=30, dtype="float64").fit(old, new)          # linear=True by default
    W = LinearSLDC().fit(old, new).W_
    torch.testing.assert_close(hop.linear_map_, W, rtol=0, atol=1e-12)
    torch.testing.assert_close(hop.values_, new - old @ W, rtol=0, atol=1e-12)
    stats = small_stats()
    out = HopDC(topk=30, dtype="float64", n_samples=50, match_moments=True).fit(old, new)
    out = out.transform(stats)
    # the same pseudo-samples pushed by hand: z W + the retrieved residual drift
    ref = resample_moments(stats, list(range(4)), lambda Z: Z @ W + hop.drift_at(Z),
                           n_samples=50, generator=gen(0), shared_noise=True, match_moments=True,
                           jitter=0.0, damping=0.0, class_batch=8)
    torch.testing.assert_close(out.means, ref.means, rtol=0, atol=1e-10)
    torch.testing.assert_close(out.covariances(), ref.covariances(), rtol=0, atol=1e-10)


def test_linear_part_carries_a_rotation_to_classes_far_from_the_anchors():
    g = gen(3)
    Q = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=D)).Q
    old = torch.randn(400, 6, generator=g, dtype=D)
    new = old @ Q                                   # a rotation: linear, norms kept
    far = small_stats(offset=6.0)                   # classes well outside the anchors
    truth_means = far.means @ Q
    errors = {}
    for linear in (False, True):
        out = HopDC(topk=30, n_samples=50, linear=linear).fit(old, new).transform(far)
        errors[linear] = float((out.means - truth_means).norm())
    assert errors[True] < 0.1 * errors[False], errors


def test_linear_part_round_trips_through_the_state():
    old, new = anchors()
    hop = HopDC(topk=30, n_samples=50, linear=True).fit(old, new)
    tensors, meta = hop.state_dict()
    assert "linear_map_" in tensors
    again = HopDC(topk=30, n_samples=50, linear=True).load_state_dict(tensors, meta)
    stats = small_stats()
    assert torch.equal(again.transform(stats).means, hop.transform(stats).means)
    assert "linear_map_" not in HopDC(topk=30, linear=False).fit(old, new).state_dict()[0]


# ----------------------------------------------------------------------------- shrink


def noisy_anchors(n=200, scale=2.0):
    old, new = anchors(n=n)
    return old, new + scale * torch.randn(old.shape, generator=gen(8), dtype=D)


def test_shrink_factor_is_the_clipped_least_squares_fit_of_held_out_folds():
    old, new = noisy_anchors(n=203)
    hop = HopDC(tau=0.3, topk=9, dtype="float64", linear=False).fit(old, new)
    values = new - old
    folds = torch.arange(203) % 5
    retrieved = torch.empty_like(values)
    for f in range(5):  # dense reference of each held-out fold's retrieval
        out = folds == f
        retrieved[out] = dense_drift(old[out], old[~out], new[~out], 0.3, 9)
    gamma = float((retrieved * values).sum() / retrieved.square().sum())
    assert 0.0 < gamma < 1.0 and hop.gamma_ == pytest.approx(gamma, rel=1e-12)
    torch.testing.assert_close(hop.values_, gamma * values, rtol=1e-12, atol=1e-12)
    plain = HopDC(tau=0.3, topk=9, dtype="float64", linear=False, shrink=False).fit(old, new)
    Z = torch.randn(20, 6, generator=gen(5), dtype=D) + 3.0
    assert plain.gamma_ == 1.0
    torch.testing.assert_close(hop.drift_at(Z), gamma * plain.drift_at(Z), rtol=1e-12,
                               atol=1e-12)


def test_shrink_keeps_a_predictable_drift_and_drops_noise():
    old, new = anchors(n=400)
    smooth = HopDC(topk=20, dtype="float64", linear=False).fit(old, new)
    assert smooth.gamma_ > 0.9
    noise = 0.5 * torch.randn(old.shape, generator=gen(7), dtype=D)
    noisy = HopDC(topk=20, dtype="float64", linear=False).fit(old, old + noise)
    assert noisy.gamma_ < 0.1


def test_with_unpredictable_residuals_hopdc_falls_back_to_the_linear_map():
    g = gen(11)
    old = torch.randn(500, 6, generator=g, dtype=D) + 2.0
    new = old + 0.3 * torch.randn(old.shape, generator=g, dtype=D)   # drift that is all noise
    stats = small_stats(offset=2.0)
    hop = HopDC(topk=50, n_samples=300, dtype="float64").fit(old, new)
    assert hop.gamma_ == 0.0
    out, ref = hop.transform(stats), LinearSLDC().fit(old, new).transform(stats)
    torch.testing.assert_close(out.means, ref.means, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.covariances(), ref.covariances(), rtol=1e-10, atol=1e-10)
    unshrunk = HopDC(topk=50, n_samples=300, dtype="float64", shrink=False).fit(old, new)
    assert (unshrunk.transform(stats).means - ref.means).norm() > 0.01


def test_shrink_factor_survives_a_state_round_trip():
    old, new = noisy_anchors()
    hop = HopDC(topk=20).fit(old, new)
    tensors, metadata = hop.state_dict()
    back = HopDC(topk=20).load_state_dict(tensors, metadata)
    assert back.gamma_ == hop.gamma_ < 1.0
    Z = torch.randn(10, 6, generator=gen(3), dtype=D) + 3.0
    torch.testing.assert_close(back.drift_at(Z), hop.drift_at(Z))


def test_a_state_saved_before_shrink_existed_loads_with_factor_one():
    old, new = noisy_anchors()
    hop = HopDC(topk=20, shrink=False).fit(old, new)
    tensors, metadata = hop.state_dict()
    del metadata["attributes"]["gamma_"]
    back = HopDC(topk=20).load_state_dict(tensors, metadata)
    assert back.gamma_ == 1.0
    Z = torch.randn(10, 6, generator=gen(3), dtype=D) + 3.0
    torch.testing.assert_close(back.drift_at(Z), hop.drift_at(Z))
