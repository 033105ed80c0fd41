"""The AWS Batch backend: one multi-node-parallel job definition per job spec.

Every node runs the image's entrypoint (env/containers/entrypoint.sh) with the payload launcher
and the two passes' arguments; the entrypoint finds its node index and the main node's address
in the AWS_BATCH_* variables, and the main node's exit status ends the job.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .. import launch
from ..errors import ConfigError
from ..plan import Plan, PlannedFile
from ..render import render
from ..spec import JobSpec

TEMPLATE = "batch/job-definition.json.j2"

# Retry what the infrastructure broke (a host that went away, an image that could not be pulled
# or started); exit on everything else, which is the training's own failure. First match wins.
EVALUATE_ON_EXIT = (
    {"onStatusReason": "Host EC2*", "action": "RETRY"},
    {"onReason": "CannotPullContainerError*", "action": "RETRY"},
    {"onReason": "CannotStartContainerError*", "action": "RETRY"},
    {"onReason": "*", "action": "EXIT"},
)


DEFAULT_RDZV_TIMEOUT_S = 900


def entrypoint_args(lau: launch.Launch) -> list[str]:
    """LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG... (env/containers/entrypoint.sh)."""
    return [lau.launcher, str(len(lau.compile_args)), *lau.compile_args, *lau.train_args]


def definition_name(spec: JobSpec) -> str:
    """Batch names allow letters, digits, '-' and '_' only (no '.')."""
    return "jobgen-" + re.sub(r"[^A-Za-z0-9_-]", "-", spec.recipe.name)


def node_environment(spec: JobSpec, lau: launch.Launch,
                     compile_key: str) -> list[dict[str, str]]:
    """What every node's entrypoint reads (also used by `jobgen run` on this machine)."""
    site = spec.site
    timeout = site.batch.rendezvous_timeout_s if site.batch else DEFAULT_RDZV_TIMEOUT_S
    env = dict(launch.env_block(spec))
    env.update(launch.compile_cache_env(spec, site.paths.compile_cache))
    env.update({
        "MASTER_PORT": str(spec.recipe.job.master_port),
        "JOBGEN_RUN_DIR": spec.run_dir,
        "JOBGEN_PAYLOAD_DIR": spec.payload_dir,
        "JOBGEN_WORKERS_PER_NODE": str(spec.workers_per_node),
        "JOBGEN_WORKDIR": lau.workdir,
        "JOBGEN_PROGRAM": lau.program,
        "JOBGEN_COMPILE_WRAPPER": lau.compile_wrapper,
        "JOBGEN_COMPILE_MODE": spec.compile_mode,
        "JOBGEN_COMPILE_CACHE": site.paths.compile_cache,
        "JOBGEN_COMPILE_KEY": compile_key,
        "JOBGEN_RDZV_TIMEOUT": str(timeout),
        # The node count the trainer's flags were computed for; the entrypoint refuses another.
        "JOBGEN_NODES": str(spec.nodes),
    })
    if lau.files:
        env["JOBGEN_FILES_JSON"] = json.dumps(dict(lau.files), sort_keys=True)
    if lau.prepare:
        # [script under payload/, its arguments...]: every node runs it before the compile pass
        # (node filesystems are separate on Batch).
        env["JOBGEN_PREPARE_JSON"] = json.dumps(list(lau.prepare))
    return [{"name": k, "value": v} for k, v in env.items()]


def efa_devices(spec: JobSpec) -> tuple[str, ...]:
    """The EFA devices to map: as many as the site's launch template attaches (a site fact)."""
    site, platform = spec.site, spec.platform
    assert site.batch is not None
    count = (site.batch.efa_interfaces or {}).get(platform.name)
    where = f"site {site.name}: batch.efa_interfaces"
    if count is None:
        raise ConfigError(f"{where}: no entry for {platform.name}: say how many EFA interfaces "
                          f"your launch template attaches (0 to {platform.efa_interfaces}); "
                          "a device that is not on the host stops the container from starting")
    if not 0 <= count <= platform.efa_interfaces:
        raise ConfigError(f"{where}.{platform.name}: {count} is not between 0 and "
                          f"{platform.efa_interfaces} (the interfaces a {platform.name} has)")
    return platform.efa_devices[:count]


def job_definition(spec: JobSpec) -> dict[str, Any]:
    """The RegisterJobDefinition request for this spec, validated offline (with botocore:
    without the [batch] extra, one line that names it)."""
    from ..batch_client import require_sdk
    require_sdk("--backend batch", ("botocore",))
    site, platform = spec.site, spec.platform
    if site.batch is None:
        raise ConfigError(f"site {site.name}: has no batch section (job queue, images, roles)")
    image = (site.batch.images or {}).get(platform.name)
    if not image:
        raise ConfigError(f"site {site.name}: batch.images has no image for {platform.name}")
    lau = launch.for_spec(spec, "batch")
    key = launch.compile_key(spec, lau)
    command = [site.batch.entrypoint, *entrypoint_args(lau)]
    efa = efa_devices(spec)
    devices = [{"hostPath": p, "containerPath": p, "permissions": ["READ", "WRITE", "MKNOD"]}
               for p in efa + platform.device_paths]
    volumes, mounts = [], []
    if site.batch.shared_volume:
        volumes = [{"name": "shared", "host": {"sourcePath": site.batch.shared_volume}}]
        mounts = [{"sourceVolume": "shared", "containerPath": site.batch.shared_volume,
                   "readOnly": False}]
    text = render(
        TEMPLATE,
        name=definition_name(spec),
        nodes=spec.nodes,
        image=image,
        command=command,
        job_role_arn=site.batch.job_role_arn,
        execution_role_arn=site.batch.execution_role_arn,
        instance_type=platform.name,
        vcpus=str(platform.batch_vcpus),
        memory_mib=str(platform.batch_memory_mib),
        # Gaudi cards are not mappable devices on Batch; the container must be privileged.
        privileged=platform.accelerator == "hpu",
        devices=devices,
        shm_mib=platform.batch_shm_mib,
        environment=node_environment(spec, lau, key),
        volumes=volumes,
        mount_points=mounts,
        log_group=site.batch.log_group,
        attempts=max(1, min(10, spec.recipe.job.max_restarts + 1)),
        evaluate_on_exit=list(EVALUATE_ON_EXIT),
        timeout_s=site.batch.timeout_hours * 3600,
        tags={"jobgen:recipe": spec.recipe.name, "jobgen:run": spec.run_name},
    )
    jd = json.loads(text)
    # The content hash covers everything above, so an unchanged definition is never registered
    # twice (`jobgen batch submit` looks for an ACTIVE revision carrying this tag).
    digest = hashlib.sha256(json.dumps(jd, sort_keys=True).encode()).hexdigest()[:16]
    jd["tags"]["jobgen:hash"] = digest
    from ..batch_rules import validate
    validate(jd, f"job definition for {spec.source}")
    return jd


def plan(spec: JobSpec) -> Plan:
    jd = job_definition(spec)
    name = f"{spec.run_name}.job-definition.json"
    text = json.dumps(jd, indent=2) + "\n"
    return Plan(backend="batch", files=(PlannedFile(name, text),), primary=name,
                submit_argv=("aws", "batch", "register-job-definition", "--cli-input-json",
                             "file://{primary}"))
