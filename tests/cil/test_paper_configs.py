"""Every shipped ``paper-*`` config, end to end, on format-faithful miniatures of its data.

Each config is loaded as shipped with :func:`gdacil.cil.load_config` and changed only where a
miniature needs it (``--set`` overrides): the data roots (``protocol.dataset_options.<name>.root``),
a tiny randomly initialised ``transformers`` ViT in place of ViT-B/16, one seed, two Stage-1
steps, a short SGD head, and the output and cache folders. Strategy, compensator tracks, heads,
anchors and the protocol (initial, increment, cross-domain halves, caps, split seed) stay as
shipped; the miniatures have just enough classes for two tasks (the cross-domain union: two per
dataset, 14). The data are written by :mod:`_paper_fixtures` in the published layouts (and the
reference code's ``train/<class>``, ``test/<class>`` folders) and read by the real loaders.
"""

from __future__ import annotations

import itertools
import json
import math
import pickle
import pickletools
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from gdacil.cil import ConfigError, load_config, run_experiment
from gdacil.cil.runner import build_feature_backbone
from gdacil.cli import main, shipped_configs
from gdacil.data import CROSS_DOMAIN_DATASETS, DataNotFoundError, build_dataset, read_cifar_pickle
from gdacil.heads import LDA, LRRGDA

from _assets import TINY_VIT, needs_transformers
from _paper_fixtures import (
    CIFAR100_COARSE,
    CIFAR100_FINE,
    caltech101_classes,
    cars_classes,
    cub_classes,
    food101_classes,
    imagenet_r_classes,
    write_caltech101,
    write_cars196_devkit,
    write_cifar100,
    write_cub200,
    write_flowers102,
    write_food101,
    write_imagenet_r,
    write_split_folders,
)

SEED = 1993
PAPER_CONFIGS = sorted(n for n in shipped_configs() if n.startswith("paper-"))


def _within(name: str, classes):
    """A within-domain miniature in the reference code's train/<class>, test/<class> layout."""
    return {name: lambda d: write_split_folders(d / name, classes, n_train=2, n_test=1)}


#: config -> {dataset: writer(folder) -> root}; class counts give each within-domain config
#: exactly two tasks at its shipped initial / increment (10 + 10, or 20 + 20).
MINIATURES = {
    "paper-cifar100": {"cifar100": lambda d: write_cifar100(d / "cifar100", n_classes=20)},
    # imagenet-r.tar as published: no split, so the config's test_fraction (80/20) applies
    "paper-imagenet-r": {"imagenet-r": lambda d: write_imagenet_r(d, n_classes=40, per_class=5)},
    "paper-cub200": _within("cub200", cub_classes(40)),
    "paper-cars196": _within("cars196", cars_classes(40)),
    # the seven published layouts (CUB, Food-101, Flowers-102 and Cars with their split files)
    "paper-cross-domain": {
        "cifar100": lambda d: write_cifar100(d / "cifar100", n_classes=4, seed=1),
        "imagenet-r": lambda d: write_imagenet_r(d / "imagenet-r", n_classes=4, per_class=3,
                                                      seed=2),
        "cars196": lambda d: write_cars196_devkit(d / "cars196", n_classes=4, seed=3),
        "cub200": lambda d: write_cub200(d / "cub200", n_classes=5, seed=4),
        "caltech101": lambda d: write_caltech101(d / "caltech101", n_classes=4, per_class=3,
                                                      seed=5),
        "flowers102": lambda d: write_flowers102(d / "flowers102", n_classes=4, seed=6),
        "food101": lambda d: write_food101(d / "food101", n_classes=4, seed=7),
    },
}


#: External anchors of the miniatures: a miniature ImageNet (one folder per class), 8 drawn
ANCHORS_N = 8


def _miniature_overrides(tmp_path: Path, roots: dict[str, Path]) -> list[str]:
    imagenet = write_imagenet_r(tmp_path / "imagenet", n_classes=3, per_class=4, seed=9)
    return [
        f"anchors.dataset_options.root={imagenet}",
        f"anchors.n={ANCHORS_N}",
        f"seeds=[{SEED}]",
        f"backbone.options.config={json.dumps(TINY_VIT)}",
        "strategy.train.steps=2",
        "strategy.train.batch_size=4",
        "heads.sgd.base_steps=20",
        "heads.sgd.samples_per_class=16",
        f"output_dir={tmp_path / 'run'}",
        f"cache_dir={tmp_path / 'cache'}",
        "progress=false",
        *(f"protocol.dataset_options.{name}.root={root}" for name, root in roots.items()),
    ]


