"""The EKS backend: Kubernetes manifests for one multi-node training job.

The plain form runs on any cluster: a headless Service that gives every pod a stable name, and an
Indexed Job with one pod per node (pod K's host name is JOB-K, so the main node is JOB-0.SERVICE
for the rendezvous). Where the site says Kubeflow's training operator is installed, the job is a
PyTorchJob instead (a Master and N-1 Workers; the operator sets MASTER_ADDR and RANK).

Each pod runs the image's EKS entrypoint (env/containers/eks-entrypoint.sh) with the payload
launcher and the two passes' arguments, asks for all of its node's accelerators and EFA
interfaces through the device plugins, mounts the site's FSx claim (run folders, data, the
shared compile cache) and a hostPath on the node's own disk for the compile cache the training
pass reads. A failed pod is restarted within a backoffLimit of the recipe's restarts times the
pods, and resumes from the newest checkpoint: in place under a PyTorchJob (OnFailure); an Indexed
Job replaces it (Never), and its pod failure policy ends the whole job at once on the statuses no
restart cures: 78 (a configuration error) and 75 (the health gate found a bad node, which a pod
restarted on the same node would find again).
"""
from __future__ import annotations

import json
import re
import sys
import time
from typing import Any, Optional

from .. import node, payloads, snapshot
from ..errors import ConfigError, RemoteError
from ..plan import Plan, PlannedFile
from ..spec import JobSpec
from . import Echo, JobRef, SubmitOptions, Submitted

# What happens when the health gate finds a bad node (`jobgen show` says it).
HEALTH_ON_FAILURE = (
    "the job fails (its pod failure policy on exit 75), naming the node and the check")

# Exit statuses that end the Indexed Job at once: a bad node (the health gate), a configuration
# error.
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
    return {"limits": limits, "requests": dict(limits)}


def _pod_spec(spec: JobSpec, name: str, operator: bool) -> dict[str, Any]:
    site, platform = spec.site, spec.platform
    eks = site.eks
    assert eks is not None
    image = snapshot.site_image(eks.images, platform.name, "eks.images", site.name,
                                spec.payload_digest)
    lau = payloads.for_spec(spec, "eks")
    contract = node.contract(spec, lau, "eks", rdzv_timeout_s=eks.rendezvous_timeout_s)
    env = node.environment(spec, lau, contract)
    env["JOBGEN_K8S_JOB"] = name
    if not operator:   # the operator sets MASTER_ADDR itself
        env["JOBGEN_MAIN_HOST"] = f"{name}-0.{name}"
    container: dict[str, Any] = {
        "name": "pytorch" if operator else "trainer",   # the operator's required name
        "image": image,
        "command": ["/bin/bash", eks.entrypoint],
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
                           "volumes": volumes}
    if spec.rehearsal is None:
        # EFA registers memory with the NIC; the real job runs on its platform's nodes only.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
        pod["nodeSelector"] = {"node.kubernetes.io/instance-type": platform.name}
        pod["tolerations"] = [{"key": platform.device_resource,
                               "operator": "Exists", "effect": "NoSchedule"}]
    if not operator:
        pod["subdomain"] = name   # JOB-K.SERVICE resolves through the headless Service
    if eks.service_account:
        pod["serviceAccountName"] = eks.service_account
    return pod


def _deadline(spec: JobSpec) -> Optional[int]:
    """activeDeadlineSeconds from the recipe's time limit, if it has one."""
    if not spec.recipe.job.time_limit:
        return None
    from ..recipe import time_limit_seconds
    return time_limit_seconds(spec.recipe.job.time_limit)


def manifests(spec: JobSpec) -> list[dict[str, Any]]:
    site = spec.site
    eks = site.eks
    if eks is None:
        raise ConfigError(f"site {site.name}: has no eks section (namespace, images, FSx claim)")
    name = job_name(spec)
    labels = {**MANAGED, "jobgen/recipe": spec.recipe.name, "jobgen/run": name}
    meta = {"name": name, "namespace": eks.namespace, "labels": labels}
    template_meta = {"labels": {**labels, LABEL: name}}
    restarts = spec.recipe.job.max_restarts
    deadline = _deadline(spec)
    if eks.training_operator:
        pod = _pod_spec(spec, name, operator=True)
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
    pod = _pod_spec(spec, name, operator=False)
    pod["restartPolicy"] = "Never"          # a pod failure policy needs it
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes,
        # Each restart of the job can cost one pod restart per node.
        "backoffLimit": restarts * spec.nodes,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": pod["containers"][0]["name"],
                                                  "operator": "In", "values": list(NO_RETRY)}},
            # A pod evicted for a drain or a preemption is not the job's failure.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                      "status": "True"}]}]},
        "template": {"metadata": template_meta, "spec": pod}}
    if deadline:
        job_spec["activeDeadlineSeconds"] = deadline
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}
    return [service, job]


