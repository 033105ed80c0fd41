"""The SageMaker backend: the CreateTrainingJob request (request.py) sent with boto3, and the
training job once created: status, CloudWatch logs per instance, stop."""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Optional, Sequence

from ...images import catalog as images
from ...inputs.site import Site
from ...inputs.site_sections import SageMakerSite
from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError, RemoteError
from .. import Echo, JobStatus, SubmitOptions, Submitted, aws, job_status
from ..aws import call as _call
from ..protocol import JobRef
from .request import CHECKPOINTS, job_name, training_job, validate  # noqa: F401  (tests)
from .stage import stage_job

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
# Where a SageMaker node finds its data channel.
DATA = "/opt/ml/input/data/train"
DONE = ("Completed", "Failed", "Stopped")
def node_site(site: Site) -> Site:
    """The site as a SageMaker node sees it: the run in its checkpoint folder (synced to S3),
    the data channel, and the compile cache on S3 with the checkpoints."""
    section = site.sagemaker
    assert section is not None
    return dataclasses.replace(site, paths=dataclasses.replace(
        site.paths, work_dir=CHECKPOINTS, data_dir=DATA, compile_cache=section.compile_cache,
        local_compile_cache=None, data_read_only=_data_read_only(section)))


def _data_read_only(section: SageMakerSite) -> bool:
    """An FSx channel is mounted as its access mode says; an S3 channel is mounted with
    FastFile (request.py), read-only. Either way, what rank 0 would write beside the data
    (NeMo's index files) is written elsewhere: on a read-write FSx channel every instance sees
    it, anywhere else each instance needs its own (jobgen/payloads/neuron_nemo.py)."""
    return section.fsx is None or section.fsx.access_mode == "ro"


def plan(spec: JobSpec) -> Plan:
    return _plan(f"{spec.run_name}.training-job.json", training_job(spec))


def _plan(name: str, request: dict[str, Any]) -> Plan:
    return Plan(backend="sagemaker", files=(PlannedFile(name, json.dumps(request, indent=2)
                                                        + "\n"),), primary=name,
                submit_argv=("aws", "sagemaker", "create-training-job", "--cli-input-json",
                             "file://{primary}"))


def plan_stage(spec: JobSpec, name: str, sources: Sequence[str] = (),
               step: Optional[int] = None) -> Plan:
    """The export stage's training job (stage.py): one instance on the run's checkpoints."""
    if name == "train":
        return plan(spec)
    return _plan(f"{spec.run_name}-{name}.training-job.json",
                 stage_job(spec, name, sources, step))


def _request(spec: JobSpec, options: SubmitOptions) -> dict[str, Any]:
    """The one job a submission makes: training, or one stage. SageMaker has no dependencies
    between training jobs, so stages are not chained: one line says so."""
    if len(options.stages) > 1:
        raise ConfigError(f"--stages {','.join(options.stages)}: --backend sagemaker cannot "
                          "run stages one after another (a SageMaker training job cannot wait "
                          "for another): submit each on its own, --stages export once training "
                          "has completed")
    if options.stages == ("train",):
        return training_job(spec)
    return stage_job(spec, options.stages[0], options.sources, options.step)


# --- the job once it is submitted -----------------------------------------------------------

def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """The image must carry the payload the job is rendered with (its nodes check it)."""
    images.prepare(spec, "sagemaker")

def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    name, origin = aws.region(spec.site, "sagemaker")
    return json.dumps({"region": {"name": name, "from": origin},
                       "CreateTrainingJob": _request(spec, options)}, indent=2) + "\n"


