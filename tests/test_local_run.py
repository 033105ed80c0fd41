"""`jobgen run RECIPE --smoke`: the job on this machine, no scheduler: both passes of a 2-node
BERT 1.5B smoke job (DeepSpeed ZeRO-1 on CPU), recorded like a submission. It uses the Slurm
tests' helpers but not the cluster, so a full run runs it beside them rather than after them."""
from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import Require
from test_slurm_e2e import (
    JOB_TIMEOUT,
    MAX_STEPS,
    NODES,
    _tail,
    complete_checkpoints,
    free_port,
    only,
    read_events,
    run_cli,
    show_figures,
    steps_of,
    unique,
)

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

FIGURES: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _figures(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    show_figures(request, "jobgen run figures", FIGURES)


def test_jobgen_run_without_slurm(tmp_path: Path) -> None:
    require = Require()
    for module in ("torch", "transformers", "deepspeed", "h5py"):
        require(importlib.util.find_spec(module), f"{module} is not installed in this venv")
    run_name = unique("local")
    started = time.time()
    proc = run_cli(tmp_path, "run", "bert1.5b", "--nodes", "2", "--smoke", "--run-name",
                   run_name, "--set", f"job.master_port={free_port()}", timeout=JOB_TIMEOUT)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, _tail(output, 80)
    by_node: dict[int, list[str]] = {0: [], 1: []}
    for line in proc.stdout.splitlines():
        match = re.match(r"\[node (\d)\] (.*)", line)
        if match:
            by_node[int(match.group(1))].append(match.group(2))
    events = read_events("\n".join(by_node[0]))
    assert steps_of(events, "compile") == [1, 2, 3], _tail(output, 80)
    assert steps_of(events, "train") == list(range(1, MAX_STEPS + 1)), _tail(output, 80)
    assert [e["world_size"] for e in only(events, "start")] == [NODES, NODES]
    for node in (0, 1):
        assert f"jobgen[node {node}]: train pass ended with status 0" in by_node[node]
    assert complete_checkpoints(tmp_path / "jobgen-runs" / run_name)[-1] == MAX_STEPS
    # Recorded like a submission: `jobgen runs` lists it, `status` reads what its nodes wrote.
    listed = json.loads(run_cli(tmp_path, "runs", "--json").stdout)
    mine = [r for r in listed if r["name"] == run_name]
    assert [(r["backend"], r["state"]) for r in mine] == [("local", "COMPLETED")], listed
    status = json.loads(run_cli(tmp_path, "status", run_name, "--json").stdout)
    assert status["state"] == "COMPLETED" and status["nodes"] == {"0": "0 train",
                                                                  "1": "0 train"}
    FIGURES["jobgen run bert1.5b --nodes 2 --smoke (no Slurm)"] = \
        f"{time.time() - started:.1f} s"