def validate(docs: list[dict[str, Any]], where: str) -> None:
    """Each manifest against the Kubernetes schemas (kubernetes-validate); a PyTorchJob's pod
    template as a PodTemplate (the operator's own schema is not bundled)."""
    import kubernetes_validate
    for doc in docs:
        targets = [doc]
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


_SAID: set[str] = set()


def _say_once(note: str) -> None:
    """A note on stderr, once per process (`jobgen check` renders hundreds of manifests)."""
    if note not in _SAID:
        _SAID.add(note)
        print(note, file=sys.stderr)


def plan(spec: JobSpec) -> Plan:
    docs = manifests(spec)
    try:
        import kubernetes_validate  # noqa: F401  (the [eks] extra: validated where installed)
    except ImportError:
        _say_once("note: kubernetes-validate is not installed, so the manifests were not "
                  "checked against the Kubernetes schemas: pip install 'jobgen[eks]'")
    else:
        validate(docs, f"manifests for {spec.source}")
    name = f"{spec.run_name}.k8s.yaml"
    return Plan(backend="eks", files=(PlannedFile(name, render_yaml(docs)),), primary=name,
                submit_argv=("kubectl", "apply", "-f", "{primary}"))


# --- the job once it is submitted -----------------------------------------------------------

def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """The image must carry the payload the job is rendered with (its nodes check it)."""
    snapshot.prepare_image(spec, "eks", strict, say)

def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    return render_yaml(manifests(spec))


def _kube() -> Any:
    """The Kubernetes client package, or one line naming the extra that brings it."""
    try:
        import kubernetes
    except ImportError:
        raise ConfigError("--backend eks needs the kubernetes package, which is not "
                          "installed: pip install 'jobgen[eks]'") from None
    return kubernetes


def _api(site: Any) -> Any:
    """An API client from the kubeconfig, as kubectl reads it (KUBECONFIG, ~/.kube/config)."""
    kubernetes = _kube()
    try:
        return kubernetes.config.new_client_from_config(
            context=site.eks.context if site.eks else None)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise ConfigError(f"kubeconfig: {exc}") from None


def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    kubernetes = _kube()
    try:
        return method(*args, **kwargs)
    except kubernetes.client.ApiException as exc:
        detail = exc.reason
        try:
            detail = json.loads(exc.body).get("message", detail)
        except (TypeError, ValueError):
            pass
        raise RemoteError(f"Kubernetes {method.__name__}: {detail} ({exc.status})") from None
    except OSError as exc:   # urllib3's connection errors are OSErrors
        raise RemoteError(f"Kubernetes API: cannot connect: {exc}") from None


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    kubernetes = _kube()
    if options.chain:
        raise ConfigError("--chain is for Slurm (the pods run both passes)")
    prepare(spec, strict=True, say=options.say)   # the image holds the job's payload
    docs = manifests(spec)
    api = _api(spec.site)
    ns = docs[0]["metadata"]["namespace"]
    for doc in docs:
        if doc["kind"] == "Service":
            _call(kubernetes.client.CoreV1Api(api).create_namespaced_service, ns, doc)
        elif doc["kind"] == "Job":
            _call(kubernetes.client.BatchV1Api(api).create_namespaced_job, ns, doc)
        else:
            _call(kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object,
                  "kubeflow.org", "v1", ns, "pytorchjobs", doc)
    name = docs[-1]["metadata"]["name"]
    job_id = name if docs[-1]["kind"] == "Job" else f"{OPERATOR_PREFIX}{name}"
    return Submitted((job_id,), (f"created {' and '.join(d['kind'] for d in docs)} {name} in "
                                 f"namespace {ns}",))


# A job id names what was submitted: NAME for an Indexed Job (batch/v1), pytorchjobs/NAME for a
# Kubeflow PyTorchJob, so that status, logs and cancel act on the object that exists.
OPERATOR_PREFIX = "pytorchjobs/"
_KUBEFLOW = ("kubeflow.org", "v1")


def _kind(job_id: str) -> tuple[str, str]:
    """(kind, object name) of a job id."""
    if job_id.startswith(OPERATOR_PREFIX):
        return "PyTorchJob", job_id[len(OPERATOR_PREFIX):]
    return "Job", job_id


def _where(ref: JobRef) -> tuple[Any, Any]:
    from .. import site as sites
    site = sites.load(ref.site if ref.site is not None else (ref.run.site or None)
                      if ref.run else None)
    if site.eks is None:
        raise ConfigError(f"site {site.name}: has no eks section (namespace)")
    return site, _api(site)


