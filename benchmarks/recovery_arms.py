#!/usr/bin/env python3
"""Recovery arms side by side (issue 40 item 4): one seeded failure schedule on the local Slurm
cluster, run against each way jobgen can recover, alternating the arms' order, and read back
from `jobgen report --json`.

    bash tests/ci/slurm-up.sh                       # the local cluster (root)
    python benchmarks/recovery_arms.py              # 3 repetitions, about 25 min on 2 cores
    python benchmarks/recovery_arms.py --reps 5 --step-delay 2 --save-delay 3   # longer

The arms (a 2-node `jobgen submit llama2-7b --smoke`, 24 steps, a save every 4):
- A      requeue only (today's path), synchronous saves; a requeued job waits the cluster's
         cred_expire (10 s on the local cluster; --a-delay 120 holds it as Slurm's default does)
- A-cut  A with the requeue delay cut: once the requeued job is pending, its StartTime is set to
         2 s on (`scontrol update`, for this job only; the cluster is not reconfigured)
- B      job.restarts_in_place=3: torchrun restarts the workers inside the allocation, requeue
         as the fallback; synchronous saves
- C      B plus job.spare_nodes=1 (run only where jobgen renders the key)
- D      C (B where C cannot run) with background saves (checkpoint.async_save)

The node loss kills node 1's processes; in the arms with a spare it sets node 1's host DOWN
instead (and back in service once training goes on): a spare takes the place of a node Slurm
removes from the job, while a killed task makes srun end the whole step (a requeue, as in B).

The schedule, drawn from --seed, the same for every arm: node 1's worker is SIGKILLed when a
step in 5-8 is logged (a process failure); every process of node 1 (its flow, torchrun, the
worker) is SIGKILLed when a step in 11-14 is logged (a node lost); node 1 hangs before a step in
17-20 (the smoke trainer's JOBGEN_SMOKE_HANG_AT_STEP): node 0's next collective fails after
--collective-timeout s (job.collective_timeout_s, torch's process-group timeout), and the arm
recovers as from any failed worker (A requeues, B/C/D restart in place); `jobgen watch --on-hang
requeue` runs as the fallback, with a threshold beyond that. Each save's write takes
--save-delay s more (a slow disk), so that a synchronous save takes over a second. Per arm it
prints the effective utilisation and, by cause, the restart cost (failure to the first counted
step after it), the steps trained again and the save stall, each arm's ratio to A and the spread
across repetitions, then issue 40's goals with pass or fail. No assertions: exit 0 unless a run
could not be measured.

Running an arm on Slurm is arms_slurm.py; the figures, tables and goals, read from the reports'
JSON, are arms_figures.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from arms_figures import ARMS, CAUSES, _f, measure, show, summarise
from arms_slurm import partitions, run_arm, schedule, spares_supported

# What other scripts and tests use of this one (benchmarks/restart_parts.py, the short test).
__all__ = ["ARMS", "CAUSES", "_f", "measure", "partitions", "run_arm", "schedule",
           "spares_supported", "summarise", "show"]


def as_json(runs: list[dict[str, Any]], arms: dict[str, Any]) -> str:
    """Every run's figures and the arms' summary, as --json writes them: each run folder by its
    name only (the file is kept beside the docs; no machine's path goes in it)."""
    kept = [dict(r, run_dir=Path(r["run_dir"]).name) for r in runs]
    return json.dumps({"runs": kept, "arms": arms}, indent=2) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--arms", default="A,A-cut,B,C,D", help="which arms (default: all)")
    p.add_argument("--step-delay", type=float, default=1.0, help="seconds per step (default 1)")
    p.add_argument("--save-delay", type=float, default=1.5,
                   help="seconds added to each save's write (default 1.5: a sync save > 1 s)")
    p.add_argument("--a-delay", type=float, default=0.0, help="hold arm A's requeued job this "
                   "long in all (Slurm's default cred_expire: 120; default: the cluster's own)")
    p.add_argument("--hang-min", type=float, default=20.0, help="jobgen watch --hang-min: "
                   "longer than a restart in place takes (default 20)")
    p.add_argument("--collective-timeout", type=float, default=10.0, help="job."
                   "collective_timeout_s of every arm: node 0's collective fails this long after "
                   "node 1 hangs (default 10)")
    p.add_argument("--cred-expire", type=float, default=10.0, help="the cluster's cred_expire")
    p.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    p.add_argument("--partition", help="Slurm partition of the arms without a spare (default: "
                   "side, the local cluster's 2-node partition, if there is one)")
    p.add_argument("--spare-partition", default="", help="Slurm partition of the arms with a "
                   "spare node (default: the cluster's default)")
    p.add_argument("--no-spare", action="store_true", help="run D without a spare (and not C)")
    p.add_argument("--workdir", type=Path)
    p.add_argument("--json", type=Path, help="also write every run's figures here")
    p.add_argument("--from-json", type=Path, help="print the tables of an earlier --json file")
    a = p.parse_args()
    if a.from_json:
        earlier = json.loads(a.from_json.read_text())["runs"]
        show(summarise(earlier), earlier)
        return 0
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="jobgen-arms-"))
    workdir.mkdir(parents=True, exist_ok=True)
    use_spare = spares_supported(workdir) and not a.no_spare
    chosen = [x for x in a.arms.split(",") if x in ARMS and (x != "C" or use_spare)]
    if a.partition is None:
        a.partition = "side" if "side" in partitions() else ""
    if "C" in a.arms.split(",") and not use_spare:
        print("arm C not run: no spare nodes (--no-spare, or this jobgen does not render "
              "job.spare_nodes); D runs without a spare")
    started = time.time()
    runs: list[dict[str, Any]] = []
    for rep in range(a.reps):
        order = chosen if rep % 2 == 0 else chosen[::-1]
        for arm in order:
            t0 = time.time()
            load = os.getloadavg()[0]
            run = run_arm(arm, a.seed, workdir, a, use_spare)
            run.update(rep=rep + 1, wall_s=round(time.time() - t0, 1), load=load,
                       cores=os.cpu_count())
            runs.append(run)
            print(f"rep {rep + 1} {arm:5s} {run['state']:9s} util {100 * run['utilisation']:.2f} %"
                  f"  requeues {run['requeues']}  in place {run['in_place']}  "
                  + "  ".join(f"{c} {_f(v['restart_s'])} s/{_f(v['again'], '{:.0f}')} again"
                              for c, v in run["causes"].items())
                  + f"  wall {run['wall_s']} s  load {load:.1f}", flush=True)
    arms = summarise(runs)
    if a.json:
        a.json.write_text(as_json(runs, arms))
    print(f"\nrecovery arms: seed {a.seed} (schedule {schedule(a.seed)}), {a.reps} repetition(s), "
          f"step {a.step_delay} s, save +{a.save_delay} s, {time.time() - started:.0f} s in all, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    show(arms, runs)
    return 0 if all(r["state"] == "COMPLETED" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
