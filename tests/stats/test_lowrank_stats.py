"""LowRankGaussians against dense ClassGaussians references."""

import json
from pathlib import Path

import pytest
import torch

from gdacil import ClassGaussians, ClassStatistics, LowRankGaussians
from gdacil.cil import run_experiment
from gdacil.drift import SDC, HopDC, LinearSLDC
from gdacil.heads import LDA, LRRGDA, NCM, RGDA, SGDHead
from gdacil.io import load_tensors

from _assets import needs_transformers
from test_runner import TRACKS, adapting_config, color_folder, vit_config


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def dense_stats(n_classes=6, d=12, n=60, seed=0, first_label=0, ddof=0):
    """Classes with decaying spectra (a few strong directions) and distinct means."""
    g = torch.Generator().manual_seed(seed)
    stats = ClassGaussians(d, ddof=ddof)
    scales = torch.logspace(0, -1.5, d, dtype=torch.float64)
    for c in range(first_label, first_label + n_classes):
        Q = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
        X = torch.randn(n, d, generator=g, dtype=torch.float64) * scales @ Q.T
        stats.update(X + 3 * torch.randn(d, generator=g, dtype=torch.float64), [c] * n)
    return stats


def queries(d, n=40, seed=1):
    return 2 * torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------ compression
@pytest.mark.parametrize("ddof", [0, 1])
def test_full_rank_reconstruction_is_the_dense_covariance(ddof):
    dense = dense_stats(ddof=ddof)
    low = LowRankGaussians.from_dense(dense, rank=dense.dim, batch_size=4)
    assert low.classes == dense.classes and low.ddof == ddof
    assert torch.equal(low.counts, dense.counts) and torch.equal(low.means, dense.means)
    assert rel_err(low.covariances(), dense.covariances()) < 1e-12
    assert torch.equal(low.residual_variances, torch.zeros(dense.n_classes, dtype=torch.float64))
    s = low.eigenvalues
    assert (s[:, :-1] >= s[:, 1:]).all()                  # descending
    U = low.eigenvectors
    eye = torch.eye(dense.dim, dtype=torch.float64)
    assert (U.transpose(1, 2) @ U - eye).abs().max() < 1e-12


@pytest.mark.parametrize("decomposition", ["eigh", "randomized"])
def test_truncated_model_keeps_the_top_eigenpairs_and_the_trace(decomposition):
    dense = dense_stats(d=20)
    q = 5
    low = LowRankGaussians.from_dense(dense, q, decomposition=decomposition, oversample=4, n_iter=3)
    s_true, U_true = torch.linalg.eigh(dense.covariances())
    s_true, U_true = s_true.flip(-1), U_true.flip(-1)
    tol = 1e-12 if decomposition == "eigh" else 1e-6
    assert rel_err(low.eigenvalues, s_true[:, :q]) < tol
    # the same subspace: projectors agree (eigenvector signs are arbitrary)
    P_low = low.eigenvectors @ low.eigenvectors.transpose(1, 2)
    P_true = U_true[:, :, :q] @ U_true[:, :, :q].transpose(1, 2)
    assert (P_low - P_true).abs().max() < (1e-10 if decomposition == "eigh" else 1e-3)
    # isotropic residual: the mean of the discarded eigenvalues; the trace is kept
    assert rel_err(low.residual_variances, s_true[:, q:].mean(1)) < 1e-6
    traces = dense.covariances().diagonal(dim1=1, dim2=2).sum(1)
    tol = 1e-12 if decomposition == "eigh" else 1e-10   # randomized U: orthonormal to 1e-10
    assert rel_err(low.covariances().diagonal(dim1=1, dim2=2).sum(1), traces) < tol


