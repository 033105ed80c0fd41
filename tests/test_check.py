"""`jobgen check`: every recipe at every node count from 1 to 128; forbidden combinations are
skipped with their reason; render errors, shellcheck warnings and checks that could not run fail
the run (exit 1)."""
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
from jobgen.inputs import recipe as recipes

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
    """`jobgen check --verbose ARGS`: every row, for rows() to read."""
    return subprocess.run([str(JOBGEN_EXE), "check", "--verbose", *args], capture_output=True,
                          text=True,
                          env={**os.environ, **(env or {})}, timeout=300, check=False)


@pytest.fixture(scope="module")
def full_check() -> subprocess.CompletedProcess[str]:
    """The whole matrix on the default site, with shellcheck (once for this module)."""
    return run_check()


COUNTS = range(1, check.MAX_NODES + 1)


def forbidden(name: str, nodes: int) -> bool:
    """The batch arithmetic, recomputed here from the recipe file: a global batch that the
    data-parallel ranks times the micro-batch do not divide cannot be trained."""
    from jobgen.inputs.platforms import PLATFORMS
    rec, _ = recipes.load(name)
    par = rec.parallelism
    if par.global_batch_size is None:
        return False
    dp = nodes * PLATFORMS[rec.platform].workers_per_node // (par.tensor * par.pipeline)
    return par.global_batch_size % (par.micro_batch_size * dp) != 0


@pytest.mark.slow   # several seconds: the full tier runs it
def test_check_passes_and_skips_only_forbidden_combinations(
        full_check: subprocess.CompletedProcess[str], require: Callable) -> None:
    require.executable("shellcheck")
    assert full_check.returncode == 0, full_check.stdout + full_check.stderr
    table = rows(full_check.stdout)
    names = recipes.recipe_names()
    assert set(table) == {(r, n) for r in names for n in COUNTS}   # 3 and 24 nodes included
    skipped = {key for key, (status, _) in table.items() if status == "skipped"}
    assert skipped == {(r, n) for r in names for n in COUNTS if forbidden(r, n)}
    assert table[("neox20b", 3)] == (
        "skipped", "recipes/neox20b.yaml: parallelism.global_batch_size: 256 is not divisible "
                   "by micro_batch_size 1 x data-parallel 3 = 3 at 3 nodes")
    assert table[("bert1.5b", 3)] == ("ok", "") and table[("neox20b", 64)] == ("ok", "")
    assert all(status == "ok" for key, (status, _) in table.items() if key not in skipped)
    lines = full_check.stdout.splitlines()
    assert lines[-1] == f"{len(table) - len(skipped)} ok, {len(skipped)} skipped, 0 failed"
    assert "node counts 1 to 128 (site local allows 136; bound 128)" in lines
    assert "shellcheck" not in full_check.stdout       # it ran, and found nothing
    assert full_check.stderr == ""


