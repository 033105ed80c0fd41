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
and checkpoint write time, taken among the model's runs with as many failures as this one (the
report's second model line; the expectation at the run's rate is printed too, and sits about a
point and a half above a run with one or two failures: chaos_scatter.py --given), and every
injected failure must be on the timeline, on its node,
where it happened. Exit status 0 when both hold. The figures are printed last (and written as
JSON with --json FILE).

The model gives an expectation; one rehearsal is one draw. benchmarks/chaos_scatter.py draws the
rehearsal's own process many times to show how far a single run may fall from the model by
chance: small when restarts are short next to the time between failures, large when a second
failure often strikes a restart (as with frequent kills on a loaded machine, where a CPU
start-up takes 40 s or more). The defaults keep that chance small; so does --kills 1.

The injection is chaos_inject.py; the comparison with plan's model and the printing,
chaos_compare.py.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaos_compare import figures, show
from chaos_inject import BIN, NODES, inject, job_env, job_state

JOBGEN = [str(BIN / "jobgen")] if (BIN / "jobgen").exists() else [sys.executable, "-m",
                                                                   "jobgen.cli"]


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
    if not (args.minutes > 0 and (args.kill_every is None or args.kill_every > 0)):
        parser.error("--minutes and --kill-every: more than 0")
    if args.kills is not None and args.kills < 1:
        parser.error("--kills: at least 1 (the rehearsal measures a restart)")
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
    run = {"run": name, "job": job, "run_dir": str(run_dir), "minutes": args.minutes,
           "seed": args.seed, "kills": args.kills, "wall_s": round(time.time() - started, 1),
           "step_delay_s": round(step_delay, 3)}
    result = figures(run, json.loads(as_json.stdout), injected, state)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(shown.stdout, end="")
    show(result)
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
