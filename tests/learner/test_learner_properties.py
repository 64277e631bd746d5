"""The Learner's inputs, generated (Hypothesis): whatever arrays and labels it is given, it
answers or refuses with a one-line ``ValueError``/``TypeError`` naming the input, and a refused
``learn`` changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gdacil.learner.names import class_name

from _assets import needs_transformers
from test_learner import colour_set, tiny_learner

pytestmark = needs_transformers
COLOURS = ["red", "green", "blue"]
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def learner():
    model = tiny_learner()
    model.learn(*colour_set(COLOURS, 6))
    return model


def image_arrays():
    dtypes = st.sampled_from([np.uint8, np.uint16, np.int32, np.int64, np.float32, np.float64,
                              np.bool_, np.int8])
    shapes = st.sampled_from([(0, 5, 3), (5, 0), (6, 7), (6, 7, 1), (6, 7, 3), (6, 7, 4),
                              (6, 7, 2), (6, 7, 5), (2, 3, 4, 3)])
    return dtypes.flatmap(lambda d: shapes.flatmap(
        lambda s: hnp.arrays(d, s, elements=_elements(d))))


def _elements(dtype):
    if np.issubdtype(dtype, np.floating):
        return (st.floats(-2.0, 300.0, width=32) | st.floats(0.0, 1.0, width=32)
                | st.sampled_from([float("nan"), float("inf")]))
    if dtype is np.bool_:
        return st.booleans()
    info = np.iinfo(dtype)
    return st.integers(max(info.min, -5), min(info.max, 70_000))


def one_line(exc: BaseException) -> bool:
    return bool(str(exc)) and "\n" not in str(exc)


def test_any_image_array_is_answered_or_refused_naming_it(learner):
    outcomes = set()

    @PROPERTY
    @given(st.lists(image_arrays(), min_size=1, max_size=3))
    def check(arrays):
        try:
            predictions = learner.predict(arrays, top_k=2)
        except (ValueError, TypeError) as exc:
            assert one_line(exc) and "inputs[" in str(exc), str(exc)
            outcomes.add("refused")
            return
        outcomes.add("answered")
        assert len(predictions) == len(arrays)
        for p in predictions:
            assert set(p.classes) <= set(COLOURS) and len(p.classes) == 2
            assert all(np.isfinite(p.scores)) and 0 <= p.probabilities[0] <= 1

    check()
    assert outcomes == {"answered", "refused"}


def test_a_refused_learn_changes_nothing_and_names_the_label(learner):
    images, _ = colour_set(["yellow"], 3, seed=5)
    labels = st.lists(st.text(max_size=5) | st.integers(-3, 3) | st.none()
                      | st.floats(allow_nan=True) | st.binary(max_size=2) | st.booleans(),
                      min_size=3, max_size=3)

    outcomes = set()

    @PROPERTY
    @given(labels)
    def check(given_labels):
        before = (learner.classes, learner.class_counts(), learner.head.rows_.clone())
        model = learner.copy()
        try:
            expected = [class_name(y, f"labels[{i}]") for i, y in enumerate(given_labels)]
        except ValueError as refused:
            with pytest.raises(ValueError) as err:
                model.learn(images, given_labels)
            assert str(err.value) == str(refused) and one_line(err.value)
            assert (model.classes, model.class_counts()) == before[:2]
            assert torch.equal(model.head.rows_, before[2])
            outcomes.add("refused")
            return
        outcomes.add("learned")
        report = model.learn(images, given_labels)
        assert set(report.classes) == set(expected)
        assert set(model.classes) == set(COLOURS) | set(expected)
        assert (learner.classes, learner.class_counts()) == before[:2]  # the copy learned

    check()
    assert outcomes == {"learned", "refused"}
