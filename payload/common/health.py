"""The health gate: every node checks itself before the compile pass, so that a bad node is found,
named and left out before it costs a run (jobgen/job/health.py decides what is checked).

    health.py node          this node's checks -> $JOBGEN_LOG_DIR/node-R/health.json; exit 0 or 75
    health.py wait          on shared storage: until every node has reported; the verdict
    health.py verdict [--requeues N]
                            the Slurm controller's verdict over all nodes' reports: prints the
                            hosts to leave out; exit 0 (healthy), 75 (leave them out and requeue),
                            76 (unhealthy, and the requeues for health are used up), 78 (every
                            node failed the same check: a setting, not a node), 1 (a node did not
                            report)
    health.py collective    the main node's bandwidth test across all nodes
    health.py summary       this attempt's failures in one line (SageMaker's failure reason)

The checks, from JOBGEN_HEALTH (JSON): devices (device files, the runtime's tool and what it
lists), EFA interfaces up, shared and node-local storage writable with enough room, the clock
synchronised, and a collective's bandwidth. Each failure is one line naming the node, its host,
the check, what was seen and what was needed; the verdict appends them to the run's
jobgen-health.jsonl. Every command runs with a time limit, so a healthy gate costs seconds.

A CPU rehearsal fakes a bad node with JOBGEN_SMOKE_UNHEALTHY_NODE=<node index>: that node fails
the devices check, and later allocations fail on the same host (as a broken machine would).
JOBGEN_HEALTH_SYSROOT reads /dev and /sys under another root (a container that mounts the
host's, or a test). The checks themselves are in health_checks.py; this file runs them, writes
the node's report and judges all the nodes' reports.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

UNHEALTHY = 75          # EX_TEMPFAIL: this node cannot run the job; another node could
GAVE_UP = 76            # unhealthy, and no requeue for health is left
CONFIG = 78             # every node failed alike: a setting, not a node
RECORD = "jobgen-health.jsonl"

# Run by path: make ``payload/`` importable for the checks (common/health_checks.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.health_checks import (  # noqa: E402
    Report,
    check_clock,
    check_devices,
    check_efa,
    check_storage,
    run,
    say,
    smoke_fault,
)


def settings() -> Dict[str, Any]:
    raw = os.environ.get("JOBGEN_HEALTH", "")
    try:
        found = json.loads(raw)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise SystemExit(f"health: JOBGEN_HEALTH is not the JSON jobgen renders: {raw[:80]!r}")
    return found


# ---- the commands ------------------------------------------------------------------------------
def node_dir(log_dir: Path, rank: int) -> Path:
    return log_dir / f"node-{rank}"


def node() -> int:
    spec = settings()
    env = os.environ
    rank = int(env.get("JOBGEN_NODE_RANK", "0"))
    log_dir = Path(env["JOBGEN_LOG_DIR"])
    timeout = float(spec.get("timeout_s", 30))
    started = time.monotonic()
    report = Report(rank)
    devices = spec.get("devices")
    if devices:
        check_devices(devices, report, timeout)
    if spec.get("efa_interfaces"):
        check_efa(int(spec["efa_interfaces"]), report)
    check_storage("shared storage", env["JOBGEN_RUN_DIR"], float(spec.get("shared_free_gib", 0)),
                  report)
    cache = env.get("JOBGEN_COMPILE_CACHE")
    if cache and os.path.abspath(cache) != os.path.abspath(env["JOBGEN_RUN_DIR"]):
        check_storage("compile cache", cache, 0.0, report)
    local = env.get("JOBGEN_LOCAL_COMPILE_CACHE")
    if local and spec.get("local_free_gib") is not None:
        check_storage("local storage", local, float(spec["local_free_gib"]), report)
    if spec.get("clock_max_offset_ms"):
        check_clock(float(spec["clock_max_offset_ms"]), report, timeout)
    smoke_fault(report, log_dir, int((devices or {}).get("count", 16)))
    seconds = time.monotonic() - started
    result = {"node": rank, "host": report.host, "ok": not report.failures,
              "failures": report.failures, "passed": report.passed, "notes": report.notes,
              "skipped": spec.get("skipped", []), "seconds": round(seconds, 2)}
    if env.get("JOBGEN_ATTEMPT"):   # the attempt a service told the node (EKS: JobSet's label)
        result["attempt"] = env["JOBGEN_ATTEMPT"]
    folder = node_dir(log_dir, rank)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".health.json.{os.getpid()}"
    tmp.write_text(json.dumps(result, sort_keys=True) + "\n")
    os.replace(tmp, folder / "health.json")
    for note in report.notes:
        say(f"health: {note}")
    if not report.failures:
        left_out = f"; not checked on a CPU rehearsal: {', '.join(result['skipped'])}" \
            if result["skipped"] else ""
        say(f"health: node {rank} ({report.host}) passed {len(report.passed)} checks in "
            f"{seconds:.1f} s{left_out}")
        return 0
    return UNHEALTHY


def reports(log_dir: Path, nodes: int) -> List[Optional[Dict[str, Any]]]:
    """Each node's report of this attempt (None: none yet). Where the service names the attempt
    (JOBGEN_ATTEMPT), a report of another one is not this attempt's."""
    attempt = os.environ.get("JOBGEN_ATTEMPT")
    out: List[Optional[Dict[str, Any]]] = []
    for rank in range(nodes):
        try:
            found = json.loads((node_dir(log_dir, rank) / "health.json").read_text())
        except (OSError, ValueError):
            found = None
        if attempt and isinstance(found, dict) and found.get("attempt") != attempt:
            found = None
        out.append(found)
    return out


