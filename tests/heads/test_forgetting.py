"""Guaranteed forgetting: for every head, its statistics and every scikit-learn estimator,
``forget(c)`` gives the model fitted on data that never held ``c`` (float64, 1e-10), and the
state it keeps (``state_dict``, statistics, caches) holds nothing of ``c``.

The data are drawn with hypothesis: classes (labels, counts), the batches the samples arrive in,
and the classes to forget. "Never" is the same samples, in the same batches, less those of the
forgotten classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.base import clone
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils.estimator_checks import parametrize_with_checks

import gdacil.sklearn as gsk
from gdacil import ClassGaussians
from gdacil.heads import (
    ACIL,
    LDA,
    LRRGDA,
    NCM,
    QDA,
    RBFLDA,
    RGDA,
    FeCAM,
    RanPAC,
    SGDHead,
    ShardedHead,
)
from gdacil.heads.base import NotFittedError
from gdacil.stats import PooledGaussians

PROPERTY = settings(max_examples=12, deadline=None, derandomize=True)
TOL = 1e-10


@dataclass
class Problem:
    """Samples ``X`` ``(n, d)`` of classes ``y`` in ``batches`` (index tensors), and ``gone``,
    the classes to forget."""

    X: torch.Tensor
    y: torch.Tensor
    batches: list[torch.Tensor]
    gone: list[int]

    @property
    def classes(self) -> list[int]:
        """The labels in the order statistics hold them (each batch's new ones sorted)."""
        return self.stats().classes

    @property
    def kept(self) -> list[int]:
        return [c for c in self.classes if c not in self.gone]

    def chunks(self, *, never: bool = False):
        """``(X, y)`` of every batch (``never``: less the forgotten classes' samples)."""
        for idx in self.batches:
            if never:
                idx = idx[~torch.isin(self.y[idx], torch.tensor(self.gone))]
            if len(idx):
                yield self.X[idx], self.y[idx]

    def stats(self, *, never: bool = False) -> ClassGaussians:
        stats = ClassGaussians(self.X.shape[1])
        for X, y in self.chunks(never=never):
            stats.update(X, y)
        return stats

    def queries(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(99)
        return torch.randn(20, self.X.shape[1], generator=g, dtype=torch.float64) * 2


@st.composite
def problems(draw, min_classes=2, max_classes=5, min_kept=1):
    d = draw(st.integers(2, 5))
    labels = draw(st.lists(st.integers(-40, 40), min_size=min_classes, max_size=max_classes,
                           unique=True))
    counts = draw(st.lists(st.integers(2, 9), min_size=len(labels), max_size=len(labels)))
    gone = draw(st.lists(st.sampled_from(labels), min_size=1,
                         max_size=len(labels) - min_kept, unique=True))
    seed = draw(st.integers(0, 2**16))
    n_batches = draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(seed)
    X, y = [], []
    for label, n in zip(labels, counts):
        centre = 2.0 * torch.randn(d, generator=g, dtype=torch.float64)
        mix = torch.randn(d, d, generator=g, dtype=torch.float64) * 0.6
        X.append(centre + torch.randn(n, d, generator=g, dtype=torch.float64) @ mix)
        y.append(torch.full((n,), label))
    # two samples of every class come first, in the first batch: every model is defined
    # after it, whatever the classes forgotten
    starts = torch.tensor([0, *counts]).cumsum(0)[:-1]
    first = torch.cat([starts, starts + 1])
    rest = torch.tensor([i for i in range(sum(counts)) if i not in set(first.tolist())],
                        dtype=torch.long)
    order = torch.cat([first, rest[torch.randperm(len(rest), generator=g)]])
    X, y = torch.cat(X)[order], torch.cat(y)[order]
    cuts = sorted(draw(st.lists(st.integers(len(first), len(y) - 1), max_size=n_batches - 1,
                                unique=True)) if len(y) > len(first) else [])
    batches = list(torch.tensor_split(torch.arange(len(y)), cuts))
    return Problem(X, y, batches, gone)


def rel(a, b) -> float:
    """Largest difference, relative to the largest magnitude (1 for values below 1)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape
    if not a.numel():
        return 0.0
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def assert_same_state(forgot, never, tol=TOL) -> None:
    """The same state tensors (names, shapes, dtypes, values within ``tol``) and metadata
    entries (their values may differ: LR-RGDA's ``n_decomposed_`` counts the work done)."""
    (t1, m1), (t2, m2) = forgot.state_dict(), never.state_dict()
    assert sorted(t1) == sorted(t2)
    for name in t1:
        assert t1[name].dtype == t2[name].dtype, name
        if t1[name].is_floating_point():
            assert rel(t1[name], t2[name]) <= tol, name
        else:
            assert torch.equal(t1[name], t2[name]), name
    assert m1.keys() == m2.keys()


def assert_no_row_of(state_tensors: dict, mean: torch.Tensor) -> None:
    """No float tensor holds ``mean`` as a row (or column) of its last two dimensions."""
    d = mean.shape[0]
    for name, t in state_tensors.items():
        if not t.is_floating_point() or t.ndim == 0:
            continue
        t = t.double()
        for view in (t, t.transpose(-1, -2)) if t.ndim > 1 else (t,):
            if view.shape[-1] == d:
                close = (view.reshape(-1, d) - mean).abs().amax(1) <= 1e-9 * (
                    1.0 + float(mean.abs().max()))
                assert not bool(close.any()), f"{name} holds a row equal to the forgotten mean"


# ---------------------------------------------------------------------- Gaussian heads
GAUSSIAN_HEADS = {
    "ncm": lambda: NCM(),
    "ncm-cosine": lambda: NCM("cosine", priors="empirical"),
    "lda": lambda: LDA(),
    "lda-paper": lambda: LDA.paper(priors="empirical"),
    "qda": lambda: QDA(reg_param=0.1),
    "rgda": lambda: RGDA(),
    "rgda-trace": lambda: RGDA(identity_scale="trace", priors="empirical"),
    "lrrgda": lambda: LRRGDA(rank=2),
    "lrrgda-randomized": lambda: LRRGDA(rank=1, decomposition="randomized", oversample=1),
    "lrrgda-float32": lambda: LRRGDA(rank=2, dtype="float32"),
    "fecam": lambda: FeCAM(),
    "fecam-shrunk": lambda: FeCAM(alpha1=0.5, alpha2=0.5, normalize=False),
    "sgd": lambda: SGDHead(samples_per_class=8, base_steps=16, steps_per_class=2,
                           batch_size=8, resample_every=10),
}


@pytest.mark.parametrize("name", GAUSSIAN_HEADS)
@PROPERTY
@given(problem=problems())
def test_forget_equals_a_fit_that_never_saw_the_classes(name, problem):
    make = GAUSSIAN_HEADS[name]
    stats = problem.stats()
    head = make().fit(stats)
    mean = stats.means[stats.positions(problem.gone[:1])][0].clone()
    if name == "ncm":  # the scan finds the mean where it is
        with pytest.raises(AssertionError, match="holds a row equal to the forgotten mean"):
            assert_no_row_of(head.state_dict()[0], mean)
    assert head.forget(problem.gone, stats) is head
    never_stats = problem.stats(never=True)
    never = make().fit(never_stats)
    assert stats.classes == never_stats.classes == problem.kept
    assert head.classes_.tolist() == problem.kept
    tol = 1e-5 if name == "lrrgda-float32" else TOL
    Q = problem.queries()
    assert rel(head.decision_function(Q), never.decision_function(Q)) <= tol
    assert_same_state(head, never, tol)
    assert_no_row_of(head.state_dict()[0], mean)


@pytest.mark.parametrize("name", GAUSSIAN_HEADS)
def test_forget_is_a_fit_on_the_statistics_left_bit_for_bit(name):
    problem = _fixed_problem()
    stats = problem.stats()
    head = GAUSSIAN_HEADS[name]().fit(stats)
    rest = stats.subset(problem.kept)
    head.forget(problem.gone, stats)
    fresh = GAUSSIAN_HEADS[name]().fit(rest)
    Q = problem.queries()
    assert torch.equal(head.decision_function(Q), fresh.decision_function(Q))


def _fixed_problem() -> Problem:
    g = torch.Generator().manual_seed(5)
    y = torch.arange(60) % 4 * 10
    X = torch.randn(60, 4, generator=g, dtype=torch.float64) + y[:, None] / 10
    return Problem(X, y, list(torch.tensor_split(torch.arange(60), [25, 41])), [10, 30])


def test_lrrgda_drops_the_eigenpairs_of_the_forgotten_classes_and_decomposes_nothing():
    problem = _fixed_problem()
    stats = problem.stats()
    head = LRRGDA(rank=2).fit(stats)
    tensors, meta = head.state_dict()
    assert tensors["_eig_cache.U"].shape[0] == 4
    loaded = LRRGDA(rank=2).load_state_dict(tensors, meta)  # stored pairs, not bound yet
    loaded.forget([10], stats.copy())
    assert "_stored_eigenpairs" not in vars(loaded)
    head.forget(problem.gone, stats)
    assert head.n_decomposed_ == 0 and list(head._eig_cache) == problem.kept
    assert head.state_dict()[0]["_eig_cache.U"].shape[0] == 2
    never = LRRGDA(rank=2).fit(problem.stats(never=True))
    for key in ("_eig_cache.U", "_eig_cache.s"):
        assert rel(head.state_dict()[0][key].abs(), never.state_dict()[0][key].abs()) <= TOL


def test_fecam_forgets_from_its_own_statistics_and_leaves_the_callers():
    problem = _fixed_problem()
    stats = problem.stats()
    head = FeCAM().fit_stats(stats)  # by reference: copied before it changes them
    head.forget(problem.gone)
    assert stats.classes == problem.classes  # the caller's statistics keep every class
    assert head.stats_.classes == problem.kept and head.rows_.shape[0] == 2
    streaming = FeCAM(tukey=0.5)
    for X, y in problem.chunks():
        streaming.partial_fit(X.abs(), y)
    streaming.forget(problem.gone)
    never = FeCAM(tukey=0.5)
    for X, y in problem.chunks(never=True):
        never.partial_fit(X.abs(), y)
    Q = problem.queries().abs()
    assert rel(streaming.decision_function(Q), never.decision_function(Q)) <= TOL
    assert_same_state(streaming, never)


@pytest.mark.parametrize("make", [lambda: LDA(), lambda: LRRGDA(rank=2), lambda: QDA(0.2)])
@PROPERTY
@given(problem=problems())
def test_a_sharded_head_forgets_like_one_fitted_without_the_classes(make, problem):
    stats = problem.stats()
    sharded = ShardedHead(make()).fit(stats)
    sharded.forget(problem.gone, stats)
    never = ShardedHead(make()).fit(problem.stats(never=True))
    assert sharded.classes_.tolist() == never.classes_.tolist() == problem.kept
    Q = problem.queries()
    k = len(problem.kept)
    (s1, l1), (s2, l2) = sharded.top_k(Q, k), never.top_k(Q, k)
    assert torch.equal(l1, l2) and rel(s1, s2) <= TOL
    assert_same_state(sharded.head_, never.head_)


# ---------------------------------------------------------------------- Gaussian heads: errors
def test_an_unknown_class_is_named_and_nothing_changes():
    problem = _fixed_problem()
    stats = problem.stats()
    head = LRRGDA(rank=2).fit(stats)
    before, scatters = head.state_dict(), stats.scatters.clone()
    with pytest.raises(ValueError, match=r"LRRGDA.forget: unknown class 7; it holds classes "
                                         r"\[0, 10, 20, 30\]"):
        head.forget([10, 7], stats)
    assert stats.classes == problem.classes and torch.equal(stats.scatters, scatters)
    after = head.state_dict()
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    sharded = ShardedHead(LDA()).fit(stats)
    with pytest.raises(ValueError, match="unknown class 7"):
        sharded.forget(7, stats)
    with pytest.raises(ValueError, match="unknown class 5"):
        FeCAM().partial_fit(problem.X, problem.y).forget(5)
    with pytest.raises(ValueError, match="must be integers"):
        head.forget(["ten"], stats)


def test_priors_given_as_an_array_are_refused_and_a_mapping_keeps_the_classes_left():
    problem = _fixed_problem()
    stats = problem.stats()
    head = LDA(priors=[0.1, 0.2, 0.3, 0.4]).fit(stats)
    with pytest.raises(ValueError, match="priors given as an array"):
        head.forget(10, stats)
    assert stats.classes == problem.classes
    priors = {0: 0.1, 10: 0.2, 20: 0.3, 30: 0.4}
    head = LDA(priors=priors).fit(stats).forget(problem.gone, stats)
    never = LDA(priors={0: 0.25, 20: 0.75}).fit(problem.stats(never=True))
    Q = problem.queries()
    assert rel(head.decision_function(Q), never.decision_function(Q)) <= TOL


@pytest.mark.parametrize("make", [NCM, LDA, lambda: LRRGDA(rank=2), FeCAM])
def test_forgetting_every_class_leaves_the_head_unfitted(make):
    problem = _fixed_problem()
    stats = problem.stats()
    head = make().fit(stats).forget(problem.classes, stats)
    assert stats.n_classes == 0
    assert not [n for n in vars(head) if n.endswith("_") or n.startswith("_")]
    with pytest.raises(NotFittedError):
        head.predict(problem.X)
    with pytest.raises(NotFittedError):
        make().forget(0, problem.stats())
    stats = problem.stats()
    assert make().fit(stats).forget([], stats).classes_.tolist() == problem.classes


def test_a_refit_that_fails_leaves_the_head_unfitted_and_the_classes_gone(monkeypatch):
    problem = _fixed_problem()
    stats = problem.stats()
    head = LRRGDA(rank=2).fit(stats)

    def fail(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(LRRGDA, "_build", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        head.forget(10, stats)
    assert stats.classes == [0, 20, 30]
    assert not hasattr(head, "rows_") and not hasattr(head, "_eig_cache")
    monkeypatch.undo()
    head.fit(stats)
    assert head.classes_.tolist() == [0, 20, 30]


# ---------------------------------------------------------------------- pooled statistics
@PROPERTY
@given(problem=problems())
def test_removable_pooled_statistics_remove_a_class_exactly(problem):
    d = problem.X.shape[1]
    stats, never = PooledGaussians(d, removable=True), PooledGaussians(d)
    for X, y in problem.chunks():
        stats.update(X, y)
    for X, y in problem.chunks(never=True):
        never.update(X, y)
    for c in problem.classes:
        Xc = problem.X[problem.y == c]
        Xc = Xc - Xc.mean(0)
        assert rel(stats.class_scatter(c), Xc.T @ Xc) <= TOL
    assert stats.remove_classes(problem.gone) is stats
    assert stats.classes == never.classes
    for name in ("counts", "means", "scatter"):
        assert rel(getattr(stats, name), getattr(never, name)) <= TOL
    assert set(stats._factors) == set(problem.kept)
    loaded = PooledGaussians.from_state_dict(stats.state_dict())
    assert loaded.removable and rel(loaded.scatter, stats.scatter) == 0.0
    merged = PooledGaussians(d, removable=True)
    for X, y in problem.chunks():
        merged.merge(PooledGaussians(d, removable=True).update(X, y))
    merged.remove_classes(problem.gone)
    assert rel(merged.scatter, never.scatter) <= TOL


def test_pooled_statistics_refuse_what_they_cannot_remove():
    problem = _fixed_problem()
    plain = PooledGaussians(4).update(problem.X, problem.y)
    with pytest.raises(ValueError, match="build them with removable=True"):
        plain.remove_classes([10])
    removable = PooledGaussians(4, removable=True).update(problem.X, problem.y)
    with pytest.raises(ValueError, match="cannot merge statistics that are not removable"):
        removable.merge(plain)
    with pytest.raises(KeyError, match="unknown class 7"):
        removable.remove_classes([10, 7])
    assert removable.classes == problem.classes
    state = removable.state_dict()
    state["class_factors"] = 2 * state["class_factors"]
    with pytest.raises(ValueError, match="do not add up to the pooled scatter"):
        PooledGaussians.from_state_dict(state)
    many = PooledGaussians(2, removable=True).update(problem.X[:, :2], problem.y)
    assert max(len(F) for F in many._factors.values()) == 2  # QR-compressed to M rows
    removable.remove_classes(problem.classes)
    assert removable.n_classes == 0 and not bool(removable.scatter.any())
    assert removable.memory_report()["class_factors"] == 0


def test_pooling_class_statistics_keeps_each_class_removable():
    problem = _fixed_problem()
    pooled = PooledGaussians.from_class_statistics(problem.stats(), removable=True)
    pooled.remove_classes(problem.gone)
    never = PooledGaussians.from_class_statistics(problem.stats(never=True))
    assert rel(pooled.scatter, never.scatter) <= TOL and rel(pooled.means, never.means) == 0.0


# ---------------------------------------------------------------------- mapped heads
MAPPED_HEADS = {
    "ranpac": lambda **kw: RanPAC(dim_out=64, lam=1.0, seed=3, **kw),
    "ranpac-raw": lambda **kw: RanPAC(dim_out=0, lam=0.5, **kw),
    "acil": lambda **kw: ACIL(buffer_size=64, gamma=0.3, **kw),
    "rbf-lda": lambda **kw: RBFLDA(dim_out=64, bandwidth=3.0, **kw),
    "rbf-lda-fixed": lambda **kw: RBFLDA(dim_out=64, bandwidth=2.0, shrinkage=0.3,
                                         priors="empirical", **kw),
}


@pytest.mark.parametrize("name", MAPPED_HEADS)
@PROPERTY
@given(problem=problems())
def test_a_forgettable_mapped_head_forgets_like_one_that_never_saw_the_classes(name, problem):
    make = MAPPED_HEADS[name]
    head = make(forgettable=True)
    for X, y in problem.chunks():
        head.partial_fit(X, y)
    mean = head.stats_.means[head.stats_.positions(problem.gone[:1])][0].clone()
    assert head.forget(problem.gone) is head
    never = make()
    for X, y in problem.chunks(never=True):
        never.partial_fit(X, y)
    assert head.classes_.tolist() == never.classes_.tolist() == problem.kept
    Q = problem.queries()
    assert rel(head.decision_function(Q), never.decision_function(Q)) <= TOL
    tensors, meta = head.state_dict()
    theirs, their_meta = never.state_dict()
    for key in theirs:
        assert rel(tensors[key], theirs[key]) <= TOL, key
    assert meta["state"].keys() == their_meta["state"].keys()  # the penalty, the shrinkage
    for key, value in their_meta["state"].items():
        assert rel(meta["state"][key], value) <= TOL, key
    assert tensors["stats.class_factors"].shape[0] == int(tensors["stats.class_factor_rows"].sum())
    assert_no_row_of(tensors, mean)


@pytest.mark.parametrize("name", ["ranpac", "rbf-lda"])
def test_a_loaded_or_merged_forgettable_head_still_forgets(name):
    make = MAPPED_HEADS[name]
    problem = _fixed_problem()
    shards = [make(forgettable=True).partial_fit(X, y) for X, y in problem.chunks()]
    head = shards[0]
    for shard in shards[1:]:
        head.merge(shard)
    state = head.state_dict()
    loaded = type(head)(**state[1]["params"]).load_state_dict(*state)
    keep = ~torch.isin(problem.y, torch.tensor(problem.gone))
    never = make().fit(problem.X[keep], problem.y[keep])
    Q = problem.queries()
    for h in (head, loaded):
        h.forget(problem.gone)
        assert rel(h.decision_function(Q), never.decision_function(Q)) <= TOL


def test_raw_ridge_fitted_on_class_statistics_forgets_too():
    problem = _fixed_problem()
    head = RanPAC(dim_out=0, lam=0.5, forgettable=True).fit_stats(problem.stats())
    head.forget(problem.gone)
    never = RanPAC(dim_out=0, lam=0.5).fit_stats(problem.stats(never=True))
    Q = problem.queries()
    assert rel(head.decision_function(Q), never.decision_function(Q)) <= TOL
    with pytest.raises(ValueError, match="build them with PooledGaussians.removable=True."):
        RanPAC(dim_out=0, lam=0.5, forgettable=True).fit_stats(
            PooledGaussians(4).update(problem.X, problem.y))


def test_mapped_heads_say_why_they_cannot_forget_and_change_nothing():
    problem = _fixed_problem()
    head = ACIL(buffer_size=32).fit(problem.X, problem.y)
    before = head.decision_function(problem.X)
    with pytest.raises(ValueError, match=r"one\s+M x M matrix.*ACIL\(\.\.\., forgettable=True\)"):
        head.forget(10)
    assert head.classes_.tolist() == problem.classes
    assert torch.equal(head.decision_function(problem.X), before)
    head.set_params(forgettable=True)
    with pytest.raises(ValueError, match="gathered while forgettable was False"):
        head.forget(10)
    forgettable = ACIL(buffer_size=32, forgettable=True).fit(problem.X, problem.y)
    with pytest.raises(ValueError, match="unknown class 3"):
        forgettable.forget([10, 3])
    assert forgettable.classes_.tolist() == problem.classes
    with pytest.raises(ValueError, match="needs a numeric lam: lam='auto' is chosen from the "
                                         "samples"):
        RanPAC(dim_out=16, forgettable=True).fit(problem.X, problem.y)
    with pytest.raises(ValueError, match="needs a numeric bandwidth"):
        RBFLDA(dim_out=16, forgettable=True).fit(problem.X, problem.y)
    with pytest.raises(ValueError, match="forgettable must be True or False"):
        ACIL(buffer_size=8, forgettable="yes").fit(problem.X, problem.y)
    with pytest.raises(NotFittedError):
        ACIL(forgettable=True).forget(1)
    forgettable.forget(problem.classes)
    assert not hasattr(forgettable, "stats_") and not hasattr(forgettable, "lam_")
    with pytest.raises(NotFittedError):
        forgettable.predict(problem.X)


def test_the_default_keeps_no_class_scatter():
    problem = _fixed_problem()
    head = RanPAC(dim_out=32, lam=1.0).fit(problem.X, problem.y)
    assert not head.stats_.removable and not head.stats_._factors
    assert "stats.class_factors" not in head.state_dict()[0]
    assert "class_factors" not in head.memory_report()


# ---------------------------------------------------------------------- scikit-learn estimators
ESTIMATORS = [
    gsk.NCMClassifier(),
    gsk.LDAClassifier(priors="empirical"),
    gsk.QDAClassifier(reg_param=0.1),
    gsk.RGDAClassifier(),
    gsk.LRRGDAClassifier(rank=2),
    gsk.FeCAMClassifier(tukey=0.5),
    gsk.RanPACClassifier(dim_out=64, lam=1.0, forgettable=True),
    gsk.ACILClassifier(buffer_size=64, forgettable=True),
    gsk.RBFLDAClassifier(dim_out=64, bandwidth=3.0, forgettable=True),
]


def _named(problem: Problem):
    """The problem's labels as strings, and a boolean mask of the forgotten classes' samples."""
    names = np.array([f"class {c}" for c in problem.y.tolist()], dtype=object)
    return problem.X.numpy(), names, np.isin(problem.y.numpy(), problem.gone)


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=repr)
@settings(max_examples=8, deadline=None, derandomize=True)
@given(problem=problems(min_classes=3, min_kept=2))
def test_an_estimator_forgets_like_one_fitted_without_the_classes(estimator, problem):
    X, y, gone = _named(problem)
    clf = clone(estimator)
    for idx in problem.batches:
        clf.partial_fit(X[idx.numpy()], y[idx.numpy()])
    forgotten = sorted({f"class {c}" for c in problem.gone})
    assert clf.forget(forgotten) is clf
    never = clone(estimator)
    for idx in problem.batches:
        keep = idx.numpy()[~gone[idx.numpy()]]
        if keep.size:
            never.partial_fit(X[keep], y[keep])
    assert clf.classes_.tolist() == never.classes_.tolist()
    assert rel(clf.predict_log_proba(X), never.predict_log_proba(X)) <= TOL
    assert (clf.predict(X) == never.predict(X)).all()
    assert len(clf.stats_) == len(never.stats_) == len(clf.head_.classes_) == len(clf.classes_)
    # a forgotten class can come back, as a new class
    clf.partial_fit(X[gone], y[gone])
    again = clone(estimator).fit(*_reordered(X, y, gone))
    assert clf.classes_.tolist() == again.classes_.tolist()
    assert rel(clf.predict_log_proba(X), again.predict_log_proba(X)) <= 1e-8


def _reordered(X, y, gone):
    """The samples of the classes kept first, then those of the forgotten ones."""
    order = np.concatenate([np.flatnonzero(~gone), np.flatnonzero(gone)])
    return X[order], y[order]


def test_an_estimator_refuses_what_it_cannot_forget_and_changes_nothing():
    problem = _fixed_problem()
    X, y, _ = _named(problem)
    for clf, match in [
        (gsk.LDAClassifier().fit(X, y), r"unknown class 'class 7'; the classes are"),
        (gsk.LDAClassifier(priors=[0.1, 0.2, 0.3, 0.4]).fit(X, y), "give priors as a mapping"),
        (gsk.RanPACClassifier(dim_out=16, lam=1.0).fit(X, y), "forgettable=True"),
    ]:
        before = clf.predict_log_proba(X)
        stats = clf.stats_.copy()
        with pytest.raises(ValueError, match=match):
            clf.forget(["class 10", "class 7"] if "unknown" in match else "class 10")
        assert clf.classes_.tolist() == sorted(set(y)) and len(clf.stats_) == len(stats)
        assert np.array_equal(clf.predict_log_proba(X), before)
    clf = gsk.RanPACClassifier(dim_out=16, lam=1.0).fit(X, y).set_params(forgettable=True)
    with pytest.raises(ValueError, match="forgettable changed from False to True"):
        clf.partial_fit(X, y)


def test_an_estimator_that_forgets_every_class_is_unfitted_until_it_learns_again():
    problem = _fixed_problem()
    X, y, _ = _named(problem)
    clf = gsk.ACILClassifier(buffer_size=16, forgettable=True).fit(X, y)
    clf.forget(sorted(set(y)))
    assert not hasattr(clf, "classes_") and not hasattr(clf, "stats_")
    with pytest.raises(SklearnNotFittedError):
        clf.predict(X)
    with pytest.raises(SklearnNotFittedError):
        clf.forget("class 0")
    clf.partial_fit(X[:10], y[:10])
    assert clf.classes_.tolist() == sorted(set(y[:10]))


def test_an_estimator_whose_rebuild_fails_has_lost_the_classes_and_refits_on_partial_fit(
        monkeypatch):
    problem = _fixed_problem()
    X, y, gone = _named(problem)
    clf = gsk.RGDAClassifier().fit(X, y)

    def fail(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(RGDA, "_build", fail)
    with pytest.raises(RuntimeError, match="interrupted"):
        clf.forget(["class 10", "class 30"])
    monkeypatch.undo()
    assert clf.classes_.tolist() == ["class 0", "class 20"] and len(clf.stats_) == 2
    with pytest.raises(SklearnNotFittedError):
        clf.predict(X)
    clf.partial_fit(X[~gone], y[~gone])
    assert clf.classes_.tolist() == ["class 0", "class 20"]


@parametrize_with_checks([gsk.RanPACClassifier(dim_out=16, lam=1.0, forgettable=True),
                          gsk.RBFLDAClassifier(dim_out=16, bandwidth=1.0, forgettable=True)])
def test_forgettable_estimators_pass_check_estimator(estimator, check):
    check(estimator)
