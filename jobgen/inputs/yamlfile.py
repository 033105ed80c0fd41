"""Reading a YAML file (recipes, site profiles, platform files, the user's config): the bytes,
parsed by the one YAML reader (jobgen/inputs/yaml12.py) into a mapping, every problem turned into a
one-line ConfigError."""
from __future__ import annotations

from pathlib import Path
from typing import Any

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
    return data

