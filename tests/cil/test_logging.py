"""Logging: the library only logs (a NullHandler, no configuration), the ``gdacil`` command sends
it to stderr at the level of ``--verbose``/``--quiet``, and a run's progress line estimates the
time left."""

import logging
import subprocess
import sys
import textwrap

import pytest
import yaml

from gdacil import cil
from gdacil.cil import run_experiment
from gdacil.cil.progress import RunProgress, format_duration, remaining_seconds
from gdacil.cli import main

from _assets import needs_transformers
from test_runner import TRAIN_TINY, color_folder, vit_config


# ------------------------------------------------------------------ the estimate
def test_the_time_left_is_the_mean_task_time_times_the_tasks_left():
    assert remaining_seconds([10.0, 20.0], 3) == pytest.approx(45.0)
    assert remaining_seconds([7.0], 0) == 0.0
    assert remaining_seconds([], 3) is None
    with pytest.raises(ValueError, match="tasks_left"):
        remaining_seconds([1.0], -1)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (-3, "0s"), (59.4, "59s"), (59.6, "1m00s"), (80, "1m20s"), (3599.4, "59m59s"),
    (3600, "1h00m"), (7500, "2h05m"), (36 * 3600 + 90, "36h02m"),
])
def test_durations_read_in_two_units(seconds, text):
    assert format_duration(seconds) == text


def test_run_progress_counts_resumed_tasks_as_done_but_not_in_the_mean():
    now = [100.0]
    progress = RunProgress(clock=lambda: now[0])
    assert progress.summary() == "[0/? tasks, 0s elapsed]"
    progress.total = 10
    progress.skip(2)  # restored from a checkpoint: done, not timed here
    assert progress.summary() == "[2/10 tasks, 0s elapsed]"  # nothing timed yet: no estimate
    progress.task_done(4.0)
    progress.task_done(6.0)
    now[0] = 112.0
    # 6 tasks left at the mean of 5 s
    assert progress.summary() == "[4/10 tasks, 12s elapsed, about 30s left]"
    for _ in range(6):
        progress.task_done(5.0)
    now[0] = 190.0
    assert progress.summary() == "[10/10 tasks, 1m30s elapsed]"


# ------------------------------------------------------------------ the library
def test_the_library_configures_no_logging():
    """Importing every entry point adds one NullHandler to the ``gdacil`` logger and nothing
    else; a warning then reaches no stream (the application decides where logs go)."""
    code = textwrap.dedent("""
        import logging
        import gdacil, gdacil.callbacks, gdacil.cil, gdacil.cil.runner, gdacil.cli, gdacil.learner
        root = logging.getLogger()
        assert root.handlers == [] and root.level == logging.WARNING, root.handlers
        top = logging.getLogger("gdacil")
        assert [type(h) for h in top.handlers] == [logging.NullHandler], top.handlers
        assert top.level == logging.NOTSET
        for name, lg in logging.Logger.manager.loggerDict.items():
            if name.startswith("gdacil.") and isinstance(lg, logging.Logger):
                assert lg.handlers == [] and lg.level == logging.NOTSET, name
        logging.getLogger("gdacil.cil.runner").warning("must not be printed")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "must not be printed" not in proc.stderr + proc.stdout


def test_the_command_leaves_logging_as_it_found_it(capsys):
    top = logging.getLogger("gdacil")
    handlers, level = list(top.handlers), top.level
    assert main(["-v", "list", "heads"]) == 0
    assert "lr_rgda" in capsys.readouterr().out
    assert top.handlers == handlers and top.level == level


@needs_transformers
def test_runner_messages_go_to_loggers_at_their_levels_or_to_log(tmp_path, caplog):
    from test_runner_streaming import STREAMING

    color_folder(tmp_path / "images")
    caplog.set_level(logging.DEBUG, logger="gdacil")
    heads = {"ncm": {}, "acil": STREAMING["acil"]}
    run_experiment(vit_config(tmp_path, strategy=TRAIN_TINY, heads=heads))
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records
               if r.name.startswith("gdacil")]
    warnings = [m for _, level, m in records if level == logging.WARNING]
    assert len(warnings) == 1 and "not drift-compensated" in warnings[0]
    info = [m for name, level, m in records
            if level == logging.INFO and name == "gdacil.cil.runner"]
    assert [m.split(":")[0] for m in info] == [f"seed 3 task {t}/3" for t in (1, 2, 3)]
    assert "[1/3 tasks, " in info[0] and "left]" in info[0] and "[3/3 tasks, " in info[2]
    debug = [m for _, level, m in records if level == logging.DEBUG]
    assert sum("timings:" in m and "checkpoint_s" in m for m in debug) == 3
    assert sum("Stage-1 4 steps" in m for m in debug) == 3
    results = [m for name, _, m in records if name == "gdacil.cil.results"]
    assert results[0].startswith("results of tiny-vit (percent):\n| head |")
    # with a log callable, it gets the INFO and WARNING messages and the loggers nothing
    caplog.clear()
    messages = []
    run_experiment(vit_config(tmp_path, out="again", strategy=TRAIN_TINY, heads=heads),
                   log=messages.append)
    assert not [r for r in caplog.records if r.name.startswith("gdacil")]
    assert len(messages) == 1 + 3 + 2  # the warning, the tasks, the table and the folder
    assert "not drift-compensated" in messages[0] and "timings:" not in "".join(messages)


# ------------------------------------------------------------------ the command
@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    """A frozen tiny-ViT experiment as a YAML file."""
    tmp = tmp_path_factory.mktemp("cli")
    color_folder(tmp / "images")
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(vit_config(tmp, heads={"ncm": {}}).to_dict()))
    return str(path)


@needs_transformers
@pytest.mark.parametrize("argv", [["-v", "run", "{}"], ["run", "{}", "--verbose"],
                                  ["run", "{}"], ["--quiet", "run", "{}"], ["run", "{}", "-q"]])
def test_verbose_shows_debug_and_quiet_hides_info(config_file, argv, capsys):
    argv = [a.format(config_file) for a in argv] + ["--overwrite"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == ""  # a run's messages are logs: stderr
    lines = [line for line in err.splitlines() if line.startswith("gdacil: ")]
    debug = any(line.startswith("gdacil: seed 3 task 1 timings:") for line in lines)
    info = any(line.startswith("gdacil: seed 3 task 3/3: 1 new classes") for line in lines)
    if {"-v", "--verbose"} & set(argv):
        assert debug and info
    elif {"-q", "--quiet"} & set(argv):
        assert lines == []
    else:
        assert info and not debug
        assert "gdacil: results written to" in err and "| ncm |" in err


def test_quiet_turns_progress_bars_off_and_tensorboard_is_a_flag(tmp_path, monkeypatch):
    path = tmp_path / "t.yaml"
    path.write_text("name: t\nseeds: [3]\n")
    seen = []
    monkeypatch.setattr(cil, "run_experiment", lambda cfg, **kw: seen.append(cfg))
    assert main(["run", str(path)]) == 0
    assert main(["-q", "run", str(path), "--tensorboard"]) == 0
    assert main(["run", str(path), "--quiet"]) == 0
    assert [(c.progress, c.tensorboard) for c in seen] == [(True, False), (False, True),
                                                           (False, False)]
    with pytest.raises(SystemExit):
        main(["-v", "-q", "run", str(path)])
