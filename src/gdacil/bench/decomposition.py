"""``gdacil bench decomposition``: what LR-RGDA's top-r eigenpairs cost, and how exact they are.

For batches of class covariances with three kinds of spectra, at each dimension ``d``:

- ``fast``: eigenvalues halve every 8 indices (what well-separated features look like);
- ``sample``: sample covariances of ``d + 50`` Gaussian samples (a Marchenko-Pastur spectrum,
  whose eigenvalues around index ``r`` are close together);
- ``plateau``: nearly equal eigenvalues around index ``r`` (relative gaps 1e-3 to 1e-2),

it times the top-``r`` eigenpairs per class by randomized subspace iteration without a
convergence check (gdacil before the check; ``n_iter = 4``), with the check (the default: more
iterations, or an exact decomposition, until the residual is below ``1e-10`` of the top
eigenvalue), and by a full ``eigh``; and states each randomized model's largest relative error
against the exact rank-``r`` model ``U diag(s) U^T``.
"""

from __future__ import annotations

import argparse
import time

import torch

from ..stats.linalg import class_top_eigh, top_eigh
from .common import machine_info, markdown_table, output_arguments, refuse_to_overwrite, write_json

__all__ = ["main", "render", "run", "spectra"]


def spectra(kind: str, d: int, n: int, rank: int, seed: int = 0) -> torch.Tensor:
    """``n`` covariances ``(n, d, d)`` with the spectrum ``kind`` (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "sample":
        X = torch.randn(n, d + 50, d, generator=g, dtype=torch.float64)
        return X.transpose(1, 2) @ X / (d + 50)
    Q = torch.linalg.qr(torch.randn(n, d, d, generator=g, dtype=torch.float64))[0]
    if kind == "fast":
        ev = 0.5 ** (torch.arange(d, dtype=torch.float64) / 8)
    elif kind == "plateau":
        ev = torch.cat([torch.linspace(10.0, 4.0, rank - 1, dtype=torch.float64),
                        torch.tensor([4.0 * (1 - 1e-3)], dtype=torch.float64),
                        torch.linspace(4.0 * (1 - 1e-2), 2.0, 40, dtype=torch.float64),
                        torch.linspace(1.0, 0.01, d - rank - 40, dtype=torch.float64)])
    else:
        raise ValueError(f"unknown spectrum {kind!r}; known: fast, sample, plateau")
    return (Q * ev) @ Q.transpose(1, 2)


def _model(U, s):
    return U @ torch.diag_embed(s) @ U.transpose(-1, -2)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run(dims=(384, 768), kinds=("fast", "sample", "plateau"), n_classes=32, rank=64) -> dict:
    from ..stats.linalg import randomized_top_eigh

    rows = []
    labels = list(range(n_classes))
    for d in dims:
        for kind in kinds:
            A = spectra(kind, d, n_classes, rank)
            exact, t_eigh = _timed(lambda A=A: _model(*top_eigh(A, rank)))
            checked, t_checked = _timed(lambda A=A: _model(*class_top_eigh(
                A, rank, labels, decomposition="randomized")))
            omega = torch.randn(n_classes, d, rank + 16, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(0))
            unchecked, t_unchecked = _timed(lambda A=A, omega=omega: _model(*randomized_top_eigh(
                A, rank, test_matrix=omega, tol=None)))

            def error(M, exact=exact):
                return float(((M - exact).norm(dim=(1, 2)) / exact.norm(dim=(1, 2))).max())

            rows.append({"d": d, "spectrum": kind, "classes": n_classes, "rank": rank,
                         "ms_per_class": {"unchecked": 1e3 * t_unchecked / n_classes,
                                          "checked": 1e3 * t_checked / n_classes,
                                          "eigh": 1e3 * t_eigh / n_classes},
                         "max_model_error": {"unchecked": error(unchecked),
                                             "checked": error(checked)}})
    return {"benchmark": "decomposition", "machine": machine_info(), "results": rows}


def render(payload: dict) -> str:
    rows = [[r["d"], r["spectrum"], *(f"{r['ms_per_class'][k]:.1f}"
                                      for k in ("unchecked", "checked", "eigh")),
             f"{r['max_model_error']['unchecked']:.1e}", f"{r['max_model_error']['checked']:.1e}"]
            for r in payload["results"]]
    m = payload["machine"]
    return "\n".join([
        "# Top-r eigenpairs of class covariances: cost and exactness", "",
        f"r = {payload['results'][0]['rank']}, {payload['results'][0]['classes']} classes per "
        f"batch, float64; {m['processor']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch "
        "thread(s). Error: largest relative Frobenius error of a class's rank-r model against "
        "the exact one.", "",
        markdown_table(["d", "spectrum", "ms/class unchecked", "ms/class checked (default)",
                        "ms/class eigh", "error unchecked", "error checked"], rows)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench decomposition", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", nargs="+", type=int, default=[384, 768])
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    output_arguments(parser, "decomposition", "decomposition.json and decomposition.md")
    args = parser.parse_args(argv)
    refuse_to_overwrite(parser, args, "decomposition.json", "decomposition.md")
    torch.set_num_threads(args.threads)
    payload = run(args.dims, n_classes=args.classes, rank=args.rank)
    text = render(payload)
    from ..io import atomic_write_text

    write_json(args.out / "decomposition.json", payload)
    atomic_write_text(args.out / "decomposition.md", text)
    print(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
