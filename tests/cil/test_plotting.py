"""gdacil's figures leave the user's matplotlib state alone and are written whole."""

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from gdacil._plotting import save_figure, subplots
from gdacil.cil.metrics import IncrementalMetrics, TaskEvaluation
from gdacil.cil.results import _plot


def test_plots_keep_the_backend_and_open_no_pyplot_figure(tmp_path):
    matplotlib.use("svg")  # a user's choice that gdacil must not replace
    try:
        before = set(plt.get_fignums())
        y = np.array([0, 0, 1, 1])
        metrics = IncrementalMetrics(2)
        metrics.add(TaskEvaluation(y[:2], y[:2], np.zeros(2, dtype=int)))
        metrics.add(TaskEvaluation(y, np.array([0, 1, 1, 1]), np.array([0, 0, 1, 1])))
        _plot(tmp_path / "accuracy.png", "run", {0: {"lda": metrics}})
        fig, axes = subplots(1, 2, figsize=(4, 2), sharey=True)
        axes[0].plot([0, 1], [1, 0])
        save_figure(fig, tmp_path / "two.png")
        assert matplotlib.get_backend() == "svg"
        assert set(plt.get_fignums()) == before
    finally:
        matplotlib.use("agg")
    for name in ("accuracy.png", "two.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", name
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
