"""What a SageMaker or EKS job meets between attempts, rehearsed on CPU with the real entrypoints
(env/containers/), the two-pass flow and the smoke trainer:

- a **multi-instance SageMaker retry**: two emulated instances, each with its own /opt/ml (its
  own disk), whose checkpoint folders (CheckpointConfig's LocalPath) are synced to one S3 URI on
  moto's server over HTTP and restored whole on every instance of the next attempt, as SageMaker
  documents it ("the checkpoints from this S3 bucket are restored to checkpoint_local_path in each
  instance"). One instance's part of the newest step never reaches S3: both instances resume
  from the step before, each prunes its own disk to `keep`, and the compile cache, restored with
  the checkpoints, spares the retry its compile pass;
- a **time limit**: SIGTERM to each container's first process (what SageMaker does at
  MaxRuntimeInSeconds, and Kubernetes at activeDeadlineSeconds), within the service's grace
  period, gives a checkpoint of the step just trained before the containers exit, and the next
  attempt resumes from it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_batch_client import _aws_env, aws, moto_inprocess, moto_url  # noqa: E402,F401

from jobgen import api  # noqa: E402
from jobgen.backends import declaration  # noqa: E402
from jobgen.backends.local import runner as local_runner
from jobgen.backends.sagemaker.request import training_job  # noqa: E402

RECIPE = "neox20b"   # a Trainium recipe: --smoke runs payload/smoke/train.py, one rank per node
KEEP = 3             # the rehearsal keeps min(recipe checkpoint.keep, 3)
EVERY = 4            # and saves every 4 of its 24 steps
STEPS = 24


class Containers:
    """The emulated instances (or pods) of one attempt, each its own process group whose first
    process is the container's entrypoint, output in a file per node."""

    def __init__(self, spec: Any, job_id: str, folder: Path, label: str = "",
                 **env: str) -> None:
        self.commands = local_runner.commands(spec, job_id)
        self.run_name = spec.run_name
        self.logs = [folder / f"{label or job_id}-node-{i}.log"
                     for i in range(len(self.commands))]
        self.env = env
        self.procs: list[subprocess.Popen] = []

    def start(self) -> Containers:
        for (argv, env), log in zip(self.commands, self.logs):
            full = dict(os.environ, **env, **self.env)
            full["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), full["PATH"]])
            with open(log, "w", encoding="utf-8") as out:
                self.procs.append(subprocess.Popen(argv, env=full, stdout=out,
                                                   stderr=subprocess.STDOUT,
                                                   start_new_session=True))
        return self

    def text(self, node: int) -> str:
        return self.logs[node].read_text(encoding="utf-8", errors="replace")

    def events(self, node: int, kind: str) -> list[dict[str, Any]]:
        found = []
        for line in self.text(node).splitlines():
            if line.startswith('{"event": "%s"' % kind):
                found.append(json.loads(line))
        return found

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                    for proc in self.procs]
        except subprocess.TimeoutExpired:
            self.kill()
            tails = "\n".join(self.text(i)[-2000:] for i in range(len(self.logs)))
            raise AssertionError(f"the containers did not end within {timeout} s:\n"
                                 + tails) from None

    def wait_for_step(self, step: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e["phase"] == "train" and e["step"] >= step for e in self.events(0, "step")):
                return
            if any(proc.poll() is not None for proc in self.procs):
                break
            time.sleep(0.2)
        self.kill()
        raise AssertionError(f"training never reached step {step}:\n" + self.text(0)[-3000:])

    def terminate_first_processes(self) -> None:
        """SIGTERM to each container's first process only, as the service sends it."""
        for proc in self.procs:
            os.kill(proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _index_builds(attempt: Containers, node: int) -> list[str]:
    """The passes in which this instance's leader built the stand-in NeMo index file."""
    text = attempt.text(node)
    return [name for name in ("compile", "train")
            if f"smoke-train: node {node} (rank {node}) built the {name} pass's index" in text]


def _scratch(sync: CheckpointSync, attempt: Containers, node: int) -> Path:
    """The instance's /tmp/jobgen/<run>/index_mappings (its own, as on SageMaker)."""
    local = sync.local_path(attempt, node)       # ROOT/algo-N/opt/ml/checkpoints
    return local.parents[2] / "tmp" / "jobgen" / attempt.run_name / "index_mappings"


def _steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in folder.glob("step_*") if p.is_dir())