def test_a_missing_shellcheck_fails_unless_declined(tmp_path: Path) -> None:
    """Without shellcheck (a PATH without it, and an interpreter folder without it) the check
    fails, saying so; --no-shellcheck says it was skipped and passes."""
    venv = tmp_path / "bin"
    venv.mkdir()
    python = venv / "python"
    python.symlink_to(sys.executable)
    env = {**os.environ, "PATH": f"{venv}:/usr/bin:/bin"}
    argv = [str(python), "-m", "jobgen.cli", "check", "--recipe", "llama2-7b", "--max-nodes", "4"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-2].startswith("FAILED: shellcheck not found, so no script")
    proc = subprocess.run(argv + ["--no-shellcheck"], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "shellcheck: skipped (--no-shellcheck)" in proc.stdout


def test_test_only_without_a_controller_fails(jobgen: Callable,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = jobgen("check", "--recipe", "llama2-7b", "--max-nodes", "2", "--test-only",
                    "--no-shellcheck")
    assert result.exit_code == 1
    assert ("FAILED: sbatch --test-only: sbatch not found: is this a Slurm login node?; nothing "
            "was tested") in result.stdout


def test_check_one_recipe(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "llama2-7b", "--site", "trn1-pcluster",
                    "--no-shellcheck", "--max-nodes", "8", "--verbose")
    assert result.exit_code == 0, result.output
    table = rows(result.stdout)
    assert set(table) == {("llama2-7b", n) for n in range(1, 9)}
    assert [n for n in range(1, 9) if table[("llama2-7b", n)][0] == "ok"] == [1, 2, 4, 8]
    assert result.stdout.splitlines()[0].split() == ["recipe", "nodes", "status", "detail"]
    assert result.stdout.splitlines()[-1] == "4 ok, 4 skipped, 0 failed"


def test_a_site_that_breaks_rendering_fails_the_check(jobgen: Callable,
                                                      write_site: Callable) -> None:
    site = write_site("local", {"name": "no-nemo"}, delete=["paths.nemo_dir"])
    result = jobgen("check", "--site", str(site), "--recipe", "neox20b", "--recipe", "llama2-7b",
                    "--no-shellcheck", "--max-nodes", "8", "--verbose")
    assert result.exit_code == 1
    table = rows(result.stdout)
    message = ("site no-nemo: paths.nemo_dir is required by payload neuron_nemo (the "
               "neuronx-nemo-megatron language_modeling directory)")
    # Where the arithmetic allows the node count, the site breaks NeMo's recipe.
    assert all(table[("neox20b", n)] == ("FAILED", message) for n in (1, 2, 4, 8))
    assert all(table[("llama2-7b", n)][0] == "ok" for n in (1, 2, 4, 8))
    assert result.stdout.splitlines()[-1] == "4 ok, 8 skipped, 4 failed"


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A copy of the project's data folders, used through JOBGEN_HOME."""
    home = tmp_path / "jobgen-home"
    for folder in ("recipes", "templates", "payload", "env/sites", "env/platforms"):
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
    for n in COUNTS:
        status, detail = table[("neox20b", n)]
        if forbidden("neox20b", n):
            continue
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


def test_report_summary_is_one_line_per_kind_of_row() -> None:
    """Rows that differ only in their numbers are one line naming their node counts, with the
    first one's detail; failures are grouped only where their details are the same."""
    report = check.Report(
        [check.Row("a", n) for n in (1, 2, 4, 8)]
        + [check.Row("a", n, "skipped", f"{256} not divisible by {n * 3} at {n} nodes")
           for n in (3, 5, 6, 7)]
        + [check.Row("b", 1, "FAILED", "bad x"), check.Row("b", 2, "FAILED", "bad x"),
           check.Row("b", 3, "FAILED", "bad 3")], ["a note"], ["it broke"])
    assert report.summary().splitlines() == [
        "recipe  status   nodes            detail (the first one's)",
        "a       ok       4 at 1, 2, 4, 8",
        "a       skipped  4 at 3, 5-7      256 not divisible by 9 at 3 nodes",
        "b       FAILED   2 at 1, 2        bad x",
        "b       FAILED   1 at 3           bad 3",
        "(--verbose lists every node count, --json too)",
        "a note",
        "FAILED: it broke",
        "4 ok, 4 skipped, 3 failed"]
    assert check.node_ranges([check.Row("a", n) for n in (9, 1, 2, 3, 5, 6)]) == "1-3, 5, 6, 9"


def test_check_summarises_the_skipped_rows_and_json_lists_them(jobgen: Callable) -> None:
    """By default one line per recipe and kind of row (482 skipped rows on the local site are
    5 lines); --verbose and --json still give every node count."""
    args = ("check", "--recipe", "pythia6.9b", "--recipe", "neox20b", "--no-shellcheck",
            "--max-nodes", "8")
    result = jobgen(*args)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        "recipe      status   nodes            detail (the first one's)",
        "pythia6.9b  ok       4 at 1, 2, 4, 8",
        "pythia6.9b  skipped  4 at 3, 5-7      recipes/pythia6.9b.yaml: parallelism."
        "global_batch_size: 256 is not divisible by micro_batch_size 2 x data-parallel 12 = 24 "
        "at 3 nodes",
        "neox20b     ok       4 at 1, 2, 4, 8",
        "neox20b     skipped  4 at 3, 5-7      recipes/neox20b.yaml: parallelism."
        "global_batch_size: 256 is not divisible by micro_batch_size 1 x data-parallel 3 = 3 at "
        "3 nodes"]
    assert lines[-1] == "8 ok, 8 skipped, 0 failed" and not rows(result.stdout)
    verbose = rows(jobgen(*args, "--verbose").stdout)
    assert len(verbose) == 16 and verbose[("neox20b", 6)][0] == "skipped"
    import json
    data = json.loads(jobgen(*args, "--json").stdout)
    assert [(r["recipe"], r["nodes"]) for r in data["rows"]] == \
        [(name, n) for name in ("pythia6.9b", "neox20b") for n in range(1, 9)]
    assert data["rows"][6]["detail"].endswith("data-parallel 28 = 56 at 7 nodes")


def _model_keys() -> list[str]:
    import dataclasses

    from jobgen.inputs.recipe import Model
    return [f.name for f in dataclasses.fields(Model)]


def test_check_batch_validates_every_definition(jobgen: Callable) -> None:
    """--backend batch: every definition passes botocore + the multi-node rules, at every node
    count up to the site's batch.max_nodes."""
    result = jobgen("check", "--backend", "batch", "--site", "dl1-batch", "--verbose")
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    names = recipes.recipe_names()
    assert set(table) == {(r, n) for r in names for n in range(1, 33)}
    assert table[("bert1.5b", 16)] == ("ok", "")
    skipped = {key for key, (status, _) in table.items() if status == "skipped"}
    assert skipped == {(r, n) for r in names for n in range(1, 33) if forbidden(r, n)}
    assert "node counts 1 to 32 (site dl1-batch allows 32; bound 128)" in result.output
    # The summary closes stdout; a trainer's note on the Batch stop (NeMo saves only
    # periodically) goes to stderr.
    assert result.stdout.splitlines()[-1] == \
        f"{len(table) - len(skipped)} ok, {len(skipped)} skipped, 0 failed"
