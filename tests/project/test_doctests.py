"""Every docstring example in gdacil runs and prints what it shows (the stdlib ``doctest``).

The modules are found from the files of the installed package, not by importing it, so a module
that cannot be imported fails its own test instead of dropping out of the list. Examples are
marked ``# doctest: +SKIP`` only where they show a sketch with placeholder files (the
``gdacil.learner`` overview); the rest run on small seeded data or the offline assets that
scripts/install.sh installs.
"""

import doctest
import importlib
import re
from pathlib import Path

import pytest

import gdacil
from gdacil._deprecation import MOVED_MODULES

from _assets import needs_fashion_mnist, needs_minilm, needs_transformers

PACKAGE = Path(gdacil.__file__).resolve().parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: Fewest examples that run (not skipped) over the whole package; raise it as examples are added,
#: so that a change that silently stops collecting examples fails here
MIN_EXAMPLES = 320

#: Examples that need an offline asset: skipped where it is missing, failed under CI (_assets.py)
NEEDS = {
    "gdacil.backbones": [needs_transformers],
    "gdacil.data": [needs_fashion_mnist],
    "gdacil.data.cache": [needs_fashion_mnist, needs_transformers],
    "gdacil.learner.learner": [needs_minilm],
    "gdacil.learner.serve": [needs_minilm],
}

#: Modules whose examples are not run, and why (empty: every module's examples run)
EXCLUDED: dict[str, str] = {}


def _module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":  # ``python -m`` entry points: importing runs the command
            continue
        if ".".join(parts) in MOVED_MODULES:  # shims of moved modules: importing warns
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _module_names()


def _params():
    for name in MODULES:
        marks = list(NEEDS.get(name, []))
        if name in EXCLUDED:
            marks.append(pytest.mark.skip(reason=EXCLUDED[name]))
        yield pytest.param(name, marks=marks, id=name)


def _doctests(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder(exclude_empty=True).find(module) if t.examples]


def _runs(example: doctest.Example) -> bool:
    return not example.options.get(doctest.SKIP, False)


@pytest.mark.parametrize("name", _params())
def test_docstring_examples(name):
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS, verbose=False)
    for test in _doctests(name):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, (f"{result.failed} of {result.attempted} examples failed in "
                                f"{name}:\n" + "".join(report))


def test_every_example_is_collected():
    """Each ``>>>`` prompt in a source file is an example that the finder collects, and at least
    :data:`MIN_EXAMPLES` of them run; prints which modules hold how many."""
    assert len(MODULES) > 80 and "gdacil.heads.lowrank" in MODULES, MODULES
    found: dict[str, int] = {}  # source file -> examples collected from it
    running: dict[str, int] = {}  # module -> examples that are not skipped
    for name in MODULES:
        for test in _doctests(name):
            source = str(Path(test.filename).resolve())
            found[source] = found.get(source, 0) + len(test.examples)
            running[name] = running.get(name, 0) + sum(map(_runs, test.examples))
    prompts = {str(path): n for path in PACKAGE.rglob("*.py")
               if (n := len(re.findall(r"^\s*>>>", path.read_text(), flags=re.M)))}
    total = sum(n for name, n in running.items() if name not in EXCLUDED)
    table = "\n".join(f"  {name:45s} {n:4d}" for name, n in sorted(running.items()))
    print(f"{total} examples run, by module ({len(MODULES)} modules checked):\n{table}")
    assert found == prompts, "some >>> prompts are not collected as examples (a docstring the "\
        "finder does not see, such as one of a decorated function?)"
    assert total >= MIN_EXAMPLES, f"only {total} examples run:\n{table}"
