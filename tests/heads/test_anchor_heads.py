"""The analytic CIL heads (RanPAC, ACIL, RBF-LDA, FeCAM), their feature maps and pooled statistics,
each against an independent dense reference (numpy / scikit-learn / torch.linalg.solve)."""

import math
import warnings

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.heads.base import NotFittedError
from gdacil.heads.fecam import FeCAM, fecam_covariances
from gdacil.heads.mapped import MappedLinearHead
from gdacil.heads.rbf_lda import RBFLDA, oas_covariance
from gdacil.heads.ridge import ACIL, RanPAC
from gdacil.heads.ridge_lambda import DEFAULT_LAMBDA_GRID, select_ridge_lambda
from gdacil.stats import PooledGaussians
from gdacil.stats import feature_maps as fm
from gdacil.stats.feature_maps import FeatureMap, Identity, RandomBuffer, RandomFourier, RandomReLU
from gdacil.testing import HeadContract


def blobs(seed=0, d=6, classes=(0, 1, 2), n=40, spread=1.5, scale=1.0):
    """Gaussian classes with anisotropic noise; labels need not be 0..C-1."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(d, d, generator=g, dtype=torch.float64) * 0.5
    X, y = [], []
    for c in classes:
        centre = spread * torch.randn(d, generator=g, dtype=torch.float64)
        X.append(centre + torch.randn(n, d, generator=g, dtype=torch.float64) @ mix)
        y.append(torch.full((n,), c))
    return scale * torch.cat(X), torch.cat(y)


def three_tasks(seed=0, d=6):
    """Three tasks with new classes each (labels 7, 3, 11 | 5, 9 | 2, 8)."""
    return [blobs(seed + t, d=d, classes=cls) for t, cls in enumerate(((7, 3, 11), (5, 9), (2, 8)))]


def rel(a, b):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max() / b.abs().max())


def one_hot(y, classes):
    pos = {c: i for i, c in enumerate(classes)}
    Y = np.zeros((len(y), len(classes)))
    Y[np.arange(len(y)), [pos[int(c)] for c in y]] = 1.0
    return Y


# ------------------------------------------------------------------ feature maps
def test_feature_maps_match_their_formulas_in_any_chunking(monkeypatch):
    d, M = 5, 37
    X, _ = blobs(d=d)
    g = torch.Generator().manual_seed(3)
    W = torch.randn(d, M, generator=g, dtype=torch.float64)
    expected = {"relu": np.maximum(X.numpy() @ W.numpy(), 0.0)}
    got = RandomReLU(d, M, seed=3)(X)
    assert np.allclose(got.numpy(), expected["relu"], rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(fm, "_CHUNK_BYTES", 8 * M * 7)  # chunks of 7 rows
    assert torch.allclose(RandomReLU(d, M, seed=3)(X), got, rtol=1e-13, atol=1e-13)
    rff = RandomFourier(d, M, bandwidth=2.5, seed=4)
    omega, phase = rff.weights()
    ref = math.sqrt(2 / M) * np.cos(X.numpy() @ omega.numpy() / 2.5 + phase.numpy())
    assert np.allclose(rff(X).numpy(), ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(Identity(d)(X), X)


def test_random_buffer_is_uniform_in_linear_default_bounds():
    W, = RandomBuffer(64, 4000, seed=1).weights()
    bound = 1 / math.sqrt(64)
    assert float(W.abs().max()) <= bound
    assert abs(float(W.std()) - bound / math.sqrt(3)) < 0.01 * bound  # U(-b, b): std b / sqrt(3)
    assert abs(float(W.mean())) < 0.01 * bound


@pytest.mark.parametrize("fmap", [Identity(4), RandomReLU(4, 9, seed=2), RandomBuffer(4, 9, seed=5),
                                  RandomFourier(4, 9, bandwidth=0.7, seed=1)])
def test_feature_maps_regenerate_from_their_description(fmap):
    X, _ = blobs(d=4)
    config = fmap.to_dict()
    import json

    again = FeatureMap.from_dict(json.loads(json.dumps(config)))
    assert again == fmap and type(again) is type(fmap)
    assert torch.equal(again(X), fmap(X))


def test_tampered_weights_fingerprint_is_refused():
    config = RandomReLU(4, 9, seed=2).to_dict()
    config["weights_sha256"] = "0" * 64
    with pytest.raises(ValueError, match="sha256 mismatch"):
        FeatureMap.from_dict(config)(torch.ones(1, 4))
    with pytest.raises(ValueError, match="not a RandomBuffer description"):
        RandomBuffer.from_dict(RandomReLU(4, 9).to_dict())


def test_auto_bandwidth_is_the_rms_distance_and_scale_equivariant():
    X, _ = blobs(d=5)
    rff = RandomFourier(5, 50, seed=0).fit(X)
    D = torch.cdist(X, X).square()
    n = X.shape[0]
    assert math.isclose(rff.bandwidth_, math.sqrt(float(D.sum()) / (n * (n - 1))), rel_tol=1e-12)
    scaled = RandomFourier(5, 50, seed=0).fit(10 * X)
    assert math.isclose(scaled.bandwidth_, 10 * rff.bandwidth_, rel_tol=1e-12)
    assert torch.allclose(scaled(10 * X), rff(X), atol=1e-10)
    with pytest.raises(NotFittedError, match="not fitted"):
        RandomFourier(5, 50)(X)
    with pytest.raises(ValueError, match="identical"):
        RandomFourier(5, 50).fit(torch.ones(3, 5))


# ------------------------------------------------------------------ pooled statistics
def test_pooled_statistics_merge_of_shards_equals_one_pass():
    X, y = blobs(d=7, classes=(4, 1, 9, 6), n=50)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    X, y = X[order], y[order]
    one = PooledGaussians(7).update(X, y)
    shards = [PooledGaussians(7).update(X[s], y[s]) for s in (slice(0, 30), slice(30, 120),
                                                                slice(120, 200))]
    forward = shards[0].copy().merge(shards[1]).merge(shards[2])
    backward = shards[2].copy().merge(shards[1]).merge(shards[0])
    for merged in (forward, backward):
        perm = merged.positions(one.classes)
        assert torch.equal(merged.counts[perm], one.counts)
        assert rel(merged.means[perm], one.means) <= 1e-12
        assert rel(merged.scatter, one.scatter) <= 1e-12
    Xn, yn = X.numpy(), y.numpy()
    assert rel(one.gram(), Xn.T @ Xn) <= 1e-12
    assert rel(one.cross(), Xn.T @ one_hot(yn, one.classes)) <= 1e-12
    within = sum((Xn[yn == c] - Xn[yn == c].mean(0)).T @ (Xn[yn == c] - Xn[yn == c].mean(0))
                 for c in one.classes)
    assert rel(one.pooled_covariance(), within / len(yn)) <= 1e-12
    assert rel(one.pooled_covariance(ddof=1), within / (len(yn) - 4)) <= 1e-12


def test_pooled_statistics_save_load_and_input_errors(tmp_path):
    X, y = blobs(d=3)
    stats = PooledGaussians(3).update(X, y)
    stats.save(tmp_path / "p.safetensors")
    back = PooledGaussians.load(tmp_path / "p.safetensors")
    assert back.classes == stats.classes and torch.equal(back.scatter, stats.scatter)
    with pytest.raises(ValueError, match="NaN or inf"):
        stats.update(torch.full((2, 3), float("nan")), [0, 1])
    with pytest.raises(ValueError, match="dimension 4, expected 3"):
        stats.update(torch.zeros(2, 4), [0, 1])
    with pytest.raises(ValueError, match="must be integers"):
        stats.update(torch.zeros(2, 3), [0.5, 1.0])
    bad = stats.state_dict()
    bad["means"] = bad["means"].clone()
    bad["means"][0, 0] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        PooledGaussians.from_state_dict(bad)


# ------------------------------------------------------------------ ridge heads
def dense_ridge_scores(H_train, y_train, H_query, lam, classes):
    """The closed-form ridge on one-hot targets, with numpy."""
    H, Y = H_train.numpy(), one_hot(y_train.numpy(), classes)
    W = np.linalg.solve(H.T @ H + lam * np.eye(H.shape[1]), H.T @ Y)
    return H_query.numpy() @ W


def relu_map(head, X):
    W, = head.feature_map_.weights()
    return torch.relu(X @ W)


@pytest.mark.parametrize("make, mapping", [
    (lambda: RanPAC(dim_out=0, lam=0.5), lambda head, X: X),
    (lambda: RanPAC(dim_out=300, lam=3.0, seed=1), relu_map),
    (lambda: ACIL(buffer_size=300, gamma=0.1, seed=2), relu_map),
])
def test_ridge_heads_trained_task_by_task_equal_joint_ridge(make, mapping):
    tasks = three_tasks()
    head = make()
    for X, y in tasks:
        head.partial_fit(X, y)
    X_all, y_all = torch.cat([t[0] for t in tasks]), torch.cat([t[1] for t in tasks])
    Xq = blobs(seed=9, d=6)[0]
    lam = head.lam if isinstance(head, RanPAC) else head.gamma
    ref = dense_ridge_scores(mapping(head, X_all), y_all, mapping(head, Xq), lam, head.classes_.tolist())
    assert rel(head.decision_function(Xq), ref) <= 1e-6
    assert head.lam_ == lam
    assert torch.equal(head.predict(Xq), head.classes_[torch.as_tensor(ref.argmax(1))])


def paper_lambda_curve(H, Y, train, val, grid):
    """RanPAC's procedure: one dense solve per grid value on the 80%, MSE on the 20%."""
    Ht, Yt, Hv, Yv = H[train].numpy(), Y[train], H[val].numpy(), Y[val]
    G, Q = Ht.T @ Ht, Ht.T @ Yt
    return np.array([np.mean((Hv @ np.linalg.solve(G + lam * np.eye(G.shape[0]), Q) - Yv) ** 2)
                     for lam in grid])