def record(failed: List[Dict[str, Any]], action: str) -> None:
    """One line per failed node in the run's jobgen-health.jsonl (the run record's health log)."""
    env = os.environ
    job = env.get("SLURM_JOB_ID") or env.get("AWS_BATCH_JOB_ID") or env.get(
        "TRAINING_JOB_NAME") or env.get("JOBGEN_K8S_JOB") or Path(env["JOBGEN_LOG_DIR"]).name
    lines = []
    for item in failed:
        for failure in item["failures"]:
            lines.append(json.dumps({
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "job": job,
                "allocation": env.get("SLURM_RESTART_COUNT", "0"), "node": item["node"],
                "host": item["host"], **failure, "action": action}, sort_keys=True))
    try:
        with open(Path(env["JOBGEN_RUN_DIR"]) / RECORD, "a") as out:
            out.write("".join(line + "\n" for line in lines))
    except OSError as exc:
        say(f"health: cannot add to {RECORD} in the run folder ({exc.strerror})")


def judge(found: List[Optional[Dict[str, Any]]], requeues: Optional[int],
          max_requeues: int) -> int:
    missing = [rank for rank, item in enumerate(found) if item is None]
    if missing:
        say(f"health: node(s) {', '.join(map(str, missing))} did not report; the job stops here")
        return 1
    failed = [item for item in found if item and not item["ok"]]
    if not failed:
        return 0
    summary = "; ".join(f"node {f['node']} ({f['host']}) failed "
                        + ", ".join(f"{x['check']}: {x['seen']}" for x in f["failures"])
                        for f in failed)
    checks = {tuple(sorted(x["check"] for x in f["failures"])) for f in failed}
    if len(found) > 1 and len(failed) == len(found) and len(checks) == 1:
        if os.environ.get("JOBGEN_IS_MAIN", "1") != "1":
            return CONFIG
        record(failed, "stopped: every node failed alike")
        alike = next(iter(checks))
        # No node has the accelerators: machines of another kind (turning the gate off would
        # only move the failure into the compile pass).
        advice = ("these machines have none of the job's accelerators: run it on the "
                  "platform's instances (`jobgen run --smoke` rehearses it on CPU)"
                  if "devices" in alike else "fix the site's health section (jobgen show lists "
                  "it) or set job.health_gate: false")
        say(f"health: every node failed {', '.join(alike)} - a setting, not a node: {advice}")
        return CONFIG
    hosts = ",".join(sorted({f["host"] for f in failed}))
    spares = int(os.environ.get("JOBGEN_SPARE_NODES") or 0)
    if requeues is not None and 0 < len(failed) <= spares:
        # Spare nodes (job.spare_nodes) cover the bad ones: the healthy nodes run the job and the
        # controller leaves these out of its step (printed), with no requeue.
        record(failed, f"left out {hosts}; the healthy nodes train, spares among them")
        say(f"health: {summary}; left out, the spare nodes cover it")
        print(hosts)
        return 0
    if os.environ.get("JOBGEN_IS_MAIN", "1") != "1":
        # The main node records and explains; the others only say why they stop.
        if requeues is None:
            say(f"health: stopping before the compile pass: {summary}")
        return UNHEALTHY
    if requeues is None:
        record(failed, "stopped")
        say(f"health: {summary}; the job stops before the compile pass")
        return UNHEALTHY
    if requeues >= max_requeues:
        record(failed, f"stopped: {max_requeues} requeues for health used")
        say(f"health: {summary}; the job has been requeued for health {requeues} times "
            f"(health.max_requeues {max_requeues}): giving up")
        return GAVE_UP
    record(failed, f"left out {hosts}; requeued")
    say(f"health: {summary}")
    print(hosts)
    return UNHEALTHY


