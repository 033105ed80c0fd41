"""Running one recovery arm on the local Slurm cluster (benchmarks/recovery_arms.py): submit the
2-node smoke run, inject the seeded failure schedule (a worker killed, a node lost, a hang that
the other node's collective timeout catches, `jobgen watch` as the fallback), then read the run
back from `jobgen report --json`."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from arms_figures import ARMS, measure

BIN = Path(sys.executable).parent
JOBGEN = [str(BIN / "jobgen")] if (BIN / "jobgen").exists() else [sys.executable, "-m",
                                                                   "jobgen.cli"]
RECIPE = "llama2-7b"
NODES = 2
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def spares_supported(workdir: Path) -> bool:
    """Whether this jobgen renders job.spare_nodes (issue 40 item 2)."""
    done = subprocess.run([*JOBGEN, "render", RECIPE, "--nodes", str(NODES), "--smoke", "--set",
                           "job.spare_nodes=1", "--set", "job.restarts_in_place=1"],
                          cwd=workdir, capture_output=True, text=True, check=False)
    return done.returncode == 0


def schedule(seed: int) -> dict[str, int]:
    """The steps at which each failure strikes (the same for every arm and repetition)."""
    rng = random.Random(seed)
    return {"process": rng.randint(5, 8), "node": rng.randint(11, 14), "hang": rng.randint(17, 20)}


def partitions() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True,
                         check=False).stdout.split()
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def job_state(job: str) -> tuple[str, str]:
    """The job's state and reason: the controller's (which holds a requeued job as PENDING;
    accounting's last row of it may read FAILED meanwhile), else accounting's."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                           text=True, check=False).stdout
    fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
    if fields.get("JobState"):
        return fields["JobState"], fields.get("Reason", "")
    done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"],
                          capture_output=True, text=True, check=False).stdout.split()
    return (done[-1] if done else "UNKNOWN"), ""


def _env_of(pid: str) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(i.split("=", 1) for i in raw if "=" in i)


