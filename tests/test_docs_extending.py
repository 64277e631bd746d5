"""docs/extending.md stays true: its Python blocks run, in order, in one namespace."""

import re
from pathlib import Path

import pytest

from gdacil.adapt import STRATEGIES
from gdacil.backbones import BACKBONES
from gdacil.data import DATASETS
from gdacil.drift import COMPENSATORS
from gdacil.heads import HEADS

DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture
def clean_registries(monkeypatch):
    """The page registers new names: give every registry back its entries afterwards."""
    for registry in (HEADS, COMPENSATORS, DATASETS, BACKBONES, STRATEGIES):
        monkeypatch.setattr(registry, "_factories", dict(registry._factories))


def test_every_block_of_the_extending_page_runs(clean_registries):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 5  # head, compensator, dataset, backbone, experiment
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # intended: runs the docs' own code
    for registry, name in ((HEADS, "diagonal_lda"), (COMPENSATORS, "mean_shift"),
                           (DATASETS, "tiny-words"), (BACKBONES, "char-bag")):
        assert name in registry
