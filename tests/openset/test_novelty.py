"""Novelty scores (gdacil.novelty): what the default score does that the classical ones do not,
invariances, forgetting, and the scores offered by every head and estimator.

The dense reference of every distance score runs in the head contract
(gdacil.testing.HeadContract.test_novelty_scores_match_the_dense_reference)."""

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.heads import ACIL, LDA, LRRGDA, NCM, QDA, RBFLDA, RGDA, FeCAM, RanPAC
from gdacil.heads.base import ModelTerms
from gdacil.novelty import (
    DEFAULT_SCORE,
    DISTANCE_SCORES,
    MIXTURE_SCORES,
    NORM_BAND,
    NOVELTY_SCORES,
    TYPICAL_NORM_SCORES,
    ClassNovelty,
    to_typical_norm,
)
from gdacil.sklearn import LRRGDAClassifier, RanPACClassifier
from gdacil.testing import make_stats, novelty_reference, queries

HEADS = [NCM, LDA, QDA, RGDA, LRRGDA, FeCAM]


def _two_class_plane(n=400, seed=0):
    """Two classes that differ along axis 0 only, in 6 dimensions."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    X = torch.randn(n, 6, generator=g, dtype=torch.float64)
    X[:, 0] += 4.0 * y
    return X, y


def test_the_relative_scores_fall_without_bound_away_from_every_class():
    X, y = _two_class_plane()
    head = LRRGDA(rank=2).fit(ClassGaussians(6).update(X, y))
    # a ray orthogonal to the direction in which the class means differ
    ray = torch.zeros(5, 6, dtype=torch.float64)
    ray[:, 0] = 2.0
    ray[:, 3] = torch.tensor([0.0, 5.0, 10.0, 20.0, 40.0], dtype=torch.float64)
    for method in ("shrunk_relative_mahalanobis", "relative_likelihood"):
        # (the relative likelihood falls too where every class has the spread of the mixture)
        score = head.score_samples(ray, method)
        # beyond NORM_BAND times the typical norm (about 3.7 here) the excess length counts
        assert bool((score[2:].diff() < 0).all()), method
        assert float(score[-1]) < float(head.score_samples(X, method).min()), method
    # the classical relative score cannot see that direction (the two distances nearly cancel):
    # the far input looks at least as typical as the near one
    relative = head.score_samples(ray, "relative_mahalanobis")
    assert float(relative[-1]) >= float(relative[0])


def test_own_scores_ignore_an_input_length_within_the_band_and_not_beyond():
    X, y = _two_class_plane()
    X = X + torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 8.0], dtype=torch.float64)  # off the origin
    head = LRRGDA(rank=2).fit(ClassGaussians(6).update(X, y))
    known = X[:50]
    for method in TYPICAL_NORM_SCORES:
        score = head.score_samples(known, method)
        for factor in (0.7, 1.4):  # within NORM_BAND of the typical norm: the same input
            assert torch.allclose(head.score_samples(factor * known, method), score,
                                  rtol=1e-9, atol=1e-9), (method, factor)
        # ten times longer than any known input: less typical than every known one
        far = head.score_samples(10.0 * known, method)
        assert float(far.max()) < float(head.score_samples(X, method).min()), method
    # the classical scores keep their published definitions: the length counts
    maha = head.score_samples(known, "mahalanobis")
    assert not torch.allclose(head.score_samples(1.4 * known, "mahalanobis"), maha)


def test_to_typical_norm_rescales_within_the_band_and_by_its_factor_beyond():
    X = torch.tensor([[4.5, 6.0], [30.0, 40.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    out = to_typical_norm(X, 10.0)  # norms 7.5 (within the band), 50, 0.5, 0
    expected = torch.tensor([10.0, 50.0 / NORM_BAND, 0.5 * NORM_BAND, 0.0], dtype=torch.float64)
    assert torch.allclose(out.norm(dim=1), expected)
    assert torch.allclose(torch.nn.functional.normalize(out[:3], dim=1),
                          torch.nn.functional.normalize(X[:3], dim=1))


@pytest.mark.parametrize("head_class", HEADS)
def test_scores_are_invariant_to_a_positive_rescaling(head_class):
    stats, X, y = make_stats()
    Q = queries(stats.dim)
    head = head_class().fit(stats)
    scaled = head_class().fit(ClassGaussians(stats.dim).update(7.0 * X, y))
    # the distance scores always; msp and the relative likelihood where the head's own scores
    # are scale-free (NCM's identity covariance and QDA's absolute reg_param are not)
    for method in (*DISTANCE_SCORES, *(["msp"] if head_class not in (NCM, FeCAM) else []),
                   *(["relative_likelihood"] if head_class in (RGDA, LRRGDA) else [])):
        a, b = head.score_samples(Q, method), scaled.score_samples(7.0 * Q, method)
        scale = float(a.abs().max())
        assert float((a - b).abs().max()) <= 1e-8 * scale, method


def test_forgetting_a_class_gives_the_scores_of_statistics_that_never_held_it():
    stats, X, y = make_stats()
    Q = queries(stats.dim)
    keep = y != 13
    never = ClassGaussians(stats.dim).update(X[keep], y[keep])
    forgotten = stats.copy().remove_classes([13])
    for method in (*DISTANCE_SCORES, *MIXTURE_SCORES):
        a = LRRGDA(rank=3).fit(forgotten).score_samples(Q, method)
        b = LRRGDA(rank=3).fit(never).score_samples(Q, method)
        assert float((a - b).abs().max()) <= 1e-10 * float(b.abs().max()), method


def test_class_blocks_do_not_change_the_scores():
    g = torch.Generator().manual_seed(0)
    C, d = 1100, 4  # more classes than one scoring block holds
    y = torch.arange(C).repeat_interleave(3)
    X = torch.randn(C, d, generator=g, dtype=torch.float64)[y] * 10 + torch.randn(
        len(y), d, generator=g, dtype=torch.float64)
    stats = ClassGaussians(d).update(X, y)
    Q = queries(d, n=16)
    novelty = ClassNovelty().fit(stats)
    for method in DISTANCE_SCORES:
        got, ref = novelty.score(Q, method), novelty_reference(stats, Q, method)
        assert float((got - ref).abs().max()) <= 1e-8 * float(ref.abs().max()), method


def test_float32_heads_score_in_float32_and_stay_close():
    stats, _, _ = make_stats()
    Q = queries(stats.dim)
    a = LRRGDA(rank=3).fit(stats).score_samples(Q)
    head32 = LRRGDA(rank=3, dtype="float32").fit(stats)
    assert head32.novelty_means_.dtype == torch.float32
    b = head32.score_samples(Q)
    assert b.dtype == torch.float64
    assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max())


def test_unknown_method_and_missing_state_are_refused_clearly():
    stats, _, _ = make_stats()
    Q = queries(stats.dim)
    head = LDA().fit(stats)
    with pytest.raises(ValueError, match="unknown novelty score 'knn'.*'shrunk_relative"):
        head.score_samples(Q, "knn")
    shard = LDA().fit(stats, model_terms=ModelTerms.of(stats))
    with pytest.raises(ValueError, match="model_terms.*'msp' or 'energy'"):
        shard.score_samples(Q)
    assert shard.score_samples(Q, "msp").shape == (len(Q),)


@pytest.mark.parametrize("factory", [lambda: RanPAC(dim_out=32, lam=1.0),
                                     lambda: ACIL(buffer_size=32), lambda: RBFLDA(dim_out=32)])
def test_mapped_heads_offer_the_logit_scores(factory):
    _, X, y = make_stats()
    head = factory().partial_fit(X, y)
    Q = queries(X.shape[1])
    proba = head.predict_proba(Q).double()
    assert torch.allclose(head.score_samples(Q), proba.amax(1), atol=1e-12)
    assert torch.allclose(head.score_samples(Q, "energy"),
                          head.decision_function(Q).double().logsumexp(1), atol=1e-12)
    with pytest.raises(ValueError, match="unknown novelty score 'mahalanobis'"):
        head.score_samples(Q, "mahalanobis")


def test_estimators_score_as_their_heads():
    _, X, y = make_stats()
    names = np.array([f"c{int(c)}" for c in y])
    clf = LRRGDAClassifier(rank=3).fit(X.numpy(), names)
    Q = queries(X.shape[1]).numpy()
    for method in NOVELTY_SCORES:
        got = clf.score_samples(Q, method)
        assert got.shape == (len(Q),)
        assert np.array_equal(got, clf.head_.score_samples(torch.as_tensor(Q), method).numpy())
    assert np.array_equal(clf.score_samples(Q), clf.score_samples(Q, DEFAULT_SCORE))
    ranpac = RanPACClassifier(dim_out=32, lam=1.0).fit(X.numpy(), names)
    assert ranpac.score_samples(Q).shape == (len(Q),)


def test_a_sharded_head_scores_msp_and_energy_as_one_head():
    from gdacil.heads import ShardedHead

    stats, _, _ = make_stats()
    Q = queries(stats.dim)
    one, sharded = LRRGDA(rank=3).fit(stats), ShardedHead(LRRGDA(rank=3)).fit(stats)
    assert torch.allclose(sharded.score_samples(Q), one.score_samples(Q, "msp"), atol=1e-12)
    assert torch.allclose(sharded.score_samples(Q, "energy"), one.score_samples(Q, "energy"),
                          rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="unknown novelty score 'mahalanobis'"):
        sharded.score_samples(Q, "mahalanobis")


def test_a_head_saved_before_the_typical_norm_scores_inputs_as_they_are():
    # its calibration records were scored that way: new inputs must be too
    stats, _, _ = make_stats()
    Q = queries(stats.dim)
    head = LRRGDA().fit(stats)
    tensors, metadata = head.state_dict()
    del tensors["novelty_typical_norm_"]
    old = LRRGDA(**head.get_params()).load_state_dict(tensors, metadata)
    at_norm = to_typical_norm(Q.double(), head.novelty_typical_norm_)
    for method in TYPICAL_NORM_SCORES:
        rescaled = head.score_samples(Q, method)
        assert torch.allclose(old.score_samples(at_norm, method), rescaled,
                              rtol=1e-9, atol=1e-9), method
        assert not torch.allclose(old.score_samples(Q, method), rescaled), method
