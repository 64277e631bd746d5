"""The strategies benchmark: its runs are valid experiments, and its summary reads their results."""

import json
from pathlib import Path

import pytest

from gdacil.bench import strategies as bench
from gdacil.cil import load_config
from gdacil.cil.runner import anchor_subset
from gdacil.cli import resolve_config


def _config(run):
    return load_config(resolve_config(bench.BASE_CONFIG), run.overrides)


def test_every_planned_run_is_a_valid_experiment(tmp_path):
    cfg = bench.StrategiesBenchConfig()
    runs = bench.plan_runs(cfg, tmp_path)
    names = [r.name for r in runs]
    assert len(names) == len(set(names)) == 8 + 4 + 3 + 1
    assert names[:8] == [f"{s}-seed1993" for s in bench.ALL_STRATEGIES] and names[-1] == "hopdc-sensitivity"
    assert {"seqft-seed1995", "lora_seqkd-seed1994", "hopdc-sensitivity"} <= set(names)
    for run in runs:
        exp = _config(run)
        assert exp.output_dir == str(tmp_path / "runs" / run.name)
        assert exp.threads == cfg.threads and exp.protocol.test_cap == cfg.test_cap
        if run.name == "hopdc-sensitivity":
            assert list(exp.heads) == ["lr_rgda"] and exp.anchors.n == 1024
            assert {exp.track_anchors(t) for t in exp.compensators} == {None, 0, 64, 256, 1024}
            assert len(exp.compensators) == 2 + len(cfg.tau) + len(cfg.topk) + len(cfg.n_anchors)
            assert exp.compensators["k=all"].params["topk"] is None
            continue
        if run.name.startswith("hopdc-moments"):
            assert list(exp.heads) == ["lr_rgda"]
            assert exp.drift_diagnostics == (run.name == "hopdc-moments-seed1993")
            assert exp.compensators["hopdc_matched"].params["match_moments"] is True
            assert exp.build_strategy().config.name == "seqft"
            continue
        strategy = run.name.split("-seed")[0]
        built = exp.build_strategy().config
        assert built.name == strategy and built.train.steps == cfg.steps
        lora = strategy.startswith("lora") or strategy == "randproj"
        assert built.train.lr == bench.STEP_OVERRIDES["lora" if lora else "full"]["lr"]
        assert set(exp.compensators) == set(bench.TRACKS) and set(exp.heads) == set(bench.HEADS)
        assert exp.anchors.n == cfg.anchors
        assert exp.drift_diagnostics == (run.name == "seqft-seed1993")
        assert exp.backbone.projection_dim == (cfg.projection_dim if strategy == "randproj" else None)


def test_track_anchor_counts_are_validated():
    run = bench.plan_runs(bench.StrategiesBenchConfig(), Path("/tmp/x"))[0]
    with pytest.raises(ValueError, match="anchors must be an integer from 0 to anchors.n"):
        load_config(resolve_config(bench.BASE_CONFIG), [
            *run.overrides, "anchors.n=10", "compensators={h: {name: hopdc, anchors: 11}}"])


def test_anchor_subsets_are_nested_and_seeded():
    small, large = anchor_subset(100, 10, seed=3), anchor_subset(100, 40, seed=3)
    assert set(small.tolist()) <= set(large.tolist()) and len(set(large.tolist())) == 40
    assert small.tolist() == sorted(small.tolist())
    assert anchor_subset(100, 10, seed=3).equal(small)
    assert not anchor_subset(100, 10, seed=4).equal(small)


def _fake_results(out, name, seed, tracks, heads, base):
    per = {f"{t}/{h}": {"last_acc": base + 0.01 * i, "inc_acc": base + 0.1}
           for i, (t, h) in enumerate((t, h) for t in tracks for h in heads)}
    run_dir = out / "runs" / name
    run_dir.mkdir(parents=True)
    payload = {"seeds": {str(seed): per}}
    if name in ("seqft-seed1993", "hopdc-moments-seed1993"):
        compensated = sorted(t for t in tracks if t != "none")
        payload["drift_diagnostics"] = {str(seed): [
            {"task": t, **{track: {"mean_rel_error": e, "cov_rel_error": 2 * e, "w2": 3 * e,
                                   "identity": {"mean_rel_error": 9.0, "cov_rel_error": 9.0,
                                                "w2": 9.0}}
                           for track, e in zip(compensated, (t, 2 * t, 3 * t))}}
            for t in (1, 2)]}
    (run_dir / "results.json").write_text(json.dumps(payload))


