"""`jobgen run --backend sagemaker`: the training job's instances emulated on this machine."""
from __future__ import annotations

import json
from pathlib import Path

from ...job.spec import JobSpec
from ...plumbing import fsio
from ..local.runner import image_moves, relocate
from .request import SCRATCH, training_job


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
