"""Your own encoder: a backbone around a function gdacil does not ship.

:class:`EncoderBackbone` wraps ``encode(batch of raw inputs) -> (n, dim) array`` (a Python
callable, a sentence-transformers model: :func:`sentence_transformers_encoder`) with what a
model records about its backbone: a registry name, the modality, the dimension and an
``identity`` (a model id and revision, or the sha256 of a local model directory's files:
:func:`directory_identity`), which is its weights fingerprint. Register a factory under a name
(:data:`gdacil.backbones.BACKBONES`) and make a :class:`~gdacil.learner.Learner` with that name;
a model saved with it loads where the same name is registered, and is refused (a
``ValueError`` on its first prediction or learn) when the encoder registered there has another
identity, instead of silently scoring another encoder's features.

>>> import numpy as np
>>> from gdacil.backbones import BACKBONES, EncoderBackbone
>>> def letters(texts):  # counts of a..z: an encoder small enough for an example
...     return np.array([[t.count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for t in texts])
>>> BACKBONES.register("letters-v1", lambda **_: EncoderBackbone(
...     letters, dim=26, modality="text", name="letters-v1", identity={"version": 1}))
... # doctest: +ELLIPSIS
<function <lambda> at ...>
>>> from gdacil.backbones import build_backbone
>>> build_backbone("letters-v1").extract(["abba", "cab"])[:, :3]
tensor([[2., 2., 0.],
        [1., 1., 1.]])

A Hugging Face model in a local directory needs no wrapper: ``Learner("bert",
backbone_options={"source": "/models/my-bert", "local_files_only": True})`` (or ``"vit"``
for images) records the sha256 of its weights, and a model learned from a local directory
refuses weights that differ at load. Embeddings computed anywhere else (a hosted API, another
language) make a vectors model (:class:`~gdacil.backbones.vectors.VectorBackbone`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..hashing import file_sha256s, sha256_json
from .base import Backbone, PreparedInputs, installed_package, portable_location

__all__ = ["EncoderBackbone", "directory_identity", "sentence_transformers_encoder"]

_MODALITIES = ("text", "image")


class EncoderBackbone(Backbone):
    """A backbone whose features are ``encode(raw inputs)``.

    Parameters
    ----------
    encode : callable
        ``encode(list of raw inputs) -> array or tensor (n, dim)`` (texts, or images as the
        learner loads them: PIL images or arrays).
    dim : int
    modality : {"text", "image"}
    name : str
        The registry name it is built by (what a saved model records).
    identity : str or dict
        What identifies the encoder's function (JSON-able): its sha256 is the weights
        fingerprint a saved model keeps and checks at load.
    batch_size : int, default 64
        Inputs per call of ``encode``.
    """

    #: A model refuses this backbone at load when its fingerprint differs (not just a warning)
    strict = True

    def __init__(self, encode: Callable, *, dim: int, modality: str, name: str,
                 identity, batch_size: int = 64, device=None):
        if modality not in _MODALITIES:
            raise ValueError(f"modality must be one of {_MODALITIES}; got {modality!r}")
        if not callable(encode):
            raise TypeError(f"encode must be callable; got {type(encode).__name__}")
        super().__init__(nn.Identity(), dim, name=name, device=device)
        self.modality = modality
        self.encode, self.identity, self.batch_size = encode, identity, batch_size
        sha256_json(identity)  # refuse what JSON cannot hold now, not at save

    def preprocess(self, raw: Sequence) -> dict[str, torch.Tensor]:
        raise NotImplementedError("an EncoderBackbone encodes raw inputs itself (extract)")  # intended: a refusal, not a stub

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError("an EncoderBackbone has no differentiable forward; no "  # intended: a refusal
                                  "strategy can train it")

    def prepare(self, raw: Sequence, *, batch_size: int | None = None) -> PreparedInputs:
        step = max(int(batch_size or self.batch_size), 1)
        return PreparedInputs(len(raw), None, [{"raw": list(raw[s:s + step])}  # type: ignore[dict-item]
                                               for s in range(0, len(raw), step)])

    def extract_prepared(self, prepared: PreparedInputs, *, on_batch=None) -> torch.Tensor:
        out = []
        for batch in prepared.batches:
            raw = list(batch["raw"])
            X = torch.as_tensor(np.asarray(self.encode(raw), dtype=np.float32))
            if X.shape != (len(raw), self.dim):
                raise ValueError(f"encoder {self.name!r} returned shape {tuple(X.shape)} for "
                                 f"{len(raw)} inputs; expected ({len(raw)}, {self.dim})")
            out.append(X)
            if on_batch is not None:
                on_batch(len(X))
        return torch.cat(out) if out else torch.empty(0, self.dim)

    def weights_fingerprint(self) -> str:
        return sha256_json(self.identity)

    def extraction_config(self) -> dict:
        return {"class": type(self).__name__, "identity": self.identity}


def directory_identity(path) -> dict:
    """The identity of a local model directory: where it is (as a record names it, without
    this machine's path) and the sha256 of every file under it, by relative path."""
    root = Path(path).expanduser()
    files = sorted(p for p in root.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"{root}: no files (expected a model directory)")
    digests = file_sha256s(files)
    return {"location": portable_location(str(root)),
            "files_sha256": sha256_json({str(p.relative_to(root)): d
                                         for p, d in zip(files, digests)})}


def sentence_transformers_encoder(path: str, *, name: str = "sentence-transformers",
                                  batch_size: int = 64, device=None) -> EncoderBackbone:
    """A sentence-transformers model (a local directory, or a name in the local cache) as a
    text backbone: its ``encode`` (normalisation as the model's own pipeline has it), its
    identity the directory's files (:func:`directory_identity`) or, for a name, the name and
    the installed sentence-transformers version."""
    from .._optional import require

    st = require("sentence_transformers", feature="sentence-transformers encoders",
                 install="pip install 'gdacil[text]'")
    model = st.SentenceTransformer(path, device=str(device) if device is not None else "cpu")
    dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") \
        else model.get_sentence_embedding_dimension()
    identity = (directory_identity(path) if Path(path).expanduser().is_dir()
                else {"model": path, "package": installed_package("sentence-transformers")})

    def encode(texts):
        return model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True)

    return EncoderBackbone(encode, dim=dim, modality="text", name=name, identity=identity,
                           batch_size=batch_size, device=device)
