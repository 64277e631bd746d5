"""``python -m gdacil.bench NAME [options]``: run a benchmark by name."""

import sys

from . import run_benchmark

if __name__ == "__main__":
    raise SystemExit(run_benchmark(sys.argv[1:]))
