"""The scikit-learn estimators over the anchor heads (RanPAC, ACIL, RBF-LDA, FeCAM):
check_estimator, agreement with the heads fitted directly, sharded partial_fit, failed calls,
parameters, pipelines."""

import inspect

import numpy as np
import pytest
import torch

pytest.importorskip("sklearn")

from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from gdacil.heads import ACIL, RBFLDA, FeCAM, RanPAC
from gdacil.sklearn import (
    ACILClassifier,
    FeCAMClassifier,
    RanPACClassifier,
    RBFLDAClassifier,
)
from gdacil.stats import PooledGaussians
from gdacil.stats.linalg import NumericalWarning

# The default maps (M = 10000 / 8192 / 5000) hold hundreds of MB each: small ones here.
SMALL = [RanPACClassifier(dim_out=64), ACILClassifier(buffer_size=64),
         RBFLDAClassifier(dim_out=64), FeCAMClassifier()]

# Settings whose sharded fit must equal one fit: no per-batch choice (numeric lam and bandwidth).
DETERMINISTIC = [
    RanPACClassifier(dim_out=48, lam=10.0),
    ACILClassifier(buffer_size=48, gamma=1.0, seed=3),
    RBFLDAClassifier(dim_out=48, bandwidth=4.0, priors="empirical"),
    RBFLDAClassifier(dim_out=48, bandwidth=4.0, shrinkage=0.2),
    FeCAMClassifier(alpha2=0.5, tukey=0.5, l2=True),
    FeCAMClassifier(normalize=False, priors="empirical"),   # ddof=1 matters here
]
# ... and settings that choose from the first batch or from every batch
CONFIGURED = [*DETERMINISTIC, RanPACClassifier(dim_out=48), RBFLDAClassifier(dim_out=48)]

# A parameter value each head refuses, for set_params between partial_fit calls
INVALID = {RanPAC: {"lam": -1.0}, ACIL: {"gamma": 0.0}, RBFLDA: {"shrinkage": 2.0},
           FeCAM: {"alpha1": -1.0}}
# A valid change that a failed partial_fit must not leave applied to the head
VALID = {RanPAC: {"train_fraction": 0.5}, ACIL: {"gamma": 5.0}, RBFLDA: {"shrinkage": 0.9},
         FeCAM: {"alpha1": 5.0}}
# Parameters the statistics depend on, fixed by the first batch
FIXED = {RanPAC: {"seed": 7}, ACIL: {"buffer_size": 32}, RBFLDA: {"bandwidth": 2.0},
         FeCAM: {"tukey": 0.7}}


def ids(estimator):
    return repr(estimator)


@parametrize_with_checks(SMALL)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


NAMES = ["pear", "apple", "fig", "banana", "kiwi"]


def classes(n_classes=5, n_per_class=30, dim=6, seed=0):
    """Samples of classes 0..n-1 around distinct means, with class-specific spreads, shuffled."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(n_classes), n_per_class)
    centers = 3.0 * rng.normal(size=(n_classes, dim))
    spread = rng.uniform(0.5, 1.5, size=(n_classes, dim))
    X = centers[y] + spread[y] * rng.normal(size=(y.size, dim))
    order = rng.permutation(y.size)
    return X[order], y[order]


def shards(y):
    """Masks of three batches: labels out of order, later batches bring old classes too."""
    first = np.isin(y, [0, 2]) & (np.arange(y.size) % 3 != 0)    # "pear", "fig"
    second = np.isin(y, [1, 0]) & ~first                           # "apple" (sorts first), more
    return [first, second, ~(first | second)]                      # the rest: 3, 4 and 2


def head_of(estimator):
    """The gdacil head with the estimator's parameters, not fitted."""
    params = estimator.get_params()
    params["dtype"] = getattr(torch, params["dtype"])
    return type(estimator)._head_class(**params)


def columns_in_label_order(head, scores):
    """The head's score columns (in its ``classes_`` order) put in label order 0, 1, ..."""
    return scores.numpy()[:, np.argsort(head.classes_.numpy())]