@pytest.mark.parametrize("dim_out, n", [(0, 400), (120, 100)])  # M < n_train, then n_train < M
def test_fast_lambda_selection_matches_the_paper_procedure(dim_out, n):
    g = torch.Generator().manual_seed(5)
    d = 30
    y = torch.arange(n) % 4
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * 0.5
    X[:, :4] += 0.4 * torch.nn.functional.one_hot(y, 4)  # a weak signal: the best lam is interior
    H = X if dim_out == 0 else RandomReLU(d, dim_out, seed=0)(X)
    Y = one_hot(y.numpy(), [0, 1, 2, 3])
    seed = 11
    sel = select_ridge_lambda(H, torch.as_tensor(Y), generator=torch.Generator().manual_seed(seed))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    train, val = perm[: int(0.8 * n)], perm[int(0.8 * n):]
    ref = paper_lambda_curve(H, Y, train, val, DEFAULT_LAMBDA_GRID)
    best = int(np.argmin(ref))
    assert 2 <= best <= len(ref) - 3, f"fixture should choose an interior lam, got index {best}"
    assert sel.lam == DEFAULT_LAMBDA_GRID[best]
    assert sel.floor < 1e-8 and sel.effective == list(DEFAULT_LAMBDA_GRID)
    # the dense solves lose digits where G + lam I is ill-conditioned (tiny lam, n_train < M)
    G = H[train].T @ H[train]
    cond = (torch.linalg.eigvalsh(G)[-1] + torch.tensor(DEFAULT_LAMBDA_GRID)) / torch.tensor(
        DEFAULT_LAMBDA_GRID)
    tight = (cond < 1e6).numpy()
    assert tight.sum() >= 8
    mse = np.array(sel.mse)
    assert np.max(np.abs(mse - ref)[tight] / ref[tight]) <= 1e-8
    assert np.max(np.abs(mse - ref) / ref) <= 1e-4


