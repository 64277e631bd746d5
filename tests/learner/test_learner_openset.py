"""A learner that can say "I don't know": calibration at learn time, rejection, calibrated
probabilities and conformal sets (gdacil.learner with gdacil.calibration and gdacil.novelty).

The learners are the tiny random ViT of tests/learner/test_learner.py on noisy single-colour
images: red, green and blue are learned, yellow and purple play the unknown classes. Every draw
is seeded, so the rates measured here are fixed numbers, not samples that could flake.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from gdacil.calibration import Calibration, calibration_folds, held_out_calibration
from gdacil.cil.config import ConfigError
from gdacil.cil.model import task_seed
from gdacil.io import CorruptFileError
from gdacil.learner import Learner, LearnerConfig, Prediction, UnknownClassError
from gdacil.state import load_state

from _assets import needs_transformers
from test_learner import colour_images, colour_set, tiny_learner, trained_learner

pytestmark = needs_transformers
KNOWN, UNKNOWN = ["red", "green", "blue"], ["yellow", "purple"]
FIXTURE = Path(__file__).parents[1] / "fixtures" / "learner-bundle-v1"
#: the purpose of the calibration's seed (gdacil.learner.learner._CALIBRATION)
CALIBRATION_SEED = 103


def record_count(counts: list[int], share: float = 0.1) -> int:
    """How many records a learn makes (gdacil.calibration.calibration_folds): every sample of a
    class whose largest fold leaves it two samples."""
    folds = max(2, round(1 / share))
    return sum(n for n in counts if n - math.ceil(n / folds) >= 2)


def same_calibration(a: Calibration, b: Calibration) -> bool:
    ta, ma = a.state_dict()
    tb, mb = b.state_dict()
    return ma == mb and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.fixture(scope="module")
def learned() -> Learner:
    """Red, green and blue, 20 images each, cross-fitted in ten folds: 60 records."""
    learner = tiny_learner()
    learner.learn(*colour_set(KNOWN, 20))
    return learner


@pytest.fixture(scope="module")
def plenty() -> Learner:
    """Red, green and blue, 100 images each: 300 records."""
    learner = tiny_learner()
    learner.learn(*colour_set(KNOWN, 100))
    return learner


# ---------------------------------------------------------------------- calibration at learn
def test_a_learn_calibrates_on_cross_fitted_records_of_its_own_samples(learned):
    X, y = colour_set(KNOWN, 20)
    calibration = learned.calibration
    assert calibration is not None and calibration.n_records == record_count([20] * 3) == 60
    assert learned.class_counts() == {"red": 20, "green": 20, "blue": 20}  # all are learned
    # exactly held_out_calibration on the folds calibration_folds deals with the learn's seed,
    # the features of its one extraction, and the statistics that include them
    labels = torch.tensor([learned.class_ids()[name] for name in y])
    folds = calibration_folds(labels, 0.1, task_seed(0, 0, CALIBRATION_SEED))
    again = held_out_calibration(learned.head, learned.statistics, learned._features(X), labels,
                                 folds=folds)
    assert torch.equal(calibration.labels_, again.labels_)
    torch.testing.assert_close(calibration.novelty_, again.novelty_, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(calibration.scores_, again.scores_, rtol=1e-9, atol=1e-6)
    assert calibration.temperature_ == pytest.approx(again.temperature_, rel=1e-6)
    info = learned.info()["calibration"]
    assert info == {"records": 60, "record_classes": 3, "novelty": "relative_likelihood",
                    "temperature": calibration.temperature_, "reject_rate": 0.05,
                    "threshold": calibration.threshold(0.05)}


@pytest.mark.parametrize("trained", [False, True])
def test_a_small_learn_joins_its_records_to_the_newest_earlier_ones(trained):
    learner = trained_learner() if trained else tiny_learner()
    learner.learn(*colour_set(KNOWN, 10))
    first = learner.calibration
    assert first is not None and first.n_records == 30
    report = learner.learn(*colour_set(UNKNOWN, 15, seed=1))
    assert report.compensated == trained  # the statistics moved before the merge, if trained
    second = learner.calibration
    ids = learner.class_ids()
    # fewer than MIN_RECORDS of its own: this learn's 30 records follow the earlier 30
    assert second.n_records == record_count([15, 15]) + 30 == 60
    assert set(second.labels_[30:].tolist()) == {ids["yellow"], ids["purple"]}
    assert learner.info()["calibration"]["record_classes"] == 5
    assert torch.equal(second.novelty_[:30], first.novelty_)
    assert set(second.score_classes_.flatten().tolist()) <= set(ids.values()) | {-1}
    # no class with 3 samples: no new calibration, the previous one is kept
    learner.learn(colour_images("red", 2, seed=2), ["red"] * 2)
    assert learner.calibration is second and learner.class_counts()["red"] == 12


def test_no_calibration_without_a_share_or_with_low_rank_statistics():
    X, y = colour_set(KNOWN, 10)
    for settings, why in [({"calibration_share": 0}, "calibration_share is 0"),
                          ({"statistics": {"storage": "lowrank", "rank": 4},
                            "head_params": {"rank": 4}},
                           "its statistics are lowrank")]:
        learner = tiny_learner(**settings)
        learner.learn(X, y)
        assert learner.calibration is None and learner.info()["calibration"] is None
        for ask in ({"reject": True}, {"sets": 0.1}):
            with pytest.raises(ValueError, match=f"no calibration: {why}"):
                learner.predict(X[:2], **ask)
        with pytest.raises(ValueError, match="needs a calibrated model"):
            learner.predict_set(X[:2])
        assert learner.predict(X[:2])[0].novelty is None  # predicting as before
        # held-out samples calibrate them all the same
        assert learner.calibrate(*colour_set(KNOWN, 8, seed=3)) == 24
        assert learner.predict(X[:2], reject=True, reject_rate=0.2)[0].novelty is not None


def test_a_failing_calibration_fails_the_learn_and_changes_nothing(learned, monkeypatch):
    from gdacil.learner import learner as module

    learner = learned.copy()
    test = colour_set(KNOWN, 2, seed=5)[0]
    before = learner.predict(test, top_k=3, reject=True, reject_rate=0.2)
    calibration, counts = learner.calibration, learner.class_counts()

    def broken(*args, **kwargs):
        raise RuntimeError("calibration failed")

    monkeypatch.setattr(module, "held_out_calibration", broken)
    with pytest.raises(RuntimeError, match="calibration failed"):
        learner.learn(*colour_set(UNKNOWN, 10))
    assert learner.calibration is calibration and learner.class_counts() == counts
    assert learner.predict(test, top_k=3, reject=True, reject_rate=0.2) == before
    monkeypatch.undo()
    learner.learn(*colour_set(UNKNOWN, 10))  # and it learns once the failure is gone
    assert learner.calibration.n_records == 20 + 60  # joined by the earlier records


def test_settings_are_checked_and_old_configs_load():
    assert LearnerConfig().calibration_share == 0.1 and LearnerConfig().reject_rate == 0.05
    old = LearnerConfig().to_dict()
    for key in ("calibration_share", "reject_rate", "novelty"):
        del old[key]
    assert LearnerConfig.from_dict(old) == LearnerConfig()
    for field, value, message in [
        ("calibration_share", 1.0, "calibration_share: expected 0 .* strictly between 0 and 1"),
        ("calibration_share", True, "calibration_share: expected 0"),
        ("reject_rate", 0, "reject_rate: expected a rate strictly between 0 and 1"),
        ("novelty", "distance", "novelty: expected null .* shrunk_relative_mahalanobis"),
    ]:
        with pytest.raises(ConfigError, match=message):
            LearnerConfig(**{field: value})
    assert LearnerConfig(calibration_share=0, novelty="energy").novelty == "energy"


# ---------------------------------------------------------------------- rejection
def test_unknown_classes_are_rejected_and_known_ones_accepted(learned):
    known, truth = colour_set(KNOWN, 10, seed=3)
    unknown = colour_set(UNKNOWN, 10, seed=3)[0]
    threshold = learned.rejection_threshold(0.2)
    assert threshold == learned.calibration.threshold(0.2)
    answers = learned.predict(known + unknown, top_k=2, reject=True, reject_rate=0.2)
    novelty = learned.head.score_samples(learned._features(known + unknown))
    for p, score in zip(answers, novelty.tolist()):
        assert p.threshold == threshold and p.novelty == pytest.approx(score, rel=1e-9, abs=1e-9)
        assert p.unknown == (p.novelty < threshold)
        assert p.to_dict() == {"predictions": p.to_list(), "unknown": p.unknown,
                               "novelty": p.novelty, "threshold": threshold}
    assert sum(p.unknown for p in answers[:30]) <= 6  # of 30 known inputs: the 20% asked
    assert sum(p.unknown for p in answers[30:]) >= 18  # of 20 inputs of unlearned classes
    assert sum(p.label == t for p, t in zip(answers, truth)) >= 29  # ranking as before
    # the positional construction and the list of before still hold
    old = Prediction(("red",), (1.0,), (0.5,))
    assert (old.novelty, old.unknown, old.to_list()) == (None, False,
                                                         [{"class": "red", "score": 1.0,
                                                           "probability": 0.5}])
    assert old.to_dict() == {"predictions": old.to_list()}


def test_the_false_rejection_rate_of_known_inputs_is_near_its_target(plenty):
    """With 300 records, the threshold for rate r is their floor(301 r)-th smallest score:
    fresh known inputs fall below it at about r (a Beta(301 r, 301 (1 - r)) share of them)."""
    fresh = colour_set(KNOWN, 100, seed=7)[0]
    answers = plenty.predict(fresh, reject=True, reject_rate=0.1)
    novelty = torch.tensor([p.novelty for p in answers])
    for rate in (0.05, 0.1, 0.2, 0.3):
        measured = float((novelty < plenty.rejection_threshold(rate)).double().mean())
        assert abs(measured - rate) <= 0.1, (rate, measured)
    assert sum(p.unknown for p in answers) == int((novelty < plenty.rejection_threshold(0.1)).sum())
    unknown = plenty.predict(colour_set(UNKNOWN, 30, seed=7)[0], reject=True)
    assert sum(p.unknown for p in unknown) >= 54  # of 60, at the default rate of 0.05


def test_rejection_errors_say_why_and_what_to_do(learned):
    x = colour_images("red", 1, seed=9)
    with pytest.raises(ValueError, match=r"holds 60 records, too few for a false-rejection "
                                         r"rate of 0.01 \(that takes at least 99\); ask a "
                                         r"larger reject_rate \(at least 0.017\)"):
        learned.predict(x, reject=True, reject_rate=0.01)
    assert learned.predict(x, reject=True, reject_rate=0.017)[0].threshold is not None
    for kwargs, message in [({"reject_rate": 0.1}, "reject_rate applies to predict"),
                            ({"reject": True, "reject_rate": 1.5}, "reject_rate must be a number"),
                            ({"reject": 1}, "reject must be True or False"),
                            ({"sets": 0}, "sets .* strictly between 0 and 1")]:
        with pytest.raises(ValueError, match=message):
            learned.predict(x, **kwargs)


# ---------------------------------------------------------------------- probabilities, sets
def test_probabilities_are_temperature_scaled_and_rank_as_before():
    X, y = colour_set(KNOWN, 20)
    # a quarter of the red images labelled green: the records' labels are uncertain, so the
    # temperature lies inside its search range (perfectly separated records push it to the
    # bottom of the range, exp(-6))
    y = ["green" if name == "red" and i % 4 == 0 else name for i, name in enumerate(y)]
    learner, plain = tiny_learner(), tiny_learner(calibration_share=0)
    learner.learn(X, y)
    plain.learn(X, y)  # the same statistics and head, no calibration
    temperature = learner.calibration.temperature_
    assert math.exp(-5) < temperature < math.exp(5) and temperature != pytest.approx(1.0)
    test = colour_set(KNOWN, 4, seed=8)[0]
    calibrated, raw = learner.predict(test, top_k=3), plain.predict(test, top_k=3)
    assert [p.classes for p in calibrated] == [p.classes for p in raw]
    torch.testing.assert_close(torch.tensor([p.scores for p in calibrated], dtype=torch.float64),
                               torch.tensor([p.scores for p in raw], dtype=torch.float64),
                               rtol=1e-12, atol=1e-9)
    scores = learner.head.decision_function(learner._features(test)).double()
    want = learner.calibration.calibrated(scores).sort(dim=1, descending=True).values
    torch.testing.assert_close(torch.tensor([p.probabilities for p in calibrated],
                                            dtype=torch.float64), want, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(want, torch.softmax(scores, 1).sort(dim=1, descending=True).values)
    torch.testing.assert_close(torch.tensor([p.probabilities for p in raw], dtype=torch.float64),
                               torch.softmax(scores, 1).sort(dim=1, descending=True).values,
                               rtol=1e-9, atol=1e-12)
    assert all(abs(sum(p.probabilities) - 1) < 1e-9 for p in calibrated)
    without = learner.predict(test, top_k=2, probabilities=False)
    assert [p.classes for p in without] == [p.classes[:2] for p in calibrated]
    assert all(p.probabilities is None for p in without)


def test_conformal_sets_cover_known_inputs(plenty):
    fresh, truth = colour_set(KNOWN, 30, seed=11)
    sets = plenty.predict_set(fresh, alpha=0.1)
    assert sum(t in s for s, t in zip(sets, truth)) >= 0.85 * len(truth)
    answers = plenty.predict(fresh, top_k=2, sets=0.1)
    assert [list(p.prediction_set) for p in answers] == sets
    for p in answers:  # ranked by score, the set's classes best first
        assert p.to_dict()["set"] == list(p.prediction_set)
        assert not p.prediction_set or p.prediction_set[0] == p.label
    scores = plenty.head.decision_function(plenty._features(fresh[:5]))
    inside = plenty.calibration.prediction_sets(scores, 0.1)
    names = plenty.classes
    assert [sorted(s) for s in sets[:5]] == [sorted(names[j] for j in torch.nonzero(row)[:, 0])
                                             for row in inside]
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        plenty.predict_set(fresh[:1], alpha=1.0)


# ---------------------------------------------------------------------- bundles, forgetting
def test_save_and_load_keep_the_calibration_bit_for_bit(learned, tmp_path):
    test = colour_set(KNOWN + UNKNOWN, 2, seed=12)[0]
    before = learned.predict(test, top_k=2, reject=True, reject_rate=0.2, sets=0.2)
    learner = learned.copy()
    learner.save(tmp_path / "model")
    stored = tmp_path / "model" / "versions" / "v1" / "calibration.safetensors"
    assert stored.is_file()
    assert same_calibration(Calibration().load_state_dict(*load_state(stored)),
                            learned.calibration)
    loaded = Learner.load(tmp_path / "model")
    assert same_calibration(loaded.calibration, learned.calibration)
    assert loaded.predict(test, top_k=2, reject=True, reject_rate=0.2, sets=0.2) == before
    assert loaded.info() == learner.info()
    # a calibration of classes the model does not hold is refused, naming the file
    other = tiny_learner()
    other.learn(*colour_set(UNKNOWN, 10))
    other.learn(*colour_set(KNOWN, 10))  # its ids 2, 3, 4 are classes the model lacks
    from gdacil.learner.learner import _read_calibration

    assert _read_calibration(stored, [0, 1, 2]) is not None
    other.save(tmp_path / "other")
    with pytest.raises(CorruptFileError, match="records of classes the model does not hold"):
        _read_calibration(tmp_path / "other" / "versions" / "v1" / "calibration.safetensors",
                          [0, 1])


def test_forgetting_keeps_only_records_no_head_holding_the_class_scored(tmp_path):
    """Red and green, then blue (a small learn: the first learn's records join its own).
    Forgetting blue leaves the first learn's records, exactly those of a learner that never
    learned blue; forgetting green too leaves none, and says how to calibrate again."""
    def first() -> Learner:
        learner = tiny_learner()
        learner.learn(*colour_set(["red", "green"], 20))
        return learner

    never = first()
    learner = first()
    learner.learn(*colour_set(["blue"], 20, seed=1))
    assert learner.calibration.n_records == 60
    learner.forget("blue")
    assert same_calibration(learner.calibration, never.calibration)
    learner.save(tmp_path / "model")
    assert same_calibration(Learner.load(tmp_path / "model").calibration, never.calibration)

    learner.forget("green")
    assert learner.calibration is None and learner.classes == ["red"]
    learner.save(tmp_path / "model")
    assert not (tmp_path / "model" / "versions" / "v2" / "calibration.safetensors").exists()
    with pytest.raises(ValueError, match=r"forgetting classes dropped the records .* calibrate "
                                         r"it on held-out samples \(Learner.calibrate"):
        Learner.load(tmp_path / "model").predict(colour_images("red", 1), reject=True)


def test_calibrate_on_held_out_samples_scores_them_with_the_head(learned, tmp_path):
    learner = learned.copy()
    inputs, labels = colour_set(["red", "blue"], 15, seed=7)  # not learned
    assert learner.calibrate(inputs, labels) == 30
    ids = learner.class_ids()
    y = torch.tensor([ids[n] for n in labels])
    X = learner._features(inputs)
    head = learner.head
    assert head.default_novelty == "relative_likelihood"
    expected = Calibration().fit(head.score_samples(X).double(), y,
                                 head.decision_function(X).double(),
                                 torch.tensor(head.classes_.tolist()),
                                 method="relative_likelihood")
    assert same_calibration(learner.calibration, expected)
    assert learner.statistics.counts.tolist() == learned.statistics.counts.tolist()
    assert learner.predict(colour_images("red", 1, seed=8), reject=True, reject_rate=0.1)
    learner.save(tmp_path / "model")
    assert same_calibration(Learner.load(tmp_path / "model").calibration, expected)
    with pytest.raises(UnknownClassError, match="unknown class 'purple'"):
        learner.calibrate(colour_images("purple", 3), ["purple"] * 3)
    assert same_calibration(learner.calibration, expected)  # unchanged by the failure


def test_a_model_saved_before_calibration_loads_and_says_it_has_none(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(FIXTURE / "model", model)
    learner = Learner.load(model)
    assert learner.calibration is None and learner.info()["calibration"] is None
    assert learner.config.calibration_share == 0.1  # the defaults of the new settings
    image = sorted((FIXTURE / "inputs").glob("*.png"))[0]
    with pytest.raises(ValueError, match=r"rejection needs a calibrated model, and this one has "
                                         r"no calibration: no learn has calibrated it \(a model "
                                         r"saved before gdacil calibrated"):
        learner.predict([image], reject=True)
    assert learner.predict([image])[0].novelty is None
    learner.learn(*colour_set(["purple"], 10, seed=3))  # its next learn calibrates it
    assert learner.calibration.n_records == 10
    assert learner.save(model) == "v3"
    assert Learner.load(model).calibration.n_records == 10


def test_a_calibration_saved_under_the_earlier_default_scores_new_inputs_its_way(learned):
    """Records saved before calibrations named their score were shrunk relative Mahalanobis
    scores (every head's default then): predictions compare new inputs on that score."""
    learner = learned.copy()
    tensors, meta = learner.calibration.state_dict()
    attributes = {k: v for k, v in meta["attributes"].items() if k != "method_"}
    learner._calibration = Calibration().load_state_dict(tensors, {**meta,
                                                                   "attributes": attributes})
    assert learner.calibration.method_ == "shrunk_relative_mahalanobis"
    x = colour_images("red", 3, seed=11)
    got = [p.novelty for p in learner.predict(x, reject=True, reject_rate=0.1)]
    expected = learner.head.score_samples(learner._features(x), "shrunk_relative_mahalanobis")
    assert got == expected.tolist()
    assert learned.calibration.method_ == "relative_likelihood"  # what learns record now
