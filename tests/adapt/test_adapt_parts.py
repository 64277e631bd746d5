"""Stage-1 building blocks: configs and presets, SCE loss, schedule, augmentation, NSP algebra."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch

from gdacil.adapt import (
    REFERENCE_OVERRIDES,
    STRATEGIES,
    AugmentConfig,
    StrategyConfig,
    build_strategy,
    lr_factor,
    minibatches,
    null_space_split,
    soft_projector,
    strategy_config,
    symmetric_cross_entropy,
)

from _assets import needs_transformers, random_images

# ---------------------------------------------------------------- configs


def test_presets_have_the_paper_defaults_and_round_trip_through_json():
    assert set(STRATEGIES) == {"frozen", "seqft", "seqkd", "nsp_seqft", "nsp_seqkd",
                               "lora_seqft", "lora_seqkd", "randproj"}
    for name in STRATEGIES:
        for defaults in ("paper", "reference"):
            cfg = strategy_config(name, defaults=defaults)
            again = StrategyConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
            assert again == cfg and again.name == name
    seqft = strategy_config("seqft").train
    assert (seqft.optimizer, seqft.lr, seqft.head_lr, seqft.momentum, seqft.steps) == (
        "sgd", 5e-6, 5e-5, 0.9, 1000)
    assert (seqft.warmup_ratio, seqft.final_lr_ratio, seqft.loss, seqft.batch_size) == (
        0.1, 1 / 3, "sce", 16)
    assert strategy_config("seqkd").kd_weight == 1.0
    nsp = strategy_config("nsp_seqkd")
    assert nsp.kd_weight == 0.5 and (nsp.null_space.eps, nsp.null_space.soft) == (0.05, 0.02)
    assert nsp.train.steps == 1500
    lora = strategy_config("lora_seqkd")
    assert (lora.lora.rank, lora.lora.scale, lora.train.optimizer, lora.train.lr,
            lora.train.head_lr) == (4, 1.0, "adamw", 1e-4, 1e-3)
    rp = strategy_config("randproj")
    assert rp.first_task_only and rp.params == "lora" and rp.train.loss == "ce"
    # the reference code's departures
    ref = strategy_config("nsp_seqft", defaults="reference").train
    assert (ref.optimizer, ref.head_lr, ref.steps) == ("adamw", 1e-3, 1000)
    assert strategy_config("lora_seqft", defaults="reference").train.steps == 1000
    assert set(REFERENCE_OVERRIDES) <= set(STRATEGIES)


def test_overrides_merge_into_the_preset_key_by_key():
    cfg = strategy_config("nsp_seqkd", train={"steps": 7}, null_space={"soft": 0.0})
    assert cfg.train.steps == 7 and cfg.train.lr == 5e-6 and cfg.null_space.soft == 0.0
    assert cfg.null_space.eps == 0.05
    assert strategy_config("nsp_seqft", null_space=None).null_space is None
    assert strategy_config("seqft", train={"augment": True}).train.augment == AugmentConfig()
    s = build_strategy(cfg.to_dict())  # a saved config
    assert s.config == cfg
    assert build_strategy(cfg, kd_weight=2.0).config.kd_weight == 2.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "nope"}, "unknown strategy 'nope'; known: frozen, lora_seqft"),
        ({"train": {"optimizer": "adam"}}, "unknown optimizer 'adam'; known: sgd, adamw"),
        ({"train": {"lr": -1e-3}}, "lr must be a finite number in"),
        ({"train": {"head_lr": float("nan")}}, "head_lr must be"),
        ({"train": {"steps": -1}}, "steps must be an integer >= 0"),
        ({"train": {"steps": 2.5}}, "strategy.train.steps: expected an integer, got 2.5"),
        ({"train": {"batch_size": 0}}, "batch_size must be an integer >= 1"),
        ({"train": {"momentum": 1.0}}, "momentum must be"),
        ({"train": {"loss": "mse"}}, "unknown loss 'mse'; known: sce, ce"),
        ({"train": {"warmup_ratio": 1.5}}, "warmup_ratio must be"),
        ({"train": {"bogus": 1}}, r"unknown key\(s\) \['bogus'\]"),
        ({"train": {"augment": {"scale": [0.5, 0.1]}}}, r"augment scale\[1\]"),
        ({"train": "fast"}, "strategy.train: expected a mapping, got 'fast'"),
        ({"params": "all"}, "unknown params 'all'; known: none, mlp, lora"),
        ({"kd_weight": -1}, "kd_weight must be"),
        ({"null_space": {"eps": 0.0}}, "null_space eps must be"),
        ({"null_space": {"soft": 2}}, "null_space soft must be"),
        ({"lora": {"rank": 0}}, "lora rank must be an integer >= 1"),
        ({"lora": {"targets": ["mlp"]}}, r"unknown lora target\(s\) \['mlp'\]"),
        ({"name": "lora_seqft", "null_space": {}}, "null_space projection needs params='mlp'"),
        ({"name": "frozen", "kd_weight": 1.0}, "kd_weight > 0 needs a trained backbone"),
        ({"defaults": "best"}, "unknown defaults 'best'; known: paper, reference"),
        ({"typo": 1}, r"unknown key\(s\) \['typo'\]"),
    ],
)
def test_bad_configs_raise_clear_value_errors(kwargs, match):
    kwargs = dict(kwargs)
    name = kwargs.pop("name", "seqft")
    with pytest.raises(ValueError, match=match):
        build_strategy(name, **kwargs)


# ---------------------------------------------------------------- loss and schedule


def test_sce_matches_its_closed_form():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 3, 0, 1])
    p = torch.softmax(logits, 1)
    py = p[torch.arange(6), y]
    ce = -py.log() - 1e-4 * (p.log().sum(1) - py.log())
    rce = -math.log(1e-4) * (1 - py)
    expected = (0.5 * ce + 0.5 * rce).mean()
    torch.testing.assert_close(symmetric_cross_entropy(logits, y), expected)
    # lambda2 = 0 and (almost) no label clamping is plain cross-entropy
    torch.testing.assert_close(
        symmetric_cross_entropy(logits, y, lambda1=1.0, lambda2=0.0, label_min=1e-30),
        torch.nn.functional.cross_entropy(logits, y),
    )


def test_warmup_cosine_schedule():
    total = 100
    f = [lr_factor(s, total, 0.1, 1 / 3) for s in range(total)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0) and f[-1] == pytest.approx(1 / 3)
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))
    assert lr_factor(0, 1, 0.0, 0.5) == 1.0  # a single step runs at the base rate


def test_minibatches_cycle_over_shuffled_passes():
    g = torch.Generator().manual_seed(0)
    batches = list(minibatches(10, 4, 6, g))
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(10))
    again = list(minibatches(10, 4, 6, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))


# ---------------------------------------------------------------- augmentation


@needs_transformers
def test_augmentation_is_seeded_and_reduces_to_eval_preprocessing():
    from dataclasses import replace

    from gdacil.adapt import augment_images
    from gdacil.backbones import ImagePreprocess

    imgs = random_images(3, size=(40, 48))
    tf = ImagePreprocess(32, None, "bilinear", "half")
    cfg = AugmentConfig()
    a = augment_images(imgs, tf, cfg, torch.Generator().manual_seed(1))
    b = augment_images(imgs, tf, cfg, torch.Generator().manual_seed(1))
    c = augment_images(imgs, tf, cfg, torch.Generator().manual_seed(2))
    assert a.shape == (3, 3, 32, 32) and torch.equal(a, b) and not torch.equal(a, c)
    square = random_images(2, size=(32, 32))
    whole = AugmentConfig(scale=(1.0, 1.0), ratio=(1.0, 1.0), flip=0.0, brightness=0.0)
    plain = replace(tf, resize=None)(square)
    torch.testing.assert_close(augment_images(square, tf, whole, torch.Generator()), plain)
    flipped = augment_images(square, tf, replace(whole, flip=1.0), torch.Generator())
    torch.testing.assert_close(flipped, plain.flip(-1))
    dimmed = augment_images([np.full((32, 32, 3), 200, np.uint8)], tf,
                            replace(whole, brightness=0.5), torch.Generator().manual_seed(0))
    level = float(dimmed.mean()) * 0.5 + 0.5  # back to [0, 1] ("half" normalisation)
    assert 0.5 * 200 / 255 - 0.01 <= level <= 1.0 and abs(level - 200 / 255) > 1e-3


# ---------------------------------------------------------------- null-space algebra


def test_null_space_split_and_soft_projector():
    g = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    energy = torch.tensor([0.01, 0.02, 0.5, 1.0, 3.0, 10.0], dtype=torch.float64)
    s = q @ torch.diag(energy) @ q.T
    # cumulative energy fractions: 0.0007, 0.002, 0.036, 0.11, ... -> 3 directions under 5 %
    v_null, v_prot = null_space_split(s, 0.05, jitter=0.0)
    assert v_null.shape == (6, 3) and v_prot.shape == (6, 3)
    torch.testing.assert_close(v_null @ v_null.T, q[:, :3] @ q[:, :3].T)
    P = soft_projector(v_null, 0.02)
    torch.testing.assert_close(P @ v_null, v_null)
    torch.testing.assert_close(P @ v_prot, 0.02 * v_prot)
    grad = torch.randn(4, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close((grad @ soft_projector(v_null, 0.0)) @ v_prot,
                               torch.zeros(4, 3, dtype=torch.float64))
    assert np.isclose(float(torch.linalg.matrix_norm(P - P.T)), 0.0)
