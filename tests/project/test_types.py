"""The package type-checks: mypy with ``[tool.mypy]`` of pyproject.toml, on src/gdacil."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_nothing_in_src(request, tmp_path):
    assert importlib.util.find_spec("mypy"), "mypy is not installed: pip install -e '.[test]'"
    # pytest's cache folder (when its cache is on) keeps mypy's: a rerun takes seconds, not 30
    pytest_cache = getattr(request.config, "cache", None)
    cache_dir = pytest_cache.mkdir("mypy") if pytest_cache is not None else tmp_path
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(cache_dir)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