def test_randomized_compression_does_not_depend_on_batching_or_order():
    dense = dense_stats(d=20)
    kw = {"decomposition": "randomized", "oversample": 2, "n_iter": 1, "seed": 3}
    a = LowRankGaussians.from_dense(dense, 4, batch_size=32, **kw)
    b = LowRankGaussians.from_dense(dense.subset(dense.classes[::-1]), 4, batch_size=1, **kw)
    pos = b.positions(a.classes)
    assert torch.allclose(b.eigenvectors[pos], a.eigenvectors, rtol=0, atol=1e-12)
    assert torch.allclose(b.eigenvalues[pos], a.eigenvalues, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ heads
@pytest.mark.parametrize("q,r", [(8, 8), (12, 5), (12, 12)])
def test_lrrgda_on_stored_eigenpairs_equals_lrrgda_on_dense_statistics(q, r):
    dense = dense_stats()
    low = LowRankGaussians.from_dense(dense, q)
    X = queries(dense.dim)
    ref = LRRGDA(rank=r, decomposition="eigh").fit(dense)
    head = LRRGDA(rank=r).fit(low)                        # decomposition is not used
    assert head.n_decomposed_ == 0
    assert rel_err(head.decision_function(X), ref.decision_function(X)) < 1e-8
    # the head's eigenpair cache holds views of the statistics' storage, not copies
    storage = low.eigenvectors.untyped_storage().data_ptr()
    assert all(u.untyped_storage().data_ptr() == storage for _, u, _ in head._eig_cache.values())
    # after compensation-like edits the head follows the statistics
    low.set_moments([0], low.means[:1] + 1.0)
    assert rel_err(head.fit(low).decision_function(X),
                   ref.fit(dense.with_moments([0], dense.means[:1] + 1.0))
                   .decision_function(X)) < 1e-8


def test_lrrgda_on_float32_eigenvectors_is_close():
    dense = dense_stats()
    low = LowRankGaussians.from_dense(dense, 6, dtype=torch.float32)
    assert low.eigenvectors.dtype == torch.float32
    X = queries(dense.dim)
    ref = LRRGDA(rank=6, decomposition="eigh").fit(dense).decision_function(X)
    assert rel_err(LRRGDA(rank=6).fit(low).decision_function(X), ref) < 1e-5


def test_lrrgda_rank_above_the_stored_rank_is_a_clear_error():
    low = LowRankGaussians.from_dense(dense_stats(), 4)
    with pytest.raises(ValueError, match="rank 5 exceeds the rank q = 4"):
        LRRGDA(rank=5).fit(low)


def rgda_reference(stats, X, alphas=(0.1, 2.0, 0.6)):
    """RGDA log-posteriors (up to a per-sample constant) by a direct solve per class."""
    avg, eye = stats.average_covariance(), torch.eye(stats.dim, dtype=torch.float64)
    dof = float(stats.counts.sum()) - stats.n_classes
    eye = eye * avg.trace() / dof  # the default identity term is in units of tr(avg) / (N - C)
    scores = []
    for mu, cov in zip(stats.means, stats.covariances()):
        S = alphas[0] * cov + alphas[1] * avg + alphas[2] * eye
        diff = X - mu
        maha = (diff * torch.linalg.solve(S, diff.T).T).sum(1)
        scores.append(-0.5 * maha - 0.5 * torch.logdet(S))
    return torch.stack(scores, 1) - torch.log(torch.tensor(float(stats.n_classes)))


def test_every_head_fits_low_rank_statistics():
    dense = dense_stats()
    low = LowRankGaussians.from_dense(dense, 4)
    X = queries(dense.dim)
    # NCM needs the means, LDA the average covariance: both exact, so both equal the dense heads
    for make in (NCM, lambda: LDA(shrinkage=0.2)):
        a, b = make().fit(low), make().fit(dense)
        assert rel_err(a.decision_function(X), b.decision_function(X)) < 1e-10
    # RGDA: the modelled class covariances around the exact average covariance
    assert rel_err(RGDA().fit(low).decision_function(X), rgda_reference(low, X)) < 1e-8
    sgd = {"base_steps": 60, "steps_per_class": 0, "samples_per_class": 32, "resample_every": 20}
    a = SGDHead(**sgd).fit(low).decision_function(X)
    assert torch.equal(a, SGDHead(**sgd).fit(low).decision_function(X))
    assert torch.isfinite(a).all()


# ------------------------------------------------------------------ average covariance
@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)])
def test_average_covariance_is_exact_after_merges_in_any_order(order):
    shards = [dense_stats(n_classes=3, d=10, seed=s, first_label=10 * s) for s in range(4)]
    whole = ClassGaussians(10)
    for shard in shards:
        whole.merge(shard)
    low = LowRankGaussians(10, 2)
    for i in order:
        if i % 2:   # dense shards are compressed by merge; others arrive already compressed
            low.merge(shards[i])
        else:
            low.merge(LowRankGaussians.from_dense(shards[i], 2 + i, batch_size=2))
    assert sorted(low.classes) == sorted(whole.classes)
    assert rel_err(low.average_covariance(), whole.average_covariance()) < 1e-12
    # the truncated higher-rank shards kept their traces
    traces = whole.covariances(low.classes).diagonal(dim1=1, dim2=2).sum(1)
    assert rel_err(low.covariances().diagonal(dim1=1, dim2=2).sum(1), traces) < 1e-12


