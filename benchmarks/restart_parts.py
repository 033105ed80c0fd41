#!/usr/bin/env python3
"""Where a restart in place goes: arm B of recovery_arms.py (job.restarts_in_place=3) with the
process failure alone (node 1's worker SIGKILLed at step 6), torchrun logging at INFO, and each
part read from torchrun's log and the trainer's events (docs/recovery.md, "Recovery arms").

    bash tests/ci/slurm-up.sh                         # the local cluster (root)
    python benchmarks/restart_parts.py                # 3 runs, about 3 minutes
    PET_MONITOR_INTERVAL=5 python benchmarks/restart_parts.py   # torchrun polling as torch < 2.4
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recovery_arms  # noqa: E402

PARTS = ("worker killed -> its agent sees it", "-> the peer's agent acts", "peer's worker ends",
         "c10d rendezvous, next round", "new workers up to the start event", "checkpoint load",
         "restart cost (report)")


def _glog(line: str, year: int) -> float:
    m = re.match(r"[IWE](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)", line)
    if not m:
        return float("nan")
    when = datetime.datetime.strptime(f"{year}-{m[1]}-{m[2]} {m[3]}", "%Y-%m-%d %H:%M:%S.%f")
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def parts(result: dict[str, Any]) -> list[float]:
    """The parts of one run's restart (torchrun's log times are UTC, as on the cluster here)."""
    t0 = result["failures"][0]["time"]
    year = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).year
    logs = sorted(Path(result["run_dir"], "logs").glob("*/restart-0"))[0]
    n0, n1 = ((logs / f"node-{n}" / "train.log").read_text().splitlines() for n in (0, 1))

    def first(lines: list[str], after: float, *marks: str) -> float:
        return next(_glog(x, year) for x in lines
                    if any(m in x for m in marks) and _glog(x, year) >= after)
    seen = first(n1, t0 - 1, "failed (exitcode")
    peer = first(n0, t0 - 1, "closing signal SIGTERM", "failed (exitcode", "Stopping worker group")
    stopped = first(n0, peer, "Rendezvous'ing worker group")
    rdzv = max(first(n, seen, "Rendezvous complete") for n in (n0, n1))
    events = [json.loads(x) for x in n0 if x.startswith("{")]
    at = {e["event"]: datetime.datetime.fromisoformat(e["time"]).timestamp() for e in events
          if e["event"] in ("start", "resume")
          and datetime.datetime.fromisoformat(e["time"]).timestamp() > t0}
    restart = result["causes"]["process"]["restart_s"]
    return [seen - t0, peer - seen, stopped - peer, rdzv - stopped, at["start"] - rdzv,
            at["resume"] - at["start"], restart]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path("restart-parts"))
    p.add_argument("--partition", default="")
    a = p.parse_args()
    os.environ.setdefault("LOGLEVEL", "INFO")   # torchrun's rendezvous and worker-group lines
    steps = {"process": 6, "node": 10**6, "hang": 10**6}     # the process failure alone
    opts = argparse.Namespace(step_delay=1.0, save_delay=1.5, hang_min=20.0, a_delay=0.0,
                              cred_expire=10.0, timeout=400.0, partition=a.partition,
                              collective_timeout=10.0,
                              spare_partition="")
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for rep in range(a.reps):
        result = recovery_arms.run_arm("B", 1, a.workdir.resolve(), opts, False, steps)
        rows.append(parts(result))
        print(f"run {rep + 1}: restart {rows[-1][-1]:.2f} s", flush=True)
    for i, name in enumerate(PARTS):
        values = [r[i] for r in rows]
        print(f"{name:40s} {statistics.median(values):6.2f} s  "
              f"({min(values):.2f}-{max(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
