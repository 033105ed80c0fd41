"""The AWS Batch backend: one multi-node-parallel job definition per job spec (definition.py),
registered and submitted, and the job once submitted: status, logs, cancel (client.py holds the
calls to AWS)."""
from __future__ import annotations

import json
from typing import Any, Optional

from ...images import catalog as images
from ...inputs.site import Site
from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError
from .. import Echo, JobStatus, SubmitOptions, Submitted, aws, job_status
from ..protocol import JobRef
from . import client as batch_client
from .definition import (  # noqa: F401  (re-exported: the health gate asks the backend, tests)
    NODE_LOST_STATUS,
    NODE_SILENCE_S,
    definition_name,
    efa_interfaces,
    job_definition,
    run_folder_shared,
)


def node_site(site: Site) -> Site:
    """The site as a Batch node sees it: the same paths (the shared file system is mounted
    where the site says)."""
    return site


def shares_run_folder(site: Site) -> bool:
    """Whether the nodes share the run folder: work_dir on batch.shared_volume."""
    return run_folder_shared(site)


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
    from ...inputs import site as sites
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
