"""Features at the edges of what a dtype holds (issue 43, items of failure 7): integer features
that float64 would round are refused by the estimators as by the heads, naming the sample and
the feature, and LR-RGDA in low precision is exact at any scale its dtype can hold and refused,
with the documented one-line error, beyond it (docs/reliability.md)."""

import numpy as np
import pytest
import torch
from sklearn.base import clone

from gdacil import ClassGaussians
from gdacil._validation import as_features
from gdacil.heads import LDA, LRRGDA, NCM
from gdacil.sklearn import LDAClassifier, LRRGDAClassifier, NCMClassifier, RanPACClassifier


def integer_classes(n=60, d=3, seed=0):
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    return rng.integers(-5, 5, (n, d)) + 8 * np.eye(2, d, dtype=np.int64)[y], y


ESTIMATORS = [NCMClassifier(), LDAClassifier(), LRRGDAClassifier(rank=2),
              RanPACClassifier(dim_out=16, lam=1.0)]


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_estimators_refuse_integer_features_that_float64_would_round(estimator):
    # scikit-learn's validate_data converted them silently: 2**53 + 1 became 2**53, so two
    # different inputs got one prediction and one novelty score
    X, y = integer_classes()
    clf = clone(estimator).fit(X, y)
    Q = X[:3].copy()
    Q[1, 2] = 2**53 + 1
    message = (r"X: sample 1, feature 2: the integer 9007199254740993 is not exact in float64 "
               r"\(it would become 9007199254740992.0\)")
    methods = ["predict", "predict_proba", "decision_function", "score_samples"]
    for method in methods:
        with pytest.raises(ValueError, match=message):
            getattr(clf, method)(Q)
    train = np.vstack([X, [[0, 0, -(2**62) - 1]]])
    with pytest.raises(ValueError, match="sample 60, feature 2: the integer -4611686018427387905"):
        clone(estimator).fit(train, np.r_[y, 1])
    with pytest.raises(ValueError, match="sample 0, feature 0: the integer 18446744073709551615"):
        clf.predict(np.array([[2**64 - 1, 0, 0]], dtype=np.uint64))
    # integers float64 holds exactly are features like any other
    exact = X.astype(np.int64)
    exact[0, 0] = 2**60
    np.testing.assert_array_equal(clf.predict(exact), clf.predict(exact.astype(np.float64)))
    np.testing.assert_array_equal(clf.score_samples(X), clf.score_samples(X.astype(np.float64)))


def test_heads_name_the_sample_and_feature_of_an_inexact_integer():
    X, y = integer_classes()
    head = NCM().fit(ClassGaussians(3).update(X, y))
    Q = torch.from_numpy(X[:4].copy())
    Q[3, 0] = -(2**53) - 1
    for method in ("predict", "score_samples"):
        with pytest.raises(ValueError, match="sample 3, feature 0: the integer "
                                             "-9007199254740993 is not exact in float64"):
            getattr(head, method)(Q)
    Q[3, 0] = 2**62  # exact in float64
    assert torch.equal(as_features(Q)[3], torch.tensor([2.0**62, *Q[3, 1:].double()]))


# ---------------------------------------------------------------------- LR-RGDA, low precision
def gaussian_classes(n=120, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    return 3.0 * torch.eye(3, d, dtype=torch.float64)[y] + torch.randn(
        n, d, generator=g, dtype=torch.float64), y


@pytest.mark.parametrize("scale", [1e25, 1e30, 1e35])
def test_float32_lrrgda_at_a_scale_whose_squares_overflow_float32_is_exact(scale):
    # B^-1 ~ scale^-2 flushed to 0 in float32: the quadratic term vanished (scores off by 0.28
    # at 1e25, silently); at 1e40 eigh failed with torch's _LinAlgError
    X, y = gaussian_classes()
    reference = LRRGDA(rank=4).fit(ClassGaussians(8).update(X, y))
    head = LRRGDA(rank=4, dtype="float32").fit(ClassGaussians(8).update(scale * X, y))
    assert torch.isfinite(head.rows_).all()
    assert torch.equal(head.predict(scale * X), reference.predict(X))
    # scale-free: the scores of scale * x equal those of x up to a per-sample constant
    got = head.decision_function(scale * X).double()
    want = reference.decision_function(X)
    got, want = got - got.mean(1, keepdim=True), want - want.mean(1, keepdim=True)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("head", [LRRGDA(rank=4), LDA(), NCM()], ids=lambda h: type(h).__name__)
def test_class_means_beyond_the_head_dtype_are_refused_at_fit_in_one_line(dtype, head):
    X, y = gaussian_classes()
    stats = ClassGaussians(8).update(1e40 * X, y)
    with pytest.raises(ValueError, match=rf"{type(head).__name__}: the class means .* overflow "
                                         rf"torch.{dtype} .*fit it with dtype='float64' or "
                                         r"rescale the features$"):
        with_dtype(head, dtype).fit(stats)
    assert torch.isfinite(with_dtype(head, "float64").fit(stats).decision_function(
        1e40 * X[:5])).all()


def with_dtype(head, dtype):
    return type(head)(**{**head.get_params(), "dtype": dtype})


def test_lrrgda_estimator_in_float32_at_scale_1e40_is_refused_in_one_line():
    X, y = gaussian_classes()
    with pytest.raises(ValueError, match="LRRGDA: the class means .* overflow torch.float32"):
        LRRGDAClassifier(rank=4, dtype="float32").fit((1e40 * X).numpy(), y.numpy())
