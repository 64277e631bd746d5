"""The scikit-learn estimators: check_estimator, class-incremental partial_fit, agreement with
scikit-learn's LDA/QDA, labels, pipelines and errors."""

import inspect
import pickle
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from sklearn.base import clone
from sklearn.discriminant_analysis import (
    LinearDiscriminantAnalysis,
    QuadraticDiscriminantAnalysis,
)
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import gdacil.sklearn
from gdacil._params import parameter_names
from gdacil.sklearn import (
    LDAClassifier,
    LRRGDAClassifier,
    NCMClassifier,
    QDAClassifier,
    RGDAClassifier,
)

ESTIMATORS = [NCMClassifier(), LDAClassifier(), QDAClassifier(), RGDAClassifier(),
              LRRGDAClassifier()]

# Non-default settings that make every model differ from the others and exercise the quadratic
# terms; LR-RGDA uses the exact decomposition so that sharded and joint fits agree to round-off.
CONFIGURED = [
    NCMClassifier(),
    NCMClassifier(metric="cosine"),
    LDAClassifier(shrinkage=0.2, shrinkage_target="scaled_identity"),
    QDAClassifier(reg_param=0.05),
    RGDAClassifier(),
    LRRGDAClassifier(rank=3, decomposition="eigh"),
    LRRGDAClassifier(rank=2, alpha2=0.5, alpha3=0.1, priors="empirical"),
]


def ids(estimator):
    return repr(estimator)


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


def blobs(labels, n_per_class=40, dim=6, seed=0):
    """Gaussian classes with distinct means and covariances, samples shuffled."""
    rng = np.random.default_rng(seed)
    X, y = [], []
    for label in labels:
        A = np.eye(dim) + 0.3 * rng.normal(size=(dim, dim))
        X.append(rng.normal(size=(n_per_class, dim)) @ A + 2.5 * rng.normal(size=dim))
        y += [label] * n_per_class
    order = rng.permutation(len(y))
    return np.vstack(X)[order], np.asarray(y)[order]


