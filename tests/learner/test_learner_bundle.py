"""Model bundles (gdacil.learner.bundle): exact round trips, checksums, versions and rollback,
readers during writes, and the committed fixture of the first bundle format."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gdacil.io import CorruptFileError
from gdacil.learner import BundleError, Learner, rollback, versions
from gdacil.learner.bundle import current_version, write_version

from _assets import needs_transformers
from test_learner import colour_images, colour_set, image_folder, tiny_learner, trained_learner

FIXTURE = Path(__file__).parents[1] / "fixtures" / "learner-bundle-v1"
NAMES = ["red", "green", "blue", "yellow", "purple"]


def scores(learner: Learner, inputs) -> torch.Tensor:
    """The head's scores of every class (what predictions are made of)."""
    return learner.head.decision_function(learner._features(inputs))


def saved(model: Path, names, n: int) -> Learner:
    """A frozen tiny learner of ``names`` (``n`` images each), saved as ``model``'s first version."""
    learner = tiny_learner()
    learner.learn(*colour_set(names, n))
    learner.save(model)
    return learner


@pytest.fixture(scope="module")
def trained_bundle(tmp_path_factory) -> Path:
    """A model whose versions hold every kind of file: v1 red/green, v2 + blue (trained)."""
    model = tmp_path_factory.mktemp("trained") / "model"
    learner = trained_learner()
    learner.learn(*colour_set(NAMES[:2], 5))
    learner.save(model)
    learner.learn(*colour_set(NAMES[2:3], 5))
    learner.save(model)
    return model


# ---------------------------------------------------------------------- round trips
@needs_transformers
@pytest.mark.parametrize("kind", ["frozen", "trained"])
def test_save_and_load_give_identical_predictions_and_scores(tmp_path, kind):
    learner = tiny_learner() if kind == "frozen" else trained_learner()
    learner.learn(*colour_set(NAMES[:3], 6))
    test = colour_set(NAMES[:3], 3, seed=4)[0]
    before, raw = learner.predict(test, top_k=3), scores(learner, test)
    assert learner.save(tmp_path / "model") == "v1" and learner.version == "v1"
    loaded = Learner.load(tmp_path / "model")
    assert loaded.predict(test, top_k=3) == before  # names, scores, probabilities: bit for bit
    assert loaded._stats is None  # predicting reads no statistics
    assert torch.equal(scores(loaded, test), raw)
    assert loaded.classes == learner.classes and loaded.class_ids() == learner.class_ids()
    assert torch.equal(loaded.statistics.scatters, learner.statistics.scatters)
    assert loaded.info() == learner.info() and loaded.config == learner.config
    files = set(os.listdir(tmp_path / "model" / "versions" / "v1"))
    stored = {"manifest.json", "learner.json", "statistics", "head.safetensors",
              "calibration.safetensors"}  # 6 samples a class: each a record
    if kind == "trained":
        stored |= {"backbone.safetensors", "strategy.safetensors", "anchors.json", "anchors"}
    assert files == stored
    # a loaded model keeps learning, and continues its own version line
    loaded.learn(*colour_set(NAMES[3:4], 6))
    assert loaded.save(tmp_path / "model") == "v2"
    assert [v.parent for v in versions(tmp_path / "model")] == [None, "v1"]


@needs_transformers
def test_a_loaded_model_learns_and_forgets_exactly_as_if_never_saved(tmp_path):
    kept = tiny_learner()
    kept.learn(*colour_set(NAMES[:3], 6))
    kept.save(tmp_path / "model")
    loaded = Learner.load(tmp_path / "model")
    test = colour_set(NAMES, 2, seed=6)[0]
    for learner in (kept, loaded):
        learner.learn(*colour_set(NAMES[3:], 6))
        assert learner.head.n_decomposed_ == 2  # LR-RGDA's stored eigenpairs are reused
    assert torch.equal(scores(loaded, test), scores(kept, test))
    for learner in (kept, loaded):
        learner.forget(["green"])
        assert learner.head.n_decomposed_ == 0
    assert loaded.predict(test, top_k=4) == kept.predict(test, top_k=4)


@needs_transformers
def test_a_head_whose_state_is_its_statistics_loads_without_reading_them(tmp_path):
    learner = tiny_learner(head="fecam")  # FeCAM's fitted state is its statistics
    learner.learn(*colour_set(NAMES[:3], 6))
    test = colour_set(NAMES[:3], 2, seed=4)[0]
    learner.save(tmp_path / "model")
    assert (tmp_path / "model" / "versions" / "v1" / "head.safetensors").exists()
    loaded = Learner.load(tmp_path / "model")
    assert loaded.predict(test, top_k=3) == learner.predict(test, top_k=3)
    assert loaded._lazy is not None  # predicting read no statistics


