"""The submitit backend: the same job as the sbatch script (same node contract, same two-pass
flow on every node, same restart accounting), handed to Slurm by submitit; once submitted it is
a Slurm job, so status, logs and cancel are Slurm's."""
from __future__ import annotations

import json
from typing import Optional

from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError
from .. import Echo, JobStatus, SubmitOptions, Submitted
from ..protocol import JobRef
from ..slurm import backend as _slurm


def plan(spec: JobSpec) -> Plan:
    """What submitit is handed: its parameters, and each node's command and environment."""
    from . import runner as submitit_runner
    name = f"{spec.run_name}.submitit.json"
    text = json.dumps(submitit_runner.dry_run(spec), indent=2) + "\n"
    return Plan(backend="submitit", files=(PlannedFile(name, text),), primary=name,
                submit_argv=("jobgen", "submit", "--backend", "submitit"))


def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """The payload snapshot, as for an sbatch script (the nodes read the same folders)."""
    _slurm.prepare(spec, strict, say)


def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    if options.chain:
        raise ConfigError("--chain is for --backend slurm (submitit runs both passes in one "
                          "job)")
    return plan(spec).text


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    from . import runner as submitit_runner
    if options.chain:
        dry_run(spec, options)   # the same refusal
    prepare(spec, strict=True, say=options.say)   # the snapshot, before the preflight looks
    _slurm.check(spec, options)
    return Submitted((str(submitit_runner.submit(spec).job_id),))


def wait(ref: JobRef, echo: Echo, poll_s: float = 2.0) -> int:
    return _slurm.wait(ref, echo, poll_s)


def status(ref: JobRef) -> JobStatus:
    return _slurm.status(ref)


def status_lines(ref: JobRef) -> list[str]:
    return _slurm.status_lines(ref)


def logs(ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None:
    _slurm.logs(ref, node, follow, echo)


def cancel(ref: JobRef) -> str:
    return _slurm.cancel(ref)


def checked() -> tuple[list[str], list[str]]:
    """What `jobgen check` says it checked beyond rendering (notes), or could not (problems)."""
    return [], []
