"""Every docstring example in gdacil runs and prints what it shows."""

import doctest
import importlib
import pkgutil

import pytest

import gdacil

MODULES = sorted(m.name for m in pkgutil.walk_packages(gdacil.__path__, "gdacil.")
                 if m.name != "gdacil.__main__")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