def test_replacing_and_removing_classes_update_the_sum_with_the_model():
    dense = dense_stats(d=10)
    low = LowRankGaussians.from_dense(dense, 3)
    C = low.n_classes
    total = low.average_covariance() * C
    new = dense.covariances([1, 2]) * 2.0
    old_model = low.covariances([1, 2])
    low.set_moments([1, 2], low.means[[1, 2]], new)
    expected = total - old_model.sum(0) + new.sum(0)
    assert rel_err(low.average_covariance() * C, expected) < 1e-12
    # the trace of the sum stays exact: the model keeps every trace
    exact = dense.with_moments([1, 2], dense.means[[1, 2]], new).average_covariance()
    assert abs(float(low.average_covariance().trace() - exact.trace())) < 1e-12 * float(exact.trace())
    total = low.average_covariance() * C
    dropped = low.covariances([0, 4])
    low.remove_classes([0, 4])
    assert rel_err(low.average_covariance() * (C - 2), total - dropped.sum(0)) < 1e-12
    low.remove_classes(low.classes)
    assert torch.equal(low._covariance_sum, torch.zeros(10, 10, dtype=torch.float64))
    # with q = d every operation is exact
    full = LowRankGaussians.from_dense(dense, dense.dim)
    full.set_moments([1], full.means[[1]], new[:1]).remove_classes([3])
    ref = dense.with_moments([1], dense.means[[1]], new[:1])
    ref.remove_classes([3])
    assert rel_err(full.average_covariance(), ref.average_covariance()) < 1e-12


# ------------------------------------------------------------------ sampling
def test_sampling_is_seeded_and_matches_the_low_rank_model():
    dense = dense_stats(n_classes=2, d=6, n=200)
    low = LowRankGaussians.from_dense(dense, 2)
    a, la = low.sample(40000, generator=torch.Generator().manual_seed(5))
    b, lb = low.sample(40000, generator=torch.Generator().manual_seed(5), batch_size=1,
                       factors=low.sampling_factors())
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, low.sample(40000, generator=torch.Generator().manual_seed(6))[0])
    for c in low.classes:
        Xc = a[la == c]
        model = low.covariance(c)
        emp = torch.cov(Xc.T, correction=0)
        assert (Xc.mean(0) - low.means[low.positions([c])[0]]).abs().max() < 0.02
        assert rel_err(emp, model) < 0.05
        assert abs(float(emp.trace() / dense.covariance(c).trace()) - 1) < 0.02   # trace kept
    # jitter adds to every direction
    X, _ = low.sample(40000, generator=torch.Generator().manual_seed(1), labels=[0], jitter=0.5)
    eye = torch.eye(6, dtype=torch.float64)
    assert rel_err(torch.cov(X.T, correction=0), low.covariance(0) + 0.5 * eye) < 0.05