def node_processes(job: str, rank: int) -> tuple[list[int], list[int]]:
    """(the worker of global rank `rank`, every process of the Slurm node it runs on)."""
    procs: dict[int, dict[str, str]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                env = _env_of(proc.name)
            except OSError:
                continue
            if env.get("SLURM_JOB_ID") == job:
                procs[int(proc.name)] = env
    workers = [p for p, e in procs.items() if e.get("RANK") == str(rank)
               and "TORCHELASTIC_RESTART_COUNT" in e]
    if not workers:
        return [], []
    node = procs[workers[0]].get("SLURM_NODEID")
    return workers, [p for p, e in procs.items() if e.get("SLURM_NODEID") == node]


def newest_events(run_dir: Path) -> list[dict[str, Any]]:
    """The JSON events of node 0's training log in the newest allocation."""
    logs = sorted(run_dir.glob("logs/*/restart-*/node-0/train.log"),
                  key=lambda p: int(p.parent.parent.name.split("-")[1]))
    if not logs:
        return []
    out = []
    for line in logs[-1].read_text(errors="replace").splitlines():
        if line.startswith('{"event"'):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _when(stamp: Any) -> float:
    """An event's ISO time as seconds since the epoch (now, where it has none)."""
    try:
        return datetime.datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return time.time()


def node_host(run_dir: Path, node: int) -> str:
    """The host of a node of the newest allocation (its flow writes it)."""
    hosts = sorted(run_dir.glob(f"logs/*/restart-*/node-{node}/host"),
                   key=lambda p: int(p.parent.parent.name.split("-")[1]))
    return hosts[-1].read_text().strip() if hosts else ""


def resume(host: str) -> None:
    """A host this benchmark set DOWN back in service (only where it is still down)."""
    shown = subprocess.run(["sinfo", "-h", "-n", host, "-o", "%t"], capture_output=True,
                           text=True, check=False).stdout
    if shown.strip().startswith(("down", "drain")):
        subprocess.run(["scontrol", "update", f"nodename={host}", "state=resume"],
                       capture_output=True, check=False)


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_arm(arm: str, seed: int, workdir: Path, a: argparse.Namespace, use_spare: bool,
            steps: Optional[dict[str, int]] = None) -> dict[str, Any]:
    """One run of one arm: submit, inject the schedule (`steps`, else the seed's), watch, then
    `jobgen report --json`."""
    in_place, spares, sync, cut = ARMS[arm]
    steps = steps or schedule(seed)
    name = f"bench-{arm.lower()}-{seed}-{int(time.time())}"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "JOBGEN_SMOKE_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
               JOBGEN_STATE_DIR=str(workdir / "state"),
               JOBGEN_SMOKE_STEP_DELAY=str(a.step_delay), JOBGEN_SMOKE_SAVE_DELAY=str(a.save_delay),
               JOBGEN_SMOKE_HANG_AT_STEP=str(steps["hang"]), JOBGEN_SMOKE_HANG_NODE="1")
    sets = [f"job.master_port={free_port()}", "job.max_restarts=10",
            f"job.collective_timeout_s={a.collective_timeout:.0f}",
            f"job.restarts_in_place={in_place}", f"checkpoint.async_save={str(not sync).lower()}"]
    if spares and use_spare:
        sets.append(f"job.spare_nodes={spares}")
    # A spare needs a third node: the default partition (side has two).
    part = a.spare_partition if spares and use_spare else a.partition
    # No compile pass in any arm (a requeue skips it once the cache is warm; only a
    # workdir's first run would pay it).
    cmd = [*JOBGEN, "submit", RECIPE, "--nodes", str(NODES), "--smoke", "--run-name", name,
           "--compile", "never", *(["--partition", part] if part else [])]
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{arm}: jobgen submit failed: {done.stderr.strip()}")
    job = done.stdout.split()[0]
    run_dir = workdir / "jobgen-runs" / name
    watch_out = workdir / f"{name}.watch"
    # The hang is caught first by the others' collective timeout (job.collective_timeout_s, the
    # same in every arm: A's flow requeues, B/C/D's torchrun restarts in place); watch is the
    # fallback, for a hang no collective sees: no step for 8 x the median step, and longer than
    # the collective timeout plus a restart (new workers import torch and load the checkpoint:
    # 20 s at least on a loaded 2-core machine).
    hang_min = max(a.hang_min, 4 * a.step_delay + 2 * a.save_delay,
                   2 * a.collective_timeout + 20)
    with open(watch_out, "w") as out:
        watcher = subprocess.Popen([*JOBGEN, "watch", name, "--on-hang", "requeue", "--hang-min",
                                    f"{hang_min:g}", "--hang-factor", "8", "--poll", "0.5"],
                                   cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    failures: list[dict[str, Any]] = []
    delays = 0
    downed = ""
    ended = time.time() + a.timeout
    try:
        while time.time() < ended:
            state, reason = job_state(job)
            if state in FINISHED:
                break
            if state == "PENDING" and reason == "BeginTime" and failures:
                if cut or (a.a_delay and not in_place):
                    # A-cut: eligible now; A with --a-delay: held as Slurm's default would.
                    # Not `now`: a start within the second of the requeue finds the old
                    # allocation's credential revoked, and Slurm fails the job.
                    at = "now+2" if cut else f"now+{max(0, a.a_delay - a.cred_expire):.0f}"
                    if delays < len(failures):
                        subprocess.run(["scontrol", "update", f"jobid={job}", f"StartTime={at}"],
                                       capture_output=True, check=False)
                        delays += 1
            events = newest_events(run_dir) if state == "RUNNING" else []
            logged = {e["step"]: _when(e.get("time")) for e in events
                      if e.get("event") == "step" and "step" in e}
            done_causes = {f["cause"] for f in failures}
            for cause in ("process", "node"):
                if cause not in done_causes and steps[cause] in logged:
                    worker, node = node_processes(job, 1)
                    if worker and cause == "node" and spares and use_spare:
                        # Lost as Slurm sees it: the host DOWN (the job keeps its other nodes,
                        # --no-kill); back in service once training has gone on without it.
                        downed = node_host(run_dir, 1)
                        subprocess.run(["scontrol", "update", f"nodename={downed}",
                                        "state=down", "reason=jobgen-recovery-arms"],
                                       capture_output=True, check=False)
                    elif worker:
                        kill(worker if cause == "process" else node)
                    if worker:
                        failures.append({"cause": cause, "time": time.time(),
                                         "step": steps[cause]})
            if downed and any(n > steps["node"] + 1 for n in logged):
                resume(downed)
                downed = ""
            if "hang" not in done_causes and steps["hang"] - 1 in logged and \
                    steps["hang"] not in logged and "node" in done_causes:
                # Node 1 stops before this step: the failure is when the step before ended.
                failures.append({"cause": "hang", "time": logged[steps["hang"] - 1],
                                 "step": steps["hang"]})
            time.sleep(0.25)
        else:
            subprocess.run(["scancel", job], check=False)
            raise SystemExit(f"{arm}: job {job} still running after {a.timeout:.0f} s; cancelled")
    finally:
        if downed:
            resume(downed)
        try:
            watcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            watcher.kill()
    state, _ = job_state(job)
    rep = subprocess.run([*JOBGEN, "report", name, "--json"], cwd=workdir, env=env,
                         capture_output=True, text=True, check=False)
    if rep.returncode != 0:
        raise SystemExit(f"{arm}: jobgen report failed: {rep.stderr.strip()}")
    return measure(arm, json.loads(rep.stdout), failures, state, run_dir)