def test_ranpac_records_its_choice_per_batch_and_uses_it():
    tasks = three_tasks()
    head = RanPAC(dim_out=60, seed=3)
    for X, y in tasks:
        head.partial_fit(X, y)
    assert len(head.lam_history_) == 3
    assert head.lam_ == head.lam_history_[-1]["lam"]
    # the last batch's choice, with one-hot targets over all classes seen, equals a direct call
    X, y = tasks[-1]
    H = head.feature_map_(X)
    Y = torch.as_tensor(one_hot(y.numpy(), head.classes_.tolist()))
    direct = select_ridge_lambda(H, Y, generator=torch.Generator().manual_seed(3 * 1_000_003 + 2))
    assert direct.mse == head.lam_history_[-1]["mse"]
    fixed = RanPAC(dim_out=60, seed=3, lam=head.lam_)
    for X, y in tasks:
        fixed.partial_fit(X, y)
    assert torch.equal(fixed.decision_function(X), head.decision_function(X))


def test_lambda_floor_keeps_unresolvable_penalties_out():
    # huge features: eps * M * tr(G) is far above the grid's smallest values
    X, y = blobs(d=6, scale=1e7)
    Y = torch.as_tensor(one_hot(y.numpy(), [0, 1, 2]))
    sel = select_ridge_lambda(X, Y, generator=torch.Generator().manual_seed(0))
    assert sel.floor > 1e-3
    assert min(sel.effective) == sel.floor and sel.lam >= sel.floor
    assert all(e == max(v, sel.floor) for v, e in zip(sel.grid, sel.effective))