def test_full_rank_sampling_with_shared_noise_has_exactly_the_dense_moments():
    from gdacil.drift.pseudo import standard_noise

    dense = dense_stats(n_classes=3, d=5)
    low = LowRankGaussians.from_dense(dense, 5)
    E = standard_noise(50, 5, torch.Generator().manual_seed(0), match_moments=True)
    X, y = low.sample(50, generator=torch.Generator(), noise=E)
    for c in low.classes:
        Xc = X[y == c]
        assert rel_err(Xc.mean(0), dense.means[dense.positions([c])[0]]) < 1e-12
        assert rel_err(torch.cov(Xc.T, correction=0), dense.covariance(c)) < 1e-10
    with pytest.raises(TypeError, match="LowRankFactors"):
        low.sample(5, generator=torch.Generator(), factors=dense.sampling_factors())
    with pytest.raises(TypeError, match="Generator"):
        low.sample(5, generator=None)


# ------------------------------------------------------------------ memory and files
def test_memory_report_equals_the_tensor_sizes():
    d, q, C = 768, 64, 1000
    low = LowRankGaussians(d, q, dtype=torch.float32).reserve(C)
    report = low.memory_report()
    assert report["eigenvectors"] == C * d * q * 4
    assert report == {"counts": C * 8, "means": C * d * 8, "eigenvectors": C * d * q * 4,
                      "eigenvalues": C * q * 8, "residual_variances": C * 8,
                      "covariance_sum": d * d * 8, "total": report["total"]}
    assert report["total"] == sum(v for k, v in report.items() if k != "total") == low.nbytes
    # appending within the reserved capacity allocates nothing
    small = dense_stats(n_classes=2, d=d, n=80)
    low.merge(small)
    assert low.memory_report() == report and low.capacity == C
    # without a reservation the capacity grows by a quarter (8, 10, 13, ...), not double
    grown = LowRankGaussians(16, 4)
    for c in range(12):
        grown.add_classes([c], torch.zeros(1, 16), torch.eye(16)[None], [10])
    assert grown.n_classes == 12 and grown.capacity == 13
    assert grown.memory_report()["eigenvectors"] == 13 * 16 * 4 * 8


def test_save_load_round_trip(tmp_path):
    dense = dense_stats()
    low = LowRankGaussians.from_dense(dense, 4, dtype=torch.float32, decomposition="randomized",
                                      oversample=3, seed=5)
    path = tmp_path / "low.safetensors"
    low.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["low.safetensors"]
    for loader in (LowRankGaussians.load, ClassStatistics.load):
        back = loader(path)
        assert isinstance(back, LowRankGaussians)
        assert back._config() == low._config() and back.classes == low.classes
        for name in ("counts", "means", "eigenvectors", "eigenvalues", "residual_variances"):
            assert torch.equal(getattr(back, name), getattr(low, name)), name
        assert torch.equal(back.average_covariance(), low.average_covariance())
    _, meta = load_tensors(path)
    assert json.loads(json.dumps(meta))["format"] == "gdacil.LowRankGaussians/1"
    with pytest.raises(ValueError, match="not a ClassGaussians file"):
        ClassGaussians.load(path)
    dense.save(tmp_path / "dense.safetensors")
    assert isinstance(ClassStatistics.load(tmp_path / "dense.safetensors"), ClassGaussians)
    with pytest.raises(ValueError, match="not a LowRankGaussians file"):
        LowRankGaussians.load(tmp_path / "dense.safetensors")


def test_copy_subset_and_to_keep_the_type_and_the_storage_settings():
    low = LowRankGaussians.from_dense(dense_stats(), 3, dtype=torch.float32)
    for other in (low.copy(), low.to("cpu"), low.subset([4, 1])):
        assert isinstance(other, LowRankGaussians) and other._config() == low._config()
    sub = low.subset([4, 1])
    assert sub.classes == [4, 1]
    assert torch.equal(sub.eigenvectors[0], low.eigenvectors[low.positions([4])[0]])
    assert sub.revision(4) == low.revision(4)
    U, s = low.eigenpairs([1, 4], rank=2)
    assert U.shape == (2, 12, 2) and s.shape == (2, 2)


