"""`jobgen watch` on a SageMaker training job: its instances' CloudWatch logs (group
/aws/sagemaker/TrainingJobs, a stream JOB/algo-N-EPOCH per instance and start) carry the same
JSON events as a run folder's node logs. A training job can be stopped, not requeued in place:
SageMaker's own RetryStrategy restarts it after an infrastructure failure."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Optional

from ...plumbing.errors import RemoteError
from ...watching.target import StreamReader, Target
from ..aws import LogStream, call
from ..protocol import JobRef
from .backend import DONE, LOG_GROUP, _ref_client, describe

STREAM = re.compile(r"/algo-(\d+)-")


def target(ref: JobRef, run_dir: Optional[Path], view: Any) -> Target:
    client, logs = _ref_client(ref), _ref_client(ref, "logs")
    where = run_dir or Path(ref.run.run_dir if ref.run else ".")
    return Target(Controller(client, ref.job_id),
                  StreamReader(Streams(logs, ref.job_id).fetch, where), run_dir_here=False)


class Streams:
    """Each instance's log streams, read on from where the last call stopped."""

    def __init__(self, logs: Any, job: str) -> None:
        self.logs = logs
        self.job = job
        self.streams: dict[str, LogStream] = {}

    def fetch(self) -> dict[int, list[str]]:
        found = call(self.logs.describe_log_streams, logGroupName=LOG_GROUP,
                     logStreamNamePrefix=f"{self.job}/algo-").get("logStreams", [])
        out: dict[int, list[str]] = {}
        for name in sorted(s["logStreamName"] for s in found):
            match = STREAM.search(name)
            if match is None:
                continue
            stream = self.streams.setdefault(name, LogStream(self.logs, LOG_GROUP, name))
            out.setdefault(int(match.group(1)) - 1, []).extend(stream.read())
        return out


class Controller:
    def __init__(self, client: Any, job_id: str) -> None:
        self.client = client
        self.job_id = job_id

    def state(self) -> tuple[str, bool]:
        status = str(describe(self.client, self.job_id).get("TrainingJobStatus", "Unknown"))
        return status, status in DONE

    def stop(self) -> str:
        call(self.client.stop_training_job, TrainingJobName=self.job_id)
        return f"stopping SageMaker training job {self.job_id}"

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        raise RemoteError("a SageMaker training job cannot be requeued in place: stop it "
                          "(--on-hang stop) and submit the run again (jobgen resubmit)")
