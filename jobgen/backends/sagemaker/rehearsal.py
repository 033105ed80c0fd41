"""`jobgen run --backend sagemaker`: the training job's instances emulated on this machine, and
the export stage's one instance (`--stage export`), which reads what SageMaker's checkpoint sync
left of the run: every earlier emulated instance's checkpoint folder, as one S3 prefix."""
from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import stat
from pathlib import Path
from typing import Optional

from ...job.spec import JobSpec
from ...plumbing import fsio
from ...plumbing.errors import ConfigError
from ..local.runner import image_moves, rehearsal_folder, relocate
from .request import CHECKPOINTS, SCRATCH, training_job
from .stage import STAGES, TRAINED_PATH, stage_job  # noqa: F401  (STAGES: for `run --stage`)


def commands(spec: JobSpec, job_id: str, root: Path,
             write: bool = True) -> list[tuple[list[str], dict[str, str]]]:
    """Each instance of the rendered CreateTrainingJob request, emulated: the container's
    entrypoint and arguments with the request's Environment, TRAINING_JOB_NAME, and what
    SageMaker writes on every instance (/opt/ml/input/config/resourceconfig.json and
    hyperparameters.json), under ROOT/algo-N/opt/ml: each instance has its own disk, as on
    SageMaker (the run folder, its checkpoints and logs are node 0's under algo-1; its scratch,
/tmp/jobgen, under ROOT/algo-N/tmp/jobgen). Those files
    are written only with `write` (not for a dry run)."""
    request = training_job(spec)
    site = spec.site.sagemaker
    assert site is not None
    hosts = [f"algo-{i + 1}" for i in range(spec.nodes)]
    algorithm = request["AlgorithmSpecification"]
    out = []
    for host in hosts:
        opt_ml = root / host / "opt" / "ml"
        # The instance's scratch too is its own (NeMo's index files: each instance builds them).
        moves = image_moves(spec, write) + [("/opt/ml/", f"{opt_ml}/"),
                                            (SCRATCH + "/", f"{root / host}{SCRATCH}/")]
        config = opt_ml / "input" / "config"
        if write:
            config.mkdir(parents=True, exist_ok=True)
            fsio.write_file(config / "resourceconfig.json", json.dumps({
                "current_host": host, "current_instance_type": request["ResourceConfig"][
                    "InstanceType"], "current_group_name": "homogeneousCluster",
                "hosts": hosts, "network_interface_name": "eth0"}))
            fsio.write_file(config / "hyperparameters.json", json.dumps({
                k: relocate(v, moves) for k, v in request["HyperParameters"].items()}))
        env = {k: relocate(v, moves) for k, v in request["Environment"].items()}
        env.update({"TRAINING_JOB_NAME": job_id, "SM_INPUT_CONFIG_DIR": str(config),
                    # algo-1 resolves inside SageMaker's network; here every instance is local
                    "JOBGEN_MAIN_HOST": "127.0.0.1"})
        argv = [relocate(a, moves) for a in algorithm["ContainerEntrypoint"]
                + algorithm["ContainerArguments"]]
        out.append((argv, env))
    return out


def run_folder(spec: JobSpec, root: Path) -> str:
    """The run folder as it lies on this machine: on the first instance's own disk, where the
    job's /opt/ml is under ROOT/algo-1/opt/ml (the closing line names it, not /opt/ml)."""
    return relocate(spec.run_dir, [("/opt/ml/", f"{root / 'algo-1' / 'opt' / 'ml'}/")])


# --- the export stage's instance -------------------------------------------------------------

JOB = re.compile(r"local-(\d+)-(\d+)")   # runs.ledger.local_job_id's: start time, process


def synced(spec: JobSpec, relative: str, job_id: str) -> list[Path]:
    """What the run's S3 prefix holds at `relative` (a path under the instances' checkpoint
    folder), as SageMaker's sync left it: that folder of every emulated instance of every
    earlier rehearsal job here, oldest job first (a later upload replaces a key)."""
    jobs = []
    for entry in rehearsal_folder(False).glob("local-*"):
        found = JOB.fullmatch(entry.name)
        if found and entry.name != job_id:
            jobs.append(((int(found[1]), int(found[2])), entry))
    out = []
    for _, job in sorted(jobs):
        for host in sorted(job.glob("algo-*"), key=lambda h: int(h.name[5:] or 0)):
            folder = host / CHECKPOINTS.lstrip("/") / relative
            if folder.is_dir():
                out.append(folder)
    return out


