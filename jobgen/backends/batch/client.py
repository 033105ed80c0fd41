"""AWS Batch's API for the batch backend: register a job definition only when its content changed,
submit it, follow it node by node, show its logs, cancel it. Every call goes through
`jobgen.backends.aws.call`; the clients come from `jobgen.backends.aws.client`."""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from ...plumbing.errors import ConfigError, RemoteError
from ...plumbing.record import record
from .. import aws
from ..aws import call

Echo = Callable[[str], None]
HASH_TAG = "jobgen:hash"
QUEUED = ("SUBMITTED", "PENDING", "RUNNABLE")   # cancel_job stops these
STARTED = ("STARTING", "RUNNING")               # only terminate_job stops these
DONE = ("SUCCEEDED", "FAILED")


# --- job definitions and submission --------------------------------------------------------------

@record
class Definition:
    arn: str
    registered: bool   # False: an ACTIVE revision with the same content hash was reused


def _active_revisions(batch: Any, name: str) -> Iterator[dict[str, Any]]:
    """Every ACTIVE revision of the definition `name`, through botocore's paginator."""
    pages = batch.get_paginator("describe_job_definitions").paginate(
        jobDefinitionName=name, status="ACTIVE")
    yield from call(pages.build_full_result, client=batch).get("jobDefinitions", [])


def ensure_definition(batch: Any, jd: dict[str, Any]) -> Definition:
    """The ARN of an ACTIVE revision of `jd` with the same content hash, registering a new
    revision only when there is none (so resubmitting never piles up identical revisions)."""
    digest = jd.get("tags", {}).get(HASH_TAG)
    for rev in sorted(_active_revisions(batch, jd["jobDefinitionName"]),
                      key=lambda r: -int(r.get("revision", 0))):
        tags = rev.get("tags")
        if tags is None:   # older APIs leave tags out of the description
            tags = call(batch.list_tags_for_resource,
                         resourceArn=rev["jobDefinitionArn"]).get("tags", {})
        if digest and tags.get(HASH_TAG) == digest:
            return Definition(rev["jobDefinitionArn"], registered=False)
    return Definition(call(batch.register_job_definition, **jd)["jobDefinitionArn"],
                      registered=True)


