"""Constructor parameters, scikit-learn's way: ``get_params``, ``set_params`` and the ``repr``.

A class whose constructor only stores its arguments under their own names (every head,
compensator and estimator of gdacil) gets its parameters from its signature, so a parameter
is declared once, in ``__init__``.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["Params", "parameter_names"]


def parameter_names(cls: type[Any]) -> list[str]:
    """The names of ``cls.__init__``'s parameters, ``self`` and ``*args``/``**kwargs`` left out."""
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


class Params:
    """``get_params``/``set_params`` over the constructor's arguments, and a ``repr`` of them.

    Examples
    --------
    >>> from gdacil.heads import LDA
    >>> head = LDA(shrinkage=0.1).set_params(shrinkage=0.2)
    >>> head.get_params()["shrinkage"]
    0.2
    """

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments, by name (``deep`` is accepted for scikit-learn)."""
        return {name: getattr(self, name) for name in parameter_names(type(self))}

    def set_params(self, **params):
        """Set constructor arguments by name; returns ``self``. An unknown name raises a
        ``ValueError`` listing the valid ones, and nothing is set. A fitted object keeps its
        fitted state until it is fitted again."""
        valid = parameter_names(type(self))
        unknown = sorted(set(params) - set(valid))
        if unknown:
            raise ValueError(f"invalid parameter{'s' * (len(unknown) > 1)} "
                             f"{', '.join(map(repr, unknown))} for {type(self).__name__}; "
                             f"valid: {', '.join(valid)}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"