@pytest.mark.parametrize("estimator", CONFIGURED, ids=ids)
def test_partial_fit_in_shards_equals_fit(estimator):
    labels = [30, 10, 20, 5, 40]
    X, y = blobs(labels)
    shards = [np.isin(y, [30, 10]), np.isin(y, [20, 5]), np.isin(y, [40])]
    # later shards also bring more samples of classes already seen
    shards = [s & (np.arange(len(y)) % 2 == 0) for s in shards] + [np.arange(len(y)) % 2 == 1]
    joint = clone(estimator).fit(X, y)
    sharded = clone(estimator)
    for mask in shards:
        sharded.partial_fit(X[mask], y[mask])
    np.testing.assert_array_equal(sharded.classes_, [5, 10, 20, 30, 40])
    np.testing.assert_array_equal(sharded.classes_, joint.classes_)
    np.testing.assert_allclose(sharded.decision_function(X), joint.decision_function(X),
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(sharded.predict_proba(X), joint.predict_proba(X), atol=1e-10)
    np.testing.assert_array_equal(sharded.predict(X), joint.predict(X))
    assert joint.score(X, y) > 0.8


def test_lrrgda_partial_fit_decomposes_only_new_or_changed_classes():
    X, y = blobs(["a", "b", "c", "d", "e"], dim=8)
    clf = LRRGDAClassifier(rank=3).partial_fit(X[np.isin(y, ["a", "b", "c"])],
                                               y[np.isin(y, ["a", "b", "c"])])
    head = clf.head_
    assert head.n_decomposed_ == 3
    clf.partial_fit(X[y == "d"], y[y == "d"])
    assert clf.head_ is head and head.n_decomposed_ == 1
    clf.partial_fit(X[np.isin(y, ["a", "e"])][:30], y[np.isin(y, ["a", "e"])][:30])
    assert clf.head_ is head and head.n_decomposed_ == 2
    restored = pickle.loads(pickle.dumps(clf))  # the cache survives a round trip
    restored.partial_fit(X[y == "b"][:5], y[y == "b"][:5])
    assert restored.head_.n_decomposed_ == 1
    clf.fit(X, y)
    assert clf.head_ is not head and clf.head_.n_decomposed_ == 5


def test_set_params_between_partial_fits_takes_effect():
    X, y = blobs([0, 1, 2])
    first = y < 2
    clf = LRRGDAClassifier(rank=2).partial_fit(X[first], y[first])
    clf.set_params(alpha3=1.0, rank=3).partial_fit(X[~first], y[~first])
    fresh = LRRGDAClassifier(rank=3, alpha3=1.0).fit(X, y)
    np.testing.assert_allclose(clf.decision_function(X), fresh.decision_function(X),
                               rtol=1e-10, atol=1e-10)


def balanced_problem(n_classes, seed=0):
    rng = np.random.default_rng(seed)
    X, y = blobs(range(n_classes), n_per_class=150, dim=4, seed=seed)
    return X, y, rng.normal(size=(200, 4)) * 2.0


@pytest.mark.parametrize("n_classes", [2, 3])
def test_qda_matches_sklearn(n_classes):
    X, y, X_test = balanced_problem(n_classes)
    ours = QDAClassifier(reg_param=0.1).fit(X, y)
    ref = QuadraticDiscriminantAnalysis(reg_param=0.1).fit(X, y)
    np.testing.assert_array_equal(ours.predict(X_test), ref.predict(X_test))
    np.testing.assert_allclose(ours.predict_proba(X_test), ref.predict_proba(X_test),
                               rtol=1e-7, atol=1e-10)
    if n_classes == 2:  # both return the log-odds
        np.testing.assert_allclose(ours.decision_function(X_test),
                                   ref.decision_function(X_test), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_lda_matches_sklearn(n_classes):
    X, y, X_test = balanced_problem(n_classes, seed=1)
    ours = LDAClassifier(shrinkage=0.3, shrinkage_target="scaled_identity").fit(X, y)
    ref = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=0.3).fit(X, y)
    np.testing.assert_array_equal(ours.predict(X_test), ref.predict(X_test))
    np.testing.assert_allclose(ours.predict_proba(X_test), ref.predict_proba(X_test),
                               rtol=1e-7, atol=1e-10)
    if n_classes == 2:
        np.testing.assert_allclose(ours.decision_function(X_test),
                                   ref.decision_function(X_test), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("estimator", CONFIGURED[::2], ids=ids)
def test_string_labels_round_trip_and_late_classes_sort_first(estimator):
    names = ["pear", "apple", "fig", "banana"]
    X, y = blobs(names, dim=5)
    late = y == "apple"  # arrives last but sorts first
    clf = clone(estimator).partial_fit(X[~late], y[~late]).partial_fit(X[late], y[late])
    np.testing.assert_array_equal(clf.classes_, sorted(names))
    pred = clf.predict(X)
    assert pred.dtype == clf.classes_.dtype and set(pred) <= set(names)
    proba = clf.predict_proba(X)
    np.testing.assert_array_equal(clf.classes_[proba.argmax(1)], pred)
    np.testing.assert_allclose(proba, clone(estimator).fit(X, y).predict_proba(X), atol=1e-10)
    with pytest.raises(ValueError, match="cannot join"):
        clf.partial_fit(X[:3], [1, 2, 3])


def test_float_and_object_labels():
    X, y = blobs([0.0, 1.0, 2.0])
    clf = NCMClassifier().fit(X, y)
    assert clf.classes_.dtype == np.float64 and clf.predict(X).dtype == np.float64
    obj = y.astype(int).astype(str).astype(object)
    clf = RGDAClassifier().fit(X, obj)
    assert clf.predict(X[:5]).dtype == object
    assert clf.score(X, obj) > 0.8


def test_binary_decision_function_is_the_log_odds():
    X, y = blobs(["no", "yes"])
    clf = LRRGDAClassifier(rank=2).fit(X, y)
    df = clf.decision_function(X)
    assert df.shape == (len(y),)
    np.testing.assert_allclose(1.0 / (1.0 + np.exp(-df)), clf.predict_proba(X)[:, 1], atol=1e-12)
    np.testing.assert_array_equal(np.where(df > 0, "yes", "no"), clf.predict(X))
    np.testing.assert_allclose(clf.predict_log_proba(X), np.log(clf.predict_proba(X)),
                               atol=1e-10)


def test_fit_refuses_a_single_class_like_scikit_learn():
    X, _ = blobs([0])
    y = ["only"] * len(X)
    with pytest.raises(ValueError, match="number of classes has to be greater than one"):
        QuadraticDiscriminantAnalysis().fit(X, y)
    for clf in (LDAClassifier(), NCMClassifier(), QDAClassifier(), LRRGDAClassifier(rank=2)):
        with pytest.raises(ValueError, match="number of classes has to be greater than one"):
            clf.fit(X, y)
        assert not hasattr(clf, "stats_")


def test_priors_that_do_not_sum_to_one_warn_and_renormalise_like_scikit_learn():
    X, y = blobs([0, 1, 2])
    with pytest.warns(UserWarning, match="priors do not sum to 1"):
        reference = LinearDiscriminantAnalysis(priors=[2.0, 1.0, 1.0]).fit(X, y)
    np.testing.assert_allclose(reference.priors_, [0.5, 0.25, 0.25])
    normalised = NCMClassifier(priors=[0.5, 0.25, 0.25]).fit(X, y)
    for priors in ([2.0, 1.0, 1.0], {0: 2.0, 1: 1.0, 2: 1.0}):
        with pytest.warns(UserWarning, match="priors do not sum to 1"):
            clf = NCMClassifier(priors=priors).fit(X, y)
        np.testing.assert_allclose(clf.predict_proba(X), normalised.predict_proba(X), atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NCMClassifier(priors={0: 0.5, 1: 0.25, 2: 0.125, 3: 0.125}).fit(X, y)  # 3 yet to come


def test_lda_needs_more_samples_than_classes_like_scikit_learn():
    X, _ = blobs([0, 1, 2])
    X, y = X[:3], np.array([0, 1, 2])
    message = "number of samples must be more than the number of classes"
    with pytest.raises(ValueError, match=message):
        LinearDiscriminantAnalysis().fit(X, y)
    with pytest.raises(ValueError, match=message):
        LDAClassifier().fit(X, y)
    clf = LDAClassifier().fit(np.vstack([X, X[:1] + 0.1]), [0, 1, 2, 0])  # 4 samples: fine
    with pytest.raises(ValueError, match=message):
        LDAClassifier().partial_fit(X[:2], [0, 1])
    assert clf.predict(X[:1])[0] == 0


def test_partial_fit_accepts_one_class_at_a_time_and_predicts_it():
    X, _ = blobs([0])
    clf = LDAClassifier().partial_fit(X, ["only"] * len(X))
    assert (clf.predict(X) == "only").all()
    assert clf.decision_function(X).shape == (len(X), 1)
    np.testing.assert_allclose(clf.predict_proba(X), 1.0)


def test_priors_follow_classes_order_and_labels():
    X, y = blobs(["c", "a", "b"])
    priors = np.array([0.7, 0.2, 0.1])  # for classes_ = ["a", "b", "c"]
    uniform = NCMClassifier().fit(X, y)
    weighted = NCMClassifier(priors=priors).fit(X, y)
    shift = weighted.predict_log_proba(X) - uniform.predict_log_proba(X) - np.log(priors)
    np.testing.assert_allclose(shift - shift[:, :1], 0.0, atol=1e-10)
    mapping = {"a": 0.7, "b": 0.2, "c": 0.1}
    mapped = NCMClassifier(priors=mapping).fit(X, y)
    np.testing.assert_allclose(mapped.decision_function(X), weighted.decision_function(X),
                               atol=1e-10)
    sharded = NCMClassifier(priors=mapping)
    for label in ["c", "b"]:  # internal order differs from classes_ order
        sharded.partial_fit(X[y == label], y[y == label])
    sharded.set_params(priors=priors).partial_fit(X[y == "a"], y[y == "a"])
    np.testing.assert_allclose(sharded.decision_function(X), weighted.decision_function(X),
                               atol=1e-10)
    with pytest.raises(ValueError, match="priors has 2 entries but there are 3 classes"):
        NCMClassifier(priors=[0.5, 0.5]).fit(X, y)
    with pytest.raises(ValueError, match="priors has no entry for classes"):
        NCMClassifier(priors={"a": 1.0}).fit(X, y)
    with pytest.raises(ValueError, match="positive"):
        sharded.set_params(priors=[0.5, 0.5, -1.0]).partial_fit(X[:5], y[:5])
    assert sharded.stats_.counts.sum().item() == len(y)  # the rejected batch was not added


def test_pipeline_and_clone():
    X, y = blobs(["x", "y", "z"])
    X = 50.0 * X + 100.0  # far from the scale the paper's alphas assume
    pipe = make_pipeline(StandardScaler(), LRRGDAClassifier(rank=2))
    assert pipe.fit(X, y).score(X, y) > 0.9
    twin = clone(pipe)
    assert twin.get_params()["lrrgdaclassifier__rank"] == 2
    assert not hasattr(twin[-1], "classes_")
    np.testing.assert_allclose(twin.fit(X, y).predict_proba(X), pipe.predict_proba(X))


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=ids)
def test_parameters_mirror_the_head(estimator):
    head_params = list(inspect.signature(type(estimator)._head_class.__init__).parameters)[1:]
    assert list(estimator.get_params()) == sorted(head_params)
    X, y = blobs([0, 1])
    head = clone(estimator).fit(X, y).head_
    assert isinstance(head, type(estimator)._head_class) and head.dtype_ == torch.float64
    assert head.device_ == torch.device("cpu")


ALL_ESTIMATORS = [getattr(gdacil.sklearn, name) for name in gdacil.sklearn.__all__]


@pytest.mark.parametrize("cls", ALL_ESTIMATORS, ids=lambda cls: cls.__name__)
def test_every_estimator_takes_its_heads_signature_and_documents_it(cls):
    head_signature = inspect.signature(cls._head_class.__init__)
    assert inspect.signature(cls.__init__) == head_signature  # names, kinds and defaults
    first = next(p for p in head_signature.parameters.values() if p.name != "self")
    positional = cls("sentinel")  # positional parameters stay positional; all are stored
    assert positional.get_params()[first.name] == "sentinel"
    assert all(value is head_signature.parameters[name].default
               for name, value in cls().get_params().items())
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\(\) got an unexpected keyword"):
        cls(no_such_parameter=1)
    section = cls.__doc__.split("Parameters\n    ----------\n")[1].split("\n\n")[0]
    documented = {name for line in section.splitlines() if not line.startswith(" " * 8)
                  for name in line.split(":")[0].strip().split(", ")}
    assert set(parameter_names(cls)) <= documented, f"{cls.__name__}: undocumented parameters"


def test_float32_head():
    X, y = blobs([0, 1, 2])
    for dtype in ("float32", torch.float32, np.float32):
        clf = LRRGDAClassifier(rank=2, dtype=dtype).fit(X, y)
        assert clf.predict_proba(X).dtype == np.float32
    ref = LRRGDAClassifier(rank=2).fit(X, y)
    np.testing.assert_allclose(clf.predict_proba(X), ref.predict_proba(X), atol=1e-4)
    with pytest.raises(ValueError, match="dtype must be"):
        LRRGDAClassifier(dtype="float65").fit(X, y)


def test_bad_input_errors():
    X, y = blobs([0, 1])
    clf = QDAClassifier(reg_param=0.1)
    with pytest.raises(NotFittedError):
        clf.predict(X)
    for bad in (np.nan, np.inf):
        X_bad = X.copy()
        X_bad[3, 2] = bad
        with pytest.raises(ValueError, match="NaN|infinity"):
            clf.fit(X_bad, y)
    with pytest.raises(ValueError, match="2D array"):
        clf.fit(X[:, 0], y)
    with pytest.raises(ValueError, match="0 sample"):
        clf.fit(X[:0], y[:0])
    with pytest.raises(ValueError, match="Unknown label type"):
        clf.fit(X, y + 0.5)
    clf.fit(X, y)
    with pytest.raises(ValueError, match="features"):
        clf.predict(X[:, :3])
    with pytest.raises(ValueError, match="features"):
        clf.partial_fit(X[:, :3], y)
    with pytest.raises(ValueError, match=r"labels \[7\] that are not in classes"):
        clf.partial_fit(X[:2], [0, 7], classes=[0, 1])
    clf.partial_fit(X[:2], [0, 7], classes=[0, 1, 7])
    np.testing.assert_array_equal(clf.classes_, [0, 1, 7])


def test_single_sample_class():
    X, y = blobs([0, 1])
    qda = QDAClassifier().fit(X, y)
    before = qda.decision_function(X)
    with pytest.raises(ValueError, match="class 9 has only 1 sample"):
        qda.partial_fit(X[:1], [9])
    np.testing.assert_array_equal(qda.classes_, [0, 1])  # nothing changed
    np.testing.assert_array_equal(qda.decision_function(X), before)
    with pytest.raises(ValueError, match="only 1 sample"):
        RGDAClassifier(alpha2=0.0, alpha3=0.0).fit(X[:3], [0, 1, 1])
    # regularised models give the single-sample class a zero covariance plus regularisation
    for clf in (QDAClassifier(reg_param=0.1), RGDAClassifier(), LRRGDAClassifier(rank=2),
                LDAClassifier(), NCMClassifier()):
        clf.fit(X, y).partial_fit(X[:1] + 10.0, [9])
        proba = clf.predict_proba(X)
        assert np.isfinite(proba).all() and clf.predict(X[:1] + 10.0)[0] == 9


def test_invalid_parameters_leave_a_partial_fit_untouched():
    X, y = blobs([0, 1, 2])
    clf = RGDAClassifier().fit(X[y < 2], y[y < 2])
    n_seen = clf.stats_.counts.sum().item()
    with pytest.raises(ValueError, match="alpha1"):
        clf.set_params(alpha1=-1.0).partial_fit(X, y)
    assert clf.stats_.counts.sum().item() == n_seen
    np.testing.assert_array_equal(clf.classes_, [0, 1])
    clf.set_params(alpha1=0.2).partial_fit(X[y == 2], y[y == 2])
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])