@pytest.mark.parametrize("dim_out", [0, 150])
def test_ranpac_with_auto_lambda_is_invariant_to_feature_scale(dim_out):
    # few samples, overlapping classes: the choices are interior to the grid
    tasks = [blobs(seed=t, d=40, classes=cls, spread=1.0, n=15)
             for t, cls in enumerate(((7, 3, 11), (5, 9), (2, 8)))]
    a, b = RanPAC(dim_out=dim_out, seed=1), RanPAC(dim_out=dim_out, seed=1)
    for X, y in tasks:
        a.partial_fit(X, y)
        b.partial_fit(10 * X, y)
    chosen = [h["lam"] for h in a.lam_history_]
    assert all(1e-6 <= lam <= 1e6 for lam in chosen), chosen  # 100 x lam stays on the grid
    assert [h["lam"] for h in b.lam_history_] == pytest.approx([100 * lam for lam in chosen],
                                                               rel=1e-12)
    Xq = blobs(seed=9, d=40)[0]
    assert rel(b.decision_function(10 * Xq), a.decision_function(Xq)) <= 1e-8
    assert torch.equal(b.predict(10 * Xq), a.predict(Xq))


def test_acil_is_not_scale_invariant():
    """ACIL's absolute gamma: the same data at another scale gives another head (documented)."""
    tasks = three_tasks()
    a, b = ACIL(buffer_size=50), ACIL(buffer_size=50)
    for X, y in tasks:
        a.partial_fit(X * 1e-3, y)
        b.partial_fit(X, y)
    Xq = blobs(seed=9, d=6)[0]
    assert rel(a.decision_function(Xq * 1e-3), b.decision_function(Xq)) > 1e-3


# ------------------------------------------------------------------ RBF-LDA
class FixedCovariance:
    """A scikit-learn covariance estimator that returns a given matrix."""

    def __init__(self, cov):
        self.cov = cov

    def fit(self, X, y=None):
        self.covariance_ = self.cov
        return self


def test_oas_formula_matches_scikit_learn():
    from sklearn.covariance import OAS

    X, y = blobs(d=8, n=15)
    Xc = X.numpy() - np.stack([X.numpy()[y.numpy() == c].mean(0) for c in y.numpy()])
    sk = OAS(assume_centered=True).fit(Xc)
    ours, rho = oas_covariance(torch.as_tensor(Xc.T @ Xc / len(Xc)), len(Xc))
    assert math.isclose(rho, sk.shrinkage_, rel_tol=1e-12)
    assert rel(ours, sk.covariance_) <= 1e-12


def test_rbf_lda_equals_scikit_learn_lda_on_the_same_random_features():
    from sklearn.covariance import OAS
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    X, y = blobs(d=5, classes=(4, 0, 2, 7), n=30)
    head = RBFLDA(dim_out=60, seed=2, priors="empirical").fit(X, y)
    Z = head.feature_map_(X).numpy()
    Zc = Z - np.stack([Z[y.numpy() == c].mean(0) for c in y.numpy()])  # within-class residuals
    pooled_oas = OAS(assume_centered=True).fit(Zc).covariance_
    lda = LinearDiscriminantAnalysis(solver="lsqr", covariance_estimator=FixedCovariance(pooled_oas))
    lda.fit(Z, y.numpy())
    Xq = blobs(seed=4, d=5, classes=(4, 0, 2, 7), n=10)[0]
    Zq = head.feature_map_(Xq).numpy()
    cols = [list(lda.classes_).index(c) for c in head.classes_.tolist()]
    ref = lda.decision_function(Zq)[:, cols]
    assert rel(head.decision_function(Xq), ref) <= 1e-9
    assert np.array_equal(head.predict(Xq).numpy(), lda.predict(Zq))
    assert np.allclose(head.predict_proba(Xq).numpy(), lda.predict_proba(Zq)[:, cols], atol=1e-9)