def job_name(run_name: str) -> str:
    """Batch job names: 1-128 letters, digits, '-' and '_', starting with a letter or digit."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", run_name).lstrip("-_")
    return (name or "jobgen")[:128]


@record
class Submitted:
    job_id: str
    job_name: str
    definition: Definition


def submit_request(jd: dict[str, Any], definition_arn: str, *, queue: str, nodes: int,
                   run_name: str, depends_on: Sequence[dict[str, str]] = (),
                   command: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """The SubmitJob request for a registered revision of `jd`: a multi-node job on `nodes`
    nodes, or (nodes 0) a container job running `command` where given; after the jobs of
    `depends_on`."""
    request: dict[str, Any] = {"jobName": job_name(run_name), "jobQueue": queue,
                               "jobDefinition": definition_arn}
    if depends_on:
        request["dependsOn"] = [dict(d) for d in depends_on]
    if nodes:
        request["nodeOverrides"] = {"numNodes": nodes}
    if command is not None:
        request["containerOverrides"] = {"command": list(command)}
    return {**request, "tags": dict(jd.get("tags", {})), "propagateTags": True}


def submit(batch: Any, jd: dict[str, Any], *, queue: str, nodes: int, run_name: str,
           depends_on: Sequence[dict[str, str]] = (),
           commands: Sequence[Optional[Sequence[str]]] = (None,)) -> list[Submitted]:
    """Register `jd` if its content is new, then submit it to `queue`: one job per entry of
    `commands` (None: the definition's own command)."""
    definition = ensure_definition(batch, jd)
    done = []
    for command in commands:
        request = submit_request(jd, definition.arn, queue=queue, nodes=nodes,
                                 run_name=run_name, depends_on=depends_on, command=command)
        response = call(batch.submit_job, **request)
        done.append(Submitted(response["jobId"], request["jobName"], definition))
    return done


def dry_run(jd: dict[str, Any], *, queue: str, nodes: int, run_name: str,
            depends_on: Sequence[dict[str, str]] = (),
            commands: Sequence[Optional[Sequence[str]]] = (None,)) -> list[dict[str, Any]]:
    """The requests `submit` makes, offline: which revision SubmitJob names is only known
    once Batch answers, so it is written as `<the ACTIVE revision of NAME tagged HASH>`."""
    name, digest = jd["jobDefinitionName"], jd.get("tags", {}).get("jobgen:hash", "")
    arn = f"<the ACTIVE revision of {name} tagged jobgen:hash={digest}>"
    return [
        {"operation": "RegisterJobDefinition",
         "when": f"no ACTIVE revision of {name} carries the tag jobgen:hash={digest}",
         "request": jd},
        *({"operation": "SubmitJob",
           "request": submit_request(jd, arn, queue=queue, nodes=nodes, run_name=run_name,
                                     depends_on=depends_on, command=command)}
          for command in commands)]


# --- following jobs ------------------------------------------------------------------------------

def describe(batch: Any, job_id: str) -> dict[str, Any]:
    jobs = call(batch.describe_jobs, jobs=[job_id]).get("jobs", [])
    if not jobs:
        raise RemoteError(f"AWS Batch: no job {job_id!r} (Batch forgets jobs 7 days after "
                          "they finish)")
    return dict(jobs[0])


def node_jobs(batch: Any, job: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The nodes of a multi-node job (`<id>#<n>`) that Batch describes, by node index."""
    num = int((job.get("nodeProperties") or {}).get("numNodes", 0))
    ids = [f"{job['jobId']}#{i}" for i in range(num)]
    found: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), 100):   # describe_jobs takes at most 100 ids
        for node in call(batch.describe_jobs, jobs=ids[start:start + 100]).get("jobs", []):
            found[int(node["jobId"].rpartition("#")[2])] = node
    return found


def _main_node(job: dict[str, Any]) -> int:
    return int((job.get("nodeProperties") or {}).get("mainNode", 0))


def _node(job: dict[str, Any], nodes: dict[int, dict[str, Any]], index: int
          ) -> Optional[dict[str, Any]]:
    """Node `index`'s description; for the main node, the parent's own when Batch (or an
    emulator) describes no `<id>#<n>` children: the job's status is the main node's."""
    if index in nodes:
        return nodes[index]
    return job if index == _main_node(job) and job.get("container") else None


def _reason(job: dict[str, Any]) -> str:
    return job.get("statusReason") or (job.get("container") or {}).get("reason") or ""


def wait(batch: Any, job_id: str, *, echo: Echo, poll_s: float = 15.0,
         timeout_s: Optional[float] = None) -> int:
    """Print the job's and its nodes' state changes until it ends; 0 if it SUCCEEDED, else 1."""
    seen: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        job = describe(batch, job_id)
        changes = [("job", job)] + [(f"node {i}", n) for i, n in
                                    sorted(node_jobs(batch, job).items())]
        for label, item in changes:
            if seen.get(label) != item.get("status"):
                seen[label] = item.get("status", "?")
                echo(f"{time.strftime('%H:%M:%S')} {job_id} {label}: {seen[label]}")
        if job.get("status") in DONE:
            if _reason(job):
                echo(f"{job_id}: {job['status']}: {_reason(job)}")
            return 0 if job["status"] == "SUCCEEDED" else 1
        if deadline is not None and time.monotonic() > deadline:
            raise RemoteError(f"job {job_id} still {job.get('status')} after {timeout_s:g} s")
        time.sleep(poll_s)


def status(batch: Any, job_id: str) -> dict[str, Any]:
    """The job and each of its nodes as data (`jobgen status --json`)."""
    job = describe(batch, job_id)
    nodes = node_jobs(batch, job)
    num = int((job.get("nodeProperties") or {}).get("numNodes", 0))
    state = job.get("status", "?")
    shown: list[dict[str, Any]] = []
    for i in range(num):
        described = _node(job, nodes, i)
        entry: dict[str, Any] = {"index": i, "main": i == _main_node(job)}
        if described is None:
            entry["state"] = "UNKNOWN" if state in DONE else "NOT_STARTED"
        else:
            container = described.get("container") or {}
            entry.update({"state": described.get("status", "?"),
                          "exit_code": container.get("exitCode"),
                          "log_stream": container.get("logStreamName") or "",
                          "reason": _reason(described) if described is not job else ""})
        shown.append(entry)
    return {"backend": "batch", "job_id": job["jobId"], "name": job.get("jobName", ""),
            "state": state, "finished": state in DONE, "reason": _reason(job),
            "nodes": shown}


def status_lines(batch: Any, job_id: str) -> list[str]:
    """One summary line, then one line per node: status, exit code, log stream, reason."""
    st = status(batch, job_id)
    head = f"{st['job_id']}  {st['name']}  {st['state']}"
    if st["nodes"]:
        head += f"  {len(st['nodes'])} nodes"
    lines = [head + (f"  ({st['reason']})" if st["reason"] else "")]
    for entry in st["nodes"]:
        role = " (main)" if entry["main"] else ""
        if "exit_code" not in entry:
            lines.append(f"  node {entry['index']}{role}: " + (
                "no details from Batch" if entry["state"] == "UNKNOWN" else "not started"))
            continue
        code = "-" if entry["exit_code"] is None else entry["exit_code"]
        line = (f"  node {entry['index']}{role}: {entry['state']}  exit {code}  "
                f"log {entry['log_stream'] or '-'}")
        lines.append(line + (f"  ({entry['reason']})" if entry["reason"] else ""))
    return lines


def cancel(batch: Any, job_id: str, reason: str = "cancelled with jobgen") -> str:
    """cancel_job for a queued job, terminate_job for a started one; says which it did."""
    state = describe(batch, job_id).get("status", "?")
    if state in QUEUED:
        call(batch.cancel_job, jobId=job_id, reason=reason)
        return f"cancelled {job_id} (was {state})"
    if state in STARTED:
        call(batch.terminate_job, jobId=job_id, reason=reason)
        return f"terminating {job_id} (was {state}): its nodes are being stopped"
    return f"{job_id} already finished ({state}): nothing to cancel"


# --- logs ----------------------------------------------------------------------------------------

def log_location(batch: Any, job_id: str, node: int, default_group: str
                 ) -> tuple[str, Optional[str], dict[str, Any]]:
    """(log group, log stream or None while the node has not started, the job)."""
    job = describe(batch, job_id)
    num = int((job.get("nodeProperties") or {}).get("numNodes", 1))
    if not 0 <= node < num:
        raise ConfigError(f"--node: job {job_id} has {num} nodes (0 to {num - 1})")
    group = default_group
    for rng in (job.get("nodeProperties") or {}).get("nodeRangeProperties", []):
        options = ((rng.get("container") or {}).get("logConfiguration") or {}).get("options")
        group = (options or {}).get("awslogs-group", group)
    found = call(batch.describe_jobs, jobs=[f"{job_id}#{node}"]).get("jobs", [])
    described = _node(job, dict(enumerate(found, start=node)), node) or {}
    return group, (described.get("container") or {}).get("logStreamName"), job


def logs(batch: Any, logs_client: Any, job_id: str, *, node: int, echo: Echo,
         follow: bool = False, default_group: str = "/aws/batch/job", poll_s: float = 5.0,
         timeout_s: Optional[float] = None) -> None:
    """Print node `node`'s log events; with `follow`, keep printing until the job has ended."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def pause(what: str) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise RemoteError(f"job {job_id}: still {what} after {timeout_s:g} s")
        time.sleep(poll_s)

    while True:
        group, stream, job = log_location(batch, job_id, node, default_group)
        if stream:
            break
        if not follow or job.get("status") in DONE:
            raise RemoteError(f"job {job_id} node {node}: no log stream "
                              f"(job {job.get('status', '?')})")
        pause("without a log stream")
    seen = {"job": job}

    def running() -> None:
        pause("running")
        seen["job"] = describe(batch, job_id)

    aws.follow(aws.LogStream(logs_client, group, stream), echo, keep_on=follow,
               ended=lambda: seen["job"].get("status") in DONE, pause=running)
