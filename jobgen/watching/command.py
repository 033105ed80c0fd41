"""`jobgen watch`: find the run's folder and its job, wire readers, detectors, actions and the
view together, and run until the job ends."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

from ..plumbing.errors import ConfigError
from .detectors import Detectors, Rules
from .readers import RunReader
from .summary import Summary
from .view import JsonView, PlainView, TerminalView
from .watcher import WATCH_LOG, Policy, Watch


def parse_notify(text: Optional[str]) -> Optional[str]:
    """`cmd:COMMAND` -> COMMAND (the only form: a command run with sh -c)."""
    if text is None:
        return None
    kind, sep, command = text.partition(":")
    if not sep or kind != "cmd" or not command.strip():
        raise ConfigError(f"--notify {text!r}: give cmd:COMMAND (a shell command; the alert "
                          "reaches it as JOBGEN_ALERT_* variables and JSON on stdin)")
    return command


def make_view(as_json: bool, every: float) -> Any:
    if as_json:
        return JsonView()
    if sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb":
        return TerminalView()
    return PlainView(every=every)


def watch_recorded(run_dir: Path, rules: Rules, as_json: bool) -> Summary:
    """Judge a run folder as it stands (a finished run, or a copy): nothing is acted on."""
    from .runfolder import RUN_MARKERS, is_run
    if not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir}: no such folder")
    if not is_run(run_dir):
        raise ConfigError(f"--run-dir {run_dir}: not a run folder (it holds none of "
                          f"{', '.join(RUN_MARKERS)}); give the folder a job writes to")
    reader = RunReader(run_dir)
    watch = Watch(reader, Detectors(rules), Policy(), None, make_view(as_json, 0.0))
    return watch.run(0.0)


def watch_job(backend: str, ref: Any, *, run_dir: Optional[Path], rules: Rules,
              policy: Policy, as_json: bool, poll_s: float, every: float,
              max_steps: Optional[int]) -> Summary:
    """Follow a submitted job until it ends: its backend (its package's watch.py) says what to
    read and how to act."""
    from .. import backends
    run = ref.run
    view = make_view(as_json, every)
    seq_length = run.seq_length if run else None
    max_steps = max_steps or (run.max_steps if run else None)
    target = backends.module(backend, "watch").target(ref, run_dir, view)
    if not target.run_dir_here and "rollback" in (policy.on_hang, policy.on_diverge):
        raise ConfigError(f"--on-diverge rollback needs the run folder on this machine, and a "
                          f"{backend} job's is not: use requeue or stop")
    reader = target.reader
    log_path = None
    if target.run_dir_here:
        if not reader.run_dir.is_dir():
            view.note(f"the run folder {reader.run_dir} is not visible here (yet); watching "
                      "for it")
        log_path = reader.run_dir / WATCH_LOG
    states = backends.declaration(backend).states
    watch = Watch(reader, Detectors(rules), policy, target.controller, view,
                  run_name=run.name if run else "", max_steps=max_steps,
                  seq_length=seq_length, log_path=log_path,
                  running=lambda state: states.get(state.upper()) == backends.State.RUNNING)
    return watch.run(poll_s)
