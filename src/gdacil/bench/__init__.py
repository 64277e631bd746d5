"""Benchmarks that print their figures and write JSON, markdown and plots.

They ship with the package because ``gdacil bench NAME`` is a user command: users measure gdacil
on their own hardware. They observe gdacil only through its public interfaces (callbacks, the
timings a run records, return values) and never patch it (``benchmarks/README.md``).
"""

from __future__ import annotations

import importlib

BENCHMARKS = {
    "heads": "gdacil.bench.heads",
    "decomposition": "gdacil.bench.decomposition",
    "speed": "gdacil.bench.speed",
    "defaults": "gdacil.bench.defaults",
    "drift": "gdacil.bench.drift",
    "strategies": "gdacil.bench.strategies",
    "strategies-images": "gdacil.bench.strategies_images",
    "scale": "gdacil.bench.scale",
    "ranpac-lambda": "gdacil.bench.ranpac_lambda",
    "pipeline": "gdacil.bench.pipeline",
    "serve": "gdacil.bench.serve",
    "sharded": "gdacil.bench.sharded",
    "openset": "gdacil.bench.openset",
    "vectors": "gdacil.bench.vectors",
}


def run_benchmark(argv: list[str]) -> int:
    """Dispatch ``NAME [options]`` to the benchmark module's ``main``."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m gdacil.bench {" + ",".join(BENCHMARKS) + "} [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
        return 2
    return importlib.import_module(BENCHMARKS[name]).main(rest)
