"""One registry API for every kind of component; a registered class is usable everywhere."""

import pytest

from gdacil.drift import COMPENSATORS, SDC, build_compensator
from gdacil.heads import ALL_HEADS, HEADS, NCM, STREAMING_HEADS, build_head, head_class
from gdacil.registry import Registry, RegistryUnion, UnknownNameError

from test_runner import vit_config


class CosineNCM(NCM):
    """A user's head: NCM with the cosine metric by default."""

    def __init__(self, metric="cosine", **kwargs):
        super().__init__(metric=metric, **kwargs)


@pytest.fixture
def registered_head(monkeypatch):
    monkeypatch.setitem(HEADS._factories, "cosine_ncm", CosineNCM)
    return "cosine_ncm"


def test_a_head_registered_once_is_built_configured_and_listed(registered_head, tmp_path):
    assert registered_head in ALL_HEADS and head_class(registered_head) is CosineNCM
    assert build_head(registered_head).metric == "cosine"
    cfg = vit_config(tmp_path, heads={registered_head: {"metric": "euclidean"}})
    assert not cfg.heads[registered_head].streaming
    assert cfg.heads[registered_head].build().metric == "euclidean"


def test_the_union_of_head_registries_is_a_read_only_view():
    assert set(ALL_HEADS) == set(HEADS) | set(STREAMING_HEADS)
    with pytest.raises(TypeError, match="register a head in one of the registries"):
        ALL_HEADS.register("x", CosineNCM)
    with pytest.raises(UnknownNameError, match="unknown head 'x'; known: acil"):
        build_head("x")


def test_every_kind_uses_the_same_registry_and_error():
    from gdacil.adapt import STRATEGIES
    from gdacil.backbones import BACKBONES
    from gdacil.data import DATASETS

    for registry in (HEADS, STREAMING_HEADS, COMPENSATORS, BACKBONES, DATASETS, STRATEGIES):
        assert isinstance(registry, Registry)
        with pytest.raises(UnknownNameError, match=f"unknown {registry.kind} 'nope'; known: "):
            registry.build("nope")
    assert isinstance(build_compensator("sdc"), SDC)
    with pytest.raises(ValueError, match="unknown compensator 'nope'"):
        build_compensator({"name": "nope"})
    with pytest.raises(ValueError, match="already registered"):
        COMPENSATORS.register("sdc", SDC)
    assert isinstance(ALL_HEADS, RegistryUnion)
