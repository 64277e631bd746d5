import math

import numpy as np
import pytest

from gdacil.cil.metrics import IncrementalMetrics, TaskEvaluation, summarize_seeds


def hand_run():
    """Three tasks, classes {0,1}, {2}, {3}; two test samples per class.

    After task 1: all four task-1 samples right.
    After task 2: task 1 3/4 right, task 2 1/2 right.
    After task 3: task 1 2/4, task 2 2/2, task 3 0/2.
    """
    y1 = [0, 0, 1, 1]
    y2 = [*y1, 2, 2]
    y3 = [*y2, 3, 3]
    t1, t2, t3 = [0] * 4, [0] * 4 + [1] * 2, [0] * 4 + [1] * 2 + [2] * 2
    m = IncrementalMetrics(3)
    m.add(TaskEvaluation(y1, [0, 0, 1, 1], t1))
    m.add(TaskEvaluation(y2, [0, 0, 1, 2, 2, 0], t2))
    m.add(TaskEvaluation(y3, [0, 1, 0, 1, 2, 2, 2, 0], t3))
    return m


def test_metrics_match_a_hand_computed_accuracy_matrix():
    m = hand_run()
    expected = np.array([[1.0, np.nan, np.nan], [0.75, 0.5, np.nan], [0.5, 1.0, 0.0]])
    np.testing.assert_array_equal(m.accuracy_matrix, expected)
    assert m.pooled == [1.0, 4 / 6, 4 / 8]
    assert m.last_acc == 0.5
    assert m.inc_acc == pytest.approx((1.0 + 4 / 6 + 0.5) / 3)
    # per-class after task 3: class0 1/2, class1 1/2, class2 1, class3 0
    assert m.class_balanced[-1] == pytest.approx((0.5 + 0.5 + 1.0 + 0.0) / 4)
    # forgetting: task1 max(1, .75) - .5 = .5; task2 .5 - 1.0 = -.5 -> mean 0
    assert m.forgetting == pytest.approx(0.0)
    d = m.to_dict()
    assert d["accuracy_matrix"][0][1] is None and d["last_acc"] == 0.5


def test_evaluation_input_errors():
    with pytest.raises(ValueError, match="no test samples"):
        TaskEvaluation([], [], [])
    with pytest.raises(ValueError, match="differ in length"):
        TaskEvaluation([0, 1], [0], [0, 0])
    m = IncrementalMetrics(1)
    m.add(TaskEvaluation([0], [0], [0]))
    with pytest.raises(ValueError, match="already evaluated"):
        m.add(TaskEvaluation([0], [0], [0]))


def test_seed_summary_uses_the_t_interval():
    s = summarize_seeds([0.5, 0.6, 0.7])
    assert s["mean"] == pytest.approx(0.6) and s["std"] == pytest.approx(0.1)
    assert s["ci95"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    assert summarize_seeds([0.4]) == {"mean": 0.4, "std": None, "ci95": None, "n": 1}
