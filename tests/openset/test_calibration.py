"""Calibration from held-out records (gdacil.calibration): the stated guarantees of the
rejection threshold and of split-conformal sets on exchangeable data, temperature scaling, ECE
by hand, and the exact removal of held-out samples from the statistics."""

import copy
import math

import pytest
import torch

from gdacil import ClassGaussians
from gdacil.calibration import (
    TEMPERATURE_PRIOR,
    Calibration,
    calibration_folds,
    conformal_quantile,
    ece_floor,
    expected_calibration_error,
    fit_temperature,
    held_out_calibration,
    lower_quantile,
    without_samples,
)
from gdacil.heads import LDA, LRRGDA
from gdacil.stats import LowRankGaussians
from gdacil.testing import make_stats


def same_calibration(a: Calibration, b: Calibration) -> bool:
    ta, ma = a.state_dict()
    tb, mb = b.state_dict()
    return ma == mb and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def one_fold(y, share, seed):
    """The positions of the first calibration fold of ``y``."""
    return torch.nonzero(calibration_folds(y, share, seed) == 0)[:, 0]


def _model_draws(n, C=5, temperature=1.0, seed=0):
    """Class scores and labels drawn from softmax(scores / temperature): exchangeable records."""
    g = torch.Generator().manual_seed(seed)
    scores = 3.0 * torch.randn(n, C, generator=g, dtype=torch.float64)
    labels = torch.multinomial(torch.softmax(scores / temperature, 1), 1, generator=g)[:, 0]
    return scores, labels


def test_rejection_threshold_keeps_its_false_rejection_rate_on_exchangeable_data():
    g = torch.Generator().manual_seed(0)
    n, rate, trials = 99, 0.05, 4000
    draws = torch.randn(trials, n + 1, generator=g, dtype=torch.float64)
    rejected = [float(d[-1]) < lower_quantile(d[:-1], rate) for d in draws]
    frr = sum(rejected) / trials
    # E[FRR] lies in [rate - 1/(n+1), rate]; 4000 trials: standard error 0.0034
    assert rate - 1 / (n + 1) - 0.011 <= frr <= rate + 0.011


def test_conformal_sets_cover_with_the_stated_probability():
    alpha, n, trials = 0.1, 200, 300
    hits = []
    for t in range(trials):
        scores, labels = _model_draws(n + 20, seed=t)
        cal = Calibration().fit(torch.zeros(n), labels[:n], scores[:n], torch.arange(5))
        sets = cal.prediction_sets(scores[n:], alpha)
        hits.append(float(sets[torch.arange(20), labels[n:]].double().mean()))
    coverage = sum(hits) / trials
    # marginal coverage lies in [1 - alpha, 1 - alpha + 1/(n+1)]; 6000 test draws
    assert 1 - alpha - 0.012 <= coverage <= 1 - alpha + 1 / (n + 1) + 0.012


def test_conformal_quantile_needs_enough_records():
    assert conformal_quantile(torch.tensor([0.1, 0.2]), 0.1) == math.inf
    assert conformal_quantile(torch.arange(1.0, 20.0), 0.1) == 18.0  # ceil(20 * 0.9) = 18th


def test_temperature_recovers_the_overconfidence_of_the_scores():
    scores, labels = _model_draws(4000, temperature=1.0)
    assert abs(fit_temperature(2.5 * scores, labels) - 2.5) < 0.15
    assert abs(fit_temperature(scores, labels) - 1.0) < 0.06


def test_temperature_stays_finite_when_every_record_is_right():
    """Records all classified right: the likelihood alone would send T to 0 (every probability
    0 or 1). The pull towards T = 1 keeps it finite; the result is the minimiser of the stated
    objective, checked against scipy's bounded search on 1 / T."""
    from scipy.optimize import minimize_scalar

    scores, labels = _model_draws(400, temperature=1.0)
    right = scores.argmax(1) == labels
    z, y = scores[right], labels[right]
    t = fit_temperature(z, y)
    assert 0.05 < t < 1.0  # sharper than the scores, but not the search's bound e^-6

    def objective(beta: float) -> float:
        nll = float(((z * beta).logsumexp(1) - z.gather(1, y[:, None])[:, 0] * beta).sum())
        return nll + 0.5 * TEMPERATURE_PRIOR * (beta - 1.0) ** 2

    best = minimize_scalar(objective, bounds=(1e-3, 1e3), method="bounded",
                           options={"xatol": 1e-10})
    assert abs(1.0 / t - best.x) <= 1e-5 * best.x
    assert fit_temperature(z, y, prior=0.0) < 0.003  # without the pull: the bound


