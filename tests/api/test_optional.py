"""A missing optional package names the ``pip install "gdacil[extra]"`` that brings it."""

import sys

import pytest
import torch

from gdacil._optional import MissingDependencyError
from gdacil._plotting import subplots
from gdacil.cil.config import apply_overrides
from gdacil.data.cache import extract_features
from gdacil.io import save_tensors


class _Backbone:
    dim, device = 2, torch.device("cpu")

    def __call__(self, batch):
        return torch.zeros(len(batch), 2)


def _hide(monkeypatch, package):
    """Make ``import package`` (and its submodules) fail, as if it were not installed."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)


@pytest.mark.parametrize("package, call, extra", [
    ("yaml", lambda tmp: apply_overrides({}, ["seeds=[1]"]), "gdacil[cli]"),
    ("safetensors", lambda tmp: save_tensors(tmp / "t.safetensors", {"a": torch.ones(1)}, {}),
     "gdacil[io]"),
    ("matplotlib", lambda tmp: subplots(), "gdacil[plot]"),
    ("tqdm", lambda tmp: extract_features(_Backbone(), ["a"], lambda ids: ids, progress=True),
     "gdacil[cli]"),
])
def test_a_missing_extra_names_its_install_line(monkeypatch, tmp_path, package, call, extra):
    _hide(monkeypatch, package)
    with pytest.raises(MissingDependencyError, match=rf"'{package}'.*pip install '{extra}'".replace(
            "[", r"\[").replace("]", r"\]")):
        call(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written