def test_rbf_lda_heads_with_different_auto_bandwidths_refuse_to_merge():
    X, y = blobs(d=4)
    a, b = RBFLDA(dim_out=20).fit(X[::2], y[::2]), RBFLDA(dim_out=20).fit(X[1::2], y[1::2])
    assert a.feature_map_.bandwidth_ != b.feature_map_.bandwidth_
    with pytest.raises(ValueError, match="different feature maps"):
        a.merge(b)


# ------------------------------------------------------------------ merging
@pytest.mark.parametrize("make", [
    lambda: RanPAC(dim_out=80, lam=2.0, seed=4),
    lambda: ACIL(buffer_size=80, seed=4),
    lambda: RBFLDA(dim_out=80, bandwidth=3.0, seed=4),
    lambda: FeCAM(alpha1=0.5, alpha2=0.2),
])
def test_merge_of_shard_heads_equals_one_head(make):
    X, y = blobs(d=6, classes=(3, 8, 1, 5), n=40)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))
    X, y = X[perm], y[perm]
    whole = make().partial_fit(X, y)
    parts = [make().partial_fit(X[s], y[s]) for s in (slice(0, 50), slice(50, 110), slice(110, 160))]
    merged = parts[0]
    merged.merge(parts[1]).merge(parts[2])
    Xq = blobs(seed=7, d=6, classes=(3, 8, 1, 5), n=8)[0]
    cols = [merged.classes_.tolist().index(c) for c in whole.classes_.tolist()]
    assert rel(merged.decision_function(Xq)[:, cols], whole.decision_function(Xq)) <= 1e-9
    assert torch.equal(merged.predict(Xq), whole.predict(Xq))
    with pytest.raises(ValueError, match="different parameters"):
        merged.merge(type(merged)(**{**merged.get_params(), "dtype": torch.float32}))


# ------------------------------------------------------------------ FeCAM
def fecam_reference(X, y, Xq, classes, alpha1, alpha2, normalize, transform=lambda v: v):
    """Squared Mahalanobis distances with torch.linalg.solve of FeCAM's matrix, written out."""
    X, Xq = transform(X), transform(Xq)
    out = []
    for c in classes:
        Xc = X[y == c]
        cov = torch.cov(Xc.T)
        d = cov.shape[0]
        v = torch.diag(cov).mean()
        off = (cov.sum() - torch.diag(cov).sum()) / (d * d - d)
        ones = torch.ones(d, d, dtype=cov.dtype)
        eye = torch.eye(d, dtype=cov.dtype)
        S = cov + alpha1 * v * eye + alpha2 * off * (ones - eye)
        if normalize:
            sd = torch.sqrt(torch.diag(S))
            S = S / torch.outer(sd, sd)
        diff = Xq - Xc.mean(0)
        out.append((diff * torch.linalg.solve(S, diff.T).T).sum(1))
    return torch.stack(out, 1)


@pytest.mark.parametrize("kw", [{"alpha1": 1.0, "alpha2": 0.0}, {"alpha1": 0.3, "alpha2": 0.7},
                                {"alpha1": 2.0, "alpha2": 0.0, "normalize": False},
                                {"alpha1": 1.0, "alpha2": 1.0, "tukey": 0.5, "l2": True}])
def test_fecam_distances_equal_a_dense_solve(kw):
    X, y = blobs(d=8, classes=(5, 2, 9), n=30)
    X = X.abs() if kw.get("tukey") else X
    Xq = blobs(seed=3, d=8, classes=(5, 2, 9), n=6)[0]
    Xq = Xq.abs() if kw.get("tukey") else Xq
    head = FeCAM(**kw).partial_fit(X, y)

    def transform(v):
        v = v.pow(kw["tukey"]) if kw.get("tukey") else v
        return v / v.norm(dim=1, keepdim=True) if kw.get("l2") else v

    classes = head.classes_.tolist()
    assert sorted(classes) == [2, 5, 9]
    dist = fecam_reference(X, y, Xq, classes, kw["alpha1"], kw["alpha2"], kw.get("normalize", True),
                           transform)
    assert rel(-2 * (head.decision_function(Xq) + math.log(3)), dist) <= 1e-9
    assert torch.equal(head.predict(Xq), torch.tensor(classes)[dist.argmin(1)])


