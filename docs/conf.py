"""Sphinx configuration of gdacil's documentation site.

Build it with ``sphinx-build -W --keep-going -b html docs build/docs`` after ``pip install -e
'.[docs]'``; tests/project/test_docs_build.py builds it the same way, warnings as errors. The site
is the Markdown pages of docs/ as they are (MyST) and an API reference that autodoc makes from the
numpydoc-style docstrings (napoleon), one hand-listed page per public module under docs/api/.
Nothing is generated into docs/, so a build only writes to its output folder.
"""

import re

from sphinx.ext.napoleon.docstring import NumpyDocstring

import gdacil  # the installed package (pip install -e .): autodoc imports it

project = "gdacil"
author = "the gdacil authors"
copyright = "the gdacil authors"
release = version = gdacil.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# numpydoc-style docstrings (Parameters / Returns / Examples ... sections), read by napoleon's
# NumpyDocstring from _numpy_docstring below rather than by napoleon's own hook
napoleon_google_docstring = False
napoleon_numpy_docstring = False

autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_preserve_defaults = True  # defaults as written (``2**30``), not their repr
autosummary_generate = False  # the tables in docs/api/ link to pages written by hand

myst_heading_anchors = 3  # links to #a-section-title within and between the Markdown pages

html_theme = "alabaster"
html_title = f"gdacil {release}"

# scikit-learn adds set_{fit,partial_fit,score,...}_request methods to every estimator; their
# docstrings refer to scikit-learn's own glossary and are not gdacil's API
_SKLEARN_GENERATED = re.compile(r"set_\w+_request")

# Links from docs/*.md to Markdown files outside docs/ (benchmarks/*.md) work on a repository
# browser but name no page of this site: make them MyST "path:" links, which copy the file into
# the site as a download, instead of a missing-document warning. A target that does not exist
# still fails the build (download.not_readable).
_OUTSIDE_MD_LINK = re.compile(r"\[([^\]]+)\]\((\.\./[^)\s#]+\.md)\)")


def _skip_member(app, what, name, obj, skip, options):
    if _SKLEARN_GENERATED.fullmatch(name):
        return True
    return None


def _numpy_docstring(app, what, name, obj, options, lines):
    # napoleon reads the first line of a data, attribute or property docstring as "type: text"
    # (the Google style); gdacil's are prose ("Every head name, either kind: what configs ...
    # use"), so they are parsed as a module's docstring is: prose and numpydoc sections
    if what in {"attribute", "data", "property"}:
        what = "module"
    lines[:] = NumpyDocstring(lines, app.config, app, what, name, obj, options).lines()


def _outside_links_as_downloads(app, docname, source):
    def link(match):
        return f"[{match[1]}](path:{match[2]})"

    source[0] = _OUTSIDE_MD_LINK.sub(link, source[0])


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-docstring", _numpy_docstring)
    app.connect("source-read", _outside_links_as_downloads)
