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
worker) is SIGKILLed when a step in 11-14 is logged (a node lost); node 1 hangs before a step
in 17-20 (the smoke trainer's JOBGEN_SMOKE_HANG_AT_STEP), which `jobgen watch --on-hang
requeue` catches. Each save's write takes --save-delay s more (a slow disk), so that a
synchronous save takes over a second. Per arm it prints the effective utilisation and, by
cause, the restart cost (failure to the first counted step after it), the steps trained again
and the save stall, each arm's ratio to A and the spread across repetitions, then issue 40's
goals with pass or fail. No assertions: exit 0 unless a run could not be measured.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

BIN = Path(sys.executable).parent
JOBGEN = [str(BIN / "jobgen")] if (BIN / "jobgen").exists() else [sys.executable, "-m",
                                                                   "jobgen.cli"]
RECIPE = "llama2-7b"
NODES = 2
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
CAUSES = ("process", "node", "hang")
# arm: (restarts in place, spare nodes, synchronous saves, requeue delay cut)
ARMS: dict[str, tuple[int, int, bool, bool]] = {
    "A": (0, 0, True, False), "A-cut": (0, 0, True, True), "B": (3, 0, True, False),
    "C": (3, 1, True, False), "D": (3, 1, False, False)}


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


def run_arm(arm: str, seed: int, workdir: Path, a: argparse.Namespace,
            use_spare: bool) -> dict[str, Any]:
    """One run of one arm: submit, inject the schedule, watch, then `jobgen report --json`."""
    in_place, spares, sync, cut = ARMS[arm]
    steps = schedule(seed)
    name = f"bench-{arm.lower()}-{seed}-{int(time.time())}"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "JOBGEN_SMOKE_"))}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
               JOBGEN_STATE_DIR=str(workdir / "state"),
               JOBGEN_SMOKE_STEP_DELAY=str(a.step_delay), JOBGEN_SMOKE_SAVE_DELAY=str(a.save_delay),
               JOBGEN_SMOKE_HANG_AT_STEP=str(steps["hang"]), JOBGEN_SMOKE_HANG_NODE="1")
    sets = [f"job.master_port={free_port()}", "job.max_restarts=10",
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
    # A hang: no step for 8 x the median step, and at least a few steps and saves' time (the
    # first steps have no median yet).
    # A restart in place (torchrun starting new workers, which import torch and load the
    # checkpoint) logs no step for a while too: 20 s at least, on a loaded 2-core machine.
    hang_min = max(a.hang_min, 4 * a.step_delay + 2 * a.save_delay)
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


def measure(arm: str, report: dict[str, Any], failures: list[dict[str, Any]], state: str,
            run_dir: Path) -> dict[str, Any]:
    """One run's figures from its report: utilisation, and per failure its restart cost (its
    time to the start of the first counted step after it) and the steps trained again (repeat
    segments since the failure before it)."""
    segs = report["timeline"]["segments"]
    allocs = report["timeline"]["allocations"]
    by_cause: dict[str, dict[str, Optional[float]]] = {}
    before = 0.0
    for f in sorted(failures, key=lambda f: f["time"]):
        t = f["time"]
        after = [s["start"] for s in segs if s["kind"] == "train" and s["start"] >= t - 0.5]
        again = {s["step"] for s in segs if s["kind"] == "repeat" and s["step"] is not None
                 and before <= s["start"] < t}
        by_cause[f["cause"]] = {"restart_s": (min(after) - t) if after else None,
                                "again": float(len(again))}
        before = t
    saves = [(s[1], s[2]) for al in allocs for s in al["saves"] if s[1] is not None]
    return {
        "arm": arm, "state": state, "run_dir": str(run_dir),
        "utilisation": report["account"]["utilisation"], "causes": by_cause,
        "stall_s": sum(s for s, _ in saves), "save_stall_s": [s for s, _ in saves],
        "save_write_s": [w for _, w in saves if w is not None],
        "requeues": len(allocs) - 1 - sum(al["ending"] == "unhealthy" for al in allocs[:-1]),
        "in_place": sum(al.get("restarts_in_place", 0) for al in allocs),
        "allocations": len(allocs), "failures": failures,
    }


def _mean(values: list[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: mean utilisation and its range over repetitions; per cause the mean restart cost
    and steps trained again; the mean stall per run and the median stall and write per save."""
    out: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        util = [r["utilisation"] for r in mine]
        causes = {c: {k: _mean([v for r in mine if c in r["causes"]
                                if (v := r["causes"][c][k]) is not None])
                      for k in ("restart_s", "again")} for c in CAUSES}
        stalls = [s for r in mine for s in r["save_stall_s"]]
        writes = [w for r in mine for w in r["save_write_s"]]
        out[arm] = {"runs": len(mine), "utilisation": statistics.fmean(util),
                    "low": min(util), "high": max(util), "causes": causes,
                    "stall_s": statistics.fmean(r["stall_s"] for r in mine),
                    "save_stall_s": statistics.median(stalls) if stalls else None,
                    "save_write_s": statistics.median(writes) if writes else None,
                    "requeues": statistics.fmean(r["requeues"] for r in mine),
                    "in_place": statistics.fmean(r["in_place"] for r in mine),
                    "completed": sum(r["state"] == "COMPLETED" for r in mine)}
    return out


def _f(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ratio(value: Optional[float], base: Optional[float]) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def table(arms: dict[str, dict[str, Any]]) -> list[str]:
    """Two tables: utilisation and saves per arm; restart cost and steps again by cause."""
    base = arms.get("A", {})
    lines = ["arm    runs  utilisation %  (low-high)      x A   stall s/run  x A   "
             "per save: stall s  write s  requeues  in place"]
    for arm, s in arms.items():
        lines.append(
            f"{arm:6s} {s['runs']:4d}  {100 * s['utilisation']:13.2f}  "
            f"({100 * s['low']:5.2f}-{100 * s['high']:5.2f})  "
            f"{_ratio(s['utilisation'], base.get('utilisation')):>5s}  {s['stall_s']:11.2f}  "
            f"{_ratio(s['stall_s'], base.get('stall_s')):>4s}  "
            f"{_f(s['save_stall_s'], '{:.3f}'):>17s}  {_f(s['save_write_s'], '{:.3f}'):>7s}  "
            f"{s['requeues']:8.1f}  {s['in_place']:8.1f}")
    lines.append("")
    lines.append("arm    restart s by cause (failure to the next counted step)      "
                 "steps trained again")
    lines.append("       " + "".join(f"{k:>9s}  {'x A':>5s}   " for k in CAUSES)
                 + "process  node  hang")
    for arm, s in arms.items():
        c, bc = s["causes"], base.get("causes", {})
        cells = "".join(f"{_f(c[k]['restart_s']):>9s}  "
                        f"{_ratio(c[k]['restart_s'], bc.get(k, {}).get('restart_s')):>5s}   "
                        for k in CAUSES)
        lines.append(f"{arm:6s} {cells}{_f(c['process']['again']):>7s}  "
                     f"{_f(c['node']['again']):>4s}  {_f(c['hang']['again']):>4s}")
    return lines


def goals(arms: dict[str, dict[str, Any]]) -> list[tuple[str, Optional[bool], str]]:
    out: list[tuple[str, Optional[bool], str]] = []
    b = arms.get("B", {}).get("causes", {}).get("process", {}).get("restart_s")
    a = arms.get("A-cut", {}).get("causes", {}).get("process", {}).get("restart_s")
    out.append(("B's restart cost after a process failure <= 1/3 of A-cut's",
                None if a is None or b is None else b <= a / 3,
                f"B {_f(b)} s, A-cut {_f(a)} s, ratio {_ratio(b, a)}"))
    sync_arm = "C" if "C" in arms else "B"
    sync = arms.get(sync_arm, {}).get("save_stall_s")
    d = arms.get("D", {}).get("save_stall_s")
    out.append((f"D's save stall <= 1/5 of the synchronous one ({sync_arm}), at a sync save "
                ">= 1 s", None if sync is None or d is None or sync < 1 else d <= sync / 5,
                f"D {_f(d, '{:.3f}')} s, {sync_arm} {_f(sync, '{:.3f}')} s per save, ratio "
                f"{_ratio(d, sync)}"))
    chain = [x for x in ("A", "B", "C", "D") if x in arms]
    for lo, hi in zip(chain, chain[1:]):
        ok = arms[hi]["low"] > arms[lo]["high"]
        out.append((f"utilisation {lo} -> {hi} rises beyond the spread", ok,
                    f"{lo} {100 * arms[lo]['low']:.2f}-{100 * arms[lo]['high']:.2f} %, "
                    f"{hi} {100 * arms[hi]['low']:.2f}-{100 * arms[hi]['high']:.2f} %"))
    return out


def show(arms: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    loads = [r["load"] for r in runs if "load" in r]
    if loads:
        print(f"load average (1 min) at each run's start: {min(loads):.1f}-{max(loads):.1f} on "
              f"{os.cpu_count()} cores")
    print("\n".join(table(arms)))
    print("goals (issue 40 item 4):")
    for what, ok, detail in goals(arms):
        print(f"  {'PASS' if ok else 'not measured' if ok is None else 'FAIL'}: {what} ({detail})")


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
        runs = json.loads(a.from_json.read_text())["runs"]
        show(summarise(runs), runs)
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
            run.update(rep=rep + 1, wall_s=round(time.time() - t0, 1), load=load)
            runs.append(run)
            print(f"rep {rep + 1} {arm:5s} {run['state']:9s} util {100 * run['utilisation']:.2f} %"
                  f"  requeues {run['requeues']}  in place {run['in_place']}  "
                  + "  ".join(f"{c} {_f(v['restart_s'])} s/{_f(v['again'], '{:.0f}')} again"
                              for c, v in run["causes"].items())
                  + f"  wall {run['wall_s']} s  load {load:.1f}", flush=True)
    arms = summarise(runs)
    if a.json:
        a.json.write_text(json.dumps({"runs": runs, "arms": arms}, indent=2) + "\n")
    print(f"\nrecovery arms: seed {a.seed} (schedule {schedule(a.seed)}), {a.reps} repetition(s), "
          f"step {a.step_delay} s, save +{a.save_delay} s, {time.time() - started:.0f} s in all, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    show(arms, runs)
    return 0 if all(r["state"] == "COMPLETED" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
