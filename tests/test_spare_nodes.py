"""Spare nodes on Slurm (recipe job.spare_nodes, issue 40 item 2): the job allocates N+S nodes
with --no-kill, the health gate picks which N train, and when the job step loses a node the
controller runs it again on the nodes left and a spare, inside the allocation. The fast tests
cover render, validation, the other backends' notes, the plan's pricing and the controller's
stages; the Slurm rehearsal (tests/test_slurm_e2e.py's cluster) loses a training node mid-run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import test_slurm_e2e as e2e
from test_slurm_e2e import cluster  # noqa: F401  (the local cluster's fixture)

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


def test_spares_need_no_restart_budget_and_suit_every_payload() -> None:
    """The step runs again on a spare: no torchrun restart budget is needed, and NeMo's
    launcher, which picks its checkpoint at launch, resumes from the newest one too."""
    proc = jobgen("render", "neox20b", "--nodes", "2", "--smoke", "--set", "job.spare_nodes=1")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=3\n#SBATCH" in proc.stdout and "#SBATCH --no-kill\n" in proc.stdout


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


def _plan(*sets: str, counts: tuple[int, ...] = (16, 64)) -> planner.Result:
    return planner.plan("llama2-7b", list(counts), sets, None, planner.Options(price=10.0))


def test_spares_count_against_the_sites_node_limit() -> None:
    """136 nodes fill the local site's slurm.max_nodes: with a spare the allocation is 137."""
    result = _plan(*SPARE, counts=(128, 136))
    assert [r.nodes for r in result.rows] == [128]
    assert [(s.nodes, s.reason) for s in result.skipped] == [
        (136, "site local allows at most 136 nodes (slurm.max_nodes)")]


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
    # More spares: more of the failures stay inside the allocation.
    three = _plan("job.spare_nodes=3")
    assert three.rows[0].failures.restart_s < spared.rows[0].failures.restart_s  # type: ignore


# --- the rehearsal on the local Slurm cluster ---------------------------------------------------

@pytest.mark.slurm
@pytest.mark.slow
def test_a_lost_node_is_replaced_by_the_spare_without_a_requeue(
        cluster: int, tmp_path: Path) -> None:  # noqa: F811
    """2 training nodes + 1 spare (llama2-7b --smoke, job.spare_nodes=1, restarts_in_place=2):
    once a checkpoint is sealed, training node 1's host is set DOWN. Slurm keeps the allocation
    (--no-kill) and the step ends; the controller runs it again on node 0 and the spare, which
    train the rest from the newest checkpoint. One allocation, no requeue, the run completes."""
    import time

    if cluster < 3:
        pytest.skip(f"the cluster has {cluster} nodes; 2 + 1 spare are needed")
    job = e2e.render_into_sbatch(
        tmp_path, "llama2-7b", run_name=e2e.unique("spare"), port=e2e.free_port(),
        env=e2e.job_env(JOBGEN_SMOKE_STEP_DELAY="0.3"), label="spare node",
        render_args=["--compile", "never", *[w for s in SPARE for w in ("--set", s)]],
        sbatch_args=["--job-name=spare-e2e"])
    logs = job.run_dir / "logs" / job.job_id / "restart-0"
    lost, downed_at = "", 0.0
    try:
        sealed = e2e.wait_until(job, lambda: e2e.complete_checkpoints(job.run_dir), "a checkpoint",
                                240, poll=0.2)
        lost = (logs / "node-1" / "host").read_text().strip()
        downed_at = time.time()
        subprocess.run(["scontrol", "update", f"nodename={lost}", "state=down",
                        "reason=jobgen-spare-test"], capture_output=True, text=True, timeout=30,
                       check=True)
        fields = e2e.wait_finished(job)
    finally:
        if lost and e2e.node_state(lost).startswith(("down", "drain")):
            subprocess.run(["scontrol", "update", f"nodename={lost}", "state=resume"],
                           capture_output=True, text=True, timeout=30, check=False)
        if e2e._squeue_state(job.job_id):
            subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30, check=False)
    e2e.assert_state(job, fields, "COMPLETED")
    out = job.output()
    assert f"the job step lost {lost}: a spare takes its place" in out, e2e.explain(job, "spare")
    # One allocation: no requeue, the lost node left the job.
    assert not (job.run_dir / "logs" / job.job_id / "restart-1").exists()
    assert fields.get("Restarts", "0") == "0", e2e.explain(job, "requeued")
    assert lost not in e2e._hosts(fields["NodeList"])
    # The main node's workers started twice in this allocation and resumed from the newest
    # checkpoint sealed before the loss; the run trained to its end.
    events = job.events(0, "train")
    starts = e2e.only(events, "start")
    assert len(starts) == 2 and starts[0]["allocation"] == starts[1]["allocation"], \
        e2e.explain(job, "starts")
    resumed = [e["step"] for e in e2e.only(events, "resume")]
    assert len(resumed) == 1 and resumed[0] >= sealed[-1], (resumed, sealed)
    assert [e["step"] for e in e2e.only(events, "done")] == [e2e.MAX_STEPS]
    # The spare, another host of the allocation, ran as node 1 and trained to the end.
    spare = (logs / "node-1" / "host").read_text().strip()
    assert spare != lost and (logs / "spares-used").read_text().split()[1:] == [lost]
    beats = [json.loads(line)["step"] for line in
             (logs / "node-1" / "train.log").read_text(errors="replace").splitlines()
             if line.startswith('{"event": "beat"')]
    assert beats and beats[-1] == e2e.MAX_STEPS
    assert (logs / "node-1" / "job.status").read_text() == "0 train\n"
    again = e2e.event_time(starts[1]) - downed_at
    print(f"\nspare node: {lost} down -> {spare}'s step started training {again:.1f} s later")