def test_fecam_from_class_statistics_equals_streaming():
    X, y = blobs(d=5, classes=(1, 4), n=25)
    streamed = FeCAM(alpha1=0.5, tukey=0.5).partial_fit(X.abs(), y)
    stats = ClassGaussians(5, ddof=1).update(streamed.transform(X.abs()), y)
    direct = FeCAM(alpha1=0.5, tukey=0.5).fit(stats)
    Xq = blobs(seed=2, d=5, classes=(1, 4), n=5)[0].abs()
    assert rel(direct.decision_function(Xq), streamed.decision_function(Xq)) <= 1e-12
    # a later partial_fit copies the caller's statistics instead of changing them
    direct.partial_fit(Xq, torch.full((len(Xq),), 6))
    assert stats.classes == [1, 4] and direct.classes_.tolist() == [1, 4, 6]
    # low-rank statistics cannot take samples: a clear error, and the head is unchanged
    from gdacil import LowRankGaussians

    low = FeCAM(alpha1=0.5, tukey=0.5).fit(LowRankGaussians.from_dense(stats, rank=2))
    with pytest.raises(ValueError, match="fitted on LowRankGaussians, which cannot take new"):
        low.partial_fit(Xq, torch.full((len(Xq),), 6))
    assert low.classes_.tolist() == [1, 4]


def test_fecam_signed_tukey_on_negative_features_is_finite():
    X, y = blobs(d=6)  # about half the entries are negative
    assert (X < 0).float().mean() > 0.2
    head = FeCAM.preset("resnet").partial_fit(X, y)
    Z = head.transform(X)
    assert torch.allclose(Z, torch.sign(X) * X.abs().sqrt())
    assert torch.isfinite(head.decision_function(X)).all()
    assert head.score(X, y) > 0.8
    with pytest.raises(ValueError, match="log transform"):
        FeCAM(tukey=0.0).partial_fit(X, y)


def layer_norm_like(seed, n, d=16, classes=4):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, d, generator=torch.Generator().manual_seed(100), dtype=torch.float64)
    scales = torch.linspace(0.3, 2.0, d, dtype=torch.float64)  # unequal variances: D^{1/2} 1 is not 1
    y = torch.arange(classes).repeat_interleave(n)
    X = (centres[y] + 0.8 * torch.randn(len(y), d, generator=g, dtype=torch.float64)) * scales
    X = X - X.mean(1, keepdim=True)
    return X / X.std(1, keepdim=True), y


def test_fecam_equal_alphas_on_zero_sum_features_is_not_singular():
    X, y = layer_norm_like(0, 60)
    Xq, yq = layer_norm_like(1, 50)
    stats = ClassGaussians(16, ddof=1).update(X, y)
    R = fecam_covariances(stats.covariances(), 10.0, 10.0)
    eig = torch.linalg.eigvalsh(R)
    assert (eig[:, 0].abs() < 1e-12 * eig[:, -1]).all()  # the published matrix is singular
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no jitter escalation, no warnings
        head = FeCAM(alpha1=10.0, alpha2=10.0).partial_fit(X, y)
        scores = head.decision_function(Xq)
    # reference: pseudo-inverse of each singular matrix (what the head documents)
    ref = torch.stack([((Xq - mu) @ torch.linalg.pinv(Rc, hermitian=True, rtol=1e-10)
                        * (Xq - mu)).sum(1) for mu, Rc in zip(stats.means, R)], 1)
    assert rel(-2 * (scores + math.log(4)), ref) <= 1e-8
    diagonal_only = FeCAM(alpha1=10.0, alpha2=0.0).partial_fit(X, y).score(Xq, yq)
    assert head.score(Xq, yq) >= diagonal_only - 0.05 and diagonal_only > 0.6


