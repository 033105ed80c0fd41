"""Where jobgen's own files live: the recipes, templates, payloads, site profiles, platforms and
container build files.

An installed jobgen (wheel, sdist, pipx) carries them as the package data of `jobgen.data.<name>`
(setup.cfg maps each of the project's top-level folders there), found with importlib.resources.
An editable install or a source checkout has no such copies: they are read where they are kept,
at the project's top level. JOBGEN_HOME points jobgen at another project folder of the same
layout (tests use it to try a changed copy).
"""
from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Optional

from .errors import ConfigError

# Package data name -> where the project keeps it (setup.cfg's package_dir says the same; a test
# holds the two together).
LAYOUT = {
    "recipes": "recipes",
    "templates": "templates",
    "payload": "payload",
    "sites": "env/sites",
    "platforms": "env/platforms",
    "containers": "env/containers",
}


def _checkout() -> Path:
    """The project folder of a source checkout: the one that holds the jobgen package."""
    return Path(str(importlib.resources.files("jobgen"))).resolve().parent


def _packaged(name: str) -> Optional[Path]:
    """The package data folder `name` of an installed jobgen, if it is there as a folder."""
    found = importlib.resources.files("jobgen.data").joinpath(name)
    return found if isinstance(found, Path) and found.is_dir() else None


def folder(name: str) -> Path:
    """The folder of `name` (a key of LAYOUT) as a path on this machine."""
    home = os.environ.get("JOBGEN_HOME")
    if home:
        path = Path(home) / LAYOUT[name]
        if not path.is_dir():
            raise ConfigError(f"JOBGEN_HOME={home}: no {LAYOUT[name]}/ there (it must be a "
                              "jobgen project folder; unset JOBGEN_HOME to use this "
                              "installation's own files)")
        return path
    packaged = _packaged(name)
    if packaged is not None:
        return packaged
    source = _checkout() / LAYOUT[name]
    if source.is_dir():
        return source
    raise ConfigError(f"jobgen's {LAYOUT[name]}/ is missing from this installation (neither "
                      f"package data jobgen.data.{name} nor {source}): reinstall jobgen from its "
                      "wheel or sdist (pip install --force-reinstall jobgen)")


def installed() -> str:
    """How this jobgen finds its files: 'package' (wheel/sdist), 'checkout' or 'JOBGEN_HOME'."""
    if os.environ.get("JOBGEN_HOME"):
        return "JOBGEN_HOME"
    return "package" if _packaged("payload") is not None else "checkout"
