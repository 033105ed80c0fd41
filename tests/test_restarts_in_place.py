"""Restarts inside the allocation (recipe job.restarts_in_place, issue 40): the training pass's
torchrun runs the elastic agent with the c10d rendezvous and --max_restarts, so that a worker
that fails on healthy nodes restarts every node's workers in place, from the newest complete
checkpoint, without the health gate, the compile pass or the scheduler. A failure no restart
cures (78, a trainer started wrongly) is never restarted in place. The rehearsal kills one
worker of a 2-node `jobgen run` and reads what report, watch and runs count."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobgen import api

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "payload" / "smoke" / "launch.sh"
JOBGEN = Path(sys.executable).parent / "jobgen"
FACTS = json.loads((ROOT / "jobgen" / "payloads" / "upstream" / "torchrun.json").read_text())

# A torchrun stand-in: records its arguments; with STUB_SCRIPT, prints that and sleeps as an
# agent restarting its workers would (the watch must end it).
STUB = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_ARGV"
if [ -n "${STUB_SCRIPT:-}" ]; then
  printf '%b\\n' "$STUB_SCRIPT"
  trap 'kill $!; echo agent stopped; exit 1' TERM
  sleep "${STUB_SLEEP:-60}" & wait
  exit 1
fi
"""


def launch(tmp_path: Path, node: str = "1", **env: str) -> tuple[subprocess.CompletedProcess[str],
                                                                  list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(STUB)
    (bin_dir / "torchrun").chmod(0o755)
    (tmp_path / "train.py").write_text("")
    argv_file = tmp_path / "argv"
    full = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path),
            "JOBGEN_NODE_RANK": node, "JOBGEN_NNODES": "2", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "41000", "JOBGEN_WORKERS_PER_NODE": "8",
            "JOBGEN_LOG_DIR": str(tmp_path / "logs"), "JOBGEN_WORKDIR": str(tmp_path),
            "JOBGEN_PROGRAM": "train.py", "STUB_ARGV": str(argv_file), **env}
    proc = subprocess.run(["bash", str(LAUNCHER), "train", "--lr", "0.1"], env=full,
                          capture_output=True, text=True, timeout=60, check=False)
    return proc, argv_file.read_bytes().decode().split("\0")[:-1]


def test_the_training_pass_meets_in_a_c10d_rendezvous_ranked_as_the_flow_ranks(
        tmp_path: Path) -> None:
    """Node 1: the main node's endpoint, not the host; a label that sorts after any address, so
    that torchrun's node ranks are the flow's (rank 0, which speaks for the job, on node 0).
    Current torch and 2.1.2 (the Neuron image's) parse it; 1.13.1 has no --local_addr (NeMo's
    pin: the NeMo payload fixes job.restarts_in_place at 0)."""
    proc, argv = launch(tmp_path, JOBGEN_RESTARTS_IN_PLACE="3", JOBGEN_RDZV_TIMEOUT="900")
    assert proc.returncode == 0, proc.stderr
    assert "up to 3 restarts in place" in proc.stderr
    from torch.distributed.run import get_args_parser
    args = get_args_parser().parse_args(argv)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.max_restarts) == ("c10d",
                                                                          "10.0.0.1:41000", 3)
    assert args.rdzv_conf == "is_host=0,join_timeout=900"
    # Each agent looks at its workers and its peers every 0.1 s, as torch 2.4+ does by default:
    # torch 2.1.2's torchrun would wait 5 s, twice per restart.
    assert args.monitor_interval == 0.1
    assert args.local_addr == "~jobgen-node-000001"
    assert sorted(["~jobgen-node-000002", args.local_addr, "10.0.0.1", "255.255.255.255",
                   "ip-10-0-0-9.ec2.internal"])[-2:] == ["~jobgen-node-000001",
                                                        "~jobgen-node-000002"]
    script = next(i for i, a in enumerate(argv) if a.endswith("train.py"))
    options = {a for a in argv[:script] if a.startswith("--")}
    assert options <= {s for o in FACTS["torch"]["2.1.2"]["options"].values()
                       for s in o["spellings"]}
    assert "--local_addr" not in {s for o in FACTS["torch"]["1.13.1"]["options"].values()
                                  for s in o["spellings"]}
    # The main node hosts the rendezvous and gives its own address.
    _, argv = launch(tmp_path, node="0", JOBGEN_RESTARTS_IN_PLACE="3")
    args = get_args_parser().parse_args(argv)
    assert (args.rdzv_conf, args.local_addr) == ("is_host=1", "10.0.0.1")
    # Without a budget, and in the compile pass, the static rendezvous as before.
    _, argv = launch(tmp_path, JOBGEN_RESTARTS_IN_PLACE="0")
    assert "--rdzv_backend" not in argv and argv[argv.index("--node_rank") + 1] == "1"


