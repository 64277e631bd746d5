"""Declared state: what a fitted object holds, and the one way gdacil stores it.

Every stateful object of gdacil (heads, class statistics, compensators, Stage-1 strategies and
the :class:`~gdacil.cil.IncrementalModel` that holds them) implements

- ``state_dict() -> (tensors, metadata)``: its fitted state, tensors by name and JSON-able
  metadata, including the caches worth keeping (LR-RGDA's eigenpairs);
- ``load_state_dict(tensors, metadata) -> self``: that state set on an object built with the
  same parameters.

A class declares its fitted attributes in ``_state_attributes`` (torchmetrics declares its
states with ``add_state`` the same way); :class:`Stateful` turns them into a state and back.
A container nests its parts' states under their names (:func:`nest`, :func:`part`), so a whole
model is one state. :func:`save_state` writes a state to one safetensors file (atomic,
checksummed, no pickle) and :func:`load_state` reads and verifies one: run checkpoints and model
bundles store their states through these two functions only.

Examples
--------
>>> import os, tempfile, torch
>>> from gdacil import ClassGaussians
>>> from gdacil.heads import LDA
>>> g = torch.Generator().manual_seed(0)
>>> X, y = torch.randn(60, 4, generator=g), torch.arange(60) % 3
>>> head = LDA().fit(ClassGaussians(4).update(X, y))
>>> with tempfile.TemporaryDirectory() as tmp:
...     path = save_state(os.path.join(tmp, "head.safetensors"), head.state_dict())
...     copy = LDA().load_state_dict(*load_state(path))
>>> bool((copy.decision_function(X) == head.decision_function(X)).all())
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from ._validation import as_dtype, dtype_name
from .io import load_tensors, save_tensors

__all__ = ["State", "Stateful", "json_params", "load_state", "nest", "part", "restore",
           "save_state"]

#: ``(tensors, metadata)``: what ``state_dict`` returns and ``load_state_dict`` takes
State = tuple[dict[str, torch.Tensor], dict]

_DEVICE, _DTYPE = "__torch_device__", "__torch_dtype__"


def save_state(path: str | os.PathLike, state: State) -> Path:
    """Write ``state`` to one safetensors file (atomic, checksummed; see
    :func:`gdacil.io.save_tensors`)."""
    return save_tensors(path, *state)


def load_state(path: str | os.PathLike) -> State:
    """Read a state written by :func:`save_state`, verifying its checksum (``FileNotFoundError``
    or :class:`~gdacil.io.CorruptFileError` naming the file)."""
    return load_tensors(path)


def restore(obj, path: str | os.PathLike, *, kind: str = "file"):
    """``obj.load_state_dict`` of the state :func:`load_state` reads from ``path``: every error
    of a file that holds another object's state, or one whose entries are missing or mistyped
    (edited, with its checksum recomputed), is a ``ValueError`` naming ``path``."""
    return _restored(obj, load_state(path), str(path), kind)


def _restored(obj, state: State, source: str, kind: str):
    try:
        return obj.load_state_dict(*state, source=source)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{source}: not a valid {type(obj).__name__} {kind} (lacks or "
                         f"mistypes {exc})") from None


def nest(parts: Mapping[str, State]) -> State:
    """One state holding ``parts`` under their names (tensor ``"<name>.<key>"``, metadata
    ``{name: metadata}``)."""
    tensors = {f"{name}.{key}": t for name, (ts, _) in parts.items() for key, t in ts.items()}
    return tensors, {name: meta for name, (_, meta) in parts.items()}


def part(state: State, name: str) -> State:
    """The state nested as ``name`` in ``state`` (the inverse of :func:`nest`)."""
    tensors, metadata = state
    prefix = f"{name}."
    return ({key[len(prefix):]: t for key, t in tensors.items() if key.startswith(prefix)},
            metadata[name])


def json_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor parameters as JSON values: dtypes and devices as their names, arrays as
    lists, mapping keys (priors per class) as strings."""
    return {key: _json_value(value) for key, value in params.items()}


def _json_value(value):
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, torch.device):
        return str(value)
    if hasattr(value, "tolist"):  # numpy and torch arrays
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _encode(value) -> Any:
    """A fitted attribute's value as JSON (devices and dtypes tagged), or a ``TypeError``."""
    if isinstance(value, torch.device):
        return {_DEVICE: str(value)}
    if isinstance(value, torch.dtype):
        return {_DTYPE: dtype_name(value)}
    if value is None or isinstance(value, (bool, int, float, str, list)):
        json.dumps(value)  # a list of JSON values only
        return value
    raise TypeError(f"cannot store a {type(value).__name__} as a fitted value")


