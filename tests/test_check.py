"""`jobgen check`: every recipe at 1..128 nodes; forbidden combinations are skipped with their
reason, render errors and shellcheck warnings fail the run (exit 1)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from jobgen import check
from jobgen import recipe as recipes

ROOT = Path(__file__).resolve().parent.parent
JOBGEN_EXE = Path(sys.executable).parent / "jobgen"
ROW = re.compile(
    r"^(?P<recipe>\S+)\s+(?P<nodes>\d+)\s+(?P<status>ok|skipped|FAILED)\s*(?P<detail>.*)$")


def rows(table: str) -> dict[tuple[str, int], tuple[str, str]]:
    found = {}
    for line in table.splitlines():
        m = ROW.match(line)
        if m:
            found[(m["recipe"], int(m["nodes"]))] = (m["status"], m["detail"])
    return found


def run_check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN_EXE), "check", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, check=False)


@pytest.fixture(scope="module")
def full_check() -> subprocess.CompletedProcess[str]:
    """The whole matrix on the default site, with shellcheck (once for this module)."""
    return run_check()


def test_check_passes_and_skips_only_forbidden_combinations(
        full_check: subprocess.CompletedProcess[str], require: Callable) -> None:
    require.executable("shellcheck")
    assert full_check.returncode == 0, full_check.stdout + full_check.stderr
    table = rows(full_check.stdout)
    names = recipes.recipe_names()
    assert set(table) == {(r, n) for r in names for n in check.NODE_COUNTS}
    skipped = {key: detail for key, (status, detail) in table.items() if status == "skipped"}
    assert skipped == {
        ("pythia6.9b", 64): "recipes/pythia6.9b.yaml: parallelism.global_batch_size: 256 is not "
                            "divisible by micro_batch_size 2 x data-parallel 256 = 512 at 64 nodes",
        ("pythia6.9b", 128): "recipes/pythia6.9b.yaml: parallelism.global_batch_size: 256 is not "
                             "divisible by micro_batch_size 2 x data-parallel 512 = 1024 at 128 "
                             "nodes",
    }
    assert all(status == "ok" for key, (status, _) in table.items() if key not in skipped)
    ok = len(table) - 2
    assert full_check.stdout.splitlines()[-1] == f"{ok} ok, 2 skipped, 0 failed"
    assert "shellcheck not found" not in full_check.stdout       # it ran
    assert "shellcheck could not run" not in full_check.stdout
    assert full_check.stderr == ""


def test_check_one_recipe(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "llama2-7b", "--site", "trn1-pcluster",
                    "--no-shellcheck")
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert set(table) == {("llama2-7b", n) for n in check.NODE_COUNTS}
    assert result.stdout.splitlines()[0].split() == ["recipe", "nodes", "status", "detail"]
    assert result.stdout.splitlines()[-1] == "8 ok, 0 skipped, 0 failed"


def test_a_site_that_breaks_rendering_fails_the_check(jobgen: Callable,
                                                      write_site: Callable) -> None:
    site = write_site("local", {"name": "no-nemo"}, delete=["paths.nemo_dir"])
    result = jobgen("check", "--site", str(site), "--recipe", "neox20b", "--recipe", "llama2-7b",
                    "--no-shellcheck")
    assert result.exit_code == 1
    table = rows(result.stdout)
    message = ("site no-nemo: paths.nemo_dir is required by payload neuron_nemo (the "
               "neuronx-nemo-megatron language_modeling directory)")
    assert all(table[("neox20b", n)] == ("FAILED", message) for n in check.NODE_COUNTS)
    assert all(table[("llama2-7b", n)][0] == "ok" for n in check.NODE_COUNTS)
    assert result.stdout.splitlines()[-1] == "8 ok, 0 skipped, 8 failed"


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A copy of the project's data folders, used through JOBGEN_HOME."""
    home = tmp_path / "jobgen-home"
    for folder in ("recipes", "templates", "payload", "env/sites"):
        shutil.copytree(ROOT / folder, home / folder)
    return home


def test_a_broken_recipe_fails_the_check(project_copy: Path) -> None:
    broken = project_copy / "recipes" / "broken.yaml"
    broken.write_text((ROOT / "recipes" / "neox20b.yaml").read_text()
                      .replace("name: neox20b", "name: broken")
                      .replace("  num_layers: 44", "  num_layers: 44\n  num_layer: 44"))
    proc = run_check("--no-shellcheck", env={"JOBGEN_HOME": str(project_copy)})
    assert proc.returncode == 1
    table = rows(proc.stdout)
    assert table[("broken", 1)] == ("FAILED", "recipes/broken.yaml: model.num_layer: unknown key "
                                    f"(known keys: {', '.join(_model_keys())})")
    assert {status for (name, _), (status, _) in table.items() if name == "broken"} == {"FAILED"}
    assert table[("neox20b", 4)][0] == "ok"


def test_a_shellcheck_warning_fails_the_check(project_copy: Path, require: Callable) -> None:
    require.executable("shellcheck")
    template = project_copy / "templates" / "slurm" / "job.sbatch.j2"
    # SC2164 (warning): a cd that may fail without stopping the script.
    template.write_text(template.read_text() + 'cd "$RUN_DIR"\n')
    proc = run_check("--recipe", "neox20b", env={"JOBGEN_HOME": str(project_copy)})
    assert proc.returncode == 1
    table = rows(proc.stdout)
    for n in check.NODE_COUNTS:
        status, detail = table[("neox20b", n)]
        assert status == "FAILED" and "shellcheck" in detail and "SC2164" in detail


def test_report_table() -> None:
    report = check.Report([check.Row("a", 1), check.Row("long-name", 16, "skipped", "why"),
                           check.Row("a", 2, "FAILED", "bad")], ["a note"])
    assert report.table().splitlines() == [
        "recipe     nodes  status   detail",
        "a              1  ok",
        "long-name     16  skipped  why",
        "a              2  FAILED   bad",
        "a note",
        "1 ok, 1 skipped, 1 failed"]
    assert [r.nodes for r in report.failed] == [2]


def _model_keys() -> list[str]:
    import dataclasses

    from jobgen.recipe import Model
    return [f.name for f in dataclasses.fields(Model)]


def test_check_batch_validates_every_definition(jobgen: Callable) -> None:
    """--backend batch: every definition passes botocore + the multi-node rules; node counts over
    the site's batch.max_nodes are skipped with the reason."""
    result = jobgen("check", "--backend", "batch", "--site", "dl1-batch")
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    assert table[("bert1.5b", 16)] == ("ok", "")
    assert table[("bert1.5b", 64)] == (
        "skipped", "--nodes 64: site dl1-batch allows at most 32 nodes (batch.max_nodes)")
    assert table[("pythia6.9b", 64)][0] == "skipped"
    assert result.output.splitlines()[-1] == "30 ok, 10 skipped, 0 failed"
