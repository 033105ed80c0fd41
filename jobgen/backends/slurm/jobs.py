"""A Slurm job once submitted: its state from the controller (squeue, scontrol) or from
accounting once it ended (sacct), its output and node logs, and cancel. Slurm's own commands
only (client.py runs them)."""
from __future__ import annotations

import json
import posixpath
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ...plumbing import fsio
from ...plumbing.errors import JobgenError, RemoteError, printable
from .client import _run

FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")


@dataclass(frozen=True, slots=True)
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


def _text(value: Any) -> str:
    """A field of Slurm's JSON as text: v0.0.38 gives strings and numbers; later versions give
    lists of flags (job_state) and {"set", "number"} objects for numbers."""
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        if "number" in value:
            return "" if value.get("set") is False else _text(value["number"])
        if "return_code" in value or "signal" in value:   # an exit code object
            code = _text(value.get("return_code", ""))
            sig = value.get("signal") or {}
            number = _text(sig.get("id", sig.get("signal_id", 0)) if isinstance(sig, dict)
                           else sig) or "0"
            return f"{code or 0}:{number}"
        return ""
    return "" if value is None else str(value)


def _exit_code(value: Any) -> str:
    """EXIT:SIGNAL as scontrol and sacct print it: squeue's v0.0.38 JSON gives the wait status
    as a number (exit << 8 | signal); accounting and later versions give an object."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value >> 8}:{value & 0x7F}"
    return _text(value)


def _json(argv: Sequence[str]) -> Optional[list[dict[str, Any]]]:
    """The `jobs` of a Slurm command's --json output; None where this Slurm has no --json (then
    the text output is parsed instead)."""
    try:
        out = _run([*argv, "--json"])
    except RemoteError as exc:
        if any(w in str(exc) for w in ("unrecognized option", "invalid option", "--json")):
            return None
        raise
    try:
        data = json.loads(out)
        jobs, errors = data.get("jobs"), data.get("errors") or []
    except (ValueError, AttributeError):
        return None
    # squeue exits 0 with an `errors` entry when it could not ask the controller.
    failed = [e for e in errors if isinstance(e, dict) and e.get("source") == "slurm_load_jobs"]
    if failed and not jobs:
        raise RemoteError(f"{argv[0]}: {failed[0].get('description', 'failed')} "
                          f"({failed[0].get('error', '')}): the Slurm controller did not answer")
    return jobs if isinstance(jobs, list) else None


def controller_up() -> None:
    """Ask the controller first (`scontrol ping`, instant either way), so that a controller that
    is down is said as that, at once, rather than after squeue's retries as an unknown job."""
    if shutil.which("scontrol") is None:
        return   # the command that is missing is named by the next call
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10,
                              check=False)
    except subprocess.TimeoutExpired:
        raise RemoteError("the Slurm controller does not answer: `scontrol ping` took more "
                          "than 10 s") from None
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        raise RemoteError("the Slurm controller does not answer (`scontrol ping`: "
                          f"{said[0] if said else f'exit {proc.returncode}'}); the job's state "
                          "is not known until it does")


def _squeue(job_id: str) -> Optional[JobState]:
    """The job as the controller knows it, from `squeue --json` (all of the job's fields, paths
    with spaces included); None when the controller no longer knows it."""
    jobs = _json(["squeue", "--jobs", job_id.split("_")[0], "--states", "all"])
    if jobs is None:
        fields = _scontrol_fields(job_id)
        if fields is None:
            return None
        return JobState(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""),
                        fields.get("ExitCode", ""), fields.get("NodeList", ""),
                        fields.get("Restarts", ""), fields.get("StdOut", ""))
    for job in jobs:
        if _text(job.get("job_id")) == job_id.split("_")[0]:
            out = _text(job.get("standard_output"))
            workdir = _text(job.get("current_working_directory"))
            return JobState(job_id, _text(job.get("job_state")) or "UNKNOWN",
                            _text(job.get("state_reason")), _exit_code(job.get("exit_code")),
                            _text(job.get("nodes")), _text(job.get("restart_cnt")),
                            _expand_output(out, job, workdir))
    return None


def _expand_output(path: str, job: dict[str, Any], workdir: str) -> str:
    """squeue shows the --output pattern (%x-%j.out); scontrol showed the file: expand the
    patterns jobgen's scripts use, relative to the job's working directory."""
    if not path:
        return ""
    path = path.replace("%x", _text(job.get("name"))).replace("%j", _text(job.get("job_id")))
    return path if path.startswith("/") or not workdir else posixpath.join(workdir, path)


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z0-9:/_]*)=")


