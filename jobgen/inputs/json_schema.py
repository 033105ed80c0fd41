"""JSON Schemas (draft 2020-12) of recipes and site profiles, generated from the records the
loader builds (jobgen/inputs/recipe.py, jobgen/inputs/site.py: their field types, defaults and the
comments beside them) and from the value rules both the loader and the schema apply
(jobgen/inputs/limits.py, enforced in jobgen/inputs/rules.py). `jobgen schema recipe|site` prints
them; editors read them through a
`# yaml-language-server: $schema=...` line."""
from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from collections import abc
from typing import Any, Literal, Union, get_args, get_origin

from . import schema
from .limits import RECIPE_LIMITS, SITE_LIMITS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_DESCRIPTIONS: dict[type, dict[str, str]] = {}


def _comments(cls: type) -> dict[str, str]:
    """The comment beside each field in the record's source: its description."""
    if cls not in _DESCRIPTIONS:
        found: dict[str, str] = {}
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            source = ""
        for line in source.splitlines():
            m = re.match(r"\s+(\w+): [^#]+#\s*(.*)", line)
            if m:
                found[m.group(1)] = m.group(2).strip()
        _DESCRIPTIONS[cls] = found
    return _DESCRIPTIONS[cls]


def _of(tp: Any, path: str, limits: dict[str, dict[str, Any]]) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin is Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        out = _of(inner[0], path, limits)
        return {"anyOf": [out, {"type": "null"}]} if type(None) in get_args(tp) else out
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", **limits.get(path, {})}
    if tp is float:
        return {"type": "number", **limits.get(path, {})}
    if tp is str:
        return {"type": "string", **limits.get(path, {})}
    if tp is Any:
        return {}
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _of(args[0], path, limits)}
        return {"type": "array", "prefixItems": [_of(a, path, limits) for a in args],
                "minItems": len(args), "maxItems": len(args)}
    if origin in (dict, abc.Mapping):
        key_tp, val_tp = get_args(tp)
        mapping: dict[str, Any] = {"type": "object",
                                   "additionalProperties": _of(val_tp, f"{path}.*", limits)}
        if path.endswith("env"):
            mapping["propertyNames"] = {"pattern": schema.ENV_NAME_RE.pattern}
        mapping.update(limits.get(path, {}))   # a rule on the keys (eval.tasks)
        return mapping
    if dataclasses.is_dataclass(tp):
        return record(typing.cast(type, tp), limits, path)
    raise TypeError(f"no JSON Schema for {tp!r}")


def record(cls: type, limits: dict[str, dict[str, Any]], path: str = "") -> dict[str, Any]:
    """The schema of one record: every field, required where the record has no default."""
    hints = schema.type_hints(cls)
    notes = _comments(cls)
    properties: dict[str, Any] = {}
    required = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = f"{path}.{field.name}" if path else field.name
        prop = _of(hints[field.name], key, limits)
        if "anyOf" in prop:   # an Optional: the limits belong to the non-null branch
            prop["anyOf"][0].update(limits.get(key, {}))
        if field.name in notes or "description" in field.metadata:
            prop["description"] = notes.get(field.name) or field.metadata["description"]
        if field.default is not dataclasses.MISSING and isinstance(
                field.default, (str, int, float, bool)):
            prop["default"] = field.default
        if (field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING):
            required.append(field.name)
        properties[field.name] = prop
    out: dict[str, Any] = {"type": "object", "properties": properties,
                           "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def recipe_schema() -> dict[str, Any]:
    from .overlays import overlay_backends
    from .recipe import Recipe
    body = record(Recipe, RECIPE_LIMITS)
    # A recipe may carry per-backend overlays of its own values (jobgen/inputs/recipe.py).
    body["properties"]["backends"] = {
        "type": "object", "description": "values that replace the recipe's for one backend",
        "propertyNames": {"enum": list(overlay_backends())},
        "additionalProperties": {"type": "object"}}
    return {"$schema": DRAFT, "$id": "https://jobgen.invalid/schema/recipe.json",
            "title": "jobgen recipe", **body}


def site_schema() -> dict[str, Any]:
    from .site import Site
    return {"$schema": DRAFT, "$id": "https://jobgen.invalid/schema/site.json",
            "title": "jobgen site profile", **record(Site, SITE_LIMITS)}