@pytest.mark.parametrize("printed", [
    "ModuleNotFoundError: No module named 'apex'\nE1127 api.py:1002] failed (exitcode: 1) "
    "local_rank: 0 (pid: 7) of binary: python",
    "E1127 api.py:1002] failed (exitcode: 78) local_rank: 3 (pid: 7) of binary: python"])
def test_a_failure_no_restart_cures_ends_the_pass_instead_of_a_restart(
        tmp_path: Path, printed: str) -> None:
    """The agent would restart the workers: the node's watch reads its failure line, ends it,
    and the pass ends with 78 (the job is never requeued)."""
    proc, _ = launch(tmp_path, JOBGEN_RESTARTS_IN_PLACE="3", STUB_SCRIPT=printed)
    assert proc.returncode == 78, proc.stderr
    assert "not restarted in place" in proc.stderr
    assert "agent stopped" in proc.stdout
    assert (tmp_path / "logs" / "node-1" / "train.status").read_text() == "78\n"


@pytest.mark.parametrize("before", ["", "UserWarning: No module named 'apex'; fused kernels off\n"])
def test_an_ordinary_failure_is_left_to_the_agent(tmp_path: Path, before: str) -> None:
    """A killed worker (-9) is the agent's to restart, even after a warning that reads like a
    trainer started wrongly (only a worker's own exit status is judged by that): the watch
    leaves the stand-in agent running to its own end."""
    proc, _ = launch(tmp_path, JOBGEN_RESTARTS_IN_PLACE="3", STUB_SLEEP="4", STUB_SCRIPT=(
        before + "E1127 api.py:1002] failed (exitcode: -9) local_rank: 0 (pid: 7) of binary: "
        "python"))
    assert "not restarted in place" not in proc.stderr
    assert "agent stopped" not in proc.stdout
    # The agent gave up (its status 1): judged as before, from the whole pass's log.
    assert proc.returncode == (78 if before else 1), proc.stderr


def test_the_recipe_key_reaches_nodes_that_share_the_run_folder() -> None:
    spec = api.job_spec("llama2-7b", 2, smoke=True, overrides=["job.restarts_in_place=2"])
    assert "export JOBGEN_RESTARTS_IN_PLACE=2" in api.plan(spec).text
    plain = api.job_spec("llama2-7b", 2, smoke=True)
    assert "JOBGEN_RESTARTS_IN_PLACE" not in api.plan(plain).text


