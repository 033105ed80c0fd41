"""What `jobgen watch` can do about a job: requeue it, stop it, roll it back to the checkpoint
before the trouble began, or run the user's notification command.

Slurm: `scontrol requeue` (the job resumes from its newest checkpoint on a fresh allocation),
`scancel`; a rollback (and a requeue that leaves a bad node out) holds the requeued job
(`scontrol requeuehold`), changes what must change while nothing runs, then releases it.
Batch: a multi-node job cannot be requeued, so it is terminated and the same definition
submitted again under the same run name (recorded, so `jobgen status RUN` follows it).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from ..errors import RemoteError

NOTIFY_TIMEOUT_S = 60
HOLD_TIMEOUT_S = 300
NEMO_STEP = re.compile(r"step=(\d+)")


class Controller(Protocol):
    job_id: str

    def state(self) -> tuple[str, bool]:
        """(the scheduler's state, whether the job has ended)."""

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        """Start the job again from its newest checkpoint; `prepare` runs while nothing of it
        runs (its text is reported); `exclude`: a host the new allocation must not use."""

    def stop(self) -> str: ...


class SlurmController:
    def __init__(self, job_id: str, poll_s: float = 1.0) -> None:
        self.job_id = job_id
        self.poll_s = poll_s

    def state(self) -> tuple[str, bool]:
        from .. import slurm_client
        st = slurm_client.state(self.job_id)
        return st.state, st.finished

    def _scontrol(self, *args: str) -> None:
        from .. import slurm_client
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
        from .. import slurm_client
        return slurm_client.cancel(self.job_id)


class BatchController:
    """A Batch job: `state` and `stop` through the Batch API; `requeue` terminates the job and
    submits its definition again (same queue, name, node count and parameters)."""

    def __init__(self, client: Any, job_id: str,
                 on_resubmit: Optional[Callable[[str], None]] = None) -> None:
        self.client = client
        self.job_id = job_id
        self.on_resubmit = on_resubmit

    def _job(self) -> dict[str, Any]:
        from .. import batch_client
        return batch_client.describe(self.client, self.job_id)

    def state(self) -> tuple[str, bool]:
        status = str(self._job().get("status", "UNKNOWN"))
        return status, status in ("SUCCEEDED", "FAILED")

    def stop(self) -> str:
        from .. import batch_client
        return batch_client.cancel(self.client, self.job_id, "stopped by jobgen watch")

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        from .. import batch_client
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
        answer = batch_client._call(self.client.submit_job, **request)
        old, self.job_id = self.job_id, str(answer["jobId"])
        if self.on_resubmit is not None:
            self.on_resubmit(self.job_id)
        done.append(f"submitted again as {self.job_id} (was {old})")
        return "; ".join(done)


# --- rollback ----------------------------------------------------------------------------------

def _complete_steps(root: Path) -> list[int]:
    """Steps of jobgen's payload checkpoints (payload/common/checkpoints.py) that have their
    marker: the ones a resume may load."""
    steps = []
    for marker in root.glob("step_*/COMPLETE"):
        text = marker.parent.name[5:]
        try:
            info = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if text.isdigit() and isinstance(info, dict) and info.get("step") == int(text):
            steps.append(int(text))
    return steps


def rollback_target(run_dir: Path, before: int) -> tuple[Optional[int], str]:
    """The newest checkpoint step below `before`, and the layout found ("jobgen", "nemo"), or
    (None, why)."""
    ours = run_dir / "train" / "checkpoints"
    if any(ours.glob("step_*/COMPLETE")):
        steps = [s for s in _complete_steps(ours) if s < before]
        return (max(steps), "jobgen") if steps else (None, f"no complete checkpoint in {ours} "
                                                            f"before step {before}")
    nemo = run_dir / "nemo" / "checkpoints"
    ckpts = _nemo_checkpoints(nemo)
    if ckpts:
        steps = [s for s, _ in ckpts if s < before]
        return (max(steps), "nemo") if steps else (None, f"no checkpoint in {nemo} before "
                                                         f"step {before}")
    return None, (f"no checkpoints under {run_dir} that jobgen can roll back (jobgen's payloads' "
                  "train/checkpoints/step_N folders, NeMo's nemo/checkpoints/*.ckpt)")


def _nemo_checkpoints(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for path in root.rglob("*.ckpt"):
            match = NEMO_STEP.search(path.name)
            if match:
                out.append((int(match.group(1)), path))
    return out


def roll_back(run_dir: Path, target: int, layout: str) -> str:
    """Move every checkpoint newer than `target` aside, into a `rolled-back-<time>` folder next
    to the checkpoints (nothing is deleted), so that the resume picks `target`."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved = []
    if layout == "jobgen":
        root = run_dir / "train" / "checkpoints"
        aside = root.parent / f"rolled-back-{stamp}"
        for entry in sorted(root.glob("step_*")):
            text = entry.name[5:]
            if text.isdigit() and int(text) > target:
                aside.mkdir(parents=True, exist_ok=True)
                shutil.move(str(entry), str(aside / entry.name))
                moved.append(entry.name)
        tag = f"step_{target:08d}"
        tmp = root / f".latest.tmp.{os.getpid()}"
        tmp.write_text(tag, encoding="utf-8")
        os.replace(tmp, root / "latest")
    else:
        root = run_dir / "nemo" / "checkpoints"
        aside = root.parent / f"rolled-back-{stamp}"
        for step, path in _nemo_checkpoints(root):
            if step > target:
                relative = path.relative_to(root)
                (aside / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(path), str(aside / relative))
                moved.append(str(relative))
    if not moved:
        return f"resuming from step {target}; no newer checkpoint to move"
    return (f"resuming from step {target}; moved {len(moved)} newer checkpoint(s) "
            f"({', '.join(moved)}) to {aside}")


# --- notification ------------------------------------------------------------------------------

def notify(command: str, payload: dict[str, Any], env: dict[str, str]) -> tuple[bool, str]:
    """Run the user's notification command with `sh -c`: the alert reaches it only as
    environment variables and as JSON on stdin, never inside the command text."""
    full = dict(os.environ, **env)
    try:
        proc = subprocess.run(["sh", "-c", command], input=json.dumps(payload) + "\n",
                              capture_output=True, text=True, env=full,
                              timeout=NOTIFY_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"the notification command ran past {NOTIFY_TIMEOUT_S} s and was stopped"
    except OSError as exc:
        return False, f"could not run the notification command: {exc.strerror}"
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
    if proc.returncode != 0:
        return False, f"the notification command exited with status {proc.returncode}: {tail[0]}"
    return True, "notified"
