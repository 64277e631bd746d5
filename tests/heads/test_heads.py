"""Every head against a dense reference: the Gaussian log-posterior computed with solve/logdet.

Each head passes the public contract, :class:`gdacil.testing.HeadContract`: a test class names
its head and dense reference and inherits every check (scores, argmax, probabilities, batching,
dtype, errors, state, parameters, statistics left unchanged, refits, top-k).
"""

import warnings
from typing import ClassVar

import numpy as np
import pytest
import torch

from gdacil import ClassGaussians
from gdacil.heads import HEADS, LDA, LRRGDA, NCM, QDA, RGDA, SGDHead, build_head
from gdacil.stats.linalg import NumericalWarning, top_eigh
from gdacil.testing import HeadContract, gaussian_scores, make_stats, queries, uniform_log_priors

from _assets import needs_minilm, needs_wordnet


class TestNCM(HeadContract):
    exact_scores = True
    densities = True

    def make_head(self, **kw):
        return NCM(**kw)

    def mixture_covariance(self, stats):
        return torch.eye(stats.dim, dtype=torch.float64)

    def reference(self, stats, X):
        d = stats.dim
        eye = torch.eye(d, dtype=torch.float64).expand(stats.n_classes, d, d)
        return gaussian_scores(X, stats.means, eye, uniform_log_priors(stats))


class TestCosineNCM(HeadContract):
    exact_scores = True

    def make_head(self, **kw):
        return NCM("cosine", **kw)

    def reference(self, stats, X):
        cos = torch.nn.functional.cosine_similarity(X[:, None, :], stats.means[None], dim=2)
        return cos + uniform_log_priors(stats)


def mean_variance(stats):
    """``tr(Sigma_avg) / d`` from the class covariances one by one: the unit of LDA's shrinkage
    target and of ``identity_scale="trace"``."""
    return torch.stack([c.trace() for c in stats.covariances()]).mean() / stats.dim


def per_sample_variance(stats):
    """``tr(Sigma_avg) / (N - C)``: the unit of RGDA's and LR-RGDA's default identity term
    (``identity_scale="samples"``), from the counts one by one."""
    dof = sum(float(n) - 1.0 for n in stats.counts)
    return mean_variance(stats) * stats.dim / dof


class TestLDA(HeadContract):
    unit = staticmethod(mean_variance)

    def make_head(self, **kw):
        return LDA(0.1, **kw)

    def reference(self, stats, X):
        avg = stats.average_covariance()
        shared = 0.9 * avg + 0.1 * self.unit(stats) * torch.eye(stats.dim, dtype=torch.float64)
        return gaussian_scores(X, stats.means, shared.expand(stats.n_classes, -1, -1),
                               uniform_log_priors(stats))


class TestPaperLDA(TestLDA):
    unit = staticmethod(lambda stats: 1.0)

    def make_head(self, **kw):
        return LDA.paper(**kw)


class TestRGDA(HeadContract):
    exact_scores = True
    densities = True
    unit = staticmethod(per_sample_variance)
    alphas = (0.1, 2.0, 0.6)

    def make_head(self, **kw):
        return RGDA(**kw)

    def covariances(self, stats):
        a1, a2, a3 = self.alphas
        eye = torch.eye(stats.dim, dtype=torch.float64)
        return (a1 * stats.covariances() + a2 * stats.average_covariance()
                + a3 * self.unit(stats) * eye)

    def mixture_covariance(self, stats):
        return self.covariances(stats).mean(0)

    def reference(self, stats, X):
        return gaussian_scores(X, stats.means, self.covariances(stats), uniform_log_priors(stats))


class TestTraceRGDA(TestRGDA):
    unit = staticmethod(mean_variance)
    alphas = (0.2, 2.0, 0.5)

    def make_head(self, **kw):
        return RGDA(*self.alphas, identity_scale="trace", **kw)


class TestPaperRGDA(TestRGDA):
    unit = staticmethod(lambda stats: 1.0)
    alphas = (0.2, 2.0, 0.5)

    def make_head(self, **kw):
        return RGDA.paper(**kw)


class TestLRRGDA(HeadContract):
    rank = 3
    densities = True
    top_k_options: ClassVar = {"pruned": True, "screen_rank": 1}  # pruned search, few classes
    unit = staticmethod(per_sample_variance)
    alphas = (0.1, 2.0, 0.6)

    def make_head(self, **kw):
        return LRRGDA(rank=self.rank, decomposition="eigh", **kw)

    def mixture_covariance(self, stats):
        """The mean class covariance of the full-rank model (RGDA's)."""
        return TestRGDA.covariances(self, stats).mean(0)

    def reference(self, stats, X):
        U, s = top_eigh(stats.covariances(), self.rank)
        truncated = U @ torch.diag_embed(s) @ U.transpose(1, 2)
        eye = torch.eye(stats.dim, dtype=torch.float64)
        a1, a2, a3 = self.alphas
        covs = a1 * truncated + a2 * stats.average_covariance() + a3 * self.unit(stats) * eye
        return gaussian_scores(X, stats.means, covs, uniform_log_priors(stats))