def huge_values(X, y):
    """A batch that passes validation (finite) but whose scatter overflows float64."""
    return np.vstack([X[:4], 1e200 * X[:4]]), np.concatenate([y[:4], np.full(4, 7)])


def zero_mean_class(X, y):
    """A batch with a new class whose mean is the zero vector (cosine NCM cannot score it)."""
    return np.vstack([X[:4], X[:1], -X[:1]]), np.concatenate([y[:4], np.full(2, 7)])


@pytest.mark.parametrize("estimator, bad_batch", [
    (LDAClassifier(), huge_values),
    (LRRGDAClassifier(rank=2), huge_values),
    (RGDAClassifier(), huge_values),
    (NCMClassifier(metric="cosine"), zero_mean_class),
], ids=lambda p: p.__name__ if callable(p) and not hasattr(p, "fit") else repr(p))
def test_a_partial_fit_whose_head_fails_leaves_the_estimator_exactly_as_it_was(estimator,
                                                                                bad_batch):
    X, y = blobs([0, 1, 2])
    clf = clone(estimator).fit(X[y < 2], y[y < 2])
    clf.partial_fit(X[y == 2], y[y == 2])
    before = {m: getattr(clf, m)(X) for m in ("predict", "decision_function", "predict_proba")}
    stats = clf.stats_.copy()
    Xb, yb = bad_batch(X[y < 2], y[y < 2])     # known classes 0 and 1 and a new class 7
    with pytest.raises(ValueError):
        clf.partial_fit(Xb, yb)
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    for method, expected in before.items():
        np.testing.assert_array_equal(getattr(clf, method)(X), expected)
    assert clf.stats_.classes == stats.classes
    for name in ("counts", "means", "scatters"):
        assert torch.equal(getattr(clf.stats_, name), getattr(stats, name))
    assert [clf.stats_.revision(c) for c in stats.classes] == \
        [stats.revision(c) for c in stats.classes]
    # what follows is as if the failed call never happened
    clf.partial_fit(X[:5], y[:5])
    reference = clone(estimator).fit(np.vstack([X[y < 2], X[y == 2], X[:5]]),
                                     np.concatenate([y[y < 2], y[y == 2], y[:5]]))
    np.testing.assert_allclose(clf.decision_function(X), reference.decision_function(X),
                               rtol=1e-10, atol=1e-10)


