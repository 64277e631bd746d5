"""Explicit random generators: every random draw in gdacil takes one (never the global RNG)."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["isolated_global_seed", "make_generator"]


def make_generator(seed, *, name: str = "seed") -> torch.Generator:
    """A CPU ``torch.Generator`` from an int seed, or ``seed`` itself if it is a generator.

    An int gives a fresh generator on every call, so repeated calls draw the same numbers; a
    generator passed in is advanced by every draw. The global RNG is never used.
    """
    if isinstance(seed, torch.Generator):
        return seed
    if isinstance(seed, bool) or not isinstance(seed, int):  # a bad hyperparameter: ValueError
        raise ValueError(
            f"{name} must be an int or a torch.Generator (the global RNG is never used); "
            f"got {seed!r}"
        )
    return torch.Generator().manual_seed(seed)


@contextlib.contextmanager
def isolated_global_seed(seed: int, devices=()):
    """Run code that draws from torch's *global* RNG (e.g. third-party layer initialisation) with
    ``seed``, restoring the global RNG state afterwards so gdacil never leaves a side effect."""
    with torch.random.fork_rng(devices=list(devices)):
        torch.manual_seed(seed)  # intended: inside fork_rng, restored on exit
        yield
