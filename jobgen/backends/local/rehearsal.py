"""What `jobgen run` does around its runner (jobgen/backends/local/runner.py): it records the run as
`submit` does (`jobgen runs`, and the run's record, jobgen-run.json, for `runs NAME`, `status`,
`report` and `resubmit`); it moves the rendezvous off a port that is taken on this machine; it
records a Ctrl-C as a cancelled run, with the step it reached, its last checkpoint and the
command that resumes it; and it says "add --smoke" where the job needs accelerators that this
machine does not have."""
from __future__ import annotations

import errno
import json
import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError, printable
from ...runs.ledger import CANCELLED  # noqa: F401 (in RUN_DIR/logs/JOB/: Ctrl-C stopped it)

STATUS_CANCELLED = 130


def port_taken(port: int) -> bool:
    """Whether something on this machine listens on `port`, on any address, IPv4 or IPv6 (the
    rendezvous binds every address; a connection of an earlier run in TIME_WAIT does not count:
    the rendezvous reuses the address as this check does)."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:         # no IPv6 here
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def master_port(spec: JobSpec, movable: bool = True) -> Optional[int]:
    """The port to use instead of the recipe's job.master_port where that is taken here (None:
    the recipe's is free). Where the nodes' port cannot be moved, a one-line refusal."""
    port = spec.recipe.job.master_port
    if not port_taken(port):
        return None
    if not movable:
        raise ConfigError(f"port {port} (the recipe's job.master_port) is in use on this "
                          f"machine: stop what holds it, or pass --set job.master_port=N with "
                          "a free port N")
    return _free_port()


# --- the run's record -----------------------------------------------------------------------

def record(spec: JobSpec, job_id: str, *, site_ref: str, overrides: Sequence[str],
           recipe_file: Path, site_file: Path, amend: bool = False,
           resubmit: bool = False, stage: Optional[str] = None,
           sources: Sequence[str] = (), exported: Optional[dict[str, Any]] = None) -> list[str]:
    """Record the rehearsal as `submit` records a job: a line of `jobgen runs` and the run's
    record in its folder (refused, as for submit, where the run was trained with other values
    and not `amend`). Returns warnings (the run goes on without its record). `stage`: a
    stage's job before training, on one node (jobgen/backends/local/stage.py), with its --from
    `sources` (`resubmit` runs it again); the export (eval) stage's step and folder (results
    file), `exported`, under the stage's name."""
    from ... import backends
    from ...runs import ledger as runs
    from ...runs import runrecord
    # A container's run folder is the emulated instance's, not this one: only the state copy.
    here = not backends.declaration(spec.backend).container
    new = runrecord.submission(spec, backend=spec.backend, overrides=overrides,
                               site_ref=site_ref, recipe_file=recipe_file, site_file=site_file,
                               amend=amend, resubmit=resubmit)
    new["rehearsal"] = True     # `resubmit` runs it here again, with `jobgen run`
    if stage is not None:
        new["sources"] = list(sources)       # its stage: commit's job_stages
    if exported is not None:
        new[stage or "export"] = dict(exported)   # its outcome is added when it ends
    old = runrecord.admit(spec, new, here, amend)
    run = runs.Run(name=spec.run_name, backend="local", job_id=job_id, recipe=spec.recipe.name,
                   nodes=1 if stage is not None else spec.nodes, site=site_ref,
                   stages=(stage,) if stage is not None else (),
                   run_dir=os.path.abspath(run_folder(spec, job_id)),   # where it is here
                   submitted=runs.now(), jobs=(job_id,), smoke=spec.smoke,
                   max_steps=(spec.rehearsal.max_steps if spec.rehearsal
                              else spec.recipe.schedule.max_steps),
                   seq_length=(spec.rehearsal.seq_length if spec.rehearsal
                               else spec.recipe.model.seq_length))
    return [w for w in (runs.record(run), runrecord.commit(
        spec, new, old, [job_id], here, stages=[stage] if stage is not None else [])) if w]


# --- Ctrl-C ---------------------------------------------------------------------------------

def _events(path: Path) -> list[dict[str, Any]]:
    """The JSON events of the tail of a node's log (the last 1 MiB), through the one reader."""
    from ...plumbing import fsio
    from ...plumbing.errors import JobgenError
    try:
        size = os.stat(path).st_size
        data = fsio.read_bytes(path, 1 << 20, offset=max(0, size - (1 << 20)), partial=True)
    except (OSError, JobgenError):
        return []
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
    return out


def _step(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reached(run_dir: str, job_id: str) -> dict[str, Any]:
    """The training step node 0 of `job_id` logged last, and the run's newest complete
    checkpoint (a step folder whose COMPLETE marker is written: what a resumed run starts
    from; payload/common/checkpoints.py)."""
    found: dict[str, Any] = {"step": None, "checkpoint_step": None, "checkpoint": None}
    for item in _events(Path(run_dir, "logs", job_id, "node-0", "train.log")):
        if item.get("event") == "step" and item.get("phase", "train") == "train":
            found["step"] = _step(item.get("step"))
    sealed = []
    for marker in Path(run_dir).glob("*/checkpoints/step_*/COMPLETE"):
        digits = marker.parent.name[len("step_"):]
        if digits.isascii() and digits.isdigit() and len(digits) < 12:
            sealed.append((int(digits), marker.parent))
    if sealed:
        step, folder = max(sealed)
        found["checkpoint_step"], found["checkpoint"] = step, os.path.relpath(folder)
        found["step"] = max(step, found["step"] or 0)
    return found


def record_cancel(run_dir: str, job_id: str, resume: str) -> dict[str, Any]:
    """Mark the job cancelled in its log folder (the local backend's status reads it)."""
    from ...plumbing import fsio
    from ...runs import ledger as runs
    found = dict(reached(run_dir, job_id), time=runs.now(), by="Ctrl-C", resume=resume)
    try:
        fsio.write_file(Path(run_dir, "logs", job_id, CANCELLED),
                        json.dumps(found, sort_keys=True) + "\n")
    except (OSError, ConfigError):
        pass    # the nodes' own status files still say the job was stopped
    return found


def read_cancel(folder: Path) -> Optional[dict[str, Any]]:
    """What `record_cancel` wrote in a job's log folder, or None."""
    from ...plumbing import fsio
    from ...plumbing.errors import JobgenError
    try:
        data = fsio.loads(fsio.read_bytes(folder / CANCELLED, fsio.MAX_LINE))
    except (OSError, ValueError, JobgenError):
        return None
    return data if isinstance(data, dict) else None


def cancel_lines(found: dict[str, Any]) -> list[str]:
    step, saved = found.get("step"), found.get("checkpoint_step")
    where = f"at step {step}" if step is not None else "before its first training step"
    kept = (f"its last checkpoint is step {saved} ({printable(str(found.get('checkpoint')))})"
            if saved is not None else "it saved no checkpoint, so it starts again from step 0")
    return [f"jobgen: cancelled (Ctrl-C) {where}; every process it started is stopped; {kept}",
            f"jobgen: resume it with: {found['resume']}"]


# --- the run --------------------------------------------------------------------------------

def start(spec: JobSpec, *, site_ref: str, overrides: Sequence[str], recipe_file: Path,
          site_file: Path, resume: str, emit: Callable[[str], None],
          say: Callable[[str], None], amend: bool = False, resubmit: bool = False,
          job_id: Optional[str] = None) -> int:
    """Run the rehearsal (as `job_id`, default a new one); returns its status (130:
    cancelled)."""
    from ... import backends
    from ...runs import ledger as runs
    from . import needs
    from . import runner as local_runner
    # What the nodes' programs import, looked up in their interpreter before anything starts.
    needs.check(spec, local_runner.node_env(local_runner.commands(spec, "check", False)[0][1]))
    container = backends.declaration(spec.backend).container
    port = master_port(spec, movable=not container)
    job_id = job_id or runs.local_job_id()
    for warning in record(spec, job_id, site_ref=site_ref, overrides=overrides,
                          recipe_file=recipe_file, site_file=site_file, amend=amend,
                          resubmit=resubmit):
        say(f"warning: {warning}")
    if port is not None:
        say(f"jobgen: port {spec.recipe.job.master_port} (job.master_port) is in use on this "
            f"machine; this rehearsal's nodes meet on port {port} instead (--set "
            f"job.master_port=N picks one)")
    status = local_runner.run(spec, emit=emit, job_id=job_id, master_port=port)
    here = run_folder(spec, job_id)     # an emulated instance's disk: where the folder is
    if status == STATUS_CANCELLED:
        for line in cancel_lines(record_cancel(os.path.abspath(here), job_id, resume)):
            say(line)
    elif status in (75, 78) and not spec.smoke and _no_devices(here, job_id):
        say("jobgen: this machine has none of the job's accelerators (the health gate found "
            "no devices; nothing was compiled or trained): add --smoke to rehearse it on CPU")
    elif status == 75:
        say("jobgen: the health gate found a bad node (the lines above name it and the check); "
            "nothing was compiled or trained")
    return status


def run_folder(spec: JobSpec, job_id: str) -> str:
    """The run folder of `job_id` as it lies on this machine: an emulated service keeps it
    where its backend's rehearsal puts the first node's disk (its `run_folder`), else the
    spec's own (relative to the current folder, as the site gives it)."""
    from ... import backends
    from . import runner as local_runner
    if backends.declaration(spec.backend).container:
        where = getattr(backends.module(spec.backend, "rehearsal"), "run_folder", None)
        if where is not None:
            return os.path.relpath(where(spec, local_runner.rehearsal_folder(False) / job_id))
    return spec.run_dir


def _no_devices(run_dir: str, job_id: str) -> bool:
    """Whether the health gate stopped `job_id` for want of devices (jobgen-health.jsonl)."""
    from ...plumbing import fsio
    from ...plumbing.errors import JobgenError
    from ...runs.runrecord import HEALTH_FILE
    try:
        events, _ = fsio.read_records(Path(run_dir, HEALTH_FILE), lambda item: item)
    except (OSError, JobgenError):
        return False
    return any(e.get("job") == job_id and e.get("check") == "devices" for e in events)