@pytest.mark.parametrize("estimator", CONFIGURED, ids=ids)
def test_matches_the_head_fitted_directly_on_integer_labels(estimator):
    X, y = classes()
    labels = np.array(NAMES)[y]
    clf, head = clone(estimator), head_of(estimator)
    for mask in shards(y):
        clf.partial_fit(X[mask], labels[mask])
        head.partial_fit(torch.from_numpy(X[mask]), torch.from_numpy(y[mask]))
    np.testing.assert_array_equal(clf.classes_, sorted(NAMES))
    # head label k is NAMES[k]; clf.classes_ is sorted(NAMES)
    to_sorted = np.argsort(NAMES)
    scores = columns_in_label_order(head, head.decision_function(torch.from_numpy(X)))[:, to_sorted]
    proba = columns_in_label_order(head, head.predict_proba(torch.from_numpy(X)))[:, to_sorted]
    assert clf.decision_function(X).shape == (len(y), 5)
    np.testing.assert_allclose(clf.decision_function(X), scores, rtol=1e-7,
                               atol=1e-9 * np.abs(scores).max())
    np.testing.assert_allclose(clf.predict_proba(X), proba, rtol=1e-7, atol=1e-10)
    np.testing.assert_array_equal(clf.predict(X), np.array(NAMES)[head.predict(X).numpy()])
    np.testing.assert_allclose(clf.predict_log_proba(X), np.log(proba), rtol=1e-7, atol=1e-9)
    assert clf.score(X, labels) > 0.9


@pytest.mark.parametrize("estimator", DETERMINISTIC, ids=ids)
def test_partial_fit_in_shards_equals_one_fit(estimator):
    X, y = classes(seed=1)
    joint = clone(estimator).fit(X, y)
    sharded = clone(estimator)
    for mask in shards(y):
        sharded.partial_fit(X[mask], y[mask])
    np.testing.assert_array_equal(sharded.classes_, joint.classes_)
    scores = joint.decision_function(X)
    np.testing.assert_allclose(sharded.decision_function(X), scores, rtol=1e-6,
                               atol=1e-8 * np.abs(scores).max())
    np.testing.assert_allclose(sharded.predict_proba(X), joint.predict_proba(X), atol=1e-8)
    np.testing.assert_array_equal(sharded.predict(X), joint.predict(X))
    assert sharded.stats_.counts.sum().item() == len(y)


def state_of(clf):
    """Copies of what a failed call must leave as it was: outputs, statistics, head scalars."""
    X = np.random.default_rng(5).normal(size=(40, 6)) * 3.0
    out = {m: getattr(clf, m)(X) for m in ("predict", "decision_function", "predict_proba")}
    stats = clf.stats_
    out["stats"] = {"classes": stats.classes, "counts": stats.counts.clone(),
                    "means": stats.means.clone(),
                    "scatter": (stats.scatter if isinstance(stats, PooledGaussians)
                                else stats.scatters).clone()}
    scalars = ("lam_", "lam_history_", "shrinkage_")
    out["head"] = {k: list(v) if isinstance(v, list) else v for k, v in vars(clf.head_).items()
                   if k in scalars}
    return out


def assert_same_state(before, after):
    for key in ("predict", "decision_function", "predict_proba"):
        np.testing.assert_array_equal(after[key], before[key])
    assert after["stats"]["classes"] == before["stats"]["classes"]
    for key in ("counts", "means", "scatter"):
        assert torch.equal(after["stats"][key], before["stats"][key]), key
    assert after["head"] == before["head"]


def failing(*args, **kwargs):
    raise ValueError("cannot factorise")


@pytest.mark.parametrize("estimator", [SMALL[0], DETERMINISTIC[1], DETERMINISTIC[2],
                                       DETERMINISTIC[4]], ids=ids)
