"""The code passes the project's lint rules (``[tool.ruff.lint]`` in pyproject.toml)."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing_in_src_and_tests():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is not installed: pip install -e '.[test]'"
    result = subprocess.run([ruff, "check", "--no-cache", "src", "tests"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
