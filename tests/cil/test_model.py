"""IncrementalModel on its own: its task step against statistics computed at once, its
transaction, and its declared state round trip."""

from types import SimpleNamespace

import pytest
import torch

from gdacil.cil import IncrementalModel, TaskData
from gdacil.cil.config import StatisticsConfig
from gdacil.drift import build_compensator
from gdacil.heads import LDA, LRRGDA
from gdacil.stats import ClassGaussians

D = 6
FEATURES = torch.randn(120, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
LABELS = torch.arange(120) % 6


def model() -> IncrementalModel:
    return IncrementalModel(SimpleNamespace(dim=D), StatisticsConfig(),
                            compensators={"none": build_compensator("identity")},
                            heads={"lda": LDA, "lr_rgda": lambda: LRRGDA(rank=2)})


def task(classes) -> TaskData:
    keys = [i for i in range(len(LABELS)) if int(LABELS[i]) in classes]
    return TaskData(keys=keys, labels=LABELS[keys], samples=(),
                    features=lambda ks: FEATURES[list(ks)])


def test_two_tasks_give_the_statistics_and_heads_of_all_samples_at_once():
    m = model()
    for classes in ((0, 1, 2), (3, 4, 5)):
        timing = m.learn_task(0, task(classes))
        assert set(timing["heads"]) == {"lda", "lr_rgda"}
    at_once = ClassGaussians(D).update(FEATURES, LABELS)
    stats = m.tracks["none"]
    assert stats.classes == at_once.classes
    assert torch.allclose(stats.covariances(), at_once.covariances(), atol=1e-12)
    ref = LDA().fit(at_once).decision_function(FEATURES)
    assert torch.allclose(m.heads["none"]["lda"].decision_function(FEATURES), ref, atol=1e-9)


def test_a_failure_inside_the_task_leaves_statistics_and_heads_as_they_were():
    m = model()
    m.learn_task(0, task((0, 1, 2)))
    before = m.heads["none"]["lr_rgda"].decision_function(FEATURES)
    counts = m.tracks["none"].counts.clone()

    def fail(_X):
        raise RuntimeError("the reservoir could not take the samples")

    with pytest.raises(RuntimeError, match="reservoir"):
        m.learn_task(1, task((1, 3)), finish=fail)
    assert m.tracks["none"].classes == [0, 1, 2]
    assert torch.equal(m.tracks["none"].counts, counts)
    assert torch.equal(m.heads["none"]["lr_rgda"].decision_function(FEATURES), before)


def test_the_state_round_trip_gives_the_same_model():
    m = model()
    m.learn_task(0, task((0, 1, 2, 3)))
    copy = model().load_state_dict(*m.state_dict())
    assert copy.tracks["none"].classes == m.tracks["none"].classes
    for label in ("lda", "lr_rgda"):
        assert torch.equal(copy.heads["none"][label].decision_function(FEATURES),
                           m.heads["none"][label].decision_function(FEATURES))
    # the restored eigenpairs are bound to the restored statistics: the next task decomposes
    # only its new classes
    copy.learn_task(1, task((4, 5)))
    assert copy.heads["none"]["lr_rgda"].n_decomposed_ == 2