def _expected_classes(protocol: dict, datasets: dict) -> list[list[str]]:
    """Per task, the global class names the documented rule gives: within-domain
    ``RandomState(seed).permutation`` cut at initial / increment; cross-domain every dataset's
    ``RandomState(split_seed + index).permutation`` in two halves (the first takes the odd one)."""
    if not protocol.get("cross_domain"):
        (name,) = protocol["datasets"]
        classes = datasets[name].classes
        order = [f"{name}:{classes[i]}" for i in np.random.RandomState(SEED).permutation(len(classes))]
        first, step = protocol.get("initial") or protocol["increment"], protocol["increment"]
        cuts = [0, first, *range(first + step, len(order) + step, step)]
        return [order[a:b] for a, b in itertools.pairwise(cuts) if order[a:b]]
    tasks = []
    for i, name in enumerate(protocol["datasets"]):
        classes = datasets[name].classes
        perm = np.random.RandomState(protocol.get("split_seed", 42) + i).permutation(len(classes))
        names = [f"{name}:{classes[c]}" for c in perm]
        half = (len(names) + 1) // 2
        tasks += [names[:half], names[half:]]
    return tasks


def _shipped(name: str) -> dict:
    return yaml.safe_load(shipped_configs()[name].read_text())


def test_every_paper_config_has_a_miniature():
    assert sorted(MINIATURES) == PAPER_CONFIGS
    for name in PAPER_CONFIGS:
        assert set(_shipped(name)["protocol"]["datasets"]) == set(MINIATURES[name]), name


