"""Streaming heads (RanPAC, ACIL, RBF-LDA) in the class-incremental runner."""

import json

import numpy as np
import pytest
import torch

from gdacil.cil import run_experiment
from gdacil.cil.config import ConfigError
from gdacil.cil.runner import _SeedRun, experiment_fingerprint, output_dir
from gdacil.heads import ACIL, RBFLDA, RanPAC

from _assets import needs_transformers
from test_runner import TRAIN_TINY, adapting_config, color_folder, hand_metrics, vit_config

# small maps keep the test fast; lam is fixed because "auto" picks it from each task's split
STREAMING = {"ranpac": {"dim_out": 64, "lam": 1.0, "seed": 5},
             "acil": {"buffer_size": 48, "gamma": 0.5, "seed": 2},
             "rbf_lda": {"dim_out": 40, "seed": 1}}
REFERENCE = {"ranpac": RanPAC, "acil": ACIL, "rbf_lda": RBFLDA}


def quiet(*_):
    pass


@needs_transformers
def test_streaming_heads_match_the_head_fitted_on_every_task_at_once(tmp_path):
    color_folder(tmp_path / "images")
    cfg = vit_config(tmp_path, heads={"lda": {"shrinkage": 0.5}, **STREAMING})
    results = run_experiment(cfg, log=quiet)
    state = json.loads((tmp_path / "run" / "seed_3" / "state.json").read_text())
    assert set(state["files"]["streaming"]) == set(STREAMING)
    assert set(state["evaluations"]) == {"lda", *STREAMING}

    # the reference: each head fitted once on the training features of all tasks
    run = _SeedRun(cfg, 3, tmp_path / "run" / "seed_3", quiet)  # features come from the cache
    train_ids = [i for task in run.tasks for i in task.train.ids]
    train_y = torch.tensor([y for task in run.tasks for y in task.train.labels])
    test_ids = [i for task in run.tasks for i in task.test.ids]
    X, X_test = run.features(train_ids), run.features(test_ids)
    for label, params in STREAMING.items():
        expected = REFERENCE[label](**params).fit(X, train_y).predict(X_test).numpy()
        final = state["evaluations"][label][-1]
        np.testing.assert_array_equal(final["y_pred"], expected, err_msg=label)
        last, inc, _ = hand_metrics(state["evaluations"][label], 3)
        assert results["seeds"]["3"][label]["last_acc"] == pytest.approx(last)
        assert results["seeds"]["3"][label]["inc_acc"] == pytest.approx(inc)
    timings = json.loads((tmp_path / "run" / "timings.json").read_text())
    assert set(timings["3"][-1]["heads"]) == {"lda", *STREAMING}
    assert all(timings["3"][-1]["heads"][h]["bytes"] > 0 for h in STREAMING)


@needs_transformers
def test_resume_restores_streaming_heads_exactly(tmp_path):
    color_folder(tmp_path / "images")
    heads = {"ncm": {}, **STREAMING}
    # fp32 pinned: what this checks does not depend on the precision, and "auto" would make
    # it depend on the CPU (resume identity in bf16: tests/cil/test_runner.py)
    full = run_experiment(vit_config(tmp_path, out="full", precision="fp32", heads=heads),
                          log=quiet)

    class Killed(Exception):
        pass

    def kill_after_second_task(seed, t):
        if t == 1:
            raise Killed

    cfg = vit_config(tmp_path, out="killed", precision="fp32", heads=heads)
    with pytest.raises(Killed):
        run_experiment(cfg, log=quiet, on_task_end=kill_after_second_task)
    saved = sorted(p.name for p in (tmp_path / "killed" / "seed_3").glob("head_task*"))
    assert saved == [f"head_task2_{label}.safetensors" for label in sorted(STREAMING)]
    resumed = run_experiment(cfg, resume=True, log=quiet)
    assert resumed == full
    assert ((tmp_path / "killed" / "results.json").read_bytes()
            == (tmp_path / "full" / "results.json").read_bytes())
    # only the last checkpoint's head files remain
    left = sorted(p.name for p in (tmp_path / "killed" / "seed_3").glob("head_task*"))
    assert left == [f"head_task3_{label}.safetensors" for label in sorted(STREAMING)]


@needs_transformers
def test_streaming_heads_report_on_the_uncompensated_track_and_warn_about_drift(tmp_path):
    color_folder(tmp_path / "images")
    messages = []
    cfg = adapting_config(tmp_path, "adapt", heads={"ncm": {}, "acil": STREAMING["acil"]})
    results = run_experiment(cfg, log=messages.append)
    labels = set(results["seeds"]["3"])
    assert {"none/ncm", "hopdc/ncm", "sldc/ncm", "none/acil"} <= labels
    assert not any(label.endswith("/acil") and label != "none/acil" for label in labels)
    assert any("not drift-compensated" in m and "acil" in m for m in messages)
    # one streaming head per seed, whatever the tracks: the run with no compensator agrees
    alone = run_experiment(vit_config(tmp_path, out="alone", strategy=TRAIN_TINY,
                                      heads={"acil": STREAMING["acil"]}), log=quiet)
    assert alone["seeds"]["3"]["acil"] == results["seeds"]["3"]["none/acil"]


def test_streaming_head_configuration_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="heads.ranpac: head 'ranpac' has no parameter"):
        vit_config(tmp_path, heads={"ranpac": {"rank": 3}})
    with pytest.raises(ConfigError, match="heads.acil: head 'acil': .*gamma"):
        vit_config(tmp_path, heads={"acil": {"gamma": -1.0}})
    with pytest.raises(ConfigError, match="unknown head 'ranpack'; known: .*rbf_lda"):
        vit_config(tmp_path, heads={"ranpack": {}})


def test_streaming_heads_change_the_fingerprint_and_keep_the_output_dir(tmp_path):
    a = vit_config(tmp_path, heads={"ncm": {}, "ranpac": {"dim_out": 64}})
    b = vit_config(tmp_path, heads={"ncm": {}, "ranpac": {"dim_out": 128}})
    assert experiment_fingerprint(a) != experiment_fingerprint(b)
    assert output_dir(a) == output_dir(b)
