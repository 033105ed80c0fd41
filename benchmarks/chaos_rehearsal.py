#!/usr/bin/env python3
"""Chaos rehearsal: a CPU smoke run on the local Slurm cluster with failures injected at a known
rate, then `jobgen report` on it, holding `jobgen plan`'s failure model to the measurement.

    bash tests/ci/slurm-up.sh            # the local 4-node cluster (root)
    python benchmarks/chaos_rehearsal.py [--minutes 10] [--seed 1] [--workdir DIR]

What is injected, each where a real cluster would see it:
- an unhealthy node at start: node 1 of the first allocation fails the health gate
  (JOBGEN_SMOKE_UNHEALTHY_NODE=1); the job requeues itself without that host;
- killed nodes: the first at a drawn time early in training (10-20 % of --minutes after the
  first training step, so that every rehearsal restarts at least once), then at random
  (exponential gaps, mean --kill-every s, by default --minutes x 60 and at least 120, seeded),
  --kills at most; at each, one node's training processes (the trainer, or its torchrun
  launcher while it starts) are SIGKILLed; a failure that falls while the job waits for its
  next allocation strikes when that allocation starts (as plan's model has it: a failure
  during a restart starts the restart over);
- a time limit: once, about half-way, the batch script gets Slurm's time-limit warning (USR1, as
  `#SBATCH --signal=B:USR1@N` delivers it): the trainers save and stop and the job requeues.

The smoke run keeps its 24 steps and saves after every one (a failure loses at most a step); the
step time is scaled so that training takes about 40 % of --minutes. Then: the measured effective
utilisation must be within 3 points of plan's model for the run's own failure rate, restart cost
and checkpoint write time, and every injected failure must be on the timeline, on its node,
where it happened. Exit status 0 when both hold. The figures are printed last (and written as
JSON with --json FILE).

The model gives an expectation; one rehearsal is one draw. benchmarks/chaos_scatter.py draws the
rehearsal's own process many times to show how far a single run may fall from the model by
chance: small when restarts are short next to the time between failures, large when a second
failure often strikes a restart (as with frequent kills on a loaded machine, where a CPU
start-up takes 40 s or more). The defaults keep that chance small; so does --kills 1.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

BIN = Path(sys.executable).parent
JOBGEN = [str(BIN / "jobgen")] if (BIN / "jobgen").exists() else [sys.executable, "-m",
                                                                   "jobgen.cli"]
TOLERANCE = 0.03            # points of effective utilisation, as a fraction
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


def check(report: dict[str, Any], injected: list[dict[str, Any]]) -> list[str]:
    """What does not hold, as sentences (empty: the rehearsal holds)."""
    problems = []
    acc, allocs = report["account"], report["timeline"]["allocations"]
    measured, predicted = acc["utilisation"], acc["predicted"]
    if predicted is None or abs(measured - predicted) > TOLERANCE:
        problems.append(f"measured {measured:.4f} vs plan's {predicted}: more than 3 points")
    if acc["closure"] > 0.01:
        problems.append(f"the parts miss the allocated total by {100 * acc['closure']:.2f} %")
    step_s = acc["cluster"]["step_s"] or 0.0
    failed = [a for a in allocs if a["ending"] == "failed"]
    for item in injected:
        if item["what"] == "kill":
            near = [a for a in failed if a["failure_at"] is not None
                    and item["time"] - 2 <= a["failure_at"] <= item["time"] + step_s + 15]
            if not any(a["failed_node"] == item["node"] for a in near):
                problems.append(f"the kill of node {item['node']} at {item['time']:.1f} is not on "
                                "the timeline")
        elif item["what"] == "time-limit":
            if not any(a["ending"] == "stopped" and a["start"] <= item["time"] <= a["end"]
                       for a in allocs):
                problems.append(f"the time-limit warning at {item['time']:.1f} is not on the "
                                "timeline")
    if not allocs or allocs[0]["ending"] != "unhealthy" or not allocs[0]["excluded"]:
        problems.append("the unhealthy node at start is not on the timeline")
    return problems


def detection(report: dict[str, Any], injected: list[dict[str, Any]]) -> Optional[float]:
    """Mean seconds from a kill (this script's clock) to the failure the timeline records (the
    killed node's flow ending): a cost the run's own records cannot show, measured from outside."""
    found = []
    for item in injected:
        if item["what"] != "kill":
            continue
        near = [a["failure_at"] for a in report["timeline"]["allocations"]
                if a["ending"] == "failed" and a["failure_at"] is not None
                and 0 <= a["failure_at"] - item["time"] <= 60]
        if near:
            found.append(min(near) - item["time"])
    return round(sum(found) / len(found), 2) if found else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="about how long (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-every", type=float, help="mean seconds between node kills "
                        "(default: --minutes x 60, at least 120)")
    parser.add_argument("--kills", type=int, help="kill nodes this many times at most "
                        "(default: no limit)")
    parser.add_argument("--workdir", type=Path, help="where the run goes (default: a new "
                                                     "temporary folder, kept)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--html", type=Path, help="also write the report's page here")
    parser.add_argument("--plot", type=Path, help="also write the report's PNG here")
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="jobgen-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    step_delay = args.minutes * 60 * 0.4 / 24
    rng = random.Random(args.seed)
    name = f"chaos-{int(time.time())}"
    env = job_env(workdir, step_delay)
    with socket.socket() as sock:   # a port nobody holds now (tests run beside it)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.time()
    submitted = subprocess.run(
        [*JOBGEN, "submit", "pythia6.9b", "--nodes", str(NODES), "--smoke", "--run-name", name,
         "--set", "job.max_restarts=40", "--set", f"job.master_port={port}",
         "--set", "checkpoint.every_steps=1"],
        cwd=workdir, env=env, capture_output=True, text=True, check=False)
    if submitted.returncode != 0:
        print(submitted.stderr, file=sys.stderr)
        return 2
    job = submitted.stdout.split()[0]
    run_dir = workdir / "jobgen-runs" / name
    if not (args.minutes > 0 and (args.kill_every is None or args.kill_every > 0)):
        parser.error("--minutes and --kill-every: more than 0")
    if args.kills is not None and args.kills < 1:
        parser.error("--kills: at least 1 (the rehearsal measures a restart)")
    injected = inject(job, run_dir, args.minutes, args.kill_every or max(args.minutes * 60, 120),
                      args.kills, rng, timeout=args.minutes * 60 * 4 + 300)
    state = job_state(job)
    extra = [f"--html={args.html}"] if args.html else []
    extra += [f"--plot={args.plot}"] if args.plot else []
    shown = subprocess.run([*JOBGEN, "report", name, *extra], cwd=workdir, env=env,
                           capture_output=True, text=True, check=False)
    as_json = subprocess.run([*JOBGEN, "report", name, "--json"], cwd=workdir, env=env,
                             capture_output=True, text=True, check=False)
    if as_json.returncode != 0:
        print(shown.stdout, shown.stderr, as_json.stderr, file=sys.stderr)
        return 1
    report = json.loads(as_json.stdout)
    problems = check(report, injected) + ([] if state == "COMPLETED" else [f"job {state}"])
    acc = report["account"]
    figures = {
        "run": name, "job": job, "run_dir": str(run_dir), "minutes": args.minutes,
        "seed": args.seed, "kills": args.kills, "wall_s": round(time.time() - started, 1),
        "step_delay_s": round(step_delay, 3), "injected": injected,
        "failures_per_node_hour": acc["cluster"]["failures_per_node_hour"],
        "restart_s": acc["cluster"]["restart_s"],
        "checkpoint_write_s": acc["cluster"]["checkpoint_write_s"],
        "seal_lag_s": acc["cluster"].get("seal_lag_s"),
        "kill_to_failure_s": detection(report, injected),
        "measured_utilisation": acc["utilisation"], "plan_predicts": acc["predicted"],
        "difference_points": None if acc["predicted"] is None
        else round(100 * (acc["utilisation"] - acc["predicted"]), 2),
        "problems": problems,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(shown.stdout, end="")
    print("\nchaos rehearsal figures")
    for key in ("wall_s", "step_delay_s", "failures_per_node_hour", "restart_s",
                "checkpoint_write_s", "seal_lag_s", "kill_to_failure_s", "measured_utilisation",
                "plan_predicts", "difference_points"):
        print(f"  {key}: {figures[key]}")
    for item in injected:
        when = time.strftime("%H:%M:%S", time.gmtime(item["time"]))
        print(f"  injected: {item['what']} at {when} UTC"
              f"{'' if 'node' not in item else ' on node ' + str(item['node'])}")
    print("  holds" if not problems else "  DOES NOT HOLD: " + "; ".join(problems))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