# ---------------------------------------------------------------------- integrity
def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@needs_transformers
def test_every_altered_or_missing_file_is_refused_naming_it(tmp_path, trained_bundle):
    version = trained_bundle / "versions" / "v2"
    files = sorted(p.relative_to(version).as_posix() for p in version.rglob("*") if p.is_file())
    assert {"backbone.safetensors", "strategy.safetensors", "anchors.json",
            "calibration.safetensors"} < set(files)
    assert any(f.startswith("anchors/") for f in files)
    for i, name in enumerate(files):
        for how in ("altered", "missing"):
            copy = tmp_path / f"{i}-{how}"
            shutil.copytree(trained_bundle, copy)
            target = copy / "versions" / "v2" / name
            _damage(target) if how == "altered" else target.unlink()
            with pytest.raises(CorruptFileError) as err:
                Learner.load(copy)
            assert str(target) in str(err.value), (name, how, str(err.value))
            assert "gdacil rollback" in str(err.value)
            Learner.load(copy, "v1")  # the other versions are untouched
    # a manifest edited consistently (its own checksum recomputed) still fails on the file
    copy = tmp_path / "edited"
    shutil.copytree(trained_bundle, copy)
    (copy / "CURRENT").write_text("v7\n")
    with pytest.raises(CorruptFileError, match="CURRENT: names version v7, which does not exist"):
        Learner.load(copy)
    (copy / "CURRENT").write_text("latest\n")
    with pytest.raises(CorruptFileError, match="does not name a version"):
        Learner.load(copy)


