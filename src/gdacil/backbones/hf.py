"""Loading Hugging Face ``transformers`` models: from a hub id, a local directory, or a config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from .._optional import require
from .._random import isolated_global_seed

__all__ = ["HFOrigin", "load_pretrained", "seeded_init", "transformers_module"]


def transformers_module(feature: str):
    return require("transformers", feature=feature, install="pip install transformers")


def load_pretrained(
    model_class,
    source: str,
    *,
    local_files_only: bool = False,
    revision: str | None = None,
    **kwargs,
):
    """``model_class.from_pretrained(source)`` with an error that says what to do when offline.

    A local directory is read with ``local_files_only=True`` (never touches the hub).
    """
    local = Path(source).expanduser().is_dir()
    try:
        return model_class.from_pretrained(
            str(Path(source).expanduser()) if local else source,
            local_files_only=local or local_files_only,
            revision=revision,
            **kwargs,
        )
    except OSError as err:
        where = (
            f"the directory {source!r} does not hold a Hugging Face checkpoint"
            if local
            else f"{source!r} is not a local directory and the Hugging Face hub could not provide "
            f"it (no internet access?); download it where you have access and pass the "
            f"directory as source="
        )
        raise OSError(
            f"could not load {model_class.__name__} from {source!r}: {where}. Cause: {err}"
        ) from err


def seeded_init(factory, config, *, seed: int = 0, **kwargs):
    """A randomly initialised ``factory(config, **kwargs)``, seeded with ``seed`` inside a
    forked RNG so the global torch RNG is left as it was."""
    with isolated_global_seed(seed):
        return factory(config, **kwargs)


@dataclass(frozen=True)
class HFOrigin:
    """Where a ``transformers`` model comes from: a hub id or directory, or a config for a
    randomly initialised model.

    Build it with :meth:`resolve`, which refuses both at once and fills in the default source.
    """

    source: str | None
    config: dict | None
    revision: str | None = None
    seed: int = 0

    @classmethod
    def resolve(cls, source, config, default: str, revision=None, seed: int = 0):
        if source is not None and config is not None:
            raise ValueError(
                "pass either source (pretrained weights) or config (random init), not both"
            )
        if config is not None:
            if not isinstance(config, Mapping):  # a TypeError: the option's type is wrong
                raise TypeError(f"the option config must be a mapping of transformers config "
                                f"values (JSON such as config='{{\"hidden_size\": 16}}'); got "
                                f"{config!r}")
            return cls(None, dict(config), revision, seed)
        return cls(source or default, None, revision, seed)

    def load(self, pretrained, make_config, from_config, *, local_files_only=False, **kwargs):
        """``pretrained.from_pretrained(source)``, or ``from_config(make_config(**config))``
        initialised with ``seed``; ``kwargs`` go to both."""
        if self.config is not None:
            return seeded_init(
                from_config, make_config(**self.config), seed=self.seed, **kwargs
            )
        return load_pretrained(
            pretrained,
            cast(str, self.source),  # resolve sets it when there is no config
            local_files_only=local_files_only,
            revision=self.revision,
            **kwargs,
        )

    def to_dict(self) -> dict:
        """A JSON-able record that names no path of this machine: a local checkpoint directory
        is recorded as ``"local:<its name>"`` (:func:`~gdacil.backbones.base.portable_location`)."""
        from .base import portable_location

        return {
            "source": portable_location(self.source),
            "config": self.config,
            "revision": self.revision,
            "seed": self.seed,
        }
