"""``gdacil bench speed``: build time, inference throughput and memory of every head.

Synthetic classes with low-rank spectra (the regime LR-RGDA is built for) are sampled, their
statistics accumulated, and every head is built from the same statistics; scikit-learn's QDA is
fitted on the same samples. Throughput is measured with ``decision_function`` on one batch of
queries in float32 (scikit-learn runs in float64, its only dtype), as the best of a few passes.
LR-RGDA throughput is also stated as a fraction of the machine's measured fp32 GEMM rate, with
``2 d C (r + 1)`` FLOPs per sample.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._plotting import save_figure, subplots
from ..heads import LDA, LRRGDA, NCM, RGDA, GaussianHead, SGDHead
from ..stats import ClassGaussians
from .common import (
    best_time,
    gemm_rate,
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)

__all__ = ["HeadsBenchConfig", "main", "run"]


@dataclass
class HeadsBenchConfig:
    classes: tuple[int, ...] = (100, 300, 1000)
    dim: int = 768
    ranks: tuple[int, ...] = (16, 64, 128)
    batch: int = 1024
    samples_per_class: int = 200
    spectrum_rank: int = 128
    added_classes: int = 10
    sklearn_qda: bool = True
    seed: int = 0
    heads: tuple[str, ...] = field(default=("ncm", "lda", "sgd", "rgda", "sklearn_qda", "lr_rgda"))


QUICK = HeadsBenchConfig(classes=(20, 60), dim=96, ranks=(8, 16), batch=256, samples_per_class=60,
                         spectrum_rank=24, added_classes=4)


def class_samples(labels, dim, n, spectrum_rank, seed) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples of Gaussian classes whose covariances have a decaying rank-``spectrum_rank`` part.

    Class ``c`` draws from its own generator seeded by ``(seed, c)``, so adding classes never
    changes the earlier ones. The scale mimics LayerNorm-ed features (per-coordinate variance < 1).
    """
    xs, ys = [], []
    decay = 3.0 / torch.arange(1, spectrum_rank + 1, dtype=torch.float64)
    for c in labels:
        g = torch.Generator().manual_seed(seed * 1_000_003 + int(c))
        basis = torch.randn(dim, spectrum_rank, generator=g, dtype=torch.float64) / dim**0.5
        mean = torch.randn(dim, generator=g, dtype=torch.float64) * 0.3
        z = torch.randn(n, spectrum_rank, generator=g, dtype=torch.float64) * decay.sqrt()
        noise = 0.1 * torch.randn(n, dim, generator=g, dtype=torch.float64)
        xs.append(mean + z @ (basis * dim**0.5 / spectrum_rank**0.5).T + noise)
        ys.append(torch.full((n,), int(c)))
    return torch.cat(xs), torch.cat(ys)


def _our_heads(cfg: HeadsBenchConfig) -> dict:
    heads: dict[str, Callable[..., GaussianHead]] = {
        "ncm": lambda: NCM(dtype=torch.float32),
        "lda": lambda: LDA(dtype=torch.float32),
        "sgd": lambda: SGDHead(dtype=torch.float32),
        "rgda": lambda: RGDA(dtype=torch.float32),
    }
    heads = {k: v for k, v in heads.items() if k in cfg.heads}
    if "lr_rgda" in cfg.heads:
        for r in cfg.ranks:
            heads[f"lr_rgda_r{r}"] = lambda r=r: LRRGDA(rank=r, dtype=torch.float32)
    return heads


def _time_fit(fn) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _throughput(score, queries) -> float:
    start = time.perf_counter()
    score(queries)  # warm-up pass, also tells how many timed passes are affordable
    first = time.perf_counter() - start
    repeats = 3 if first < 2.0 else 1
    return len(queries) / min(first, best_time(lambda: score(queries), repeats=repeats, warmup=0))