def _scontrol_fields(job_id: str) -> Optional[dict[str, str]]:
    """`scontrol show job -o` (Slurm without --json): a value runs up to the next ` Key=`, so
    that a path with spaces is read whole."""
    try:
        text = _run(["scontrol", "show", "job", "-o", job_id])
    except RemoteError as exc:
        if "Invalid job id" in str(exc):
            return None
        raise
    line = text.strip().splitlines()[0] if text.strip() else ""
    marks = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for mark, following in zip(marks, marks[1:] + [None]):
        end = following.start() if following is not None else len(line)
        fields.setdefault(mark.group(1), line[mark.end():end].strip())
    return fields


def _sacct(job_id: str) -> Optional[JobState]:
    jobs = _json(["sacct", "-j", job_id, "-X"])
    if jobs is None:
        rows = _run(["sacct", "-j", job_id, "-X", "-P", "-n", "-o",
                     "JobID,State,ExitCode,NodeList"]).strip().splitlines()
        if not rows:
            return None
        _, st, code, nodes = (rows[-1].split("|") + ["", "", "", ""])[:4]
        return JobState(job_id, st.split()[0], "", code, nodes)
    found = [j for j in jobs if _text(j.get("job_id")) == job_id.split("_")[0]]
    if not found:
        return None
    job = found[-1]
    state_field = job.get("state") or {}
    st = _text(state_field.get("current") if isinstance(state_field, dict) else state_field)
    reason = _text(state_field.get("reason")) if isinstance(state_field, dict) else ""
    return JobState(job_id, st.split()[0] if st else "UNKNOWN",
                    "" if reason == "None" else reason, _exit_code(job.get("exit_code")),
                    _text(job.get("nodes")))


def state(job_id: str) -> JobState:
    """The job's state from the controller, or from accounting once the controller forgot it
    (Slurm's JSON output where it has one)."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise RemoteError(f"{job_id!r} is not a Slurm job id")
    controller_up()
    live = _squeue(job_id)
    if live is not None:
        return live
    try:
        ended = _sacct(job_id)
    except RemoteError:
        ended = None
    if ended is None:
        raise RemoteError(f"job {job_id} is unknown to the controller and to accounting")
    return ended


def status(job_id: str) -> dict[str, Any]:
    """The job's state as data (`jobgen status --json`)."""
    st = state(job_id)
    return {"backend": "slurm", "job_id": st.job_id, "state": st.state,
            "finished": st.finished, "reason": "" if st.reason == "None" else st.reason,
            "exit_code": st.exit_code if st.finished else "",
            "nodes": "" if st.nodes == "(null)" else st.nodes,
            "restarts": int(st.restarts) if st.restarts.isascii() and st.restarts.isdigit() else 0,
            "output": st.stdout}


def status_lines(job_id: str) -> list[str]:
    st = status(job_id)
    line = f"job {st['job_id']}: {st['state']}"
    # scontrol shows ExitCode=0:0 for a job still pending or running: not an exit yet
    extras = [f"reason {st['reason']}" if st["reason"] else "",
              f"exit {st['exit_code']}" if st["exit_code"] else "",
              f"nodes {st['nodes']}" if st["nodes"] else "",
              f"restarts {st['restarts']}" if st["restarts"] else ""]
    return [line + "".join(f", {e}" for e in extras if e)] + (
        [f"output {st['output']}"] if st["output"] else [])


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


def node_logs(folder: Path, node: int) -> list[Path]:
    """Node `node`'s logs of one job (`RUN_DIR/logs/JOB_ID/restart-N/node-K/{compile,train}.log`,
    written by payload/common/job_flow.sh): every restart's, oldest first."""
    def restart(path: Path) -> int:
        number = path.name.partition("-")[2]
        return int(number) if number.isascii() and number.isdigit() else -1
    found = []
    for attempt in sorted(folder.glob("restart-*"), key=restart):
        found += [f for f in (attempt / f"node-{node}" / "compile.log",
                              attempt / f"node-{node}" / "train.log") if f.is_file()]
    return found


def follow(files: Callable[[], list[Path]], job_id: str, emit: Callable[[str], None],
           poll: float = 1.0) -> None:
    """Print the files as they grow (and as new ones appear) until the job ends, like
    `tail -f` that knows when to stop."""
    offsets: dict[Path, int] = {}
    refused: set[Path] = set()
    while True:
        done = state(job_id).finished
        for path in files():
            if not path.exists():
                continue
            try:   # the one reader: a FIFO or a device among the logs is not waited on
                data = fsio.read_bytes(path, fsio.MAX_BYTES, offset=offsets.get(path, 0),
                                       partial=True)
            except (OSError, JobgenError) as exc:
                if path not in refused:   # said once
                    refused.add(path)
                    emit(printable(f"jobgen: {exc}; not followed") + "\n")
                continue
            offsets[path] = offsets.get(path, 0) + len(data)
            if data:
                emit(data.decode("utf-8", "replace"))
        if done:
            return
        time.sleep(poll)
