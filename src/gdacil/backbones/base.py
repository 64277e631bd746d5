"""The backbone interface: raw inputs in, fixed-dimension features out, plus a fingerprint."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._hardware import native_bfloat16
from .._validation import as_device, check_choice
from ..hashing import sha256_json, sha256_tensors
from .blocks import BlockLinears, find_blocks
from .preprocess import ImagePreprocess

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = [
    "FINAL_NORMS",
    "PRECISIONS",
    "Backbone",
    "ImageBackbone",
    "PreparedInputs",
    "check_final_norm",
    "installed_package",
    "make_final_layernorm_nonaffine",
    "normalize_features",
    "portable_location",
]

#: What is applied at the end of a backbone:
#: ``"pretrained"``: the model as shipped (for ViTs its learned final LayerNorm);
#: ``"nonaffine_ln"``: a parameter-free LayerNorm (zero mean, unit variance per sample; for ViTs it
#: replaces the final LayerNorm, as the reference code does for every backbone);
#: ``"l2"``: as shipped, then L2-normalised (what sentence-transformers does).
FINAL_NORMS = ("pretrained", "nonaffine_ln", "l2")


def portable_location(location) -> str | None:
    """How a record names where weights come from without a path of this machine: a hub id
    (``"bert-base-uncased"``) or None as it is; a local file or folder (an absolute path, or
    one that exists here) as ``"local:<its name>"`` (``"local:all-MiniLM-L6-v2"``). What
    identifies the weights is their sha256, which records keep beside it."""
    if location is None:
        return None
    text = str(location)
    path = Path(text).expanduser()
    if path.is_absolute() or text.startswith(("~", "./", "../")) or path.exists():
        return f"local:{path.name or text}"
    return text


def installed_package(distribution: str) -> dict:
    """``{"name": distribution, "version": ...}`` of an installed distribution (version None
    when it is not installed): which package shipped a backbone's weights."""
    from importlib import metadata

    try:
        version: str | None = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        version = None
    return {"name": distribution, "version": version}


def check_final_norm(final_norm: str) -> str:
    if final_norm not in FINAL_NORMS:
        raise ValueError(f"unknown final_norm {final_norm!r}; known: {', '.join(FINAL_NORMS)}")
    return final_norm


def normalize_features(
    f: torch.Tensor, final_norm: str, eps: float = 1e-12, *, in_model: bool = False
) -> torch.Tensor:
    """Apply ``final_norm`` to features ``(n, d)`` (see :data:`FINAL_NORMS`).

    ``in_model=True``: the model already holds the non-affine LayerNorm (see
    :func:`make_final_layernorm_nonaffine`), so only ``"l2"`` is left to apply.
    """
    if final_norm == "l2":
        return nn.functional.normalize(f, dim=-1)
    if final_norm == "nonaffine_ln" and not in_model:
        return nn.functional.layer_norm(f, f.shape[-1:], eps=eps)
    return f


def make_final_layernorm_nonaffine(model: nn.Module, path: str) -> None:
    """Replace the ``nn.LayerNorm`` at module ``path`` by a parameter-free one (same shape and
    eps), in place: the reference code's treatment of every ViT's final norm."""
    old = model.get_submodule(path)
    if not isinstance(old, nn.LayerNorm):
        raise TypeError(f"{path} is a {type(old).__name__}, not a LayerNorm")
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    new = nn.LayerNorm(old.normalized_shape, eps=old.eps, elementwise_affine=False)
    setattr(parent, attr, new)


#: Forward-pass precisions: the autocast dtype of each (None: plain float32)
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device) -> str:
    """``precision``, with "auto" resolved for ``device``: "bf16" where bfloat16 is native
    (:func:`gdacil._hardware.native_bfloat16`), "fp32" elsewhere. On the demo and a SeqFT run,
    bf16 stayed within 0.2 points of fp32 on every head (``benchmarks/precision.md``)."""
    if precision == "auto":
        return "bf16" if native_bfloat16(as_device(device)) else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; known: auto, {', '.join(PRECISIONS)}")
    return precision


