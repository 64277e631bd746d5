"""Figures drawn without pyplot, so gdacil never changes the user's matplotlib state (the
backend, the list of open figures), and saved atomically."""

from __future__ import annotations

import io
import os
from pathlib import Path

from ._optional import require
from .io import atomic_write_bytes

__all__ = ["save_figure", "subplots"]


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    """``(figure, axes)`` as ``matplotlib.pyplot.subplots`` returns them, on a figure that no
    pyplot state holds (nothing to close; rendered by Agg when saved)."""
    figure = require("matplotlib.figure", feature="plots", install="pip install 'gdacil[plot]'")
    fig = figure.Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig, path: str | os.PathLike, *, dpi: int = 120) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically (the whole file or nothing)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_bytes(path, buf.getvalue())
