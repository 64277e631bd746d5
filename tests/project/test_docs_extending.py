"""docs/extending.md stays true: its Python blocks run, in order, in one namespace, and the head
it adds passes every check of the public contract (which a broken head fails)."""

import re
from pathlib import Path

import pytest

from gdacil.adapt import STRATEGIES
from gdacil.backbones import BACKBONES
from gdacil.data import DATASETS
from gdacil.drift import COMPENSATORS
from gdacil.heads import HEADS
from gdacil.testing import HeadContract

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


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
    _the_head_passes_the_contract_and_a_broken_one_does_not(namespace)


def _the_head_passes_the_contract_and_a_broken_one_does_not(namespace):
    """The page's contract subclass ran every check; each broken variant fails one. (Run in the
    same test as the page: ``GaussianHead.load`` finds a class by its name, so the page's classes
    must be defined once.)"""
    every = sorted(name for name in dir(HeadContract) if name.startswith("test_"))
    assert len(every) >= 15
    assert sorted(namespace["checks"]) == every
    head_class, contract = namespace["DiagonalLDA"], namespace["TestDiagonalLDA"]

    class NoPriors(head_class):  # forgets the priors
        def _build(self, stats, log_priors):
            return super()._build(stats, 0.0 * log_priors)

    class Undeclared(head_class):  # a fitted attribute its state does not declare
        def fit(self, stats, **kw):
            self.spread_ = float(stats.average_covariance().trace())
            return super().fit(stats, **kw)

    class Mutating(head_class):  # changes the statistics it is fitted on
        def _build(self, stats, log_priors):
            stats.update(stats.means[:1].clone(), stats.classes[:1])
            return super()._build(stats, log_priors)

    for broken, failing in ((NoPriors, "test_priors_shift_scores_by_log_prior"),
                            (Undeclared, "test_declared_state_is_complete"),
                            (Mutating, "test_fit_returns_self_and_leaves_the_statistics_unchanged")):
        check = type(f"Test{broken.__name__}", (contract,),
                     {"make_head": lambda self, broken=broken, **kw: broken(**kw)})
        with pytest.raises(AssertionError):
            getattr(check(), failing)()
        with pytest.raises(AssertionError, match=rf"^Test{broken.__name__}\.test_\w+ failed"):
            check().check()
