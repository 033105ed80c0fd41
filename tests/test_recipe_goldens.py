"""Every recipe in recipes/, at its own node count (or the local site's limit, if lower) on the
local site, rendered for Slurm and for AWS Batch and compared with its golden file. The list
comes from recipes/: a new recipe is its YAML plus the golden files that
`pytest -m golden tests --update-golden` writes for it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from conftest import GOLDEN_DIR, recipe_names

from jobgen import api
from jobgen.inputs import recipe as recipes
from jobgen.inputs import site as sites

FORMS = {"slurm": "sbatch", "batch": "json"}     # backend -> the golden file's extension
FOLDER = Path("recipes")


@pytest.mark.parametrize("backend", sorted(FORMS))
@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_matches_its_golden(name: str, backend: str,
                                         golden: Callable[[Path, str], None]) -> None:
    nodes = min(recipes.load(name)[0].nodes, getattr(sites.load("local"), backend).max_nodes)
    spec = api.job_spec(name, nodes, site="local", backend=backend)
    golden(FOLDER / backend / f"{name}-{nodes}n.{FORMS[backend]}", api.plan(spec).text)


def test_no_golden_file_outlives_its_recipe() -> None:
    kept = {(p.parent.name, p.stem.rpartition("-")[0])
            for p in (GOLDEN_DIR / FOLDER).glob("*/*") if p.is_file()}
    expected = {(backend, name) for backend in FORMS for name in recipe_names()}
    assert kept <= expected, f"golden files of no recipe: {sorted(kept - expected)}"
    assert kept, "no golden files: regenerate with pytest -m golden tests --update-golden"
