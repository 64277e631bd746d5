"""``gdacil bench drift``: wall time, CPU time and peak memory of every drift compensator.

Each compensator is fitted on ``N`` anchor pairs and transforms the statistics of ``C`` classes
in ``d`` dimensions (synthetic, from :func:`gdacil.drift.synthetic.sphere_drift_problem`: class
covariances of rank 64 plus a ridge, features on the sphere of radius ``sqrt(d)``). Every cell
runs in its own Python process (``--inline`` runs them in this one), so one cell's allocations
cannot hide in another's numbers.

What is measured, per cell:

- ``fit_s``, ``transform_s``: wall-clock seconds of ``fit`` and of ``transform``; ``cpu_s``: the
  process CPU time (user + system) of both, which a busy machine inflates less than wall time.
- ``peak_mib``: the peak resident set size (RSS) during ``fit`` + ``transform``, minus the RSS just
  before, in MiB. On Linux the kernel's RSS high-water mark is reset right before ``fit``
  (``/proc/self/clear_refs``), so this is the extra memory the compensator really touched: its
  working memory plus its output, a new ``ClassGaussians`` as large as the input (``stats_mib``).
  Where the reset is unavailable the high-water mark of the whole process is used
  (``memory_method`` says which). On CUDA, ``torch.cuda.max_memory_allocated`` is reported too.

Worker processes run with ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already: on a busy
machine with few cores, OpenMP threads that spin while waiting for a descheduled sibling made
small-matrix work (the weak SLDC training steps) four times slower in wall time and six times
costlier in CPU time than the computation itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from ..drift import build_compensator
from ..drift.synthetic import sphere_drift_problem
from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)

__all__ = ["QUICK", "DriftBenchConfig", "main", "measure_cell", "render", "run"]


@dataclass
class DriftBenchConfig:
    classes: tuple[int, ...] = (100, 300, 1000)
    anchors: tuple[int, ...] = (256, 1024, 4096)
    dim: int = 768
    compensators: tuple[str, ...] = ("identity", "sdc", "sldc_linear", "sldc_weak", "hopdc")
    hopdc_samples: int = 2000      # HopDC default M
    hopdc_topk: int = 400          # clamped to N for N < 400 (HopDC would warn and use all N)
    weak_samples: int = 5000       # weak-nonlinear SLDC default M
    weak_steps: int = 4000         # weak-nonlinear SLDC default training steps
    isolate: bool = True           # one subprocess per cell
    device: str = "cpu"
    threads: int | None = None     # torch threads per cell (None: torch's default)
    seed: int = 0
    overrides: dict = field(default_factory=dict)  # {"C": {"hopdc_samples": ...}} per class count


QUICK = DriftBenchConfig(classes=(6,), anchors=(64,), dim=32, hopdc_samples=64, weak_samples=64,
                         weak_steps=20)


def compensator_config(name: str, cfg: DriftBenchConfig, classes: int, anchors: int) -> dict:
    o = {**asdict(cfg), **cfg.overrides.get(str(classes), {})}
    if name == "hopdc":
        return {"n_samples": o["hopdc_samples"], "topk": min(o["hopdc_topk"], anchors)}
    if name == "sldc_weak":
        return {"n_samples": o["weak_samples"], "steps": o["weak_steps"]}
    return {}


# ------------------------------------------------------------------------------ one cell


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    # ru_maxrss is in KiB on Linux (bytes on macOS, where the reset is unavailable anyway)
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure_cell(cell: dict) -> dict:
    """Fit and transform one compensator on one synthetic problem; return the measurements."""
    device = torch.device(cell["device"])
    if cell.get("threads"):
        torch.set_num_threads(cell["threads"])
    prob = sphere_drift_problem(cell["classes"], cell["anchors"], cell["dim"],
                                samples_per_class=None, seed=cell["seed"])
    stats = prob.stats.to(device)
    old, new = prob.old_anchors.to(device), prob.new_anchors.to(device)
    comp = build_compensator(cell["compensator"], **cell["config"])
    del prob
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        cuda_before = torch.cuda.memory_allocated(device)
    rss_before = _rss_bytes()
    reset = _reset_peak_rss()
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    comp.fit(old, new)
    if cuda:
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    out = comp.transform(stats)
    if cuda:
        torch.cuda.synchronize(device)
    t2, cpu1 = time.perf_counter(), _cpu_seconds()
    peak = _peak_rss_bytes()
    result = {
        **cell,
        "fit_s": t1 - t0,
        "transform_s": t2 - t1,
        "total_s": t2 - t0,
        "cpu_s": cpu1 - cpu0,
        "peak_mib": max(peak - rss_before, 0) / 2**20,
        "memory_method": "rss high-water mark reset before fit" if reset
        else "process rss high-water mark (not reset)",
        "stats_mib": stats.nbytes / 2**20,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        "loadavg_1min": os.getloadavg()[0],
    }
    if cuda:
        result["cuda_peak_mib"] = (torch.cuda.max_memory_allocated(device) - cuda_before) / 2**20
    del out
    return result


def _run_isolated(cell: dict, timeout: float | None) -> dict:
    cmd = [sys.executable, "-m", "gdacil.bench.drift", "--worker", json.dumps(cell)]
    env = {**os.environ}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env=env)
    except subprocess.TimeoutExpired:
        return {**cell, "error": f"timed out after {timeout} s"}
    if proc.returncode != 0:
        return {**cell, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(cfg: DriftBenchConfig, *, log=print, timeout: float | None = None) -> dict:
    results = []
    for C in cfg.classes:
        for N in cfg.anchors:
            for name in cfg.compensators:
                cell = {"compensator": name, "config": compensator_config(name, cfg, C, N),
                        "classes": C, "anchors": N, "dim": cfg.dim, "device": cfg.device,
                        "threads": cfg.threads, "seed": cfg.seed}
                row = _run_isolated(cell, timeout) if cfg.isolate else measure_cell(cell)
                results.append(row)
                log(_summary(row))
    return {"config": asdict(cfg), "machine": machine_info(), "results": results}


def _summary(r: dict) -> str:
    head = f"{r['compensator']:12s} C={r['classes']:5d} N={r['anchors']:5d}"
    if "error" in r:
        return f"{head}  ERROR {r['error']}"
    return (f"{head}  fit {r['fit_s']:8.2f}s  transform {r['transform_s']:8.2f}s  "
            f"cpu {r['cpu_s']:8.2f}s  peak {r['peak_mib']:8.1f} MiB  "
            f"(load {r['loadavg_1min']:.1f})")


# ------------------------------------------------------------------------------- output


def _m(r: dict) -> str:
    return str(r["config"].get("n_samples", ""))


def render(payload: dict) -> str:
    res = [r for r in payload["results"] if "error" not in r]
    rows = [[r["compensator"], r["classes"], r["anchors"], _m(r), r["config"].get("topk", ""),
             f"{r['fit_s']:.2f}", f"{r['transform_s']:.2f}", f"{r['total_s']:.2f}",
             f"{r['cpu_s']:.2f}", f"{r['peak_mib']:.0f}", f"{r['stats_mib']:.0f}",
             f"{r['loadavg_1min']:.1f}"]
            for r in res]
    table = markdown_table(["compensator", "C", "N", "M", "k", "fit (s)", "transform (s)",
                            "total (s)", "CPU (s)", "peak extra RSS (MiB)", "stats (MiB)",
                            "load"], rows)
    cfg, m = payload["config"], payload["machine"]
    anchors = sorted({r["anchors"] for r in res})
    pivot = markdown_table(
        ["compensator", "C"] + [f"N={n}" for n in anchors],
        [[name, C] + [next((f"{r['total_s']:.1f}" for r in res if r["compensator"] == name
                            and r["classes"] == C and r["anchors"] == n), "") for n in anchors]
         for name in cfg["compensators"] for C in cfg["classes"]],
    )
    errors = [r for r in payload["results"] if "error" in r]
    err_lines = "".join(f"- {r['compensator']} C={r['classes']} N={r['anchors']}: {r['error']}\n"
                        for r in errors)
    loads = [r["loadavg_1min"] for r in res]
    return (
        "# Drift-compensation benchmark\n\n"
        f"Command: `{payload.get('command', 'gdacil bench drift')}`\n\n"
        f"Machine: {payload.get('cpu_model') or m['processor']}, {m['cpu_count']} CPUs, "
        f"torch {m['torch']} with {res[0]['torch_threads'] if res else m['torch_threads']} "
        f"threads (OMP_WAIT_POLICY {res[0]['omp_wait_policy'] if res else '?'}), "
        f"device `{cfg['device']}`. "
        f"1-minute load average during the cells: {min(loads, default=0):.1f} to "
        f"{max(loads, default=0):.1f} (a shared machine: CPU time is the steadier figure).\n\n"
        f"d = {cfg['dim']}; synthetic statistics (covariances of rank min(d, 64) plus a ridge, "
        "float64); HopDC in float32 attention with float64 re-estimation; M = pseudo-samples per "
        "class, "
        "k = HopDC's top-k (clamped to N; HopDC itself warns and uses all N anchors).\n\n"
        "`peak extra RSS`: peak resident memory during fit + transform above the resident memory "
        "just before (the high-water mark is reset before fit), which includes the output "
        "statistics (as large as `stats`). `CPU`: process user + system time. `load`: the "
        f"machine's 1-minute load average at the end of the cell (above {m['cpu_count']}, the "
        "number of CPUs, other work was competing).\n\n"
        "## Total wall time (s), fit + transform\n\n" + pivot
        + "\n## All measurements\n\n" + table
        + (f"\n## Cells that did not finish\n\n{err_lines}" if errors else "")
    )


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench drift", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny grid (seconds), for smoke tests")
    output_arguments(parser, "drift", "drift.json and drift.md")
    parser.add_argument("--classes", type=int, nargs="+", help="class counts C (100 300 1000)")
    parser.add_argument("--anchors", type=int, nargs="+", help="anchor counts N (256 1024 4096)")
    parser.add_argument("--dim", type=int, help="feature dimension d (768)")
    parser.add_argument("--compensators", nargs="+", help="registry names (all but oracle)")
    parser.add_argument("--hopdc-samples", type=int, help="HopDC pseudo-samples per class (2000)")
    parser.add_argument("--weak-samples", type=int,
                        help="weak SLDC pseudo-samples per class (5000)")
    parser.add_argument("--weak-steps", type=int, help="weak SLDC training steps (4000)")
    parser.add_argument("--override", action="append", default=[], metavar="C:KEY=VALUE",
                        help="per class count, e.g. 1000:weak_samples=2000 (repeatable)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, help="torch threads per cell (torch's default)")
    parser.add_argument("--inline", action="store_true", help="run every cell in this process")
    parser.add_argument("--timeout", type=float, help="seconds allowed per cell (isolated runs)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure_cell(json.loads(args.worker))))
        return 0
    refuse_to_overwrite(parser, args, "drift.json", "drift.md")
    cfg = QUICK if args.quick else DriftBenchConfig()
    cfg = DriftBenchConfig(**asdict(cfg))
    for key in ("classes", "anchors", "compensators"):
        if getattr(args, key):
            setattr(cfg, key, tuple(getattr(args, key)))
    for key in ("dim", "hopdc_samples", "weak_samples", "weak_steps"):
        if getattr(args, key) is not None:
            setattr(cfg, key, getattr(args, key))
    for item in args.override:
        try:
            C, assignment = item.split(":", 1)
            key, value = assignment.split("=", 1)
            int(C)
            if key not in ("hopdc_samples", "hopdc_topk", "weak_samples", "weak_steps"):
                raise ValueError
            cfg.overrides.setdefault(C, {})[key] = int(value)
        except ValueError:
            parser.error(f"--override {item!r}: expected C:KEY=INT with KEY one of hopdc_samples, "
                         "hopdc_topk, weak_samples, weak_steps")
    cfg.device, cfg.isolate, cfg.threads = args.device, not args.inline, args.threads
    payload = run(cfg, log=lambda line: print(line, flush=True), timeout=args.timeout)
    # argv is None when run as ``python -m gdacil.bench.drift``; the CLI passes its arguments
    prog = "python -m gdacil.bench.drift" if argv is None else "gdacil bench drift"
    payload["command"] = " ".join([prog, *(shlex.quote(a) for a in
                                           (sys.argv[1:] if argv is None else argv))])
    payload["cpu_model"] = _cpu_model()
    write_report(args.out, "drift", payload, render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
