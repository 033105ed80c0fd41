"""`jobgen watch`: find the run's folder and its job, wire readers, detectors, actions and the
view together, and run until the job ends."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any, Optional

from ..errors import ConfigError, RemoteError
from . import actions
from .detectors import Detectors, Rules
from .readers import RunReader
from .view import JsonView, PlainView, TerminalView
from .watcher import WATCH_LOG, Policy, Summary, Watch


def parse_notify(text: Optional[str]) -> Optional[str]:
    """`cmd:COMMAND` -> COMMAND (the only form: a command run with sh -c)."""
    if text is None:
        return None
    kind, sep, command = text.partition(":")
    if not sep or kind != "cmd" or not command.strip():
        raise ConfigError(f"--notify {text!r}: give cmd:COMMAND (a shell command; the alert "
                          "reaches it as JOBGEN_ALERT_* variables and JSON on stdin)")
    return command


def slurm_run_dir(job_id: str) -> Optional[Path]:
    """The run folder of a Slurm job jobgen rendered but did not record (render | sbatch):
    JOBGEN_RUN_DIR in its batch script, relative to its working directory."""
    from .. import slurm_client
    try:
        fields = slurm_client._scontrol_fields(job_id) or {}
        script = slurm_client._run(["scontrol", "write", "batch_script", job_id, "-"])
    except RemoteError:
        return None
    for line in script.splitlines():
        line = line.strip()
        if line.startswith("export JOBGEN_RUN_DIR="):
            try:
                value = shlex.split(line[len("export "):])[0].partition("=")[2]
            except ValueError:
                return None
            workdir = fields.get("WorkDir", "")
            return Path(value) if os.path.isabs(value) or not workdir else Path(workdir, value)
    return None


def make_view(as_json: bool, every: float) -> Any:
    if as_json:
        return JsonView()
    if sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb":
        return TerminalView()
    return PlainView(every=every)


def watch_recorded(run_dir: Path, rules: Rules, as_json: bool) -> Summary:
    """Judge a run folder as it stands (a finished run, or a copy): nothing is acted on."""
    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir}: no such folder")
    reader = RunReader(run_dir)
    watch = Watch(reader, Detectors(rules), Policy(), None, make_view(as_json, 0.0))
    return watch.run(0.0)


def watch_job(impl_name: str, ref: Any, *, run_dir: Optional[Path], rules: Rules,
              policy: Policy, as_json: bool, poll_s: float, every: float,
              max_steps: Optional[int]) -> Summary:
    """Follow a submitted job until it ends."""
    run = ref.run
    view = make_view(as_json, every)
    seq_length = run.seq_length if run else None
    max_steps = max_steps or (run.max_steps if run else None)
    if impl_name == "batch":
        from .. import runs
        from ..backends import batch as batch_backend
        client = batch_backend._client(ref)
        job_ids = [ref.job_id]

        def resubmitted(new_id: str) -> None:
            job_ids.append(new_id)
            if run is not None:
                import dataclasses
                warning = runs.record(dataclasses.replace(
                    run, job_id=new_id, jobs=(new_id,), submitted=runs.now()))
                if warning:
                    view.note(warning)

        controller: actions.Controller = BatchController(client, ref.job_id, resubmitted)
        jobs = lambda: list(job_ids)   # noqa: E731
    else:
        controller = actions.SlurmController(ref.job_id)
        jobs = lambda: [ref.job_id]   # noqa: E731
    if run_dir is None and run is not None:
        run_dir = Path(run.run_dir)
    if run_dir is None and impl_name == "slurm":
        run_dir = slurm_run_dir(ref.job_id)
    if run_dir is None:
        raise ConfigError(f"job {ref.job_id}: jobgen did not record it and its run folder is "
                          "unknown; give --run-dir")
    if not run_dir.is_dir():
        view.note(f"the run folder {run_dir} is not visible here (yet); watching for it")
    log_path = run_dir / WATCH_LOG
    watch = Watch(RunReader(run_dir, jobs), Detectors(rules), policy, controller, view,
                  run_name=run.name if run else "", max_steps=max_steps,
                  seq_length=seq_length, log_path=log_path)
    return watch.run(poll_s)


BatchController = actions.BatchController
