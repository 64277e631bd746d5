"""``gdacil bench sharded``: LR-RGDA with its classes split over 1, 2 and 4 processes.

For each class count ``C`` and process count ``W``, ``torchrun`` starts ``W`` gloo processes on
this machine. Each takes the classes :meth:`~gdacil.heads.ShardedHead.assign` gives it (the
least-loaded rank: ``C / W`` each), compresses their synthetic covariances into
:class:`~gdacil.LowRankGaussians` (the synthetic classes of ``gdacil bench scale``: d = 768,
rank 64, exact eigenpairs) and fits its shard of ``ShardedHead(LRRGDA(rank=64))``. Then every rank answers the same
``queries``: top-5 and argmax, merged exactly over the ranks. Reported per ``W``: statistics and
head bytes per rank, peak RSS per rank, fit seconds and queries per second, and whether the
top-5 lists equal those of one process. The ranks share this machine's cores, so throughput
with more processes than cores measures the merge's overhead, not a speed-up; the memory per
rank is the point.

Regenerate with ``python -m gdacil bench sharded --out benchmarks --overwrite`` (writes
``sharded.json`` and ``sharded.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)
from .scale import ScaleBenchConfig, SyntheticClasses, SyntheticMoments, _compress, _peak_rss

__all__ = ["QUICK", "ShardedBenchConfig", "main", "render", "run"]


@dataclass
class ShardedBenchConfig:
    classes: tuple[int, ...] = (1000,)
    worlds: tuple[int, ...] = (1, 2, 4)
    dim: int = 768
    rank: int = 64
    queries: int = 256
    k: int = 5
    seed: int = 0


QUICK = ShardedBenchConfig(classes=(40,), worlds=(1, 2), dim=32, rank=4, queries=16)


def _synthetic(cfg: ShardedBenchConfig) -> SyntheticClasses:
    scale = ScaleBenchConfig()
    return SyntheticClasses(replace(scale, dim=cfg.dim, rank=cfg.rank, seed=cfg.seed,
                                    true_rank=min(scale.true_rank, cfg.dim)))


def worker(C: int, cfg: ShardedBenchConfig, out: Path) -> None:
    """One rank's part (under torchrun): build its shard, answer the queries, report."""
    from .. import distributed
    from ..heads import LRRGDA, ShardedHead
    from ..stats import LowRankGaussians

    me = distributed.rank()
    classes = _synthetic(cfg)
    sharded = ShardedHead(LRRGDA(rank=cfg.rank))
    mine = [c for c, r in zip(range(C), sharded.assign(range(C))) if r == me]
    start = time.perf_counter()
    stats = LowRankGaussians(cfg.dim, cfg.rank)  # exact top-q eigenpairs (eigh)
    _compress(stats, SyntheticMoments(classes.cfg), mine, 64)
    compress_s = time.perf_counter() - start
    start = time.perf_counter()
    sharded.fit(stats)
    fit_s = time.perf_counter() - start
    g = torch.Generator().manual_seed(cfg.seed)
    queries = classes.sample(torch.randint(0, C, (cfg.queries,), generator=g), g)
    sharded.top_k(queries[:8], cfg.k)  # warm-up
    start = time.perf_counter()
    _, labels = sharded.top_k(queries, cfg.k)
    top_k_s = time.perf_counter() - start
    start = time.perf_counter()
    sharded.predict(queries)
    predict_s = time.perf_counter() - start
    head_bytes = sum(sharded.memory_report().values())
    mine_row = torch.tensor([[len(mine), stats.nbytes, head_bytes, _peak_rss(), compress_s,
                              fit_s, top_k_s, predict_s]], dtype=torch.float64)
    rows = distributed.all_gather_rows(mine_row)
    if me == 0:
        keys = ("classes", "stats_bytes", "head_bytes", "peak_rss_bytes", "compress_s", "fit_s",
                "top_k_s", "predict_s")
        ranks = [dict(zip(keys, r)) for r in rows.tolist()]
        out.write_text(json.dumps({"ranks": ranks, "top_k_labels": labels.tolist()}))


