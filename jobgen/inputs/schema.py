"""Strict construction of frozen dataclasses from YAML data.

One constructor for every record jobgen reads (recipes, site profiles): unknown keys, missing keys
and wrong types are errors that carry the file and the full key path, e.g.
``recipes/neox20b.yaml: parallelism.tensor: expected an integer, got 'eight'``.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections import abc
from types import MappingProxyType
from typing import Any, Literal, Mapping, TypeVar, Union, get_args, get_origin

from ..plumbing.errors import ConfigError

T = TypeVar("T")

# Names that reach an #SBATCH line, a file name or an environment variable are restricted to a
# safe alphabet, so that a hostile recipe cannot smuggle a newline into a shell comment line.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def describe(value: Any) -> str:
    """A short, quoted rendering of a bad value for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_word(tp: Any) -> str:
    if tp in _TYPE_WORDS:
        return _TYPE_WORDS[tp]
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin in (dict, abc.Mapping) or dataclasses.is_dataclass(tp):
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) is Union and type(None) in get_args(tp)


def coerce(tp: Any, value: Any, where: str, key: str) -> Any:
    """Check `value` against `tp`; returns the (immutable) value or raises ConfigError."""
    def bad() -> ConfigError:
        return ConfigError(f"{where}: {key}: expected {_type_word(tp)}, got {describe(value)}")

    if tp is Any:
        return value
    if _is_optional(tp):
        if value is None:
            return None
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return coerce(inner, value, where, key)
    origin = get_origin(tp)
    if origin is Literal:
        if value not in get_args(tp) or isinstance(value, bool) != any(
                isinstance(a, bool) for a in get_args(tp)):
            raise bad()
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise bad()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad()
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad()
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad()
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise bad()
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where}: {key}: expected a list of {len(args)} items, "
                              f"got {describe(value)}")
        return tuple(coerce(a, v, where, f"{key}[{i}]")
                     for i, (a, v) in enumerate(zip(args, value)))
    if origin in (dict, abc.Mapping):
        key_tp, val_tp = get_args(tp)
        if not isinstance(value, Mapping):
            raise bad()
        items = []
        for k, v in value.items():
            k2 = coerce(key_tp, k, where, f"{key}.{k}")
            items.append((k2, coerce(val_tp, v, where, f"{key}.{k}")))
        return MappingProxyType(dict(sorted(items)))  # read-only, deterministic order
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise bad()
        return build(typing.cast(type, tp), value, where, key)
    raise TypeError(f"schema type {tp!r} is not supported")  # a bug in a schema, not user input


@functools.lru_cache(maxsize=None)   # in-process: `jobgen check` builds many records
def type_hints(cls: type) -> dict[str, Any]:
    """A record's field types by name, in field order (typing.get_type_hints, once a class)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def build(cls: type[T], data: Mapping[str, Any], where: str, prefix: str = "") -> T:
    """Construct the frozen dataclass `cls` from `data`, refusing unknown and missing keys."""
    hints = type_hints(typing.cast(type, cls))
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    path = f"{prefix}." if prefix else ""
    for name in data:
        if name not in fields:
            known = ", ".join(fields)
            raise ConfigError(f"{where}: {path}{name}: unknown key (known keys: {known})")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = coerce(hints[name], data[name], where, path + name)
        elif (field.default is dataclasses.MISSING
              and field.default_factory is dataclasses.MISSING):
            raise ConfigError(f"{where}: {path}{name}: required key is missing")
    return cls(**kwargs)


def field_type(cls: type, dotted: str, where: str) -> Any:
    """The schema type at a dotted key path, or a ConfigError naming the first unknown part."""
    tp: Any = cls
    seen: list[str] = []
    for part in dotted.split("."):
        if _is_optional(tp):
            (tp,) = [a for a in get_args(tp) if a is not type(None)]
        if get_origin(tp) in (dict, abc.Mapping):
            # A free-form mapping (env, launch): any key, values of the mapping's value type.
            tp = get_args(tp)[1]
            seen.append(part)
            continue
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"{where}: {dotted}: {'.'.join(seen)} is not a mapping")
        hints = type_hints(typing.cast(type, tp))
        if part not in hints:
            raise ConfigError(f"{where}: {'.'.join(seen + [part])}: unknown key "
                              f"(known keys: {', '.join(hints)})")
        tp = hints[part]
        seen.append(part)
    return tp


def to_plain(value: Any) -> Any:
    """A dataclass tree as plain dicts/lists (for `jobgen show` and hashing)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    return value
