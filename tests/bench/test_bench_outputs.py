"""Benchmarks write to a fresh folder by default and never replace results unless asked."""

import importlib
from pathlib import Path

import pytest

from gdacil.bench.common import DEFAULT_OUT

# module -> a file it writes; every module's refusal happens before any measurement
BENCHES = {"speed": "speed.json", "scale": "scale.json", "drift": "drift.json",
           "decomposition": "decomposition.json", "heads": "anchors.json",
           "defaults": "defaults.json", "strategies": "strategies.json",
           "pipeline": "pipeline.json", "serve": "serve.json", "sharded": "sharded.json"}


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_existing_results_are_refused_without_overwrite(name, tmp_path, capsys):
    bench = importlib.import_module(f"gdacil.bench.{name}")
    (tmp_path / BENCHES[name]).write_text("{}")
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path)])
    assert f"{tmp_path / BENCHES[name]} exists; pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / BENCHES[name]).read_text() == "{}"


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_the_default_output_is_outside_the_committed_results(name, capsys):
    bench = importlib.import_module(f"gdacil.bench.{name}")
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default runs/bench/{name}/" in help_text
    assert Path("runs") / "bench" == DEFAULT_OUT