def test_calibration_lowers_the_ece_of_overconfident_scores():
    scores, labels = _model_draws(12000)
    cal = Calibration().fit(torch.zeros(4000), labels[:4000], 3.0 * scores[:4000],
                            torch.arange(5))
    before = expected_calibration_error(torch.softmax(3.0 * scores[4000:], 1), labels[4000:])
    after = expected_calibration_error(cal.calibrated(3.0 * scores[4000:]), labels[4000:])
    assert after < 0.03 < before


def test_expected_calibration_error_by_hand():
    proba = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.55, 0.45], [0.45, 0.55]])
    labels = torch.tensor([0, 1, 0, 0])
    # bins of width 1/15: {0.95, 0.95} accuracy 1/2; {0.55, 0.55} accuracy 1/2
    expected = (2 * abs(0.5 - 0.95) + 2 * abs(0.5 - 0.55)) / 4
    assert expected_calibration_error(proba, labels) == pytest.approx(expected, abs=1e-12)


def test_without_samples_is_the_statistics_of_the_rest():
    stats, X, y = make_stats()
    held = one_fold(y, 0.3, 4)
    rest = torch.ones(len(y), dtype=torch.bool)
    rest[held] = False
    got = without_samples(stats, X[held], y[held])
    ref = ClassGaussians(stats.dim).update(X[rest], y[rest])
    for c in stats.classes:
        i, j = got.positions([c])[0], ref.positions([c])[0]
        assert float(got.counts[i]) == float(ref.counts[j])
        assert torch.allclose(got.means[i], ref.means[j], rtol=0, atol=1e-12)
        assert torch.allclose(got.covariances([c]), ref.covariances([c]), rtol=0, atol=1e-11)


def test_without_samples_refuses_what_it_cannot_do():
    stats, X, y = make_stats()
    with pytest.raises(ValueError, match="dense statistics"):
        without_samples(LowRankGaussians.from_dense(stats, rank=2), X[:3], y[:3])
    only = y == 3
    with pytest.raises(ValueError, match="at least one sample"):
        without_samples(stats, X[only], y[only])


