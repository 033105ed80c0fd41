"""Where jobgen's own files live: the recipes, templates, payloads, site profiles, platforms and
container build files.

An installed jobgen (wheel, sdist, pipx) carries them as the package data of `jobgen.data.<name>`
(setup.cfg maps each of the project's top-level folders there) and finds them with
importlib.resources. An editable install or a source checkout has no such copies: they are read
where they are kept, at the project's top level. JOBGEN_HOME points jobgen at another project
folder of the same layout (tests use it to try a changed copy).
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

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
    return Path(__file__).resolve().parent.parent


def folder(name: str) -> Path:
    """The folder of `name` (a key of LAYOUT) as a path on this machine."""
    home = os.environ.get("JOBGEN_HOME")
    if home:
        return Path(home) / LAYOUT[name]
    packaged = resources.files("jobgen.data") / name
    if isinstance(packaged, Path) and packaged.is_dir():
        return packaged
    source = _checkout() / LAYOUT[name]
    if source.is_dir():
        return source
    raise ConfigError(f"jobgen's {LAYOUT[name]}/ is missing from this installation "
                      f"(looked in {packaged} and {source}): reinstall jobgen from its wheel or "
                      "sdist (`pip install --force-reinstall jobgen`)")


def installed() -> str:
    """How this jobgen finds its files: 'package' (wheel/sdist), 'checkout' or 'JOBGEN_HOME'."""
    if os.environ.get("JOBGEN_HOME"):
        return "JOBGEN_HOME"
    packaged = resources.files("jobgen.data") / "payload"
    return "package" if isinstance(packaged, Path) and packaged.is_dir() else "checkout"
