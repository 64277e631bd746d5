"""Storage faults (issue 13): damaged tensor files and state.json, leftover temporary files of
killed writers, and output names that leave runs/. Each case is refused with an error naming the
file, repaired (the feature cache recomputes), or cleaned on the next run (docs/reliability.md)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save

from gdacil import ClassGaussians
from gdacil.backbones import build_backbone
from gdacil.cil import run_experiment
from gdacil.cil.config import ConfigError, load_config
from gdacil.cil.runner import output_dir
from gdacil.cli import main
from gdacil.data import FeatureCache
from gdacil.io import CorruptFileError, load_tensors, remove_stale_temp_files, save_tensors
from gdacil.stats import ClassStatistics

from _assets import TINY_VIT, needs_transformers, random_images
from test_runner import color_folder, vit_config

HOUR = 3600


def quiet(*_):
    pass


# ---------------------------------------------------------------------- helpers
def header(path):
    """The safetensors header of ``path``: (its JSON, where the tensor bytes start)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), 8 + n


def flip(path, offset, bit=0):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 1 << bit
    path.write_bytes(bytes(raw))


def flip_tensor_byte(path, name):
    """Flip the lowest mantissa bit of the first element of tensor ``name``."""
    head, start = header(path)
    flip(path, start + head[name]["data_offsets"][0])


def flip_metadata(path, text: bytes, bit=0):
    """Flip a bit in the first byte after ``text`` in the file (inside the JSON metadata)."""
    raw = path.read_bytes()
    at = raw.index(text) + len(text)
    assert at < header(path)[1], "not in the header"
    flip(path, at, bit)


def age(path, seconds=2 * HOUR):
    then = time.time() - seconds
    os.utime(path, (then, then))