def _pods(api: Any, ns: str, name: str) -> list[Any]:
    kubernetes = _kube()
    found = _call(kubernetes.client.CoreV1Api(api).list_namespaced_pod, ns,
                  label_selector=f"{LABEL}={name}")
    return list(found.items)


def _index(pod: Any) -> int:
    labels = pod.metadata.labels or {}
    annotations = pod.metadata.annotations or {}
    for source in (labels, annotations):
        for key in ("batch.kubernetes.io/job-completion-index",
                    "training.kubeflow.org/replica-index"):
            if key in source:
                value = int(source[key])
                role = labels.get("training.kubeflow.org/replica-type", "")
                return value + 1 if role == "worker" else value
    return -1


def status(ref: JobRef) -> dict[str, Any]:
    kubernetes = _kube()
    site, api = _where(ref)
    ns = site.eks.namespace
    kind, name = _kind(ref.job_id)
    pods = {_index(p): p.status.phase for p in _pods(api, ns, name)}
    if kind == "PyTorchJob":
        job = _call(kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object_status,
                    *_KUBEFLOW, ns, "pytorchjobs", name)
        st = job.get("status") or {}
        conditions = [c.get("type") for c in st.get("conditions") or []
                      if c.get("status") == "True"]
        replicas = (st.get("replicaStatuses") or {}).values()
        active = sum(r.get("active", 0) for r in replicas)
        succeeded = sum(r.get("succeeded", 0) for r in replicas)
        failed = sum(r.get("failed", 0) for r in replicas)
        state = ("Complete" if "Succeeded" in conditions else "Failed" if "Failed" in conditions
                 else "Running" if "Running" in conditions or active else "Pending")
    else:
        st = _call(kubernetes.client.BatchV1Api(api).read_namespaced_job_status, name,
                   ns).status
        conditions = [c.type for c in (st.conditions or []) if c.status == "True"]
        active, succeeded, failed = st.active or 0, st.succeeded or 0, st.failed or 0
        state = ("Complete" if "Complete" in conditions else "Failed" if "Failed" in conditions
                 else "Running" if active else "Pending")
    return {"job_id": ref.job_id, "kind": kind, "state": state, "active": active,
            "succeeded": succeeded, "failed": failed,
            "pods": {str(k): v for k, v in sorted(pods.items())}}


def status_lines(ref: JobRef) -> list[str]:
    s = status(ref)
    lines = [f"{s['job_id']}: {s['state']} (active {s['active']}, succeeded {s['succeeded']}, "
             f"failed pods {s['failed']})"]
    lines += [f"  node {k}: {v}" for k, v in s["pods"].items()]
    return lines


def wait(ref: JobRef, echo: Echo, poll_s: float = 15.0) -> int:
    seen = None
    while True:
        state = status(ref)["state"]
        if state != seen:
            echo(f"{ref.job_id}: {state}\n")
            seen = state
        if state in ("Complete", "Failed"):
            return 0 if state == "Complete" else 1
        time.sleep(poll_s)


def logs(ref: JobRef, node_index: Optional[int], follow: bool, echo: Echo) -> None:
    """Pod `node`'s log (node 0: the main pod)."""
    kubernetes = _kube()
    site, api = _where(ref)
    ns = site.eks.namespace
    want = node_index or 0
    pods = [p for p in _pods(api, ns, _kind(ref.job_id)[1]) if _index(p) == want]
    if not pods:
        raise RemoteError(f"job {ref.job_id}: no pod for node {want} in namespace {ns}")
    core = kubernetes.client.CoreV1Api(api)
    if follow:
        stream = _call(core.read_namespaced_pod_log, pods[0].metadata.name, ns, follow=True,
                       _preload_content=False)
        for chunk in stream.stream():
            echo(chunk.decode("utf-8", "replace"))
        return
    echo(_call(core.read_namespaced_pod_log, pods[0].metadata.name, ns))


def cancel(ref: JobRef) -> str:
    kubernetes = _kube()
    site, api = _where(ref)
    ns = site.eks.namespace
    body = kubernetes.client.V1DeleteOptions(propagation_policy="Foreground")
    kind, name = _kind(ref.job_id)
    if kind == "PyTorchJob":   # the operator deletes its pods and services with it
        _call(kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object,
              *_KUBEFLOW, ns, "pytorchjobs", name, body=body)
        return f"deleted PyTorchJob {name} (and its pods) in namespace {ns}"
    _call(kubernetes.client.BatchV1Api(api).delete_namespaced_job, name, ns, body=body)
    try:
        _call(kubernetes.client.CoreV1Api(api).delete_namespaced_service, name, ns)
    except RemoteError as exc:   # deleted by hand already: the job is what mattered
        return f"deleted Job {name} (and its pods) in namespace {ns}; its Service: {exc}"
    return f"deleted Job {name} and its Service (and its pods) in namespace {ns}"
