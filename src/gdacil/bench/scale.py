"""``gdacil bench scale``: LR-RGDA with 100 to 20,000 classes on one machine.

For every class count ``C`` (d = 768, head rank r = 64, statistics of rank q = 64), in its own
process so peak memory is per cell:

- **build from scratch**: the classes' dense covariances arrive in blocks of ``block`` classes
  and are added to :class:`~gdacil.LowRankGaussians` (validated, then compressed to their exact
  top-q eigenpairs in ``decomposition_dtype``; the dense blocks are discarded), then the LR-RGDA
  head is built from the stored eigenpairs. ``compress_s + fit_s`` is what a model of ``C``
  classes costs to build. Drawing the synthetic covariances is timed apart (``generate_s``):
  with ``processes > 1`` the worker processes of
  :func:`~gdacil.stats.lowrank.build_in_processes` draw their own classes, in parallel and
  the same number each, so ``compress_s`` is the build's wall time less their mean drawing
  time; ``build_wall_s`` is the wall time with drawing.
  Where the time goes is measured per class on the first block: validation (finite, symmetric),
  the decomposition, and the re-orthonormalisation of float32 eigenvectors.
- **against a float64 build** (for ``C`` in ``reference_classes``): the same classes compressed
  in float64, the head refitted, and the dense top-k decisions of both heads compared; this
  runs last, once the float32 model is freed, and its peak RSS is reported apart.
- **incremental**: ``added`` new classes are compressed and the head refitted; only the terms
  that depend on ``B`` (which moves with ``Sigma_avg``) are recomputed for the old classes.
- **memory**: statistics and head as reported by ``memory_report()``, the process's peak RSS,
  and what peers' dense storage would need (one float32 ``d x d`` covariance per class; FeCAM's
  scripts keep three float64 copies).
- **inference**: the argmax and the top-5 of ``queries`` samples, dense (every class's
  ``r + 1`` rows) against exact pruned scoring (:meth:`~gdacil.heads.LRRGDA.top_k`), in
  float32, with each screening precision of ``screen_dtypes`` ("auto" is bfloat16 on CPUs with
  native bfloat16 dot products); the pruned labels are checked against the dense ones, and the
  fraction of (sample, class) pairs that pass screening (and get more rows) is reported.
  Timings are the best of three after a warm-up. Workers inherit the environment, so OpenMP
  waits with its default policy unless ``OMP_WAIT_POLICY`` is set: pruned scoring runs many
  small parallel regions, which ``PASSIVE`` (sleeping threads) slows by about a quarter.

Classes are synthetic: a random mean, a random 96-dimensional principal subspace with a
power-law spectrum, and isotropic noise, so the top-64 compression is lossy as on real
features; queries are drawn from the classes' own distributions.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .._plotting import save_figure, subplots
from ..io import atomic_write_text
from .common import (
    best_time,
    best_times,
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_json,
)

__all__ = ["QUICK", "ScaleBenchConfig", "SyntheticClasses", "main", "measure", "run"]


@dataclass
class ScaleBenchConfig:
    classes: tuple[int, ...] = (100, 1000, 2000, 5000, 10000, 20000)
    dim: int = 768
    rank: int = 64               # head rank r; the statistics keep the same q
    true_rank: int = 96          # principal subspace of each synthetic class
    spectrum_decay: float = 1.0  # eigenvalue i of a class is top_variance * i^-decay
    top_variance: float = 1.0
    noise_variance: float = 0.1
    mean_scale: float = 0.07     # class means ~ N(0, mean_scale^2 I)
    block: int = 100             # classes compressed at a time (dense block memory)
    added: int = 100
    queries: int = 1024
    topk: int = 5
    screen_rank: int | str = "auto"   # "auto": the head's default (a quarter of r)
    screen_dtypes: tuple[str, ...] = ("auto", "float32")
    stats_dtype: str = "float32"
    decomposition_dtype: str = "float32"
    processes: int = 2           # worker processes of the build from scratch (1: in this process)
    reference_classes: tuple[int, ...] = (1000, 10000)  # also built in float64, decisions compared
    seed: int = 0


QUICK = ScaleBenchConfig(classes=(60, 120), dim=48, rank=8, true_rank=12, block=25, added=10,
                         queries=256, screen_rank=2, mean_scale=0.3,
                         screen_dtypes=("bfloat16", "float32"), reference_classes=(60,),
                         processes=1)


class SyntheticClasses:
    """Class ``c``'s mean, principal subspace and spectrum, drawn from a generator seeded with
    ``(seed, c)`` so any block of classes can be generated alone."""

    def __init__(self, cfg: ScaleBenchConfig):
        self.cfg = cfg
        i = torch.arange(1, cfg.true_rank + 1, dtype=torch.float64)
        self.spectrum = cfg.top_variance * i.pow(-cfg.spectrum_decay)

    def _generator(self, c: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + c)

    def model(self, labels: list[int]):
        """Means ``(k, d)`` and orthonormal bases ``(k, d, true_rank)``."""
        cfg = self.cfg
        means, bases = [], []
        for c in labels:
            g = self._generator(c)
            means.append(cfg.mean_scale * torch.randn(cfg.dim, generator=g, dtype=torch.float64))
            bases.append(torch.randn(cfg.dim, cfg.true_rank, generator=g, dtype=torch.float64))
        return torch.stack(means), torch.linalg.qr(torch.stack(bases)).Q

    def moments(self, labels: list[int]):
        """``(means, covariances)`` of a block of classes (dense, float64)."""
        means, Q = self.model(labels)
        covs = (Q * self.spectrum) @ Q.transpose(1, 2)
        covs.diagonal(dim1=1, dim2=2).add_(self.cfg.noise_variance)
        return means, covs

    def sample(self, labels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """One sample of each class in ``labels``."""
        uniq, inverse = labels.unique(return_inverse=True)
        means, Q = self.model(uniq.tolist())
        n, cfg = len(labels), self.cfg
        z = torch.randn(n, cfg.true_rank, generator=generator, dtype=torch.float64)
        noise = torch.randn(n, cfg.dim, generator=generator, dtype=torch.float64)
        principal = (Q[inverse] @ (z * self.spectrum.sqrt())[:, :, None])[:, :, 0]
        return means[inverse] + principal + cfg.noise_variance ** 0.5 * noise


def _compress(stats, moments: SyntheticMoments, labels: list[int], block: int
              ) -> tuple[float, float]:
    """Add ``labels`` to ``stats`` block by block; seconds spent ``(generating, adding)``."""
    generate_s = add_s = 0.0
    for start in range(0, len(labels), block):
        part = labels[start:start + block]
        t0 = time.perf_counter()
        block_moments = moments(part)
        t1 = time.perf_counter()
        stats.add_classes(part, *block_moments)
        generate_s, add_s = generate_s + t1 - t0, add_s + time.perf_counter() - t1
    return generate_s, add_s


class SyntheticMoments:
    """``(means, covariances, counts)`` of a block of synthetic classes (picklable, for
    :func:`~gdacil.stats.lowrank.build_in_processes`). With ``clock_dir``, each process that
    calls it keeps the seconds it has spent drawing in ``clock_dir/<pid>``, so the build's
    time can be told apart from drawing its inputs."""

    def __init__(self, cfg: ScaleBenchConfig, clock_dir: str | None = None):
        self.cfg, self.clock_dir, self.seconds = cfg, clock_dir, 0.0

    def __call__(self, labels: list[int]):
        start = time.perf_counter()
        means, covs = SyntheticClasses(self.cfg).moments(labels)
        self.seconds += time.perf_counter() - start
        if self.clock_dir is not None:
            Path(self.clock_dir, str(os.getpid())).write_text(repr(self.seconds))
        return means, covs, torch.full((len(labels),), 1000.0)


def _params(cfg: ScaleBenchConfig, decomposition_dtype: str) -> dict:
    return {"dim": cfg.dim, "rank": cfg.rank, "dtype": cfg.stats_dtype,
            "decomposition_dtype": decomposition_dtype, "seed": cfg.seed}


def _build(cfg: ScaleBenchConfig, C: int, decomposition_dtype: str):
    """``(statistics, seconds generating, seconds building, wall seconds)`` of classes
    ``0 .. C - 1``. With several processes the workers draw their own classes, in parallel with
    the same share each: generating is then the mean of their drawing seconds, and building the
    wall time less that."""
    import tempfile

    from ..stats.lowrank import LowRankGaussians, build_in_processes

    params = _params(cfg, decomposition_dtype)
    start = time.perf_counter()
    if cfg.processes == 1:
        stats = LowRankGaussians(**params)
        generate_s, compress_s = _compress(stats, SyntheticMoments(cfg), list(range(C)),
                                           cfg.block)
        return stats, generate_s, compress_s, time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="gdacil-scale-clock-") as clock_dir:
        stats = build_in_processes(SyntheticMoments(cfg, clock_dir), range(C),
                                   processes=cfg.processes, block=cfg.block, **params)
        wall_s = time.perf_counter() - start
        drawn = [float(f.read_text()) for f in Path(clock_dir).iterdir()]
    generate_s = sum(drawn) / len(drawn)
    return stats, generate_s, wall_s - generate_s, wall_s


def build_breakdown(classes: SyntheticClasses, labels: list[int], cfg: ScaleBenchConfig) -> dict:
    """Seconds per class of each step of ``add_classes`` on one block of ``labels``."""
    from .._validation import check_covariances
    from ..stats.linalg import reorthonormalize, top_eigh

    _, covs = classes.moments(labels)
    dtype = getattr(torch, cfg.decomposition_dtype)
    low = covs.to(dtype)
    steps = {"validate": lambda: check_covariances(covs, labels, psd=False),
             "convert": lambda: covs.to(dtype),
             "decompose": lambda: top_eigh(low, cfg.rank, return_smallest=True)}
    out = {name: best_time(step, repeats=1) / len(labels) for name, step in steps.items()}
    U = top_eigh(low, cfg.rank)[0].double()
    out["orthonormalize"] = (best_time(lambda: reorthonormalize(U), repeats=1) / len(labels)
                             if dtype != torch.float64 else 0.0)
    return out


def _decisions_against(scores, labels, reference, X, k: int) -> dict:
    """How far dense top-``k`` lists ``(scores, labels)`` of ``X`` are from ``reference``'s."""
    scores, labels = scores[:, :k], labels[:, :k]
    ref_scores, ref_labels = reference.top_k(X, k, pruned=False)
    differ = labels != ref_labels
    gap = (ref_scores - scores).abs()[differ]
    return {"argmax_differ": int(differ[:, 0].sum()), "topk_entries_differ": int(differ.sum()),
            "max_score_gap_where_different": float(gap.max()) if gap.numel() else 0.0,
            "max_relative_score_difference": float(
                ((scores - ref_scores).abs() / ref_scores.abs().clamp_min(1e-30)).max())}


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(C: int, cfg: ScaleBenchConfig) -> dict:
    """Every figure of one class count (run it in a fresh process for a meaningful peak RSS)."""
    from ..heads import LRRGDA

    classes = SyntheticClasses(cfg)
    stats, generate_s, compress_s, wall_s = _build(cfg, C, cfg.decomposition_dtype)
    head = LRRGDA(rank=cfg.rank, dtype=torch.float32)
    start = time.perf_counter()
    head.fit(stats)
    fit_s = time.perf_counter() - start
    row: dict[str, Any]
    row = {"classes": C, "generate_s": generate_s, "compress_s": compress_s, "fit_s": fit_s,
           "build_s": compress_s + fit_s, "build_wall_s": wall_s + fit_s,
           "per_class_s": build_breakdown(classes, list(range(min(C, cfg.block))), cfg),
           "stats_bytes": stats.memory_report()["total"],
           "head_bytes": head.memory_report()["total"]}

    g = torch.Generator().manual_seed(cfg.seed + 1)
    truth = torch.randint(0, C, (cfg.queries,), generator=g)
    X = classes.sample(truth, g).float()
    dense_s = best_time(lambda: head.top_k(X, cfg.topk, pruned=False))
    dense_scores, dense_labels = head.top_k(X, cfg.topk, pruned=False)
    row["dense_throughput"] = cfg.queries / dense_s
    row["top1_accuracy"] = float((dense_labels[:, 0] == truth).double().mean())
    screenings = dict.fromkeys(head._screen_dtype(s) for s in cfg.screen_dtypes)  # resolved, unique
    row["pruned"] = [_pruned(head, X, k, cfg.screen_rank, screen, dense_s, dense_scores,
                             dense_labels)
                     for k in (1, cfg.topk) for screen in screenings]
    row["auto"] = [_pruned(head, X, k, cfg.screen_rank, "auto", None, dense_scores,
                           dense_labels, pruned="auto") for k in (1, cfg.topk)]
    timed = best_times({"argmax": lambda: head.decision_function(X).argmax(1),
                        "predict": lambda: head.predict(X)}, repeats=5)
    dense_argmax_s, predict_s = timed["argmax"], timed["predict"]
    row["predict"] = {"seconds": predict_s, "dense_argmax_seconds": dense_argmax_s,
                      "speedup": dense_argmax_s / predict_s,
                      "equal_to_dense": bool(torch.equal(head.predict(X),
                                                         dense_labels[:, 0]))}

    new = list(range(C, C + cfg.added))
    _, add_compress_s = _compress(stats, SyntheticMoments(cfg), new, cfg.block)
    start = time.perf_counter()
    head.fit(stats)
    refit_s = time.perf_counter() - start
    row.update({"add_compress_s": add_compress_s, "refit_s": refit_s,
                "incremental_s": add_compress_s + refit_s,
                "incremental_ratio": (add_compress_s + refit_s) / row["build_s"],
                "decomposed_on_refit": head.n_decomposed_,
                "peak_rss_bytes": _peak_rss()})
    d = cfg.dim
    row["peer_dense_fp32_bytes"] = C * d * d * 4
    row["fecam_bytes"] = 3 * C * d * d * 8
    if C in cfg.reference_classes and cfg.decomposition_dtype != "float64":
        # the check is not part of the model: the float32 model goes first, so the process
        # holds one build at a time and its peak stays the larger of the two, not their sum
        del head, stats
        gc.collect()
        reference, _, row["reference_compress_s"], _ = _build(cfg, C, "float64")
        reference = LRRGDA(rank=cfg.rank, dtype=torch.float32).fit(reference)
        row["against_float64"] = _decisions_against(dense_scores, dense_labels, reference, X,
                                                    cfg.topk)
        row["reference_peak_rss_bytes"] = _peak_rss()
    return row


