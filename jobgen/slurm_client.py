"""Talking to a Slurm controller: submit a plan with `sbatch --parsable`, and status, logs and
cancel by job id. Everything here runs Slurm's own commands; nothing is rendered here."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from .errors import RemoteError
from .plan import Plan

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def _run(argv: Sequence[str], *, stdin: Optional[str] = None, timeout: float = 60) -> str:
    """Run a Slurm command; a missing command or a refusal becomes a one-line RemoteError."""
    if shutil.which(argv[0]) is None:
        raise RemoteError(f"{argv[0]} not found: is this a Slurm login node?")
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
        raise RemoteError(f"{argv[0]}: {lines[-1].strip()}")
    return proc.stdout


def parse_job_id(text: str) -> str:
    """`sbatch --parsable` prints `ID` or `ID;CLUSTER`."""
    match = re.match(r"^\s*(\d+)(?:;\S+)?\s*$", text)
    if not match:
        raise RemoteError(f"sbatch: unexpected answer {text.strip()[:80]!r}")
    return match.group(1)


def submit(plan: Plan, extra: Sequence[str] = ()) -> str:
    """Submit the plan's script exactly as `jobgen render` prints it (on sbatch's stdin)."""
    return parse_job_id(_run(["sbatch", "--parsable", *extra], stdin=plan.text))


def submit_chain(compile_plan: Plan, train_plan: Plan) -> tuple[str, str]:
    """Compile and training as two jobs; training starts only if compiling succeeded, and is
    cancelled (not left pending forever) if it failed."""
    first = submit(compile_plan)
    second = submit(train_plan, [f"--dependency=afterok:{first}", "--kill-on-invalid-dep=yes"])
    return first, second


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""
    restarts: str = ""
    stdout: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


def _scontrol_fields(job_id: str) -> Optional[dict[str, str]]:
    try:
        text = _run(["scontrol", "show", "job", "-o", job_id])
    except RemoteError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    fields: dict[str, str] = {}
    for token in re.findall(r"(\w+)=(\S*)", text):
        fields.setdefault(token[0], token[1])
    return fields


def state(job_id: str) -> JobState:
    """The job's state from the controller, or from accounting once the controller forgot it."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise RemoteError(f"{job_id!r} is not a Slurm job id")
    fields = _scontrol_fields(job_id)
    if fields is not None:
        return JobState(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""),
                        fields.get("ExitCode", ""), fields.get("NodeList", ""),
                        fields.get("Restarts", ""), fields.get("StdOut", ""))
    try:
        rows = _run(["sacct", "-j", job_id, "-X", "-P", "-n", "-o",
                     "JobID,State,ExitCode,NodeList"]).strip().splitlines()
    except RemoteError:
        rows = []
    if not rows:
        raise RemoteError(f"job {job_id} is unknown to the controller and to accounting")
    _, st, code, nodes = (rows[-1].split("|") + ["", "", "", ""])[:4]
    return JobState(job_id, st.split()[0], "", code, nodes)


def status_lines(job_id: str) -> list[str]:
    st = state(job_id)
    line = f"job {st.job_id}: {st.state}"
    extras = [f"reason {st.reason}" if st.reason and st.reason != "None" else "",
              # scontrol shows ExitCode=0:0 for a job still pending or running: not an exit yet
              f"exit {st.exit_code}" if st.exit_code and st.finished else "",
              f"nodes {st.nodes}" if st.nodes and st.nodes != "(null)" else "",
              f"restarts {st.restarts}" if st.restarts and st.restarts != "0" else ""]
    return [line + "".join(f", {e}" for e in extras if e)] + (
        [f"output {st.stdout}"] if st.stdout else [])


def cancel(job_id: str) -> str:
    st = state(job_id)
    if st.finished:
        return f"job {job_id} already ended ({st.state}); nothing to cancel"
    _run(["scancel", job_id])
    return f"job {job_id} cancelled (was {st.state})"


def wait(job_id: str, poll: float = 2.0, on_change: Callable[[str], None] = print,
         timeout: Optional[float] = None) -> JobState:
    """Poll until the job ends, reporting each state change."""
    start, last = time.monotonic(), ""
    while True:
        st = state(job_id)
        if st.state != last:
            on_change(f"job {job_id}: {st.state}")
            last = st.state
        if st.finished:
            return st
        if timeout is not None and time.monotonic() - start > timeout:
            raise RemoteError(f"job {job_id} still {st.state} after {timeout:.0f} s")
        time.sleep(poll)


def log_path(job_id: str) -> Path:
    st = state(job_id)
    if not st.stdout:
        raise RemoteError(f"job {job_id}: the controller no longer knows its output file "
                          "(look for <job-name>-<id>.out in the submission directory)")
    return Path(st.stdout)


def follow(path: Path, job_id: str, emit: Callable[[str], None], poll: float = 1.0) -> None:
    """Print the file as it grows until the job ends (like `tail -f` that knows when to stop)."""
    offset = 0
    while True:
        done = state(job_id).finished
        if path.exists():
            with path.open("r", encoding="utf-8", errors="replace") as fh:
                fh.seek(offset)
                chunk = fh.read()
                offset = fh.tell()
            if chunk:
                emit(chunk)
        if done:
            return
        time.sleep(poll)
