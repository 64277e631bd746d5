"""Datasets, protocols, manifests and anchors."""

from __future__ import annotations

import gzip
import json
import pickle
import warnings

import numpy as np
import pytest

from gdacil.data import (
    CIFAR100,
    DATASETS,
    DataNotFoundError,
    FashionMNIST,
    ImageFolder,
    ManifestMismatchError,
    Protocol,
    anchor_pool,
    build_dataset,
    draw_anchors,
    read_cifar_pickle,
)
from gdacil.data.fashion_mnist import read_idx
from gdacil.data.wordnet import read_wordnet

from _assets import needs_fashion_mnist, needs_openclipart, needs_wordnet


def _png(path, value=0, size=(6, 5)):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*size, 3), value, np.uint8)).save(path)


def _folder(root, counts: dict[str, int]):
    for cls, n in counts.items():
        for i in range(n):
            _png(root / cls / f"img{i:03d}.png", value=i)
    return root


# ---------------------------------------------------------------- registry and missing files


def test_dataset_registry_and_unknown_name():
    assert {
        "fashion-mnist",
        "wordnet-hypernym",
        "wordnet-supersense",
        "openclipart",
        "cifar100",
        "imagenet-r",
        "cub200",
        "cars196",
        "caltech101",
        "flowers102",
        "food101",
        "image-folder",
    } <= set(DATASETS)
    with pytest.raises(KeyError, match="unknown dataset 'mnist'; known: banking77"):
        build_dataset("mnist")


def test_missing_data_errors_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(DataNotFoundError, match="apt-get install -y dataset-fashion-mnist"):
        FashionMNIST(root=tmp_path).index("train")
    with pytest.raises(DataNotFoundError, match=str(tmp_path / "c")):
        CIFAR100(root=tmp_path / "c")
    with pytest.raises(DataNotFoundError, match="apt-get install -y wordnet-base"):
        read_wordnet(tmp_path)
    with pytest.raises(DataNotFoundError, match=r"ImageNet-R .*train/<class>/<image>"):
        build_dataset("imagenet-r", root=tmp_path / "inr")
    with pytest.raises(DataNotFoundError, match="openclipart-png"):
        build_dataset("openclipart", root=tmp_path / "oc")


# ---------------------------------------------------------------- Fashion-MNIST


def test_read_idx_on_generated_files(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    header = b"\x00\x00\x08\x03" + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    (tmp_path / "x.gz").write_bytes(gzip.compress(header + arr.tobytes()))
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), arr)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + (3).to_bytes(4, "big") + bytes(12))
    with pytest.raises(ValueError, match="unsigned bytes"):
        read_idx(tmp_path / "bad")


@needs_fashion_mnist
def test_fashion_mnist_index_and_load():
    ds = build_dataset("fashion-mnist")
    train, test = ds.index("train"), ds.index("test")
    assert (len(train), len(test)) == (60000, 10000) and len(ds.classes) == 10
    assert np.bincount(test.labels).tolist() == [1000] * 10
    img = ds.load([test.ids[0]])[0]
    assert img.size == (28, 28) and img.mode == "L"
    with pytest.raises(KeyError, match="not a fashion-mnist sample id"):
        ds.load(["val/00001"])
    with pytest.raises(ValueError, match="splits train, test"):
        ds.index("all")


# ---------------------------------------------------------------- WordNet


def test_wordnet_parser_on_a_tiny_database(tmp_path):
    lines = {
        "noun": [
            "  1 header line",
            "00000001 03 n 01 thing 0 000 | a thing",
            "00000002 03 n 02 animal 0 beast 0 001 @ 00000001 n 0000 | a living being",
            (
                "00000003 05 n 0a dog 0 a 0 b 0 c 0 d 0 e 0 f 0 g 0 h 0 i 0 001 @ 00000002 n 0000"
                " | a barking animal"
            ),
            "00000004 18 n 01 Rex 0 001 @i 00000003 n 0000 | a particular dog",
        ],
        "verb": ["00000001 30 v 01 bark 0 000 00 | make a barking sound"],
        "adj": [],
        "adv": [],
    }
    for pos, ls in lines.items():
        (tmp_path / f"data.{pos}").write_text("\n".join(ls) + "\n")
    wn = read_wordnet(tmp_path)
    assert set(wn.synsets) == {"n:00000001", "n:00000002", "n:00000003", "n:00000004", "v:00000001"}
    assert wn.synsets["n:00000003"].words[-1] == "i"  # w_cnt is hexadecimal
    assert wn.parents["n:00000004"] == ("n:00000003",)  # instance hypernym
    assert wn.descendants["n:00000001"] == {"n:00000002", "n:00000003", "n:00000004"}
    assert wn.synsets["v:00000001"].gloss == "make a barking sound"
    ds = build_dataset("wordnet-hypernym", root=tmp_path, n_classes=None, min_size=1, max_size=2)
    assert ds.classes == ("dog.n.00000003",)
    assert ds.index("all").ids == ("n:00000004",)
    assert set(ds.unlabelled()) == {"n:00000001", "n:00000002", "v:00000001"}


