"""The EKS backend: Kubernetes manifests for one multi-node training job, in the form the site's
`eks.gang` names (what restarts the gang of pods):

  jobset       (recommended) a JobSet whose one child Job is Indexed (jobset.py): JobSet restarts
               every pod when one fails, and a disruption (a drain) without counting it;
  pytorchjob   a Kubeflow PyTorchJob (a Master and N-1 Workers; the operator sets MASTER_ADDR
               and RANK), which restarts the failed pods only;
  indexed-job  on a cluster with neither: a headless Service that gives every pod a stable name,
               and an Indexed Job with one pod per node (pod K's host name is JOB-K, so the main
               node is JOB-0.SERVICE for the rendezvous).

Each pod runs the image's EKS entrypoint (env/containers/eks-entrypoint.sh) with the payload
launcher and the two passes' arguments, asks for all of its node's accelerators and EFA
interfaces through the device plugins, mounts the site's FSx claim (run folders, data, the
shared compile cache) and a hostPath on the node's own disk for the compile cache the training
pass reads. The platform file's `pod:` adds what its pods need beside devices and EFA (CPU and
memory requests, Gaudi's huge pages and the node's IPC namespace, CCOM_SOCKET_IFNAME on Neuron).

Restarts restart the whole gang, since a replaced pod cannot rejoin a running torchrun. Under
JobSet that is the engine's doing. Without it, on the shared claim every pod watches its peers
(eks-entrypoint.sh, GANG_* below) and stops within seconds of one's failure. An Indexed Job
(restartPolicy Never) then replaces every pod: its pod failure policy ignores the stopped peers
(one counted failure per restart: backoffLimit is the recipe's restarts). Under a PyTorchJob
(OnFailure) the operator restarts each stopped container in place, within restarts times the
pods. Every form ends the whole job at once on the statuses no restart cures: 78 (a
configuration error) and 75 (the health gate found a bad node, which a pod restarted on the same
node would find again). Every pod resumes from the newest step every node holds. What the two
forms without JobSet cannot do on a drain, render says (NOTES).
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

# Exit statuses that end the Indexed Job at once: a bad node (the health gate), a configuration
# error.
NO_RETRY = (75, 78)
# Gang restarts (an Indexed Job has no whole-job restart of its own): every pod beats a file on
# the shared claim and watches its peers' (eks-entrypoint.sh). When one pod fails, or stops
# beating for GANG_STALE_S (its node is gone), the others stop within GANG_BEAT_S and exit with
# GANG_EXIT, which the pod failure policy ignores: only the first failure counts against the
# backoffLimit, Kubernetes replaces every pod, and the new gang resumes from the newest
# checkpoint instead of waiting in collectives for the runtime's timeout.
GANG_EXIT = 79
GANG_BEAT_S = 2
GANG_STALE_S = 30
# The Kubernetes release whose schemas the manifests are checked against (EKS standard support).
K8S_VERSION = "1.31"
# Device plugin resources, per accelerator: Neuron devices (Trainium chips), Gaudi cards, GPUs.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
LABEL = "jobgen/job"
MANAGED = {"app.kubernetes.io/managed-by": "jobgen"}
# What each form without JobSet cannot do, said once per render (Kubernetes signals only the pod
# it evicts; training-operator v1.9.0 pkg/controller.v1/common/pod.go recreates failed or missing
# pods one by one).
NOTES = {
    "indexed-job": "eks.gang is indexed-job (neither JobSet nor Kubeflow): jobgen's own heartbeats "
                   "restart the gang when a pod fails, but a drain signals only the evicted pod, "
                   "whose peers save and end as done, so its replacement waits alone until "
                   "backoffLimit fails the job; install JobSet and set eks.gang: jobset",
    "pytorchjob": "eks.gang is pytorchjob: on a drain the training operator (restartPolicy "
                  "OnFailure) recreates only the evicted pod, whose peers save and exit 0, and a "
                  "Master that exits 0 marks the PyTorchJob Succeeded before training is done "
                  "(resubmit to resume); JobSet restarts the whole gang: eks.gang: jobset",
}


def gang(site: Any) -> str:
    """The form of the site's EKS jobs (site.eks.gang; the older training_operator key)."""
    eks = site.eks
    return eks.gang or ("pytorchjob" if eks.training_operator else "indexed-job")


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