def bench_classes(C: int, cfg: HeadsBenchConfig, log) -> tuple[list[dict], dict]:
    labels = list(range(C))
    X, y = class_samples(labels, cfg.dim, cfg.samples_per_class, cfg.spectrum_rank, cfg.seed)
    stats = ClassGaussians(cfg.dim).update(X, y)
    q_gen = torch.Generator().manual_seed(cfg.seed + 1)
    queries = X[torch.randint(0, len(X), (cfg.batch,), generator=q_gen)]
    queries = (queries + 0.05 * torch.randn(queries.shape, generator=q_gen, dtype=torch.float64))
    queries32 = queries.float()
    rows = []
    for name, make in _our_heads(cfg).items():
        head, build = _time_fit(lambda make=make: make().fit(stats))
        tput = _throughput(head.decision_function, queries32)
        row = {"classes": C, "head": name, "build_s": build, "throughput": tput,
               "head_bytes": head.memory_report()["total"], "stats_bytes": stats.nbytes}
        if name.startswith("lr_rgda"):
            r = head.rows_.shape[1] - 1
            row["flops_per_sample"] = 2 * cfg.dim * C * (r + 1)
        if name == "sgd":
            row["sgd_steps"] = head.n_steps_
        rows.append(row)
        log(row)
        del head
        gc.collect()
    if "sklearn_qda" in cfg.heads and cfg.sklearn_qda:
        from sklearn.discriminant_analysis import QuadraticDiscriminantAnalysis

        Xn, yn, qn = X.numpy(), y.numpy(), queries.numpy()
        sk, build = _time_fit(
            lambda: QuadraticDiscriminantAnalysis(solver="eigen", shrinkage=0.1).fit(Xn, yn))
        tput = _throughput(sk.decision_function, qn)
        nbytes = sum(a.nbytes for a in sk.rotations_) + sum(a.nbytes for a in sk.scalings_)
        rows.append({"classes": C, "head": "sklearn_qda", "build_s": build, "throughput": tput,
                     "head_bytes": nbytes, "stats_bytes": Xn.nbytes})
        log(rows[-1])
        del sk
    incremental = _incremental(C, stats, cfg)
    log(incremental)
    return rows, incremental