def check_precision(precision, strategy: str) -> str:
    """``precision`` if it is "auto" or one of :data:`PRECISIONS` and can run ``strategy`` (the
    name of the Stage-1 strategy: fp16 has no loss scaling, so it cannot train); else a
    ``ValueError`` saying why."""
    check_choice(precision, "precision", ("auto", *PRECISIONS))
    if precision == "fp16" and strategy != "frozen":
        raise ValueError("fp16 cannot train the backbone (no loss scaling): use bf16 with "
                         f"strategy {strategy!r}, or fp16 with frozen")
    return precision


class KeptCasts:
    """Keeps a backbone's low-precision weight casts from one forward to the next, in the
    thread that calls :meth:`keep` (a prediction worker's).

    Under ``torch.autocast`` every forward casts the float32 weights again, and the casts are
    dropped when the outermost autocast context exits: MiniLM on one input took 28 ms in bf16
    against 7 ms in fp32, 5.5 ms of it with the casts kept. :meth:`keep` holds one outer
    autocast context, disabled (nothing runs in low precision outside :meth:`Backbone.autocast`),
    so the casts of every forward in this thread stay cached until :meth:`release` or the next
    backbone. A weight changed in place while they are kept is not seen: only a thread that
    never trains (and whose backbone nobody changes) may keep them. The casts are those
    autocast makes, so the features are the same bits.
    """

    def __init__(self):
        self._held: tuple[Backbone, int, torch.autocast] | None = None

    def keep(self, backbone: Backbone) -> None:
        """Keep ``backbone``'s casts in this thread from now on (those kept before are freed)."""
        thread = threading.get_ident()
        if self._held is not None and self._held[:2] == (backbone, thread):
            return
        self.release()
        if backbone.precision == "fp32":
            return
        context = torch.autocast(backbone.device.type, enabled=False)
        context.__enter__()
        self._held = (backbone, thread, context)

    def release(self) -> None:
        """Drop the kept casts. Only the thread that kept them can exit their context; one
        that has ended took them with it."""
        if self._held is not None and self._held[1] == threading.get_ident():
            self._held[2].__exit__(None, None, None)
        self._held = None


@dataclass
class PreparedInputs:
    """Preprocessed model inputs of ``n`` raw samples: CPU tensor batches in ``order`` (None:
    input order), what :meth:`Backbone.prepare` returns and :meth:`Backbone.extract_prepared`
    runs."""

    n: int
    order: list[int] | None
    batches: list[dict[str, torch.Tensor]]

    def pin_memory(self) -> PreparedInputs:
        """Page-locked copies of the batches (``torch.utils.data.DataLoader(pin_memory=True)``
        calls this), for asynchronous copies to a GPU."""
        return PreparedInputs(self.n, self.order,
                              [{k: v.pin_memory() for k, v in b.items()} for b in self.batches])


def _state_version(state: list[tuple[str, torch.Tensor]]) -> list[tuple]:
    """What identifies the current values of a state dict without reading them: each tensor
    with its storage address, version counter, shape, dtype and device."""
    return [(name, t, t.data_ptr(), t._version, tuple(t.shape), t.dtype, t.device)
            for name, t in state]


def _same_version(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[2:] == y[2:] for x, y in zip(a, b))


