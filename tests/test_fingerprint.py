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
    cosine = torch.nn.functional.cosine_similarity(mixed, exact, dim=1)
    assert cosine.min() > 0.99
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
