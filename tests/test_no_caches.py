"""jobgen keeps nothing between runs: a render, as the console script runs it, writes nothing
under the home folder, and a second render reads the edited recipe, not a former result."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import JOBGEN_EXE, ROOT


def render(home: Path, work: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("JOBGEN_", "XDG_"))}
    environ.update(HOME=str(home), **env)
    return subprocess.run([str(JOBGEN_EXE), "render", *args], cwd=work, env=environ,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("backend", ["slurm", "batch"])
def test_a_render_writes_nothing_under_home(tmp_path: Path, backend: str) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    proc = render(home, work, "neox20b", "--nodes", "4", "--backend", backend,
                  "--site", "local")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash" if backend == "slurm" else "{")
    assert sorted(home.rglob("*")) == []


def test_an_edited_recipe_shows_in_the_next_render(tmp_path: Path) -> None:
    """The same project folder (JOBGEN_HOME) rendered twice with one value changed between."""
    project, home = tmp_path / "project", tmp_path / "home"
    for name in ("recipes", "templates", "payload"):
        shutil.copytree(ROOT / name, project / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(ROOT / "env", project / "env")
    home.mkdir()
    first = render(home, tmp_path, "neox20b", "--nodes", "4", JOBGEN_HOME=str(project))
    assert first.returncode == 0, first.stderr
    recipe = project / "recipes" / "neox20b.yaml"
    text = recipe.read_text()
    assert text.count("name: neox20b") == 1
    recipe.write_text(text.replace("name: neox20b", "name: neox20b-edited"))
    second = render(home, tmp_path, "neox20b", "--nodes", "4", JOBGEN_HOME=str(project))
    assert second.returncode == 0, second.stderr
    assert "neox20b-edited" in second.stdout and "neox20b-edited" not in first.stdout
