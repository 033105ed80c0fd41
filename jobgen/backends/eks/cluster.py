"""The Kubernetes API as the EKS backend and its watch use it: the client (from the kubeconfig,
as kubectl reads it), calls whose failures become one line, the JobSet a job id names and its
pods with their node index."""
from __future__ import annotations

import json
from typing import Any

from ...plumbing.errors import ConfigError, RemoteError
from ..protocol import JobRef
from . import jobset as jobsets
from .manifests import LABEL


def kube() -> Any:
    """The Kubernetes client package, or one line naming the extra that brings it."""
    try:
        import kubernetes
    except ImportError:
        raise ConfigError("--backend eks needs the kubernetes package, which is not "
                          "installed: pip install 'jobgen[eks]'") from None
    return kubernetes


def api_client(site: Any) -> Any:
    """An API client from the kubeconfig, as kubectl reads it (KUBECONFIG, ~/.kube/config)."""
    kubernetes = kube()
    try:
        return kubernetes.config.new_client_from_config(
            context=site.eks.context if site.eks else None)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise ConfigError(f"kubeconfig: {exc}") from None


def call(method: Any, *args: Any, **kwargs: Any) -> Any:
    kubernetes = kube()
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


# A job id is jobsets/NAME: the JobSet that was submitted.
JOBSET_PREFIX = f"{jobsets.PLURAL}/"
JOBSET = (jobsets.GROUP, jobsets.VERSION)


def name_of(job_id: str) -> str:
    """The JobSet's name in a job id; one line for an id of another form."""
    if not job_id.startswith(JOBSET_PREFIX):
        raise ConfigError(f"job id {job_id!r} is not a JobSet's ({JOBSET_PREFIX}NAME): jobgen's "
                          "EKS jobs are JobSets only (delete another form with kubectl)")
    return job_id[len(JOBSET_PREFIX):]


def where(ref: JobRef) -> tuple[Any, Any]:
    from ...inputs import site as sites
    site = sites.load(ref.site if ref.site is not None else (ref.run.site or None)
                      if ref.run else None)
    if site.eks is None:
        raise ConfigError(f"site {site.name}: has no eks section (namespace)")
    return site, api_client(site)


def pods(api: Any, ns: str, name: str) -> list[Any]:
    kubernetes = kube()
    found = call(kubernetes.client.CoreV1Api(api).list_namespaced_pod, ns,
                 label_selector=f"{LABEL}={name}")
    return list(found.items)


def index(pod: Any) -> int:
    """A pod's node index: its completion index in the child Job (Kubernetes' label)."""
    labels = pod.metadata.labels or {}
    value = labels.get("batch.kubernetes.io/job-completion-index")
    return int(value) if value is not None else -1
