"""Reading a YAML file (recipes, site profiles, platform files, the user's config): the bytes,
parsed by the one YAML reader (jobgen/inputs/yaml12.py) into a mapping, every problem turned into a
one-line ConfigError. A file already read is taken from jobgen's private cache
(jobgen/plumbing/cache.py) instead: rendering it again imports no YAML parser, which is why this is
not in yaml12.py (that module subclasses PyYAML's loader, so importing it imports PyYAML)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..plumbing.errors import ConfigError, printable


def load_yaml(path: Path, shown: str) -> dict[str, Any]:
    """Parse a YAML mapping (YAML 1.2 scalars, no duplicate keys, bounded: jobgen/inputs/yaml12.py),
    turning every problem into a one-line ConfigError."""
    from ..plumbing import fsio
    try:    # a regular file only: a FIFO or device is refused at once, not waited on
        raw = fsio.read_bytes(path, fsio.MAX_BYTES)
    except fsio.NotRegularFile as exc:
        raise ConfigError(f"{shown}: {str(exc).split(': ', 1)[-1]}") from None
    except fsio.TooLarge:
        raise ConfigError(f"{shown}: larger than {fsio.MAX_BYTES >> 20} MB; not read") from None
    except OSError as exc:
        raise ConfigError(f"{shown}: cannot read: {exc}") from None
    cached = _parsed(raw)
    if cached is not None:
        return cached
    import yaml

    from .yaml12 import YamlError, loads
    try:
        text = raw.decode("utf-8")
        data = loads(text)
    except yaml.reader.ReaderError as exc:   # a character YAML does not allow (ESC, NUL, ...)
        line = text.count("\n", 0, exc.position) + 1
        char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
        raise ConfigError(f"{shown}: invalid YAML (line {line}): the character "
                          f"{printable(char)} is not allowed") from None
    except YamlError as exc:
        where = f" (line {exc.line})" if exc.line else ""
        raise ConfigError(f"{shown}{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{shown}: invalid YAML{where}: {problem}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: expected a mapping at the top level")
    _remember(raw, data)
    return data


# Parsed recipe and site files, kept in jobgen's private cache (jobgen/plumbing/cache.py) as JSON
# under the SHA-256 of the file's bytes: rendering a file already read needs no YAML parser. Only a
# document that JSON carries exactly (string keys, no NaN) is kept; errors are never cached.
_PARSER = b"yaml12-v1\0"


def _entry(raw: bytes) -> Optional[str]:
    import os

    from ..plumbing import cache
    folder = cache.folder("parsed")
    if folder is None:
        return None
    return os.path.join(folder, cache.sha256(_PARSER + raw).hexdigest() + ".json")


def _parsed(raw: bytes) -> Optional[dict[str, Any]]:
    import json

    from ..plumbing import cache
    entry = _entry(raw)
    payload = cache.read(entry) if entry else None
    if payload is None:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _nodes_within(data: Any, limit: int) -> bool:
    """Whether the document has at most `limit` values once its aliases are expanded (a few
    aliases can stand for billions: such a document is never written out)."""
    stack, seen = [data], 0
    while stack:
        seen += 1
        if seen > limit:
            return False
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _remember(raw: bytes, data: dict[str, Any]) -> None:
    import json

    from ..plumbing import cache
    if not _nodes_within(data, 20_000):
        return
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        return
    entry = _entry(raw)
    if entry and repr(json.loads(text)) == repr(data):
        cache.write(entry, text.encode("utf-8"))
