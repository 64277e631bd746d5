"""Callbacks of the experiment runner: every Stage-1 step's losses while training, one task end
per task and seed with its timings and accuracies, and the TensorBoard logger's event files."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gdacil import cil
from gdacil._optional import MissingDependencyError
from gdacil.adapt import Strategy, build_strategy
from gdacil.backbones import build_backbone
from gdacil.callbacks import Callback, CallbackList, TensorBoardLogger
from gdacil.cil import ConfigError, run_experiment
from gdacil.cil.runner import experiment_fingerprint

from _assets import TINY_VIT, needs_module, needs_transformers, random_images
from test_runner import TRAIN_TINY, color_folder, vit_config

needs_tensorboard = needs_module("tensorboard", "pip install 'gdacil[tensorboard]'")
SEEDS, TASKS, STEPS = [3, 4], 3, TRAIN_TINY["train"]["steps"]
TIME_KEYS = ("task_s", "test_features_s", "checkpoint_s", "adapt_s", "features_s")


class Recorder(Callback):
    """Every call, in order."""

    def __init__(self):
        self.calls = []

    def on_run_start(self, cfg):
        self.calls.append(("run_start", cfg))

    def on_task_start(self, seed, task, info):
        self.calls.append(("task_start", seed, task, dict(info)))

    def on_train_step(self, seed, task, step, losses):
        self.calls.append(("step", seed, task, step, dict(losses)))

    def on_task_end(self, seed, task, timing, metrics):
        self.calls.append(("task_end", seed, task, dict(timing), metrics))

    def on_run_end(self, results):
        self.calls.append(("run_end", results))

    def of(self, kind):
        return [c[1:] for c in self.calls if c[0] == kind]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One fine-tuning run (2 seeds x 3 tasks x 4 Stage-1 steps) with a recording callback and
    TensorBoard on, and the training logs that the strategy returned, in order."""
    tmp = tmp_path_factory.mktemp("callbacks")
    color_folder(tmp / "images")
    logs = []
    original = Strategy.adapt_task

    def adapt_task(self, *args, **kwargs):
        logs.append(original(self, *args, **kwargs))
        return logs[-1]

    recorder = Recorder()
    tensorboard = importlib.util.find_spec("tensorboard") is not None
    cfg = vit_config(tmp, strategy=TRAIN_TINY, seeds=SEEDS, tensorboard=tensorboard)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Strategy, "adapt_task", adapt_task)
        results = run_experiment(cfg, log=lambda *_: None, callbacks=[recorder])
    return {"cfg": cfg, "results": results, "recorder": recorder, "logs": logs,
            "out": tmp / "run"}


