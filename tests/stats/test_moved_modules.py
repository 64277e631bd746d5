"""The modules that moved into :mod:`gdacil.stats` stay one release at their old names: each
import warns with a ``FutureWarning`` that names the new module and gives the same objects; and
nothing in src/ or tests/ imports one (the shims are for users' code only)."""

import ast
import importlib
import re
import sys
import warnings
from pathlib import Path

import pytest

import gdacil
from gdacil._deprecation import MOVED_MODULES

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_a_moved_module_warns_at_the_import_and_gives_the_same_objects(old, monkeypatch):
    new = importlib.import_module(MOVED_MODULES[old])
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(FutureWarning, match=re.escape(MOVED_MODULES[old])) as caught:
        shim = __import__(old, fromlist=["*"])
    assert caught[0].filename == __file__  # the warning points at the import
    assert shim.__all__ == new.__all__
    for name in new.__all__:
        assert getattr(shim, name) is getattr(new, name), name


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_a_moved_module_is_an_attribute_of_gdacil_too(old, monkeypatch):
    short = old.rpartition(".")[2]
    if short in vars(gdacil):  # (hasattr would import it)
        monkeypatch.delattr(gdacil, short)
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(FutureWarning, match=re.escape(MOVED_MODULES[old])):
        module = getattr(gdacil, short)
    assert module.__all__ == importlib.import_module(MOVED_MODULES[old]).__all__


def _imported(path: Path) -> set[str]:
    """Modules (and ``module.name``) that a file imports, relative imports resolved; string
    constants that are dotted module paths (``importlib.import_module``, ``monkeypatch``)."""
    tree = ast.parse(path.read_text())
    in_src = path.is_relative_to(ROOT / "src")
    parts = path.relative_to(ROOT / "src").with_suffix("").parts if in_src else ()
    package = list(parts[:-1]) if parts else []
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(
                r"[\w.]+", node.value):
            found.add(node.value)
    return found


def test_nothing_in_src_or_tests_imports_a_moved_module():
    shims = {ROOT / "src" / (old.replace(".", "/") + ".py") for old in MOVED_MODULES}
    shims.add(ROOT / "src" / "gdacil" / "_deprecation.py")
    users = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        if path in shims:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            imported = _imported(path)
        hits = {m for m in imported for old in MOVED_MODULES if m == old or m.startswith(old + ".")}
        users += [f"{path.relative_to(ROOT)}: {m}" for m in sorted(hits)]
    assert not users, "import from the new modules (gdacil._deprecation.MOVED_MODULES):\n" + \
        "\n".join(users)