class TestPaperLRRGDA(TestLRRGDA):
    unit = staticmethod(lambda stats: 1.0)
    alphas = (0.2, 2.0, 0.5)

    def make_head(self, **kw):
        return LRRGDA.paper(rank=self.rank, decomposition="eigh", **kw)


class TestQDA(HeadContract):
    exact_scores = True
    densities = True

    def make_head(self, **kw):
        return QDA(0.05, **kw)

    def covariances(self, stats):
        return 0.95 * stats.covariances() + 0.05 * torch.eye(stats.dim, dtype=torch.float64)

    def mixture_covariance(self, stats):
        return self.covariances(stats).mean(0)

    def reference(self, stats, X):
        return gaussian_scores(X, stats.means, self.covariances(stats), uniform_log_priors(stats))


class TestSGD(HeadContract):
    """The SGD head has no closed form: its reference is the linear model it trained (seeded, so
    every fit trains the same one), scored densely. The other checks are what matter here."""

    exact_scores = True

    def make_head(self, **kw):
        return SGDHead(samples_per_class=32, base_steps=50, steps_per_class=0, batch_size=32, **kw)

    def reference(self, stats, X):
        head = self.make_head().fit(stats)
        return X @ head.rows_[:, 0].T + head.bias_[:, 0]


# ------------------------------------------------------------------ cross-head identities
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lrrgda_full_rank_equals_rgda_up_to_a_per_sample_constant(seed):
    stats, _, _ = make_stats(seed=seed, d=24, few_shot=(0, 2))  # n < d for two classes
    X = queries(stats.dim, seed=seed)
    full = RGDA().fit(stats).decision_function(X)
    for decomposition in ("eigh", "randomized"):
        low = LRRGDA(rank=stats.dim, decomposition=decomposition).fit(stats).decision_function(X)
        diff = low - full
        assert (diff - diff[:, :1]).abs().max() <= 1e-8
        assert torch.equal(low.argmax(1), full.argmax(1))
        # the constant is exactly 1/2 x^T B^{-1} x
        B = (2.0 * stats.average_covariance()
             + 0.6 * per_sample_variance(stats) * torch.eye(stats.dim, dtype=torch.float64))
        const = 0.5 * (X * torch.linalg.solve(B, X.T).T).sum(1)
        assert (diff[:, 0] - const).abs().max() <= 1e-8


def test_rgda_with_alpha_1_0_0_is_qda():
    stats, _, _ = make_stats(few_shot=())
    X = queries(stats.dim)
    a = RGDA(1.0, 0.0, 0.0).fit(stats).decision_function(X)
    b = QDA(0.0).fit(stats).decision_function(X)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)


def balanced_problem(seed=0, d=6, n_per_class=80, n_classes=4):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n_per_class * n_classes, d, generator=g, dtype=torch.float64)
    y = torch.arange(n_per_class * n_classes) % n_classes
    for c in range(n_classes):
        X[y == c] = X[y == c] * (1 + 0.5 * c) + 1.5 * torch.randn(d, generator=g, dtype=torch.float64)
    return X, y


@pytest.mark.parametrize("reg_param", [0.0, 0.3])
def test_qda_matches_scikit_learn(reg_param):
    from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis

    X, y = balanced_problem()
    X, y = X[:-7], y[:-7]  # unequal counts, so empirical priors matter
    sk = QuadraticDiscriminantAnalysis(reg_param=reg_param).fit(X.numpy(), y.numpy())
    head = QDA(reg_param, priors="empirical").fit(ClassGaussians(X.shape[1]).update(X, y))
    assert np.array_equal(sk.predict(X.numpy()), head.predict(X).numpy())
    assert np.abs(sk.predict_log_proba(X.numpy()) - head.predict_log_proba(X).numpy()).max() < 1e-9


@pytest.mark.parametrize("shrinkage", [0.0, 0.1, 0.5])
def test_lda_matches_scikit_learn(shrinkage):
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    X, y = balanced_problem(seed=4)
    sk = LinearDiscriminantAnalysis(solver="lsqr", shrinkage=shrinkage).fit(X.numpy(), y.numpy())
    head = LDA(shrinkage, shrinkage_target="scaled_identity").fit(
        ClassGaussians(X.shape[1]).update(X, y))
    assert np.array_equal(sk.predict(X.numpy()), head.predict(X).numpy())
    assert np.abs(sk.decision_function(X.numpy()) - head.decision_function(X).numpy()).max() < 1e-9
    assert np.abs(sk.predict_proba(X.numpy()) - head.predict_proba(X).numpy()).max() < 1e-12