def test_calibration_folds_deal_each_class_evenly_and_leave_two():
    y = torch.tensor([0] * 10 + [1] * 3 + [2] * 2 + [3] * 4)
    folds = calibration_folds(y, 0.2, seed=1)
    assert torch.equal(folds, calibration_folds(y, 0.2, seed=1))
    assert not torch.equal(folds, calibration_folds(y, 0.2, seed=2))
    # five folds: class 0 two samples in each, class 1 one sample in three folds, class 2 none
    assert sorted(folds[y == 0].tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert len(set(folds[y == 1].tolist())) == 3 and int(folds[y == 1].min()) >= 0
    assert folds[y == 2].tolist() == [-1, -1]
    # two folds: a class of 3 would keep one sample in some fold, one of 4 keeps two
    halves = calibration_folds(y, 0.5, seed=0)
    assert halves[y == 1].tolist() == [-1] * 3
    assert sorted(halves[y == 3].tolist()) == [0, 0, 1, 1]
    assert int(calibration_folds(y, 0.9, seed=0).max()) == 1  # at least two folds
    with pytest.raises(ValueError, match="share"):
        calibration_folds(y, 1.5, seed=0)


def test_cross_fitted_records_are_scored_by_heads_without_their_fold():
    stats, X, y = make_stats()
    head = LRRGDA(rank=3).fit(stats)
    folds = calibration_folds(y, 0.25, seed=3)
    cal = held_out_calibration(head, stats, X, y, folds=folds, min_records=1)
    kept = torch.nonzero(folds >= 0)[:, 0]
    assert cal.n_records == len(kept) and torch.equal(cal.labels_, y[kept])  # in X's order
    order = head.classes_.tolist()
    for fold in range(4):
        part = torch.nonzero(folds[kept] == fold)[:, 0]
        rows = kept[part]
        probe = LRRGDA(rank=3).fit(without_samples(stats, X[rows], y[rows]))
        assert torch.equal(cal.novelty_[part], probe.score_samples(X[rows]))
        # the class scores are in the head's class order, whatever order the probe has
        scores = probe.decision_function(X[rows])[
            :, [probe.classes_.tolist().index(c) for c in order]]
        expected = scores.gather(1, torch.tensor(
            [[order.index(int(c)) for c in row] for row in cal.score_classes_[part]]))
        assert torch.equal(cal.scores_[part], expected)
    with pytest.raises(ValueError, match="one fold per sample"):
        held_out_calibration(head, stats, X, y, folds=folds[:-1])
    with pytest.raises(ValueError, match="at least one held-out record"):
        held_out_calibration(head, stats, X, y, folds=torch.full_like(y, -1))


def test_ece_floor_is_the_ece_of_a_calibrated_model_on_so_many_inputs():
    scores, _ = _model_draws(200, temperature=1.0, seed=5)
    proba = torch.softmax(scores, 1)
    floor = ece_floor(proba, draws=50, seed=1)
    assert floor == ece_floor(proba, draws=50, seed=1)
    g = torch.Generator().manual_seed(9)  # independent labels of the same calibrated model
    again = [expected_calibration_error(proba, torch.multinomial(proba, 1, generator=g)[:, 0])
             for _ in range(200)]
    assert floor == pytest.approx(sum(again) / len(again), abs=0.01)
    assert 0.02 < floor < 0.2  # 200 inputs: far from 0, though calibrated
    big = torch.softmax(_model_draws(20000, temperature=1.0, seed=6)[0], 1)
    assert ece_floor(big, draws=5) < floor / 3  # it shrinks like 1 / sqrt(n)


def test_held_out_records_come_from_a_head_that_never_saw_them():
    stats, X, y = make_stats()
    held = one_fold(y, 0.2, 0)
    cal = held_out_calibration(LRRGDA(rank=3).fit(stats), stats, X[held], y[held])
    probe = LRRGDA(rank=3).fit(without_samples(stats, X[held], y[held]))
    assert cal.n_records == len(held)
    expected = probe.score_samples(X[held])
    assert torch.equal(cal.novelty_, expected)
    true = cal.score_classes_ == cal.labels_[:, None]
    own = probe.decision_function(X[held]).gather(
        1, torch.tensor([probe.classes_.tolist().index(c) for c in y[held].tolist()])[:, None])
    assert torch.equal(cal.scores_[true], own[:, 0])
    assert torch.equal(cal.labels_, y[held])
    k = math.floor(0.1 * (len(held) + 1))
    assert cal.threshold(0.1) == pytest.approx(float(expected.sort().values[k - 1]), rel=1e-12)


def _two_task_calibrations():
    """Calibrations after task 1 (labels 3-93) and task 2 (103-193), the second joined by all
    of the first's records: as the Learner makes them, labels numbered in learning order."""
    stats, X, y = make_stats(n_classes=20)
    first = y < 100
    stats1 = ClassGaussians(X.shape[1]).update(X[first], y[first])
    held = one_fold(y, 0.3, 0)
    h1, h2 = held[first[held]], held[~first[held]]
    cal1 = held_out_calibration(LDA().fit(stats1), stats1, X[h1], y[h1])
    cal2 = held_out_calibration(LDA().fit(stats), stats, X[h2], y[h2], previous=cal1,
                                min_records=10_000)
    return cal1, cal2


def test_forget_keeps_only_records_scored_by_heads_that_never_held_the_classes():
    cal1, cal2 = _two_task_calibrations()
    assert cal2.n_records > cal1.n_records
    assert set(cal1.scored_by_.tolist()) == {93} and set(cal2.scored_by_.tolist()) == {93, 193}
    # a class of task 2: every record of task 2 was scored by a head that held it; the records
    # left are the first task's, exactly those a calibration that never saw task 2 holds
    left = copy.deepcopy(cal2).forget([133, 173])
    assert same_calibration(left, cal1)
    # a class of task 1: every record was scored by a head that held it
    assert copy.deepcopy(cal2).forget([43]) is None
    assert copy.deepcopy(cal2).forget([]).n_records == cal2.n_records


def test_records_of_another_novelty_score_do_not_join():
    stats, X, y = make_stats()
    first, later = y < 30, y >= 30
    head = LRRGDA(rank=3).fit(stats)
    def calibrated(part, **kw):
        folds = calibration_folds(y[part], 0.5, 0)
        return held_out_calibration(head, stats, X[part], y[part], folds=folds, **kw)

    old = calibrated(first, method="mahalanobis")
    same = calibrated(later, previous=old, method="mahalanobis", min_records=10_000)
    other = calibrated(later, previous=old, min_records=10_000)
    assert old.method_ == same.method_ == "mahalanobis"
    assert same.n_records == old.n_records + int(later.sum())
    assert other.method_ == "relative_likelihood" and other.n_records == int(later.sum())
    with pytest.raises(ValueError, match="unknown novelty score 'knn'"):
        Calibration().fit(torch.zeros(2), torch.tensor([3, 13]), torch.zeros(2, 2),
                          torch.tensor([3, 13]), method="knn")


def test_a_calibration_saved_before_records_kept_their_head_forgets_everything():
    _, cal2 = _two_task_calibrations()
    tensors, meta = cal2.state_dict()
    old = {k: v for k, v in tensors.items() if "scored_by" not in k}
    loaded = Calibration().load_state_dict(old, meta)
    assert loaded.n_records == cal2.n_records  # usable as it was
    assert loaded.forget([193]) is None  # but no record can be shown free of the class


def test_state_round_trip_and_bad_records():
    stats, X, y = make_stats()
    held = one_fold(y, 0.2, 0)
    cal = held_out_calibration(LDA().fit(stats), stats, X[held], y[held])
    loaded = Calibration().load_state_dict(*cal.state_dict())
    for name in ("novelty_", "labels_", "scores_", "score_classes_", "nonconformity_"):
        assert torch.equal(getattr(loaded, name), getattr(cal, name)), name
    assert loaded.temperature_ == cal.temperature_
    with pytest.raises(ValueError, match="same samples"):
        Calibration().fit(torch.zeros(3), torch.zeros(2, dtype=torch.long), torch.zeros(3, 2),
                          torch.arange(2))
    with pytest.raises(ValueError, match="classes the head lacks"):
        Calibration().fit(torch.zeros(1), torch.tensor([7]), torch.zeros(1, 2), torch.arange(2))
    with pytest.raises(ValueError, match="rate must be a number strictly between 0 and 1"):
        cal.threshold(1.0)


def test_previous_records_join_a_small_task_up_to_the_minimum():
    stats, X, y = make_stats()
    first = one_fold(y, 0.2, 0)
    old = held_out_calibration(LDA().fit(stats), stats, X[first], y[first])
    second = one_fold(y, 0.1, 1)
    new = held_out_calibration(LDA().fit(stats), stats, X[second], y[second])
    joined = held_out_calibration(LDA().fit(stats), stats, X[second], y[second], previous=old,
                                  min_records=len(second) + 5)
    assert joined.n_records == len(second) + 5
    # the newest five of the older records come first, then this task's, unchanged
    assert torch.equal(joined.novelty_, torch.cat([old.novelty_[-5:], new.novelty_]))
    assert torch.equal(joined.labels_, torch.cat([old.labels_[-5:], new.labels_]))
    enough = held_out_calibration(LDA().fit(stats), stats, X[second], y[second], previous=old,
                                  min_records=len(second))
    assert torch.equal(enough.novelty_, new.novelty_)  # a task with enough records stands alone


@pytest.mark.parametrize("value", [0, 1, 1.0, -0.1, float("nan"), True, "0.1", None])
def test_rates_shares_and_alphas_lie_strictly_between_0_and_1(value):
    stats, X, y = make_stats()
    cal = held_out_calibration(LDA().fit(stats), stats, X, y, folds=calibration_folds(y, 0.5, 0))
    for check in (cal.threshold, cal.quantile, lambda v: calibration_folds(y, v, 0)):
        with pytest.raises(ValueError, match=f"must be a number strictly between 0 and 1; got "
                                             f"{value!r}"):
            check(value)
    assert cal.threshold(0.5) == lower_quantile(cal.novelty_, 0.5)  # a valid rate passes