@needs_transformers
def test_missing_and_foreign_directories(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model at .*gdacil learn"):
        Learner.load(tmp_path / "nothing")
    (tmp_path / "photos").mkdir()
    with pytest.raises(BundleError, match="is not a gdacil model: it has no CURRENT file"):
        Learner.load(tmp_path / "photos")
    (tmp_path / "photos" / "cat.png").write_bytes(b"")
    learner = saved(tmp_path / "model", NAMES[:2], 3)
    with pytest.raises(BundleError, match="not empty and not a gdacil model"):
        learner.save(tmp_path / "photos")
    with pytest.raises(BundleError, match=r"no version v9 \(versions: v1\)"):
        Learner.load(tmp_path / "model", "v9")


# ---------------------------------------------------------------------- versions
@needs_transformers
def test_rollback_restores_identical_predictions(tmp_path):
    model = tmp_path / "model"
    learner = saved(model, NAMES[:2], 5)
    test = colour_set(NAMES[:3], 2, seed=3)[0]
    first, first_scores = learner.predict(test, top_k=2), scores(learner, test)
    learner.learn(*colour_set(NAMES[2:3], 5))
    learner.save(model)
    assert Learner.load(model).predict(test, top_k=2) != first
    info = rollback(model, "v1")
    assert (info.name, info.current, info.summary["classes"]) == ("v1", True, 2)
    back = Learner.load(model)
    assert back.version == "v1" and back.predict(test, top_k=2) == first
    assert torch.equal(scores(back, test), first_scores)
    assert [(v.name, v.current) for v in versions(model)] == [("v1", True), ("v2", False)]
    # learning from the rolled-back version makes v3, a child of v1; v2 stays loadable
    back.learn(*colour_set(NAMES[3:4], 5))
    assert back.save(model) == "v3"
    assert [(v.name, v.parent) for v in versions(model)] == [("v1", None), ("v2", "v1"),
                                                             ("v3", "v1")]
    assert Learner.load(model, "v2").classes == ["red", "green", "blue"]
    assert Learner.load(model).classes == ["red", "green", "yellow"]
    rollback(model, 2)
    assert current_version(model) == "v2"
    with pytest.raises(BundleError, match="has no version v5"):
        rollback(model, "v5")
    with pytest.raises(BundleError, match="not a version name"):
        rollback(model, "latest")


@needs_transformers
def test_writers_from_a_stale_version_and_other_models_are_refused(tmp_path):
    model = tmp_path / "model"
    saved(model, NAMES[:2], 4)
    a, b = Learner.load(model), Learner.load(model)
    b.forget("red")
    b.save(model)
    a.learn(*colour_set(NAMES[2:3], 4))
    with pytest.raises(BundleError, match="version v2 is current now, not v1, which this model "
                                          "was read from"):
        a.save(model)
    assert [v.name for v in versions(model)] == ["v1", "v2"]
    other = tiny_learner()
    other.learn(*colour_set(NAMES[3:4], 4))
    with pytest.raises(BundleError, match="already holds a model .version v2.; continue it"):
        other.save(model)
    assert other.save(model, force=True) == "v3"
    assert Learner.load(model).classes == ["yellow"]


@needs_transformers
def test_unchanged_files_are_linked_between_versions(tmp_path, trained_bundle):
    model = tmp_path / "model"
    shutil.copytree(trained_bundle, model)
    learner = Learner.load(model)
    learner.forget("green")  # the backbone, the strategy state and red's statistics stay
    learner.save(model)
    v2, v3 = model / "versions" / "v2", model / "versions" / "v3"
    for name in ("backbone.safetensors", "strategy.safetensors", "statistics/0.safetensors"):
        assert os.path.samefile(v2 / name, v3 / name)
    assert not (v3 / "statistics" / "1.safetensors").exists()
    assert not os.path.samefile(v2 / "learner.json", v3 / "learner.json")
    # a frozen model: learning new classes writes only theirs (and updated ones)
    saved(tmp_path / "frozen", NAMES[:3], 4)
    frozen = Learner.load(tmp_path / "frozen")
    frozen.learn(*colour_set(["blue", "yellow"], 4))
    frozen.save(tmp_path / "frozen")
    a, b = (tmp_path / "frozen" / "versions" / v / "statistics" for v in ("v1", "v2"))
    assert [os.path.samefile(a / f"{c}.safetensors", b / f"{c}.safetensors")
            for c in range(3)] == [True, True, False]


@needs_transformers
def test_a_writer_that_fails_midway_leaves_no_version(tmp_path):
    model = tmp_path / "model"
    learner = saved(model, NAMES[:2], 3)

    def crash(writer):
        writer.write_bytes("learner.json", b"{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_version(model, crash)
    assert os.listdir(model / "versions") == ["v1"] and current_version(model) == "v1"
    (model / "versions" / ".v2.dead.tmp").mkdir()  # what a writer killed with -9 leaves
    learner.forget("red")
    assert learner.save(model) == "v2"
    assert sorted(os.listdir(model / "versions")) == ["v1", "v2"]


@needs_transformers
def test_readers_never_see_a_half_written_model(tmp_path):
    """A thread loads and predicts in a loop while the main thread learns and saves versions
    (threads interleave at least every few milliseconds, file reads and writes included)."""
    model = tmp_path / "model"
    inputs = sorted(str(p) for p in image_folder(tmp_path / "inputs", NAMES, 1, seed=9)
                    .rglob("*.png"))
    learner = saved(model, NAMES[:1], 4)
    expected = {"v1": list(learner.classes)}
    records, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                reader = Learner.load(model)
                labels = [p.label for p in reader.predict(inputs)]
                records.append((reader.version, reader.classes, labels))
            except Exception as exc:  # every failure is a finding
                records.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        for name in NAMES[1:]:
            while len(records) < len(expected):  # at least one read per version
                time.sleep(0.01)
            learner.learn(*colour_set([name], 4))
            expected[learner.save(model)] = list(learner.classes)
        while len(records) < len(expected) + 1:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=60)
    failures = [r for r in records if isinstance(r, Exception)]
    assert not failures, failures
    assert len({version for version, _, _ in records}) >= 3
    for version, classes, labels in records:
        assert classes == expected[version]
        assert set(labels) <= set(classes)


# ---------------------------------------------------------------------- the committed fixture
@needs_transformers
def test_the_committed_bundle_of_format_1_still_loads_and_predicts(tmp_path):
    expected = json.loads((FIXTURE / "expected.json").read_text())
    inputs = sorted((FIXTURE / "inputs").glob("*.png"))
    model = tmp_path / "model"
    shutil.copytree(FIXTURE / "model", model)  # the committed copy is never written to
    assert [(v.name, v.current) for v in versions(model)] == [("v1", False), ("v2", True)]
    for version in ("v2", "v1"):
        predictions = Learner.load(model, version).predict(inputs, top_k=2)
        got = [p.to_list() for p in predictions]
        for mine, recorded in zip(got, expected[version]):
            assert [x["class"] for x in mine] == [x["class"] for x in recorded]
            np.testing.assert_allclose([x["score"] for x in mine],
                                       [x["score"] for x in recorded], rtol=1e-5)
            np.testing.assert_allclose([x["probability"] for x in mine],
                                       [x["probability"] for x in recorded], atol=1e-4)
    learner = Learner.load(model)
    assert learner.classes == ["red", "green", "blue", "yellow"]
    assert learner.class_counts()["red"] == 10 and len(learner._reservoir) == 4
    # a model of format 1 keeps learning (its strategy, anchors and compensator included)
    report = learner.learn(colour_images("purple", 4, seed=3), ["purple"] * 4)
    assert report.compensated
    assert learner.save(model) == "v3"
    assert Learner.load(model).predict(inputs[:1])[0].label == "red"
