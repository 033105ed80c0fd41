"""The JobSet form of an EKS job (kubernetes-sigs/jobset, API jobset.x-k8s.io/v1alpha2): the
engine that restarts the whole gang of pods, where the site says the cluster has it
(`eks.gang: jobset`, the recommended setting).

One replicatedJob ("node", one child Job) whose child Job is Indexed: one pod per node, and
`backoffLimit: 0`, so any pod's failure fails the child Job. JobSet's failure policy then acts on
the child Job's failure reason (pkg/controllers/failure_policy.go at v0.12.0: the rules are
evaluated in order, the first whose onJobFailureReasons and onJobFailureMessagePatterns match
the child Job's Failed condition wins, no match means RestartJobSet). Restarting the JobSet
deletes every child Job, so every pod gets SIGTERM and its grace period, and creates them again:
the new gang resumes from the newest step every node holds.

A child Job fails with one of three reasons that matter here, and the pod failure policy below is
what tells them apart (Kubernetes' Job controller writes the matched rule into the message,
pkg/controller/job/pod_failure_policy.go):
  PodFailurePolicy      "Pod NS/POD has condition DisruptionTarget matching FailJob rule at
                        index 0": the pod was evicted (a drain), preempted or its node shut down.
                        -> RestartJobSetAndIgnoreMaxRestarts: not the job's failure, not counted.
  PodFailurePolicy      "Container trainer for pod NS/POD failed with exit code 78 matching
                        FailJob rule at index 1" (or 75) -> FailJobSet: a configuration error
                        (78) fails every attempt alike; a bad node (75, the health gate) would
                        most likely get the replacement pod again, since nothing cordons it: the
                        job fails at once, naming the node, to be resubmitted once it is
                        cordoned.
  BackoffLimitExceeded  any other pod failure -> RestartJobSet, counted: failurePolicy.maxRestarts
                        is the recipe's job.max_restarts.
  DeadlineExceeded      the time limit (the child Job's activeDeadlineSeconds) -> FailJobSet.
                        A restart creates the child Job anew, so the limit counts from the
                        newest restart.

Pod K's host name is NAME-node-0-K and JobSet's headless Service (network.enableDNSHostnames,
named after the JobSet) resolves NAME-node-0-K.NAME: the main node is NAME-node-0-0.NAME
(api/jobset/v1alpha2/jobset_types.go, Network: "<jobSet.name>-<spec.replicatedJob.name>-
<job-index>-<pod-index>.<subdomain>", the subdomain defaulting to the JobSet's name).
The semantics above were read in kubernetes-sigs/jobset at v0.12.0 (f22e565): pkg/controllers/
failure_policy.go, pkg/webhooks/jobset_webhook.go (names, failure reasons), site/content/en/docs/
tasks/failure_policy.md (its host-maintenance example is this design).
"""
from __future__ import annotations

from typing import Any, Optional

API_VERSION = "jobset.x-k8s.io/v1alpha2"
# The release whose CRD the manifests are checked against (tests/k8s/jobset-crd-v0.12.0.yaml).
# The rules' onJobFailureMessagePatterns came in v0.10.0: an older JobSet's API server drops the
# field, and its disruption rule would then restart (uncounted, forever) on 75 and 78 too, so
# `submit` reads the cluster's CRD first (CRD_FIELD) and refuses an older JobSet.
RELEASE = "v0.12.0"
OLDEST = "v0.10.0"
CRD_NAME = "jobsets.jobset.x-k8s.io"
CRD_FIELD = "onJobFailureMessagePatterns"
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
REPLICATED_JOB = "node"
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