def test_ncm_matches_scikit_learn_nearest_centroid():
    from sklearn.neighbors import NearestCentroid

    X, y = balanced_problem(seed=5)
    sk = NearestCentroid().fit(X.numpy(), y.numpy())
    head = NCM().fit(ClassGaussians(X.shape[1]).update(X, y))
    assert np.array_equal(sk.predict(X.numpy()), head.predict(X).numpy())


# ------------------------------------------------------------------ LR-RGDA specifics
def low_rank_stats(d=64, n_classes=12, rank=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    means, covs = [], []
    for _ in range(n_classes):
        U = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))[0]
        spectrum = torch.cat([torch.linspace(4.0, 1.0, rank), 1e-3 * torch.rand(d - rank, generator=g)])
        covs.append((U * spectrum) @ U.T)
        means.append(torch.randn(d, generator=g, dtype=torch.float64))
    return ClassGaussians.from_moments(list(range(n_classes)), torch.stack(means),
                                       0.5 * (torch.stack(covs) + torch.stack(covs).transpose(1, 2)),
                                       [100] * n_classes)


def test_randomized_decomposition_agrees_with_exact_on_low_rank_spectra():
    stats = low_rank_stats()
    X = queries(stats.dim)
    a = LRRGDA(rank=5, decomposition="randomized").fit(stats).decision_function(X)
    b = LRRGDA(rank=5, decomposition="eigh").fit(stats).decision_function(X)
    assert (a - b).abs().max() < 1e-8 * b.abs().max()


def test_randomized_decomposition_is_seeded_and_order_independent():
    stats = low_rank_stats(seed=3)
    X = queries(stats.dim)
    kw = {"rank": 3, "oversample": 2, "n_iter": 1, "decomposition": "randomized"}
    a = LRRGDA(**kw).fit(stats).decision_function(X)
    b = LRRGDA(**kw).fit(stats).decision_function(X)
    assert torch.equal(a, b)
    order = list(reversed(stats.classes))
    c = LRRGDA(**kw, class_batch_size=1).fit(stats.subset(order)).decision_function(X)
    assert torch.allclose(c.flip(1), a, rtol=0, atol=1e-10)
    # another seed takes another path to the same converged eigenpairs: the exact model
    d = LRRGDA(**kw, seed=7).fit(stats).decision_function(X)
    exact = LRRGDA(rank=3, decomposition="eigh").fit(stats).decision_function(X)
    assert not torch.equal(a, d)
    for scores in (a, d):
        torch.testing.assert_close(scores, exact, rtol=1e-7, atol=1e-7 * exact.abs().max().item())


def test_incremental_refit_decomposes_only_new_and_changed_classes():
    stats = low_rank_stats(n_classes=12)
    head = LRRGDA(rank=5).fit(stats)
    assert head.n_decomposed_ == 12
    extra = low_rank_stats(n_classes=3, seed=9)
    stats.add_classes([100, 101, 102], extra.means, extra.covariances(), extra.counts)
    stats.update(torch.randn(5, stats.dim, generator=torch.Generator().manual_seed(0)), [4] * 5)
    head.fit(stats)
    assert head.n_decomposed_ == 4  # three new classes and the updated class 4
    fresh = LRRGDA(rank=5).fit(stats)
    X = queries(stats.dim)
    assert torch.equal(head.classes_, fresh.classes_)
    assert torch.allclose(head.decision_function(X), fresh.decision_function(X), rtol=0, atol=1e-10)
    # changing the rank invalidates the cache
    head.rank = 4
    head.fit(stats)
    assert head.n_decomposed_ == stats.n_classes


def test_lrrgda_refuses_a_singular_base():
    stats, _, _ = make_stats()
    with pytest.raises(ValueError, match="alpha2 > 0 or alpha3 > 0"):
        LRRGDA(rank=2, alpha1=1.0, alpha2=0.0, alpha3=0.0).fit(stats)


def test_qda_on_few_shot_class_warns_and_stays_finite():
    stats, _, _ = make_stats(few_shot=(0,))
    with pytest.warns(NumericalWarning, match="not positive definite"):
        head = QDA(0.0).fit(stats)
    assert torch.isfinite(head.decision_function(queries(stats.dim))).all()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: RGDA(-1.0, 0.0, 0.0), "alpha1 must be a finite number >= 0"),
        (lambda: RGDA(0.0, 0.0, 0.0), "all zero"),
        (lambda: LDA(1.5), r"shrinkage must lie in \[0, 1\]"),
        (lambda: QDA(2.0), r"reg_param must lie in \[0, 1\]"),
        (lambda: NCM("manhattan"), "metric must be"),
        (lambda: LRRGDA(rank=0), "rank must be an integer >= 1"),
        (lambda: LRRGDA(decomposition="svd"), "decomposition must be"),
        (lambda: LDA(priors="balanced"), "priors must be"),
        (lambda: LDA(priors=[1.0, 2.0]), "one entry per class"),
        (lambda: LDA(priors=[0.0] * 6), "positive"),
    ],
)
def test_bad_parameters_are_refused_at_fit(make, match):
    stats, _, _ = make_stats()
    with pytest.raises(ValueError, match=match):
        make().fit(stats)


