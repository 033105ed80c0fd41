"""The local backend (`jobgen run`): every node of the job as a process group on this machine,
no scheduler. It runs in the foreground, so there is no job to ask about afterwards: its logs
are in the run folder (RUN_DIR/logs/local-<time>-<pid>/)."""
from __future__ import annotations

import json
from typing import NoReturn, Optional

from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError, printable
from .. import Echo, JobStatus, SubmitOptions, Submitted, job_status
from ..protocol import JobRef

JOB_ID = "local-{time}"   # what the plan shows for the id `jobgen run` makes when it starts


def plan(spec: JobSpec) -> Plan:
    """Each emulated node's command and the environment it adds."""
    from . import runner as local_runner
    nodes = [{"argv": argv, "env": env} for argv, env in local_runner.node_commands(spec, JOB_ID)]
    name = f"{spec.run_name}.local.json"
    return Plan(backend="local", files=(PlannedFile(name, json.dumps(
        {"nodes": nodes}, indent=2) + "\n"),), primary=name, submit_argv=("jobgen", "run"))


def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """The payload snapshot, as for an sbatch script (the nodes read the same folders)."""
    from ..slurm import backend as slurm
    slurm.prepare(spec, strict, say)


def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    return plan(spec).text


def _foreground(what: str) -> NoReturn:
    raise ConfigError(f"{what}: the local backend runs in the foreground (`jobgen run`); its "
                      "nodes' logs are in RUN_DIR/logs/local-<time>-<pid>/")


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    _foreground("submit")


def wait(ref: JobRef, echo: Echo, poll_s: float = 1.0) -> int:
    _foreground("wait")


def status(ref: JobRef) -> JobStatus:
    """A finished (or running) `jobgen run`: what its nodes wrote when their flow ended
    (RUN_DIR/logs/JOB/node-K/job.status: `STATUS PASS`), and whether Ctrl-C stopped it
    (RUN_DIR/logs/JOB/cancelled.json: jobgen/backends/local/rehearsal.py)."""
    from pathlib import Path

    from ...plumbing import fsio
    from ...plumbing.errors import JobgenError
    from .rehearsal import read_cancel
    if ref.run is None:
        _foreground("status")
    folder = Path(ref.run.run_dir, "logs", ref.job_id)
    nodes: dict[str, str] = {}
    for path in sorted(folder.glob("node-*/job.status")):
        try:      # through the one reader: a FIFO or a device there is not waited on
            text = fsio.read_bytes(path, 4096, partial=True).decode("utf-8", "replace")
        except (OSError, JobgenError) as exc:
            text = f"? unreadable: {exc}"
        nodes[path.parent.name[len("node-"):]] = printable(text.strip()[:200])
    codes = [line.split()[0] for line in nodes.values() if line]
    cancelled = read_cancel(folder)
    if not folder.is_dir():
        state, reason = "UNKNOWN", f"no logs in {folder}"
    elif cancelled is not None:
        step, saved = cancelled.get("step"), cancelled.get("checkpoint_step")
        state, reason = "CANCELLED", printable(
            f"Ctrl-C at step {step if step is not None else '(none yet)'}; last checkpoint: "
            + (f"step {saved}" if saved is not None else "none") + "; resume with: "
            + str(cancelled.get("resume", "the same jobgen run command")))
    elif len(nodes) < ref.run.nodes:
        state, reason = "RUNNING", (f"{len(nodes)} of {ref.run.nodes} nodes ended (or it was "
                                    "interrupted)")
    elif all(code == "0" for code in codes):
        state, reason = "COMPLETED", ""
    else:
        state, reason = "FAILED", "; ".join(f"node {k}: {v}" for k, v in nodes.items()
                                            if not v.startswith("0 "))
    return job_status("local", ref.job_id, state, reason, nodes=nodes)


def status_lines(ref: JobRef) -> list[str]:
    s = status(ref)
    return [f"{s.job_id}: {s.native}" + (f" ({s.reason})" if s.reason else "")]


# How much of each log `jobgen logs` prints of a `jobgen run` job: its tail.
LOG_TAIL = 1 << 20


def logs(ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None:
    """What a `jobgen run` job's node wrote (RUN_DIR/logs/JOB/node-K/*.log: a stage's log, or
    the compile and training passes'), each file's tail under its name. It ran in the
    foreground, so `--follow` has nothing more to wait for."""
    from pathlib import Path

    from ...plumbing import fsio
    from ...plumbing.errors import JobgenError
    if ref.run is None:
        _foreground("logs")
    folder = Path(ref.run.run_dir, "logs", ref.job_id, f"node-{node or 0}")
    files = sorted(folder.glob("*.log"), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        raise ConfigError(printable(f"{folder}: no logs of job {ref.job_id} node {node or 0} "
                                    "(`jobgen runs` lists the runs and their folders)"))
    for path in files:
        try:
            size = path.stat().st_size
            data = fsio.read_bytes(path, LOG_TAIL, offset=max(0, size - LOG_TAIL), partial=True)
        except (OSError, JobgenError) as exc:
            echo(printable(f"==> {path}: unreadable: {exc} <==") + "\n")
            continue
        text = data.decode("utf-8", "replace")
        echo(printable(f"==> {path} <==") + "\n" + text + ("" if text.endswith("\n") else "\n"))


def cancel(ref: JobRef) -> str:
    _foreground("cancel")


def checked() -> tuple[list[str], list[str]]:
    """What `jobgen check` says it checked beyond rendering (notes), or could not (problems)."""
    return [], []