# --- SageMaker's checkpoint sync, emulated against S3 on moto's server -------------------------

class CheckpointSync:
    """CheckpointConfig as SageMaker applies it: what each instance writes or deletes under its
    LocalPath is written or deleted under the one S3 URI (instances' files side by side; "if a
    checkpoint is deleted in the container, it will also be deleted in the S3 folder"), and a
    new attempt's instances each get the whole prefix back before the container starts. Here
    the mirror runs once an attempt ended, from what each disk holds then against what it was
    given: a key two instances wrote or deleted fails the test (their syncs would race)."""

    def __init__(self, url: str, spec: Any) -> None:
        import boto3
        config = training_job(spec)["CheckpointConfig"]
        self.local, uri = config["LocalPath"], config["S3Uri"]
        self.bucket, _, self.prefix = uri[len("s3://"):].partition("/")
        self.s3 = boto3.client("s3", endpoint_url=url, region_name="us-west-2")
        try:
            self.s3.create_bucket(Bucket=self.bucket, CreateBucketConfiguration={
                "LocationConstraint": "us-west-2"})
        except self.s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        # What each instance of an attempt was given (the restore): key -> (size, mtime).
        self.given: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}

    def local_path(self, attempt: Containers, node: int) -> Path:
        """An instance's LocalPath on this machine (the rehearsal's /opt/ml of that instance)."""
        config_dir = Path(attempt.commands[node][1]["SM_INPUT_CONFIG_DIR"])
        return config_dir.parents[1] / self.local[len("/opt/ml/"):]

    @staticmethod
    def _files(local: Path) -> dict[str, tuple[int, int]]:
        return {p.relative_to(local).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
                for p in local.rglob("*") if p.is_file()}

    def upload(self, attempt: Containers) -> int:
        """Mirror each instance's writes and deletes; the number of keys written."""
        sent, owner = 0, {}
        for node in range(len(attempt.commands)):
            local = self.local_path(attempt, node)
            given = self.given.get((str(local), node), {})
            now = self._files(local)
            wrote = sorted(k for k, v in now.items() if given.get(k) != v)
            for key in wrote + sorted(set(given) - set(now)):
                assert key not in owner, f"{key}: written or deleted by instances " \
                                         f"{owner[key]} and {node}"
                owner[key] = node
            for key in wrote:
                self.s3.upload_file(str(local / key), self.bucket, f"{self.prefix}/{key}")
                sent += 1
            for key in set(given) - set(now):
                self.s3.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")
        return sent

    def keys(self) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                   Prefix=self.prefix + "/")
        return [item["Key"][len(self.prefix) + 1:] for page in pages
                for item in page.get("Contents", [])]

    def restore(self, attempt: Containers) -> None:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                   Prefix=self.prefix + "/")
        keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
        assert keys, "nothing in S3 to restore"
        for node in range(len(attempt.commands)):
            local = self.local_path(attempt, node)
            for key in keys:
                target = local / key[len(self.prefix) + 1:]
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(self.bucket, key, str(target))
            self.given[(str(local), node)] = self._files(local)

    def lose(self, relative: str) -> None:
        """An upload that never arrived (an instance stopped while SageMaker was syncing)."""
        self.s3.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{relative}")


