"""The command line: thin click commands over jobgen.api, one module per command group, each
imported when its command is asked for (app.COMMANDS), so that `jobgen render` loads neither
planning, watching nor any cloud SDK. `main` is the console entry point."""
from __future__ import annotations

from .app import cli, main

__all__ = ["cli", "main"]
