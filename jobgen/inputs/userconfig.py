"""The user's defaults, set once: the site every command uses when --site is not given.

Precedence: the --site flag, then the JOBGEN_SITE environment variable (a site name or a file),
then `site:` in the user's config file ($XDG_CONFIG_HOME/jobgen/config.yaml, else
~/.config/jobgen/config.yaml; a relative file there is taken from the config file's folder),
then the built-in `local`. `jobgen show` says which one it was.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..plumbing.errors import ConfigError

ENV = "JOBGEN_SITE"
KEYS = ("site",)
BUILT_IN = "local"


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base, "jobgen", "config.yaml")


def _config() -> dict[str, str]:
    path = config_path()
    if not os.path.lexists(path):   # anything else there (a FIFO, a folder) is refused on read
        return {}
    from .yamlfile import load_yaml
    data = load_yaml(path, str(path))
    for key, value in data.items():
        if key not in KEYS:
            raise ConfigError(f"{path}: {key}: not a jobgen setting (known: {', '.join(KEYS)})")
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{path}: {key}: must be a site name or a file")
    return data


def site(flag: Optional[str]) -> tuple[str, str]:
    """(the site reference to load, where it came from)."""
    if flag is not None:
        return flag, "--site"
    env = os.environ.get(ENV)
    if env is not None:
        if not env.strip():
            raise ConfigError(f"{ENV} is set but empty (unset it for the default site)")
        return env, ENV
    value = _config().get("site")
    if value is not None:
        if value.endswith((".yaml", ".yml")) or "/" in value:
            value = str(config_path().parent / value)
        return value, str(config_path())
    return BUILT_IN, "built-in default"
