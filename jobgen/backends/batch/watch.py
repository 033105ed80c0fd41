"""`jobgen watch` on an AWS Batch job: read its run folder (the shared file system, mounted here
too), and act through Batch: a multi-node job cannot be requeued, so it is terminated and the
same definition submitted again under the same run name (recorded, so `jobgen status RUN`
follows it)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional

from ...plumbing.errors import ConfigError
from ...watching.readers import RunReader
from ...watching.target import Target
from ..aws import call
from ..protocol import JobRef
from . import client as batch_client
from .backend import _client


def target(ref: JobRef, run_dir: Optional[Path], view: Any) -> Target:
    from ...runs import ledger as runs
    run = ref.run
    job_ids = [ref.job_id]

    def resubmitted(new_id: str) -> None:
        job_ids.append(new_id)
        if run is not None:
            warning = runs.record(dataclasses.replace(
                run, job_id=new_id, jobs=(new_id,), submitted=runs.now()))
            if warning:
                view.note(warning)

    run_dir = run_dir or (Path(run.run_dir) if run is not None else None)
    if run_dir is None:
        raise ConfigError(f"job {ref.job_id}: jobgen did not record it and its run folder is "
                          "unknown; give --run-dir")
    controller = BatchController(_client(ref), ref.job_id, resubmitted)
    return Target(controller, RunReader(run_dir, lambda: list(job_ids)))


class BatchController:
    """A Batch job: `state` and `stop` through the Batch API; `requeue` terminates the job and
    submits its definition again (same queue, name, node count and parameters)."""

    def __init__(self, client: Any, job_id: str,
                 on_resubmit: Optional[Callable[[str], None]] = None) -> None:
        self.client = client
        self.job_id = job_id
        self.on_resubmit = on_resubmit

    def _job(self) -> dict[str, Any]:
        return batch_client.describe(self.client, self.job_id)

    def state(self) -> tuple[str, bool]:
        status = str(self._job().get("status", "UNKNOWN"))
        return status, status in ("SUCCEEDED", "FAILED")

    def stop(self) -> str:
        return batch_client.cancel(self.client, self.job_id, "stopped by jobgen watch")

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        job = self._job()
        done = [batch_client.cancel(self.client, self.job_id,
                                    "requeued by jobgen watch")]
        if prepare is not None:
            done.append(prepare())
        request: dict[str, Any] = {"jobName": job["jobName"], "jobQueue": job["jobQueue"],
                                   "jobDefinition": job["jobDefinition"]}
        nodes = (job.get("nodeProperties") or {}).get("numNodes")
        if nodes:
            request["nodeOverrides"] = {"numNodes": int(nodes)}
        if job.get("parameters"):
            request["parameters"] = job["parameters"]
        if job.get("tags"):
            request["tags"] = job["tags"]
        answer = call(self.client.submit_job, **request)
        old, self.job_id = self.job_id, str(answer["jobId"])
        if self.on_resubmit is not None:
            self.on_resubmit(self.job_id)
        done.append(f"submitted again as {self.job_id} (was {old})")
        return "; ".join(done)


# --- rollback ----------------------------------------------------------------------------------