def test_the_gate_leaves_out_as_many_bad_nodes_as_there_are_spares(tmp_path: Path) -> None:
    """The controller's verdict over N+S nodes: up to S bad ones are left out (named, recorded)
    with no requeue; more than S: today's requeue without them."""
    from test_health import TRN1, _node, _reports
    _reports(tmp_path, [("n1", []), ("n2", ["devices"]), ("n3", []), ("n4", ["efa"])])
    env = {"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "0"}
    covered = _node(tmp_path, TRN1, nodes=4, command="verdict --requeues 0",
                    extra={**env, "JOBGEN_SPARE_NODES": "2"})
    assert covered.returncode == 0 and covered.stdout == "n2,n4\n", covered.stderr
    assert "left out, the spare nodes cover it" in covered.stderr
    (line, _) = (tmp_path / "run" / "jobgen-health.jsonl").read_text().splitlines()
    assert json.loads(line)["action"] == ("left out n2,n4; the healthy nodes train, spares "
                                          "among them")
    short = _node(tmp_path, TRN1, nodes=4, command="verdict --requeues 0",
                  extra={**env, "JOBGEN_SPARE_NODES": "1"})
    assert short.returncode == 75 and short.stdout == "n2,n4\n"


def test_report_reads_a_resized_allocation_as_one() -> None:
    """sacct records a --no-kill job that lost a node as RESIZING up to the loss, then the rest
    on fewer nodes: one allocation for the report, from the first start to the last end."""
    from jobgen.reporting import sacct
    text = ("319|2026-11-27T06:11:44|2026-11-27T06:13:07|2026-11-27T06:14:02|RESIZING|n[1-3]\n"
            "319|2026-11-27T06:14:02|2026-11-27T06:14:02|2026-11-27T06:14:41|COMPLETED|n[1,3]\n")
    (span,) = sacct.parse(text, "319")
    assert (span.state, span.nodes) == ("COMPLETED", "n[1-3]")
    assert span.end is not None and span.end - span.start == 94


def _controller(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """slurm.sh's functions with stand-ins for scontrol, squeue and getent: an allocation of
    n1-n3 (squeue: the job's nodes now, $NOW), node nK at 10.0.0.K."""
    from test_flow_stages import STAGES
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text('#!/bin/sh\ncase $3 in "n[1-3]") echo n1; echo n2; '
                                      'echo n3 ;; "n[1,3]") echo n1; echo n3 ;; esac\n')
    (bin_dir / "squeue").write_text('#!/bin/sh\necho "$NOW"\n')
    (bin_dir / "getent").write_text('#!/bin/sh\necho "10.0.0.${2#n} STREAM $2"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    text = (f'source "{STAGES}/base.sh" && source "{STAGES}/compile.sh" && '
            f'source "{STAGES}/slurm.sh" && MASTER_ADDR=10.0.0.1 && {script}')
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "JOBGEN_SPARE_NODES": "1", "JOBGEN_NODES": "2",
            "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "7", "MASTER_PORT": "41000",
            "JOBGEN_MASTER_RESOLVER": "getent", "JOBGEN_LOG_DIR": str(tmp_path),
            "JOBGEN_COMPILE_CACHE": str(tmp_path / "cache"), "JOBGEN_COMPILE_KEY": "k",
            "JOBGEN_PASSES": "both", "JOBGEN_COMPILE_MODE": "auto", **env}
    return subprocess.run(["bash", "-c", text], env=full, capture_output=True, text=True,
                          timeout=30, check=False)


SHOW = 'echo "${FLOW_STEP[*]}|$FLOW_SPARES|$MASTER_ADDR"'


@pytest.mark.parametrize(("left_out", "step", "spares", "master"), [
    ("", "--nodes=2 --ntasks=2 --nodelist=n1,n2", "n3", "10.0.0.1"),
    ("n1", "--nodes=2 --ntasks=2 --nodelist=n2,n3", "", "10.0.0.2"),
])
def test_the_step_runs_on_the_first_nodes_the_gate_kept(tmp_path: Path, left_out: str,
                                                        step: str, spares: str,
                                                        master: str) -> None:
    """The controller's job step with spares: the first JOBGEN_NODES nodes the gate kept, in the
    allocation's order, the rest wait; the master moves when the gate left out the first node.
    Without spares the step is today's."""
    proc = _controller(tmp_path, f"flow_spare_step n1 && {SHOW}", FLOW_LEFT_OUT=left_out)
    assert proc.stdout == f"--kill-on-bad-exit=1 {step}|{spares}|{master}\n", proc.stderr
    plain = _controller(tmp_path, f"flow_spare_step n1 && {SHOW}", JOBGEN_SPARE_NODES="")
    assert plain.stdout == "--kill-on-bad-exit=1||10.0.0.1\n", plain.stderr


def test_a_step_that_lost_a_node_runs_again_on_a_spare(tmp_path: Path) -> None:
    """n2 left the job (squeue: n[1,3]): the step runs again on n1 and the spare n3, deciding
    the compile pass again (no marker: it runs); no spare left after that. A step that lost no
    node, or one with no spare left, is not run again (the failure goes on as before)."""
    again = (f'flow_spare_step n1 && flow_spare_relaunch && {SHOW} && '
             'echo "compile $JOBGEN_RUN_COMPILE" && cat "$JOBGEN_LOG_DIR/spares-used"')
    proc = _controller(tmp_path, again, NOW="n[1,3]")
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["--kill-on-bad-exit=1 --nodes=2 --ntasks=2 --nodelist=n1,n3||10.0.0.1",
                         "compile 1"], proc.stderr
    assert lines[2].endswith(" n2")
    assert "the job step lost n2: a spare takes its place" in proc.stderr
    assert _controller(tmp_path, "flow_spare_step n1 && flow_spare_relaunch",
                       NOW="n[1-3]").returncode == 1
    twice = _controller(tmp_path, "flow_spare_step n1 && flow_spare_relaunch && "
                        "FLOW_STEP_NODES=n1,n2 && flow_spare_relaunch", NOW="n[1,3]")
    assert twice.returncode == 1
    none = _controller(tmp_path, "flow_spare_step n1 && FLOW_SPARES=n2 && flow_spare_relaunch",
                       NOW="n[1,3]")
    assert none.returncode == 1 and "no spare is left" in none.stderr

def test_logs_reads_a_spare_nodes_logs(jobgen: Any, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A spare logs past the training nodes' ranks: `logs --node 2` of a 2-node job reads it
    where its folder is; a rank no node logged is still refused."""
    from jobgen.runs import ledger as runs
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    folder = tmp_path / "run" / "logs" / "101" / "restart-0" / "node-2"
    folder.mkdir(parents=True)
    (folder / "train.log").write_text("the spare trained\n")
    runs.record(runs.Run(name="spare-2n", backend="slurm", job_id="101", recipe="llama2-7b",
                         nodes=2, site="", run_dir=str(tmp_path / "run"),
                         submitted="2026-11-27T06:00:00Z", jobs=("101",)))
    result = jobgen("logs", "spare-2n", "--node", "2")
    assert result.exit_code == 0 and "the spare trained" in result.output, result.output
    refused = jobgen("logs", "spare-2n", "--node", "3")
    assert refused.exit_code == 2 and "job 101 has 2 nodes (0 to 1)" in refused.stderr