def test_lrrgda_keeps_its_eigenpair_cache_through_a_failed_partial_fit():
    X, y = blobs([0, 1, 2])
    clf = LRRGDAClassifier(rank=2).fit(X, y)
    with pytest.raises(ValueError):
        clf.partial_fit(*huge_values(X, y))
    clf.partial_fit(X[y == 0], y[y == 0])
    assert clf.head_.n_decomposed_ == 1   # only class 0 changed since the last good fit


def test_a_fit_that_fails_leaves_the_estimator_unfitted_and_partial_fit_starts_afresh(
        monkeypatch):
    X, y = blobs([0, 1, 2])
    clf = LDAClassifier().fit(X, y)

    def fail(*args, **kwargs):
        raise ValueError("cannot factorise")

    monkeypatch.setattr(LDAClassifier._head_class, "_build", fail)
    with pytest.raises(ValueError, match="cannot factorise"):
        clf.fit(X[y < 2], y[y < 2])
    assert not hasattr(clf, "stats_") and not hasattr(clf, "head_")
    with pytest.raises(NotFittedError):
        clf.predict(X)
    monkeypatch.undo()
    clf.partial_fit(X[y < 2], y[y < 2])
    np.testing.assert_array_equal(clf.decision_function(X),
                                  LDAClassifier().fit(X[y < 2], y[y < 2]).decision_function(X))


def test_feature_names_are_checked():
    pd = pytest.importorskip("pandas")
    X, y = blobs([0, 1])
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    clf = NCMClassifier().fit(frame, y)
    np.testing.assert_array_equal(clf.feature_names_in_, frame.columns)
    with pytest.raises(ValueError, match="feature names"):
        clf.partial_fit(frame.rename(columns={"f0": "g0"}), y)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_head_matches_cpu():
    X, y = blobs(["a", "b", "c"], dim=16)
    cpu = LRRGDAClassifier(rank=4).fit(X, y)
    gpu = LRRGDAClassifier(rank=4, device="cuda").fit(X, y)
    assert gpu.head_.rows_.is_cuda
    np.testing.assert_array_equal(gpu.predict(X), cpu.predict(X))
    np.testing.assert_allclose(gpu.predict_proba(X), cpu.predict_proba(X), atol=1e-8)
