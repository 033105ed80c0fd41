"""Where jobgen's own files live: the recipes, templates, payloads and site profiles that ship
beside the package (an editable install or a checkout keeps them at the project root)."""
from __future__ import annotations

import os
from pathlib import Path

# JOBGEN_HOME lets a packaged install point at a copy of the project's data directories.
ROOT = Path(os.environ.get("JOBGEN_HOME") or Path(__file__).resolve().parent.parent)
RECIPES_DIR = ROOT / "recipes"
TEMPLATES_DIR = ROOT / "templates"
PAYLOAD_DIR = ROOT / "payload"
SITES_DIR = ROOT / "env" / "sites"
PLATFORMS_DIR = ROOT / "env" / "platforms"