# ------------------------------------------------------------------ errors
def test_bad_input_is_refused():
    dense = dense_stats(d=6)
    with pytest.raises(ValueError, match="rank 7 exceeds the feature dimension 6"):
        LowRankGaussians(6, 7)
    with pytest.raises(ValueError, match="rank 7 exceeds the feature dimension 6"):
        LowRankGaussians.from_dense(dense, 7)
    with pytest.raises(ValueError, match="dtype must be a torch dtype or its name, one of 'float64', 'float32'"):
        LowRankGaussians(6, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="decomposition"):
        LowRankGaussians(6, 2, decomposition="svd")
    low = LowRankGaussians.from_dense(dense, 2)
    with pytest.raises(ValueError, match=r"classes \[0, 1, 2, 3, 4, 5\] are already present"):
        low.merge(dense)
    with pytest.raises(ValueError, match="already present"):
        low.add_classes([3], torch.zeros(1, 6), torch.eye(6)[None], [5])
    with pytest.raises(ValueError, match="NaN"):
        low.add_classes([9], torch.zeros(1, 6), torch.full((1, 6, 6), float("nan")), [5])
    with pytest.raises(ValueError, match="NaN"):
        low.set_moments([0], low.means[:1], torch.full((1, 6, 6), float("nan")))
    with pytest.raises(ValueError, match="NaN or inf"):
        low.set_moments([0], torch.full((1, 6), float("nan")))
    with pytest.raises(KeyError, match="unknown class 99"):
        low.covariance(99)
    with pytest.raises(KeyError, match="unknown class 99"):
        low.set_moments([99], torch.zeros(1, 6))
    with pytest.raises(ValueError, match="rank 3 exceeds the 2 eigenpairs"):
        low.eigenpairs(rank=3)
    with pytest.raises(ValueError, match="ddof=1 into ddof=0"):
        low.merge(dense_stats(d=6, first_label=50, ddof=1))
    with pytest.raises(ValueError, match="rank-1 statistics into rank-2"):
        low.merge(LowRankGaussians.from_dense(dense_stats(d=6, first_label=50), 1))
    with pytest.raises(TypeError, match="from_dense expects ClassGaussians"):
        LowRankGaussians.from_dense(low, 2)
    with pytest.raises(TypeError, match="can only merge ClassGaussians"):
        dense.merge(low)
    assert low.classes == dense.classes        # nothing above changed the statistics
    with pytest.raises(ValueError, match="no classes"):
        LowRankGaussians(6, 2).average_covariance()


# ------------------------------------------------------------------ drift compensators
def anchors(d, n=200, seed=4):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_compensators_return_low_rank_statistics():
    dense = dense_stats()
    low = LowRankGaussians.from_dense(dense, 4)
    old = anchors(dense.dim)
    A = torch.eye(dense.dim, dtype=torch.float64) + 0.1 * anchors(dense.dim, dense.dim, seed=7)
    comps = {"hopdc": HopDC(topk=20, n_samples=64), "sdc": SDC(),
             "sldc_linear": LinearSLDC(gamma=0.0, normalize=False, shrink=False)}
    for name, comp in comps.items():
        out = comp.fit(old, old @ A + 0.3).transform(low, labels=[0, 2, 3])
        assert isinstance(out, LowRankGaussians) and out._config() == low._config(), name
        assert out.classes == low.classes
        assert torch.equal(out.means[1], low.means[1]) and torch.equal(
            out.eigenvectors[1], low.eigenvectors[1])          # untouched class
        assert not torch.equal(out.means[0], low.means[0]), name
        assert torch.isfinite(out.covariances()).all() and out.eigenvalues.min() >= 0
        # the input is not modified
        assert torch.equal(low.means, LowRankGaussians.from_dense(dense, 4).means)


def test_compensators_on_full_rank_statistics_equal_their_dense_results():
    dense = dense_stats(d=8)
    low = LowRankGaussians.from_dense(dense, 8)
    old = anchors(8)
    A = torch.eye(8, dtype=torch.float64) + 0.1 * anchors(8, 8, seed=7)
    sldc = LinearSLDC(gamma=0.0, normalize=False, shrink=False).fit(old, old @ A)
    a, b = sldc.transform(low), sldc.transform(dense)
    assert rel_err(a.means, b.means) < 1e-12
    assert rel_err(a.covariances(), b.covariances()) < 1e-10
    assert rel_err(a.average_covariance(), b.average_covariance()) < 1e-10
    # HopDC on a translation with matched moments reproduces the moments exactly
    hop = HopDC(topk=20, n_samples=64, match_moments=True, dtype="float64", linear=False)
    hop.fit(old, old + 0.5)
    out = hop.transform(low)
    assert rel_err(out.means, low.means + 0.5) < 1e-12
    assert rel_err(out.covariances(), low.covariances()) < 1e-10


