"""Every shell script the project ships or renders passes `shellcheck -S warning` and `bash -n`:
the rendered sbatch scripts (each recipe, both sites, every compile mode, a smoke rehearsal and a
recipe full of hostile strings), the payload launchers, the container entrypoint and the CI
scripts. (`jobgen check`, tested in test_check.py, lints the whole node-count matrix.)"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

import pytest

from jobgen import api
from jobgen.inputs import recipe as recipes
from jobgen.plumbing.errors import JobgenError

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "$(touch /tmp/x) `id` '; id; ' \"; id; \" \n id ; ${HOME} ~ *"


def shipped_scripts() -> list[Path]:
    found = [*ROOT.glob("payload/**/*.sh"), *ROOT.glob("env/**/*.sh"), *ROOT.glob("tests/ci/*.sh")]
    if (ROOT / ".ci" / "run").exists():
        found.append(ROOT / ".ci" / "run")
    return sorted(found)


def rendered_scripts(tmp_path: Path, write_recipe: Callable, write_site: Callable) -> list[Path]:
    # The local site's matrix is linted by `jobgen check` (test_check.py).
    jobs: list[tuple[str, dict]] = []
    for name in recipes.recipe_names():
        # The example cluster has trn1 nodes only; a Gaudi recipe renders for the local site.
        trn1 = recipes.load(name)[0].platform == "trn1.32xlarge"
        jobs.append((name, {"site": "trn1-pcluster" if trn1 else "local"}))
        jobs.append((name, {"smoke": True, "nodes": 2}))
    for mode in ("always", "never"):
        jobs.append(("neox20b", {"compile_mode": mode, "site": "trn1-pcluster"}))
    hostile_recipe = write_recipe("neox20b", {
        # (data.splits must be numbers now: jobgen/inputs/rules.py refuses anything else)
        "description": HOSTILE, "data.path": HOSTILE,
        "env.HOSTILE": HOSTILE, "launch.config_name": HOSTILE}, filename="hostile.yaml")
    hostile_site = write_site("trn1-pcluster", {
        f"paths.{key}": HOSTILE for key in ("work_dir", "data_dir", "payload_dir", "nemo_dir")
    } | {"paths.local_compile_cache": "/local/" + HOSTILE, "setup.activate": HOSTILE,
         # a cache of its own (one that is the run folder is refused)
         "paths.compile_cache": "cache-" + HOSTILE},
        filename="hostile.yaml")
    jobs.append((str(hostile_recipe), {"site": str(hostile_site)}))
    paths = []
    for i, (ref, options) in enumerate(jobs):
        try:
            plan = api.plan(api.job_spec(ref, options.pop("nodes", None), **options))
        except JobgenError as exc:            # e.g. a payload with no Slurm launcher yet
            pytest.fail(f"{ref} {options}: {exc}")
        path = tmp_path / f"{i:02d}-{Path(ref).stem}.sbatch"
        path.write_text(plan.text)
        paths.append(path)
    return paths


def test_every_script_passes_shellcheck_and_parses(tmp_path: Path, write_recipe: Callable,
                                                   write_site: Callable,
                                                   require: Callable) -> None:
    shellcheck = require.executable("shellcheck")
    rendered = rendered_scripts(tmp_path, write_recipe, write_site)
    shipped = shipped_scripts()
    assert len(shipped) >= 6 and len(rendered) >= 9
    for path in [*shipped, *rendered]:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0, f"{path}: {proc.stderr}"
    # -x follows `source` lines (the launchers source payload/common/node_launch.sh).
    proc = subprocess.run([shellcheck, "-x", "-S", "warning", "-f", "gcc", *map(str, shipped),
                           *map(str, rendered)], capture_output=True, text=True, cwd=ROOT,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_rendered_scripts_have_a_bash_shebang_and_strict_mode(jobgen: Callable) -> None:
    for name in recipes.recipe_names():
        script = jobgen("render", name).stdout
        assert script.startswith("#!/bin/bash\n")
        assert "\nset -uo pipefail\n" in script