@needs_wordnet
def test_wordnet_hypernym_classes_are_disjoint_subtrees():
    everything = build_dataset("wordnet-hypernym", n_classes=None)
    assert len(everything.classes) == 131
    ds = build_dataset("wordnet-hypernym")
    assert len(ds.classes) == 100
    idx = ds.index("all")
    assert len(set(idx.ids)) == len(idx.ids)  # every synset in at most one class
    counts = np.bincount(idx.labels)
    assert counts.min() >= 150 and counts.max() <= 1500
    wn = ds.wordnet
    roots = {name.rsplit(".", 2)[1][0] + ":" + name.rsplit(".", 1)[1] for name in ds.classes}
    assert roots.isdisjoint(idx.ids) and roots.isdisjoint(ds.unlabelled())
    members = set(idx.ids)
    for root in roots:
        assert wn.descendants[root] <= members
    assert members.isdisjoint(ds.unlabelled())
    assert len(members) + len(ds.unlabelled()) + len(roots) == len(wn.synsets)
    text = ds.load(idx.ids[:1])[0]
    assert isinstance(text, str) and text and "|" not in text


@needs_wordnet
def test_wordnet_supersenses():
    ds = build_dataset("wordnet-supersense")
    assert len(ds.classes) == 40 and "noun.animal" in ds.classes and "noun.Tops" not in ds.classes
    assert np.bincount(ds.index("all").labels).min() >= 300
    assert len(ds.index("all")) + len(ds.unlabelled()) == 117659


# ---------------------------------------------------------------- openclipart


@needs_openclipart
def test_openclipart_classes():
    ds = build_dataset("openclipart")
    idx = ds.index("all")
    assert len(ds.classes) == 43 and 2300 < len(idx) < 2500
    assert np.bincount(idx.labels).min() >= 20
    assert not any(set(c.split("/")) & {"icons", "shapes", "flags", "unsorted"} for c in ds.classes)
    assert set(idx.ids).isdisjoint(ds.unlabelled())
    assert list(ds.classes) == sorted(ds.classes)
    assert list(idx.ids) == sorted(idx.ids, key=lambda i: (i.rsplit("/", 1)[0], i))
    assert not any((ds.root / i).is_symlink() for i in idx.ids[::50])
    img = ds.load([idx.ids[0]])[0]
    assert max(img.size) <= 512


# ---------------------------------------------------------------- CIFAR-100 pickles


def _cifar_files(root, n_train=6, n_test=4, n_classes=3):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    for split, n in (("train", n_train), ("test", n_test)):
        data = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"fine_labels": [i % n_classes for i in range(n)],
            b"coarse_labels": [0] * n,
            b"filenames": [f"img{i}.png".encode() for i in range(n)],
            b"batch_label": b"training batch 1 of 1",
        }
        (root / split).write_bytes(pickle.dumps(data, protocol=2))
    names = [f"class{i}".encode() for i in range(n_classes)]
    (root / "meta").write_bytes(
        pickle.dumps({b"fine_label_names": names, b"coarse_label_names": [b"all"]}, protocol=2)
    )


def test_cifar100_from_generated_pickles(tmp_path):
    _cifar_files(tmp_path / "cifar-100-python")
    ds = build_dataset("cifar100", root=tmp_path)
    assert ds.classes == ("class0", "class1", "class2")
    idx = ds.index("train")
    assert len(idx) == 6 and idx.labels.tolist() == [0, 1, 2, 0, 1, 2]
    raw = read_cifar_pickle(tmp_path / "cifar-100-python" / "train")
    img = np.asarray(ds.load(["train/00004"])[0])
    np.testing.assert_array_equal(img, raw["data"][4].reshape(3, 32, 32).transpose(1, 2, 0))
    assert raw["batch_label"] == b"training batch 1 of 1"


def test_cifar_reader_accepts_the_python2_module_path_and_big_endian(tmp_path):
    blob = pickle.dumps({b"data": np.arange(4, dtype=">i4").reshape(2, 2)}, protocol=2)
    blob = blob.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    (tmp_path / "f").write_bytes(blob)
    np.testing.assert_array_equal(read_cifar_pickle(tmp_path / "f")["data"], [[0, 1], [2, 3]])


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


