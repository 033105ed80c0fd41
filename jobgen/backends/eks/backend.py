"""The EKS backend: the JobSet (manifests.py) handed to the cluster with the official Kubernetes
client, and the job once submitted: status, logs, cancel. The API client, job ids and pods are in
cluster.py."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

from ...images import catalog as images
from ...inputs.site import Site
from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError, RemoteError
from .. import Echo, JobStatus, SubmitOptions, Submitted, job_status
from ..protocol import JobRef
from . import cluster
from . import jobset as jobsets
from .manifests import (  # noqa: F401  (efa_interfaces: the health gate asks the backend)
    K8S_VERSION,
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


def shares_run_folder(site: Site) -> bool:
    """Whether the pods share the run folder: the site names the FSx claim (eks.shared_pvc)."""
    return bool(site.eks and site.eks.shared_pvc)


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


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    kubernetes = cluster.kube()
    if options.chain:
        raise ConfigError("--chain is for Slurm (the pods run both passes)")
    prepare(spec, strict=True, say=options.say)   # the image holds the job's payload
    (doc,) = manifests(spec)
    api = cluster.api_client(spec.site)
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    _jobset_installed(kubernetes, api)
    cluster.call(kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object,
                 *cluster.JOBSET, ns, jobsets.PLURAL, doc)
    return Submitted((f"{cluster.JOBSET_PREFIX}{name}",),
                     (f"created JobSet {name} in namespace {ns}",))


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
            raise RemoteError(f"the cluster has no JobSet ({jobsets.CRD_NAME}), which jobgen's EKS "
                              f"jobs are: install it: {jobsets.INSTALL}") from None
        _say_once(f"note: cannot read the CRD {jobsets.CRD_NAME} ({exc.status} {exc.reason}): "
                  f"not checked that JobSet is {jobsets.OLDEST} or later")
        return
    except OSError as exc:
        raise RemoteError(f"Kubernetes API: cannot connect: {exc}") from None
    if jobsets.CRD_FIELD not in text:
        raise RemoteError(f"the cluster's JobSet is older than {jobsets.OLDEST} (its CRD has no "
                          f"{jobsets.CRD_FIELD}): a restart could not tell a drain from exit 78; "
                          f"upgrade it: {jobsets.INSTALL}")


def status(ref: JobRef) -> JobStatus:
    kubernetes = cluster.kube()
    site, api = cluster.where(ref)
    ns = site.eks.namespace
    name = cluster.name_of(ref.job_id)
    pods = {cluster.index(p): p.status.phase for p in cluster.pods(api, ns, name)}
    job = cluster.call(
        kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object_status,
        *cluster.JOBSET, ns, jobsets.PLURAL, name)
    st = job.get("status") or {}
    conditions = [c.get("type") for c in st.get("conditions") or [] if c.get("status") == "True"]
    # Its status counts child Jobs: the pods' counts are read off the pods themselves.
    phases = list(pods.values())
    active = sum(phase in ("Running", "Pending") for phase in phases)
    state = ("Complete" if "Completed" in conditions else "Failed" if "Failed" in conditions
             else "Running" if "Running" in phases else "Pending")
    return job_status("eks", ref.job_id, state, kind="JobSet", active=active,
                      succeeded=phases.count("Succeeded"), failed=phases.count("Failed"),
                      restarts=st.get("restarts", 0),
                      counted_restarts=st.get("restartsCountTowardsMax", 0),
                      pods={str(k): v for k, v in sorted(pods.items())})


def status_lines(ref: JobRef) -> list[str]:
    s = status(ref)
    d = s.detail
    lines = [f"{s.job_id}: {s.native} (active {d['active']}, succeeded {d['succeeded']}, "
             f"failed pods {d['failed']})"]
    # Disruptions restart it without counting (up to the site's eks.max_disruptions).
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
    kubernetes = cluster.kube()
    site, api = cluster.where(ref)
    ns = site.eks.namespace
    want = node_index or 0
    pods = [p for p in cluster.pods(api, ns, cluster.name_of(ref.job_id))
            if cluster.index(p) == want]
    if not pods:
        raise RemoteError(f"job {ref.job_id}: no pod for node {want} in namespace {ns}")
    core = kubernetes.client.CoreV1Api(api)
    if follow:
        stream = cluster.call(core.read_namespaced_pod_log, pods[0].metadata.name, ns, follow=True,
                              _preload_content=False)
        for chunk in stream.stream():
            echo(chunk.decode("utf-8", "replace"))
        return
    echo(cluster.call(core.read_namespaced_pod_log, pods[0].metadata.name, ns))


def cancel(ref: JobRef) -> str:
    kubernetes = cluster.kube()
    site, api = cluster.where(ref)
    ns = site.eks.namespace
    body = kubernetes.client.V1DeleteOptions(propagation_policy="Foreground")
    name = cluster.name_of(ref.job_id)
    # Its child Jobs, their pods and its Service go with it.
    cluster.call(kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object,
                 *cluster.JOBSET, ns, jobsets.PLURAL, name, body=body)
    return f"deleted JobSet {name} (its Jobs, pods and Service) in namespace {ns}"


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
