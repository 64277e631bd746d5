"""The content-addressed feature cache."""

from __future__ import annotations

import json

import pytest
import torch

from gdacil.backbones import build_backbone
from gdacil.data import FeatureCache, extract_features

from _assets import TINY_VIT, needs_minilm, needs_transformers, needs_wordnet, random_images


class CountingLoader:
    """A ``load(ids)`` over generated images that counts the samples it was asked for."""

    def __init__(self, n: int = 7):
        self.images = dict(zip((f"s{i}" for i in range(n)), random_images(n)))
        self.loaded = 0

    def __call__(self, ids):
        self.loaded += len(ids)
        return [self.images[i] for i in ids]


@pytest.fixture(scope="module")
def vit():
    return build_backbone("vit", config=TINY_VIT)


@needs_transformers
def test_cache_hit_returns_identical_features_without_loading(tmp_path, vit):
    cache, load = FeatureCache(tmp_path), CountingLoader()
    ids = sorted(load.images)
    first = cache.get_or_compute(vit, ids, load, batch_size=3)
    assert load.loaded == 7 and cache.misses == 1
    torch.testing.assert_close(first, vit.extract(load(ids)), rtol=0, atol=0)
    load.loaded = 0
    again = FeatureCache(tmp_path).get_or_compute(vit, ids, load)
    assert load.loaded == 0 and torch.equal(again, first)
    files = list(tmp_path.rglob("*.safetensors"))
    assert len(files) == 1
    header_len = int.from_bytes(files[0].read_bytes()[:8], "little")  # safetensors, not pickle
    meta = json.loads(files[0].read_bytes()[8 : 8 + header_len])["__metadata__"]
    assert vit.fingerprint() in meta["gdacil"]


@needs_transformers
def test_cache_key_changes_with_weights_ids_and_namespace(tmp_path):
    bb = build_backbone("vit", config=TINY_VIT)
    cache, load = FeatureCache(tmp_path), CountingLoader()
    ids = sorted(load.images)
    cache.get_or_compute(bb, ids, load)
    cache.get_or_compute(bb, ids[::-1], load)  # other order: other rows, other entry
    cache.get_or_compute(bb, ids, load, namespace="dataset-v2")
    with torch.no_grad():
        bb.blocks()[0].mlp_in.weight.mul_(1.01)  # adapted backbone
    cache.get_or_compute(bb, ids, load)
    assert cache.misses == 4 and cache.hits == 0
    assert len(list(tmp_path.rglob("*.safetensors"))) == 4


@needs_transformers
def test_corrupt_entry_is_detected(tmp_path, vit):
    cache, load = FeatureCache(tmp_path), CountingLoader(2)
    ids = sorted(load.images)
    cache.get_or_compute(vit, ids, load)
    key = cache.key(vit.fingerprint(), ids)
    other = cache.key(vit.fingerprint(), ids[:1])
    cache.path(other).parent.mkdir(parents=True, exist_ok=True)
    cache.path(key).rename(cache.path(other))
    with pytest.raises(ValueError, match="corrupt cache"):
        cache.get(other)
    with pytest.raises(ValueError, match="do not hash"):
        cache.put(key, torch.zeros(1), {"n": 3})


@needs_transformers
def test_extract_features_batches_with_a_progress_bar(vit, capsys):
    load = CountingLoader(5)
    ids = sorted(load.images)
    f = extract_features(vit, ids, load, batch_size=2, progress=True)
    assert f.shape == (5, 32)
    err = capsys.readouterr().err
    # one load of 5 samples: the bar counts samples after each forward pass of 2, 2 and 1
    assert "features (vit)" in err and "5/5" in err and "sample" in err
    torch.testing.assert_close(f, extract_features(vit, ids, load, batch_size=2))
    assert extract_features(vit, [], load).shape == (0, 32)


@needs_minilm
@needs_wordnet
def test_minilm_glosses_cached(tmp_path):
    from gdacil.data import Protocol

    seq = Protocol("wordnet-hypernym", train_cap=2, test_cap=1, increment=50).build()
    ids = seq[0].train.ids[:12]
    calls = []

    def load(batch):
        calls.append(len(batch))
        return seq.load(batch)

    bb = build_backbone("minilm")
    cache = FeatureCache(tmp_path)
    first = cache.get_or_compute(bb, ids, load, batch_size=1, namespace=seq.cache_namespace,
                                 load_batches=8)
    assert first.shape == (12, 384) and calls == [8, 4]  # 1-sample batches, loaded 8 at a time
    torch.testing.assert_close(first, bb.extract(seq.load(ids)), atol=1e-5, rtol=1e-4)
    second = cache.get_or_compute(bb, ids, load, namespace=seq.cache_namespace)
    assert calls == [8, 4] and torch.equal(first, second) and cache.hits == 1
    other = Protocol(
        "wordnet-hypernym",
        train_cap=2,
        test_cap=1,
        increment=50,
        dataset_options={"wordnet-hypernym": {"n_classes": 90}},
    ).build()
    assert other.cache_namespace != seq.cache_namespace