def _pruned(head, X, k, screen_rank, screen, dense_s, dense_scores, dense_labels,
            pruned=True) -> dict:
    """Speed and exactness of the pruned top-``k`` (``pruned="auto"``: the default path, which
    prunes only where a pilot batch says it pays) with one screening precision. Without
    ``dense_s``, dense scoring is timed in turn with it (five times each)."""
    def run():
        return head.top_k(X, k, pruned=pruned, screen_rank=screen_rank, screen_dtype=screen)

    if dense_s is None:
        timed = best_times({"dense": lambda: head.top_k(X, k, pruned=False), "run": run},
                           repeats=5)
        dense_s, pruned_s = timed["dense"], timed["run"]
    else:
        pruned_s = best_time(run)
    scores, labels = run()
    differ = labels != dense_labels[:, :k]
    # where the lists differ, how far apart the dense scores of the two classes are: a float32
    # near-tie (gap within rounding) rather than a wrong bound
    gap = (dense_scores[:, :k] - scores).abs()[differ]
    return {"k": k, "screen_dtype": head.last_pruning_["screen_dtype"],
            "differing_entries": int(differ.sum()),
            "max_score_gap_where_different": float(gap.max()) if gap.numel() else 0.0,
            "pruned_throughput": len(X) / pruned_s, "speedup": dense_s / pruned_s,
            "pairs_scored_fraction": head.last_pruning_["pairs_scored_fraction"],
            "classes_scored_fraction": head.last_pruning_["classes_scored_fraction"],
            "mode": head.last_pruning_["mode"],
            "equal_to_dense": bool(torch.equal(labels, dense_labels[:, :k])),
            "max_score_difference": float((scores - dense_scores[:, :k]).abs().max())}