def test_registry_builds_every_head_and_rejects_unknown_names():
    stats, X, y = make_stats(few_shot=())
    for name in HEADS:
        head = build_head(name, **({"base_steps": 300} if name == "sgd" else {})).fit(stats)
        assert head.score(X, y) > 0.5, name
    with pytest.raises(ValueError, match="unknown head 'svm'; known: .*lr_rgda"):
        build_head("svm")


# ------------------------------------------------------------------ SGD head
def sgd_problem():
    g = torch.Generator().manual_seed(0)
    d, C = 16, 8
    mu = 1.5 * torch.randn(C, d, generator=g, dtype=torch.float64)
    X = torch.cat([torch.randn(60, d, generator=g, dtype=torch.float64) + mu[c] for c in range(C)])
    y = torch.arange(C).repeat_interleave(60)
    return ClassGaussians(d).update(X, y), X, y


def test_sgd_head_is_reproducible_and_learns_the_bayes_rule():
    stats, X, _ = sgd_problem()
    kw = {"base_steps": 600, "steps_per_class": 0, "resample_every": 200, "patience": None}
    a, b = SGDHead(**kw).fit(stats), SGDHead(**kw).fit(stats)
    assert torch.equal(a.rows_, b.rows_) and torch.equal(a.bias_, b.bias_)
    assert a.n_steps_ == 600 and len(a.loss_curve_) == 3
    assert a.loss_curve_[-1] < a.loss_curve_[0]
    # shared identity covariance: the Bayes rule is linear, so the SGD head should agree with LDA
    lda = LDA(0.0).fit(stats)
    assert (a.predict(X) == lda.predict(X)).double().mean() > 0.95
    assert not torch.equal(SGDHead(**kw, seed=1).fit(stats).rows_, a.rows_)


def test_sgd_head_step_budget_and_early_stopping():
    stats, _, _ = sgd_problem()
    head = SGDHead(base_steps=100, steps_per_class=5)
    assert head.n_steps_for(stats.n_classes) == 140
    stopped = SGDHead(base_steps=5000, steps_per_class=0, patience=5, lr=0.0, min_lr=0.0).fit(stats)
    assert stopped.n_steps_ < 100  # a frozen model cannot improve, so patience ends training


