"""The EKS backend: the manifests (manifests.py) handed to the cluster with the official
Kubernetes client, and the job once submitted: status, logs, cancel of the object that was
submitted (a JobSet, an Indexed Job with its Service, or a Kubeflow PyTorchJob)."""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Optional

from ... import images
from ...errors import ConfigError, RemoteError
from ...plan import Plan, PlannedFile
from ...site import Site
from ...spec import JobSpec
from .. import Echo, JobRef, JobStatus, SubmitOptions, Submitted, job_status
from . import jobset as jobsets
from .manifests import (  # noqa: F401  (efa_interfaces: the health gate asks the backend)
    K8S_VERSION,
    LABEL,
    _say_once,
    efa_interfaces,
    manifests,
    render_yaml,
    validate,
)


def node_site(site: Site) -> Site:
    """The site as an EKS pod sees it: the training pass reads the compile cache from the
    node's own disk (hostPath)."""
    section = site.eks
    assert section is not None
    return dataclasses.replace(site, paths=dataclasses.replace(
        site.paths, local_compile_cache=section.local_cache_host_path))


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
    images.prepare(spec, "eks")

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
        elif doc["kind"] == "JobSet":
            _jobset_installed(kubernetes, api)
            _call(kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object,
                  *_JOBSET, ns, jobsets.PLURAL, doc)
        else:
            _call(kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object,
                  "kubeflow.org", "v1", ns, "pytorchjobs", doc)
    name = docs[-1]["metadata"]["name"]
    job_id = {"Job": name, "JobSet": f"{JOBSET_PREFIX}{name}"}.get(
        docs[-1]["kind"], f"{OPERATOR_PREFIX}{name}")
    return Submitted((job_id,), (f"created {' and '.join(d['kind'] for d in docs)} {name} in "
                                 f"namespace {ns}",))


def _jobset_installed(kubernetes: Any, api: Any) -> None:
    """The cluster's JobSet CRD is one whose failure policy matches on messages (v0.10.0 or
    later: jobset.py): one line otherwise. Where the CRD cannot be read (no permission on
    cluster-scoped objects), a note."""
    try:
        answer = kubernetes.client.ApiextensionsV1Api(api).read_custom_resource_definition(
            jobsets.CRD_NAME, _preload_content=False)
        text = answer.data.decode("utf-8", "replace")
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            raise RemoteError(f"the cluster has no JobSet ({jobsets.CRD_NAME}), which the site's "
                              f"eks.gang: jobset needs: install JobSet {jobsets.OLDEST} or later, "
                              "or set eks.gang") from None
        _say_once(f"note: cannot read the CRD {jobsets.CRD_NAME} ({exc.status} {exc.reason}): "
                  f"not checked that JobSet is {jobsets.OLDEST} or later")
        return
    except OSError as exc:
        raise RemoteError(f"Kubernetes API: cannot connect: {exc}") from None
    if jobsets.CRD_FIELD not in text:
        raise RemoteError(f"the cluster's JobSet is older than {jobsets.OLDEST} (its CRD has no "
                          f"{jobsets.CRD_FIELD}): a restart could not tell a drain from exit 78; "
                          f"upgrade JobSet, or set eks.gang")


# A job id names what was submitted: NAME for an Indexed Job (batch/v1), jobsets/NAME for a
# JobSet, pytorchjobs/NAME for a Kubeflow PyTorchJob, so that status, logs and cancel act on the
# object that exists.
OPERATOR_PREFIX = "pytorchjobs/"
JOBSET_PREFIX = f"{jobsets.PLURAL}/"
_KUBEFLOW = ("kubeflow.org", "v1")
_JOBSET = (jobsets.GROUP, jobsets.VERSION)


def _kind(job_id: str) -> tuple[str, str]:
    """(kind, object name) of a job id."""
    if job_id.startswith(OPERATOR_PREFIX):
        return "PyTorchJob", job_id[len(OPERATOR_PREFIX):]
    if job_id.startswith(JOBSET_PREFIX):
        return "JobSet", job_id[len(JOBSET_PREFIX):]
    return "Job", job_id


