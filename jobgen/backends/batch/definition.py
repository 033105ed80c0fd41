"""The RegisterJobDefinition request of a Batch job (backend.py renders and submits it): one
multi-node-parallel definition per job spec, the node contract in every node's environment, the
instance and devices each node needs, and which exits Batch retries.

Every node runs the image's entrypoint (env/containers/entrypoint.sh) with the payload launcher
and the two passes' arguments; the entrypoint finds its node index and the main node's address
in the AWS_BATCH_* variables, and the main node's exit status ends the job.
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any

from ... import payloads
from ...images import catalog as images
from ...inputs.site import Site
from ...job.spec import JobSpec
from ...payloads import node
from ...plumbing.errors import ConfigError

# The main node's status when its watch found a child node lost (env/containers/entrypoint.sh,
# payload/common/node_watch.py): Batch ends a multi-node job only when the main node exits, and a
# child's failure starts no new attempt, so the main node ends the attempt itself.
NODE_LOST_STATUS = 69
# Seconds of a child's silence (its host gone from the network) after which the main node ends the
# attempt; a child whose container stops is noticed at once (its connection closes).
NODE_SILENCE_S = 60

# Retry what the infrastructure broke (a host that went away, a child node lost, an image that
# could not be pulled or started); exit on everything else, which is the training's own failure.
# First match wins; Batch takes at most 5.
EVALUATE_ON_EXIT = (
    {"onStatusReason": "Host EC2*", "action": "RETRY"},
    {"onExitCode": str(NODE_LOST_STATUS), "action": "RETRY"},
    {"onReason": "CannotPullContainerError*", "action": "RETRY"},
    {"onReason": "CannotStartContainerError*", "action": "RETRY"},
    {"onReason": "*", "action": "EXIT"},
)


DEFAULT_RDZV_TIMEOUT_S = 900


def entrypoint_args(lau: payloads.Launch) -> list[str]:
    """LAUNCHER COMPILE_ARGC COMPILE_ARG... TRAIN_ARG... (env/containers/entrypoint.sh)."""
    return [lau.launcher, str(len(lau.compile_args)), *lau.compile_args, *lau.train_args]


def definition_name(spec: JobSpec) -> str:
    """Batch names allow letters, digits, '-' and '_' only (no '.')."""
    return "jobgen-" + re.sub(r"[^A-Za-z0-9_-]", "-", spec.job_name)


def node_environment(spec: JobSpec, lau: payloads.Launch) -> list[dict[str, str]]:
    """What every node's entrypoint reads: the node contract (jobgen/payloads/node.py) for Batch,
    with the platform's and the recipe's environment (also used by `jobgen run` on this machine)."""
    site = spec.site
    timeout = site.batch.rendezvous_timeout_s if site.batch else DEFAULT_RDZV_TIMEOUT_S
    contract = node.contract(spec, lau, "batch", rdzv_timeout_s=timeout,
                             shared=run_folder_shared(site), node_silence_s=NODE_SILENCE_S)
    if lau.stop_signal:
        _note_save_in_grace(spec)
    env = node.environment(spec, lau, contract)
    return [{"name": k, "value": v} for k, v in env.items()]


def container_secrets(site: Site, environment: list[dict[str, str]]) -> list[dict[str, str]]:
    """The site's batch.secrets as the container's `secrets` (name, valueFrom): Batch has the
    execution role fetch each value when the container starts, so none is in the definition.
    A name the container's environment sets too is refused (which would win is not said)."""
    assert site.batch is not None
    secrets = [{"name": k, "valueFrom": v} for k, v in sorted((site.batch.secrets or {}).items())]
    clash = sorted({s["name"] for s in secrets} & {e["name"] for e in environment})
    if clash:
        raise ConfigError(f"site {site.name}: batch.secrets.{clash[0]}: the job's environment "
                          "sets it too (the recipe's or the node contract's): name another "
                          "variable")
    return secrets


def _note_save_in_grace(spec: JobSpec) -> None:
    """At a terminate or a time-out Batch stops each node's container with SIGTERM and kills it
    30 s later (the ECS agent's ECS_CONTAINER_STOP_TIMEOUT; Batch's job definition has no field for
    it). The trainers save on that signal; where the checkpoint takes longer to write than that
    at the site's declared storage bandwidth (plan.storage), the render says so once."""
    from ...job import sizes
    from . import DECLARATION

    storage = spec.site.plan.storage
    if spec.rehearsal is not None or storage is None or not storage.write_mb_s:
        return
    write_mb_s = storage.write_mb_s
    if storage.node_mb_s:
        write_mb_s = min(write_mb_s, storage.node_mb_s * spec.nodes)
    size = sizes.checkpoint_bytes(spec)
    write_s = size / (write_mb_s * 1e6)
    grace = DECLARATION.stop_grace_s
    if write_s > grace:
        node.say_once(
            f"note: {spec.source}: a Batch terminate or time-out gives the trainers {grace} s "
            f"from SIGTERM to SIGKILL, and a checkpoint of {size / 1e9:.1f} GB takes about "
            f"{write_s:.0f} s at the site's {write_mb_s:g} MB/s: that save is cut off and the "
            "job resumes from its last periodic checkpoint (the ECS agent's "
            "ECS_CONTAINER_STOP_TIMEOUT, set in the compute environment's launch template, "
            "gives longer)")