def test_sgd_head_samples_singular_covariances_without_warnings():
    stats, _, _ = make_stats(few_shot=(0, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = SGDHead(base_steps=50, steps_per_class=0).fit(stats)
    assert torch.isfinite(head.decision_function(queries(stats.dim))).all()


# ------------------------------------------------------------------ exact top-k with pruning
def pruning_problem(spread=4.0, offset=0.0, d=24, C=40, seed=0):
    """Classes with decaying spectra; ``offset`` shifts every feature (real features are not centred)."""
    g = torch.Generator().manual_seed(seed)
    means = spread * torch.randn(C, d, generator=g, dtype=torch.float64) + offset
    X = torch.cat([means[c] + torch.randn(30, d, generator=g, dtype=torch.float64)
                   @ torch.diag(torch.linspace(2.0, 0.1, d, dtype=torch.float64)) for c in range(C)])
    y = torch.arange(C).repeat_interleave(30)
    queries = X[::7] + 0.1 * torch.randn(len(X[::7]), d, generator=g, dtype=torch.float64)
    return ClassGaussians(d).update(X, y), queries


# every screening precision each head dtype accepts: its own and the lower ones
SCREENINGS = [(torch.float64, torch.float64), (torch.float64, torch.float32),
              (torch.float64, torch.bfloat16), (torch.float32, torch.float32),
              (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize(("dtype", "screen_dtype"), SCREENINGS)
@pytest.mark.parametrize("spread", [0.5, 4.0])  # overlapping and well-separated classes
def test_pruned_top_k_equals_dense_top_k(dtype, screen_dtype, spread):
    stats, queries = pruning_problem(spread)
    head = LRRGDA(rank=6, dtype=dtype).fit(stats)
    dense_scores, dense_labels = head.top_k(queries, 5, pruned=False)
    assert torch.equal(dense_labels[:, 0], head.predict(queries))
    for screen_rank in (0, 2, 5):
        scores, labels = head.top_k(queries, 5, pruned=True, screen_rank=screen_rank, sample_batch=16,
                                    screen_dtype=screen_dtype)
        assert torch.equal(labels, dense_labels)
        # the remaining rows are added to the screened part: rounding at the scale of the scores
        scale = float(dense_scores.abs().max()) * torch.finfo(dtype).eps
        torch.testing.assert_close(scores, dense_scores, rtol=0, atol=64 * scale)
    if spread == 4.0:
        assert head.last_pruning_["pairs_scored_fraction"] < 0.5
        assert head.last_pruning_["screen_dtype"] == str(screen_dtype).removeprefix("torch.")


@pytest.mark.parametrize(("spread", "k", "mode"), [(4.0, 1, "pruned"), (0.5, 30, "dense")])
def test_auto_pruning_follows_the_pilot_cost_and_stays_exact(spread, k, mode, monkeypatch):
    """The pilot is pruned with a dense pass's rows as its budget (rounds' rows at
    ``ROUND_ROW_COST``); within it, every batch is pruned, past it the pilot stops where it ran
    out and everything is scored densely."""
    import gdacil.heads.lowrank as lowrank

    monkeypatch.setattr(lowrank, "AUTO_PILOT", 16)  # a pilot batch, then 16-sample batches
    monkeypatch.setattr(lowrank, "AUTO_MIN_CLASSES", 10)  # 40 classes count as many
    stats, queries = pruning_problem(spread)
    head = LRRGDA(rank=6).fit(stats)
    dense_scores, dense_labels = head.top_k(queries, k, pruned=False)
    scores, labels = head.top_k(queries, k, screen_rank=2, sample_batch=16)  # pruned="auto"
    assert head.last_pruning_["mode"] == mode
    assert torch.equal(labels, dense_labels)
    scale = float(dense_scores.abs().max()) * torch.finfo(torch.float64).eps
    torch.testing.assert_close(scores, dense_scores, rtol=0, atol=64 * scale)
    auto_rows, auto_pairs = (head.last_pruning_[key] for key in ("rows_fraction",
                                                                  "pairs_scored_fraction"))
    pilot = head.top_k(queries[:16], k, pruned=True, screen_rank=2)
    pilot_rows = head.last_pruning_["rows_fraction"]      # the pilot pruned to the end
    assert torch.equal(pilot[1], dense_labels[:16])
    if mode == "pruned":  # the pilot fit its budget, so every batch was pruned
        assert pilot_rows <= 1.0 and auto_rows < 1.0
    else:  # it would not have: it stopped, and all was dense
        assert pilot_rows > 1.0
        assert auto_rows == 1.0 and auto_pairs == 1.0
        rounds, row_norms = [], LRRGDA._row_norms

        def counted(self, X, cls, smp, start, stop):
            rounds.append((start, stop))
            return row_norms(self, X, cls, smp, start, stop)

        monkeypatch.setattr(LRRGDA, "_row_norms", counted)
        head.fit(stats)  # forgets the verdict: the next call runs a pilot again
        head.top_k(queries[:16], k, screen_rank=2)
        assert head.last_pruning_["piloted"]
        r = head.rows_.shape[1] - 1
        assert not [1 for start, stop in rounds if start > 0 and stop == r]  # stopped early
        head.top_k(queries[:16], k, pruned=True, screen_rank=2)
        assert [1 for start, stop in rounds if start > 0 and stop == r]  # forced: to the end
    with pytest.raises(ValueError, match="pruned must be 'auto', True or False"):
        head.top_k(queries, k, pruned="sometimes")


@pytest.mark.parametrize(("spread", "k", "mode"), [(4.0, 1, "pruned"), (0.5, 30, "dense")])
def test_a_pilots_verdict_holds_for_the_next_calls_until_refit(spread, k, mode, monkeypatch):
    """A pilot's verdict serves ``AUTO_VERDICT_CALLS`` later calls with the same k and screening
    (no pilot: a call of a few samples would pay one each time), then a pilot runs again; another
    k pilots for itself, and fit forgets. Every call stays exact."""
    import gdacil.heads.lowrank as lowrank

    monkeypatch.setattr(lowrank, "AUTO_PILOT", 16)
    monkeypatch.setattr(lowrank, "AUTO_MIN_CLASSES", 10)
    monkeypatch.setattr(lowrank, "AUTO_VERDICT_CALLS", 2)
    stats, queries = pruning_problem(spread)
    head = LRRGDA(rank=6).fit(stats)
    dense = head.top_k(queries, k, pruned=False)[1]

    def call(X, kk=k):
        labels = head.top_k(X, kk, screen_rank=2, sample_batch=16)[1]
        report = head.last_pruning_["piloted"], head.last_pruning_["mode"]
        assert torch.equal(labels, head.top_k(X, kk, pruned=False)[1])
        return report

    assert torch.equal(head.top_k(queries, k, screen_rank=2, sample_batch=16)[1], dense)
    assert head.last_pruning_["piloted"] and head.last_pruning_["mode"] == mode
    assert [call(queries[i:i + 3]) for i in (0, 3)] == [(False, mode)] * 2  # a few samples each
    assert call(queries) == (True, mode)                                     # the verdict expired
    assert call(queries, kk=k + 1)[0]                                        # its own pilot
    head.fit(stats)
    assert call(queries)[0]


@pytest.mark.parametrize(("dtype", "screen_dtype"), SCREENINGS)
@pytest.mark.parametrize("offset", [0.0, 300.0])
def test_screening_bounds_enclose_the_exact_scores(dtype, screen_dtype, offset):
    """lower <= the exact score after j rows, and the exact full score <= upper, for every pair:
    computed in float64 from the head's own rows, with a lowered screening's rounding included."""
    stats, queries = pruning_problem(2.0, offset=offset, d=32, C=30)
    head = LRRGDA(rank=8, dtype=dtype).fit(stats)
    X = head._prepare(queries)
    j = 3
    lin, lower, upper, _, margin = head._bounds(X, j, screen_dtype)
    rows, bias = head.rows_.double(), head.bias_.double()
    Z = torch.einsum("cid,nd->nci", rows, X.double()) + bias
    partial = Z[:, :, 0] + 0.5 * Z[:, :, 1:1 + j].square().sum(2)
    full = Z[:, :, 0] + 0.5 * Z[:, :, 1:].square().sum(2)
    assert (lower.double() <= partial + margin).all()
    assert (full <= upper.double() + margin).all()
    torch.testing.assert_close(lin.double(), Z[:, :, 0], rtol=0, atol=float(margin.max()))
    if screen_dtype != dtype:
        # the rounding allowance is a small part of the pruning slack, even far from the origin
        _, exact_lower, exact_upper, _, _ = head._bounds(X, j, dtype)
        allowance = (upper - exact_upper).double().abs()
        slack = (exact_upper - exact_lower).double()
        assert float(allowance.median()) < 0.2 * float(slack.median())


def test_lowered_screening_prunes_nearly_as_well():
    stats, queries = pruning_problem(4.0, offset=50.0)
    head = LRRGDA(rank=6, dtype=torch.float32).fit(stats)
    fractions = {}
    for screen_dtype in (torch.float32, torch.bfloat16):
        head.top_k(queries, 1, pruned=True, screen_rank=2, screen_dtype=screen_dtype)
        fractions[screen_dtype] = head.last_pruning_["pairs_scored_fraction"]
    assert fractions[torch.bfloat16] <= 1.5 * fractions[torch.float32] + 0.01


@pytest.mark.parametrize(("dtype", "exact"), [(torch.bfloat16, torch.float32),
                                               (torch.float32, torch.float64)])
def test_lowered_gemm_error_bounds_real_products(dtype, exact):
    from gdacil.heads.lowrank import _lowered_gemm_error

    g = torch.Generator().manual_seed(3)
    d = 768
    # same-signed entries: no cancellation to hide the accumulated rounding
    a = torch.rand(64, d, generator=g, dtype=torch.float64).to(exact) * 3.0
    x = (torch.rand(32, d, generator=g, dtype=torch.float64) + 2.0).to(exact)
    computed = (x.to(dtype) @ a.to(dtype).T).double()
    true = x.double() @ a.double().T
    bound = _lowered_gemm_error(dtype, exact, d) * x.double().norm(dim=1, keepdim=True) * a.double().norm(dim=1)
    assert ((computed - true).abs() <= bound).all()
    assert float(((computed - true).abs() / bound).max()) > 1e-3   # a bound of this rounding


@pytest.mark.parametrize(("native", "dtype", "expected"), [
    (True, torch.float32, "bfloat16"), (False, torch.float32, "float32"),
    (True, torch.float64, "float32"), (False, torch.float64, "float32")])
def test_auto_screening_precision_follows_the_cpu(monkeypatch, native, dtype, expected):
    monkeypatch.delenv("GDACIL_NATIVE_BF16", raising=False)  # the CPU's answer, not an override
    for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: native, raising=False)
    stats, queries = pruning_problem()
    head = LRRGDA(rank=6, dtype=dtype).fit(stats)
    head.top_k(queries, 1, pruned=True, screen_rank=2)
    assert head.last_pruning_["screen_dtype"] == expected


@pytest.mark.parametrize("bad", [torch.float16, "float64", "double precision", torch.int32])
def test_screening_precision_rejects_what_it_cannot_certify(bad):
    stats, queries = pruning_problem()
    head = LRRGDA(rank=6, dtype=torch.float32).fit(stats)
    with pytest.raises(ValueError, match="screen_dtype"):
        head.top_k(queries, 1, screen_rank=2, screen_dtype=bad)


@pytest.mark.parametrize("dense_share", [0.0, 2.0])  # every class group scored densely / gathered
@pytest.mark.parametrize("present", [0.4, 0.1])      # most classes have pairs / a scattered few
def test_pruned_rounds_score_pairs_like_a_direct_computation(monkeypatch, dense_share, present):
    from gdacil.heads import lowrank

    monkeypatch.setattr(lowrank, "_DENSE_SHARE", dense_share)
    monkeypatch.setattr(lowrank, "_RESCORE_CLASSES", 3)   # groups that split the class range
    g = torch.Generator().manual_seed(1)
    d, C = 12, 31
    X = torch.randn(C * 20, d, generator=g, dtype=torch.float64) * torch.linspace(2, 0.2, d)
    y = torch.arange(C).repeat_interleave(20)
    head = LRRGDA(rank=5).fit(ClassGaussians(d).update(X + 3 * torch.randn(C, d, generator=g,
                                                                      dtype=torch.float64)[y], y))
    queries = torch.randn(9, d, generator=g, dtype=torch.float64)
    pairs = torch.rand(C, 9, generator=g) < present              # some classes get no pair
    cls, smp = pairs.nonzero(as_tuple=True)
    got = head._row_norms(queries, cls, smp, 1, 4)
    Z = torch.einsum("pid,pd->pi", head.rows_[cls, 2:5], queries[smp]) + head.bias_[cls, 2:5]
    torch.testing.assert_close(got, Z.square().sum(1), rtol=1e-12, atol=1e-12)
    dense_scores, dense_labels = head.top_k(queries, 3, pruned=False)
    for j in (0, 1, 2):
        scores, labels = head.top_k(queries, 3, pruned=True, screen_rank=j)
        assert torch.equal(labels, dense_labels)
        torch.testing.assert_close(scores, dense_scores, rtol=0, atol=1e-10)


@needs_minilm
@needs_wordnet
def test_pruned_top_k_equals_dense_top_k_on_real_features():
    from gdacil.backbones import build_backbone
    from gdacil.data import Protocol

    # exactness only: on 40 related real classes the bounds prune few pairs (docs/scale.md)
    tasks = Protocol("wordnet-hypernym", train_cap=30, test_cap=10, increment=40).build()
    bb = build_backbone("minilm", final_norm="nonaffine_ln")
    train, test = tasks[0].train, tasks[0].test
    stats = ClassGaussians(bb.dim).update(bb.extract(tasks.load(train.ids), batch_size=64),
                                          torch.tensor(train.labels))
    X = bb.extract(tasks.load(test.ids), batch_size=64)
    for dtype in (torch.float64, torch.float32):
        head = LRRGDA(rank=16, dtype=dtype).fit(stats)
        dense_scores, dense_labels = head.top_k(X, 5, pruned=False)
        for screen_dtype in (dtype, torch.bfloat16):
            scores, labels = head.top_k(X, 5, pruned=True, screen_rank=4, sample_batch=64,
                                        screen_dtype=screen_dtype)
            assert torch.equal(labels, dense_labels)
            scale = float(dense_scores.abs().max()) * torch.finfo(dtype).eps
            torch.testing.assert_close(scores, dense_scores, rtol=0, atol=64 * scale)


# ------------------------------------------------------------------ units of the features
@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("factor", [1e-3, 1e3])
def test_default_heads_predict_the_same_in_any_units(name, factor):
    """Multiplying every feature by a constant changes no prediction of any head with its
    defaults (the identity terms follow tr(Sigma_avg) / d), while the paper's absolute forms do."""
    stats, X, y = make_stats(seed=3, few_shot=())
    Xq = queries(stats.dim, n=200, seed=4)
    scaled = ClassGaussians(stats.dim).update(X * factor, y)
    params = {"base_steps": 300, "steps_per_class": 0} if name == "sgd" else {}
    a = build_head(name, **params).fit(stats).predict(Xq)
    b = build_head(name, **params).fit(scaled).predict(Xq * factor)
    if name == "sgd":  # float32 training on standardised pseudo-features: rounding may differ
        assert (a == b).double().mean() >= 0.99
    else:
        assert torch.equal(a, b)


@pytest.mark.parametrize("make", [lambda: LDA.paper(), lambda: RGDA.paper(),
                                  lambda: LRRGDA.paper(rank=3, decomposition="eigh")])
def test_paper_presets_depend_on_the_units(make):
    stats, X, y = make_stats(seed=3, few_shot=())
    Xq = queries(stats.dim, n=200, seed=4)
    small = ClassGaussians(stats.dim).update(X * 1e-3, y)
    assert not torch.equal(make().fit(stats).predict(Xq), make().fit(small).predict(Xq * 1e-3))


def test_identity_scale_is_recorded_and_falls_back_for_classes_without_variance():
    stats, _, _ = make_stats(seed=3, few_shot=())
    head = LRRGDA(rank=3).fit(stats)
    assert head.identity_scale_ == pytest.approx(float(per_sample_variance(stats)), rel=1e-12)
    trace = LRRGDA(rank=3, identity_scale="trace").fit(stats)
    assert trace.identity_scale_ == pytest.approx(float(mean_variance(stats)), rel=1e-12)
    assert LRRGDA.paper(rank=3).fit(stats).identity_scale_ == 1.0
    # one sample per class: the spread of the class means around their centre, (1 + 1) / 2,
    # times d / max(N - C, 1) = 2 for "samples"
    points = ClassGaussians(2).update(torch.tensor([[0.0, 1.0], [2.0, 3.0]]), [0, 1])
    assert RGDA(identity_scale="trace").fit(points).identity_scale_ == pytest.approx(1.0, rel=1e-12)
    assert RGDA().fit(points).identity_scale_ == pytest.approx(2.0, rel=1e-12)
    scaled = ClassGaussians(2).update(torch.tensor([[0.0, 3.0], [6.0, 9.0]]), [0, 1])
    assert RGDA(identity_scale="trace").fit(scaled).identity_scale_ == pytest.approx(9.0, rel=1e-12)
    with pytest.raises(ValueError, match="identity_scale must be one of"):
        LRRGDA(identity_scale="relative").fit(stats)


def test_predict_of_many_classes_takes_the_pruned_argmax(monkeypatch):
    import gdacil.heads.lowrank as lowrank

    stats, queries = pruning_problem(4.0)
    head = LRRGDA(rank=16).fit(stats)   # more rows than the default screening (4)
    dense = head.decision_function(queries).argmax(1)
    monkeypatch.setattr(lowrank, "AUTO_MIN_CLASSES", 10)  # 40 classes count as many
    head.__dict__.pop("last_pruning_", None)
    assert torch.equal(head.predict(queries), head.classes_[dense])
    assert head.last_pruning_["mode"] == "pruned"
    monkeypatch.setattr(lowrank, "AUTO_MIN_CLASSES", 1000)
    head.__dict__.pop("last_pruning_", None)
    assert torch.equal(head.predict(queries), head.classes_[dense])
    assert not hasattr(head, "last_pruning_")  # dense, through decision_function


def test_auto_pruning_is_for_the_cpu(monkeypatch):
    """A GPU scores every class faster than it gathers the screened pairs: there "auto" and
    predict score densely (the rule alone: no CUDA call is made)."""
    import gdacil.heads.lowrank as lowrank

    stats, _ = pruning_problem(4.0)
    head = LRRGDA(rank=16).fit(stats)
    monkeypatch.setattr(lowrank, "AUTO_MIN_CLASSES", 10)
    assert head._auto_prunes()
    monkeypatch.setattr(head, "device_", torch.device("cuda"))
    assert not head._auto_prunes()
    monkeypatch.setattr(lowrank, "AUTO_MIN_CLASSES", 1000)
    monkeypatch.setattr(head, "device_", torch.device("cpu"))
    assert not head._auto_prunes()


def test_scoring_blocks_are_larger_on_a_gpu(monkeypatch):
    """On the CPU a block's (samples, classes, rows) buffer stays within the cache budget; on a
    GPU blocks are 32 times larger, since there each costs kernel launches, not cache misses."""
    import gdacil.heads.base as base

    stats, _ = pruning_problem(4.0)
    head = LRRGDA(rank=16).fit(stats)
    cpu = head._block_size(17, 1024)
    assert cpu * 1024 * 17 * 8 <= base._SCORE_BUFFER_BYTES
    monkeypatch.setattr(head, "device_", torch.device("cuda"))
    gpu = head._block_size(17, 1024)
    assert gpu * 1024 * 17 * 8 <= base._GPU_SCORE_BUFFER_BYTES and gpu >= 30 * cpu


def test_auto_top_k_of_a_small_head_scores_densely():
    """Below AUTO_MIN_CLASSES the screening costs more than it saves: "auto" is dense, exact,
    and says so; pruned=True still prunes."""
    stats, queries = pruning_problem(4.0)
    head = LRRGDA(rank=6).fit(stats)
    dense_scores, dense_labels = head.top_k(queries, 3, pruned=False)
    scores, labels = head.top_k(queries, 3)
    assert head.last_pruning_["mode"] == "dense" and head.last_pruning_["pairs_scored_fraction"] == 1
    assert torch.equal(labels, dense_labels) and torch.equal(scores, dense_scores)
    head.top_k(queries, 3, pruned=True, screen_rank=2)
    assert head.last_pruning_["mode"] == "pruned" and head.last_pruning_["pairs_scored_fraction"] < 1
