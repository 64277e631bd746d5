"""``python -m gdacil.bench.ranpac_lambda``: RanPAC's choice of the ridge penalty, fast and literal.

RanPAC chooses ``lam`` per task from the task's batch: an 80/20 split, a ridge fitted on the 80%
for each of 17 values ``10^-8 ... 10^8``, the lowest holdout MSE wins. This benchmark times, on one
synthetic task batch mapped by :class:`~gdacil.stats.feature_maps.RandomReLU` to ``M`` features:

- ``fast``: :func:`gdacil.heads.ridge_lambda.select_ridge_lambda`, one eigendecomposition (of the
  ``n_train x n_train`` kernel when ``n_train < M``, else of the ``M x M`` Gram) for the whole grid;
- ``paper``: the literal procedure, ``G = H_t^T H_t`` once, then one dense
  ``torch.linalg.solve(G + lam I, H_t^T Y_t)`` per grid value, in float32 (the official code's
  precision) and in float64. ``--dense-solves k`` runs only ``k`` of the 17 solves and
  extrapolates (``extrapolated: true`` in the output): at ``M = 10000`` one solve takes about a
  minute on one core.

The batch: ``--samples`` features of dimension ``--dim-in`` from ``--task-classes`` Gaussian classes
(means ``N(0, 0.09 I)``, unit noise, L2-normalised rows like sentence embeddings: classes that
overlap enough for the holdout to choose a penalty inside the grid), one-hot targets with one
column per class seen so far (``--seen-classes``). Everything runs with ``--threads`` torch threads
(1 by default). The figures are printed and written as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import cast

import torch

from ..heads.ridge_lambda import DEFAULT_LAMBDA_GRID, holdout_split, select_ridge_lambda
from ..stats.feature_maps import RandomReLU
from .common import machine_info, write_json

__all__ = ["main", "make_batch", "relative_differences", "render", "run", "time_fast", "time_paper"]


def make_batch(n: int, dim_in: int, n_classes: int, seed: int = 0):
    """``n`` L2-normalised features from ``n_classes`` Gaussian classes, and their labels."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % n_classes
    means = 0.3 * torch.randn(n_classes, dim_in, generator=g, dtype=torch.float64)
    X = means[y] + torch.randn(n, dim_in, generator=g, dtype=torch.float64)
    return X / X.norm(dim=1, keepdim=True), y


def _one_hot(y: torch.Tensor, n_columns: int) -> torch.Tensor:
    Y = torch.zeros(len(y), n_columns, dtype=torch.float64)
    Y[torch.arange(len(y)), y] = 1.0
    return Y


def time_fast(H, Y, seed: int) -> dict:
    start = time.perf_counter()
    sel = select_ridge_lambda(H, Y, generator=torch.Generator().manual_seed(seed))
    return {"seconds": time.perf_counter() - start, "lam": sel.lam, "floor": sel.floor,
            "mse": sel.mse}


