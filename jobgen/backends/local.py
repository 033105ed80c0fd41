"""The local backend (`jobgen run`): every node of the job as a process group on this machine,
no scheduler. It runs in the foreground, so there is no job to ask about afterwards: its logs
are in the run folder (RUN_DIR/logs/local-<time>/)."""
from __future__ import annotations

import json
from typing import Any, NoReturn, Optional

from ..errors import ConfigError
from ..plan import Plan, PlannedFile
from ..spec import JobSpec
from . import Echo, JobRef, SubmitOptions, Submitted

# What happens when the health gate finds a bad node (`jobgen show` says it).
HEALTH_ON_FAILURE = (
    "the rehearsal stops, naming the node and the check")

# The run folder is on storage this machine reaches: the run's record is kept there too.
RUN_DIR_HERE = True

JOB_ID = "local-{time}"   # what the plan shows for the id `jobgen run` makes when it starts


def plan(spec: JobSpec) -> Plan:
    """Each emulated node's command and the environment it adds."""
    from .. import local_runner
    nodes = [{"argv": argv, "env": env} for argv, env in local_runner.node_commands(spec, JOB_ID)]
    name = f"{spec.run_name}.local.json"
    return Plan(backend="local", files=(PlannedFile(name, json.dumps(
        {"nodes": nodes}, indent=2) + "\n"),), primary=name, submit_argv=("jobgen", "run"))


def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """The payload snapshot, as for an sbatch script (the nodes read the same folders)."""
    from . import slurm
    slurm.prepare(spec, strict, say)


def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    return plan(spec).text


def _foreground(what: str) -> NoReturn:
    raise ConfigError(f"{what}: the local backend runs in the foreground (`jobgen run`); its "
                      "nodes' logs are in RUN_DIR/logs/local-<time>/")


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    _foreground("submit")


def wait(ref: JobRef, echo: Echo, poll_s: float = 1.0) -> int:
    _foreground("wait")


def status(ref: JobRef) -> dict[str, Any]:
    """A finished (or running) `jobgen run`: what its nodes wrote when their flow ended
    (RUN_DIR/logs/JOB/node-K/job.status: `STATUS PASS`)."""
    from pathlib import Path
    if ref.run is None:
        _foreground("status")
    folder = Path(ref.run.run_dir, "logs", ref.job_id)
    nodes: dict[str, str] = {}
    for path in sorted(folder.glob("node-*/job.status")):
        nodes[path.parent.name[len("node-"):]] = path.read_text(errors="replace").strip()
    codes = [line.split()[0] for line in nodes.values() if line]
    if not folder.is_dir():
        state, reason = "UNKNOWN", f"no logs in {folder}"
    elif len(nodes) < ref.run.nodes:
        state, reason = "RUNNING", (f"{len(nodes)} of {ref.run.nodes} nodes ended (or it was "
                                    "interrupted)")
    elif all(code == "0" for code in codes):
        state, reason = "COMPLETED", ""
    else:
        state, reason = "FAILED", "; ".join(f"node {k}: {v}" for k, v in nodes.items()
                                            if not v.startswith("0 "))
    return {"job_id": ref.job_id, "state": state, "reason": reason, "nodes": nodes}


def status_lines(ref: JobRef) -> list[str]:
    s = status(ref)
    return [f"{s['job_id']}: {s['state']}" + (f" ({s['reason']})" if s["reason"] else "")]


def logs(ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None:
    _foreground("logs")


def cancel(ref: JobRef) -> str:
    _foreground("cancel")