def run_folder_shared(site: Site) -> bool:
    """Whether a Batch job's nodes share its run folder: the site's work_dir lies on the shared
    volume every node mounts (EFS, FSx). Then one rank prepares, seals and prunes each checkpoint
    and the main node waits for the others' compile passes; otherwise each node keeps its own
    disk (the container's) and its leader does that for its own part."""
    volume = site.batch.shared_volume if site.batch else None
    if not volume:
        return False
    work = posixpath.normpath(site.paths.work_dir)
    volume = posixpath.normpath(volume)
    return work.startswith("/") and (work == volume or work.startswith(volume.rstrip("/") + "/"))


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


def efa_interfaces(spec: JobSpec) -> int:
    """The EFA interfaces a node has on this backend (the health gate checks them)."""
    return len(efa_devices(spec))


def _instance(spec: JobSpec) -> dict[str, Any]:
    """Where each node runs: the platform's instance with its devices, or for a rehearsal the
    site's CPU instance type with no devices at all."""
    site, platform = spec.site, spec.platform
    assert site.batch is not None
    if spec.rehearsal is not None:
        cpu = site.batch.smoke
        if cpu is None:
            raise ConfigError(f"site {site.name}: batch.smoke: no CPU instance type for --smoke "
                              "jobs (instance_type, vcpus, memory_mib); a rehearsal needs no "
                              f"{platform.name}")
        return {"instanceType": cpu.instance_type,
                "resourceRequirements": [{"type": "VCPU", "value": str(cpu.vcpus)},
                                         {"type": "MEMORY", "value": str(cpu.memory_mib)}],
                "privileged": False,
                "linuxParameters": {"devices": [], "sharedMemorySize": cpu.memory_mib // 4,
                                    "initProcessEnabled": True}}
    devices = [{"hostPath": p, "containerPath": p, "permissions": ["READ", "WRITE", "MKNOD"]}
               for p in efa_devices(spec) + platform.device_paths]
    return {"instanceType": platform.name,
            "resourceRequirements": [{"type": "VCPU", "value": str(platform.batch_vcpus)},
                                     {"type": "MEMORY", "value": str(platform.batch_memory_mib)}],
            # Gaudi cards are not mappable devices on Batch; the container must be privileged.
            "privileged": platform.batch_privileged,
            "linuxParameters": {"devices": devices, "sharedMemorySize": platform.batch_shm_mib,
                                "initProcessEnabled": True}}


def job_definition(spec: JobSpec) -> dict[str, Any]:
    """The RegisterJobDefinition request for this spec, validated offline (with botocore:
    without the [batch] extra, one line that names it)."""
    from ...plumbing.extras import require
    require("--backend batch", ("botocore",), "batch")
    site = spec.site
    if site.batch is None:
        raise ConfigError(f"site {site.name}: has no batch section (job queue, images, roles)")
    image = images.uri(spec, "batch")
    lau = payloads.for_spec(spec, "batch")
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if site.batch.shared_volume:
        volumes = [{"name": "shared", "host": {"sourcePath": site.batch.shared_volume}}]
        mounts = [{"sourceVolume": "shared", "containerPath": site.batch.shared_volume,
                   "readOnly": False}]
    container: dict[str, Any] = {
        "image": image,
        "command": [images.declared().entrypoint("batch"), *entrypoint_args(lau)],
    }
    if site.batch.job_role_arn:
        container["jobRoleArn"] = site.batch.job_role_arn
    if site.batch.execution_role_arn:
        container["executionRoleArn"] = site.batch.execution_role_arn
    container.update(_instance(spec))
    container.update({
        "ulimits": [{"name": "memlock", "softLimit": -1, "hardLimit": -1},
                    {"name": "nofile", "softLimit": 65535, "hardLimit": 65535}],
        "environment": node_environment(spec, lau),
        "volumes": volumes,
        "mountPoints": mounts,
        "logConfiguration": {"logDriver": "awslogs",
                             "options": {"awslogs-group": site.batch.log_group}},
    })
    if site.batch.secrets:
        container["secrets"] = container_secrets(site, container["environment"])
    jd: dict[str, Any] = {
        "jobDefinitionName": definition_name(spec),
        "type": "multinode",
        "platformCapabilities": ["EC2"],
        "nodeProperties": {"numNodes": spec.nodes, "mainNode": 0, "nodeRangeProperties": [
            {"targetNodes": "0:", "container": container}]},
        "retryStrategy": {"attempts": max(1, min(10, spec.recipe.job.max_restarts + 1)),
                          "evaluateOnExit": [dict(e) for e in EVALUATE_ON_EXIT]},
        "timeout": {"attemptDurationSeconds": site.batch.timeout_hours * 3600},
        "tags": {"jobgen:recipe": spec.recipe.name, "jobgen:run": spec.run_name},
        "propagateTags": True,
    }
    # The content hash covers everything above, so an unchanged definition is never registered
    # twice (`jobgen batch submit` looks for an ACTIVE revision carrying this tag).
    digest = hashlib.sha256(json.dumps(jd, sort_keys=True).encode()).hexdigest()[:16]
    jd["tags"]["jobgen:hash"] = digest
    from .rules import validate
    validate(jd, f"job definition for {spec.source}")
    return jd
