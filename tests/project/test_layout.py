"""The tests mirror the package: one folder per area under tests/, each on pytest's
``pythonpath`` (pyproject.toml) with tests/ itself, so tests import the shared helpers
(tests/_*.py) and each other's by module name; pytest imports test modules by that name too
(``rootdir``-relative, no ``__init__.py``), so the names are unique across the folders."""

import importlib.metadata
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _folders() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def test_test_modules_live_in_folders_under_unique_names():
    assert not sorted(p.name for p in TESTS.glob("test_*.py")), "put it in a folder of tests/"
    names = [p.name for folder in _folders() for p in folder.glob("test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert not [p for folder in _folders() for p in folder.iterdir() if p.is_dir()
                and p.name != "__pycache__"], "one level of folders"


def test_every_test_folder_is_on_the_pythonpath():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    paths = options["ini_options"]["pythonpath"]
    assert paths == ["tests", *(f"tests/{p.name}" for p in _folders())]


def test_no_test_folder_shadows_a_module():
    """tests/ is on sys.path, so each folder is also a namespace package: none may take the
    name of an installed or standard module (a missing ``sklearn`` would seem installed)."""
    taken = set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)
    assert not {p.name for p in TESTS.iterdir() if p.is_dir()} & taken