def _client(site: Any, endpoint_url: Optional[str], service: str = "sagemaker") -> Any:
    return aws.client(site, endpoint_url, service, region_of="sagemaker")


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    """CreateTrainingJob with the request `jobgen render --backend sagemaker [--stage ...]`
    prints. Names are never reused by SageMaker: a second submission of the same request gets
    -2, -3, ..."""
    if options.chain:
        raise ConfigError("--chain is for Slurm (a SageMaker job runs both passes on its "
                          "instances)")
    request = _request(spec, options)
    prepare(spec, strict=True, say=options.say)   # the image holds the job's payload
    client = _client(spec.site, options.endpoint_url)
    base = request["TrainingJobName"]
    for attempt in range(1, 100):
        name = base if attempt == 1 else f"{base[:60]}-{attempt}"
        try:
            _call(client.describe_training_job, TrainingJobName=name)
        except RemoteError as exc:
            if "(ValidationException)" not in str(exc):
                raise
            break   # SageMaker: no such job, so the name is free
    else:
        raise RemoteError(f"SageMaker: 99 jobs named {base}[-N] exist already")
    request["TrainingJobName"] = name
    _call(client.create_training_job, **request)
    resources = request["ResourceConfig"]
    return Submitted((name,), (f"created SageMaker training job {name} "
                               f"({resources['InstanceCount']} x {resources['InstanceType']})",),
                     stages=() if options.stages == ("train",) else options.stages)


def _ref_client(ref: JobRef, service: str = "sagemaker") -> Any:
    from ...inputs import site as sites
    site = sites.load(ref.site if ref.site is not None else (ref.run.site or None)
                      if ref.run else None)
    endpoint = ref.endpoint_url or (ref.run.endpoint_url if ref.run else None)
    return _client(site, endpoint, service)


def describe(client: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = _call(client.describe_training_job, TrainingJobName=name)
    return found


def status(ref: JobRef) -> JobStatus:
    job = describe(_ref_client(ref), ref.job_id)
    return job_status("sagemaker", ref.job_id, str(job.get("TrainingJobStatus", "")),
                      job.get("FailureReason", ""), secondary=job.get("SecondaryStatus"),
                      instances=job.get("ResourceConfig", {}).get("InstanceCount"),
                      instance_type=job.get("ResourceConfig", {}).get("InstanceType"))


def status_lines(ref: JobRef) -> list[str]:
    s = status(ref)
    line = (f"{s.job_id}: {s.native} ({s.detail['secondary']}), {s.detail['instances']} x "
            f"{s.detail['instance_type']}")
    return [line + (f": {s.reason}" if s.reason else "")]


def wait(ref: JobRef, echo: Echo, poll_s: float = 30.0) -> int:
    client = _ref_client(ref)
    seen = None
    while True:
        job = describe(client, ref.job_id)
        state = (job.get("TrainingJobStatus"), job.get("SecondaryStatus"))
        if state != seen:
            echo(f"{ref.job_id}: {state[0]} ({state[1]})\n")
            seen = state
        if state[0] in DONE:
            return 0 if state[0] == "Completed" else 1
        time.sleep(poll_s)


def logs(ref: JobRef, node_index: Optional[int], follow: bool, echo: Echo) -> None:
    """Instance `node` (0: algo-1)'s CloudWatch log events: group /aws/sagemaker/TrainingJobs,
    streams JOB/algo-N-EPOCH."""
    client, logs_client = _ref_client(ref), _ref_client(ref, "logs")
    prefix = f"{ref.job_id}/algo-{(node_index or 0) + 1}-"
    while True:
        streams = _call(logs_client.describe_log_streams, logGroupName=LOG_GROUP,
                        logStreamNamePrefix=prefix).get("logStreams", [])
        job = describe(client, ref.job_id)
        if streams:
            break
        if not follow or job.get("TrainingJobStatus") in DONE:
            raise RemoteError(f"training job {ref.job_id} instance {(node_index or 0) + 1}: no "
                              f"log stream {prefix}* in {LOG_GROUP}")
        time.sleep(10)
    stream = sorted(s["logStreamName"] for s in streams)[-1]
    aws.follow(aws.LogStream(logs_client, LOG_GROUP, stream), echo, keep_on=follow,
               ended=lambda: describe(client, ref.job_id).get("TrainingJobStatus") in DONE,
               pause=lambda: time.sleep(10), end="\n")


def cancel(ref: JobRef) -> str:
    client = _ref_client(ref)
    _call(client.stop_training_job, TrainingJobName=ref.job_id)
    return f"stopping SageMaker training job {ref.job_id}"


def checked() -> tuple[list[str], list[str]]:
    """What `jobgen check` says it checked beyond rendering (notes), or could not (problems)."""
    return ["requests validated against botocore's SageMaker model (members, types, lengths, "
            "counts, patterns, instance types)"], []