def wait(requeues: Optional[int] = None, limit: Optional[float] = None) -> int:
    """Until every node has reported (or `limit` s: a node that never reports), then judge."""
    spec = settings()
    env = os.environ
    log_dir = Path(env["JOBGEN_LOG_DIR"])
    nodes = int(env.get("JOBGEN_NNODES", "1"))
    deadline = time.monotonic() + (limit if limit is not None else float(
        env.get("JOBGEN_RDZV_TIMEOUT") or 900))
    while True:
        found = reports(log_dir, nodes)
        if all(item is not None for item in found) or time.monotonic() > deadline:
            break
        # A failed node is enough to stop: the others need not wait for the stragglers.
        if any(item is not None and not item["ok"] for item in found) and requeues is None:
            found = [item or {"node": r, "host": "?", "ok": True, "failures": []}
                     for r, item in enumerate(found)]
            break
        time.sleep(0.5)
    return judge(found, requeues, int(spec.get("max_requeues", 3)))


def collective() -> int:
    spec = settings().get("collective")
    if not spec:
        return 0
    env = os.environ
    nodes = int(env.get("JOBGEN_NNODES", "1"))
    workers = int(env.get("JOBGEN_WORKERS_PER_NODE", "1"))
    hosts = ",".join(item["host"] for item in reports(Path(env["JOBGEN_LOG_DIR"]), nodes) if item)
    argv = [a.format(nodes=nodes, workers=workers, world=nodes * workers, hosts=hosts)
            for a in spec["command"]]
    status, out, why = run(argv, float(settings().get("timeout_s", 30)) * 4)
    floor = float(spec["floor_gbps"])
    found = re.findall(spec["pattern"], out, re.M)
    if status != 0 or not found:
        say(f"health: the collective test failed: {why or f'exit {status}'}"
            + ("" if found else ", no bandwidth in its output"))
        return 1
    gbps = min(float(x if isinstance(x, str) else x[0]) for x in found)
    if gbps < floor:
        say(f"health: the collective test across {nodes} nodes reached {gbps:g} GB/s; needs "
            f"{floor:g} GB/s (a slow link: no single node to leave out)")
        return 1
    say(f"health: the collective test across {nodes} nodes reached {gbps:g} GB/s")
    return 0


def summary() -> int:
    """This attempt's failed checks in one line (a service's failure reason)."""
    env = os.environ
    found = reports(Path(env["JOBGEN_LOG_DIR"]), int(env.get("JOBGEN_NNODES", "1")))
    failed = [f"node {item['node']} ({item['host']}) failed "
              + ", ".join(f"{x['check']}: {x['seen']}; needs {x['needs']}"
                          for x in item["failures"])
              for item in found if item and not item["ok"]]
    print("jobgen health gate: " + ("; ".join(failed) or "no failed check recorded"))
    return 0


def main(argv: List[str]) -> int:
    if not argv:
        say("usage: health.py node | wait | verdict [--requeues N] | collective")
        return 2
    command = argv[0]
    if command == "node":
        return node()
    if command == "wait":
        return wait()
    if command == "verdict":
        requeues = int(argv[2]) if len(argv) > 2 and argv[1] == "--requeues" else 0
        # The controller asks once the gate step has ended: every node has reported by then
        # (a few seconds more for a shared file system that shows new files late).
        return wait(requeues, limit=min(5.0, float(settings().get("timeout_s", 5))))
    if command == "collective":
        return collective()
    if command == "summary":
        return summary()
    say(f"health.py: unknown command {command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
