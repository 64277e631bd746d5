"""``gdacil bench vectors``: class statistics of millions of vectors in three engines, and
``gdacil learn`` of a Parquet file as it grows.

Part 1, engines. Synthetic 768-d vectors (float32, class ``c`` drawn with its own seed) of
``classes`` classes, ``per_class`` each, written as Parquet files of ``block_classes`` classes
(rows shuffled within a file). The class statistics of every file are computed by

- ``one``: one process (:func:`gdacil.learner.vectors.table_statistics`, chunks of 65,536 rows);
- ``torchrun``: the same function under ``torchrun --nproc_per_node 2`` (gloo), each process
  reading half the rows, merged by :func:`gdacil.distributed.all_reduce_stats`; timed inside the
  processes (after the group is up) and as the whole command;
- ``ray``: :func:`gdacil.ray_data.class_statistics` over ``ray.data.read_parquet`` on a local
  Ray cluster of 2 CPUs (started once, not timed).

Each engine's statistics of each file are compared with ``one``'s (largest difference relative
to the largest value: counts, means, scatters). Files are processed one at a time, so memory is
one file's statistics (``block_classes * 768^2 * 8`` bytes) whatever ``classes``; every process
runs one torch thread.

Part 2, ``gdacil learn MODEL --data FILE.parquet`` (a new vectors model, default settings) of
``learn_sizes`` vectors of ``learn_classes`` classes: wall time and peak resident memory of the
command (``/usr/bin/time``), against the statistics' size and one chunk's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)

__all__ = ["main"]

CHUNK = 65_536


def _vectors(classes: range, per_class: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The vectors of ``classes`` (``per_class`` each, class ``c`` from seed ``seed + c``),
    rows shuffled with ``seed``: float32 ``(n, dim)`` and int labels."""
    X = np.empty((len(classes) * per_class, dim), dtype=np.float32)
    for k, c in enumerate(classes):
        g = torch.Generator().manual_seed(seed + c)
        scale = 0.5 + torch.rand(dim, generator=g)
        X[k * per_class:(k + 1) * per_class] = (
            torch.randn(per_class, dim, generator=g) * scale + 3 * torch.randn(dim, generator=g)
        ).numpy()
    y = np.repeat(np.asarray(classes, dtype=np.int64), per_class)
    order = np.random.default_rng(seed).permutation(len(y))
    return X[order], y[order]