# ----------------------------------------------------------------------------- driver
def _cell(C: int, cfg: ScaleBenchConfig, inline: bool) -> dict:
    if inline:
        return measure(C, cfg)
    cmd = [sys.executable, "-m", "gdacil.bench.scale", "--cell", str(C),
           "--config", json.dumps(asdict(cfg))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        return {"classes": C, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(cfg: ScaleBenchConfig, *, inline: bool = False, log=print) -> dict:
    rows = []
    for C in cfg.classes:
        rows.append(_cell(C, cfg, inline))
        log(rows[-1])
    return {"config": asdict(cfg), "machine": machine_info(), "results": rows,
            "load_average": os.getloadavg(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)")}


def render(payload: dict, command: str) -> str:
    cfg, m = payload["config"], payload["machine"]
    gb = 1e9
    ok = [r for r in payload["results"] if "error" not in r]
    lines = [
        "# Scale benchmark: LR-RGDA with many classes", "",
        f"d = {cfg['dim']}, head rank r = {cfg['rank']}, statistics rank q = {cfg['rank']} "
        f"({cfg['stats_dtype']} eigenvectors), float32 head; {cfg['queries']} queries, top-"
        f"{cfg['topk']}, screening rank {_screen_rank(cfg)}. Machine: {m['processor']}, "
        f"{m['cpu_count']} CPUs, torch {m['torch']} with {m['torch_threads']} threads "
        f"(OMP_WAIT_POLICY {payload.get('omp_wait_policy', '(default)')}); load "
        f"average at the end {payload['load_average'][0]:.1f}.", "",
        f"Regenerate: `{command}`.", "",
        "## Memory (GB)", "",
        markdown_table(
            ["C", "statistics", "LR-RGDA head", "process peak RSS",
             "peak with the float64 check", "peers: dense fp32 cov.", "FeCAM: 3 float64 copies"],
            [[r["classes"], f"{r['stats_bytes'] / gb:.2f}", f"{r['head_bytes'] / gb:.2f}",
              f"{r['peak_rss_bytes'] / gb:.2f}",
              f"{r['reference_peak_rss_bytes'] / gb:.2f}" if "reference_peak_rss_bytes" in r
              else "", f"{r['peer_dense_fp32_bytes'] / gb:.1f}",
              f"{r['fecam_bytes'] / gb:.1f}"] for r in ok]),
        "Process peak RSS: building, fitting, scoring and adding classes. The float64 check "
        "(below) runs after the float32 model is freed; its column is the cell's peak with it.",
        "",
        "## Build and incremental build (s)", "",
        f"Compression: validation, then exact top-{cfg['rank']} eigenpairs in "
        f"{cfg.get('decomposition_dtype', 'float64')} (LAPACK tridiagonalisation; the smallest "
        "eigenvalue checks positive semi-definiteness), "
        + (f"in {cfg['processes']} worker processes (`gdacil.stats.lowrank.build_in_processes`), "
           "which also draw the synthetic covariances, in parallel and the same number each: "
           "compress is the wall time less their mean drawing time (generating), and the last "
           "column the build's wall time with it" if cfg.get("processes", 1) > 1 else
           "in this process; drawing the synthetic covariances is not part of the build "
           "(generating)") + ".", "",
        markdown_table(
            ["C", "compress", "head fit", "build from scratch", f"add {cfg['added']}: compress",
             "refit", "incremental / scratch", "decomposed on refit", "generating covariances",
             "build with generating"],
            [[r["classes"], f"{r['compress_s']:.1f}", f"{r['fit_s']:.1f}", f"{r['build_s']:.1f}",
              f"{r['add_compress_s']:.2f}", f"{r['refit_s']:.1f}",
              f"{100 * r['incremental_ratio']:.1f}%", r["decomposed_on_refit"],
              _seconds(r.get("generate_s")), _seconds(r.get("build_wall_s"))] for r in ok]),
        *_breakdown_section(ok),
        *_reference_section(ok, cfg),
        "## Inference (samples/s)", "",
        "Dense scoring computes every class's `r + 1` rows (the same cost for the argmax and "
        "the top-k list); pruned scoring is exact and is checked against it. The screening "
        "column is the precision of the screening pass's quadratic rows (its rounding error is "
        "bounded and covered); every score that decides the output is float32. Best of three "
        "timings each.", "",
        markdown_table(
            ["C", "k", "screening", "dense", "pruned", "speedup", "pairs past screening",
             "classes scored", "equal to dense", "max |score diff|", "top-1 accuracy"],
            [[r["classes"], p["k"], p["screen_dtype"], f"{r['dense_throughput']:,.0f}",
              f"{p['pruned_throughput']:,.0f}", f"{p['speedup']:.1f}x",
              f"{100 * p['pairs_scored_fraction']:.2f}%",
              f"{100 * p['classes_scored_fraction']:.1f}%",
              _equality(p), f"{p['max_score_difference']:.2g}",
              f"{100 * r['top1_accuracy']:.1f}%"]
             for r in ok for p in r["pruned"]]),
        "## The default path against dense", "",
        "`top_k` with `pruned=\"auto\"` (a pilot batch decides whether pruning pays) and "
        "`predict` (the pruned argmax from 1,000 classes on), the calls a user makes without "
        "options. Speedup over dense scoring of the same call; 1.0x or more means never slower. "
        "Timed after a warm-up call, as every timing here: a pilot's verdict holds for the next "
        "32 calls with the same k (`AUTO_VERDICT_CALLS`), so these calls run no pilot; one that "
        "gives up costs up to a dense pass of its 64 samples more.",
        "",
        markdown_table(
            ["C", "call", "mode chosen", "speedup over dense", "equal to dense"],
            [row for r in ok if "auto" in r for row in (
                *([r["classes"], f"top_k(k={p['k']})", p["mode"], f"{p['speedup']:.2f}x",
                   _equality(p)] for p in r["auto"]),
                [r["classes"], "predict", "pruned" if r["classes"] >= 1000 else "dense",
                 f"{r['predict']['speedup']:.2f}x",
                 "yes" if r["predict"]["equal_to_dense"] else "no"])]),
        *_projection_section(ok),
    ]
    errors = [r for r in payload["results"] if "error" in r]
    if errors:
        lines += ["## Failed cells", ""] + [f"- C = {r['classes']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


def _screen_rank(cfg: dict) -> str:
    from ..heads.lowrank import default_screen_rank

    if cfg["screen_rank"] != "auto":
        return str(cfg["screen_rank"])
    return f"{default_screen_rank(cfg['rank'])} (the default, a quarter of r)"


#: Class counts projected from the largest measured cell, and the memory a rank may hold
PROJECTED_CLASSES = (100_000, 1_000_000)
RANK_MEMORY_BYTES = 8e9


def projection(row: dict, classes: int) -> dict:
    """What ``classes`` would cost, scaled linearly from a measured ``row``: memory and build
    time grow with C, dense throughput falls as 1/C (every class's rows are scored)."""
    f = classes / row["classes"]
    model = (row["stats_bytes"] + row["head_bytes"]) * f
    return {"classes": classes, "stats_bytes": row["stats_bytes"] * f,
            "head_bytes": row["head_bytes"] * f, "build_s": row["build_s"] * f,
            "dense_throughput": row["dense_throughput"] / f,
            "ranks_at_8gb": max(1, -(-model // RANK_MEMORY_BYTES))}


def _projection_section(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    last = max(rows, key=lambda r: r["classes"])
    return [f"## Projected from C = {last['classes']:,}", "",
            "Linear in C from the largest measured cell: statistics and head memory, build time "
            "on this machine, dense throughput of one process holding every class, and the "
            f"ranks of a class-sharded head (`gdacil.heads.ShardedHead`, "
            f"[sharded.md](sharded.md)) that keep each under {RANK_MEMORY_BYTES / 1e9:.0f} GB "
            "of model (each rank then scores its share, so throughput scales with the ranks).",
            "",
            markdown_table(
                ["C", "statistics (GB)", "head (GB)", "build (h)", "dense samples/s, 1 process",
                 "ranks at 8 GB"],
                [[f"{p['classes']:,}", f"{p['stats_bytes'] / 1e9:.0f}",
                  f"{p['head_bytes'] / 1e9:.0f}", f"{p['build_s'] / 3600:.1f}",
                  f"{p['dense_throughput']:.2f}", f"{p['ranks_at_8gb']:.0f}"]
                 for p in (projection(last, C) for C in PROJECTED_CLASSES)])]


def _seconds(value) -> str:
    return "in the build" if value is None else f"{value:.1f}"


def _breakdown_section(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if "per_class_s" in r]
    if not rows:
        return []
    steps = list(rows[0]["per_class_s"])
    return ["Where a class's compression goes (ms per class, measured on one block in this "
            "process with its threads):", "",
            markdown_table(["C", *steps], [[r["classes"], *(f"{1e3 * r['per_class_s'][s]:.1f}"
                                                             for s in steps)] for r in rows])]


def _reference_section(rows: list[dict], cfg: dict) -> list[str]:
    rows = [r for r in rows if "against_float64" in r]
    if not rows:
        return []
    return ["Decisions against the same classes compressed in float64 (dense scoring of "
            f"{cfg['queries']} queries by both heads):", "",
            markdown_table(
                ["C", "float64 compress (s)", "argmax differ", f"top-{cfg['topk']} entries differ",
                 "score gap where different", "max relative score difference"],
                [[r["classes"], f"{r['reference_compress_s']:.1f}",
                  r["against_float64"]["argmax_differ"],
                  r["against_float64"]["topk_entries_differ"],
                  f"{r['against_float64']['max_score_gap_where_different']:.1g}",
                  f"{r['against_float64']['max_relative_score_difference']:.1g}"] for r in rows])]


def _equality(cell: dict) -> str:
    if cell["equal_to_dense"]:
        return "yes"
    if "differing_entries" not in cell:
        return "no"
    return (f"{cell['differing_entries']} entries differ (score gap <= "
            f"{cell['max_score_gap_where_different']:.1g})")


def plot(payload: dict, path: Path) -> None:
    ok = [r for r in payload["results"] if "error" not in r]
    C = [r["classes"] for r in ok]
    fig, (a, b) = subplots(1, 2, figsize=(11, 4))
    for key, label in (("stats_bytes", "gdacil statistics"), ("head_bytes", "gdacil LR-RGDA head"),
                       ("peak_rss_bytes", "gdacil process peak"),
                       ("peer_dense_fp32_bytes", "dense fp32 covariances"),
                       ("fecam_bytes", "FeCAM (3 float64 copies)")):
        a.plot(C, [r[key] / 1e9 for r in ok], marker="o", label=label)
    a.axhline(8, color="gray", ls=":", label="8 GB")
    a.set(xscale="log", yscale="log", xlabel="classes C", ylabel="GB", title="Memory")
    a.legend(fontsize=7)
    b.plot(C, [r["dense_throughput"] for r in ok], marker="o", label="dense")
    for i, first in enumerate(ok[0]["pruned"] if ok else []):
        what = "argmax" if first["k"] == 1 else f"top-{first['k']}"
        b.plot(C, [r["pruned"][i]["pruned_throughput"] for r in ok], marker="o",
               label=f"exact pruned {what}, {first['screen_dtype']} screening")
    b.set(xscale="log", yscale="log", xlabel="classes C", ylabel="samples/s",
          title="LR-RGDA inference throughput (float32)")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gdacil bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=int, nargs="+", help="class counts (default 100 ... 20000)")
    p.add_argument("--quick", action="store_true", help="tiny grid (seconds), for smoke tests")
    p.add_argument("--inline", action="store_true", help="measure in this process")
    output_arguments(p, "scale", "scale.json, scale.md and scale.png")
    p.add_argument("--cell", type=int, help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cell is not None:  # worker: one class count, JSON on the last line of stdout
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                                  for k, v in json.loads(args.config).items()}
        cfg = ScaleBenchConfig(**fields)
        print(json.dumps(measure(args.cell, cfg)))
        return 0
    refuse_to_overwrite(p, args, "scale.json", "scale.md", "scale.png")
    cfg = QUICK if args.quick else ScaleBenchConfig()
    if args.classes:
        cfg = ScaleBenchConfig(**{**asdict(cfg), "classes": tuple(args.classes)})
    payload = run(cfg, inline=args.inline)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m gdacil bench scale " + " ".join(argv if argv is not None else sys.argv[1:])
    payload["command"] = command.strip()
    write_json(out / "scale.json", payload)
    atomic_write_text(out / "scale.md", render(payload, payload["command"]))
    plot(payload, out / "scale.png")
    print(render(payload, payload["command"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