def time_paper(H, Y, seed: int, dtype: torch.dtype, solves: int) -> dict:
    """The literal loop in ``dtype``: the Gram once, then ``solves`` of the 17 dense solves."""
    train, val = holdout_split(H.shape[0], generator=torch.Generator().manual_seed(seed))
    Ht, Yt, Hv, Yv = H[train].to(dtype), Y[train].to(dtype), H[val].to(dtype), Y[val].to(dtype)
    start = time.perf_counter()
    G, Q = Ht.T @ Ht, Ht.T @ Yt
    gram_s = time.perf_counter() - start
    eye = torch.eye(G.shape[0], dtype=dtype)
    grid = list(DEFAULT_LAMBDA_GRID)
    # the solves nearest the middle of the grid are the representative ones
    order = sorted(range(len(grid)), key=lambda i: abs(i - len(grid) // 2))[:solves]
    mse: list[float | None] = [None] * len(grid)
    solve_times: list[float] = []
    for i in sorted(order):
        start = time.perf_counter()
        W = torch.linalg.solve(G + grid[i] * eye, Q)
        solve_times.append(time.perf_counter() - start)
        mse[i] = float((Hv @ W - Yv).double().square().mean())
    per_solve = sum(solve_times) / len(solve_times)
    out = {"dtype": str(dtype).removeprefix("torch."), "gram_s": gram_s, "solve_s": solve_times,
           "per_solve_s": per_solve, "solves_run": len(solve_times),
           "total_s": gram_s + per_solve * len(grid), "extrapolated": len(solve_times) < len(grid),
           "grid": grid, "mse": mse}
    if not out["extrapolated"]:  # then every solve ran: no None in mse
        out["lam"] = grid[min(range(len(grid)), key=lambda i: cast(float, mse[i]))]
    return out


def relative_differences(fast: dict, paper: dict) -> list:
    """``|mse_paper - mse_fast| / mse_fast`` per grid value (None where no solve ran)."""
    return [None if p is None else abs(p - f) / f for f, p in zip(fast["mse"], paper["mse"])]


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    X, y = make_batch(args.samples, args.dim_in, args.task_classes, args.seed)
    start = time.perf_counter()
    H = RandomReLU(args.dim_in, args.dim_out, seed=args.seed)(X)
    map_s = time.perf_counter() - start
    Y = _one_hot(y, args.seen_classes)
    fast = time_fast(H, Y, args.seed)
    paper = [time_paper(H, Y, args.seed, dtype, min(args.dense_solves, len(DEFAULT_LAMBDA_GRID)))
             for dtype in args.dense_dtypes]
    for p in paper:
        p["rel_diff_vs_fast"] = relative_differences(fast, p)
    return {"config": {"dim_out": args.dim_out, "samples": args.samples, "dim_in": args.dim_in,
                       "task_classes": args.task_classes, "seen_classes": args.seen_classes,
                       "threads": args.threads, "seed": args.seed,
                       "n_train": int(0.8 * args.samples)},
            "machine": machine_info(), "map_s": map_s, "fast": fast, "paper": paper,
            "speedup": {p["dtype"]: p["total_s"] / fast["seconds"] for p in paper}}


def render(result: dict) -> str:
    c = result["config"]
    lines = [(f"RanPAC lambda selection: n={c['samples']} (n_train={c['n_train']}), "
              f"d={c['dim_in']}, M={c['dim_out']}, {c['seen_classes']} target columns, "
              f"{c['threads']} thread(s)"),
             f"  random ReLU map:             {result['map_s']:8.2f} s",
             (f"  fast (one eigendecomposition): {result['fast']['seconds']:6.2f} s  -> lam = "
              f"{result['fast']['lam']:.3g}")]
    for p in result["paper"]:
        how = (f"{p['solves_run']} solve(s) timed, x17 extrapolated" if p["extrapolated"]
               else "all 17 solves run")
        chosen = f"  -> lam = {p['lam']:.3g}" if "lam" in p else ""
        lines.append(f"  paper, {p['dtype']:7s}: Gram {p['gram_s']:.2f} s + 17 x {p['per_solve_s']:.2f} s "
                     f"= {p['total_s']:8.2f} s ({how}){chosen}")
        diffs = [(lam, d) for lam, d in zip(p["grid"], p["rel_diff_vs_fast"]) if d is not None]
        large = [d for lam, d in diffs if lam >= 1e-3]
        lines.append(f"    holdout MSE vs fast: max rel. diff {max(d for _, d in diffs):.1e} over the "
                     f"solves run" + (f", {max(large):.1e} for lam >= 1e-3" if large else ""))
    lines += [f"  speedup over the paper's loop ({k}): {v:.0f}x" for k, v in result["speedup"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gdacil.bench.ranpac_lambda", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim-out", type=int, default=10_000, help="random features M (10000)")
    parser.add_argument("--samples", type=int, default=2000, help="samples in the task batch (2000)")
    parser.add_argument("--dim-in", type=int, default=384, help="feature dimension d (384)")
    parser.add_argument("--task-classes", type=int, default=20, help="classes in the batch (20)")
    parser.add_argument("--seen-classes", type=int, default=100,
                        help="target columns: classes seen so far (100)")
    parser.add_argument("--dense-solves", type=int, default=1,
                        help="dense solves actually run per dtype (1..17; the rest extrapolated)")
    parser.add_argument("--dense-dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.seen_classes < args.task_classes:
        parser.error("--seen-classes must be at least --task-classes")
    args.dense_dtypes = [getattr(torch, name) for name in args.dense_dtypes]
    result = run(args)
    print(render(result))
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
