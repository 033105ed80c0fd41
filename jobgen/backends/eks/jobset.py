"""The one form of an EKS job: a JobSet (kubernetes-sigs/jobset, API jobset.x-k8s.io/v1alpha2),
the engine that restarts the whole gang of pods (a replaced pod cannot rejoin a running torchrun).

One replicatedJob ("node") whose child Job is Indexed (one pod per node) with `backoffLimit: 0`:
any pod's failure fails the child Job, and JobSet's failure policy acts on the child Job's failure
reason and message (failure_policy.go: the first matching rule wins; no match: RestartJobSet).
The pod failure policy tells the reasons apart, and every pod learns its attempt from JobSet's own
label (RESTART_ATTEMPT). The rules, the bound on uncounted restarts and where each was read
upstream: docs/eks.md.
"""
from __future__ import annotations

from typing import Any, Optional

# The release whose CRD the manifests are checked against (tests/k8s/), and how to install it:
# declared with the site's eks.gang key, whose refusal names it.
from ...inputs.site_sections import JOBSET_INSTALL as INSTALL  # noqa: F401  (backend.py)
from ...inputs.site_sections import JOBSET_RELEASE as RELEASE  # noqa: F401  (the tests' CRD)

API_VERSION = "jobset.x-k8s.io/v1alpha2"
# The rules' onJobFailureMessagePatterns came in v0.10.0: an older JobSet's API server drops the
# field, and its disruption rule would then restart (uncounted, forever) on 75 and 78 too, so
# `submit` reads the cluster's CRD first (CRD_FIELD) and refuses an older JobSet.
OLDEST = "v0.10.0"
CRD_NAME = "jobsets.jobset.x-k8s.io"
CRD_FIELD = "onJobFailureMessagePatterns"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
REPLICATED_JOB = "node"
# The label JobSet's controller puts on every child Job and pod: JobSet's status.restarts when
# the child Job was created (pkg/constants/constants.go RestartsKey), counted or not.
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
# The pod failure policy's rule indexes, which the child Job's failure message names.
DISRUPTION_RULE, NO_RETRY_RULE = 0, 1
# The longest JobSet name whose pods' names (NAME-node-0-K-xxxxx) stay within 63 characters.
MAX_NAME = 40


def name(base: str) -> str:
    """The JobSet's name: an RFC 1035 label (JobSet's webhook: pod and Service names start with a
    letter) short enough for its pods' names."""
    out = base[:MAX_NAME].strip("-")
    if not out[:1].isalpha():
        out = ("j-" + out)[:MAX_NAME].strip("-")
    return out


def main_host(jobset: str) -> str:
    """Pod 0's name in DNS: its host name under the JobSet's headless Service."""
    return f"{jobset}-{REPLICATED_JOB}-0-0.{jobset}"


def pod_failure_policy(container: str, no_retry: tuple[int, ...]) -> dict[str, Any]:
    """The child Job's: a disruption or a status no restart cures fails the child Job at once
    (reason PodFailurePolicy, the rule's index in the message); any other failure is counted
    against backoffLimit 0 (reason BackoffLimitExceeded). The disruption rule comes first: an
    evicted pod's status is the eviction's doing, whatever it is."""
    rules = [{"action": "FailJob", "onPodConditions": [
                  {"type": "DisruptionTarget", "status": "True"}]},
             {"action": "FailJob", "onExitCodes": {
                 "containerName": container, "operator": "In", "values": list(no_retry)}}]
    assert (DISRUPTION_RULE, NO_RETRY_RULE) == (0, 1)   # the order the messages name
    return {"rules": rules}


def failure_policy(max_restarts: int, no_retry: tuple[int, ...]) -> dict[str, Any]:
    codes = "|".join(str(c) for c in no_retry)
    return {"maxRestarts": max_restarts, "rules": [
        {"name": "disruption", "action": "RestartJobSetAndIgnoreMaxRestarts",
         "onJobFailureReasons": ["PodFailurePolicy"],
         "onJobFailureMessagePatterns": [
             f"has condition DisruptionTarget matching FailJob rule at index {DISRUPTION_RULE}"]},
        {"name": "no_restart_cures", "action": "FailJobSet",
         "onJobFailureReasons": ["PodFailurePolicy"],
         "onJobFailureMessagePatterns": [
             f"failed with exit code ({codes}) matching FailJob rule at index {NO_RETRY_RULE}"]},
        {"name": "time_limit", "action": "FailJobSet",
         "onJobFailureReasons": ["DeadlineExceeded"]},
        {"name": "failure", "action": "RestartJobSet",
         "onJobFailureReasons": ["BackoffLimitExceeded"]}]}


def manifest(meta: dict[str, Any], template_meta: dict[str, Any], pod: dict[str, Any],
             nodes: int, max_restarts: int, deadline: Optional[int],
             no_retry: tuple[int, ...]) -> dict[str, Any]:
    container = pod["containers"][0]["name"]
    job: dict[str, Any] = {
        "completionMode": "Indexed", "completions": nodes, "parallelism": nodes,
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(container, no_retry),
        "template": {"metadata": template_meta, "spec": pod}}
    if deadline:
        job["activeDeadlineSeconds"] = deadline
    return {"apiVersion": API_VERSION, "kind": "JobSet", "metadata": meta, "spec": {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": failure_policy(max_restarts, no_retry),
        "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1,
                            "template": {"metadata": {"labels": dict(meta["labels"])},
                                         "spec": job}}]}}


def child_job(doc: dict[str, Any]) -> dict[str, Any]:
    """The child Job a JobSet's controller creates (batch/v1), for schema checks and the
    rehearsal: NAME-node-0, its pods' subdomain the JobSet's name."""
    rjob = doc["spec"]["replicatedJobs"][0]
    spec = dict(rjob["template"]["spec"])
    template = dict(spec["template"])
    template["spec"] = dict(template["spec"], subdomain=doc["metadata"]["name"])
    spec["template"] = template
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": dict(rjob["template"].get("metadata") or {},
                             name=f"{doc['metadata']['name']}-{rjob['name']}-0",
                             namespace=doc["metadata"].get("namespace", "default")),
            "spec": spec}
