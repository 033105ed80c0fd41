"""The AWS Batch backend: one multi-node-parallel job definition per job spec (definition.py),
registered and submitted, and the job once submitted: status, logs, cancel (client.py holds the
calls to AWS)."""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from ...images import catalog as images
from ...inputs.site import Site
from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError
from .. import Echo, JobStatus, SubmitOptions, Submitted, aws, job_status
from ..protocol import JobRef
from . import client as batch_client
from . import stage as stage_job
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

def plan_stage(spec: JobSpec, name: str, sources: Sequence[str] = (),
               step: Optional[int] = None) -> Plan:
    """The job definition of a stage other than training (jobgen/payloads/stages.py): a
    single-node container job in the training image; one SubmitJob per task."""
    if name == "train":
        return plan(spec)
    argv = stage_job.argvs(spec, name, sources, step)
    jd = stage_job.job_definition(spec, name, argv[0])
    file = f"{spec.run_name}-{name}.job-definition.json"
    return Plan(backend="batch", files=(PlannedFile(file, json.dumps(jd, indent=2) + "\n"),),
                primary=file, submit_argv=("aws", "batch", "register-job-definition",
                                           "--cli-input-json", "file://{primary}"))


def _jobs(spec: JobSpec, options: SubmitOptions) -> list[tuple[str, dict[str, Any], list]]:
    """The submission's jobs in order, each (stage, its definition, one command per job: None
    for the definition's own); rendered whole before anything is submitted (a rehearsal's
    jobs after its prepare job read the dataset it makes: stages.chained)."""
    from ...payloads import stages
    jobs: list[tuple[str, dict[str, Any], list]] = []
    for name, one in stages.chained(spec, options.stages):
        if name == "train":
            jobs.append(("train", job_definition(one), [None]))
            continue
        argv = stage_job.argvs(one, name, options.sources, options.step)
        jobs.append((name, stage_job.job_definition(one, name, argv[0]),
                     [None] if len(argv) == 1 else argv))
    for _, _, commands in jobs[:-1]:   # too many for the next job: refused before any submit
        stage_job.depends_on([""] * len(commands))
    return jobs


def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    """The RegisterJobDefinition and SubmitJob requests `submit` makes, as JSON (a job after
    another depends on `<job id of STAGE job N>`)."""
    queue, calls = _queue(spec, options), []
    before: list[str] = []
    for name, jd, commands in _jobs(spec, options):
        calls += batch_client.dry_run(
            jd, queue=queue, nodes=spec.nodes if name == "train" else 0, run_name=_job_name(
                spec, name), depends_on=stage_job.depends_on(before), commands=commands)
        before = [f"<job id of the {name} job {k + 1}>" for k in range(len(commands))]
    region, origin = aws.region(spec.site, "batch")
    return json.dumps({"region": {"name": region, "from": origin}, "calls": calls},
                      indent=2) + "\n"


def _job_name(spec: JobSpec, stage: str) -> str:
    return spec.run_name if stage == "train" else f"{spec.run_name}-{stage}"


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    """Register the definitions `jobgen render --backend batch [--stage ...]` prints (only if
    no ACTIVE revision has their content) and submit them, each stage's jobs after the one
    before (dependsOn)."""
    if options.chain:
        raise ConfigError("--chain is for Slurm (a Batch job runs both passes on its nodes)")
    prepare(spec, strict=True, say=options.say)   # the image holds the job's payload
    queue = _queue(spec, options)
    jobs = _jobs(spec, options)
    batch = aws.client(spec.site, options.endpoint_url)
    ids: list[str] = []
    stages: list[str] = []
    notes: list[str] = []
    before: list[str] = []
    for name, jd, commands in jobs:
        done = batch_client.submit(batch, jd, queue=queue,
                                   nodes=spec.nodes if name == "train" else 0,
                                   run_name=_job_name(spec, name),
                                   depends_on=stage_job.depends_on(before), commands=commands)
        before = [job.job_id for job in done]
        ids += before
        stages += [name] * len(done)
        how = "registered" if done[0].definition.registered else "reusing unchanged"
        count = f" ({len(done)} jobs)" if len(done) > 1 else ""
        notes.append(f"{how} {done[0].definition.arn}; submitted {done[0].job_name}{count} "
                     f"to {queue}")
    return Submitted(tuple(ids), tuple(notes), queue, stages=tuple(stages))


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
