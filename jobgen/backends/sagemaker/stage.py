"""The export stage as a SageMaker training job (jobgen/payloads/stages.py): one instance, the
training job's image, running the export program on the run's checkpoints as SageMaker left them.

SageMaker jobs share no disk: the training job's instances each sync their checkpoint folder to
the run's S3 prefix. The export job reads that prefix's training folder as a FastFile channel
(streamed from S3 as the program opens it: one step's shards, not every kept step) and writes
RUN/export, its own checkpoint folder, which SageMaker restores (earlier exports) when the job
starts and syncs to RUN/export/ under the run's prefix (docs/model-out.md).
"""
from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any, Optional, Sequence

from ...images import catalog as images
from ...job.spec import JobSpec
from ...payloads.base import say_once
from ...plumbing.errors import ConfigError
from .request import CHECKPOINTS, _sdk, instance_type, job_name, training_job, validate

# The channel of the training pass's folder (RUN/train under the run's S3 prefix): SageMaker
# mounts channel NAME at /opt/ml/input/data/NAME.
TRAINED = "run-train"
TRAINED_PATH = f"/opt/ml/input/data/{TRAINED}"
STAGES = ("export",)                 # the stages a SageMaker job runs
PAYLOADS = ("smp_fsdp",)             # whose export reads --output-dir RUN/train (stages.py)
# What the export holds at once, in bytes a parameter: at most four fp32 copies of the weights
# (the model it builds, the ranks' slices as read, the merged tensors, the proof's own load), on
# an instance that keeps a tenth of its memory for the system and SageMaker's agents.
EXPORT_BYTES_PER_PARAM = 16
USABLE = 0.9
# Memory-optimised CPU instances (8 GiB a vCPU), smallest first: the default export instance.
R5_GIB = {"ml.r5.large": 16, "ml.r5.xlarge": 32, "ml.r5.2xlarge": 64, "ml.r5.4xlarge": 128,
          "ml.r5.8xlarge": 256, "ml.r5.12xlarge": 384, "ml.r5.16xlarge": 512,
          "ml.r5.24xlarge": 768}
RETRIES = 1                          # SageMaker's retry of an internal failure, as Batch's


def export_instance_type(spec: JobSpec) -> str:
    """The one instance the export runs on: the rehearsal's CPU instance; the site's
    sagemaker.export_instance_type; else the smallest ml.r5 whose memory holds what the export
    holds (export_smp.py runs on CPU: no accelerator is needed)."""
    sm = spec.site.sagemaker
    assert sm is not None
    if spec.rehearsal is not None:
        return instance_type(spec)
    if sm.export_instance_type:
        return sm.export_instance_type
    from ...job.sizes import parameters
    need = parameters(spec) * EXPORT_BYTES_PER_PARAM / 2 ** 30
    for kind, gib in R5_GIB.items():
        if gib * USABLE >= need:
            return kind
    raise ConfigError(f"site {spec.site.name}: sagemaker.export_instance_type: the export of "
                      f"{spec.recipe.name} holds about {need:.0f} GiB, more than any ml.r5 "
                      "instance has: name an instance type with the memory")


def _arguments(spec: JobSpec, args: Sequence[str]) -> list[str]:
    """The program's arguments with the training pass's folder read from its channel."""
    trained = posixpath.join(spec.run_dir, "train")
    if trained not in args:
        raise ConfigError(f"{spec.source}: --stage export: the export of payload "
                          f"{spec.recipe.payload} does not read {trained} (--output-dir)")
    return [TRAINED_PATH if a == trained else a for a in args]


def stage_job(spec: JobSpec, name: str, sources: Sequence[str] = (),
              step: Optional[int] = None) -> dict[str, Any]:
    """The CreateTrainingJob request of stage `name`, validated offline as the training job's."""
    from ...payloads import stages
    if name not in STAGES:
        raise ConfigError(f"--stage {name}: --backend sagemaker runs the export stage only "
                          f"(slurm and batch run {name})")
    if spec.recipe.payload not in PAYLOADS:
        raise ConfigError(f"{spec.source}: --stage export: --backend sagemaker exports the runs "
                          f"of payload {', '.join(PAYLOADS)} only (this one is "
                          f"{spec.recipe.payload})")
    last = spec.rehearsal.max_steps if spec.rehearsal else spec.recipe.schedule.max_steps
    if step is not None and step > last:
        raise ConfigError(f"--step {step}: {spec.source} trains {last} steps, so no checkpoint "
                          f"of step {step} can exist")
    train = training_job(spec)      # the run's own job: its image, role, network and prefix
    work = stages.work(name, spec, tuple(sources), step)
    for note in work.notes:
        say_once(note)
    assert len(work.tasks) == 1, "an export is one task"
    sm = spec.site.sagemaker
    assert sm is not None
    run = posixpath.relpath(spec.run_dir, CHECKPOINTS)   # RUN-NAME: its place in the prefix
    prefix = train["CheckpointConfig"]["S3Uri"].rstrip("/") + "/" + run
    kind = export_instance_type(spec)
    if kind not in _sdk().shape_for("TrainingInstanceType").enum:
        raise ConfigError(f"site {spec.site.name}: sagemaker.export_instance_type: SageMaker "
                          f"training has no {kind} instances")
    algorithm = train["AlgorithmSpecification"]
    # The trained folder streamed from S3 (FastFile: the TrainingInputMode API reference), the
    # data the proof's batch is read from, as training reads it.
    channels = [{"ChannelName": TRAINED, "InputMode": "FastFile", "DataSource": {
        "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"{prefix}/train/",
                         "S3DataDistributionType": "FullyReplicated"}}},
        *train.get("InputDataConfig", [])]
    request: dict[str, Any] = {
        "TrainingJobName": job_name(spec),
        "AlgorithmSpecification": {
            "TrainingImage": algorithm["TrainingImage"], "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", posixpath.join(images.declared().payload_dir,
                                                              work.program)],
            "ContainerArguments": _arguments(spec, work.tasks[0]),
        },
        "RoleArn": train["RoleArn"],
        "InputDataConfig": channels,
        "OutputDataConfig": train["OutputDataConfig"],
        "ResourceConfig": {"InstanceType": kind, "InstanceCount": 1,
                           "VolumeSizeInGB": sm.volume_size_gb},
        "StoppingCondition": {"MaxRuntimeInSeconds": sm.max_runtime_hours * 3600},
        # RUN/export: restored from the prefix when the job starts (SageMaker's "Resume
        # training from a checkpoint"), so an earlier export of the step is seen, and synced
        # back to it as the export writes.
        "CheckpointConfig": {"S3Uri": f"{prefix}/{stages.EXPORT_ROOT}",
                             "LocalPath": posixpath.join(spec.run_dir, stages.EXPORT_ROOT)},
        "Environment": {"JOBGEN_PAYLOAD_DIR": images.declared().payload_dir,
                        "JOBGEN_PAYLOAD_DIGEST": spec.payload_digest, "PYTHONUNBUFFERED": "1"},
        "RetryStrategy": {"MaximumRetryAttempts": RETRIES},
        "EnableNetworkIsolation": False,
        "Tags": [*train["Tags"], {"Key": "jobgen:stage", "Value": name}],
    }
    if "VpcConfig" in train:        # the FSx data channel is reached inside the VPC
        request["VpcConfig"] = train["VpcConfig"]
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:8]
    request["TrainingJobName"] = f"{request['TrainingJobName'][:46]}-{name}-{digest}"
    validate(request, f"{name} job for {spec.source}")
    return request