@needs_transformers
def test_every_step_loss_reaches_the_callbacks_equal_to_the_training_log(run):
    steps, logs = run["recorder"].of("step"), run["logs"]
    assert len(logs) == len(SEEDS) * TASKS and all(log["steps"] == STEPS for log in logs)
    for k, log in enumerate(logs):
        seed, task = SEEDS[k // TASKS], k % TASKS
        mine = [s for s in steps if s[:2] == (seed, task)]
        assert [s[2] for s in mine] == list(range(STEPS))
        for key in ("loss", "task_loss", "kd_loss"):
            assert [s[3][key] for s in mine] == pytest.approx(log[key], rel=1e-6, abs=1e-9)
    assert len(steps) == len(SEEDS) * TASKS * STEPS
    # the losses are real: the first step of a task with several classes is not zero
    assert steps[0][3]["loss"] > 0.1


@needs_transformers
def test_calls_come_in_order_and_task_info_counts_steps_over_the_seed(run):
    calls = run["recorder"].calls
    assert calls[0] == ("run_start", run["cfg"]) and calls[-1] == ("run_end", run["results"])
    order = [(c[0], c[1], c[2]) for c in calls[1:-1]]
    expected = []
    for seed in SEEDS:
        for task in range(TASKS):
            expected += [("task_start", seed, task), *[("step", seed, task)] * STEPS,
                         ("task_end", seed, task)]
    assert order == expected
    for _seed, task, info in run["recorder"].of("task_start"):
        assert info["tasks"] == TASKS and info["steps"] == STEPS
        assert info["first_step"] == task * STEPS
        assert info["classes"] == (2 if task == 0 else 1) and info["seen"] == 2 + task


@needs_transformers
def test_one_task_end_per_task_and_seed_with_timings_and_the_results_metrics(run):
    ends = run["recorder"].of("task_end")
    assert [(seed, task) for seed, task, *_ in ends] == [(s, t) for s in SEEDS
                                                         for t in range(TASKS)]
    timings = json.loads((run["out"] / "timings.json").read_text())
    for seed, task, timing, metrics in ends:
        for key in TIME_KEYS:
            assert timing[key] > 0, key
        # the task's total holds its parts (the checkpoint is written after it)
        parts = timing["adapt_s"] + timing["features_s"] + timing["test_features_s"]
        assert timing["task_s"] >= parts
        assert timings[str(seed)][task] == json.loads(json.dumps(timing))  # what it holds
        per_seed = run["results"]["seeds"][str(seed)]
        assert set(metrics) == set(per_seed) == {"ncm", "lda", "lr_rgda"}
        for label, m in metrics.items():
            assert m["pooled_acc"] == pytest.approx(per_seed[label]["pooled_acc_per_task"][task])
            assert m["class_balanced_acc"] == pytest.approx(
                per_seed[label]["class_balanced_acc_per_task"][task])


@needs_transformers
@needs_tensorboard
def test_tensorboard_event_files_hold_losses_accuracies_and_timings(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for k, seed in enumerate(SEEDS):
        events = EventAccumulator(str(run["out"] / "tensorboard" / f"seed{seed}"))
        events.Reload()
        tags = set(events.Tags()["scalars"])
        logs = run["logs"][k * TASKS : (k + 1) * TASKS]
        for key in ("loss", "task_loss", "kd_loss"):
            scalars = events.Scalars(f"stage1/{key}")
            assert [s.step for s in scalars] == list(range(TASKS * STEPS))
            expected = [v for log in logs for v in log[key]]
            assert [s.value for s in scalars] == pytest.approx(expected, rel=1e-6, abs=1e-7)
        per_seed = run["results"]["seeds"][str(seed)]
        for label in ("ncm", "lda", "lr_rgda"):
            scalars = events.Scalars(f"accuracy/{label}")
            assert [s.step for s in scalars] == [1, 2, 3]
            assert [s.value for s in scalars] == pytest.approx(
                per_seed[label]["pooled_acc_per_task"], abs=1e-6)
            assert f"class_balanced_accuracy/{label}" in tags
            assert f"time/heads/{label}/build_s" in tags and f"memory/heads/{label}/bytes" in tags
        timings = json.loads((run["out"] / "timings.json").read_text())[str(seed)]
        for key in ("task_s", "test_features_s", "checkpoint_s", "adapt_s"):
            scalars = events.Scalars(f"time/{key}")
            assert [s.step for s in scalars] == [1, 2, 3]
            assert [s.value for s in scalars] == pytest.approx([t[key] for t in timings],
                                                               rel=1e-5)
        assert "memory/max_rss_bytes" in tags and "memory/stats_bytes/none" in tags
        assert not any(tag.startswith("time/adapt/") for tag in tags)  # counts are not times


@needs_transformers
def test_no_step_callback_means_no_per_step_hook(tmp_path, monkeypatch):
    """A callback that ignores steps costs nothing per step: the strategy gets on_step=None."""

    class TaskEnds(Callback):
        def __init__(self):
            self.ends = []

        def on_task_end(self, seed, task, timing, metrics):
            self.ends.append((seed, task))

    color_folder(tmp_path / "images")
    hooks = []
    original = Strategy.adapt_task

    def adapt_task(self, *args, on_step=None, **kwargs):
        hooks.append(on_step)
        return original(self, *args, on_step=on_step, **kwargs)

    monkeypatch.setattr(Strategy, "adapt_task", adapt_task)
    ends = TaskEnds()
    run_experiment(vit_config(tmp_path, strategy=TRAIN_TINY), log=lambda *_: None,
                   callbacks=[ends])
    assert hooks == [None] * TASKS and ends.ends == [(3, t) for t in range(TASKS)]


def test_callback_list_fans_out_in_order_and_knows_who_reads_steps():
    seen = []

    class Named(Callback):
        def __init__(self, name):
            self.name = name

        def on_task_end(self, seed, task, timing, metrics):
            seen.append(self.name)

    quiet = CallbackList([Named("a"), Named("b")])
    quiet.on_task_end(0, 0, {}, {})
    quiet.on_train_step(0, 0, 0, {"loss": 1.0})  # a no-op for both
    assert seen == ["a", "b"] and not quiet.wants_steps and len(quiet) == 2
    assert CallbackList([Named("a"), Recorder()]).wants_steps
    with pytest.raises(TypeError, match="Callback instances"):
        CallbackList([print])


@needs_transformers
def test_on_step_sees_each_step_and_changes_nothing():
    """The same training with and without on_step: equal logs and weights; on_step saw them."""
    images, labels = random_images(12, seed=0), np.repeat([3, 5, 7], 4)
    train = {"steps": 5, "batch_size": 4, "lr": 0.05, "head_lr": 0.05}
    runs = []
    for hook in (None, []):
        bb = build_backbone("vit", config=TINY_VIT)
        on_step = None if hook is None else (lambda i, losses, h=hook: h.append((i, losses)))
        log = build_strategy("seqkd", train=train).adapt_task(bb, 1, images, labels, generator=7,
                                                              on_step=on_step)
        runs.append((log, bb.model.state_dict(), hook))
    (plain, plain_weights, _), (hooked, weights, hook) = runs
    assert {k: v for k, v in plain.items() if k != "seconds"} == \
        {k: v for k, v in hooked.items() if k != "seconds"}
    for key, value in plain_weights.items():
        assert torch.equal(value, weights[key]), key
    assert [i for i, _ in hook] == list(range(5))
    for key in ("loss", "task_loss", "kd_loss"):
        assert [losses[key] for _, losses in hook] == hooked[key]
    assert any(losses["kd_loss"] > 0 for _, losses in hook)  # distillation is on from task 1


@needs_tensorboard
def test_the_tensorboard_logger_writes_one_run_folder_per_seed(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path)
    logger.on_task_start(0, 1, {"first_step": 10})
    logger.on_train_step(0, 1, 2, {"loss": 0.5})
    logger.on_task_end(0, 1, {"task": 1, "task_s": 2.0, "compensate_s": {"hopdc": 0.25},
                              "adapt": {"steps": 3, "seconds": 1.0}, "stats_bytes": {"none": 64}},
                       {"ncm": {"pooled_acc": 0.75, "class_balanced_acc": 0.5}})
    logger.on_run_end({})
    assert [p.name for p in tmp_path.iterdir()] == ["seed0"]
    events = EventAccumulator(str(tmp_path / "seed0"))
    events.Reload()
    values = {tag: [(s.step, s.value) for s in events.Scalars(tag)]
              for tag in events.Tags()["scalars"]}
    assert values == {"stage1/loss": [(12, 0.5)], "accuracy/ncm": [(2, 0.75)],
                      "class_balanced_accuracy/ncm": [(2, 0.5)], "time/task_s": [(2, 2.0)],
                      "time/compensate_s/hopdc": [(2, 0.25)],
                      "memory/stats_bytes/none": [(2, 64.0)]}


def test_the_tensorboard_logger_names_the_install_line_when_tensorboard_is_missing(
        tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import fails as if not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'gdacil\[tensorboard\]'"):
        TensorBoardLogger(tmp_path)


def test_the_tensorboard_setting_is_validated_and_leaves_the_fingerprint(tmp_path):
    with pytest.raises(ConfigError, match="tensorboard: expected true or false"):
        vit_config(tmp_path, tensorboard="yes")
    on, off = vit_config(tmp_path, tensorboard=True), vit_config(tmp_path)
    assert experiment_fingerprint(on) == experiment_fingerprint(off)  # --resume may switch it


def test_the_documented_callback_prints_what_the_page_says(capsys, monkeypatch):
    """docs/observability.md: the example callback runs, and so does its run block (with
    run_experiment replaced: the demo fine-tunes MiniLM for minutes)."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "class LossAndTime" in b]
    (usage,) = [b for b in blocks if "callbacks=[LossAndTime()]" in b]
    namespace: dict = {}
    exec(compile(example, str(doc), "exec"), namespace)  # intended: runs the docs' own code
    callback = CallbackList([namespace["LossAndTime"]()])
    for step in (49, 50):
        callback.on_train_step(3, 0, step, {"loss": 0.25, "task_loss": 0.25, "kd_loss": 0.0})
    callback.on_task_end(3, 0, {"task_s": 1.25},
                         {"ncm": {"pooled_acc": 0.5}, "lda": {"pooled_acc": 0.75}})
    assert capsys.readouterr().out == ("seed 3 task 1 step 50: loss 0.2500\n"
                                       "seed 3 task 1: 1.2 s, best lda (0.750)\n")
    ran = []
    monkeypatch.setattr(cil, "run_experiment", lambda cfg, **kw: ran.append((cfg, kw)) or {})
    exec(compile(usage, str(doc), "exec"), namespace)
    ((cfg, kw),) = ran
    assert cfg.build_strategy().config.train.steps == 100
    assert isinstance(kw["callbacks"][0], namespace["LossAndTime"])