def _write_parquet(path: Path, X: np.ndarray, y: np.ndarray) -> None:
    from .._optional import require

    pa = require("pyarrow", feature="the vectors benchmark", install="pip install 'gdacil[ray]'")
    pq = require("pyarrow.parquet", feature="the vectors benchmark",
                 install="pip install 'gdacil[ray]'")

    schema = pa.schema([("vector", pa.list_(pa.float32(), X.shape[1])), ("label", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for s in range(0, len(y), CHUNK):
            part = X[s:s + CHUNK]
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(part.ravel()), X.shape[1])
            writer.write_table(pa.table({"vector": vectors,
                                         "label": [f"c{v}" for v in y[s:s + CHUNK].tolist()]},
                                        schema=schema))


def file_statistics(path) -> tuple:
    """``(statistics, class names)`` of a vectors file by ``table_statistics`` (this process's
    share of it under torchrun, merged)."""
    from ..backbones import build_backbone
    from ..learner.vectors import read_vectors, table_statistics

    table = read_vectors(path)
    stats, _ = table_statistics(table, table.codes, build_backbone("vectors", dim=table.dim))
    return stats, list(table.names or ())


def _worker(paths: list[str], out: str) -> None:
    """``torchrun`` worker: the statistics of each file, timed after the group is up; rank 0
    saves them and the times."""
    from .. import distributed

    torch.set_num_threads(1)
    with distributed.process_group():
        times, saved = [], []
        for k, path in enumerate(paths):
            distributed.barrier()
            start = time.perf_counter()
            stats, names = file_statistics(path)
            distributed.barrier()
            times.append(time.perf_counter() - start)
            if distributed.is_main_process():
                target = Path(out) / f"torchrun-{k}.safetensors"
                _save(stats, names, target)
                saved.append(str(target))
        if distributed.is_main_process():
            (Path(out) / "torchrun.json").write_text(json.dumps({"seconds": times,
                                                                 "files": saved}))


def _save(stats, names, path: Path) -> None:
    from ..state import save_state

    tensors, meta = stats.state_dict()
    save_state(path, (tensors, {**meta, "names": names}))


def _load(path) -> tuple:
    from ..state import load_state
    from ..stats import ClassGaussians

    tensors, meta = load_state(path)
    names = meta.pop("names")
    return ClassGaussians.from_state((tensors, meta)), names


def _difference(found: tuple, reference: tuple) -> float:
    """Largest relative difference of counts, means and scatters (classes matched by name)."""
    (a, names), (b, theirs) = found, reference
    if sorted(names) != sorted(theirs):
        return float("inf")
    at = [names.index(n) for n in theirs]
    return max(float((x[at] - z).abs().max() / z.abs().max())
               for x, z in ((a.counts, b.counts), (a.means, b.means), (a.scatters, b.scatters)))


def engines(cfg, work: Path) -> dict:
    """Part 1 (see the module docstring)."""
    import ray

    from ..ray_data import class_statistics

    torch.set_num_threads(1)
    blocks = [range(s, min(s + cfg.block_classes, cfg.classes))
              for s in range(0, cfg.classes, cfg.block_classes)]
    paths = []
    for k, classes in enumerate(blocks):
        path = work / f"engines-{k}.parquet"
        if not path.exists():
            _write_parquet(path, *_vectors(classes, cfg.per_class, cfg.dim, cfg.seed))
        paths.append(path)
    seconds: dict[str, list[float]] = {"one": [], "ray": []}
    references = []  # saved, not held: memory stays one file's statistics
    for k, path in enumerate(paths):
        start = time.perf_counter()
        stats, names = file_statistics(path)
        seconds["one"].append(time.perf_counter() - start)
        references.append(work / f"one-{k}.safetensors")
        _save(stats, names, references[-1])
        del stats
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2", "-m", "gdacil.bench.vectors", "--worker", str(work),
                    *map(str, paths)], env=env, check=True)
    torchrun_wall = time.perf_counter() - start
    inside = json.loads((work / "torchrun.json").read_text())
    seconds["torchrun"] = inside["seconds"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    differences: dict[str, float] = {"torchrun": 0.0, "ray": 0.0}
    try:
        for path, saved_one, saved in zip(paths, references, inside["files"]):
            start = time.perf_counter()
            found = class_statistics(ray.data.read_parquet(str(path), override_num_blocks=4))
            seconds["ray"].append(time.perf_counter() - start)
            reference = _load(saved_one)
            differences["ray"] = max(differences["ray"], _difference(found, reference))
            differences["torchrun"] = max(differences["torchrun"],
                                          _difference(_load(saved), reference))
    finally:
        ray.shutdown()
    n = cfg.classes * cfg.per_class
    totals = {k: sum(v) for k, v in seconds.items()}
    return {"vectors": n, "files": len(paths), "seconds": totals,
            "seconds_per_file": seconds, "torchrun_command_seconds": torchrun_wall,
            "vectors_per_second": {k: n / t for k, t in totals.items()},
            "speedup_vs_one": {k: totals["one"] / t for k, t in totals.items()},
            "max_relative_difference_vs_one": differences,
            "statistics_bytes_per_file": cfg.block_classes * (cfg.dim ** 2 + cfg.dim + 1) * 8}


def learns(cfg, work: Path) -> list[dict]:
    """Part 2 (see the module docstring)."""
    rows = []
    for n in cfg.learn_sizes:
        per_class = n // cfg.learn_classes
        path = work / f"learn-{n}.parquet"
        if not path.exists():
            _write_parquet(path, *_vectors(range(cfg.learn_classes), per_class, cfg.dim,
                                           cfg.seed + 7))
        model = work / f"model-{n}"
        subprocess.run(["rm", "-rf", str(model)], check=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "gdacil", "learn",
                               str(model), "--data", str(path)], env=env, capture_output=True,
                              text=True, check=True)
        peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        elapsed = re.search(r"Elapsed \(wall clock\) time .*: ([\d:.]+)", done.stderr)
        assert peak is not None and elapsed is not None, done.stderr  # GNU time's report
        peak_kib, wall = int(peak.group(1)), elapsed.group(1)
        seconds = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
        print(done.stdout.strip())
        rows.append({"vectors": per_class * cfg.learn_classes, "classes": cfg.learn_classes,
                     "seconds": seconds, "peak_rss_mib": peak_kib / 1024,
                     "file_mib": path.stat().st_size / 2 ** 20})
    return rows