def _port() -> str:
    """A free rendezvous port: rehearsals running side by side must not share the recipe's."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"job.master_port={s.getsockname()[1]}"


def _sagemaker_spec(compile_mode: Any = "auto") -> Any:
    return api.job_spec(RECIPE, 2, site="sagemaker", backend="sagemaker", smoke=True,
                        run_name=f"ck-{uuid.uuid4().hex[:8]}", compile_mode=compile_mode,
                        overrides=(_port(),))


@pytest.mark.moto
@pytest.mark.slow
def test_sagemaker_retry_resumes_every_instance_from_a_step_all_of_them_hold(
        aws: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    spec = _sagemaker_spec()
    local_runner.place_payload(spec)
    sync = CheckpointSync(aws, spec)
    ckpts = f"{spec.run_name}/train/checkpoints"

    # Attempt 1: the job fails before step 11 (an instance lost: SageMaker retries the job).
    first = Containers(spec, "attempt-1", tmp_path, JOBGEN_SMOKE_FAIL_AT_STEP="11").start()
    assert first.wait(timeout=300) == [1, 1], first.text(0)[-3000:]
    assert [e["phase"] for e in first.events(0, "start")] == ["compile", "train"]
    # The compile pass's scratch save (a whole checkpoint) went to the instance's unsynced
    # scratch, not into the folder SageMaker uploads.
    (scratch_save,) = first.events(0, "compile_save")
    assert f"/algo-1/tmp/jobgen/{spec.run_name}/compile-save/" in scratch_save["path"]
    for node in (0, 1):
        # Each instance cleared, wrote and sealed its own part of each step on its own disk.
        disk = sync.local_path(first, node) / ckpts
        assert _steps(disk) == [4, 8]
        assert (disk / "step_00000008" / f"optim-rank-{node:05d}.pt").is_file()
        assert (disk / "step_00000008" / f"COMPLETE.node-{node:05d}").is_file()
        # NeMo's dataset index build stood in (rank 0 writes, every rank reads): the FSx
        # channel is read-only, so each instance built its own copy in its own scratch, in
        # both passes (their sample counts differ, as NeMo's do), and read it.
        assert _index_builds(first, node) == ["compile", "train"], first.text(node)[-2000:]
        assert len(list(_scratch(sync, first, node).glob("*_indexmap_*"))) == 2
    assert sync.upload(first) > 0   # no key written by both instances
    # Instance 2's shard of step 8 never reached S3.
    sync.lose(f"{ckpts}/step_00000008/optim-rank-00001.pt")

    # Attempt 2, on fresh instances that each get the whole S3 prefix back.
    second = Containers(spec, "attempt-2", tmp_path)
    sync.restore(second)
    second.start()
    assert second.wait(timeout=300) == [0, 0], second.text(0)[-3000:]
    # Both instances resume from step 4 (step 8 lacks a part): node 1 starts at step 5 too.
    assert [e["step"] for e in second.events(0, "resume")] == [4]
    for node in (0, 1):
        beats = [e["step"] for e in second.events(node, "beat") if e["node"] == node]
        assert beats[0] == 5 and beats[-1] == STEPS, (node, beats)
        # The compile cache came back with the checkpoints: no compile pass, no recompile.
        assert "compile pass skipped" in second.text(node)
        assert [e["phase"] for e in second.events(node, "start")] in (["train"], [])
        # Every instance pruned its own part of every step (the restored steps 4 and 8
        # included) to `keep`; the other instance's restored files stay, untouched.
        disk = sync.local_path(second, node) / ckpts
        assert sorted(int(p.parent.name.split("_")[1]) for p in disk.glob(
            f"step_*/COMPLETE.node-{node:05d}")) == [16, 20, 24]
        assert (disk / "step_00000004" / f"optim-rank-{1 - node:05d}.pt").is_file()
        assert _index_builds(second, node) == ["train"]   # fresh scratch: built again
    assert [e["step"] for e in second.events(0, "done")] == [STEPS]
    # Neither instance wrote or deleted a key of the other's, and the prefix the next retry
    # restores holds the `keep` newest steps only.
    sync.upload(second)
    assert sorted({int(k.split("/")[3].split("_")[1]) for k in sync.keys()
                   if k.startswith(f"{ckpts}/step_")}) == [16, 20, 24]


@pytest.mark.moto
@pytest.mark.slow
def test_sagemaker_time_limit_saves_before_the_kill_and_the_next_job_resumes(
        aws: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.chdir(tmp_path)
    spec = _sagemaker_spec("never")   # the compile pass is the retry test's
    local_runner.place_payload(spec)
    sync = CheckpointSync(aws, spec)
    ckpts = f"{spec.run_name}/train/checkpoints"
    grace = declaration("sagemaker").stop_grace_s   # MaxRuntime: SIGTERM, SIGKILL 120 s later

    first = Containers(spec, "attempt-1", tmp_path, JOBGEN_SMOKE_STEP_DELAY="0.3").start()
    first.wait_for_step(6)
    first.terminate_first_processes()
    assert first.wait(timeout=grace) == [143, 143], first.text(0)[-3000:]
    (stopped,) = first.events(0, "stopped")
    assert 6 <= stopped["step"] < STEPS and stopped["signal"] == "USR1"
    for node in (0, 1):
        disk = sync.local_path(first, node) / ckpts
        assert _steps(disk)[-1] == stopped["step"]   # the step just trained, on each disk
        assert "exiting 143" in first.text(node)
    sync.upload(first)

    second = Containers(spec, "attempt-2", tmp_path)
    sync.restore(second)
    second.start()
    assert second.wait(timeout=300) == [0, 0], second.text(0)[-3000:]
    assert [e["step"] for e in second.events(0, "resume")] == [stopped["step"]]
    assert [e["step"] for e in second.events(0, "done")] == [STEPS]


@pytest.mark.slow
def test_eks_deadline_saves_before_the_kill_and_the_restarted_pods_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # The default site: its run folder is relative (here), where the example site's is on FSx.
    spec = api.job_spec(RECIPE, 2, backend="eks", smoke=True, run_name="deadline",
                        compile_mode="never", overrides=(_port(),))
    local_runner.place_payload(spec)
    grace = declaration("eks").stop_grace_s   # the pods' terminationGracePeriodSeconds
    first = Containers(spec, "job", tmp_path, JOBGEN_SMOKE_STEP_DELAY="0.3").start()
    first.wait_for_step(6)
    first.terminate_first_processes()
    assert first.wait(timeout=grace) == [143, 143], first.text(0)[-3000:]
    (stopped,) = first.events(0, "stopped")
    run_dir = Path(first.commands[0][1]["JOBGEN_RUN_DIR"])
    assert _steps(run_dir / "train" / "checkpoints")[-1] == stopped["step"]
    # Each node wrote its request down before signalling (a trainer still starting reads it).
    assert sorted(p.parent.name for p in run_dir.glob("logs/*/*/node-*/stop-requested")) == \
        ["node-0", "node-1"]

    # The pods again (the Job's next attempt): they resume from the step saved on SIGTERM.
    second = Containers(spec, "job", tmp_path, "restarted").start()
    assert second.wait(timeout=300) == [0, 0], second.text(0)[-3000:]
    assert [e["step"] for e in second.events(0, "resume")] == [stopped["step"]]
    assert [e["step"] for e in second.events(0, "done")] == [STEPS]


# --- what the rendered jobs say about stopping and the compile cache -----------------------------

def test_sagemaker_and_eks_jobs_ask_the_trainers_to_save_on_sigterm() -> None:
    from jobgen.backends.eks.manifests import manifests
    request = training_job(api.job_spec("llama2-7b", 16, site="sagemaker", backend="sagemaker"))
    assert request["Environment"]["JOBGEN_STOP_SIGNAL"] == "USR1"
    from jobgen.backends.eks.jobset import child_job
    job = child_job(manifests(api.job_spec("llama2-7b", 4, site="sagemaker", backend="eks"))[-1])
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == declaration("eks").stop_grace_s
    assert {"name": "JOBGEN_STOP_SIGNAL", "value": "USR1"} in pod["containers"][0]["env"]


def test_a_sagemaker_compile_cache_outside_the_restored_folder_is_refused() -> None:
    import dataclasses

    from jobgen.plumbing.errors import ConfigError
    spec = api.job_spec("neox20b", 4, site="sagemaker", backend="sagemaker")
    site = spec.site
    assert site.sagemaker is not None
    moved = dataclasses.replace(site, sagemaker=dataclasses.replace(
        site.sagemaker, compile_cache="/opt/ml/compile-cache"))
    with pytest.raises(ConfigError, match="sagemaker.compile_cache: /opt/ml/compile-cache is "
                                          "outside /opt/ml/checkpoints"):
        training_job(dataclasses.replace(spec, site=moved))