def _where(ref: JobRef) -> tuple[Any, Any]:
    from ... import site as sites
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


def status(ref: JobRef) -> JobStatus:
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
    elif kind == "JobSet":
        job = _call(kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object_status,
                    *_JOBSET, ns, jobsets.PLURAL, name)
        st = job.get("status") or {}
        conditions = [c.get("type") for c in st.get("conditions") or []
                      if c.get("status") == "True"]
        # Its status counts child Jobs: the pods' counts are read off the pods themselves.
        phases = list(pods.values())
        active = sum(phase in ("Running", "Pending") for phase in phases)
        succeeded, failed = phases.count("Succeeded"), phases.count("Failed")
        state = ("Complete" if "Completed" in conditions else "Failed" if "Failed" in conditions
                 else "Running" if "Running" in phases else "Pending")
        return job_status("eks", ref.job_id, state, kind=kind, active=active,
                          succeeded=succeeded, failed=failed,
                          restarts=st.get("restarts", 0),
                          counted_restarts=st.get("restartsCountTowardsMax", 0),
                          pods={str(k): v for k, v in sorted(pods.items())})
    else:
        st = _call(kubernetes.client.BatchV1Api(api).read_namespaced_job_status, name,
                   ns).status
        conditions = [c.type for c in (st.conditions or []) if c.status == "True"]
        active, succeeded, failed = st.active or 0, st.succeeded or 0, st.failed or 0
        state = ("Complete" if "Complete" in conditions else "Failed" if "Failed" in conditions
                 else "Running" if active else "Pending")
    return job_status("eks", ref.job_id, state, kind=kind, active=active,
                      succeeded=succeeded, failed=failed,
                      pods={str(k): v for k, v in sorted(pods.items())})


def status_lines(ref: JobRef) -> list[str]:
    s = status(ref)
    d = s.detail
    lines = [f"{s.job_id}: {s.native} (active {d['active']}, succeeded {d['succeeded']}, "
             f"failed pods {d['failed']})"]
    if "restarts" in d:   # a JobSet: disruptions restart it without counting
        lines.append(f"  restarts: {d['restarts']} ({d['counted_restarts']} counted against "
                     "job.max_restarts)")
    lines += [f"  node {k}: {v}" for k, v in d["pods"].items()]
    return lines


def wait(ref: JobRef, echo: Echo, poll_s: float = 15.0) -> int:
    seen = None
    while True:
        state = status(ref).native
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
    if kind == "JobSet":   # its child Jobs, their pods and its Service go with it
        _call(kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object,
              *_JOBSET, ns, jobsets.PLURAL, name, body=body)
        return f"deleted JobSet {name} (its Jobs, pods and Service) in namespace {ns}"
    _call(kubernetes.client.BatchV1Api(api).delete_namespaced_job, name, ns, body=body)
    try:
        _call(kubernetes.client.CoreV1Api(api).delete_namespaced_service, name, ns)
    except RemoteError as exc:   # deleted by hand already: the job is what mattered
        return f"deleted Job {name} (and its pods) in namespace {ns}; its Service: {exc}"
    return f"deleted Job {name} and its Service (and its pods) in namespace {ns}"


def checked() -> tuple[list[str], list[str]]:
    """What `jobgen check` says it checked beyond rendering (notes), or could not (problems)."""
    try:
        from importlib.metadata import version
        return ["manifests validated against the Kubernetes "
                f"{K8S_VERSION} schemas (kubernetes-validate "
                f"{version('kubernetes-validate')})"], []
    except Exception:  # noqa: BLE001  (not installed: the [eks] extra)
        return [], ["kubernetes-validate is not installed, so the manifests were not checked "
                    "against the Kubernetes schemas: pip install 'jobgen[eks]'"]