# ------------------------------------------------------------------ runner
def test_statistics_config_is_validated_and_dense_keeps_its_fingerprint():
    from gdacil.cil.config import ConfigError, ExperimentConfig, config_from_dict
    from gdacil.cil.runner import experiment_fingerprint

    base = experiment_fingerprint(ExperimentConfig())
    dense = config_from_dict(ExperimentConfig, {"statistics": {"storage": "dense", "rank": 7}})
    assert experiment_fingerprint(dense) == base      # runs before this option resume unchanged
    low = config_from_dict(ExperimentConfig, {"statistics": {"storage": "lowrank", "rank": 64}})
    assert experiment_fingerprint(low) != base
    for bad, match in [({"storage": "sparse"}, "statistics: unknown storage"),
                       ({"rank": 0}, "statistics: rank must be"),
                       ({"dtype": "float16"}, "statistics: unknown dtype"),
                       ({"decomposition": "svd"}, "statistics: unknown decomposition"),
                       ({"q": 3}, "unknown key")]:
        with pytest.raises(ConfigError, match=match):
            config_from_dict(ExperimentConfig, {"statistics": bad})
    with pytest.raises(ConfigError, match="rank = 64 exceeds the feature dimension 32"):
        low.statistics.empty(32, 0)


@needs_transformers
def test_runner_with_full_rank_low_rank_statistics_reproduces_the_dense_run(tmp_path):
    color_folder(tmp_path / "images")
    heads = {"ncm": {}, "lda": {"shrinkage": 0.5}, "lr_rgda": {"rank": 4, "decomposition": "eigh"}}
    dense = run_experiment(vit_config(tmp_path, out="dense", heads=heads), log=lambda *_: None)
    low = run_experiment(vit_config(tmp_path, out="low", heads=heads,
                                    statistics={"storage": "lowrank", "rank": 32}),
                         log=lambda *_: None)
    for head in heads:
        assert low["seeds"]["3"][head] == dense["seeds"]["3"][head], head


@needs_transformers
def test_runner_with_low_rank_tracks_compensates_checkpoints_and_resumes(tmp_path):
    color_folder(tmp_path / "images")
    statistics = {"storage": "lowrank", "rank": 4, "dtype": "float32"}
    # fp32 pinned, as "auto" would tie the resume identity to the CPU (bf16: test_runner.py)
    full = run_experiment(adapting_config(tmp_path, "full", "fp32", statistics=statistics),
                          log=lambda *_: None)
    assert set(full["seeds"]["3"]) == {f"{t}/{h}" for t in TRACKS for h in ("ncm", "lda", "lr_rgda")}

    def kill(seed, t):
        if t == 1:
            raise KeyboardInterrupt

    cfg = adapting_config(tmp_path, "killed", "fp32", statistics=statistics)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, log=lambda *_: None, on_task_end=kill)
    saved = ClassStatistics.load(tmp_path / "killed" / "seed_3" / "stats_task2_hopdc.safetensors")
    assert isinstance(saved, LowRankGaussians) and saved.rank == 4
    assert saved.eigenvectors.dtype == torch.float32 and saved.n_classes == 3
    assert run_experiment(cfg, resume=True, log=lambda *_: None) == full


def test_float32_decomposition_gives_the_float64_model_to_float32_accuracy():
    g = torch.Generator().manual_seed(5)
    X = torch.randn(600, 40, generator=g, dtype=torch.float64) @ torch.randn(40, 40, generator=g,
                                                                              dtype=torch.float64)
    dense = ClassGaussians(40).update(X, torch.arange(600) % 6)
    exact = LowRankGaussians.from_dense(dense, 8)
    fast = LowRankGaussians.from_dense(dense, 8, decomposition_dtype="float32")
    U = fast.eigenvectors
    assert fast.eigenvectors.dtype == torch.float64        # storage dtype is separate
    assert (U.transpose(1, 2) @ U - torch.eye(8, dtype=torch.float64)).abs().max() < 1e-10
    ref = exact.covariances()
    err = (fast.covariances() - ref).norm(dim=(1, 2)) / ref.norm(dim=(1, 2))
    assert err.max() < 1e-5
    torch.testing.assert_close(fast.average_covariance(), exact.average_covariance())