@pytest.mark.parametrize(
    "payload", [_Evil(), {b"data": np.array([object()])}, {b"x": np.float64(1.0)}]
)
def test_cifar_reader_refuses_anything_else(tmp_path, payload):
    (tmp_path / "bad").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="CIFAR reader refuses"):
        read_cifar_pickle(tmp_path / "bad")


# ---------------------------------------------------------------- image folders


def test_image_folder_layouts(tmp_path):
    a = _folder(tmp_path / "a", {"zebra": 3, "ant": 2})
    ds = ImageFolder(a)
    assert ds.splits == ("all",) and ds.classes == ("ant", "zebra")
    assert ds.index("all").ids == (
        "ant/img000.png",
        "ant/img001.png",
        "zebra/img000.png",
        "zebra/img001.png",
        "zebra/img002.png",
    )
    assert ds.load(["zebra/img002.png"])[0].size == (5, 6)

    (a / "train.txt").write_text("zebra/img000.png\n# comment\nant/img001.png\n")
    (a / "test.txt").write_text("ant/img000.png\n")
    ds = ImageFolder(a)
    assert ds.splits == ("train", "test")
    assert ds.index("train").ids == ("ant/img001.png", "zebra/img000.png")
    assert ds.index("train").labels.tolist() == [0, 1]
    (a / "test.txt").write_text("ant/img001.png\n")
    with pytest.raises(ValueError, match="share 1 images"):
        ImageFolder(a)
    (a / "test.txt").write_text("ant/missing.png\n")
    with pytest.raises(DataNotFoundError, match="not a file"):
        ImageFolder(a)

    b = tmp_path / "b"
    _folder(b / "train", {"x": 2, "y": 1})
    _folder(b / "test", {"x": 1, "y": 1})
    ds = ImageFolder(b)
    assert ds.index("test").ids == ("test/x/img000.png", "test/y/img000.png")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        build_dataset("cub200", root=b)
    assert "expected 200" in str(w[0].message)


# ---------------------------------------------------------------- protocols


@pytest.fixture
def folder10(tmp_path):
    """10 classes with 2..11 images each, no official split."""
    root = _folder(tmp_path / "ten", {f"c{k}": 2 + k for k in range(10)})
    return {"image-folder": ImageFolder(root)}


def test_within_domain_order_tasks_and_caps(folder10):
    p = Protocol("image-folder", seed=1993, initial=4, increment=4, train_cap=3, test_cap=2)
    seq = p.build(datasets=folder10)
    order = np.random.RandomState(1993).permutation(10)
    assert seq.class_names == tuple(f"image-folder:c{k}" for k in order)
    assert [t.classes for t in seq] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9)]
    for t in seq:
        assert set(t.train.ids).isdisjoint(t.test.ids)
        for g in t.classes:
            n = 2 + order[g]
            n_train, n_test = (t.train.labels == g).sum(), (t.test.labels == g).sum()
            assert n_train <= 3 and n_test <= 2 and n_train >= 1 and n_test >= 1
            if n >= 5:
                assert (n_train, n_test) == (3, 2)
    again = p.build(datasets=folder10)
    assert again.checksum == seq.checksum
    other = Protocol("image-folder", seed=1996, initial=4, increment=4, train_cap=3, test_cap=2)
    assert other.build(datasets=folder10).class_names != seq.class_names
    assert seq.seen_test(1).ids == seq[0].test.ids + seq[1].test.ids
    assert len(seq.load(seq[0].train.ids[:2])) == 2


def test_protocol_serialisation_and_validation():
    p = Protocol(
        ("a", "b"), cross_domain=True, train_cap=128, dataset_options={"a": {"root": "/x"}}
    )
    assert Protocol.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert p.identity()["dataset_options"] == {"a": {}}
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['shots'\]"):
        Protocol.from_dict({"datasets": ["a"], "shots": 5})
    with pytest.raises(ValueError, match="exactly one dataset"):
        Protocol(("a", "b"))
    with pytest.raises(ValueError, match="train_cap"):
        Protocol("a", train_cap=0)
    with pytest.raises(ValueError, match="not in the protocol"):
        Protocol("a", dataset_options={"b": {}})


