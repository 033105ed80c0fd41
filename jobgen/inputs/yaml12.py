"""The one YAML reader for recipes, site profiles and `--set` values: YAML 1.2 core-schema
scalars, duplicate keys refused, and bounds on what a hostile file can make the loader do.

PyYAML implements YAML 1.1 (`041000` octal, `yes`/`on` booleans, `1e5` a string); users mean YAML
1.2. Aliases are expanded by sharing, which makes a "billion laughs" file cheap to parse and
exponential to walk: their number, the nesting depth and the input size are bounded while the
document is composed, before anything walks it.
"""
from __future__ import annotations

import re
from typing import Any

import yaml

MAX_BYTES = 1 << 20       # a recipe is a few kB
MAX_DEPTH = 32            # the schema nests 3 deep
MAX_ALIASES = 64


class YamlError(Exception):
    """A problem with the document: message and 1-based line (or None)."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


# Anchored: PyYAML's resolvers use re.match.
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


class Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema and the bounds above."""

    yaml_implicit_resolvers: dict[Any, Any] = {}

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlError(f"more than {MAX_ALIASES} aliases (*name)",
                                self.peek_event().start_mark.line + 1)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlError(f"nested more than {MAX_DEPTH} levels deep",
                                self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (list, dict)):
                raise YamlError("a mapping key must be a plain value", key_node.start_mark.line + 1)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise YamlError(f"{key}: duplicate key (first on line {seen[key]})", line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


MAX_DIGITS = 40    # no number jobgen takes has more digits (2**64 has 20); int() of 4,301 refuses


def _int(loader: Loader, node: Any) -> int:
    text = loader.construct_scalar(node)
    if len(text) > MAX_DIGITS:
        raise YamlError(f"{text[:12]}...: an integer of {len(text):,} characters; at most "
                        f"{MAX_DIGITS}", node.start_mark.line + 1)
    if text.startswith(("0o", "0x")):
        return int(text, 0)
    return int(text, 10)          # YAML 1.2: leading zeros are decimal


def _float(loader: Loader, node: Any) -> float:
    text = loader.construct_scalar(node).lower()
    if text.lstrip("+-") == ".inf":
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


Loader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
Loader.add_implicit_resolver("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])
Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
Loader.add_constructor("tag:yaml.org,2002:int", _int)
Loader.add_constructor("tag:yaml.org,2002:float", _float)


def loads(text: str) -> Any:
    """Parse one document; raises YamlError (bounds, duplicates) or yaml.YAMLError (syntax)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlError(f"larger than {MAX_BYTES // 1024} kB")
    loader = Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
