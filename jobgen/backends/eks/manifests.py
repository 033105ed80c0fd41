"""The EKS backend's manifests: one JobSet per job (jobset.py), whose child Job's pods each run
the image's EKS entrypoint (env/containers/eks-entrypoint.sh) with the payload launcher and the
two passes' arguments, ask for all of the node's accelerators and EFA interfaces through the
device plugins, mount the site's FSx claim and a hostPath on the node's own disk for the compile
cache the training pass reads. The platform file's `pod:` adds what its pods need beside devices
and EFA. Every pod takes its attempt from JobSet's restart-attempt label (the downward API): the
rule a reader must not break is that no pod counts its own attempts.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from ... import payloads
from ...images import catalog as images
from ...job.spec import JobSpec
from ...payloads import node
from ...plumbing.errors import ConfigError
from . import DECLARATION
from . import jobset as jobsets

# Exit statuses no restart cures, which fail the JobSet at once: a bad node (the health gate), a
# configuration error.
NO_RETRY = (75, 78)
# The Kubernetes release whose schemas the manifests are checked against (EKS standard support).
K8S_VERSION = "1.31"
# Device plugin resources, per accelerator: Neuron devices (Trainium chips), Gaudi cards, GPUs.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
LABEL = "jobgen/job"
MANAGED = {"app.kubernetes.io/managed-by": "jobgen"}


def job_name(spec: JobSpec) -> str:
    """An RFC 1123 name short enough for the pods' host names (JOB-K, at most 63)."""
    name = re.sub(r"[^a-z0-9-]+", "-", spec.run_name.lower()).strip("-")[:52].strip("-")
    return name or "jobgen"


def efa_interfaces(spec: JobSpec) -> int:
    """The EFA interfaces a pod asks for (the health gate checks them)."""
    assert spec.site.eks is not None
    return (spec.site.eks.efa_interfaces or {}).get(spec.platform.name,
                                                     spec.platform.efa_interfaces)


def _resources(spec: JobSpec) -> dict[str, Any]:
    site, platform = spec.site, spec.platform
    assert site.eks is not None
    if spec.rehearsal is not None:
        ask = {"cpu": site.eks.smoke_cpu, "memory": site.eks.smoke_memory}
        return {"requests": ask, "limits": ask}
    efa = efa_interfaces(spec)
    if not 0 <= efa <= platform.efa_interfaces:
        raise ConfigError(f"site {site.name}: eks.efa_interfaces.{platform.name}: {efa} is not "
                          f"between 0 and {platform.efa_interfaces}")
    limits: dict[str, Any] = {platform.device_resource: platform.devices}
    if efa:
        limits[EFA_RESOURCE] = efa
    pod = platform.pod   # what env/platforms/NAME.yaml says its pods need
    if pod.hugepages_2mi:
        limits["hugepages-2Mi"] = pod.hugepages_2mi
    requests = dict(limits)
    requests.update({k: v for k, v in (("cpu", pod.cpu), ("memory", pod.memory)) if v})
    return {"limits": limits, "requests": requests}


