"""Novelty scores never NaN (issue 43, failure 3): finite features whose distances overflow
float64 raise the error ``predict`` raises for class scores, naming the sample, in every
Gaussian head and estimator and for every score; calibration records holding NaN are refused,
so no NaN is ever compared with a rejection threshold (docs/reliability.md)."""

import json

import numpy as np
import pytest
import torch
from sklearn.base import clone

from gdacil import ClassGaussians
from gdacil.hashing import sha256_json
from gdacil.heads import LDA, LRRGDA, NCM, QDA, RGDA, FeCAM, SGDHead
from gdacil.io import CorruptFileError, load_tensors, save_tensors
from gdacil.learner import Learner, bundle
from gdacil.novelty import DISTANCE_SCORES, MIXTURE_SCORES
from gdacil.sklearn import (
    FeCAMClassifier,
    LDAClassifier,
    LRRGDAClassifier,
    NCMClassifier,
    QDAClassifier,
    RGDAClassifier,
)

from _assets import needs_transformers

HEADS = [NCM(), LDA(), QDA(), RGDA(), LRRGDA(rank=3), FeCAM(),
         SGDHead(base_steps=20, steps_per_class=0)]


def three_classes(n=120, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    X = 3.0 * torch.eye(3, d, dtype=torch.float64)[y] + torch.randn(n, d, generator=g,
                                                                     dtype=torch.float64)
    return X, y


def overflowing(X):
    """Four queries; the third finite but 1e306 times the data's scale (its squared
    distances overflow float64)."""
    Q = X[:4].clone()
    Q[2] *= 1e306
    assert torch.isfinite(Q).all()
    return Q


def offered(head):
    methods = list(DISTANCE_SCORES)
    if head._density_offset(torch.zeros(1, head.n_features_in_, dtype=torch.float64)) \
            is not None:
        methods += MIXTURE_SCORES
    return methods


@pytest.mark.parametrize("head", HEADS, ids=lambda h: type(h).__name__)
def test_novelty_scores_that_overflow_float64_raise_naming_the_sample(head):
    # were NaN (relative scores) and -inf ("mahalanobis"): a NaN compares as not below any
    # threshold, so the input passed for known
    X, y = three_classes()
    head = head.fit(ClassGaussians(X.shape[1]).update(X, y))
    Q = overflowing(X)
    for method in offered(head):
        if method == "cosine":
            continue
        with pytest.raises(ValueError, match=rf"{type(head).__name__}: the novelty scores of "
                                             r"sample 2 are NaN or inf even in float64"):
            head.score_samples(Q, method)
        # the other rows score as they did: finite
        assert torch.isfinite(head.score_samples(Q[[0, 1, 3]], method)).all(), method


@pytest.mark.parametrize("head", HEADS[:2], ids=lambda h: type(h).__name__)
def test_cosine_of_a_huge_input_is_its_direction_not_zero(head):
    # normalize() of a row whose norm overflows gave a zero vector: cosine 0 for any direction
    X, y = three_classes()
    stats = ClassGaussians(X.shape[1]).update(X, y)
    head = head.fit(stats)
    Q = overflowing(X)
    got = head.score_samples(Q, "cosine")
    assert torch.isfinite(got).all()
    # independent reference: cosine is scale-free, so scale the row down first (exact: 1e306
    # is far beyond the centre m, whose share 1e-306 is below round-off)
    m = (stats.counts.double() / stats.counts.sum()) @ stats.means
    directions = torch.nn.functional.normalize(stats.means - m, dim=1)
    x = Q[2] / 1e306 - m / 1e306
    expected = (directions @ (x / x.norm())).amax()
    torch.testing.assert_close(got[2], expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(got[[0, 1, 3]], head.score_samples(X[[0, 1, 3]], "cosine"),
                               rtol=0, atol=0)


ESTIMATORS = [NCMClassifier(), LDAClassifier(), QDAClassifier(), RGDAClassifier(),
              LRRGDAClassifier(rank=3), FeCAMClassifier()]


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_estimators_refuse_novelty_scores_that_overflow(estimator):
    X, y = three_classes()
    X, y = X.numpy(), np.array(["a", "b", "c"])[y.numpy()]
    clf = clone(estimator).fit(X, y)
    Q = overflowing(torch.from_numpy(X)).numpy()
    for method in (None, "mahalanobis", "relative_mahalanobis"):
        with pytest.raises(ValueError, match=r"novelty scores of sample 2 are NaN or inf"):
            clf.score_samples(Q, method=method)
    assert np.isfinite(clf.score_samples(Q[[0, 1, 3]])).all()


# ---------------------------------------------------------------------- the calibration
def test_calibration_records_with_nan_novelty_are_refused():
    from gdacil.calibration import Calibration

    scores = torch.zeros(4, 2, dtype=torch.float64)
    novelty = torch.tensor([0.1, float("nan"), 0.3, 0.4], dtype=torch.float64)
    with pytest.raises(ValueError, match="novelty score of record 1 is NaN or inf"):
        Calibration().fit(novelty, torch.tensor([0, 1, 0, 1]), scores, torch.tensor([0, 1]))


@needs_transformers
def test_a_model_whose_calibration_holds_nan_novelty_is_refused_naming_the_file(tmp_path):
    # edited with the manifest's checksums recomputed: the threshold was NaN, and every input
    # compared as "not below" it: predict(..., reject=True) called everything known
    from test_learner import COLOURS, colour_set, tiny_learner

    learner = tiny_learner()
    learner.learn(*colour_set(list(COLOURS)[:3], 8))
    learner.save(tmp_path / "model")
    folder = tmp_path / "model" / "versions" / "v1"
    path = folder / "calibration.safetensors"
    tensors, meta = load_tensors(path)
    tensors["novelty_"] = torch.full_like(tensors["novelty_"], float("nan"))
    save_tensors(path, tensors, meta)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["calibration.safetensors"] = bundle.sha256_file(path)
    manifest.pop("sha256")
    manifest["sha256"] = sha256_json(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorruptFileError, match="novelty score of record 0 is NaN") as raised:
        Learner.load(tmp_path / "model")
    assert raised.value.path == path


def test_a_vectors_model_refuses_a_vector_whose_novelty_overflows_instead_of_calling_it_known():
    # the vectors modality passes float64 vectors through unchanged: a finite vector 1e306
    # times the data's scale scored NaN novelty, and NaN < threshold is False: "known"
    X, y = three_classes(n=300)
    learner = Learner("vectors", head="lda")  # linear class scores: finite for this vector
    learner.learn(X.numpy(), [f"c{int(c)}" for c in y])
    Q = overflowing(X).numpy()
    assert learner.predict(Q[[0, 1, 3]], reject=True)[0].novelty is not None
    with pytest.raises(ValueError, match="LDA: the novelty scores of sample 2 are NaN or inf"):
        learner.predict(Q, reject=True)
    assert len(learner.predict(Q)) == 4  # without rejection LDA's class scores still answer
