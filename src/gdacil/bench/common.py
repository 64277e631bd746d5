"""What every benchmark shares: timing, the machine's description and GEMM rate, and output."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

from ..io import atomic_write_text

__all__ = ["best_time", "best_times", "gemm_rate", "machine_info", "markdown_table", "output_arguments",
           "refuse_to_overwrite", "write_json"]


def best_time(fn, *, repeats: int = 3, warmup: int = 1) -> float:
    """Fastest of ``repeats`` wall-clock timings of ``fn()`` after ``warmup`` untimed calls.

    The minimum is the least noisy estimate on a shared machine: noise only ever adds time.
    """
    return best_times({"fn": fn}, repeats=repeats, warmup=warmup)["fn"]


def best_times(fns: dict, *, repeats: int = 3, warmup: int = 1) -> dict:
    """:func:`best_time` of each of ``fns`` (name -> callable), their calls taken in turn, so a
    ratio of two compares timings taken under the same load (the machine's speed drifts by
    about 10% over a minute)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def machine_info() -> dict:
    from .._hardware import native_bfloat16

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": _cpu_model(),
        "native_bfloat16": native_bfloat16("cpu"),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _cpu_model() -> str | None:
    """The CPU's model name (Linux: ``/proc/cpuinfo``), or None where it is not found."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return None


def gemm_rate(dtype: torch.dtype = torch.float32, *, shapes=((2048, 2048, 2048), (1024, 768, 16384)),
              repeats: int = 3) -> dict:
    """Measured GEMM throughput (FLOP/s) of this machine: the best over a few shapes."""
    g = torch.Generator().manual_seed(0)
    best = 0.0
    per_shape = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=g).to(dtype)
        b = torch.randn(k, n, generator=g).to(dtype)
        t = best_time(lambda a=a, b=b: a @ b, repeats=repeats)
        rate = 2.0 * m * k * n / t
        per_shape[f"{m}x{k}x{n}"] = rate
        best = max(best, rate)
    return {"flops": best, "per_shape": per_shape}


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_report(out: Path, stem: str, payload: dict, markdown: str) -> None:
    """Write ``out/<stem>.json`` and ``out/<stem>.md`` (atomically) and print the markdown."""
    write_json(out / f"{stem}.json", payload)
    atomic_write_text(out / f"{stem}.md", markdown)
    print(markdown)


def markdown_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


#: Where a benchmark writes unless ``--out`` says otherwise: outside the committed ``benchmarks/``
DEFAULT_OUT = Path("runs") / "bench"


def output_arguments(parser, name: str, files: str) -> None:
    """Add ``--out`` (default ``runs/bench/<name>/``) and ``--overwrite`` to a benchmark's parser."""
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / name,
                        help=f"directory for {files} (default runs/bench/{name}/; the project's "
                             "committed results are regenerated with --out benchmarks --overwrite)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace results already in --out")


def refuse_to_overwrite(parser, args, *files: str) -> None:
    """Stop (before any work) if one of ``files`` exists in ``args.out`` and ``--overwrite`` is
    not given."""
    for name in files:
        if (args.out / name).exists() and not args.overwrite:
            parser.error(f"{args.out / name} exists; pass --overwrite to replace it, or another "
                         "--out")