# ---------------------------------------------------------------------- a checkpoint to damage
@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A tiny-ViT run stopped after its first task: its output directory (a checkpoint)."""
    base = tmp_path_factory.mktemp("interrupted")
    color_folder(base / "images")

    def stop(seed, t):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(vit_config(base, out="killed"), log=quiet, on_task_end=stop)
    return base


def checkpoint_copy(interrupted, tmp_path):
    """A copy of the interrupted run and a config that resumes it (sharing its images and cache)."""
    shutil.copytree(interrupted / "killed", tmp_path / "run")
    cfg = vit_config(interrupted, output_dir=str(tmp_path / "run"))
    return cfg, tmp_path / "run" / "seed_3"


@needs_transformers
@pytest.mark.parametrize("where", ["tensor byte", "metadata"])
def test_bit_flip_in_a_checkpoint_stats_file_is_refused_on_resume(interrupted, tmp_path, where):
    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    stats = seed_dir / "stats_task1_none.safetensors"
    assert ClassStatistics.load(stats).n_classes == 2  # the clean file loads
    if where == "tensor byte":
        flip_tensor_byte(stats, "means")  # a mantissa bit: a slightly different mean
    else:
        flip_metadata(stats, b'\\"ddof\\": ')  # ddof 0 -> 1
    with pytest.raises(CorruptFileError, match="does not match its sha256 checksum") as err:
        ClassStatistics.load(stats)
    assert err.value.path == stats
    with pytest.raises(CorruptFileError, match="stats_task1_none.safetensors.*--overwrite"):
        run_experiment(cfg, resume=True, log=quiet)


@needs_transformers
def test_cli_resume_of_a_corrupt_checkpoint_is_one_line_naming_the_file(interrupted, tmp_path,
                                                                       capsys):
    import yaml

    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    flip_tensor_byte(seed_dir / "stats_task1_none.safetensors", "scatters")
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg.to_dict()))
    assert main(["run", str(config), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(seed_dir / "stats_task1_none.safetensors") in err and "--overwrite" in err
    # --overwrite starts over, and the run completes
    results = run_experiment(cfg, overwrite=True, log=quiet)
    assert len(results["seeds"]["3"]["ncm"]["pooled_acc_per_task"]) == 3


@needs_transformers
@pytest.mark.parametrize("edit", ["one prediction", "truncated", "checksum key", "not an object"])
def test_edited_state_json_is_refused_on_resume(interrupted, tmp_path, edit):
    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    path = seed_dir / "state.json"
    state = json.loads(path.read_text())
    assert "sha256" in state
    if edit == "one prediction":  # still valid JSON, still a valid class label
        y = state["evaluations"]["lda"][0]["y_pred"]
        y[0] = 1 - y[0]
        path.write_text(json.dumps(state))
        match = "content does not match its sha256 checksum"
    elif edit == "truncated":
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        match = "not valid JSON"
    elif edit == "checksum key":  # a damaged key must not pass for a file without a checksum
        state["sha257"] = state.pop("sha256")
        path.write_text(json.dumps(state))
        match = "unexpected keys"
    else:
        path.write_text("[1, 2]")
        match = "not a JSON object"
    with pytest.raises(CorruptFileError, match=f"state.json: {match}.*--overwrite"):
        run_experiment(cfg, resume=True, log=quiet)


@needs_transformers
def test_a_missing_checkpoint_file_is_refused_naming_it(interrupted, tmp_path):
    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    (seed_dir / "stats_task1_none.safetensors").unlink()
    with pytest.raises(CorruptFileError, match="stats_task1_none.safetensors: missing.*--overwrite"):
        run_experiment(cfg, resume=True, log=quiet)


# ---------------------------------------------------------------------- any tensor file
@pytest.mark.parametrize("damage", ["empty", "half", "one byte short", "text"])
def test_truncated_empty_or_foreign_files_raise_an_error_naming_the_file(tmp_path, damage):
    path = tmp_path / "stats.safetensors"
    ClassGaussians(3).update(torch.randn(8, 3), torch.tensor([0, 1] * 4)).save(path)
    raw = path.read_bytes()
    cut = {"empty": b"", "half": raw[: len(raw) // 2], "one byte short": raw[:-1],
           "text": b"mean,count\n1,2\n"}[damage]
    path.write_bytes(cut)
    with pytest.raises(CorruptFileError, match="truncated or damaged") as err:
        load_tensors(path)
    assert str(path) in str(err.value) and err.value.path == path
    with pytest.raises(CorruptFileError, match="stats.safetensors"):
        ClassGaussians.load(path)


def test_a_bit_flip_in_any_byte_of_a_stats_file_is_refused(tmp_path):
    """Length prefix, header, metadata, checksum and tensor bytes alike: one flipped bit in any
    byte (bit ``i % 8`` of byte ``i``) and the file does not load."""
    path, damaged = tmp_path / "s.safetensors", tmp_path / "d.safetensors"
    ClassGaussians(2).update(torch.randn(6, 2), torch.tensor([0, 1, 2] * 2)).save(path)
    raw = path.read_bytes()
    accepted = []
    for i in range(len(raw)):
        b = bytearray(raw)
        b[i] ^= 1 << (i % 8)
        damaged.write_bytes(bytes(b))
        try:
            load_tensors(damaged)
            accepted.append(i)
        except CorruptFileError:
            pass
    assert accepted == []


def test_files_without_a_checksum_still_load(tmp_path):
    """Files written before checksums existed load, unverified (docs/reliability.md)."""
    path = tmp_path / "old.safetensors"
    path.write_bytes(save({"a": torch.arange(3.0)}, metadata={"gdacil": json.dumps({"k": 1})}))
    tensors, meta = load_tensors(path)
    assert torch.equal(tensors["a"], torch.arange(3.0)) and meta == {"k": 1}
    save_tensors(path, {"a": torch.arange(3.0)}, {"k": 1})
    assert header(path)[0]["__metadata__"]["gdacil.sha256"]


# ---------------------------------------------------------------------- the feature cache
@pytest.fixture(scope="module")
def vit():
    return build_backbone("vit", config=TINY_VIT)


class Loader:
    def __init__(self, n=5):
        self.images = dict(zip((f"s{i}" for i in range(n)), random_images(n)))
        self.loaded = 0

    def __call__(self, ids):
        self.loaded += len(ids)
        return [self.images[i] for i in ids]


@needs_transformers
@pytest.mark.parametrize("where", ["tensor byte", "metadata"])
def test_a_corrupt_cache_entry_is_recomputed_never_reused(tmp_path, vit, where):
    cache, load = FeatureCache(tmp_path), Loader()
    ids = sorted(load.images)
    clean = vit.extract(load(ids))
    cache.get_or_compute(vit, ids, load)
    key = cache.key(vit.fingerprint(), ids)
    entry = cache.path(key)
    if where == "tensor byte":
        flip_tensor_byte(entry, "features")
    else:
        flip_metadata(entry, b'\\"n\\": ')  # the sample count in the key's inputs
    with pytest.raises(CorruptFileError) as err:
        cache.get(key)
    assert err.value.path == entry
    load.loaded = 0
    with pytest.warns(UserWarning, match=f"{entry.name}.*computing the features again"):
        again = cache.get_or_compute(vit, ids, load)
    assert load.loaded == len(ids) and cache.misses == 2  # recomputed, not read
    torch.testing.assert_close(again, clean, rtol=0, atol=0)
    torch.testing.assert_close(cache.get(key), clean, rtol=0, atol=0)  # the entry is sound again


# ---------------------------------------------------------------------- temporary files
def test_stale_temp_files_are_removed_and_fresh_ones_kept(tmp_path):
    stale = tmp_path / ".state.json.ab1_cd9z.tmp"
    fresh = tmp_path / ".results.json.k2m3n4p5.tmp"  # another live writer's, maybe
    others = [tmp_path / "notes.tmp", tmp_path / ".x.tmp", tmp_path / "state.json",
              tmp_path / ".a.safetensors.TOOLONG9.tmp"]
    for p in (stale, fresh, *others):
        p.write_bytes(b"x")
    for p in (stale, *others):
        age(p)
    nested = tmp_path / "ab" / ".abcdef.safetensors.q1w2e3r4.tmp"
    nested.parent.mkdir()
    nested.write_bytes(b"x")
    age(nested)
    assert remove_stale_temp_files(tmp_path) == [stale]
    assert fresh.exists() and nested.exists() and all(p.exists() for p in others)
    FeatureCache(tmp_path)  # a cache cleans its root and its <key[:2]>/ folders
    assert not nested.exists() and fresh.exists()
    assert remove_stale_temp_files(tmp_path / "missing") == []
    assert remove_stale_temp_files(tmp_path / "state.json") == []  # a file, not a folder


@needs_transformers
def test_temp_file_of_a_writer_killed_mid_write_is_removed_by_the_next_run(interrupted, tmp_path):
    cfg, seed_dir = checkpoint_copy(interrupted, tmp_path)
    state = (seed_dir / "state.json").read_bytes()
    # kill -9 between writing the temporary file and renaming it over state.json
    code = ("import os, signal, sys\n"
            "from gdacil import io\n"
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
            "io.atomic_write_bytes(sys.argv[1], b'{}' * 1000)\n")
    done = subprocess.run([sys.executable, "-c", code, str(seed_dir / "state.json")],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert done.returncode == -signal.SIGKILL
    left = list(seed_dir.glob(".state.json.*.tmp"))
    assert len(left) == 1 and (seed_dir / "state.json").read_bytes() == state
    fresh = seed_dir.parent / ".results.json.abcdefgh.tmp"  # a live writer's: kept
    fresh.write_bytes(b"x")
    age(left[0])
    results = run_experiment(cfg, resume=True, log=quiet)
    assert not left[0].exists() and fresh.exists()
    assert len(results["seeds"]["3"]["ncm"]["pooled_acc_per_task"]) == 3


# ---------------------------------------------------------------------- output names
@pytest.mark.parametrize("name, problem", [
    ("../../x", "path separator"), ("/tmp/x", "absolute path"), ("a/b", "path separator"),
    ("a\\b", "path separator"), ("..", "relative path component"), (".", "relative path"),
    ("", "non-empty"), ("a\nb", "control character"),
])
def test_output_names_cannot_leave_the_output_root(tmp_path, name, problem):
    config = tmp_path / "exp.yaml"
    config.write_text(json.dumps({"name": name}))  # JSON is YAML
    with pytest.raises(ConfigError, match=f"name: .*{problem}"):
        load_config(config)


def test_output_dir_refuses_a_name_changed_after_validation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    color_folder(tmp_path / "images")
    cfg = vit_config(tmp_path, name="my-run.v2", output_dir=None)
    assert output_dir(cfg) == tmp_path.joinpath("runs", "my-run.v2").relative_to(tmp_path)
    cfg.name = "../../x"
    with pytest.raises(ConfigError, match="path separator"):
        run_experiment(cfg, log=quiet)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]


def test_tensors_with_a_stride_zero_dimension_are_saved_and_hashed_like_their_copies(tmp_path):
    """A one-element tensor expanded from a scalar is "contiguous" with stride 0 (LR-RGDA's bias
    of a single class can be one); its bytes are hashed and saved as a plain copy's."""
    import torch

    from gdacil.hashing import sha256_tensors
    from gdacil.io import load_tensors, save_tensors

    expanded = torch.tensor(3.0).expand(1)
    assert expanded.stride() == (0,)
    plain = torch.tensor([3.0])
    assert sha256_tensors([("a", expanded)]) == sha256_tensors([("a", plain)])
    save_tensors(tmp_path / "t.safetensors", {"a": expanded}, {})
    assert torch.equal(load_tensors(tmp_path / "t.safetensors")[0]["a"], plain)


