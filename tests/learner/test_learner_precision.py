"""A model's precision (issue 43): the Learner and ``gdacil serve`` run the backbone as
``precision`` says (``auto``: bf16 where it is native, as experiments resolve
``backbone.precision``), recorded in the model, overridable per model (``gdacil learn
--precision``) and per command (``predict``/``serve --precision``, not saved), shown by
``gdacil info``; models saved before it existed run fp32, as they did.

``GDACIL_NATIVE_BF16`` pins what "auto" means, so every test holds on CPUs with and without
native bfloat16."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gdacil.cil.config import ConfigError
from gdacil.cli import main
from gdacil.learner import Learner, LearnerConfig

from _assets import TINY_VIT, needs_minilm, needs_serve, needs_transformers
from test_learner import COLOURS, colour_set, tiny_learner

pytestmark = needs_transformers

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def native(monkeypatch):
    """``native(True)``: "auto" means bf16 here; ``native(False)``: fp32."""
    def pin(value: bool) -> None:
        monkeypatch.setenv("GDACIL_NATIVE_BF16", "1" if value else "0")
    return pin


def learned(tmp_path, **settings) -> Path:
    learner = tiny_learner(**settings)
    learner.learn(*colour_set(list(COLOURS)[:3], 6))
    learner.save(tmp_path / "model")
    return tmp_path / "model"


def queries():
    return colour_set(list(COLOURS)[:3], 2, seed=5)[0]


def recorded(model: Path) -> dict:
    return json.loads((model / "versions" / "v1" / "learner.json").read_text())["config"]


@pytest.mark.parametrize("is_native, runs", [(True, "bf16"), (False, "fp32")])
def test_auto_is_recorded_and_resolves_as_runs_do(tmp_path, native, is_native, runs):
    from gdacil.backbones.base import resolve_precision

    native(is_native)
    model = learned(tmp_path)
    assert recorded(model)["precision"] == "auto"
    learner = Learner.load(model)
    assert learner.precision == runs == resolve_precision("auto", "cpu")
    learner.predict(queries()[:1])
    assert learner.backbone.precision == runs
    assert learner.info()["precision"] == {"model": "auto", "runs": runs}


def test_the_forward_passes_run_in_the_precision(tmp_path, native):
    # bf16 features: close to fp32's, and not equal to them (autocast really ran)
    native(False)
    model = learned(tmp_path, precision="fp32")
    fp32 = Learner.load(model)
    bf16 = Learner.load(model, precision="bf16")
    images = queries()
    a = fp32.backbone.extract(images)
    with bf16.backbone.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    b = bf16.backbone.extract(images)
    assert bf16.backbone.precision == "bf16" and not torch.equal(a, b)
    assert float(torch.nn.functional.cosine_similarity(a, b).min()) > 0.99
    reference = bf16.backbone.extract(images)
    assert torch.equal(b, reference)  # deterministic
    scores = [p.scores for p in bf16.predict(images, top_k=3, probabilities=False)]
    head = bf16.head.decision_function(b.double()).topk(3, dim=1).values
    np.testing.assert_allclose(scores, head.numpy(), rtol=1e-6)
    assert [p.classes[0] for p in bf16.predict(images)] == \
        [p.classes[0] for p in fp32.predict(images)]


@pytest.mark.parametrize("fixture", ["a8fdd53/model-lr_rgda", "learner-bundle-v1/model"])
def test_models_saved_before_precision_existed_run_fp32(tmp_path, native, fixture):
    native(True)  # "auto" would be bf16 here: such a model still runs as it did
    model = tmp_path / "model"
    shutil.copytree(FIXTURES / fixture, model)
    assert "precision" not in recorded_current(model)
    learner = Learner.load(model)
    assert learner.precision == "fp32" and learner.config.precision == "fp32"
    assert Learner.load(model, precision="bf16").precision == "bf16"


def recorded_current(model: Path) -> dict:
    version = (model / "CURRENT").read_text().strip()
    return json.loads((model / "versions" / version / "learner.json").read_text())["config"]


def test_cli_learn_records_the_precision_and_info_shows_it(tmp_path, capsys, monkeypatch,
                                                          native):
    from test_learner import image_folder

    native(True)
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "photos", ["red", "green"], 3)
    tiny = ["--backbone", "vit", "--backbone-option", f"config={json.dumps(TINY_VIT)}"]
    assert main(["learn", "m", "--data", "photos", *tiny, "--precision", "fp32"]) == 0
    assert recorded(tmp_path / "m")["precision"] == "fp32"
    capsys.readouterr()
    assert main(["info", "m"]) == 0
    assert "precision    fp32 (runs fp32 here)" in capsys.readouterr().out
    # another precision applies only when a model is created, as the other parts' options
    assert main(["learn", "m", "--data", "photos", "--precision", "bf16"]) == 2
    err = capsys.readouterr().err
    assert "already exists with precision 'fp32'; --precision applies only when a model is " \
           "created" in err
    assert main(["learn", "a", "--data", "photos", *tiny]) == 0  # default: auto
    capsys.readouterr()
    assert main(["info", "a", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["precision"] == {"model": "auto", "runs": "bf16"}


def test_predict_precision_applies_to_the_command_only(tmp_path, capsys, native):
    native(False)
    model = learned(tmp_path)  # auto: fp32 here
    from PIL import Image

    paths = []
    for i, pixels in enumerate(queries()):
        paths.append(tmp_path / f"q{i}.png")
        Image.fromarray(pixels).save(paths[-1])
    reference = [p.to_dict() for p in Learner.load(model, precision="bf16").predict(
        [str(p) for p in paths], top_k=2)]
    capsys.readouterr()
    assert main(["predict", str(model), *map(str, paths), "--top-k", "2",
                 "--precision", "bf16"]) == 0
    answers = json.loads(capsys.readouterr().out)
    assert [{k: v for k, v in a.items() if k != "input"} for a in answers] == reference
    fp32 = [p.to_dict() for p in Learner.load(model).predict([str(p) for p in paths], top_k=2)]
    assert fp32 != reference  # the override changed the arithmetic ...
    assert recorded(model)["precision"] == "auto"  # ... and nothing in the model


def test_a_learn_under_an_override_keeps_the_recorded_precision(tmp_path, native):
    native(False)
    model = learned(tmp_path, precision="fp32")
    learner = Learner.load(model, precision="bf16")
    learner.learn(*colour_set(["yellow"], 6))
    learner.save(model)
    config = recorded_current(model)
    assert config["precision"] == "fp32"
    assert Learner.load(model).precision == "fp32"


@needs_serve
def test_serve_runs_in_the_precision_asked(tmp_path, native):
    from gdacil.learner.serve import ModelService

    native(False)
    model = learned(tmp_path)
    images = queries()
    with ModelService(model, poll=0, precision="bf16") as service:
        assert service.learner.precision == "bf16"
        assert service.info()["precision"] == {"model": "auto", "runs": "bf16"}
    with ModelService(model, poll=0) as service:
        assert service.learner.precision == "fp32"
    assert Learner.load(model, precision="bf16").predict(images)[0].classes


def test_invalid_precisions_are_refused():
    with pytest.raises(ConfigError, match="unknown precision 'fp8'"):
        LearnerConfig(backbone="vit", precision="fp8")
    with pytest.raises(ConfigError, match="fp16 cannot train the backbone"):
        LearnerConfig(backbone="vit", strategy="seqft", precision="fp16")
    config = LearnerConfig(backbone="vit", backbone_options={"config": TINY_VIT},
                           strategy="seqft")
    with pytest.raises(ValueError, match="fp16 cannot train the backbone"):
        Learner.from_config(config, precision="fp16")
    assert Learner.from_config(config, precision="bf16").precision == "bf16"
    with pytest.raises(SystemExit):
        main(["predict", "m", "x", "--precision", "fp8"])


@needs_serve
@needs_minilm
def test_bf16_text_answers_across_batchings_agree_within_bf16_rounding(tmp_path, capsys):
    # in bf16 a text's scores move with the padding of the batch it is scored in (fp32's
    # differences stay at float32 round-off): Python, the CLI and HTTP still agree on every
    # class, and on probabilities to 0.01 (measured: up to 0.0017 on these texts)
    from test_learner_cli import TICKETS
    from test_learner_serve import call, running

    from gdacil.learner.serve import ModelService

    texts = ["I was charged twice", "my password reset link is broken", "refund " * 200,
             "where is my parcel", "two-factor code never arrives", "x"]
    learner = Learner("minilm", precision="bf16")
    learner.learn(*zip(*TICKETS))
    learner.save(tmp_path / "tickets")
    python = [p.to_list() for p in learner.predict(texts, top_k=2)]
    one_by_one = [learner.predict(t, top_k=2)[0].to_list() for t in texts]
    assert main(["predict", str(tmp_path / "tickets"), *texts, "--top-k", "2"]) == 0
    cli = [entry["predictions"] for entry in json.loads(capsys.readouterr().out)]
    with running(ModelService(tmp_path / "tickets", poll=0)) as url:
        status, answer = call(url, "/predict", {"inputs": texts, "top_k": 2})
    assert status == 200
    for other in (one_by_one, cli, answer["predictions"]):
        assert [[e["class"] for e in a] for a in other] == [[e["class"] for e in r]
                                                            for r in python]
        got = np.array([[e["probability"] for e in a] for a in other])
        want = np.array([[e["probability"] for e in r] for r in python])
        np.testing.assert_allclose(got, want, atol=1e-2)


def test_kept_casts_give_the_same_features_and_last_until_released():
    # what gdacil serve's prediction worker does: bf16 weight casts kept between forwards
    # (the same bits as fresh ones); kept means a weight changed in place is not seen, which
    # is why only a thread that never trains keeps them
    from gdacil.backbones.base import KeptCasts

    backbone = tiny_learner(precision="bf16").backbone
    images = queries()
    fresh = backbone.extract(images)
    kept = KeptCasts()
    kept.keep(backbone)
    assert torch.equal(backbone.extract(images), fresh)
    assert not torch.is_autocast_enabled("cpu")  # nothing else runs in bf16
    weight = next(m.weight for m in backbone.model.modules() if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        weight.mul_(-1.0)
    assert torch.equal(backbone.extract(images), fresh)  # the cast was kept
    kept.release()
    assert not torch.equal(backbone.extract(images), fresh)  # cast again: the new weight
    with torch.no_grad():
        weight.mul_(-1.0)
    assert torch.equal(backbone.extract(images), fresh)
    kept.keep(backbone.set_precision("fp32"))  # nothing to keep in fp32
    assert kept._held is None
