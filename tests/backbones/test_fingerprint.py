"""The backbone's weights hash is computed once per state of the weights, and any change to the
weights through torch still changes it."""

import pytest
import torch

import gdacil.backbones.base as base
from gdacil.backbones import build_backbone

from _assets import TINY_VIT, needs_transformers, random_images


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = base.sha256_tensors

    def counting(named):
        calls.append(1)
        return real(named)

    monkeypatch.setattr(base, "sha256_tensors", counting)
    return calls


@needs_transformers
def test_the_hash_is_reused_until_a_weight_changes(counted):
    bb = build_backbone("vit", config=TINY_VIT)
    first = bb.fingerprint()
    for _ in range(5):
        assert bb.fingerprint() == first
    assert len(counted) == 1

    weight = dict(bb.model.named_parameters())["layers.0.attention.o_proj.weight"]
    original = {k: v.clone() for k, v in bb.model.state_dict().items()}
    with torch.no_grad():
        weight[0, 0] += 1.0  # an in-place write
    stepped = bb.fingerprint()
    assert stepped != first and len(counted) == 2

    opt = torch.optim.SGD(bb.model.parameters(), lr=0.1)
    bb.model(torch.rand(1, 3, 32, 32)).last_hidden_state.sum().backward()
    opt.step()
    trained = bb.fingerprint()
    assert trained not in (first, stepped)

    bb.model.load_state_dict(original)  # back to the first weights: the first hash
    assert bb.fingerprint() == first

    module = bb.model.layers[0].attention.o_proj
    module.weight = torch.nn.Parameter(module.weight.detach() * 2.0)  # a new tensor object
    assert bb.fingerprint() not in (first, stepped, trained)


@needs_transformers
def test_writes_outside_torch_need_forget_fingerprint(counted):
    bb = build_backbone("vit", config=TINY_VIT)
    first = bb.fingerprint()
    bias = dict(bb.model.named_parameters())["layers.0.attention.o_proj.bias"]
    bias.detach().numpy()[0] += 1.0  # bypasses torch's version counter
    assert bb.fingerprint() == first  # documented: not seen
    bb.forget_fingerprint()
    assert bb.fingerprint() != first and len(counted) == 2



@needs_transformers
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_features_are_close_and_cached_apart(precision):
    bb = build_backbone("vit", config=TINY_VIT)
    images = random_images(6)
    exact = bb.extract(images, batch_size=4)
    fp32_key = bb.fingerprint()
    assert bb.set_precision(precision) is bb
    mixed = bb.extract(images, batch_size=4)
    assert mixed.dtype == torch.float32 and mixed.shape == exact.shape
    assert not torch.equal(mixed, exact)  # autocast really ran in lower precision
    # within 2% of each fp32 feature vector (a few bf16 unit roundoffs, 2^-9 = 0.2%, through
    # the layers; measured 0.2% for bf16, whether native or emulated)
    error = (mixed - exact).norm(dim=1) / exact.norm(dim=1)
    assert error.max() < 0.02, error
    cosine = torch.nn.functional.cosine_similarity(mixed, exact, dim=1)
    assert cosine.min() > 0.999
    assert bb.fingerprint() != fp32_key  # a cache never serves one precision's features for another
    assert bb.set_precision("fp32").fingerprint() == fp32_key
    assert torch.equal(bb.extract(images, batch_size=4), exact)
    with pytest.raises(ValueError, match="unknown precision 'fp8'; known: auto, fp32, bf16, fp16"):
        bb.set_precision("fp8")


@needs_transformers
@pytest.mark.parametrize("native", [False, True])
def test_auto_precision_is_bf16_only_where_bfloat16_is_native(monkeypatch, native):
    monkeypatch.setattr(base, "native_bfloat16", lambda device: native)
    bb = build_backbone("vit", config=TINY_VIT)
    assert bb.set_precision("auto").precision == ("bf16" if native else "fp32")
    fp32 = build_backbone("vit", config=TINY_VIT).set_precision("fp32")
    # the resolved precision keys the cache: "auto" on an AVX2 CPU reads the fp32 features
    assert (bb.fingerprint() == fp32.fingerprint()) is not native


# ---------------------------------------------------------------- GDACIL_NATIVE_BF16
@pytest.mark.parametrize(("value", "native"), [("1", True), ("0", False), ("true", True),
                                                (" OFF ", False)])
def test_the_environment_overrides_what_auto_resolves_to(monkeypatch, value, native):
    """GDACIL_NATIVE_BF16 makes any machine resolve "auto" as a native-bf16 one (1) or as an
    AVX2 one (0): the backbone precision of a config and the screening of low-rank heads."""
    from gdacil._hardware import native_bfloat16
    from gdacil.cil.config import BackboneConfig
    from gdacil.heads.lowrank import _fast_screen_dtype

    monkeypatch.setenv("GDACIL_NATIVE_BF16", value)
    cpu = torch.device("cpu")
    assert native_bfloat16(cpu) is native and native_bfloat16("cuda") is native
    assert base.resolve_precision("auto", cpu) == ("bf16" if native else "fp32")
    assert BackboneConfig().resolved_precision() == ("bf16" if native else "fp32")
    for explicit in ("fp32", "bf16", "fp16"):  # only "auto" depends on the machine
        assert base.resolve_precision(explicit, cpu) == explicit
    assert _fast_screen_dtype(torch.float32, cpu) == (torch.bfloat16 if native else torch.float32)


def test_without_the_override_the_hardware_decides_and_a_bad_value_is_refused(monkeypatch):
    from gdacil._hardware import native_bfloat16

    hardware = any(getattr(torch.cpu, name, lambda: False)()
                   for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    for unset in (None, ""):
        if unset is None:
            monkeypatch.delenv("GDACIL_NATIVE_BF16", raising=False)
        else:
            monkeypatch.setenv("GDACIL_NATIVE_BF16", unset)
        assert native_bfloat16("cpu") is hardware
    monkeypatch.setenv("GDACIL_NATIVE_BF16", "maybe")
    with pytest.raises(ValueError, match="GDACIL_NATIVE_BF16='maybe': expected 1 or 0"):
        base.resolve_precision("auto", "cpu")


def test_subprocesses_inherit_the_override(monkeypatch):
    """What makes the override reach torchrun workers and `gdacil` subprocesses: the
    environment, read at every resolution (the opposite of this CPU's answer, so the child
    cannot get it right by asking the hardware)."""
    import os
    import subprocess
    import sys

    monkeypatch.delenv("GDACIL_NATIVE_BF16", raising=False)
    from gdacil._hardware import native_bfloat16

    forced = not native_bfloat16("cpu")
    code = ("from gdacil.backbones.base import resolve_precision\n"
            "print(resolve_precision('auto', 'cpu'))")
    env = {**os.environ, "GDACIL_NATIVE_BF16": str(int(forced))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == ("bf16" if forced else "fp32")