@needs_transformers
@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_config_runs_end_to_end_on_a_miniature(name, tmp_path):
    roots = {ds: write(tmp_path / "data") for ds, write in MINIATURES[name].items()}
    cfg = load_config(shipped_configs()[name], _miniature_overrides(tmp_path, roots))
    shipped = _shipped(name)

    # only what a miniature needs differs from the shipped config
    assert cfg.name == shipped["name"] and cfg.seeds == [SEED]
    protocol = cfg.protocol.to_dict()
    assert {k: protocol[k] for k in shipped["protocol"]} == shipped["protocol"]
    assert protocol["dataset_options"] == {n: {"root": str(r)} for n, r in roots.items()}
    assert cfg.backbone.name == shipped["backbone"]["name"] == "vit"
    assert cfg.backbone.options == {**shipped["backbone"]["options"], "config": TINY_VIT}
    assert cfg.strategy.to_dict() == {**shipped["strategy"], "train": {"steps": 2, "batch_size": 4}}
    assert {k: c.to_dict() for k, c in cfg.compensators.items()} == shipped["compensators"]
    assert cfg.anchors.dataset == shipped["anchors"]["dataset"] == "imagenet"
    assert shipped["anchors"]["n"] == 1024 and cfg.anchors.n == ANCHORS_N
    assert cfg.anchors.include_current == shipped["anchors"]["include_current"]
    assert {k: {**h.params, "defaults": h.defaults} for k, h in cfg.heads.items()
            if k != "sgd"} == {k: v for k, v in shipped["heads"].items() if k != "sgd"}
    # the paper's heads: absolute identity terms, the paper's alphas
    assert repr(cfg.heads["lr_rgda"].build()) == repr(LRRGDA.paper(rank=64))
    assert repr(cfg.heads["lda"].build()) == repr(LDA.paper())

    backbone = build_feature_backbone(cfg)  # ViT-B/16's class, tiny and randomly initialised
    assert type(backbone.model).__name__ == "ViTModel" and backbone.final_norm == "nonaffine_ln"
    assert backbone.config()["source"] is None and backbone.dim == TINY_VIT["hidden_size"]

    with warnings.catch_warnings():  # miniatures have fewer classes and anchors than the paper
        warnings.filterwarnings("ignore", message=r".*: found \d+ classes under")
        warnings.filterwarnings("ignore", message=r"topk=\d+ exceeds the number of anchors")
        datasets = {n: build_dataset(n, root=r) for n, r in roots.items()}
        results = run_experiment(cfg, log=lambda *_: None)

    out = tmp_path / "run"
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["seeds"] == json.loads(json.dumps(results["seeds"]))
    labels = {f"{track}/{head}" for track in shipped["compensators"] for head in shipped["heads"]}
    assert set(on_disk["seeds"][str(SEED)]) == labels == set(on_disk["summary"])

    # the manifest records the documented class order, task by task
    expected = _expected_classes(shipped["protocol"], datasets)
    n_tasks = len(expected)
    assert n_tasks == (14 if shipped["protocol"].get("cross_domain") else 2)
    manifest = json.loads((out / f"seed_{SEED}" / "manifest.json").read_text())
    assert manifest["classes"] == [c for task in expected for c in task]
    assert [len(t["classes"]) for t in manifest["tasks"]] == [len(t) for t in expected]
    assert [d["name"] for d in manifest["datasets"]] == list(shipped["protocol"]["datasets"])
    for t in manifest["tasks"]:
        assert set(t["train"]["ids"]).isdisjoint(t["test"]["ids"])
        for split in ("train", "test"):  # every class of the task has samples of both splits
            assert set(t[split]["labels"]) == set(t["classes"])
    if name == "paper-imagenet-r":  # 5 images a class, split 80/20
        assert all(np.bincount(t["test"]["labels"]).max() == 1 for t in manifest["tasks"])
        assert len(manifest["tasks"][0]["train"]["ids"]) == 4 * 20

    # every track and head evaluated after every task, with accuracies in [0, 1]
    for label, m in on_disk["seeds"][str(SEED)].items():
        matrix = m["accuracy_matrix"]
        assert len(matrix) == n_tasks, label
        for t, row in enumerate(matrix):
            seen = row[: t + 1]
            assert all(math.isfinite(a) and 0.0 <= a <= 1.0 for a in seen), (label, row)
            assert all(a is None for a in row[t + 1:]), (label, row)
        for key in ("last_acc", "inc_acc"):
            assert math.isfinite(m[key]) and 0.0 <= m[key] <= 1.0, (label, key)
    # tints are easy to tell apart: a broken pipeline (labels, features, statistics) shows here
    assert on_disk["seeds"][str(SEED)]["none/lda"]["last_acc"] > 0.5

    state = json.loads((out / f"seed_{SEED}" / "state.json").read_text())
    assert state["completed"] == n_tasks
    timings = json.loads((out / "timings.json").read_text())[str(SEED)]
    assert len(timings) == n_tasks
    for t, timing in enumerate(timings):  # SeqFT trained the backbone on every task
        assert timing["adapt"]["strategy"] == "seqft" and timing["adapt"]["steps"] == 2
        assert timing["adapt"]["classes"] == len(expected[t])
        assert math.isfinite(timing["adapt"]["final_loss"])
        if t > 0:  # every compensating track fitted on the anchors
            tracks = {k for k, v in shipped["compensators"].items() if v["name"] != "identity"}
            assert set(timing["compensate_s"]) == tracks


# ---------------------------------------------------------------- overrides and messages


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_a_root_without_a_dataset_name_says_what_to_write(name):
    datasets = _shipped(name)["protocol"]["datasets"]
    with pytest.raises(ConfigError) as err:
        load_config(shipped_configs()[name], ["protocol.dataset_options.root=/data"])
    message = str(err.value)
    assert f"--set protocol.dataset_options.{datasets[0]}.root=PATH" in message
    assert all(d in message for d in datasets)
    with pytest.raises(ConfigError, match=rf"dataset_options.{datasets[0]}.root=PATH"):
        load_config(shipped_configs()[name], [f"protocol.dataset_options.{datasets[0]}=/data"])