def test_the_collective_timeout_is_the_recipes_and_refused_where_it_cannot_act() -> None:
    """job.collective_timeout_s turns a hung rank into a failed collective (and so a restart in
    place): it reaches every trainer's process group through the node contract, and a trainer
    whose process group takes no timeout (NeMo's) refuses any other value than the default."""
    from jobgen.inputs.recipe import Job

    spec = api.job_spec("llama2-7b", 2, smoke=True, overrides=["job.collective_timeout_s=45"])
    assert "export JOBGEN_COLLECTIVE_TIMEOUT=45" in api.plan(spec).text
    default = Job().collective_timeout_s
    plain = api.plan(api.job_spec("neox20b", 2)).text
    assert f"export JOBGEN_COLLECTIVE_TIMEOUT={default}" in plain
    jobgen = str(Path(sys.executable).parent / "jobgen")
    for recipe, value, says in (
            ("neox20b", "45", "job.collective_timeout_s: payload neuron_nemo accepts only "
                              f"{default}"),
            ("llama2-7b", "0", "job.collective_timeout_s")):
        proc = subprocess.run([jobgen, "render", recipe, "--nodes", "2", "--set",
                               f"job.collective_timeout_s={value}"],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2 and not proc.stdout, proc
        assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_where_the_key_cannot_apply_render_says_so() -> None:
    """SageMaker's instances keep their own checkpoint parts: the key does not reach them, and
    render says so in one note instead of dropping it silently."""
    proc = subprocess.run([str(Path(sys.executable).parent / "jobgen"), "render", "llama2-7b",
                           "--backend", "sagemaker", "--nodes", "2",
                           "--set", "job.restarts_in_place=2"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "JOBGEN_RESTARTS_IN_PLACE" not in proc.stdout
    assert ("job.restarts_in_place=2 does not apply on sagemaker: its nodes do not share the "
            "run folder") in proc.stderr


def _worker(run: Path, rank: int) -> int | None:
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (f"RANK={rank}".encode() in env and f"JOBGEN_RUN_DIR={run}".encode() in env
                and any(e.startswith(b"TORCHELASTIC_RESTART_COUNT=") for e in env)):
            return int(proc.name)
    return None


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.startswith('{"event"')]


@pytest.mark.slow
def test_a_killed_worker_restarts_in_place_from_the_newest_checkpoint(tmp_path: Path) -> None:
    """`jobgen run llama2-7b --nodes 2 --smoke` with job.restarts_in_place=2: rank 1 is killed
    (SIGKILL) once step 8's checkpoint is sealed. Both nodes' workers start again in the same
    allocation and resume from the newest checkpoint; the health gate and the compile pass ran
    once; the run finishes; report, watch and runs count one restart in place, no requeue."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBGEN_")}
    env.update(JOBGEN_STATE_DIR=str(tmp_path / "state"), JOBGEN_SMOKE_STEP_DELAY="0.3")
    job = subprocess.Popen([str(JOBGEN), "run", "llama2-7b", "--nodes", "2", "--smoke",
                            "--set", "job.restarts_in_place=2"], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    run = tmp_path / "jobgen-runs" / "llama2-7b-2n-smoke"
    metrics = run / "train" / "metrics.jsonl"
    killed_after = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None:
            sealed = [e["step"] for e in (_events(metrics) if metrics.exists() else [])
                      if e["event"] == "checkpoint"]
            pid = _worker(run, 1) if sealed and max(sealed) >= 8 else None
            if pid is not None:
                killed_after = max(sealed)
                os.kill(pid, signal.SIGKILL)
                break
            time.sleep(0.2)
        out, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert killed_after is not None, "never reached step 8's checkpoint"
    assert job.returncode == 0, out[-3000:]
    (folder,) = [p for p in (run / "logs").iterdir() if p.is_dir()]   # one allocation
    events = _events(folder / "node-0" / "train.log")
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2 and starts[0]["allocation"] == starts[1]["allocation"]
    resumes = [e["step"] for e in events if e["event"] == "resume"]
    sealed_then = [e["step"] for e in events[:events.index(starts[1])]
                   if e["event"] == "checkpoint"]
    assert resumes == [max(sealed_then)] and max(sealed_then) >= killed_after
    assert events[-1]["event"] == "done"
    # The per-allocation work ran once on each node.
    assert out.count("health: node 0") == 1 and out.count("health: node 1") == 1
    assert out.count("compile pass (") == 2
    assert (folder / "node-0" / "train.restarts").read_text() == "1\n"
    assert "failed (exitcode: -9)" in (folder / "node-1" / "train.log").read_text()

    def jobgen(*words: str) -> str:
        proc = subprocess.run([str(JOBGEN), *words], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=120, check=False)
        return proc.stdout + proc.stderr

    assert ("restarts in place 1 (torchrun's, inside an allocation), requeues 0"
            in jobgen("report", "--run-dir", str(run)))
    assert "1 allocation(s), 1 restart(s) in place" in jobgen("watch", "--run-dir", str(run))
    assert "# restarts: 1 in place" in jobgen("runs", "llama2-7b-2n-smoke")