def _launch(C: int, W: int, cfg: ShardedBenchConfig, folder: Path) -> dict:
    out = folder / f"C{C}-W{W}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(W), "-m", "gdacil.bench.sharded", "--worker", str(C), str(out),
           json.dumps(asdict(cfg))]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"C = {C}, W = {W} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(out.read_text())


def run(cfg: ShardedBenchConfig, log=print) -> dict:
    cells = []
    with tempfile.TemporaryDirectory(prefix="gdacil-bench-sharded-") as tmp:
        for C in cfg.classes:
            reference = None
            for W in cfg.worlds:
                got = _launch(C, W, cfg, Path(tmp))
                labels = got.pop("top_k_labels")
                reference = labels if reference is None else reference
                ranks = got["ranks"]
                cell = {"classes": C, "world": W, "ranks": ranks,
                        "same_top_k_as_first": labels == reference,
                        "max_stats_head_bytes": max(r["stats_bytes"] + r["head_bytes"]
                                                    for r in ranks),
                        "max_peak_rss_bytes": max(r["peak_rss_bytes"] for r in ranks),
                        "fit_s": max(r["fit_s"] for r in ranks),
                        "top_k_per_s": cfg.queries / ranks[0]["top_k_s"],
                        "predict_per_s": cfg.queries / ranks[0]["predict_s"]}
                log(f"C = {C}, W = {W}: {cell['max_stats_head_bytes'] / 2**20:.0f} MiB of "
                    f"statistics and head per rank, peak RSS "
                    f"{cell['max_peak_rss_bytes'] / 2**20:.0f} MiB, top-{cfg.k} "
                    f"{cell['top_k_per_s']:.0f}/s, same top-{cfg.k}: "
                    f"{cell['same_top_k_as_first']}")
                cells.append(cell)
    return {"benchmark": "sharded", "config": asdict(cfg), "machine": machine_info(),
            "cells": cells}


def render(payload: dict) -> str:
    cfg = payload["config"]
    rows = [[c["classes"], c["world"], f"{c['max_stats_head_bytes'] / 2**20:.0f}",
             f"{c['max_peak_rss_bytes'] / 2**20:.0f}", f"{c['fit_s']:.2f}",
             f"{c['top_k_per_s']:.0f}", f"{c['predict_per_s']:.0f}",
             "yes" if c["same_top_k_as_first"] else "NO"] for c in payload["cells"]]
    table = markdown_table(["classes", "processes", "stats + head per rank (MiB)",
                            "peak RSS per rank (MiB)", "fit s", f"top-{cfg['k']} queries/s",
                            "argmax queries/s", f"top-{cfg['k']} equal to 1 process"], rows)
    return "\n".join(["# LR-RGDA with its classes sharded over processes", "",
                      " ".join(__doc__.split("\n\n")[1].split()), "",
                      f"d = {cfg['dim']}, rank {cfg['rank']}, {cfg['queries']} queries; "
                      f"{payload['machine']['cpu_count']} cores, one torch thread per process.",
                      "", table, ""])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        from .. import distributed

        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in json.loads(argv[3]).items()}
        cfg = ShardedBenchConfig(**fields)
        with distributed.process_group("cpu"):
            worker(int(argv[1]), cfg, Path(argv[2]))
        return 0
    parser = argparse.ArgumentParser(prog="gdacil bench sharded", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="40 classes at d = 32 (for tests)")
    parser.add_argument("--classes", type=int, nargs="+", help="class counts")
    parser.add_argument("--worlds", type=int, nargs="+", help="process counts")
    output_arguments(parser, "sharded", "sharded.json and sharded.md")
    args = parser.parse_args(argv)
    refuse_to_overwrite(parser, args, "sharded.json", "sharded.md")
    cfg = QUICK if args.quick else ShardedBenchConfig()
    if args.classes:
        cfg = replace(cfg, classes=tuple(args.classes))
    if args.worlds:
        cfg = replace(cfg, worlds=tuple(args.worlds))
    payload = run(cfg, log=lambda line: print(line, flush=True))
    write_report(args.out, "sharded", payload, render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
