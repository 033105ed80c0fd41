"""Strict JSON for everything jobgen reads back (records, run lists, markers): NaN and Infinity,
nesting past MAX_DEPTH and overlong integers are refused as ValueError, never returned or left
to overflow the stack. Parsing only; the bytes come from fsio's one reader.
"""
from __future__ import annotations

import json
from typing import Any, Union


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


MAX_DEPTH = 64   # nesting of any JSON jobgen reads: its own records are under 10 deep


def loads(text: Union[str, bytes]) -> Any:
    """Strict JSON: NaN/Infinity, nesting past MAX_DEPTH (what a printer or a schema walk
    would recurse through) and overlong integers are ValueError."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} deep")
    return value


def _depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (iteratively: no recursion to run out of)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            if level > MAX_DEPTH:
                return level
            todo += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest
