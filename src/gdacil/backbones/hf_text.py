"""Hugging Face BERT-style text encoders (BERT, MiniLM, RoBERTa, ...) with CLS, mean or pooler
features."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._deprecation import renamed_parameters
from ..hashing import canonical_json, sha256_json
from .base import Backbone, check_final_norm, normalize_features, portable_location
from .hf import HFOrigin, load_pretrained, transformers_module

__all__ = ["POOLINGS", "HFTextBackbone", "mean_pool"]

#: ``"cls"``: first token of the last layer; ``"mean"``: mask-weighted mean of the last layer
#: (sentence-transformers); ``"pooler"``: the model's pooler (dense + tanh on CLS).
POOLINGS = ("cls", "mean", "pooler")


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden (n, L, d)`` over the positions where ``mask (n, L)`` is 1."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


def _tokenizer_fingerprint(tok) -> str:
    """Hash of a freshly loaded tokenizer (vocabulary, normaliser, special tokens). Take it
    before first use: a fast tokenizer records its last padding/truncation call in its state."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = canonical_json(sorted(tok.get_vocab().items()))
    return sha256_json([type(tok).__name__, text])


class HFTextBackbone(Backbone):
    """A ``transformers`` text encoder.

    Parameters
    ----------
    source : str, optional
        Hub id or local checkpoint directory (default ``"bert-base-uncased"`` when ``config`` is
        not given).
    config : dict, optional
        ``AutoConfig.for_model`` keyword arguments (``model_type`` included): a randomly
        initialised model, for tests. Needs ``tokenizer``.
    tokenizer : str, optional
        Hub id or directory of the tokenizer (default: ``source``).
    pooling : {"cls", "mean", "pooler"}
    final_norm : {"pretrained", "nonaffine_ln", "l2"}
        Applied to the pooled feature (see :data:`~gdacil.backbones.base.FINAL_NORMS`).
    max_length : int
        Longer texts are truncated to this many tokens.
    device, seed, revision, local_files_only, name
        As for :class:`~gdacil.backbones.hf_vision.HFVisionBackbone`.
    """

    modality = "text"

    @renamed_parameters(init_seed="seed")
    def __init__(
        self,
        source: str | None = None,
        *,
        config: dict | None = None,
        tokenizer: str | None = None,
        pooling: str = "cls",
        final_norm: str = "pretrained",
        max_length: int = 128,
        device: torch.device | str | None = None,
        seed: int = 0,
        revision: str | None = None,
        local_files_only: bool = False,
        name: str = "bert",
    ):
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; known: {', '.join(POOLINGS)}")
        if config is not None and tokenizer is None:
            raise ValueError("a randomly initialised text model (config=...) needs tokenizer=")
        self.origin = HFOrigin.resolve(source, config, "bert-base-uncased", revision, seed)
        self.tokenizer_source = tokenizer or self.origin.source
        self.pooling = pooling
        self.final_norm = check_final_norm(final_norm)
        self.max_length = int(max_length)
        tf = transformers_module(f"the Hugging Face text backbone {name!r}")
        model = self.origin.load(
            tf.AutoModel,
            tf.AutoConfig.for_model,
            tf.AutoModel.from_config,
            local_files_only=local_files_only,
        )
        if pooling != "pooler" and getattr(model, "pooler", None) is not None:
            model.pooler = None  # unused: keep it out of the parameters and the fingerprint
        self.tokenizer = load_pretrained(
            tf.AutoTokenizer,
            self.tokenizer_source,
            local_files_only=local_files_only,
            revision=revision,
        )
        self._tokenizer_sha256 = _tokenizer_fingerprint(self.tokenizer)
        model.eval()
        super().__init__(model, model.config.hidden_size, name=name, device=device)

    #: Characters kept per token of ``max_length`` (see :attr:`max_chars`).
    CHARS_PER_TOKEN = 100

    @property
    def max_chars(self) -> int:
        """Texts are clipped to this many characters (``max_length * 100``) before tokenising.

        The clip cannot change what the model sees except for texts with extreme runs of
        whitespace: every WordPiece token covers at least one character and a word of more than
        100 characters becomes one ``[UNK]`` token, so the first ``max_length`` tokens of a text
        come from at most ``max_length * 100`` characters plus the whitespace between them. It
        bounds the tokeniser's work (a 10 MiB text takes milliseconds, not seconds). It is not
        part of :meth:`extraction_config` (feature caches keep their keys).
        """
        return self.max_length * self.CHARS_PER_TOKEN

    def preprocess(self, raw: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenise ``raw`` (strings; each clipped to :attr:`max_chars` characters first)."""
        texts = list(raw)
        bad = next((t for t in texts if not isinstance(t, str)), None)
        if bad is not None:
            raise TypeError(f"text backbones take strings; got {type(bad).__name__}")
        limit = self.max_chars
        texts = [t[:limit] for t in texts]
        enc = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {
            k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")
        }

    def extraction_order(self, raw: Sequence[str]) -> list[int]:
        return sorted(range(len(raw)), key=lambda i: len(raw[i]))  # stable: ties keep input order

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.model(**inputs)
        if self.pooling == "pooler":
            f = out.pooler_output
        elif self.pooling == "mean":
            f = mean_pool(out.last_hidden_state, inputs["attention_mask"])
        else:
            f = out.last_hidden_state[:, 0]
        eps = getattr(self.model.config, "layer_norm_eps", 1e-12)
        return normalize_features(f, self.final_norm, eps=eps)

    def extraction_config(self) -> dict:
        return {
            "class": type(self).__name__,
            "model_class": type(self.model).__name__,
            "pooling": self.pooling,
            "final_norm": self.final_norm,
            "preprocess": {
                "batching": "by length",
                "max_length": self.max_length,
                "tokenizer_sha256": self._tokenizer_sha256,
            },
        }

    def config(self) -> dict:
        return {
            **super().config(),
            **self.origin.to_dict(),
            "tokenizer": portable_location(self.tokenizer_source),
        }