def test_fecam_refuses_a_state_that_would_not_fit():
    X, y = blobs(d=6)
    with pytest.raises(ValueError, match="max_bytes"):
        FeCAM(max_bytes=1000).partial_fit(X, y)
    with pytest.raises(ValueError, match="max_bytes"):
        RanPAC(dim_out=500, max_bytes=2**20).fit(X, y)


# ------------------------------------------------------------------ shared API
HEADS = [lambda: RanPAC(dim_out=40), lambda: ACIL(buffer_size=40), lambda: RBFLDA(dim_out=40),
         lambda: FeCAM.preset("vit")]


@pytest.mark.parametrize("make", HEADS)
def test_save_load_round_trip_gives_identical_predictions(make, tmp_path):
    tasks = three_tasks()
    head = make()
    for X, y in tasks[:2]:
        head.partial_fit(X, y)
    Xq = blobs(seed=9, d=6)[0]
    before = head.decision_function(Xq)
    head.save(tmp_path / "head.safetensors")
    back = type(head).load(tmp_path / "head.safetensors")
    assert torch.equal(back.decision_function(Xq), before)
    assert torch.equal(back.predict(Xq), head.predict(Xq))
    # both keep learning identically
    head.partial_fit(*tasks[2])
    back.partial_fit(*tasks[2])
    assert torch.equal(back.predict(Xq), head.predict(Xq))
    if isinstance(head, MappedLinearHead):
        assert type(MappedLinearHead.load(tmp_path / "head.safetensors")) is type(head)


@pytest.mark.parametrize("make", HEADS)
def test_bad_inputs_are_refused_with_clear_errors(make):
    X, y = blobs(d=6)
    head = make()
    with pytest.raises(NotFittedError, match="not fitted"):
        head.predict(X)
    head.partial_fit(X, y)
    with pytest.raises(ValueError, match="dimension 3, expected 6"):
        head.predict(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="NaN or inf"):
        head.decision_function(torch.full((2, 6), float("nan")))
    with pytest.raises(ValueError, match="NaN or inf"):
        head.partial_fit(torch.full((2, 6), float("inf")), [0, 1])
    with pytest.raises(ValueError, match="must be integers"):
        head.partial_fit(X[:2], [0.5, 1.5])
    with pytest.raises(ValueError, match="length 3 but there are 2"):
        head.partial_fit(X[:2], [0, 1, 2])
    proba = head.predict_proba(X[:5])
    assert torch.allclose(proba.sum(1), torch.ones(5, dtype=proba.dtype))
    assert head.memory_report()["total"] > 0
    assert head.score(X, y) > 0.8


@pytest.mark.parametrize("make", [lambda **kw: RanPAC(dim_out=40, **kw),
                                  lambda **kw: RBFLDA(dim_out=40, **kw),
                                  lambda **kw: FeCAM(**kw)])
def test_float32_prediction_is_close_to_float64(make):
    X, y = blobs(d=6)
    a, b = make(dtype=torch.float32).partial_fit(X, y), make().partial_fit(X, y)
    assert a.decision_function(X).dtype == torch.float32
    assert torch.allclose(a.predict_proba(X).double(), b.predict_proba(X), atol=1e-4)


def test_mapped_heads_build_from_statistics():
    X, y = blobs(d=5, classes=(3, 1, 6))
    Xq = blobs(seed=4, d=5, classes=(3, 1, 6), n=6)[0]
    ridge = RanPAC(dim_out=0, lam=0.5)
    from_stats = ridge.fit_stats(ClassGaussians(5).update(X, y))
    assert rel(from_stats.decision_function(Xq), RanPAC(dim_out=0, lam=0.5).fit(X, y)
               .decision_function(Xq)) <= 1e-10
    streamed = RBFLDA(dim_out=30, bandwidth=2.0, seed=1).fit(X, y)
    fmap = RandomFourier(5, 30, bandwidth=2.0, seed=1)
    built = RBFLDA(dim_out=30, bandwidth=2.0, seed=1).fit_stats(PooledGaussians(30).update(fmap(X), y),
                                                                 feature_map=fmap)
    assert rel(built.decision_function(Xq), streamed.decision_function(Xq)) <= 1e-10
    with pytest.raises(ValueError, match="is not the map of"):
        RBFLDA(dim_out=30, seed=2).fit_stats(PooledGaussians(30).update(fmap(X), y), feature_map=fmap)
    with pytest.raises(ValueError, match="pass the feature_map"):
        RBFLDA(dim_out=30).fit_stats(PooledGaussians(30).update(fmap(X), y))
    with pytest.raises(ValueError, match="lam='auto'"):
        RanPAC(dim_out=0).fit_stats(ClassGaussians(5).update(X, y))


