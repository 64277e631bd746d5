"""Named parameter sets ("presets"), one mechanism for every registered class.

A class lists its presets in ``presets``: a preset name -> the constructor arguments it sets
(the others keep the constructor's defaults). ``from_preset(name, **overrides)`` builds from one;
``name=None`` is the constructor's own defaults, which is what ``defaults=None`` means wherever a
config or a builder takes a preset name (``build_head(..., defaults=)``, ``build_compensator``,
``heads: {lda: {defaults: paper}}``).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["Presets"]


class Presets:
    """``presets`` and ``from_preset`` (see :mod:`gdacil._presets`).

    Examples
    --------
    >>> from gdacil.heads import LRRGDA
    >>> LRRGDA.from_preset("paper", rank=8).identity_scale
    'absolute'
    >>> sorted(LRRGDA.presets)
    ['paper']
    """

    presets: ClassVar[dict[str, dict[str, Any]]] = {}

    @classmethod
    def from_preset(cls, name: str | None = None, /, **overrides):
        """An object with the arguments of preset ``name`` (None: the constructor's defaults),
        updated by ``overrides``. A ``ValueError`` lists the presets for a name the class lacks."""
        if name is None:
            return cls(**overrides)
        if not isinstance(name, str) or name not in cls.presets:
            known = ", ".join(map(repr, cls.presets)) or "none"
            raise ValueError(f"{cls.__name__} has no preset {name!r} (its presets: {known})")
        return cls(**{**cls.presets[name], **overrides})
