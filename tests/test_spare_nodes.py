"""Spare nodes on Slurm (recipe job.spare_nodes, issue 40 item 2): the job allocates N+S nodes
with --no-kill, the health gate picks which N train, and a node lost during training is
replaced by a spare's torchrun agent at the next rendezvous round, inside the allocation. The
fast tests cover render, validation, the other backends' notes and the plan's pricing; the
Slurm rehearsal (tests/test_slurm_e2e.py's cluster) loses a training node mid-run."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobgen import api
from jobgen.planning import planner

JOBGEN = Path(sys.executable).parent / "jobgen"
SPARE = ["job.spare_nodes=1", "job.restarts_in_place=2"]


def jobgen(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN), *words], capture_output=True, text=True, timeout=120,
                          check=False)


def test_slurm_allocates_the_spares_with_no_kill() -> None:
    text = api.plan(api.job_spec("llama2-7b", 2, smoke=True, overrides=SPARE)).text
    head = text.split("\n#\n", 1)[0]
    assert "#SBATCH --nodes=3\n" in head and "#SBATCH --no-kill\n" in head
    assert "export JOBGEN_NODES=2\n" in text and "export JOBGEN_SPARE_NODES=1\n" in text
    plain = api.plan(api.job_spec("llama2-7b", 2, smoke=True)).text
    assert "#SBATCH --nodes=2\n" in plain
    assert "--no-kill" not in plain and "JOBGEN_SPARE_NODES" not in plain


@pytest.mark.parametrize(("sets", "says"), [
    (["job.spare_nodes=1"], "job.spare_nodes: 1 needs job.restarts_in_place of 1 or more"),
    (["job.spare_nodes=-1", "job.restarts_in_place=1"], "job.spare_nodes"),
    (["job.spare_nodes=65", "job.restarts_in_place=1"], "job.spare_nodes"),
    (["job.spare_nodes=two"], "job.spare_nodes: expected an integer"),
])
def test_a_bad_value_is_one_line_and_exit_2(sets: list[str], says: str) -> None:
    words = ["render", "llama2-7b", "--nodes", "2", "--smoke"]
    for item in sets:
        words += ["--set", item]
    proc = jobgen(*words)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_nemo_refuses_spares() -> None:
    proc = jobgen("render", "neox20b", "--nodes", "2", "--smoke", "--set", "job.spare_nodes=1")
    assert proc.returncode == 2 and "job.spare_nodes" in proc.stderr, proc.stderr
    shown = jobgen("show", "neox20b")
    assert "job.spare_nodes" in shown.stdout + shown.stderr


@pytest.mark.parametrize(("backend", "why"), [
    ("batch", "the main node's exit ends it"),
    ("sagemaker", "instance count is fixed"),
    ("eks", "the gang is exactly --nodes pods"),
])
def test_where_spares_cannot_apply_render_says_why(backend: str, why: str) -> None:
    proc = jobgen("render", "llama2-7b", "--nodes", "2", "--backend", backend,
                  *[w for item in SPARE for w in ("--set", item)])
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "job.spare_nodes=1" in x]
    assert f"does not apply on {backend}: " in line and why in line
    assert "JOBGEN_SPARE_NODES" not in proc.stdout


def _plan(*sets: str) -> planner.Result:
    return planner.plan("llama2-7b", [16, 128], sets, None, planner.Options(price=10.0))


def test_plan_bills_the_spares_and_restarts_in_place_while_one_remains() -> None:
    plain, spared = _plan(), _plan(*SPARE)
    for a, b in zip(plain.rows, spared.rows):
        # Billed for N+1 nodes, with and without failures.
        assert b.cost == pytest.approx(a.cost * (a.nodes + 1) / a.nodes)
        assert a.failures is not None and b.failures is not None
        assert b.failures.recipe.cost == pytest.approx(
            b.failures.recipe.wall_s / 3600 * (a.nodes + 1) * 10.0)
        # One of every two node failures restarts in place: cheaper restarts, better goodput.
        assert b.failures.restart_s < a.failures.restart_s
        assert b.failures.recipe.goodput > a.failures.recipe.goodput
    assert any("job.spare_nodes=1: every count below is billed with 1 spare" in n
               for n in spared.notes)
    # A restart budget of 1 bounds what one allocation's spares can do.
    one = _plan("job.spare_nodes=3", "job.restarts_in_place=1")
    three = _plan("job.spare_nodes=3", "job.restarts_in_place=3")
    assert one.rows[0].failures.restart_s > three.rows[0].failures.restart_s  # type: ignore