class Backbone(abc.ABC):
    """A feature extractor with its own preprocessing.

    Subclasses set :attr:`model` (the ``torch.nn.Module`` that Stage-1 strategies may train),
    :attr:`dim` and :attr:`modality`, and implement :meth:`preprocess`, :meth:`forward` and
    :meth:`extraction_config`.

    Parameters
    ----------
    model : torch.nn.Module
    dim : int
        Feature dimension.
    name : str
        Registry name (recorded in :meth:`config`).
    device : None, str or torch.device, default None
        Where the model runs (None: the CPU).
    """

    #: ``"image"`` or ``"text"``: what :meth:`preprocess` accepts.
    modality: str = ""
    #: The installed distribution that shipped the weights (``{"name", "version"}``), if one
    #: did: recorded by :meth:`config` (:func:`installed_package`).
    package: dict | None = None

    def __init__(
        self, model: nn.Module, dim: int, *, name: str, device: torch.device | str | None = None
    ):
        self.device = as_device(device)
        self.model = model.to(self.device)
        self.dim = int(dim)
        self.name = name

    #: Arithmetic of the forward passes: "fp32", or "bf16"/"fp16" under ``torch.autocast``
    #: (features come back as float32 either way; see :meth:`set_precision`)
    precision: str = "fp32"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dim={self.dim}, device={self.device})"

    def set_precision(self, precision: str) -> Self:
        """Run forward passes (extraction and Stage-1 training) in ``precision``: "fp32", "bf16"
        or "fp16" (mixed precision under ``torch.autocast``; weights stay float32, features come
        back as float32 and statistics are accumulated in float64), or "auto": bf16 where this
        backbone's device computes it natively, fp32 elsewhere (:func:`resolve_precision`).
        Part of :meth:`fingerprint`, so features cached at one precision are never served for
        another. Returns ``self``."""
        self.precision = resolve_precision(precision, self.device)
        return self

    def autocast(self):
        """The ``torch.autocast`` context of :attr:`precision` on this backbone's device (it does
        nothing for "fp32")."""
        dtype = PRECISIONS[self.precision]
        return torch.autocast(self.device.type, dtype=dtype or torch.bfloat16,
                              enabled=dtype is not None)

    @abc.abstractmethod
    def preprocess(self, raw: Sequence) -> dict[str, torch.Tensor]:
        """Turn a batch of raw inputs into model inputs (CPU tensors)."""

    @abc.abstractmethod
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Features ``(n, dim)`` of preprocessed inputs (on :attr:`device`); differentiable."""

    @abc.abstractmethod
    def extraction_config(self) -> dict:
        """JSON-able description of everything except the weights that determines the features
        (architecture, pooling, final norm, preprocessing). Part of :meth:`fingerprint`."""

    def config(self) -> dict:
        """JSON-able record of this backbone (registry name plus :meth:`extraction_config`,
        and the installed ``package`` that shipped its weights, if one did). It names no path
        of this machine (:func:`portable_location`): a saved model records it."""
        return {"name": self.name, "dim": self.dim, **self.extraction_config(),
                **({"package": self.package} if self.package else {})}

    def to(self, device: torch.device | str) -> Self:
        """Move the model to ``device`` (in place); returns ``self``."""
        self.device = as_device(device)
        self.model.to(self.device)
        return self

    def extract(self, raw: Sequence, *, batch_size: int | None = None) -> torch.Tensor:
        """Features of raw inputs in evaluation mode, without gradients: float32 ``(n, dim)`` on
        the CPU. The model's train/eval mode is restored afterwards.

        The same as :meth:`extract_prepared` of :meth:`prepare`: an input pipeline runs
        ``prepare`` in worker processes and only the forward passes in this one."""
        return self.extract_prepared(self.prepare(raw, batch_size=batch_size))

    def prepare(self, raw: Sequence, *, batch_size: int | None = None) -> PreparedInputs:
        """The CPU work of :meth:`extract`: order the inputs (:meth:`extraction_order`), cut
        them into batches of ``batch_size`` and preprocess each; touches no model weight."""
        n = len(raw)
        step = max(n if not batch_size else int(batch_size), 1)
        order = self.extraction_order(raw)
        batches = []
        for start in range(0, n, step):
            if order is None:
                batch = raw[start : start + step]
            else:
                batch = [raw[i] for i in order[start : start + step]]
            batches.append(self.preprocess(batch))
        return PreparedInputs(n, order, batches)

    def extract_prepared(self, prepared: PreparedInputs, *,
                         on_batch: Callable[[int], object] | None = None) -> torch.Tensor:
        """Features of :meth:`prepare`'s batches, in the order of the raw inputs;
        ``on_batch(n)`` is called after each forward pass of ``n`` samples (progress bars)."""
        was_training = self.model.training
        self.model.eval()
        out = []
        try:
            with torch.no_grad(), self.autocast():
                for inputs in prepared.batches:
                    inputs = {k: v.to(self.device, non_blocking=True) for k, v in inputs.items()}
                    out.append(self.forward(inputs).float().cpu())
                    if on_batch is not None:
                        on_batch(len(out[-1]))
        finally:
            self.model.train(was_training)
        if not out:
            return torch.empty(0, self.dim)
        if prepared.order is None:
            return torch.cat(out)
        features = torch.empty(prepared.n, self.dim)
        features[torch.as_tensor(prepared.order, dtype=torch.long)] = torch.cat(out)
        return features

    def extraction_order(self, raw: Sequence) -> list[int] | None:
        """The order in which :meth:`extract` batches the inputs, or None for input order
        (features always come back in input order). Text backbones batch similar lengths
        together, so little compute goes to padding."""
        return None

    def weights_fingerprint(self) -> str:
        """sha256 of every tensor in ``model.state_dict()`` (sorted by name): changes with any
        weight, buffer or adapter registered in the model.

        The hash is computed once per state of the weights: it is reused while every tensor is
        the same object (same storage) at the same version counter, which torch advances at
        every in-place write (optimizer steps, ``load_state_dict``, ``copy_``). Replacing,
        adding or removing a tensor, or writing into one, hashes again. Writes that bypass
        torch (into a ``tensor.numpy()`` view) are not seen: call :meth:`forget_fingerprint`
        after them.
        """
        state = sorted(self.model.state_dict().items())
        version = _state_version(state)
        cached = self.__dict__.get("_weights_fingerprint")
        if cached is None or not _same_version(cached[0], version):
            # the tensors stay referenced with the hash, so their storage cannot be freed and
            # reused by a new tensor at the same address
            self._weights_fingerprint = (version, sha256_tensors(state))
        return self._weights_fingerprint[1]

    def forget_fingerprint(self) -> None:
        """Drop the cached weights hash (after writing into weights outside torch)."""
        self.__dict__.pop("_weights_fingerprint", None)

    def fingerprint(self) -> str:
        """Stable hash of the weights and of :meth:`extraction_config`: equal fingerprints give
        equal features (up to device round-off). Used as the feature-cache key."""
        key = {"extraction": self.extraction_config(), "weights": self.weights_fingerprint()}
        if self.precision != "fp32":  # fp32 keys stay those of the caches written before
            key["precision"] = self.precision
        return sha256_json(key)

    def blocks(self) -> list[BlockLinears]:
        """The linear layers of each transformer block (see :func:`find_blocks`)."""
        return find_blocks(self.model)


class ImageBackbone(Backbone):
    """A backbone over images, preprocessed by an :class:`ImagePreprocess` (``transform``).

    Subclasses set ``final_norm`` and implement :meth:`forward` and :meth:`architecture`.
    """

    modality = "image"
    final_norm: str = "pretrained"

    def __init__(
        self,
        model: nn.Module,
        dim: int,
        *,
        transform: ImagePreprocess | dict,
        name: str,
        device: torch.device | str | None = None,
    ):
        if isinstance(transform, dict):
            transform = ImagePreprocess(**transform)
        elif not isinstance(transform, ImagePreprocess):
            raise TypeError(f"preprocess must be an ImagePreprocess or a mapping of its fields; "
                            f"got {transform!r}")
        self.transform = transform
        super().__init__(model, dim, name=name, device=device)

    def preprocess(self, raw: Sequence) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.transform(raw)}

    @abc.abstractmethod
    def architecture(self) -> dict:
        """JSON-able description of the network (class, family, checkpoint name...)."""

    def extraction_config(self) -> dict:
        return {
            "class": type(self).__name__,
            **self.architecture(),
            "final_norm": self.final_norm,
            "preprocess": self.transform.to_dict(),
        }
