"""`jobgen submit --dry-run` prints what `jobgen submit` runs, as a bash script that does it:
piped into bash (with a recording stand-in for sbatch) it submits exactly the scripts
`jobgen render` prints, the second job of a chain after the first."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from jobgen import api, slurm_client
from jobgen.backends import slurm

FAKE_SBATCH = """#!/usr/bin/env bash
# Records its arguments and its stdin (the script), answers like `sbatch --parsable`.
n=$(( $(ls "$RECORD" | wc -l) / 2 + 1 ))
printf '%s\\n' "$@" > "$RECORD/$n.args"
cat > "$RECORD/$n.script"
echo "$((4240 + n));cluster"
"""


def run_dry(tmp_path: Path, text: str) -> tuple[str, list[list[str]], list[str]]:
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD=str(record))
    proc = subprocess.run(["bash"], input=text, env=env, capture_output=True, text=True,
                          check=True)
    count = len(list(record.glob("*.args")))
    args = [(record / f"{i}.args").read_text().splitlines() for i in range(1, count + 1)]
    scripts = [(record / f"{i}.script").read_text() for i in range(1, count + 1)]
    return proc.stdout, args, scripts


def test_dry_run_of_a_chain_submits_both_jobs_in_order(jobgen: Callable,
                                                        tmp_path: Path) -> None:
    result = jobgen("submit", "neox20b", "--nodes", "2", "--chain", "--dry-run")
    assert result.exit_code == 0, result.output
    out, args, scripts = run_dry(tmp_path, result.stdout)
    spec = api.job_spec("neox20b", 2)
    assert scripts == [slurm.plan(spec, "compile").text, slurm.plan(spec, "train").text]
    assert args == [["--parsable"], ["--parsable", "--dependency=afterok:4241",
                                     "--kill-on-invalid-dep=yes"]]
    assert out == "4241 4242\n"     # what `jobgen submit --chain` prints


def test_dry_run_of_one_job_is_what_render_prints(jobgen: Callable, tmp_path: Path) -> None:
    result = jobgen("submit", "llama2-7b", "--nodes", "4", "--dry-run")
    assert result.exit_code == 0, result.output
    rendered = jobgen("render", "llama2-7b", "--nodes", "4").stdout
    out, args, scripts = run_dry(tmp_path, result.stdout)
    assert scripts == [rendered] and args == [["--parsable"]] and out == "4241\n"


def test_a_script_that_contains_the_delimiter_cannot_end_the_here_document() -> None:
    plan = api.plan(api.job_spec("neox20b", 1))
    text = slurm_client.dry_run([plan])
    end = text.splitlines()[3].rpartition("<<'")[2].rstrip("'")
    assert plan.text.count(end) == 0 and text.count(end) == 2


def test_sbatch_command_is_shared_by_submit_and_dry_run() -> None:
    assert slurm_client.sbatch_argv(slurm_client.after("7")) == [
        "sbatch", "--parsable", "--dependency=afterok:7", "--kill-on-invalid-dep=yes"]
