"""The documentation site (docs/conf.py: Sphinx, MyST pages, autodoc API reference) builds with
warnings as errors, and has its pages."""

import subprocess
import sys
from pathlib import Path

from _assets import needs_module

DOCS = Path(__file__).resolve().parents[2] / "docs"

pytestmark = [needs_module("sphinx", "pip install -e '.[docs]'"),
              needs_module("myst_parser", "pip install -e '.[docs]'")]


def test_docs_build_without_warnings(tmp_path):
    html = tmp_path / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
               "-d", str(tmp_path / "doctrees"), str(DOCS), str(html)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout}\n{result.stderr}"

    for page in sorted(DOCS.glob("*.md")):  # every Markdown page is in the site
        assert (html / page.with_suffix(".html").name).is_file(), page.name
    modules = [p.stem for p in sorted((DOCS / "api").glob("gdacil*.rst"))]
    assert {"gdacil", "gdacil.heads", "gdacil.stats", "gdacil.drift", "gdacil.sklearn",
            "gdacil.learner"} <= set(modules)
    api_index = (html / "api" / "index.html").read_text()
    for module in modules:
        assert f'href="{module}.html' in api_index, module
        assert (html / "api" / f"{module}.html").is_file(), module
    heads = (html / "api" / "gdacil.heads.html").read_text()
    assert 'id="gdacil.heads.LRRGDA"' in heads and "Low-rank regularised Gaussian" in heads
    assert 'id="gdacil.heads.LRRGDA.fit"' in heads  # members are documented, not just classes