def _pod_spec(spec: JobSpec, name: str) -> dict[str, Any]:
    site, platform = spec.site, spec.platform
    eks = site.eks
    assert eks is not None
    image = images.uri(spec, "eks")
    lau = payloads.for_spec(spec, "eks")
    contract = node.contract(spec, lau, "eks", rdzv_timeout_s=eks.rendezvous_timeout_s,
                             shared=bool(eks.shared_pvc))
    env = node.environment(spec, lau, contract)
    env["JOBGEN_K8S_JOB"] = name
    env.update(platform.pod.env)
    env["JOBGEN_MAIN_HOST"] = jobsets.main_host(name)
    # The last restart attempt a pod starts: past it the pod ends the job (exit 78).
    env["JOBGEN_RESTART_LIMIT"] = str(restart_limit(spec))
    container: dict[str, Any] = {
        "name": "trainer",
        "image": image,
        "command": ["/bin/bash", images.declared().entrypoint("eks")],
        "args": [lau.launcher, *node.flow_args(lau)],
        "env": [{"name": k, "value": v} for k, v in env.items()] + [
            # The attempt, from the engine: JobSet labels every pod with its restart attempt.
            {"name": "JOBGEN_RESTART_ATTEMPT", "valueFrom": {"fieldRef": {
                "fieldPath": f"metadata.labels['{jobsets.RESTART_ATTEMPT}']"}}}],
        "resources": _resources(spec),
        "ports": [{"name": "rendezvous", "containerPort": spec.recipe.job.master_port}],
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if eks.shared_pvc:
        container["volumeMounts"].append({"name": "shared", "mountPath": eks.shared_mount})
        volumes.append({"name": "shared",
                        "persistentVolumeClaim": {"claimName": eks.shared_pvc}})
    if contract.JOBGEN_LOCAL_COMPILE_CACHE:
        container["volumeMounts"].append({"name": "local-compile-cache",
                                          "mountPath": contract.JOBGEN_LOCAL_COMPILE_CACHE})
        volumes.append({"name": "local-compile-cache", "hostPath": {
            "path": eks.local_cache_host_path, "type": "DirectoryOrCreate"}})
    pod: dict[str, Any] = {"restartPolicy": "Never",   # a pod failure policy needs it
                           "containers": [container], "volumes": volumes,
                           # SIGTERM -> the trainers save and stop (payload/common/job_flow.sh)
                           "terminationGracePeriodSeconds": DECLARATION.stop_grace_s}
    if spec.rehearsal is None:
        # EFA registers memory with the NIC; the real job runs on its platform's nodes only.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        pod["nodeSelector"] = {"node.kubernetes.io/instance-type": platform.name}
        pod["tolerations"] = [{"key": platform.device_resource,
                               "operator": "Exists", "effect": "NoSchedule"}]
        if platform.pod.host_ipc:
            pod["hostIPC"] = True
    if eks.service_account:
        pod["serviceAccountName"] = eks.service_account
    return pod


def restart_limit(spec: JobSpec) -> int:
    """The last restart attempt (JobSet's status.restarts, counted or not) a pod starts:
    job.max_restarts counted ones and the site's eks.max_disruptions beyond them."""
    assert spec.site.eks is not None
    return spec.recipe.job.max_restarts + spec.site.eks.max_disruptions


def _deadline(spec: JobSpec) -> Optional[int]:
    """activeDeadlineSeconds from the recipe's time limit, if it has one."""
    if not spec.recipe.job.time_limit:
        return None
    from ...inputs.recipe import time_limit_seconds
    return time_limit_seconds(spec.recipe.job.time_limit)


def manifests(spec: JobSpec) -> list[dict[str, Any]]:
    site = spec.site
    eks = site.eks
    if eks is None:
        raise ConfigError(f"site {site.name}: has no eks section (namespace, images, FSx claim)")
    name = jobsets.name(job_name(spec))
    labels = {**MANAGED, "jobgen/recipe": spec.recipe.name, "jobgen/run": name}
    meta = {"name": name, "namespace": eks.namespace, "labels": labels}
    template_meta = {"labels": {**labels, LABEL: name}}
    restarts = spec.recipe.job.max_restarts
    _say_once(f"note: site {site.name}: a drain, preemption or eviction (the kubelet's own "
              "memory- or disk-pressure evictions too) restarts the JobSet without counting "
              f"against job.max_restarts ({restarts}), at most eks.max_disruptions "
              f"({eks.max_disruptions}) times beyond them: a pod of restart attempt "
              f"{restart_limit(spec) + 1} ends the job (78)")
    return [jobsets.manifest(meta, template_meta, _pod_spec(spec, name), spec.nodes, restarts,
                             _deadline(spec), NO_RETRY)]


def validate(docs: list[dict[str, Any]], where: str) -> None:
    """Each manifest against the Kubernetes schemas (kubernetes-validate): a JobSet as the child
    Job its controller creates (the CRD is not bundled: the tests check it against its CRD)."""
    import kubernetes_validate
    for doc in docs:
        target = jobsets.child_job(doc) if doc["kind"] == "JobSet" else doc
        try:
            kubernetes_validate.validate(target, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise ConfigError(f"{where}: {target['kind']} {path}: {exc.message}") from None


def render_yaml(docs: list[dict[str, Any]]) -> str:
    import yaml
    return "".join("---\n" + yaml.safe_dump(doc, sort_keys=False, width=100) for doc in docs)


_say_once = node.say_once