def test_fecam_rebuilds_only_the_classes_that_changed(monkeypatch):
    import gdacil.heads.fecam as fecam_module

    tasks = three_tasks()
    head = FeCAM(alpha1=0.5, alpha2=0.2)
    seen = []
    original = fecam_module.inverse_factors
    monkeypatch.setattr(fecam_module, "inverse_factors", lambda R, rcond: seen.append(len(R))
                        or original(R, rcond))
    for X, y in tasks:
        head.partial_fit(X, y)
        head.predict(X[:2])
    assert seen == [3, 2, 2]  # each task's new classes only
    head.partial_fit(tasks[0][0][:5], tasks[0][1][:5])  # more samples of one old class
    Xq = blobs(seed=9, d=6)[0]
    scores = head.decision_function(Xq)
    assert seen[-1] == 1
    fresh = FeCAM(alpha1=0.5, alpha2=0.2).fit(head.stats_)
    assert rel(scores, fresh.decision_function(Xq)) <= 1e-12


class TestFeCAMHeadContract(HeadContract):
    """FeCAM through the contract every GaussianHead passes (built from ClassGaussians); its
    state is its statistics, from which it rebuilds its rows."""

    exact_scores = True
    state_is_nested = True

    def make_head(self, **kw):
        return FeCAM(alpha1=0.5, alpha2=0.1, **kw)

    def reference(self, stats, X):
        out = []
        for mu, cov, n in zip(stats.means, stats.covariances(), stats.counts):
            d = cov.shape[0]
            if n < 2:
                R = torch.eye(d, dtype=torch.float64)
            else:
                v, off = torch.diag(cov).mean(), (cov.sum() - torch.diag(cov).sum()) / (d * d - d)
                eye = torch.eye(d, dtype=torch.float64)
                S = cov + 0.5 * v * eye + 0.1 * off * (torch.ones_like(eye) - eye)
                sd = torch.sqrt(torch.diag(S))
                R = S / torch.outer(sd, sd)
            diff = X - mu
            out.append(-0.5 * (diff * torch.linalg.solve(R, diff.T).T).sum(1))
        return torch.stack(out, 1) - math.log(stats.n_classes)


def test_fecam_refit_on_edited_statistics_rebuilds_only_the_edited_classes(monkeypatch):
    import gdacil.heads.fecam as fecam_module

    X, y = blobs(d=5, classes=(1, 2, 3, 4))
    stats = ClassGaussians(5, ddof=1).update(X, y)
    head = FeCAM(alpha1=0.5).fit(stats)
    head.predict(X[:2])
    seen = []
    original = fecam_module.inverse_factors
    monkeypatch.setattr(fecam_module, "inverse_factors", lambda R, rcond: seen.append(len(R))
                        or original(R, rcond))
    moved = stats.with_moments([3], stats.means[2:3] + 1.0, 2.0 * stats.covariances([3]))
    scores = head.fit(moved).decision_function(X)
    assert seen == [1]
    assert rel(scores, FeCAM(alpha1=0.5).fit(moved.copy()).decision_function(X)) <= 1e-12


def test_ranpac_lambda_benchmark_runs_and_agrees(tmp_path, capsys):
    import json

    from gdacil.bench import ranpac_lambda

    out = tmp_path / "rl.json"
    assert ranpac_lambda.main(["--dim-out", "60", "--samples", "150", "--dim-in", "16",
                               "--task-classes", "5", "--seen-classes", "8", "--dense-solves", "17",
                               "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    float64 = next(p for p in result["paper"] if p["dtype"] == "float64")
    assert not float64["extrapolated"] and float64["lam"] == result["fast"]["lam"]
    assert max(d for lam, d in zip(float64["grid"], float64["rel_diff_vs_fast"]) if lam >= 1e-4) < 1e-8
    assert "speedup" in capsys.readouterr().out
