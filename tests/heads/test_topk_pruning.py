"""Exactness of LR-RGDA's pruned top-k on adversarial heads.

The pruned search must return the classes dense scoring ranks first: a returned class's dense
score equals the returned score, and the returned scores are the k best dense scores (two
classes whose scores tie within rounding may come out in either order).
"""

import pytest
import torch

from gdacil import ClassGaussians
from gdacil.heads import LRRGDA


def random_classes(C, d, *, seed, spread=1.0, scales=None, offset=0.0, rank=None):
    """Statistics of ``C`` classes with random means (``spread``) and covariances of rank
    ``rank`` (default ``d``) plus a small ridge, class ``c`` scaled by ``scales[c]``."""
    g = torch.Generator().manual_seed(seed)
    means = spread * torch.randn(C, d, generator=g, dtype=torch.float64) + offset
    factor = torch.randn(C, d, rank or d, generator=g, dtype=torch.float64)
    factor = factor * torch.linspace(1.0, 0.05, rank or d, dtype=torch.float64) / d ** 0.5
    covs = factor @ factor.transpose(1, 2) + 1e-3 * torch.eye(d, dtype=torch.float64)
    if scales is not None:
        covs = covs * torch.as_tensor(scales, dtype=torch.float64)[:, None, None]
    stats = ClassGaussians(d).add_classes(range(C), means, covs, torch.full((C,), 50.0))
    return stats, means


def queries(means, n, *, seed, noise=0.5):
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(means), (n,), generator=g)
    return means[picks] + noise * torch.randn(n, means.shape[1], generator=g, dtype=torch.float64)


def assert_exact_top_k(head, X, k, scores, labels):
    dense = head.decision_function(X)
    best = dense.topk(k, dim=1).values
    tol = 64 * torch.finfo(head.dtype_).eps * (1.0 + dense.abs().amax(1, keepdim=True))
    assert labels.shape == (len(X), k)
    assert all(len(set(row)) == k for row in labels.tolist()), "a class came out twice"
    position = {int(c): i for i, c in enumerate(head.classes_)}
    cols = torch.tensor([[position[int(c)] for c in row] for row in labels])
    assert torch.all((dense.gather(1, cols) - scores).abs() <= tol), "score is not the dense one"
    assert torch.all((best - scores).abs() <= tol), "not the k best dense scores"


def check_all_k(head, X, *, screen_ranks=(0, 2, 5), screen_dtype="auto", sample_batch=32):
    C = head.rows_.shape[0]
    for k in (1, 3, 5, 10):
        for j in screen_ranks:
            scores, labels = head.top_k(X, min(k, C), pruned=True, screen_rank=j,
                                        screen_dtype=screen_dtype, sample_batch=sample_batch)
            assert_exact_top_k(head, head._prepare(X), min(k, C), scores, labels)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("spread", [0.1, 1.0, 5.0])   # overlapping to well separated
def test_pruned_top_k_is_exact_on_random_heads(seed, spread):
    stats, means = random_classes(60, 16, seed=seed, spread=spread)
    head = LRRGDA(rank=8).fit(stats)
    check_all_k(head, queries(means, 48, seed=seed + 10))


@pytest.mark.parametrize(("dtype", "screen_dtype"), [(torch.float64, torch.float32),
                                                      (torch.float32, torch.bfloat16),
                                                      (torch.float32, torch.float32)])
@pytest.mark.parametrize("offset", [0.0, 100.0])      # features far from the origin
def test_pruned_top_k_is_exact_with_lowered_screening(dtype, screen_dtype, offset):
    stats, means = random_classes(50, 24, seed=3, spread=0.5, offset=offset)
    head = LRRGDA(rank=10, dtype=dtype).fit(stats)
    check_all_k(head, queries(means, 40, seed=4), screen_dtype=screen_dtype)


def test_pruned_top_k_is_exact_on_near_ties():
    """Pairs of classes a hair apart, and exact duplicates: many scores within rounding."""
    stats, means = random_classes(20, 12, seed=5, spread=1.0)
    g = torch.Generator().manual_seed(6)
    covs = stats.covariances()
    twins = means + 1e-7 * torch.randn(means.shape, generator=g, dtype=torch.float64)
    stats.add_classes(range(20, 40), twins, covs, torch.full((20,), 50.0))
    stats.add_classes(range(40, 60), means, covs, torch.full((20,), 50.0))
    for dtype, screen in ((torch.float64, torch.float64), (torch.float32, torch.bfloat16)):
        head = LRRGDA(rank=6, dtype=dtype).fit(stats)
        check_all_k(head, queries(means, 40, seed=7), screen_dtype=screen)


def test_pruned_top_k_is_exact_with_tiny_and_huge_spreads():
    """Classes whose covariances span twelve orders of magnitude: kappa near 0 and near 1."""
    scales = torch.logspace(-6, 6, 40, dtype=torch.float64)[torch.randperm(
        40, generator=torch.Generator().manual_seed(8))]
    stats, means = random_classes(40, 16, seed=9, spread=2.0, scales=scales, rank=4)
    X = torch.cat([queries(means, 30, seed=10, noise=0.01), queries(means, 30, seed=11, noise=30)])
    for dtype, screen in ((torch.float64, torch.float32), (torch.float32, torch.bfloat16)):
        head = LRRGDA(rank=4, dtype=dtype).fit(stats)
        check_all_k(head, X, screen_ranks=(0, 1, 3), screen_dtype=screen)


def test_pruned_top_k_is_exact_when_k_is_every_class():
    stats, means = random_classes(12, 8, seed=12)
    head = LRRGDA(rank=4).fit(stats)
    X = queries(means, 20, seed=13)
    scores, labels = head.top_k(X, 12, pruned=True, screen_rank=2)
    assert_exact_top_k(head, head._prepare(X), 12, scores, labels)


@pytest.mark.parametrize("rank, screened", [(64, 16), (8, 2), (3, 1)])
def test_default_screening_takes_a_quarter_of_the_rank_and_stays_exact(rank, screened):
    stats, means = random_classes(20, 72, seed=rank, rank=rank)
    head = LRRGDA(rank=rank).fit(stats)
    X = queries(means, 40, seed=rank + 1)
    scores, labels = head.top_k(X, 3, pruned=True)
    assert head.last_pruning_["screen_rank"] == screened
    assert_exact_top_k(head, head._prepare(X), 3, scores, labels)
    assert torch.equal(labels, head.top_k(X, 3, pruned=True, screen_rank=screened)[1])