@pytest.mark.parametrize("fmt", [["gdacil.ClassGaussians/1"], {"a": 1}, 3, None])
def test_a_file_whose_format_is_not_a_string_is_refused_with_a_value_error(tmp_path, fmt):
    """Metadata is any JSON: a list or object as the format (unhashable) must not escape as a
    TypeError from the format lookup."""
    from gdacil import ClassStatistics
    from gdacil.heads import MappedLinearHead
    from gdacil.io import save_tensors

    path = save_tensors(tmp_path / "odd.safetensors", {"counts": torch.ones(1)}, {"format": fmt})
    with pytest.raises(ValueError, match="not a ClassStatistics file"):
        ClassStatistics.load(path)
    with pytest.raises(ValueError, match="not a MappedLinearHead file"):
        MappedLinearHead.load(path)


def test_save_tensors_streams_from_the_tensors_without_a_copy_in_memory(tmp_path):
    """Saving a large model must not hold a second copy of it: the process's peak memory grows by
    far less than the tensor's 200 MB (a whole-file buffer would add 200 to 400 MB)."""
    script = (
        "import resource, sys, torch\n"
        "from gdacil.io import save_tensors\n"
        "t = torch.ones(50_000_000)\n"
        "peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024\n"
        "before = peak()\n"
        "save_tensors(sys.argv[1], {'t': t}, {'n': 1})\n"
        "print(peak() - before)\n")
    path = tmp_path / "big.safetensors"
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                         text=True, check=True)
    assert int(out.stdout) < 50 * 2**20, f"peak memory grew by {int(out.stdout) / 2**20:.0f} MiB"
    tensors, meta = load_tensors(path)
    assert meta == {"n": 1} and tensors["t"].shape == (50_000_000,) and bool((tensors["t"] == 1).all())
