"""Run by tests/stats/test_lowrank_stats.py: ``_slow_moments.py MARKERS``, a caller of
:func:`gdacil.stats.lowrank.build_in_processes` that the test kills while its workers run.

Each block of moments waits a little and leaves a file named by the worker's process id under
``MARKERS``, so the test knows which workers are running.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from gdacil.stats.lowrank import build_in_processes

DIM = 6


class SlowMoments:
    def __init__(self, markers: str):
        self.markers = Path(markers)

    def __call__(self, labels):
        (self.markers / str(os.getpid())).touch()
        time.sleep(0.2)
        g = torch.Generator().manual_seed(labels[0])
        x = torch.randn(len(labels), 3 * DIM, DIM, generator=g, dtype=torch.float64)
        return x.mean(1), x.transpose(1, 2) @ x / x.shape[1], torch.full((len(labels),), 3 * DIM)


if __name__ == "__main__":
    build_in_processes(SlowMoments(sys.argv[1]), range(1000), processes=2, block=1, dim=DIM,
                       rank=2)