@needs_transformers
def test_cli_check_finds_every_miniature_through_set_overrides(tmp_path, capsys):
    """``gdacil run paper-cross-domain --check --set protocol.dataset_options.<name>.root=...``
    finds all seven datasets in their published layouts (and the tiny model)."""
    roots = {ds: write(tmp_path / "data") for ds, write in MINIATURES["paper-cross-domain"].items()}
    sets = [a for o in _miniature_overrides(tmp_path, roots) for a in ("--set", o)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*: found \d+ classes under")
        assert main(["run", "paper-cross-domain", "--check", *sets]) == 0
    assert "its data and model are here" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", CROSS_DOMAIN_DATASETS)
def test_missing_data_names_the_override_to_set(name, tmp_path):
    with pytest.raises(DataNotFoundError, match=rf"protocol\.dataset_options\.{name}\.root=PATH"):
        build_dataset(name, root=tmp_path / "missing")


def test_every_dataset_found_in_its_unpacked_archive_under_gdacil_data(tmp_path, monkeypatch):
    """With ``$GDACIL_DATA/<name>/`` holding each archive as it unpacks, no root is needed."""
    for write in MINIATURES["paper-cross-domain"].values():
        write(tmp_path)
    monkeypatch.setenv("GDACIL_DATA", str(tmp_path))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*: found \d+ classes under")
        found = {n: build_dataset(n) for n in CROSS_DOMAIN_DATASETS}
    assert {n: len(d.classes) for n, d in found.items()} == {
        "cifar100": 4, "imagenet-r": 4, "cars196": 4, "cub200": 5, "caltech101": 4,
        "flowers102": 4, "food101": 4}
    assert found["cub200"].root == tmp_path / "cub200" / "CUB_200_2011"
    assert found["food101"].root == tmp_path / "food101" / "food-101"
    assert found["imagenet-r"].root == tmp_path / "imagenet-r" / "imagenet-r"
    assert found["caltech101"].root == tmp_path / "caltech101" / "101_ObjectCategories"


# ---------------------------------------------------------------- the formats themselves


def test_cifar100_miniature_is_written_as_the_published_python2_pickles(tmp_path):
    folder = write_cifar100(tmp_path, n_classes=20, n_train=2, n_test=1) / "cifar-100-python"
    for split, n, batch in (("train", 40, b"training batch 1 of 1"),
                            ("test", 20, b"testing batch 1 of 1")):
        blob = (folder / split).read_bytes()
        assert blob[:2] == b"\x80\x02"  # protocol 2
        ops = list(pickletools.genops(blob))
        assert {a for op, a, _ in ops if op.name == "GLOBAL"} == {
            "numpy.core.multiarray _reconstruct", "numpy ndarray", "numpy dtype"}
        assert not any(op.name in ("BINUNICODE", "SHORT_BINBYTES", "BINBYTES") for op, _, _ in ops)
        raw = read_cifar_pickle(folder / split)  # the restricted reader accepts it
        assert sorted(raw) == ["batch_label", "coarse_labels", "data", "filenames", "fine_labels"]
        assert raw["data"].dtype == np.uint8 and raw["data"].shape == (n, 3072)
        assert raw["batch_label"] == batch
        assert all(type(v) is int for v in raw["fine_labels"] + raw["coarse_labels"])
        assert all(isinstance(f, bytes) and f.endswith(b".png") for f in raw["filenames"])
        assert sorted(np.bincount(raw["fine_labels"]).tolist()) == [n // 20] * 20
        plain = pickle.loads(blob, encoding="latin1")  # how torchvision reads the real files
        np.testing.assert_array_equal(plain["data"], raw["data"])
        assert plain["fine_labels"] == raw["fine_labels"]
    meta = read_cifar_pickle(folder / "meta")
    assert [n.decode() for n in meta["fine_label_names"]] == CIFAR100_FINE[:20]
    assert [n.decode() for n in meta["coarse_label_names"]] == CIFAR100_COARSE
    assert len(CIFAR100_FINE) == 100 and len(CIFAR100_COARSE) == 20
    ds = build_dataset("cifar100", root=tmp_path)
    pixels = read_cifar_pickle(folder / "train")["data"][3].reshape(3, 32, 32).transpose(1, 2, 0)
    np.testing.assert_array_equal(np.asarray(ds.load(["train/00003"])[0]), pixels)


def test_cub200_published_layout_keeps_the_official_split(tmp_path):
    folder = write_cub200(tmp_path, n_classes=3, n_train=3, n_test=2)
    for root in (folder, tmp_path):  # CUB_200_2011/ itself, or the folder it was unpacked in
        with pytest.warns(UserWarning, match="found 3 classes"):
            ds = build_dataset("cub200", root=root)
        assert ds.root == folder and ds.splits == ("train", "test")
        assert ds.classes == tuple(cub_classes(3))  # not attributes/, images/, parts/
        flags = dict(line.split() for line in (folder / "train_test_split.txt").read_text()
                     .splitlines())
        paths = dict(line.split() for line in (folder / "images.txt").read_text().splitlines())
        for split, flag in (("train", "1"), ("test", "0")):
            assert ds.index(split).ids == tuple(
                sorted(f"images/{paths[i]}" for i in paths if flags[i] == flag))
            assert np.bincount(ds.index(split).labels).tolist() == [3 if flag == "1" else 2] * 3
    lines = (folder / "train_test_split.txt").read_text().splitlines()
    (folder / "train_test_split.txt").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(ValueError, match="does not assign 1 images"):
        build_dataset("cub200", root=folder)


def test_food101_published_layout_keeps_the_official_split(tmp_path):
    folder = write_food101(tmp_path, n_classes=3, n_train=2, n_test=1)
    with pytest.warns(UserWarning, match="found 3 classes"):
        ds = build_dataset("food101", root=tmp_path)
    assert ds.root == folder and ds.classes == tuple(food101_classes(3))
    listed = (folder / "meta" / "test.txt").read_text().split()
    assert ds.index("test").ids == tuple(sorted(f"images/{r}.jpg" for r in listed))
    assert np.bincount(ds.index("train").labels).tolist() == [2, 2, 2]
    (folder / "meta" / "test.txt").write_text("apple_pie/999\n")
    with pytest.raises(DataNotFoundError, match="images/apple_pie/999.jpg"):
        build_dataset("food101", root=folder)


def test_flowers102_published_layout_trains_on_train_and_val(tmp_path):
    pytest.importorskip("scipy")
    write_flowers102(tmp_path, n_classes=3, n_train=1, n_val=2, n_test=4)
    with pytest.warns(UserWarning, match="found 3 classes"):
        ds = build_dataset("flowers102", root=tmp_path)
    assert ds.classes == ("001", "002", "003") and ds.splits == ("train", "test")
    assert np.bincount(ds.index("train").labels).tolist() == [3, 3, 3]
    assert np.bincount(ds.index("test").labels).tolist() == [4, 4, 4]
    assert all(i.startswith("jpg/image_") for i in ds.index("test").ids)
    assert ds.load(ds.index("test").ids[:1])[0].mode == "RGB"


def test_cars196_devkit_layout_reads_the_annotations(tmp_path):
    pytest.importorskip("scipy")
    write_cars196_devkit(tmp_path, n_classes=4, n_train=2, n_test=1)
    with pytest.warns(UserWarning, match="found 4 classes"):
        ds = build_dataset("cars196", root=tmp_path)
    assert ds.classes == tuple(sorted(cars_classes(4, devkit=True)))
    assert "Ram C/V Cargo Van Minivan 2012" in ds.classes
    assert np.bincount(ds.index("train").labels).tolist() == [2, 2, 2, 2]
    assert ds.index("test").ids[0] == "cars_test/00001.jpg"
    (tmp_path / "cars_test_annos_withlabels.mat").rename(
        tmp_path / "devkit" / "cars_test_annos_withlabels.mat")
    with pytest.warns(UserWarning, match="found 4 classes"):
        assert build_dataset("cars196", root=tmp_path).index("test").ids == ds.index("test").ids
    (tmp_path / "devkit" / "cars_test_annos_withlabels.mat").unlink()
    with pytest.raises(DataNotFoundError, match="cars_test_annos_withlabels.mat"):
        build_dataset("cars196", root=tmp_path)


def test_flat_published_layouts_have_no_official_split(tmp_path):
    inr = write_imagenet_r(tmp_path / "a", n_classes=3, per_class=2)
    cal = write_caltech101(tmp_path / "b", n_classes=3, per_class=2)
    with pytest.warns(UserWarning):
        assert build_dataset("imagenet-r", root=inr).classes == tuple(imagenet_r_classes(3))
    with pytest.warns(UserWarning):
        ds = build_dataset("caltech101", root=tmp_path / "b")
    assert ds.root == cal and ds.splits == ("all",)
    assert ds.classes == tuple(sorted(caltech101_classes(3)))
