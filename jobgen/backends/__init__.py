"""Backends: where a job spec runs. Each is a plain module with the same functions (`Backend`):
`plan(spec)` (pure: the files and the command that would run), `dry_run` (what `submit` would
run, printed instead), `submit`, and, for the job once submitted, `wait`, `status`, `logs` and
`cancel`. They are imported on first use, so rendering for Slurm never loads the AWS SDK."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, cast

from ..record import record

if TYPE_CHECKING:   # not imported when rendering: only the types are needed here
    from ..plan import Plan
    from ..runs import Run
    from ..spec import JobSpec

BACKENDS = ("slurm", "batch", "submitit", "local", "sagemaker", "eks")
# The ones that hand the job to a scheduler.
SUBMITTED = ("slurm", "batch", "submitit", "sagemaker", "eks")
Echo = Callable[[str], None]


@record
class SubmitOptions:
    chain: bool = False                 # Slurm: compile and training as two dependent jobs
    check: bool = True                  # Slurm: preflight from this host before submitting
    queue: Optional[str] = None         # Batch: the job queue (default: the site's)
    endpoint_url: Optional[str] = None  # Batch: an AWS endpoint (moto) instead of AWS's own
    say: Optional[Echo] = None          # where to say, as it happens, what was not checked


@record
class Submitted:
    job_ids: tuple[str, ...]            # printed on stdout (the last one trains)
    notes: tuple[str, ...] = ()         # said on stderr
    queue: Optional[str] = None

    @property
    def job_id(self) -> str:
        return self.job_ids[-1]


@record
class JobRef:
    """A submitted job: its id, its record if jobgen submitted it, and where to ask about it."""
    job_id: str
    run: Optional[Run] = None
    site: Optional[str] = None          # --site (Batch: region, log group)
    endpoint_url: Optional[str] = None


class Backend(Protocol):
    HEALTH_ON_FAILURE: str   # what a bad node found by the health gate leads to

    def plan(self, spec: JobSpec) -> Plan: ...
    def prepare(self, spec: JobSpec, strict: bool = True,
                say: Optional[Echo] = None) -> None: ...
    def dry_run(self, spec: JobSpec, options: SubmitOptions) -> str: ...
    def submit(self, spec: JobSpec, options: SubmitOptions) -> Submitted: ...
    def wait(self, ref: JobRef, echo: Echo, poll_s: float) -> int: ...
    def status(self, ref: JobRef) -> dict[str, Any]: ...
    def status_lines(self, ref: JobRef) -> list[str]: ...
    def logs(self, ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None: ...
    def cancel(self, ref: JobRef) -> str: ...


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}")
    return cast(Backend, importlib.import_module(f"{__name__}.{name}"))


def spec_backend(name: str) -> str:
    """The backend a spec is resolved for: submitit's nodes are Slurm's (same paths, same
    payload folder)."""
    return "slurm" if name == "submitit" else name
