"""Serialisable, validated config dataclasses: the common ``to_dict`` / ``from_dict``.

Every Stage-1 config is a frozen dataclass that checks its values in ``__post_init__`` (a bad
value is a ``ValueError`` naming the field) and round-trips through JSON-able dicts.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

__all__ = ["SerialConfig", "check_choice", "check_range"]


def check_range(
    value,
    name: str,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float inside ``[low, high]`` (ends excluded where ``*_open``), else a
    ``ValueError`` naming ``name`` and the allowed interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        ok = above and below
    if not ok:
        left = "(" if low_open else "["
        right = ")" if high_open or high == math.inf else "]"
        raise ValueError(f"{name} must be a finite number in {left}{low}, {high}{right}; "
                         f"got {value!r}")
    return float(value)


def check_choice(value, name: str, choices) -> str:
    """``value`` if it is one of ``choices``, else a ``ValueError`` listing them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; known: {', '.join(map(str, choices))}")
    return value


class SerialConfig:
    """Mixin for frozen config dataclasses: :meth:`to_dict` and :meth:`from_dict`.

    Subclasses list their nested config fields in ``_nested`` (field name -> config class) and
    call :meth:`_coerce_nested` in ``__post_init__``, so nested configs may be given as mappings.
    """

    _nested: ClassVar[dict[str, type[SerialConfig]]] = {}
    if TYPE_CHECKING:  # every subclass is a dataclass, which dataclasses.asdict/fields accept
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def to_dict(self) -> dict:
        """JSON-native dict (tuples become lists) that :meth:`from_dict` turns back into
        an equal config."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | SerialConfig, *, where: str = ""):
        """Build the config from a mapping (nested configs as mappings or instances).

        Missing keys take their defaults; unknown keys raise ``ValueError`` listing the known
        ones. An instance of ``cls`` is returned unchanged.
        """
        if isinstance(data, cls):
            return data
        label = where or cls.__name__
        if not isinstance(data, Mapping):
            raise ValueError(
                f"{label}: expected a mapping; got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{label}: unknown key(s) {unknown}; known: {', '.join(known)}")
        return cls(**data)

    def _coerce_nested(self) -> None:
        """Turn mappings in the ``_nested`` fields into their config classes (call it first in
        ``__post_init__``); anything else but an instance or ``None`` is a ``ValueError``."""
        for key, sub in self._nested.items():
            value = getattr(self, key)
            if isinstance(value, Mapping):
                object.__setattr__(self, key, sub.from_dict(value, where=key))
            elif value is not None and not isinstance(value, sub):
                raise ValueError(f"{key} must be a {sub.__name__} or a mapping; "
                                 f"got {type(value).__name__}")
