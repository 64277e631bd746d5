"""Numeric faults (issue 13, items 2-4, 8 and 9): finite inputs that overflow a head's dtype,
batches that would make the statistics non-finite, invalid loaded or given statistics, lossy
label and feature conversions, and SGD training that diverges. Each must raise a clear error or
give the exact answer; none may pass silently (docs/reliability.md)."""

import re

import numpy as np
import pytest
import torch
from sklearn.base import clone

from gdacil import ClassGaussians, ClassStatistics, LowRankGaussians
from gdacil._validation import as_features, as_labels
from gdacil.heads import LDA, LRRGDA, NCM, RGDA, FeCAM, RanPAC, SGDHead
from gdacil.io import load_tensors, save_tensors
from gdacil.sklearn import LDAClassifier, NCMClassifier
from gdacil.stats import PooledGaussians


def offset_classes(d=384, n_classes=4, n=100, offset=20.0, seed=0):
    """Features of scale ``offset`` (all entries near it, like post-ReLU features), unit noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n_classes * n) % n_classes
    centres = offset + torch.randn(n_classes, d, generator=g, dtype=torch.float64)
    return centres[y] + torch.randn(len(y), d, generator=g, dtype=torch.float64), y


def small_stats(d=5, n_classes=3, n=30, seed=0, ddof=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n_classes * n) % n_classes
    X = 3.0 * torch.randn(n_classes, d, generator=g, dtype=torch.float64)[y] + \
        torch.randn(len(y), d, generator=g, dtype=torch.float64)
    return ClassGaussians(d, ddof=ddof).update(X, y), X, y


def snapshot(stats):
    """Everything a failed change must leave as it was."""
    state = {name: getattr(stats, name)[: stats.n_classes].clone() for name in stats._per_class}
    state.update({name: getattr(stats, name).clone() for name in stats._shared})
    return stats.classes, [stats.revision(c) for c in stats.classes], state


def assert_unchanged(stats, before):
    classes, revisions, state = before
    assert stats.classes == classes
    assert [stats.revision(c) for c in stats.classes] == revisions
    for name, value in state.items():
        now = getattr(stats, name)
        now = now[: stats.n_classes] if name in stats._per_class else now
        assert torch.equal(now, value), name


# ------------------------------------------------------------ scoring (item 3)
@pytest.mark.parametrize("head_class", [NCM, LDA])
def test_float16_head_on_features_of_scale_20_predicts_exactly_not_the_first_class(head_class):
    # |mu|^2 / 2 ~ 77,000 and mu . x ~ 154,000 overflow float16 (largest 65,504): the biases were
    # -inf, every score -inf or NaN, predict returned class 0 and the probabilities were NaN
    X, y = offset_classes()
    stats = ClassGaussians(X.shape[1]).update(X, y)
    reference = head_class().fit(stats)
    head = head_class(dtype=torch.float16).fit(stats)
    assert torch.isfinite(head.bias_).all() and torch.isfinite(head.rows_).all()
    assert torch.equal(head.predict(X), reference.predict(X))
    assert torch.equal(head.predict(X), y)
    scores = head.decision_function(X)
    assert scores.dtype == torch.float16 and torch.isfinite(scores).all()
    assert torch.equal(head.classes_[scores.argmax(1)], y)
    proba = head.predict_proba(X)
    assert torch.isfinite(proba).all()
    torch.testing.assert_close(proba.double(), reference.predict_proba(X), atol=2e-3, rtol=0)


def test_float32_scores_that_overflow_are_shifted_per_sample_exactly():
    # queries of magnitude 1e19: 1/2 ||x||^2 ~ 1e40 overflows float32 (the probabilities were NaN)
    X, y = offset_classes(d=32, offset=0.0)
    stats = ClassGaussians(32).update(X, y)
    head = NCM(dtype=torch.float32).fit(stats)
    Q = 1e19 * X[::7]
    scores = head.decision_function(Q)
    assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
    # mu_c . x - 1/2 ||mu_c||^2 in float64: the scores up to the per-sample -1/2 ||x||^2
    mu = stats.means
    exact = Q @ mu.T - 0.5 * (mu * mu).sum(1)
    shifted = exact - exact.amax(1, keepdim=True)
    torch.testing.assert_close(scores.double(), shifted, rtol=1e-5,
                               atol=1e-5 * float(shifted.abs().max()))
    assert torch.equal(head.predict(Q), head.classes_[exact.argmax(1)])
    assert torch.equal(head.predict(Q), y[::7])
    proba = head.predict_proba(Q)
    assert torch.isfinite(proba).all() and torch.allclose(proba.sum(1), torch.ones(len(Q)))


def test_parameters_beyond_the_dtype_are_refused_at_fit():
    # means of magnitude ~2e19 at d = 384: 1/2 ||mu||^2 ~ 8e40 and the differences between
    # classes too, so no constant shift fits float32: refuse, never predict class 0 for everyone
    X, y = offset_classes()
    stats = ClassGaussians(X.shape[1]).update(1e18 * X, y)
    with pytest.raises(ValueError, match=r"NCM: the head's parameters overflow torch.float32 .*dtype='float64'"):
        NCM(dtype=torch.float32).fit(stats)
    NCM().fit(stats)  # float64 is fine


def test_scores_that_are_nan_even_in_float64_raise_and_never_give_a_class():
    X, y = offset_classes(d=16)
    head = NCM().fit(ClassGaussians(16).update(X, y))
    Q = X[:4].clone()
    Q[2] *= 1e306          # finite, but mu . x overflows float64
    for method in ("predict", "decision_function", "predict_proba"):
        with pytest.raises(ValueError, match="NCM: the scores of sample 2 are NaN or inf even in "
                                             "float64"):
            getattr(head, method)(Q)


def test_lrrgda_top_k_falls_back_to_dense_scores_when_its_bounds_overflow():
    X, y = offset_classes(d=24, n_classes=6, n=40, offset=0.0)
    stats = ClassGaussians(24).update(X, y)
    head = LRRGDA(rank=8, dtype=torch.float32).fit(stats)
    Q = 1e19 * X[::11]       # x^T B^-1 x ~ 1e39 overflows the float32 bounds
    scores, labels = head.top_k(Q, k=2, screen_rank=2)    # pruned: 2 of 8 rows screen
    assert torch.isfinite(scores).all()
    dense = LRRGDA(rank=8).fit(stats).decision_function(Q)
    assert torch.equal(labels, head.classes_[dense.topk(2, dim=1).indices])


def test_mapped_head_scores_that_overflow_are_rescaled():
    X, y = offset_classes(d=8, offset=0.0)
    head = RanPAC(dim_out=32, lam=1.0, dtype=torch.float32).fit(X, y)
    Q = 3e37 * X[:20]          # ReLU features of magnitude ~1e38: products overflow float32
    scores = head.decision_function(Q)
    assert torch.isfinite(scores).all() and torch.isfinite(head.predict_proba(Q)).all()
    exact = head._scores64(Q)
    assert torch.equal(head.predict(Q), head.classes_[exact.argmax(1)])
    assert torch.equal(scores.argmax(1), exact.argmax(1))


def test_features_beyond_the_head_dtype_are_refused():
    X, y = offset_classes(d=8, offset=0.0)
    head = NCM(dtype=torch.float16).fit(ClassGaussians(8).update(X, y))
    with pytest.raises(ValueError, match=r"exceed the range of torch.float16.*row 1"):
        head.predict(torch.cat([X[:1], 1e5 * X[1:2]]))


# ------------------------------------------------- transactional statistics (item 4)
@pytest.mark.parametrize("label", [0, 9], ids=["known class", "new class"])
def test_update_that_would_overflow_the_scatter_is_refused_and_changes_nothing(label):
    stats, X, _ = small_stats()
    before = snapshot(stats)
    huge = 1e155 * torch.randn(4, X.shape[1], generator=torch.Generator().manual_seed(1),
                               dtype=torch.float64)
    with pytest.raises(ValueError, match=f"ClassGaussians.update: the statistics of class {label} "
                                         "would become NaN or inf.*nothing was changed"):
        stats.update(huge, [label] * 4)
    assert_unchanged(stats, before)


def test_merge_that_would_overflow_is_refused_and_changes_nothing():
    big = 1e308 * torch.eye(2, dtype=torch.float64)[None]
    a = ClassGaussians.from_moments([0], torch.zeros(1, 2), big, [1.0])
    b = ClassGaussians.from_moments([0], torch.ones(1, 2), big, [1.0])
    before = snapshot(a)
    with pytest.raises(ValueError, match="ClassGaussians.merge: the statistics of class 0"):
        a.merge(b)
    assert_unchanged(a, before)


def test_low_rank_merge_is_all_or_nothing():
    # the third block's covariance overflows the running float64 sum: the first two must go too
    big = 8e307 * torch.eye(3, dtype=torch.float64).expand(3, 3, 3)
    dense = ClassGaussians.from_moments([0, 1, 2], torch.zeros(3, 3), big, [1.0] * 3)
    low = LowRankGaussians(3, 3).add_classes([7], torch.zeros(1, 3), torch.eye(3)[None], [5.0])
    before = snapshot(low)
    with pytest.raises(ValueError, match=r"LowRankGaussians: the covariances of classes \[2\] "
                                         "would make the running covariance sum NaN or inf"):
        low.merge(dense, batch_size=1)
    assert_unchanged(low, before)
    with pytest.raises(ValueError, match=r"classes \[8, 9, 10\] would make .* NaN or inf"):
        low.add_classes([8, 9, 10], torch.zeros(3, 3), big, [1.0] * 3)
    assert_unchanged(low, before)
    with pytest.raises(ValueError, match="compressing the covariance of class 8 gave NaN or inf"):
        LowRankGaussians(3, 2).add_classes([8], torch.zeros(1, 3), big[:1], [1.0])  # trace: inf


def test_pooled_update_and_merge_that_would_overflow_are_refused_and_change_nothing():
    stats = PooledGaussians(3).update(torch.randn(10, 3, dtype=torch.float64), [0] * 5 + [1] * 5)
    before = {k: v.clone() for k, v in stats.state_dict().items()}
    with pytest.raises(ValueError, match="PooledGaussians.update: .*NaN or inf.*nothing was"):
        stats.update(1e155 * torch.tensor([[1.0, 2, 3], [-1, -2, -3]], dtype=torch.float64),
                     [0, 2])
    assert all(torch.equal(v, before[k]) for k, v in stats.state_dict().items())
    # a scatter near the float64 limit (1.6e308): merging it once fits, twice does not
    near = PooledGaussians(3).update(
        3e153 * torch.tensor([[1.0, 2, 3], [-1, -2, -3]], dtype=torch.float64), [5, 5])
    stats.merge(near)
    before = {k: v.clone() for k, v in stats.state_dict().items()}
    with pytest.raises(ValueError, match="PooledGaussians.merge: .*NaN or inf"):
        stats.merge(near)
    assert all(torch.equal(v, before[k]) for k, v in stats.state_dict().items())


def test_pooled_update_near_the_float64_limit_is_exact():
    # the cheap bound says "may overflow", so the scatter is built in a copy and checked: it fits
    X = torch.tensor([[3e153, 0.0], [-3e153, 0.0]], dtype=torch.float64)
    stats = PooledGaussians(2).update(X, [0, 0])
    assert stats.scatter[0, 0].item() == pytest.approx(1.8e307, rel=1e-12)
    assert torch.isfinite(stats.scatter).all()


# ---------------------------------------------- loaded and given statistics (items 2, 8)
def saved(stats, tmp_path, edit, name="stats.safetensors"):
    """Save ``stats``, edit its tensors or metadata with ``edit(tensors, meta)`` and write them
    back as a well-formed file (a valid checksum, if any): only the contents are wrong."""
    path = tmp_path / name
    stats.save(path)
    tensors, meta = load_tensors(path)
    tensors = {k: v.clone() for k, v in tensors.items()}
    edit(tensors, meta)
    save_tensors(path, tensors, meta)
    return path


def set_item(name, index, value):
    def edit(tensors, meta):
        tensors[name][index] = value
    return edit


def set_meta(key, value):
    def edit(tensors, meta):
        meta[key] = value
    return edit


def asymmetric(tensors, meta):
    tensors["scatters"][1, 0, 1] += 1e-3 * tensors["scatters"][1].abs().max()


def indefinite(tensors, meta):
    tensors["scatters"][2] = torch.diag(torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0],
                                                     dtype=torch.float64))


@pytest.mark.parametrize("edit, message", [
    (set_item("means", (1, 2), float("nan")), "the mean of class 1 contains NaN or inf"),
    (set_item("counts", 2, -30.0), "counts must be positive and finite; class 2 has count -30"),
    (set_item("counts", 0, float("inf")), "class 0 has count inf"),
    (set_item("scatters", (0, 1, 1), float("inf")), "scatter of class 0 contains NaN or inf"),
    (asymmetric, "scatter of class 1 is not symmetric"),
    (indefinite, "scatter of class 2 is not positive semi-definite"),
    (set_meta("ddof", 2), "ddof must be 0 or 1; got 2"),
    (set_meta("ddof", True), "ddof must be 0 or 1; got True"),
    (set_meta("ddof", 0.5), "ddof must be 0 or 1; got 0.5"),
    (set_item("labels", 1, 0), "repeated class labels"),
], ids=["nan mean", "negative count", "inf count", "inf scatter", "asymmetric", "not PSD",
        "ddof 2", "ddof true", "ddof 0.5", "repeated label"])
def test_loading_invalid_statistics_is_refused_naming_the_file_and_class(tmp_path, edit, message):
    stats, _, _ = small_stats()
    path = saved(stats, tmp_path, edit)
    for loader in (ClassGaussians.load, ClassStatistics.load):
        with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: .*{message}"):
            loader(path)


def test_a_loaded_count_at_or_below_ddof_needs_a_zero_scatter(tmp_path):
    stats, _, _ = small_stats(ddof=1)
    path = saved(stats, tmp_path, set_item("counts", 1, 1.0))
    with pytest.raises(ValueError, match=r"class 1 has count 1 <= ddof=1 but a non-zero scatter"):
        ClassGaussians.load(path)
    single = ClassGaussians(5, ddof=1).update(torch.ones(1, 5), [4])  # a legitimate singleton
    single.save(tmp_path / "single.safetensors")
    assert ClassGaussians.load(tmp_path / "single.safetensors").classes == [4]


def test_a_stats_file_with_a_nan_mean_no_longer_makes_every_head_predict_class_0(tmp_path):
    stats, X, _ = small_stats()
    path = saved(stats, tmp_path, set_item("means", (0, 0), float("nan")))
    with pytest.raises(ValueError, match="mean of class 0"):
        head = RGDA().fit(ClassStatistics.load(path))
        head.predict(X)


@pytest.mark.parametrize("edit, message", [
    (set_item("eigenvalues", (1, 0), float("nan")), "eigenvalues of class 1 contain NaN"),
    (set_item("eigenvalues", (2, 1), -1.0), "class 2 has a negative eigenvalue"),
    (set_item("residual_variances", 0, -1.0), "class 0 has a negative eigenvalue or residual"),
    (set_item("eigenvectors", (1, 0, 0), 5.0), "eigenvectors of class 1 are not orthonormal"),
    (set_item("covariance_sum", (0, 1), 7.0), "covariance sum is not symmetric"),
    (set_meta("ddof", 3), "ddof must be 0 or 1; got 3"),
    (set_meta("rank", 0), "invalid LowRankGaussians configuration"),
])
def test_loading_invalid_low_rank_statistics_is_refused(tmp_path, edit, message):
    stats, _, _ = small_stats()
    path = saved(LowRankGaussians.from_dense(stats, 2), tmp_path, edit)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: .*{message}"):
        ClassStatistics.load(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_valid_low_rank_files_load_in_either_storage_dtype(tmp_path, dtype):
    stats, _, _ = small_stats(d=40, n_classes=5, n=8)      # rank-deficient classes (n < d)
    low = LowRankGaussians.from_dense(stats, 6, dtype=dtype)
    low.remove_classes([1])      # the sum keeps a zero-trace compression error: not PSD, valid
    low.save(tmp_path / "low.safetensors")
    back = LowRankGaussians.load(tmp_path / "low.safetensors")
    assert back.classes == low.classes and torch.equal(back.eigenvectors, low.eigenvectors)


@pytest.mark.parametrize("edit, message", [
    (lambda t, m: t["scatter"].__setitem__((0, 1), t["scatter"][0, 1] + 1.0), "not symmetric"),
    (lambda t, m: t["scatter"].__setitem__((1, 1), -1.0), "negative variance"),
    (lambda t, m: t["scatter"].__setitem__((0, 1), 1e3) or t["scatter"].__setitem__((1, 0), 1e3),
     "not positive semi-definite"),
], ids=["asymmetric", "negative variance", "not PSD"])
def test_loading_an_invalid_pooled_scatter_is_refused(tmp_path, edit, message):
    stats = PooledGaussians(3).update(torch.randn(20, 3, dtype=torch.float64), [0] * 10 + [1] * 10)
    path = saved(stats, tmp_path, edit)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: the pooled scatter .*{message}"):
        PooledGaussians.load(path)


def test_fecam_load_validates_its_statistics(tmp_path):
    _, X, y = small_stats()
    head = FeCAM().partial_fit(X, y)
    path = tmp_path / "fecam.safetensors"
    head.save(path)
    tensors, meta = load_tensors(path)
    tensors = {k: v.clone() for k, v in tensors.items()}
    tensors["stats.scatters"][0] = -tensors["stats.scatters"][0]
    save_tensors(path, tensors, meta)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: scatter of class 0 is not positive semi-"):
        FeCAM.load(path)


def test_from_moments_refuses_what_it_cannot_hold_and_accepts_float32_round_off():
    eye = torch.eye(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="covariance of class 5 is not positive semi-definite"):
        ClassGaussians.from_moments([4, 5], torch.zeros(2, 3), torch.stack([eye, -eye]), [9, 9])
    with pytest.raises(ValueError, match="covariance of class 4 is not symmetric"):
        ClassGaussians.from_moments([4], torch.zeros(1, 3), (eye + torch.triu(eye.roll(1, 1)))[None],
                                    [9])
    # count <= ddof: the covariance used to be dropped silently
    with pytest.raises(ValueError, match=r"class 7 has count 1 <= ddof=1.*non-zero covariance"):
        ClassGaussians.from_moments([6, 7], torch.zeros(2, 3), torch.stack([eye, eye]), [5, 1],
                                    ddof=1)
    ok = ClassGaussians.from_moments([6, 7], torch.zeros(2, 3), torch.stack([eye, 0 * eye]), [5, 1],
                                     ddof=1)
    assert torch.equal(ok.covariance(7), 0 * eye)
    with pytest.raises(ValueError, match="class 6 has count -2"):
        ClassGaussians.from_moments([6], torch.zeros(1, 3), eye[None], [-2])
    # float32 covariances of rank-deficient classes (n < d): eigenvalues of -1e-9 of the trace
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(6, 5, 48, generator=g) * torch.logspace(0, -3, 48) + 2.0
    covs = torch.stack([torch.cov(z.T, correction=0) for z in Z])       # float32 throughout
    assert (torch.linalg.eigvalsh(covs.double()).amin(1) < 0).any()    # round-off, as expected
    stats = ClassGaussians.from_moments(list(range(6)), Z.mean(1), covs.double(), [5] * 6)
    assert stats.n_classes == 6
    LowRankGaussians(48, 4).add_classes(list(range(6)), Z.mean(1), covs.double(), [5] * 6)


# ------------------------------------------------------- labels and features (item 8)
@pytest.mark.parametrize("labels, message", [
    (np.array([1e20, 2e20]), r"float label 1e\+20 is outside the int64 range"),
    (np.array([0.0, 2.0**63]), r"float label 9.223372036854776e\+18 is outside"),
    (np.array([1.0, np.nan]), "must be integers; got dtype float64 with the value nan"),
    (np.array([1.0, np.inf]), "must be integers; got dtype float64 with the value inf"),
    (np.array([2**63, 1], dtype=np.uint64), r"9223372036854775808 does not fit an int64 label"),
    (np.array([2**64 - 1], dtype=np.uint64), "does not fit an int64 label"),
    (torch.tensor([2**63], dtype=torch.uint64), "does not fit an int64 label"),
], ids=["1e20 and 2e20", "2**63 float", "nan", "inf", "uint64 2**63", "uint64 max", "torch uint64"])
def test_lossy_label_conversions_are_refused(labels, message):
    with pytest.raises(ValueError, match=message):
        as_labels(labels)


def test_exact_label_conversions_still_work():
    assert as_labels(np.array([-(2.0**63), 3.0, 2.0**62])).tolist() == [-(2**63), 3, 2**62]
    assert as_labels(np.array([2**63 - 1], dtype=np.uint64)).tolist() == [2**63 - 1]
    assert as_labels(np.array([5.0], dtype=np.float32)).tolist() == [5]
    assert as_labels(torch.tensor([7], dtype=torch.uint32)).tolist() == [7]


def test_float_labels_1e20_and_2e20_no_longer_become_one_class():
    stats = ClassGaussians(2)
    with pytest.raises(ValueError, match="outside the int64 range"):
        stats.update(torch.randn(2, 2), np.array([1e20, 2e20]))
    assert stats.n_classes == 0


@pytest.mark.parametrize("X", [np.array([[1 + 2j, 3.0]]), torch.tensor([[1 + 2j, 3.0]])],
                         ids=["numpy", "torch"])
def test_complex_features_are_refused(X):
    with pytest.raises(ValueError, match="must be real; got complex values"):
        as_features(X)
    with pytest.raises(ValueError, match="must be real"):
        ClassGaussians(2).update(X, [0])


def test_integer_features_beyond_2_53_are_refused():
    with pytest.raises(ValueError, match=r"not exact in float64"):
        as_features(np.array([[2**53 + 1, 0]], dtype=np.int64))
    assert as_features(np.array([[2**53, -(2**53)]])).tolist() == [[2.0**53, -(2.0**53)]]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("estimator", [NCMClassifier(), LDAClassifier()], ids=repr)
def test_estimators_keep_uint64_labels_apart_and_refuse_lossy_floats_and_complex(estimator):
    # the estimators encode labels with np.unique (no int64 cast): guard that it stays exact, and
    # that float labels beyond int64 are refused (scikit-learn calls them continuous) not merged
    g = np.random.default_rng(0)
    X = g.normal(size=(40, 3)) + np.repeat(np.eye(2, 3) * 6, 20, axis=0)
    y = np.repeat(np.array([2**63, 2**64 - 1], np.uint64), 20)
    clf = clone(estimator).fit(X, y)
    np.testing.assert_array_equal(clf.classes_, np.unique(y))
    np.testing.assert_array_equal(clf.predict(X), y)
    with pytest.raises(ValueError, match="Unknown label type: continuous"):
        clone(estimator).fit(X, np.repeat([1e20, 2e20], 20))
    with pytest.raises(ValueError, match="Complex data not supported"):
        clone(estimator).fit(X + 1j, np.repeat([0, 1], 20))


# ------------------------------------------------------------------- SGD (item 9)
@pytest.mark.parametrize("lr", [1e10, 1e38])
def test_sgd_head_that_diverges_raises_naming_the_learning_rate(lr):
    stats = small_stats(d=4, n_classes=2)[0]
    head = SGDHead(base_steps=50, steps_per_class=0, lr=lr, min_lr=0.0, patience=None)
    with pytest.raises(ValueError, match=rf"SGDHead: training diverged at step \d+ of 50.*"
                                         rf"lr={re.escape(repr(lr))}"):
        head.fit(stats)
    assert not hasattr(head, "rows_")