def test_summary_averages_seeds_and_renders_every_table(tmp_path):
    cfg = bench.StrategiesBenchConfig(strategies=("frozen", "seqft"),
                                      extra_seeds={"seqft": (1994,)}, moment_seeds=(1993, 1994))
    walls = {}
    for run in bench.plan_runs(cfg, tmp_path):
        seed = int(run.name.rsplit("seed", 1)[1]) if "-seed" in run.name else 1993
        if run.name == "hopdc-sensitivity":
            _fake_results(tmp_path, run.name, seed, bench.sensitivity_tracks(cfg), ["lr_rgda"], 0.5)
        elif run.name.startswith("hopdc-moments"):
            _fake_results(tmp_path, run.name, seed, bench.MOMENT_TRACKS, ["lr_rgda"],
                          0.4 if seed == 1993 else 0.5)
        else:
            _fake_results(tmp_path, run.name, seed, bench.TRACKS, bench.HEADS,
                          0.6 if seed == 1993 else 0.7)
        walls[run.name] = {"wall_s": 120.0}
    walls["frozen-seed1993"] = {"wall_s": None}     # finished before walls were recorded
    summary = bench.summarize(cfg, tmp_path, walls)
    seqft = summary["strategies"]["seqft"]
    assert seqft["cells"]["none/lda"]["last_acc"]["mean"] == pytest.approx(0.65)
    assert seqft["cells"]["none/lda"]["last_acc"]["n"] == 2
    assert seqft["drift"]["hopdc"]["mean_mean_rel_error"] == 1.5
    assert seqft["drift"]["sldc"]["last_w2"] == 12.0 and seqft["drift"]["none"]["last_w2"] == 9.0
    assert summary["strategies"]["frozen"]["drift"] is None
    text = bench.render(summary)
    assert "| seqft | 2 | 65.00 ±" in text and "| frozen | 1 | 60.00 |" in text
    assert "| tau=0.01 |" in text and "| k=all |" in text and "| N=0 |" in text
    assert "| default |" in text
    assert "| frozen | not recorded |" in text and "| seqft | 2.0, 2.0 |" in text
    moments = summary["moments"]
    assert moments["seeds"] == [1993, 1994] and moments["drift_seed"] == 1993
    assert moments["cells"]["hopdc_matched"]["last_acc"]["mean"] == pytest.approx(0.48)
    assert moments["drift"]["hopdc_matched"]["last_cov_rel_error"] == 8.0
    assert "| hopdc_matched | 48.00 ±" in text and "| 4 | 8 | 6 |" in text
    bench.plot(summary, tmp_path)
    assert (tmp_path / "strategies.png").stat().st_size > 0
    assert (tmp_path / "hopdc_sensitivity.png").stat().st_size > 0


def test_summary_of_a_stopped_benchmark_lists_the_missing_runs(tmp_path):
    cfg = bench.StrategiesBenchConfig(strategies=("frozen", "seqft"),
                                      extra_seeds={"seqft": (1994,)}, moment_seeds=(1993,))
    _fake_results(tmp_path, "frozen-seed1993", 1993, bench.TRACKS, bench.HEADS, 0.6)
    summary = bench.run(cfg, tmp_path, log=lambda *_: None, summarize_only=True)
    assert list(summary["strategies"]) == ["frozen"]
    assert summary["missing_runs"] == ["seqft-seed1993", "seqft-seed1994", "hopdc-sensitivity",
                                       "hopdc-moments-seed1993"]
    assert "`seqft-seed1994`" in (tmp_path / "strategies.md").read_text()