def _pod_spec(spec: JobSpec, name: str, form: str) -> dict[str, Any]:
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
    operator = form == "pytorchjob"
    if eks.shared_pvc and form != "jobset":
        # No engine restarts the gang: the pods watch each other through the claim.
        env.update(JOBGEN_GANG_EXIT=str(GANG_EXIT), JOBGEN_GANG_BEAT_S=str(GANG_BEAT_S),
                   JOBGEN_GANG_STALE_S=str(GANG_STALE_S))
    if form == "jobset":
        env["JOBGEN_MAIN_HOST"] = jobsets.main_host(name)
    elif not operator:   # the operator sets MASTER_ADDR itself
        env["JOBGEN_MAIN_HOST"] = f"{name}-0.{name}"
    container: dict[str, Any] = {
        "name": "pytorch" if operator else "trainer",   # the operator's required name
        "image": image,
        "command": ["/bin/bash", images.declared().entrypoint("eks")],
        "args": [lau.launcher, *node.flow_args(lau)],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": _resources(spec),
        "ports": [{"name": "pytorchjob-port" if operator else "rendezvous",
                   "containerPort": spec.recipe.job.master_port}],
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
    pod: dict[str, Any] = {"restartPolicy": "OnFailure", "containers": [container],
                           "volumes": volumes,
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
    if form == "indexed-job":
        pod["subdomain"] = name   # JOB-K.SERVICE resolves through the headless Service
    if eks.service_account:
        pod["serviceAccountName"] = eks.service_account
    return pod


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
    form = gang(site)
    name = job_name(spec)
    if form == "jobset":
        name = jobsets.name(name)
    else:
        _say_once(f"note: site {site.name}: {NOTES[form]}")
    labels = {**MANAGED, "jobgen/recipe": spec.recipe.name, "jobgen/run": name}
    meta = {"name": name, "namespace": eks.namespace, "labels": labels}
    template_meta = {"labels": {**labels, LABEL: name}}
    restarts = spec.recipe.job.max_restarts
    deadline = _deadline(spec)
    if form == "jobset":
        pod = _pod_spec(spec, name, form)
        pod["restartPolicy"] = "Never"      # a pod failure policy needs it
        return [jobsets.manifest(meta, template_meta, pod, spec.nodes, restarts, deadline,
                                 NO_RETRY)]
    if form == "pytorchjob":
        pod = _pod_spec(spec, name, form)
        replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                                               "template": {"metadata": template_meta,
                                                            "spec": pod}}}
        if spec.nodes > 1:
            replicas["Worker"] = {"replicas": spec.nodes - 1, "restartPolicy": "OnFailure",
                                  "template": {"metadata": template_meta, "spec": pod}}
        run_policy: dict[str, Any] = {"backoffLimit": restarts * spec.nodes,
                                      "cleanPodPolicy": "None"}
        if deadline:
            run_policy["activeDeadlineSeconds"] = deadline
        return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta,
                 "spec": {"runPolicy": run_policy, "pytorchReplicaSpecs": replicas}}]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {LABEL: name},
                        "ports": [{"name": "rendezvous", "port": spec.recipe.job.master_port}]}}
    pod = _pod_spec(spec, name, form)
    pod["restartPolicy"] = "Never"          # a pod failure policy needs it
    container = pod["containers"][0]["name"]
    watched: list[dict[str, Any]] = []
    if eks.shared_pvc:
        # One counted failure per restart of the gang: the peers it stopped are not counted.
        watched = [{"action": "Ignore", "onExitCodes": {"containerName": container,
                                                     "operator": "In", "values": [GANG_EXIT]}}]
    else:
        _say_once(f"note: site {site.name}: eks.shared_pvc is not set, so the pods of a job "
                  "cannot watch each other: when one fails, the others wait in collectives for "
                  "the runtime's timeout before the job restarts")
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes,
        # With gang restarts each restart of the job costs one counted pod failure; without,
        # it can cost one per node.
        "backoffLimit": restarts * (1 if watched else spec.nodes),
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": container,
                                                  "operator": "In", "values": list(NO_RETRY)}},
            *watched,
            # A pod evicted for a drain or a preemption is not the job's failure.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                      "status": "True"}]}]},
        "template": {"metadata": template_meta, "spec": pod}}
    if deadline:
        job_spec["activeDeadlineSeconds"] = deadline
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
    return [service, job]


def validate(docs: list[dict[str, Any]], where: str) -> None:
    """Each manifest against the Kubernetes schemas (kubernetes-validate); a JobSet's child Job
    as a Job, a PyTorchJob's pod template as a PodTemplate (neither CRD is bundled: the tests
    check the JobSet against its CRD)."""
    import kubernetes_validate
    for doc in docs:
        targets = [doc]
        if doc["kind"] == "JobSet":   # its child Job, as JobSet creates it (jobset.py: the CRD)
            targets = [jobsets.child_job(doc)]
        if doc["kind"] == "PyTorchJob":
            targets = [{"apiVersion": "v1", "kind": "PodTemplate",
                        "metadata": {"name": f"{doc['metadata']['name']}-{role.lower()}"},
                        "template": replica["template"]}
                       for role, replica in doc["spec"]["pytorchReplicaSpecs"].items()]
        for target in targets:
            try:
                kubernetes_validate.validate(target, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                raise ConfigError(f"{where}: {target['kind']} {path}: {exc.message}") from None


def render_yaml(docs: list[dict[str, Any]]) -> str:
    import yaml
    return "".join("---\n" + yaml.safe_dump(doc, sort_keys=False, width=100) for doc in docs)


_say_once = node.say_once