def test_decomposition_dtype_is_saved_and_refused_with_the_randomized_decomposition(tmp_path):
    stats = LowRankGaussians(6, 2, decomposition_dtype="float32")
    stats.save(tmp_path / "s.safetensors")
    assert LowRankGaussians.load(tmp_path / "s.safetensors").decomposition_dtype == torch.float32
    with pytest.raises(ValueError, match="decomposition_dtype='float32' applies to "
                                         "decomposition='eigh'"):
        LowRankGaussians(6, 2, decomposition="randomized", decomposition_dtype="float32")


@pytest.mark.parametrize("decomposition", ["eigh", "randomized"])
def test_add_classes_refuses_an_indefinite_covariance_before_any_change(decomposition):
    """With ``eigh`` the smallest eigenvalue of the decomposition decides (no Cholesky); with
    ``randomized`` the Cholesky of check_covariances does: the same refusal either way."""
    stats = LowRankGaussians(5, 2, decomposition=decomposition)
    eye = torch.eye(5, dtype=torch.float64)
    stats.add_classes([0], torch.zeros(1, 5), eye[None], [10])
    before = stats.average_covariance().clone()
    bad = torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, -0.01], dtype=torch.float64))
    with pytest.raises(ValueError, match="covariance of class 4 is not positive semi-definite"):
        stats.add_classes([3, 4], torch.zeros(2, 5), torch.stack([eye, bad]), [10, 10])
    assert stats.classes == [0] and torch.equal(stats.average_covariance(), before)
    # within the tolerance (-1e-5 x trace) is round-off, accepted
    tiny = torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, -1e-6], dtype=torch.float64))
    stats.add_classes([4], torch.zeros(1, 5), tiny[None], [10])
    assert stats.classes == [0, 4]


def test_build_in_processes_equals_one_process():
    from gdacil.bench.scale import QUICK, SyntheticMoments
    from gdacil.stats.lowrank import build_in_processes

    moments, labels = SyntheticMoments(QUICK), list(range(5, 16))
    params = {"dim": QUICK.dim, "rank": QUICK.rank, "decomposition_dtype": "float32"}
    one = LowRankGaussians(**params).add_classes(labels, *moments(labels))
    two = build_in_processes(moments, labels, processes=3, block=2, **params)
    assert two.classes == labels and two.decomposition_dtype == torch.float32
    for name in ("counts", "means", "eigenvectors", "eigenvalues", "residual_variances"):
        assert torch.equal(getattr(two, name), getattr(one, name)), name
    avg = one.average_covariance()      # the sum is taken in another order: round-off
    torch.testing.assert_close(two.average_covariance(), avg, rtol=0,
                               atol=1e-14 * float(avg.abs().max()))


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (waiting for a parent to reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_build_in_processes_workers_stop_when_their_caller_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    markers, temp = tmp_path / "markers", tmp_path / "tmp"
    markers.mkdir()
    temp.mkdir()
    script = Path(__file__).parents[1] / "_slow_moments.py"
    caller = subprocess.Popen([sys.executable, str(script), str(markers)],
                              env={**os.environ, "TMPDIR": str(temp)})
    try:
        deadline = time.monotonic() + 120
        while len(list(markers.iterdir())) < 2:  # both workers are compressing
            assert caller.poll() is None and time.monotonic() < deadline, "workers never started"
            time.sleep(0.1)
        assert list(temp.glob("gdacil-build-*"))
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    workers = [int(p.name) for p in markers.iterdir()]
    deadline = time.monotonic() + 30
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_running, workers)), "orphaned workers kept running"
    assert not list(temp.glob("gdacil-build-*")), "orphaned workers left their files"
