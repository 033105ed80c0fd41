"""`jobgen watch` on a Slurm job: read its run folder (shared storage this machine reaches), and
act through Slurm: `scontrol requeue` (the job resumes from its newest checkpoint on a fresh
allocation), `scancel`; a rollback (and a requeue that leaves a bad node out) holds the requeued
job (`scontrol requeuehold`), changes what must change while nothing runs, then releases it."""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ...plumbing.errors import ConfigError, RemoteError
from ...watching.actions import HOLD_TIMEOUT_S
from ...watching.readers import RunReader
from ...watching.target import Target
from ..protocol import JobRef
from . import client as slurm_client
from . import jobs as slurm_jobs


def target(ref: JobRef, run_dir: Optional[Path], view: Any) -> Target:
    run = ref.run
    run_dir = run_dir or (Path(run.run_dir) if run is not None else None) or \
        slurm_run_dir(ref.job_id)
    if run_dir is None:
        raise ConfigError(f"job {ref.job_id}: jobgen did not record it and its run folder is "
                          "unknown; give --run-dir")
    return Target(SlurmController(ref.job_id), RunReader(run_dir, lambda: [ref.job_id]))


def slurm_run_dir(job_id: str) -> Optional[Path]:
    """The run folder of a Slurm job jobgen rendered but did not record (render | sbatch):
    JOBGEN_RUN_DIR in its batch script, relative to its working directory."""
    try:
        fields = slurm_jobs._scontrol_fields(job_id) or {}
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



class SlurmController:
    def __init__(self, job_id: str, poll_s: float = 1.0) -> None:
        self.job_id = job_id
        self.poll_s = poll_s

    def state(self) -> tuple[str, bool]:
        st = slurm_jobs.state(self.job_id)
        return st.state, st.finished

    def _scontrol(self, *args: str) -> None:
        slurm_client._run(["scontrol", *args])

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        if prepare is None and exclude is None:
            self._scontrol("requeue", self.job_id)
            return f"scontrol requeue {self.job_id}"
        self._scontrol("requeuehold", self.job_id)
        done = [f"scontrol requeuehold {self.job_id}"]
        try:
            self._wait_pending()
            if exclude:
                self._scontrol("update", f"JobId={self.job_id}", f"ExcNodeList={exclude}")
                done.append(f"excluded {exclude}")
            if prepare is not None:
                done.append(prepare())
        finally:
            self._scontrol("release", self.job_id)
            done.append(f"scontrol release {self.job_id}")
        return "; ".join(done)

    def _wait_pending(self) -> None:
        """Until the requeued job's processes are gone: Slurm shows it PENDING (held) then."""
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while True:
            state, finished = self.state()
            if finished:
                raise RemoteError(f"job {self.job_id} ended ({state}) instead of being requeued")
            if state == "PENDING":
                return
            if time.monotonic() > deadline:
                raise RemoteError(f"job {self.job_id} still {state} {HOLD_TIMEOUT_S} s after "
                                  "scontrol requeuehold")
            time.sleep(self.poll_s)

    def stop(self) -> str:
        return slurm_jobs.cancel(self.job_id)
