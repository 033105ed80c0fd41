"""The AWS Batch backend: one multi-node-parallel job definition per job spec.

Every node runs the image's entrypoint (env/containers/entrypoint.sh) with the payload launcher
and the two passes' arguments; the entrypoint finds its node index and the main node's address
in the AWS_BATCH_* variables, and the main node's exit status ends the job.
"""
from __future__ import annotations

import json
import posixpath
import re
from typing import Any, Optional

from ... import aws, images, node, payloads
from ...cache import sha256
from ...errors import ConfigError
from ...plan import Plan, PlannedFile
from ...site import Site
from ...spec import JobSpec
from .. import Echo, JobRef, JobStatus, SubmitOptions, Submitted, job_status
from . import client as batch_client

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
    """What every node's entrypoint reads: the node contract (jobgen/node.py) for Batch, with
    the platform's and the recipe's environment (also used by `jobgen run` on this machine)."""
    site = spec.site
    timeout = site.batch.rendezvous_timeout_s if site.batch else DEFAULT_RDZV_TIMEOUT_S
    contract = node.contract(spec, lau, "batch", rdzv_timeout_s=timeout,
                             shared=run_folder_shared(site), node_silence_s=NODE_SILENCE_S)
    if lau.stop_signal:
        _note_save_in_grace(spec)
    env = node.environment(spec, lau, contract)
    return [{"name": k, "value": v} for k, v in env.items()]


def _note_save_in_grace(spec: JobSpec) -> None:
    """At a terminate or a time-out Batch stops each node's container with SIGTERM and kills it
    30 s later (the ECS agent's ECS_CONTAINER_STOP_TIMEOUT; Batch's job definition has no field for
    it). The trainers save on that signal; where the checkpoint takes longer to write than that
    at the site's declared storage bandwidth (plan.storage), the render says so once."""
    from ... import sizes
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
    from ...extras import require
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
    digest = sha256(json.dumps(jd, sort_keys=True).encode()).hexdigest()[:16]
    jd["tags"]["jobgen:hash"] = digest
    from .rules import validate
    validate(jd, f"job definition for {spec.source}")
    return jd



def node_site(site: Site) -> Site:
    """The site as a Batch node sees it: the same paths (the shared file system is mounted
    where the site says)."""
    return site


def plan(spec: JobSpec) -> Plan:
    jd = job_definition(spec)
    name = f"{spec.run_name}.job-definition.json"
    text = json.dumps(jd, indent=2) + "\n"
    return Plan(backend="batch", files=(PlannedFile(name, text),), primary=name,
                submit_argv=("aws", "batch", "register-job-definition", "--cli-input-json",
                             "file://{primary}"))


# --- the job once it is submitted -----------------------------------------------------------

def _queue(spec: JobSpec, options: SubmitOptions) -> str:
    queue = options.queue or (spec.site.batch.job_queue if spec.site.batch else None)
    if not queue:
        raise ConfigError(f"site {spec.site.name}: no batch.job_queue; pass --queue")
    return queue


def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """The image must carry the payload the job is rendered with (its nodes check it)."""
    images.prepare(spec, "batch")

def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    """The RegisterJobDefinition and SubmitJob requests `submit` makes, as JSON."""
    request = batch_client.dry_run(job_definition(spec), queue=_queue(spec, options),
                                   nodes=spec.nodes, run_name=spec.run_name)
    name, origin = aws.region(spec.site, "batch")
    return json.dumps({"region": {"name": name, "from": origin}, **request}, indent=2) + "\n"


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    """Register the definition `jobgen render --backend batch` prints (only if no ACTIVE
    revision has its content) and submit it."""
    if options.chain:
        raise ConfigError("--chain is for Slurm (a Batch job runs both passes on its nodes)")
    prepare(spec, strict=True, say=options.say)   # the image holds the job's payload
    queue = _queue(spec, options)
    batch = aws.client(spec.site, options.endpoint_url)
    job = batch_client.submit(batch, job_definition(spec), queue=queue, nodes=spec.nodes,
                              run_name=spec.run_name)
    how = "registered" if job.definition.registered else "reusing unchanged"
    return Submitted((job.job_id,), (f"{how} {job.definition.arn}; submitted {job.job_name} "
                                     f"to {queue}",), queue)


def _site(ref: JobRef) -> Any:
    from ... import site as sites
    if ref.site is not None:
        return sites.load(ref.site)
    return sites.load(ref.run.site or None if ref.run else None)


def _client(ref: JobRef, service: str = "batch") -> Any:
    endpoint = ref.endpoint_url or (ref.run.endpoint_url if ref.run else None)
    return aws.client(_site(ref), endpoint, service)


def wait(ref: JobRef, echo: Echo, poll_s: float = 15.0) -> int:
    return batch_client.wait(_client(ref), ref.job_id, echo=echo, poll_s=poll_s)


def status(ref: JobRef) -> JobStatus:
    found = batch_client.status(_client(ref), ref.job_id)
    main = [n for n in found["nodes"] if n["main"]]
    code = main[0].get("exit_code") if main else None
    return job_status("batch", found["job_id"], found["state"], found["reason"],
                      code if isinstance(code, int) else None, name=found["name"],
                      nodes=found["nodes"])


def status_lines(ref: JobRef) -> list[str]:
    return batch_client.status_lines(_client(ref), ref.job_id)


def logs(ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None:
    """A node's CloudWatch log events (the main node's without `node`)."""
    site = _site(ref)
    batch_client.logs(_client(ref), _client(ref, "logs"), ref.job_id, node=node or 0,
                      follow=follow, echo=lambda line: echo(line + "\n"),
                      default_group=site.batch.log_group if site.batch else "/aws/batch/job")


def cancel(ref: JobRef) -> str:
    return batch_client.cancel(_client(ref), ref.job_id)


def checked() -> tuple[list[str], list[str]]:
    """What `jobgen check` says it checked beyond rendering (notes), or could not (problems)."""
    return [], []
