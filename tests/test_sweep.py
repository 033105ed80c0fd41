"""Sweeps: combinations, run names, refusals, and the job array one Slurm sweep becomes."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from jobgen import api
from jobgen.backends.slurm import backend as slurm
from jobgen.inputs import sweep
from jobgen.plumbing.errors import ConfigError


def test_points_are_the_product_in_the_order_given() -> None:
    points = sweep.points(["optim.lr=1e-4,3e-4", "parallelism.micro_batch_size=1,2"],
                          "llama2-7b-4n")
    assert [p.overrides for p in points] == [
        ("optim.lr=1e-4", "parallelism.micro_batch_size=1"),
        ("optim.lr=1e-4", "parallelism.micro_batch_size=2"),
        ("optim.lr=3e-4", "parallelism.micro_batch_size=1"),
        ("optim.lr=3e-4", "parallelism.micro_batch_size=2")]
    assert [p.run_name for p in points] == [
        "llama2-7b-4n-lr1e-4-micro_batch_size1", "llama2-7b-4n-lr1e-4-micro_batch_size2",
        "llama2-7b-4n-lr3e-4-micro_batch_size1", "llama2-7b-4n-lr3e-4-micro_batch_size2"]


def test_names_fall_back_to_numbers_when_too_long() -> None:
    points = sweep.points(["schedule.max_steps=1000000000000,2000000000000",
                           "checkpoint.every_steps=100000000000,200000000000"],
                          "a-rather-long-run-name-for-this-sweep")
    assert [p.run_name for p in points] == [
        f"a-rather-long-run-name-for-this-sweep-sweep{i}" for i in range(4)]


@pytest.mark.parametrize(("sweeps", "message"), [
    (["optim.lr"], "--sweep 'optim.lr': expected KEY=VALUE1,VALUE2,..."),
    (["=1,2"], "--sweep '=1,2': expected KEY=VALUE1,VALUE2,..."),
    (["optim.lr=1,,2"], "--sweep optim.lr: an empty value in '1,,2'"),
    (["optim.lr=1,1"], "--sweep optim.lr: a value is listed twice in '1,1'"),
    (["optim.lr=1", "optim.lr=2"], "--sweep optim.lr: given twice"),
    (["nodes=2,4"], "--sweep nodes: not a sweepable key"),
])
def test_bad_sweeps(sweeps: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        sweep.points(sweeps, "base")


def specs(*sweeps: str, nodes: int = 2, **kw: str) -> list[api.JobSpec]:
    return [api.job_spec("llama2-7b", nodes, overrides=p.overrides, run_name=p.run_name,
                         smoke=True, **kw)  # type: ignore[arg-type]
            for p in sweep.points(sweeps, f"llama2-7b-{nodes}n-smoke")]


def test_a_slurm_sweep_is_one_array_script(tmp_path: Path) -> None:
    jobs = specs("optim.lr=1e-4,3e-4", "seed=1,2,3")
    assert slurm.sweepable(jobs)
    plan = slurm.plan_array(jobs)
    text = plan.text
    assert plan.primary == "llama2-7b-2n-smoke-lr1e-4-seed1-array.sbatch"
    assert "#SBATCH --array=0-5\n" in text and "#SBATCH --output=%x-%A_%a.out\n" in text
    # Each task exports its own run folder; bash picks one by SLURM_ARRAY_TASK_ID.
    script = tmp_path / "array.sh"
    body = text[text.index("case ${SLURM_ARRAY_TASK_ID"):text.index("# ---- end of generated")]
    for task, job in enumerate(jobs):
        script.write_text(body + 'printf "%s\\n" "$JOBGEN_RUN_DIR" "${TRAIN_ARGS[*]}"\n')
        out = subprocess.run(["bash", str(script)], env={"SLURM_ARRAY_TASK_ID": str(task)},
                             capture_output=True, text=True, check=True).stdout.splitlines()
        assert out[0] == f"jobgen-runs/{job.run_name}"
        assert f"--seed {job.recipe.seed}" in out[1]
    bad = subprocess.run(["bash", str(script)], env={"SLURM_ARRAY_TASK_ID": "6"},
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "SLURM_ARRAY_TASK_ID=6 is not a task of this array (0-5)" in bad.stderr


def test_a_sweep_over_the_sbatch_header_is_not_an_array() -> None:
    jobs = specs("job.time_limit=60,120")
    assert not slurm.sweepable(jobs)
    with pytest.raises(ValueError):
        slurm.plan_array(jobs)


def test_submit_dry_run_prints_the_array(jobgen: Callable) -> None:
    result = jobgen("submit", "llama2-7b", "--nodes", "2", "--smoke", "--sweep",
                    "optim.lr=1e-4,3e-4", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("sbatch --parsable") == 1 and "#SBATCH --array=0-1" in result.stdout
    # Not an array: one sbatch per combination.
    result = jobgen("submit", "llama2-7b", "--nodes", "2", "--smoke", "--sweep",
                    "job.time_limit=60,120", "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("sbatch --parsable") == 2 and "--array" not in result.stdout
    result = jobgen("submit", "llama2-7b", "--nodes", "2", "--sweep", "optim.lr=1e-4,3e-4",
                    "--chain", "--dry-run")
    assert result.exit_code == 2 and "--chain and --sweep together" in result.stderr


def test_each_job_of_a_sweep_meets_at_its_own_port(jobgen: Callable) -> None:
    out = jobgen("submit", "pythia6.9b", "--nodes", "2", "--smoke", "--set",
                 "job.master_port=30000", "--sweep", "seed=7,8,9", "--dry-run").stdout
    assert re.findall(r"export MASTER_PORT=(\d+)", out) == ["30000", "30001", "30002"]
    # A sweep over the port itself is taken as given.
    out = jobgen("submit", "pythia6.9b", "--nodes", "2", "--smoke", "--sweep",
                 "job.master_port=30000,31000", "--dry-run").stdout
    assert re.findall(r"export MASTER_PORT=(\d+)", out) == ["30000", "31000"]
    result = jobgen("submit", "pythia6.9b", "--nodes", "2", "--smoke", "--set",
                    "job.master_port=65534", "--sweep", "seed=7,8", "--dry-run")
    assert result.exit_code == 2 and "would meet at port 65535" in result.stderr