def test_a_failed_partial_fit_leaves_the_estimator_as_it_was(estimator, monkeypatch):
    X, y = classes()
    first, second, third = shards(y)
    clf = clone(estimator).partial_fit(X[first], y[first]).partial_fit(X[second], y[second])
    before = state_of(clf)
    head_class = type(estimator)._head_class
    X_nan = X[third].copy()
    X_nan[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clf.partial_fit(X_nan, y[third])
    with pytest.raises(ValueError, match="features"):
        clf.partial_fit(X[third][:, :4], y[third])
    for params in (INVALID[head_class], FIXED[head_class]):
        with pytest.raises(ValueError, match=next(iter(params))):
            clf.set_params(**params).partial_fit(X[third], y[third])
        clf.set_params(**estimator.get_params())
    assert_same_state(before, state_of(clf))
    # a solve (mapped heads) or a build (FeCAM) that fails after the batch joined the statistics,
    # with new parameter values that must not stay on the head
    clf.set_params(**VALID[head_class])
    monkeypatch.setattr(head_class, "_solve" if hasattr(head_class, "_solve") else "_build",
                        failing)
    with pytest.raises(ValueError, match="cannot factorise"):
        clf.partial_fit(X[third], y[third])
    monkeypatch.undo()
    if head_class in (RanPAC, ACIL):  # a real one: the Gram matrix overflows
        with pytest.raises(ValueError, match="NaN or inf"):
            clf.partial_fit(1e200 * X[third], y[third])
    clf.set_params(**estimator.get_params())
    assert_same_state(before, state_of(clf))
    assert clf.stats_ is clf.head_.stats_ or head_class is FeCAM
    # what follows is as if the failed calls never happened
    clf.partial_fit(X[third], y[third])
    reference = clone(estimator)
    for mask in (first, second, third):
        reference.partial_fit(X[mask], y[mask])
    np.testing.assert_allclose(clf.decision_function(X), reference.decision_function(X),
                               rtol=1e-12, atol=1e-12)


def test_data_dependent_settings_need_two_samples_and_say_so():
    X, y = classes(n_classes=2)
    clf = RanPACClassifier(dim_out=16).fit(X, y)
    with pytest.raises(ValueError, match="lam='auto'.*at least 2 samples; got 1"):
        clf.partial_fit(X[:1], y[:1])
    assert len(clf.head_.lam_history_) == 1
    clf.partial_fit(X[:2], y[:2])
    assert len(clf.head_.lam_history_) == 2
    RanPACClassifier(dim_out=16, lam=1.0).fit(X, y).partial_fit(X[:1], y[:1])  # fixed lam: fine
    rbf = RBFLDAClassifier(dim_out=16)
    with pytest.raises(ValueError, match="bandwidth='auto' needs a first batch of at least 2"):
        rbf.partial_fit(X[:1], y[:1])
    assert not hasattr(rbf, "stats_")
    with pytest.warns(NumericalWarning, match="not positive definite"):  # no scatter at all
        rbf.set_params(bandwidth=1.0).partial_fit(X[:1], y[:1])


def test_fecam_statistics_are_of_transformed_features():
    X, y = classes(n_classes=3)
    clf = FeCAMClassifier(tukey=0.5, l2=True).fit(X, y)
    Z = np.sign(X) * np.sqrt(np.abs(X))
    Z /= np.linalg.norm(Z, axis=1, keepdims=True)
    means = np.stack([Z[y == c].mean(0) for c in clf.stats_.classes])
    np.testing.assert_allclose(clf.stats_.means.numpy(), means, rtol=1e-12, atol=1e-14)
    assert clf.stats_.ddof == 1
    with pytest.raises(ValueError, match="Tukey power 400 overflows"):
        FeCAMClassifier(tukey=400).fit(10.0 * X, y)


@pytest.mark.parametrize("estimator, change", [
    (ACILClassifier(buffer_size=48), {"gamma": 3.0}),
    (RanPACClassifier(dim_out=48, lam=1.0), {"lam": 100.0}),
    (RBFLDAClassifier(dim_out=48, bandwidth=4.0), {"shrinkage": 0.5, "priors": "empirical"}),
    (FeCAMClassifier(tukey=0.5), {"alpha1": 0.1, "alpha2": 0.3}),
], ids=str)
def test_set_params_between_partial_fits_takes_effect(estimator, change):
    X, y = classes(seed=2)
    first = y < 3
    clf = clone(estimator).partial_fit(X[first], y[first])
    clf.set_params(**change).partial_fit(X[~first], y[~first])
    fresh = clone(estimator).set_params(**change).fit(X, y)
    scores = fresh.decision_function(X)
    np.testing.assert_allclose(clf.decision_function(X), scores, rtol=1e-6,
                               atol=1e-8 * np.abs(scores).max())
    # and a parameter the statistics depend on changes with fit
    (name, value), = FIXED[type(estimator)._head_class].items()
    assert clf.set_params(**{name: value}).fit(X, y).head_.get_params()[name] == value


@pytest.mark.parametrize("estimator", SMALL, ids=ids)
def test_params_mirror_the_head_and_clone_round_trips(estimator):
    head_class = type(estimator)._head_class
    signature = inspect.signature(head_class.__init__).parameters
    params = estimator.get_params()
    assert list(params) == sorted(list(signature)[1:])
    defaults = type(estimator)().get_params()
    for name, value in defaults.items():  # same defaults, dtype named by a string
        expected = signature[name].default
        assert value == (str(expected).removeprefix("torch.") if name == "dtype" else expected)
    twin = clone(estimator)
    assert twin.get_params() == params and twin is not estimator
    changed = {"dtype": "float32", **({"seed": 11} if "seed" in params else {"alpha1": 2.0})}
    assert clone(twin).set_params(**changed).get_params() == {**params, **changed}
    X, y = classes(n_classes=3)
    fitted = clone(twin).set_params(**changed).fit(X, y)
    assert isinstance(fitted.head_, head_class) and fitted.head_.dtype == torch.float32
    assert fitted.predict_proba(X).dtype == np.float32
    unfitted = clone(fitted)
    assert not hasattr(unfitted, "classes_") and unfitted.get_params() == fitted.get_params()


@pytest.mark.parametrize("estimator", SMALL, ids=ids)
def test_pipeline(estimator):
    X, y = classes(n_classes=3, seed=4)
    X = 50.0 * X + 100.0  # far from unit scale: ACIL's absolute gamma needs the scaler
    labels = np.array(["x", "y", "z"])[y]
    pipe = make_pipeline(StandardScaler(), clone(estimator))
    assert pipe.fit(X, labels).score(X, labels) > 0.9
    twin = clone(pipe)
    name = type(estimator).__name__.lower()
    assert twin.get_params()[f"{name}__dtype"] == "float64"
    np.testing.assert_allclose(twin.fit(X, labels).predict_proba(X), pipe.predict_proba(X))


@pytest.mark.parametrize("estimator", SMALL, ids=ids)
def test_one_then_two_classes(estimator):
    X, y = classes(n_classes=2, seed=6)
    clf = clone(estimator).partial_fit(X[y == 1], np.full((y == 1).sum(), "yes"))
    assert (clf.predict(X) == "yes").all() and clf.decision_function(X).shape == (len(y), 1)
    clf.partial_fit(X[y == 0], np.full((y == 0).sum(), "no"))
    df = clf.decision_function(X)
    scores = clf.head_.decision_function(torch.from_numpy(X)).numpy()[:, clf._columns.numpy()]
    np.testing.assert_allclose(df, scores[:, 1] - scores[:, 0], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(clf.predict(X), np.where(df > 0, "yes", "no"))
    assert (clf.predict(X) == np.where(y == 1, "yes", "no")).mean() > 0.9


@pytest.mark.parametrize("estimator", SMALL[:3], ids=ids)
def test_mapped_estimators_keep_the_heads_pooled_statistics(estimator):
    X, y = classes(n_classes=3)
    clf = clone(estimator).fit(X, y)
    assert isinstance(clf.stats_, PooledGaussians) and clf.stats_ is clf.head_.stats_
    assert clf.stats_.dim == clf.head_.feature_map_.dim_out == 64
    assert hasattr(clf.head_, "coef_")  # solved in fit, not at the first prediction
    np.testing.assert_array_equal(np.sort(clf.stats_.counts.numpy()), [30, 30, 30])
