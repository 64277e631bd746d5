"""Typed configuration dataclasses: one base, one parser, one error.

Every configuration of gdacil (the sections of an experiment config, a protocol, a Stage-1
strategy, a learner) is a dataclass deriving from :class:`TypedConfig`. Its
:meth:`~TypedConfig.from_dict` builds one from a mapping as read from YAML or JSON:

* an unknown key is refused, naming the known ones;
* a value of the wrong type for its field's annotation is refused, naming its dotted path
  (``protocol.increment: expected an integer, got 'ten'``);
* a nested config (a field annotated with a :class:`TypedConfig` class, optionally ``| None``,
  or ``dict[str, ThatClass]``) is built from its mapping the same way, one path level down.

Value checks (ranges, choices, relations between fields) stay in each config's
``__post_init__``; whatever fails while building surfaces as one :class:`ConfigError` that says
where. :meth:`~TypedConfig.to_dict` returns the JSON-native mapping that ``from_dict`` turns back
into an equal config.

>>> from gdacil.adapt import StrategyConfig
>>> StrategyConfig.from_dict({"train": {"steps": 5, "lr": 1}}).train.lr
1
>>> StrategyConfig.from_dict({"train": {"lr": "fast"}}, where="strategy")
Traceback (most recent call last):
...
gdacil.typed_config.ConfigError: strategy.train.lr: expected a number, got 'fast'
>>> StrategyConfig.from_dict({"trian": {}})
Traceback (most recent call last):
...
gdacil.typed_config.ConfigError: unknown key(s) ['trian']; known: name, params, kd_weight,
    null_space, lora, first_task_only, train
>>> StrategyConfig().to_dict()["lora"]
{'rank': 4, 'scale': 1.0, 'targets': ['attention', 'mlp_in', 'mlp_out']}
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from Python 3.11

__all__ = ["ConfigError", "TypedConfig"]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key and the fix.

    ``path`` is the dotted key the problem is about (empty for the config as a whole) and
    ``problem`` the message without it.
    """

    def __init__(self, problem: str, *, path: str = ""):
        super().__init__(f"{path}: {problem}" if path else problem)
        self.problem, self.path = problem, path

    def within(self, where: str) -> ConfigError:
        """The same problem seen from the config that holds this one under key ``where``."""
        return ConfigError(self.problem, path=_join(where, self.path)) if where else self


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