def render(payload: dict) -> str:
    e, cfg = payload["engines"], payload["config"]
    small, large = payload["learns"][0], payload["learns"][-1]
    extra = large["peak_rss_mib"] - small["peak_rss_mib"]
    growth = (large["vectors"] / small["vectors"], extra,
              extra * 2**20 / max(large["vectors"] - small["vectors"], 1))
    lines = [
        "# Vectors at scale: class statistics in three engines, `gdacil learn` of Parquet",
        "",
        f"Machine: {payload['machine_name']} ({payload['machine']['platform']}), torch "
        f"{payload['machine']['torch']}, one torch thread per process. Command: "
        f"`{payload['command']}`.",
        "",
        f"## Statistics of {e['vectors']:,} vectors ({cfg['dim']}-d, {cfg['classes']:,} classes)",
        "",
        f"{e['files']} Parquet files of {cfg['block_classes']} classes each, one at a time "
        f"(statistics of one file: {e['statistics_bytes_per_file'] / 2**20:.0f} MiB).",
        "",
        markdown_table(
            ["engine", "seconds", "vectors/s", "speed-up vs one process",
             "max relative difference vs one process"],
            [[k, f"{e['seconds'][k]:.1f}", f"{e['vectors_per_second'][k]:,.0f}",
              f"{e['speedup_vs_one'][k]:.2f}",
              "-" if k == "one" else f"{e['max_relative_difference_vs_one'][k]:.1e}"]
             for k in ("one", "torchrun", "ray")]),
        f"torchrun timed inside its processes; the whole command (process start, group setup) "
        f"took {e['torchrun_command_seconds']:.1f} s. Ray's cluster start is not timed."
        + (f" This part was measured by an earlier run: `{payload['engines_command']}`."
           if "engines_command" in payload else ""),
        "",
        f"## `gdacil learn` of a Parquet file ({cfg['dim']}-d, {cfg['learn_classes']} classes)",
        "",
        markdown_table(["vectors", "file MiB", "seconds", "peak RSS MiB"],
                       [[f"{r['vectors']:,}", f"{r['file_mib']:.0f}", f"{r['seconds']:.1f}",
                         f"{r['peak_rss_mib']:.0f}"] for r in payload["learns"]]),
        f"Statistics of {cfg['learn_classes']} classes: "
        f"{payload['learn_statistics_mib']:.0f} MiB; one chunk of 65,536 float64 vectors: "
        f"{65_536 * cfg['dim'] * 8 / 2**20:.0f} MiB; calibration records kept: at most "
        "20,000 (123 MiB). Peak RSS is the whole process (Python, torch, pyarrow, the head and "
        "its calibration refits, and the transient chunk-sized copies "
        "`ClassGaussians.update` makes: centred rows and their reordering); from the smallest "
        f"file to the largest ({growth[0]:.0f} times the vectors) it grew by "
        f"{growth[1]:.0f} MiB, about {growth[2]:.0f} bytes per vector (each row's label and "
        "class id are kept; its vector is not).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench vectors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--per-class", type=int, default=2000)
    parser.add_argument("--block-classes", type=int, default=50)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--learn-sizes", type=int, nargs="+",
                        default=[125_000, 250_000, 500_000, 1_000_000])
    parser.add_argument("--learn-classes", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, help="where the Parquet files go (kept, reused)")
    parser.add_argument("--machine", default="", help="the machine, in words, for the report")
    parser.add_argument("--engines-from", type=Path, metavar="JSON",
                        help="take part 1 from an earlier run's vectors.json (run part 2 only)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    output_arguments(parser, "vectors", "vectors.json and vectors.md")
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args.worker[1:], args.worker[0])
        return 0
    refuse_to_overwrite(parser, args, "vectors.json", "vectors.md")
    work = args.work or args.out / "data"
    work.mkdir(parents=True, exist_ok=True)
    payload = {"config": {k: getattr(args, k) for k in ("classes", "per_class", "block_classes",
                                                        "dim", "learn_sizes", "learn_classes",
                                                        "seed")},
               "machine": machine_info(), "machine_name": args.machine,
               "command": "python -m gdacil bench vectors " + " ".join(argv or sys.argv[1:]),
               "learn_statistics_mib": args.learn_classes * (args.dim ** 2 + args.dim + 1) * 8
               / 2 ** 20}
    if args.engines_from is not None:
        earlier = json.loads(args.engines_from.read_text())
        payload["engines"] = earlier["engines"]
        payload["engines_command"] = earlier["command"]
    else:
        payload["engines"] = engines(args, work)
    print(json.dumps(payload["engines"], indent=2))
    payload["learns"] = learns(args, work)
    args.out.mkdir(parents=True, exist_ok=True)
    write_report(args.out, "vectors", payload, render(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