def _decode(value) -> Any:
    if isinstance(value, dict) and set(value) == {_DEVICE}:
        return torch.device(value[_DEVICE])
    if isinstance(value, dict) and set(value) == {_DTYPE}:
        return as_dtype(value[_DTYPE])
    return value


class Stateful:
    """``state_dict``/``load_state_dict`` over the fitted attributes a class declares.

    ``_state_attributes`` names them; tensors go to the state's tensors, everything else
    (numbers, strings, lists, devices, dtypes, None) to its metadata under ``"attributes"``,
    beside ``"class"``, the class's name. An attribute not set (an optional fitted value)
    is not stored and is left unset on load. Subclasses add what attributes cannot hold (nested
    states, caches) by extending both methods.
    """

    _state_attributes: ClassVar[tuple[str, ...]] = ()

    def _state_names(self) -> Iterable[str]:
        return self._state_attributes

    def state_dict(self) -> State:
        """``(tensors, metadata)`` of the fitted state (see :mod:`gdacil.state`)."""
        tensors: dict[str, torch.Tensor] = {}
        values: dict[str, Any] = {}
        for name in self._state_names():
            if name not in self.__dict__:
                continue
            value = self.__dict__[name]
            if isinstance(value, torch.Tensor):  # standard strides: safetensors and hashing
                tensors[name] = value.detach().clone(memory_format=torch.contiguous_format)
            else:
                values[name] = _encode(value)
        return tensors, {"class": type(self).__name__, "attributes": values}

    def load_state_dict(self, tensors: Mapping[str, torch.Tensor], metadata: Mapping, *,
                        source: str = "the state"):
        """Set the state :meth:`state_dict` returned; returns ``self``. A ``ValueError`` naming
        ``source`` when the state is another class's or holds attributes this class does not
        declare."""
        found = metadata.get("class")
        if found != type(self).__name__:
            raise ValueError(f"{source}: holds a {found!r}, not a {type(self).__name__!r}")
        declared = set(self._state_names())
        attributes = dict(metadata.get("attributes", {}))
        unknown = sorted((set(attributes) | set(tensors)) - declared)
        if unknown:
            raise ValueError(f"{source}: {type(self).__name__} declares no fitted state "
                             f"{unknown}")
        for name, value in attributes.items():
            setattr(self, name, _decode(value))
        device = self.__dict__.get("device_")
        for name, t in tensors.items():
            # a fresh allocation: tensors read from safetensors may sit at unaligned offsets,
            # where BLAS kernels round differently (last-bit differences in the scores)
            setattr(self, name, t.to(device, copy=True) if device is not None
                    else t.clone(memory_format=torch.contiguous_format))
        return self

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`state_dict` to one safetensors file (:func:`save_state`)."""
        return save_state(path, self.state_dict())

    @classmethod
    def load(cls, path: str | os.PathLike):
        """An object built from the parameters a file written by :meth:`save` records, with
        its state; ``SomeBase.load`` reads a file of any subclass. A ``ValueError`` names the
        file when it holds another kind of object."""
        return cls.from_state(load_state(path), source=str(path), kind="file")

    @classmethod
    def from_state(cls, state: State, *, source: str = "state", kind: str = "state"):
        """An object built from the parameters ``state`` records (``"params"``), with that
        state; a ``ValueError`` naming ``source`` when it is another kind of object's."""
        metadata = state[1]
        target = cls._state_class(metadata)
        if target is None:
            found = metadata.get("format", metadata.get("class"))
            raise ValueError(f"{source}: not a {cls.__name__} {kind} (found {found!r})")
        params = dict(metadata.get("params", {}))
        if isinstance(params.get("priors"), dict):  # JSON keys are strings; labels are ints
            params["priors"] = {int(k): v for k, v in params["priors"].items()}
        try:
            obj = target(**params)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: not a valid {target.__name__} {kind} ({exc})") from None
        return _restored(obj, state, source, kind)

    @classmethod
    def _state_class(cls, metadata: Mapping) -> type | None:
        """``cls`` or the subclass whose state ``metadata`` describes (by ``"class"`` name, or
        by the ``"format"`` of files written before states named their class)."""
        stack: list[type] = [cls]
        while stack:
            kind = stack.pop()
            fmt = getattr(kind, "_FORMAT", None)
            if kind.__name__ == metadata.get("class") or (fmt and fmt == metadata.get("format")):
                return kind
            stack.extend(kind.__subclasses__())
        return None