class TypedConfig:
    """Base of gdacil's config dataclasses: :meth:`from_dict`, :meth:`to_dict`, nested configs.

    Subclasses are dataclasses. One that takes nested configs given as mappings when built
    directly in Python calls :meth:`_coerce_nested` first in its ``__post_init__``. A field may
    name its own parser in its metadata, ``field(metadata={"parse": fn})`` with
    ``fn(value, path)``, for spellings the annotation cannot describe. A config that sets
    ``_rest`` to the name of a ``dict`` field is written flat: keys that are not fields go
    into that field, and :meth:`to_dict` writes them back beside the others (leaving out the
    other fields that are None), e.g. ``{name: hopdc, defaults: paper, tau: 0.1}``.
    """

    _rest: ClassVar[str | None] = None
    if TYPE_CHECKING:  # every subclass is a dataclass
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @classmethod
    def from_dict(cls, data, *, where: str = "") -> Self:
        """Build the config from a mapping; an instance of ``cls`` is returned unchanged.

        Missing keys take their defaults. ``where`` is the dotted path of ``data`` inside the
        config that holds it, for the messages. Raises :class:`ConfigError` for a value that is
        not a mapping, an unknown or missing key, a value of the wrong type, or a value the
        config refuses.
        """
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise ConfigError(f"expected a mapping, got {type(data).__name__}", path=where)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        if cls._rest is not None:
            own = set(fields) - {cls._rest}
            data = {**{k: v for k, v in data.items() if k in own},
                    cls._rest: {k: v for k, v in data.items() if k not in own}}
        unknown = sorted(map(str, set(data) - set(fields)))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown}; known: {', '.join(fields)}", path=where)
        missing = [name for name, f in fields.items() if name not in data
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"missing key(s) {missing}", path=where)
        hints = _hints(cls)
        kwargs = {key: _parse_field(fields[key], hints[key], value, _join(where, key))
                  for key, value in data.items()}
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            raise exc.within(where) from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc), path=where) from None

    def to_dict(self) -> dict[str, Any]:
        """JSON-native mapping (tuples become lists, nested configs mappings) that
        :meth:`from_dict` turns back into an equal config."""
        out = {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        if self._rest is None:
            return out
        rest = out.pop(self._rest)
        return {**{k: v for k, v in out.items() if v is not None}, **rest}

    def _coerce_nested(self) -> None:
        """Build the nested configs given as mappings (and run the fields' own parsers), so
        that a config built directly takes the spellings :meth:`from_dict` takes."""
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            hint = hints[f.name]
            if "parse" in f.metadata or _config_class(hint) or _config_class(_item_hint(hint)):
                value = _parse_field(f, hint, getattr(self, f.name), f.name)
                object.__setattr__(self, f.name, value)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field annotations of a config class (cached: they never change)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _parse_field(f: dataclasses.Field, hint, value, path: str):
    parse = f.metadata.get("parse")
    return parse(value, path) if parse is not None else _parse(hint, value, path)


def _parse(hint, value, path: str):
    """``value`` checked against annotation ``hint``: nested configs built from mappings,
    lists and tuples converted to the annotated one."""
    config = _config_class(hint)
    if config is not None and isinstance(value, (Mapping, config)):
        return config.from_dict(value, where=path)
    item = _config_class(_item_hint(hint))
    if item is not None and isinstance(value, Mapping):
        return {str(k): item.from_dict(v, where=_join(path, str(k))) for k, v in value.items()}
    if not _type_ok(value, hint):
        raise ConfigError(f"expected {_type_name(hint)}, got {value!r}", path=path)
    if isinstance(value, (list, tuple)):
        return tuple(value) if tuple in _containers(hint) else list(value)
    return value


def _members(hint) -> tuple:
    """The alternatives of a union annotation (``hint`` alone otherwise)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _config_class(hint) -> type[TypedConfig] | None:
    """The config class of a ``Config`` or ``Config | None`` annotation, else None."""
    found = [m for m in _members(hint) if isinstance(m, type) and issubclass(m, TypedConfig)]
    return found[0] if len(found) == 1 else None


def _item_hint(hint):
    """The value annotation of a ``dict[str, X]`` annotation (None for any other)."""
    if typing.get_origin(hint) in (dict, Mapping) and len(typing.get_args(hint)) == 2:
        return typing.get_args(hint)[1]
    return None


def _containers(hint) -> set:
    return {typing.get_origin(m) or m for m in _members(hint)}


def _type_ok(value, hint) -> bool:
    if hint is Any:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_type_ok(value, m) for m in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if not args:
            return True
        if origin is list or args[-1] is Ellipsis:
            return all(_type_ok(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_type_ok, value, args))
    if origin in (dict, Mapping):
        return isinstance(value, Mapping) and (
            len(args) != 2 or all(_type_ok(v, args[1]) for v in value.values()))
    return isinstance(value, origin)


_TYPE_NAMES = {dict: "a mapping", Mapping: "a mapping", list: "a list", tuple: "a list",
               int: "an integer", float: "a number", str: "a string", bool: "true or false",
               type(None): "null"}
_PLURALS = {int: "integers", float: "numbers", str: "strings"}


def _type_name(hint) -> str:
    members = _members(hint)
    if len(members) > 1:
        return " or ".join(_type_name(m) for m in members)
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin in (list, tuple) and args and args[0] in _PLURALS:
        return f"a list of {_PLURALS[args[0]]}"
    if origin in _TYPE_NAMES:
        return _TYPE_NAMES[origin]
    if isinstance(origin, type) and issubclass(origin, TypedConfig):
        return "a mapping"
    return getattr(origin, "__name__", None) or str(hint).replace("typing.", "")


def _jsonable(value):
    if isinstance(value, TypedConfig):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
