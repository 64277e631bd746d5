"""Anchors drawn from a dataset outside the protocol, as the paper's 1024 ImageNet images."""

import numpy as np
import pytest
from PIL import Image

from gdacil.cil import run_experiment
from gdacil.cil.config import ConfigError
from gdacil.cil.runner import _SeedRun
from gdacil.data import ExternalAnchors, build_dataset

from _assets import TINY_VIT, needs_transformers, needs_wordnet
from test_runner import TRACKS, TRAIN_TINY, color_folder, vit_config


def class_folders(root, n_classes=3, per_class=4, seed=5):
    """ImageNet-R's published layout: one folder of images per class, no split."""
    rng = np.random.default_rng(seed)
    for c in range(n_classes):
        (root / f"n0{c}").mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"n0{c}" / f"{i}.png")
    return root


pytestmark = pytest.mark.filterwarnings("ignore:imagenet-r. found 3 classes")


def external(tmp_path, n=6, **extra):
    return {"dataset": "imagenet-r", "dataset_options": {"root": str(tmp_path / "anchors")},
            "n": n, "seed": 1, "include_current": True, **extra}


def test_external_anchors_are_drawn_with_their_seed_and_loaded(tmp_path):
    dataset = build_dataset("imagenet-r", root=class_folders(tmp_path / "anchors"))
    a = ExternalAnchors(dataset, 5, seed=1)
    assert a.ids == ExternalAnchors(dataset, 5, seed=1).ids != ExternalAnchors(dataset, 5, seed=2).ids
    assert len(set(a.ids)) == 5 and all(i.startswith("external/imagenet-r:") for i in a.ids)
    images = a.load(list(a.ids))
    assert len(images) == 5 and all(isinstance(im, Image.Image) for im in images)
    with pytest.raises(ValueError, match="holds 12 samples; ask for fewer"):
        ExternalAnchors(dataset, 13)
    with pytest.raises(ValueError, match="not anchors of 'imagenet-r'"):
        a.load(["image-folder:train/class0/0.png"])


@needs_transformers
def test_a_run_fits_its_compensators_on_the_external_anchors(tmp_path):
    color_folder(tmp_path / "images")
    class_folders(tmp_path / "anchors")
    cfg = vit_config(tmp_path, out="ext", strategy=TRAIN_TINY, compensators=TRACKS,
                     anchors=external(tmp_path), drift_diagnostics=True)
    run = _SeedRun(cfg, 3, tmp_path / "probe", lambda *_: None)
    assert len(run.anchor_pool) == 6 and all(ExternalAnchors.owns(i) for i in run.anchor_pool)
    ids = [*run.anchor_pool[:2], *run.tasks[0].train.ids[:2]]  # one call, both sources
    mixed = run.features(ids)
    assert mixed.shape == (4, run.backbone.dim)
    assert (run.features(list(run.anchor_pool[:2])) == mixed[:2]).all()
    assert (run.features(list(run.tasks[0].train.ids[:2])) == mixed[2:]).all()

    with_external = run_experiment(cfg, log=lambda *_: None)
    current_only = run_experiment(
        vit_config(tmp_path, out="cur", strategy=TRAIN_TINY, compensators=TRACKS,
                   anchors={"n": 0, "include_current": True}, drift_diagnostics=True),
        log=lambda *_: None)
    # one backbone trajectory: the uncompensated track cannot depend on the anchors
    assert with_external["seeds"]["3"]["none/ncm"] == current_only["seeds"]["3"]["none/ncm"]
    # the compensators fitted on different anchors moved the statistics differently
    moved = [d["hopdc"]["mean_error"] for d in with_external["drift_diagnostics"]["3"]]
    baseline = [d["hopdc"]["mean_error"] for d in current_only["drift_diagnostics"]["3"]]
    assert len(moved) == 2 and moved != baseline


def test_external_anchor_settings_are_checked_with_the_config(tmp_path):
    with pytest.raises(ConfigError, match="'image-folder' is one of the protocol's datasets"):
        vit_config(tmp_path, anchors={"dataset": "image-folder"})
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet-1k'; known: "):
        vit_config(tmp_path, anchors={"dataset": "imagenet-1k"})
    with pytest.raises(ConfigError, match="does not apply to an external anchors.dataset"):
        vit_config(tmp_path, anchors=external(tmp_path, pool="both"))
    with pytest.raises(ConfigError, match="set anchors.dataset too"):
        vit_config(tmp_path, anchors={"splits": ["train"]})


@needs_transformers
def test_missing_anchor_data_names_the_anchors_setting(tmp_path, capsys):
    from gdacil.cli import main

    color_folder(tmp_path / "images")
    cfg_path = tmp_path / "exp.yaml"
    cfg_path.write_text(f"""
name: anchors-check
protocol: {{datasets: [image-folder], initial: 2, increment: 1,
           dataset_options: {{image-folder: {{root: {tmp_path / 'images'}}}}}}}
backbone: {{name: vit, options: {{config: {TINY_VIT}}}}}
strategy: {{name: seqft}}
compensators: {{none: {{name: identity}}, hopdc: {{name: hopdc}}}}
anchors: {{dataset: imagenet, dataset_options: {{root: {tmp_path / 'no-imagenet'}}}, n: 8}}
""")
    assert main(["run", str(cfg_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "gdacil: missing: anchors: imagenet not found" in err
    assert "--set anchors.dataset_options.root=PATH" in err and "protocol.dataset_options" not in err


@needs_wordnet
@needs_transformers
def test_anchors_of_another_modality_are_refused_before_any_work(tmp_path):
    color_folder(tmp_path / "images")
    cfg = vit_config(tmp_path, strategy=TRAIN_TINY, compensators=TRACKS,
                     anchors={"dataset": "wordnet-supersense", "n": 4})
    with pytest.raises(ValueError, match="holds text samples but the protocol's are image"):
        run_experiment(cfg, log=lambda *_: None)