def _incremental(C: int, stats: ClassGaussians, cfg: HeadsBenchConfig) -> dict:
    """Cost of refitting LR-RGDA (r = 64, or the middle rank) after adding classes."""
    r = 64 if 64 in cfg.ranks else cfg.ranks[len(cfg.ranks) // 2]
    head = LRRGDA(rank=r, dtype=torch.float32).fit(stats)
    new = list(range(C, C + cfg.added_classes))
    X, y = class_samples(new, cfg.dim, cfg.samples_per_class, cfg.spectrum_rank, cfg.seed)
    grown = stats.copy().update(X, y)
    _, refit = _time_fit(lambda: head.fit(grown))
    decomposed = head.n_decomposed_
    _, scratch = _time_fit(lambda: LRRGDA(rank=r, dtype=torch.float32).fit(grown))
    return {"classes": C, "added": cfg.added_classes, "rank": r, "refit_s": refit,
            "scratch_s": scratch, "ratio": refit / scratch, "decomposed_on_refit": decomposed}


def run(cfg: HeadsBenchConfig, log=print) -> dict:
    # the GEMM rate is sampled before and after every class count and the best is the roofline:
    # on a shared machine a single early sample can catch a busy moment and understate it
    samples = [gemm_rate(torch.float32)]
    log({"gemm_fp32_flops": samples[-1]["flops"]})
    results, incremental = [], []
    for C in cfg.classes:
        rows, inc = bench_classes(C, cfg, log)
        results += rows
        incremental.append(inc)
        samples.append(gemm_rate(torch.float32))
        log({"gemm_fp32_flops": samples[-1]["flops"]})
    gemm = max(samples, key=lambda g: g["flops"])
    gemm["samples"] = [g["flops"] for g in samples]
    for row in results:
        if "flops_per_sample" in row:
            row["roofline_fraction"] = row["throughput"] * row["flops_per_sample"] / gemm["flops"]
    return {"config": asdict(cfg), "machine": machine_info(), "gemm_fp32": gemm,
            "results": results, "incremental": incremental, "claims": claims(results, incremental)}


def _lookup(results, C, head):
    for row in results:
        if row["classes"] == C and row["head"] == head:
            return row
    return None


def claims(results, incremental) -> dict:
    """The ratios the README quotes, computed from this run only."""
    out = {}
    Cmax = max(r["classes"] for r in results)
    lr64 = _lookup(results, Cmax, "lr_rgda_r64")
    if lr64:
        out[f"lr_rgda_r64_roofline_fraction_at_C{Cmax}"] = lr64["roofline_fraction"]
    for C in sorted({r["classes"] for r in results}):
        lr = _lookup(results, C, "lr_rgda_r64")
        for other in ("rgda", "sklearn_qda"):
            ref = _lookup(results, C, other)
            if lr and ref:
                out[f"lr_rgda_r64_speedup_vs_{other}_at_C{C}"] = lr["throughput"] / ref["throughput"]
    for inc in incremental:
        out[f"incremental_add{inc['added']}_ratio_at_C{inc['classes']}"] = inc["ratio"]
    return out


def render(payload: dict) -> str:
    res = payload["results"]
    table = markdown_table(
        ["C", "head", "build (s)", "throughput (samples/s)", "head memory (MB)", "roofline"],
        [[r["classes"], r["head"], f"{r['build_s']:.3f}", f"{r['throughput']:,.0f}",
          f"{r['head_bytes'] / 2**20:.1f}",
          f"{r['roofline_fraction']:.0%}" if "roofline_fraction" in r else ""] for r in res],
    )
    inc = markdown_table(
        ["C", "added", "rank", "refit (s)", "from scratch (s)", "ratio", "classes decomposed"],
        [[i["classes"], i["added"], i["rank"], f"{i['refit_s']:.3f}", f"{i['scratch_s']:.3f}",
          f"{i['ratio']:.1%}", i["decomposed_on_refit"]] for i in payload["incremental"]],
    )
    claim_lines = "\n".join(f"- `{k}`: {v:.3g}" for k, v in payload["claims"].items())
    m = payload["machine"]
    return (
        "# Heads benchmark\n\n"
        f"Machine: {m['processor']}, {m['cpu_count']} CPUs, torch {m['torch']} with "
        f"{m['torch_threads']} threads; measured fp32 GEMM rate "
        f"{payload['gemm_fp32']['flops'] / 1e9:.1f} GFLOP/s.\n"
        f"Config: `{payload['config']}`\n\n"
        "Throughput: `decision_function` on one batch, fp32 (scikit-learn: float64), best of up "
        "to 3 passes. Build: from accumulated statistics, float64 on CPU (scikit-learn: from "
        "samples).\n\n" + table + "\n## Incremental LR-RGDA refit\n\n" + inc
        + "\n## Ratios from this run\n\n" + claim_lines + "\n"
    )


def plot(payload: dict, path: Path) -> None:
    fig, ax = subplots(figsize=(7, 4.5))
    heads = sorted({r["head"] for r in payload["results"]})
    for head in heads:
        pts = sorted((r["classes"], r["throughput"]) for r in payload["results"] if r["head"] == head)
        ax.plot(*zip(*pts), marker="o", label=head)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("classes C")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(f"Head inference throughput, d = {payload['config']['dim']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny grid (seconds), for smoke tests")
    parser.add_argument("--classes", type=int, nargs="+", help="class counts C (default 100 300 1000)")
    parser.add_argument("--no-sklearn", action="store_true", help="skip scikit-learn's QDA")
    output_arguments(parser, "speed", "speed.json, speed.md and speed.png")
    args = parser.parse_args(argv)
    refuse_to_overwrite(parser, args, "speed.json", "speed.md", "speed.png")
    cfg = QUICK if args.quick else HeadsBenchConfig()
    if args.classes:
        cfg.classes = tuple(args.classes)
    cfg.sklearn_qda = not args.no_sklearn
    payload = run(cfg, log=lambda row: print(row, flush=True))
    plot(payload, args.out / "speed.png")
    write_report(args.out, "speed", payload, render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