def _download(sources: list[Path], target: Path) -> None:
    """SageMaker's copy of an S3 prefix onto the instance's disk (a channel, a restore)."""
    for source in sources:
        for folder, _, files in os.walk(source):
            here = target / Path(folder).relative_to(source)
            here.mkdir(parents=True, exist_ok=True)
            for name in files:
                if stat.S_ISREG(os.lstat(Path(folder, name)).st_mode):   # S3 holds files only
                    shutil.copy2(Path(folder, name), here / name)


class StageInstance:
    """The export job's one instance (stage.py's request), under ROOT/algo-1 as a training
    job's are: its channel of the run's training folder and its restored export folder copied
    from the emulated prefix (FastFile streams the same bytes), then its container's command."""

    def __init__(self, spec: JobSpec, name: str, job_id: str, root: Path) -> None:
        self.spec, self.name, self.job_id, self.root = spec, name, job_id, root
        self.opt_ml = root / "algo-1" / "opt" / "ml"
        self.run_dir = relocate(spec.run_dir, [("/opt/ml/", f"{self.opt_ml}/")])
        self.trained = Path(relocate(TRAINED_PATH, [("/opt/ml/", f"{self.opt_ml}/")]))
        self.shown = ""              # the channel's S3 prefix, for refusals (lay_out)

    def lay_out(self) -> None:
        """The channel and the restore; refused in one line where no rehearsal of the run was
        trained here."""
        from ...payloads.stages import EXPORT_ROOT
        run = posixpath.relpath(self.spec.run_dir, CHECKPOINTS)
        trained = synced(self.spec, f"{run}/train", self.job_id)
        if not trained:
            raise ConfigError(f"{rehearsal_folder(False)}: no SageMaker rehearsal of run "
                              f"{self.spec.run_name} to export (train first: jobgen run "
                              f"{self.spec.recipe.name} --smoke --backend sagemaker --nodes "
                              f"{self.spec.nodes})")
        uri = stage_job(self.spec, self.name)["InputDataConfig"][0]["DataSource"][
            "S3DataSource"]["S3Uri"]
        self.shown = f"{uri}checkpoints (as the SageMaker rehearsals here left it)"
        _download(trained, self.trained)
        _download(synced(self.spec, f"{run}/{EXPORT_ROOT}", self.job_id),
                  Path(self.run_dir, EXPORT_ROOT))

    def command(self, step: Optional[int], write: bool = True) -> tuple[list[str], dict[str, str]]:
        """The container's entrypoint and arguments with the request's Environment, and the
        files SageMaker writes on the instance (with `write`)."""
        request = stage_job(self.spec, self.name, (), step)
        moves = image_moves(self.spec, write) + [("/opt/ml/", f"{self.opt_ml}/")]
        config = self.opt_ml / "input" / "config"
        if write:
            config.mkdir(parents=True, exist_ok=True)
            fsio.write_file(config / "resourceconfig.json", json.dumps({
                "current_host": "algo-1", "current_instance_type": request["ResourceConfig"][
                    "InstanceType"], "current_group_name": "homogeneousCluster",
                "hosts": ["algo-1"], "network_interface_name": "eth0"}))
            fsio.write_file(config / "hyperparameters.json", "{}")
        env = {k: relocate(v, moves) for k, v in request["Environment"].items()}
        env.update({"TRAINING_JOB_NAME": self.job_id, "SM_INPUT_CONFIG_DIR": str(config)})
        algorithm = request["AlgorithmSpecification"]
        argv = [relocate(a, moves) for a in algorithm["ContainerEntrypoint"]
                + algorithm["ContainerArguments"]]
        return argv, env

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def stage_instance(spec: JobSpec, name: str, job_id: str, write: bool = True) -> StageInstance:
    """The instance of stage `name`'s job `job_id`, laid out (with `write`)."""
    instance = StageInstance(spec, name, job_id, rehearsal_folder(write) / job_id)
    if write:
        try:
            instance.lay_out()
        except BaseException:
            instance.discard()
            raise
    return instance
