"""What a backend's `backend` module does, as a type, and the submitted job it is asked about
(`JobRef`, with its run's record). Apart from the registry (jobgen/backends/__init__.py), which
sits below the job spec and the run record it describes: the protocol names their types, and the
registry naming them would import upward."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Protocol, cast

from ..plumbing.record import record
from . import Echo, JobStatus, SubmitOptions, Submitted, get

if TYPE_CHECKING:   # not imported when rendering: only the types are needed here
    from ..job.plan import Plan
    from ..job.spec import JobSpec
    from ..runs.ledger import Run


@record
class JobRef:
    """A submitted job: its id, its record if jobgen submitted it, and where to ask about it."""
    job_id: str
    run: Optional[Run] = None
    site: Optional[str] = None          # --site (AWS: region, log group)
    endpoint_url: Optional[str] = None


class Backend(Protocol):
    def plan(self, spec: JobSpec) -> Plan: ...
    def prepare(self, spec: JobSpec, strict: bool = True,
                say: Optional[Echo] = None) -> None: ...
    def dry_run(self, spec: JobSpec, options: SubmitOptions) -> str: ...
    def submit(self, spec: JobSpec, options: SubmitOptions) -> Submitted: ...
    def wait(self, ref: JobRef, echo: Echo, poll_s: float) -> int: ...
    def status(self, ref: JobRef) -> JobStatus: ...
    def status_lines(self, ref: JobRef) -> list[str]: ...
    def logs(self, ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None: ...
    def cancel(self, ref: JobRef) -> str: ...
    def checked(self) -> tuple[list[str], list[str]]: ...


def backend(name: str) -> Backend:
    """The registry's `get`, typed."""
    return cast(Backend, get(name))
