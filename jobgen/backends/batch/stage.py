"""A stage before training on AWS Batch (jobgen/payloads/stages.py): one single-node container
job definition on the site's queue, in the training job's image (whose payload snapshot holds
the stage's program), and its SubmitJob requests, one per task. The training job of
`--stages prepare,train` depends on every one of them (SubmitJob's dependsOn).
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
from .definition import EVALUATE_ON_EXIT, container_secrets, definition_name

# A job depends on at most 20 jobs (SubmitJob's dependsOn).
MAX_DEPENDS_ON = 20


def argvs(spec: JobSpec, name: str, sources: Sequence[str],
          step: Optional[int] = None) -> list[list[str]]:
    """Each task's command in the image: the stage's program under the image's payload folder
    with that task's arguments."""
    from ...payloads import stages
    work = stages.work(name, spec, tuple(sources), step)
    for note in work.notes:
        say_once(note)
    program = posixpath.join(images.declared().payload_dir, work.program)
    return [["python3", program, *task] for task in work.tasks]


def _resources(spec: JobSpec) -> list[dict[str, str]]:
    """One instance's CPUs and memory of the queue's compute environment (its CPU instance
    type for a --smoke job); no accelerator is asked for."""
    site, platform = spec.site, spec.platform
    assert site.batch is not None
    if spec.rehearsal is not None and site.batch.smoke is not None:
        vcpus, memory = site.batch.smoke.vcpus, site.batch.smoke.memory_mib
    else:
        vcpus = min(site.slurm.cpus_per_task, platform.batch_vcpus)
        memory = platform.batch_memory_mib
    return [{"type": "VCPU", "value": str(vcpus)}, {"type": "MEMORY", "value": str(memory)}]


def _hub_tokenizer(spec: JobSpec) -> bool:
    """Whether the recipe's tokenizer comes from the Hugging Face hub (a gated one needs
    HF_TOKEN): a hub name, not a folder (stages.py says so for every backend)."""
    tokenizer = spec.recipe.data.tokenizer or ""
    return "/" in tokenizer and not posixpath.isabs(tokenizer)


def job_definition(spec: JobSpec, name: str, argv: Sequence[str]) -> dict[str, Any]:
    """The RegisterJobDefinition request of stage `name` (command: its first task's), checked
    offline against botocore's model."""
    site = spec.site
    if site.batch is None:
        raise ConfigError(f"site {site.name}: has no batch section (job queue, images, roles)")
    container: dict[str, Any] = {"image": images.uri(spec, "batch"), "command": list(argv),
                                 "resourceRequirements": _resources(spec)}
    if site.batch.job_role_arn:
        container["jobRoleArn"] = site.batch.job_role_arn
    if site.batch.execution_role_arn:
        container["executionRoleArn"] = site.batch.execution_role_arn
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if site.batch.shared_volume:   # the data folder the stage writes, as training mounts it
        volumes = [{"name": "shared", "host": {"sourcePath": site.batch.shared_volume}}]
        mounts = [{"sourceVolume": "shared", "containerPath": site.batch.shared_volume,
                   "readOnly": False}]
    container.update({
        "environment": [{"name": "JOBGEN_PAYLOAD_DIR", "value": images.declared().payload_dir},
                        {"name": "JOBGEN_PAYLOAD_DIGEST", "value": spec.payload_digest}],
        "volumes": volumes, "mountPoints": mounts,
        "logConfiguration": {"logDriver": "awslogs",
                             "options": {"awslogs-group": site.batch.log_group}},
    })
    if site.batch.secrets:      # HF_TOKEN for a gated tokenizer: from the site's secret
        container["secrets"] = container_secrets(site, container["environment"])
    elif name == "prepare" and _hub_tokenizer(spec):
        say_once(f"note: site {site.name}: on Batch a gated tokenizer's HF_TOKEN comes from "
                 "a secret the site names (batch.secrets: {HF_TOKEN: ARN of a Secrets Manager "
                 "secret or an SSM parameter}); none is named, so the job reads the hub "
                 "without a token")
    # Retried where the infrastructure failed (a host gone, an image that would not start);
    # the program's own exit (78: a permanent input error) ends the job.
    retry = [dict(e) for e in EVALUATE_ON_EXIT if "onExitCode" not in e]
    jd: dict[str, Any] = {
        "jobDefinitionName": f"{definition_name(spec)}-{name}",
        "type": "container",
        "platformCapabilities": ["EC2"],
        "containerProperties": container,
        "retryStrategy": {"attempts": 2, "evaluateOnExit": retry},
        "timeout": {"attemptDurationSeconds": site.batch.timeout_hours * 3600},
        "tags": {"jobgen:recipe": spec.recipe.name, "jobgen:run": spec.run_name,
                 "jobgen:stage": name},
        "propagateTags": True,
    }
    digest = hashlib.sha256(json.dumps(jd, sort_keys=True).encode()).hexdigest()[:16]
    jd["tags"]["jobgen:hash"] = digest
    from .rules import botocore_errors
    problems = botocore_errors(jd)
    if problems:
        raise ConfigError(f"{name} job definition for {spec.source}: {problems[0]}")
    return jd


def depends_on(job_ids: Sequence[str]) -> list[dict[str, str]]:
    """SubmitJob's dependsOn: after every one of `job_ids` (single jobs: no type)."""
    if len(job_ids) > MAX_DEPENDS_ON:
        raise ConfigError(f"--stages: {len(job_ids)} prepare tasks, and a Batch job depends on "
                          f"at most {MAX_DEPENDS_ON} jobs: give at most {MAX_DEPENDS_ON} --from "
                          "inputs (data.shards)")
    return [{"jobId": job_id} for job_id in job_ids]