def test_cross_domain_union(tmp_path):
    one = ImageFolder(_folder(tmp_path / "one", {f"a{k}": 6 for k in range(5)}), name="one")
    two = ImageFolder(_folder(tmp_path / "two", {f"b{k}": 6 for k in range(4)}), name="two")
    p = Protocol(("one", "two"), cross_domain=True, seed=0, train_cap=2, test_cap=3)
    seq = p.build(datasets={"one": one, "two": two})
    assert [len(t.classes) for t in seq] == [3, 2, 2, 2]
    assert seq.class_datasets == ("one",) * 5 + ("two",) * 4
    assert all(len(t.train) == 2 * len(t.classes) for t in seq)
    all_train = [i for t in seq for i in t.train.ids]
    all_test = [i for t in seq for i in t.test.ids]
    assert set(all_train).isdisjoint(all_test) and len(set(all_train)) == len(all_train)
    halves = Protocol(("one", "two"), cross_domain=True, seed=7, train_cap=2, test_cap=3)
    assert halves.build(datasets={"one": one, "two": two}).class_names == seq.class_names


# ---------------------------------------------------------------- manifests


def test_manifest_written_verified_and_tampering_refused(tmp_path, folder10):
    p = Protocol("image-folder", seed=1, increment=5, train_cap=3, test_cap=2)
    path = tmp_path / "m" / "manifest.json"
    seq = p.build(path, datasets=folder10)
    stored = json.loads(path.read_text())
    assert stored["classes"] == list(seq.class_names) and len(stored["sha256"]) == 64
    p.build(path, datasets=folder10)  # same split: accepted

    edited = dict(stored, tasks=stored["tasks"][::-1])
    path.write_text(json.dumps(edited))
    with pytest.raises(ManifestMismatchError, match="modified after it was written"):
        p.build(path, datasets=folder10)

    from gdacil.hashing import sha256_json

    body = {k: v for k, v in stored.items() if k != "sha256"}
    body["classes"] = body["classes"][::-1]  # a consistent manifest with another class order
    path.write_text(json.dumps({**body, "sha256": sha256_json(body)}))
    with pytest.raises(ManifestMismatchError, match="class order differs"):
        p.build(path, datasets=folder10)

    path.write_text(json.dumps(stored))
    with pytest.raises(ManifestMismatchError, match=r"protocol differs in seed \(1 -> 2\)"):
        Protocol("image-folder", seed=2, increment=5, train_cap=3, test_cap=2).build(
            path, datasets=folder10
        )

    ds = folder10["image-folder"]
    _png(ds.root / "c3" / "extra.png")
    with pytest.raises(ManifestMismatchError, match="file list of dataset 'image-folder' changed"):
        p.build(path, datasets={"image-folder": ImageFolder(ds.root)})


# ---------------------------------------------------------------- anchors


def test_anchor_pools(tmp_path):
    root = _folder(tmp_path / "f", {f"c{k}": 8 for k in range(6)})
    ds = ImageFolder(root)
    seq = Protocol("image-folder", seed=0, initial=2, increment=2, train_cap=3, test_cap=2).build(
        datasets={"image-folder": ds}
    )
    assert len(seq) == 3
    outside = anchor_pool(seq, "outside")
    assert outside == ()  # every class is used
    unused = anchor_pool(seq, "unused")
    in_tasks = {i for t in seq for i in (*t.train.ids, *t.test.ids)}
    assert len(unused) == 6 * 3 and in_tasks.isdisjoint(unused)
    a = draw_anchors(seq, 5, seed=3, pool="unused")
    assert (
        a
        == draw_anchors(seq, 5, seed=3, pool="unused")
        != draw_anchors(seq, 5, seed=4, pool="unused")
    )
    assert len(seq.load(a)) == 5
    with pytest.raises(ValueError, match="pool holds 0"):
        draw_anchors(seq, 1)
    with pytest.raises(ValueError, match="unknown anchor pool"):
        anchor_pool(seq, "everything")


@needs_wordnet
def test_wordnet_anchors_lie_outside_the_classes():
    seq = Protocol("wordnet-supersense", train_cap=5, test_cap=5).build()
    ds = seq.datasets["wordnet-supersense"]
    a = draw_anchors(seq, 100, seed=0)
    assert len(a) == 100 and all(i.split(":", 1)[1] in set(ds.unlabelled()) for i in a)
    assert all(isinstance(t, str) for t in seq.load(a[:3]))


@needs_fashion_mnist
def test_fashion_mnist_protocol_and_unused_anchors():
    seq = Protocol("fashion-mnist", initial=2, increment=2, train_cap=10, test_cap=5).build()
    assert len(seq) == 5 and all(len(t.train) == 20 and len(t.test) == 10 for t in seq)
    a = draw_anchors(seq, 50, seed=0, pool="unused")
    assert all(i.startswith("fashion-mnist:train/") for i in a)
    assert set(a).isdisjoint(i for t in seq for i in t.train.ids)
