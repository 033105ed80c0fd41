"""submitit's side of the node contract: the parameters it gets, and what every node runs
(the job end to end through submitit, with a kill and a requeue, is in test_slurm_e2e.py)."""
from __future__ import annotations

import json
from typing import Callable

import pytest

from jobgen import api
from jobgen.backends.submitit import runner as submitit_runner
from jobgen.payloads import node


@pytest.mark.parametrize("limit,minutes", [
    (None, submitit_runner.DEFAULT_TIMEOUT_MIN), ("UNLIMITED", submitit_runner.DEFAULT_TIMEOUT_MIN),
    ("90", 90), ("1:30", 2), ("02:00:00", 120), ("2-00:00:00", 2880), ("1-12", 2160),
    ("1-12:30", 2190), ("00:00:30", 1)])
def test_the_recipe_time_limit_reaches_submitit(limit: str, minutes: int) -> None:
    assert submitit_runner.time_limit_minutes(limit) == minutes


def test_parameters_follow_the_site_and_recipe() -> None:
    spec = api.job_spec("neox20b", 4, overrides=["job.time_limit=04:00:00"])
    params = submitit_runner.executor_parameters(spec)
    assert params["nodes"] == 4 and params["tasks_per_node"] == 1
    assert params["timeout_min"] == 240
    assert params["slurm_additional_parameters"]["requeue"] is True


def test_dry_run_prints_the_node_command(jobgen: Callable) -> None:
    result = jobgen("submit", "pythia6.9b", "--nodes", "2", "--smoke", "--via", "submitit",
                    "--dry-run")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    spec = api.job_spec("pythia6.9b", 2, smoke=True)
    task = submitit_runner.node_task(spec)
    assert shown["node"]["argv"] == ["bash", task.flow, "node", *task.args]
    assert shown["node"]["env"] == dict(task.env)
    assert shown["node"]["env"]["JOBGEN_MAX_RESTARTS"] == str(spec.recipe.job.max_restarts)
    assert set(shown["node"]["facts"]) == set(node.NODE_FACTS) - {"JOBGEN_RUN_COMPILE"}
    assert shown["submitit"]["parameters"] == submitit_runner.executor_parameters(spec)


def test_chain_is_refused_through_submitit(jobgen: Callable) -> None:
    result = jobgen("submit", "neox20b", "--chain", "--via", "submitit", "--dry-run")
    assert result.exit_code == 2
    assert "--chain is for --backend slurm (submitit runs both passes in one job)" \
        in result.stderr
