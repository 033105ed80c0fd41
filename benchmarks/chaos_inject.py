"""The chaos rehearsal's injection (benchmarks/chaos_rehearsal.py): the job's environment, its
processes found by their environment, how far its newest allocation has come, and the failures
injected while it runs on the local Slurm cluster (kills at a known rate, one time-limit
warning)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

BIN = Path(sys.executable).parent
NODES = 2
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED", "UNKNOWN"}


def job_env(workdir: Path, step_delay: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "JOBGEN_SMOKE_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["JOBGEN_STATE_DIR"] = str(workdir / "state")
    env["JOBGEN_SMOKE_STEP_DELAY"] = f"{step_delay:.3f}"
    env["JOBGEN_SMOKE_UNHEALTHY_NODE"] = "1"
    return env


def processes(job: str, node: int) -> dict[str, list[int]]:
    """This job's trainer and launcher processes on one node (by their environment)."""
    found: dict[str, list[int]] = {"trainer": [], "launcher": []}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not any(a.endswith("/train.py") for a in argv):
                continue
            env = dict(i.split("=", 1) for i in (proc / "environ").read_bytes()
                       .decode(errors="replace").split("\0") if "=" in i)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") != job or env.get("SLURM_NODEID") != str(node):
            continue
        if "--phase" not in argv:
            continue
        launcher = any(a.endswith(("torchrun", "torch.distributed.run")) for a in argv)
        found["launcher" if launcher else "trainer"].append(int(proc.name))
    return found


def newest_allocation(run_dir: Path) -> tuple[int, bool]:
    """The newest allocation's restart number (-1 before the first) and whether it has logged
    a training step (not just started its trainers, which may still be importing torch or
    loading the checkpoint)."""
    logs = sorted(run_dir.glob("logs/*/restart-*/node-0/train.log"),
                  key=lambda p: int(p.parent.parent.name.split("-")[1]))
    if not logs:
        return -1, False
    number = int(logs[-1].parent.parent.name.split("-")[1])
    try:
        return number, '"event": "step", "phase": "train"' in logs[-1].read_text(
            errors="replace")
    except OSError:
        return number, False


def after_kill(newest: tuple[int, bool], killed_in: int) -> bool:
    """Whether the newest allocation is one that trains and came after the last kill."""
    number, trains = newest
    return trains and number > killed_in


def training(run_dir: Path) -> bool:
    """Whether the newest allocation has logged a training step."""
    return newest_allocation(run_dir)[1]


def job_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                         text=True, check=False).stdout.strip()
    if out:
        return out.splitlines()[0]
    done = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"],
                          capture_output=True, text=True, check=False).stdout.split()
    return done[-1] if done else "UNKNOWN"


def inject(job: str, run_dir: Path, minutes: float, mean: float, kills: Optional[int],
           rng: random.Random, timeout: float) -> list[dict[str, Any]]:
    """Kills (the first early in training, then exponential gaps of `mean` seconds, `kills` at
    most) and one time-limit warning while the job runs; returns what was injected."""
    injected: list[dict[str, Any]] = []
    clock: Optional[float] = None       # starts with the first training step
    next_kill = limit_at = 0.0
    limit_sent = False
    killed_in = -1                      # the newest allocation a kill struck
    ended = time.time() + timeout
    while time.time() < ended:
        state = job_state(job)
        if state in FINISHED:
            return injected
        now = time.time()
        if clock is None:
            if training(run_dir):
                clock = now
                # The first kill comes early in training, at a drawn time, so that every
                # rehearsal restarts at least once (an exponential first gap of the mean would
                # often fall after a short rehearsal's end); the others at exponential gaps.
                next_kill = now + rng.uniform(0.1, 0.2) * minutes * 60
                limit_at = now + minutes * 60 * 0.3
        elif (not limit_sent and now >= limit_at and now < next_kill - 5
              and after_kill(newest_allocation(run_dir), killed_in)):
            # Only to an allocation that trains after the last kill: until the requeued one
            # logs its first step, the newest log is the killed allocation's.
            subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=False)
            injected.append({"what": "time-limit", "time": now})
            limit_sent = True
        elif now >= next_kill:
            node = rng.randrange(NODES)
            procs = processes(job, node)
            victims = procs["trainer"] or procs["launcher"]
            if victims and state == "RUNNING":
                for pid in victims:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                injected.append({"what": "kill", "time": now, "node": node,
                                 "during": "training" if procs["trainer"] else "start-up"})
                killed_in = max(killed_in, newest_allocation(run_dir)[0])
                done = sum(i["what"] == "kill" for i in injected)
                next_kill = (now + rng.expovariate(1 / mean)
                             if kills is None or done < kills else float("inf"))
        time.sleep(0.3)
    subprocess.run(["scancel", job], check=False)
    raise SystemExit(f"chaos rehearsal: job {job} still running after {timeout:.0f} s; cancelled")
