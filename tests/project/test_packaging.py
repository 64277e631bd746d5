"""Packaging metadata says one true thing in one place."""

import importlib.metadata
from pathlib import Path

import gdacil

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_set_once_and_the_installed_metadata_agrees():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert importlib.metadata.version("gdacil") == gdacil.__version__


def test_the_license_file_matches_the_declared_license():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    assert declared == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (ROOT / "src" / "gdacil" / "py.typed").is_file()