def test_single_seed_drops_every_extra_seed(monkeypatch):
    seen = {}
    monkeypatch.setattr(bench, "run", lambda cfg, out, **kw: seen.update(cfg=cfg, **kw))
    bench.main(["--single-seed", "--summarize-only", "--strategies", "seqft"])
    cfg = seen["cfg"]
    assert cfg.extra_seeds == {} and cfg.moment_seeds == (1993,) and seen["summarize_only"]
    names = [r.name for r in bench.plan_runs(cfg, Path("/tmp/x"))]
    assert names == ["seqft-seed1993", "hopdc-moments-seed1993", "hopdc-sensitivity"]


def test_every_planned_image_run_is_a_valid_experiment(tmp_path):
    from gdacil.bench import strategies_images as images

    cfg = images.ImageStrategiesConfig()
    planned = images.plan_runs(cfg, tmp_path)
    names = [r.name for _, r in planned]
    assert len(names) == len(set(names)) == 2 * (4 + 2 + 2) + 2
    assert names[:2] == ["openclipart-seqft-seed1993", "cifar10-seqft-seed1993"]
    assert names[-2:] == ["openclipart-tables", "cifar10-tables"]
    for dataset, run in planned:
        base = tmp_path / f"{dataset}.yaml"
        base.write_text(json.dumps(images.base_config(cfg, dataset)))
        exp = load_config(base, run.overrides)
        assert exp.protocol.datasets == (dataset,) and exp.anchors.dataset == "caltech101"
        assert exp.backbone.name == "dinov2-imgfocus" and exp.backbone.options == {"size": 112}
        if run.name.endswith("-tables"):
            assert list(exp.heads) == ["lr_rgda"] and exp.anchors.n == 2048
            assert {exp.track_anchors(t) for t in exp.compensators} == {None, 256, 512, 1024, 2048}
            continue
        assert set(exp.compensators) == {"none", "sldc", "hopdc", "hopdc_paper",
                                         "hopdc_noshrink"}
        assert exp.compensators["hopdc"].defaults is None  # gdacil's default HopDC
        assert exp.build_compensator("hopdc_noshrink").shrink is False
        built = exp.build_strategy().config
        assert built.train.steps == cfg.steps and built.train.augment == "auto"


def test_the_image_summary_follows_the_schema(tmp_path):
    from gdacil.bench import strategies_images as images

    cfg = images.ImageStrategiesConfig(datasets=("cifar10",), strategies=("seqft",),
                                       extra_seeds={})
    planned = images.plan_runs(cfg, tmp_path)
    _fake_results(tmp_path, "cifar10-seqft-seed1993", 1993,
                  {**images.TRACKS, **images.EXTRA_TRACKS}, images.HEADS, 0.5)
    _fake_results(tmp_path, "cifar10-tables", 1993, images.table_tracks(), ["lr_rgda"], 0.4)
    summary = images.summarize(cfg, tmp_path, planned, {})
    assert len(summary["runs"]) == 12 and summary["missing_runs"] == []
    row = summary["runs"][0]
    assert row == {"dataset": "cifar10", "backbone": "dinov2-imgfocus", "strategy": "seqft",
                   "seed": 1993, "compensator": "none", "head": "lda", "last_acc": 50.0,
                   "inc_acc": 60.0}
    assert {(r["compensator"], r["n"]) for r in summary["anchors_n"]} == {
        ("none", 0), *((c, n) for c in ("hopdc_paper", "sldc") for n in images.ANCHORS_N)}
    assert [r["tau"] for r in summary["tau"]] == list(images.TAUS)
    assert [r["topk"] for r in summary["topk"]] == list(images.TOPKS)
    # the default's variants are kept apart: the runs hold the schema's four compensators
    assert {r["compensator"] for r in summary["runs"]} == set(images.TRACKS)
    assert {r["compensator"] for r in summary["extra_runs"]} == {"hopdc_noshrink"}
    assert len(summary["extra_runs"]) == 3
    report = images.render(summary)
    assert "| cifar10 | seqft | hopdc |" in report
    assert "| dataset | strategy | hopdc | hopdc_noshrink |" in report
