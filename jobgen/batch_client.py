"""The AWS Batch side of `jobgen batch`: register a job definition only when its content changed,
submit it, follow it node by node, show its logs, cancel it.

boto3 is imported inside `client()` only, so rendering never loads the AWS SDK. Every other
function takes its boto3 clients as arguments (tests hand in clients pointed at moto, or stubbed).
Every AWS call goes through `_call`, the one place where throttling is retried and AWS's
exceptions become one-line jobgen errors. Set-up mistakes (profile, config and credentials
files, region, endpoint) are blamed on what holds them, and no message shows a URL's password
or the environment's secret key (`redact`).
"""
from __future__ import annotations

import importlib
import os
import re
import time
import urllib.parse
import weakref
from typing import Any, Callable, Iterator, Optional

from .errors import ConfigError, JobgenError, RemoteError
from .record import record
from .site import REGION_RE, Site

Echo = Callable[[str], None]
HASH_TAG = "jobgen:hash"
QUEUED = ("SUBMITTED", "PENDING", "RUNNABLE")   # cancel_job stops these
STARTED = ("STARTING", "RUNNING")               # only terminate_job stops these
DONE = ("SUCCEEDED", "FAILED")
THROTTLED = ("Throttling", "ThrottlingException", "TooManyRequestsException",
             "RequestLimitExceeded", "SlowDown")
# botocore retries throttling and transient errors itself ("standard" mode: exponential backoff
# with jitter); these are jobgen's defaults where the user's AWS config sets neither.
RETRY_MODE, MAX_ATTEMPTS = "standard", 5
NO_CREDENTIALS = ("no AWS credentials: set AWS_PROFILE or AWS_ACCESS_KEY_ID and "
                  "AWS_SECRET_ACCESS_KEY, or run `aws configure`")
SERVICE_ENV = {"batch": "BATCH", "logs": "CLOUDWATCH_LOGS",   # AWS_ENDPOINT_URL_<this>
               "sagemaker": "SAGEMAKER"}
# Where each client's endpoint came from, for messages about not reaching it.
_ORIGINS: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def require_sdk(what: str, modules: tuple[str, ...] = ("boto3", "botocore"),
                extra: str = "batch") -> None:
    """Refuse, in one line and before anything is written, what needs the AWS SDK where the
    extra (`batch`, `sagemaker`) is not installed (exit 2, as every missing extra)."""
    how = f"pip install 'jobgen[{extra}]'"
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] != name:
                raise ConfigError(f"{what}: {name} is installed but cannot import "
                                  f"{exc.name}: {how}") from None
            raise ConfigError(f"{what} needs {name}, which is not installed: {how}") from None
        except ImportError as exc:
            raise ConfigError(f"{what}: cannot import {name} ({_first_line(str(exc))}): "
                              f"{how}") from None


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s\"']*@")
_USER_PASSWORD = re.compile(r"[^\s/?#@\"':]+:[^\s/?#@\"']+@")   # user:password@ anywhere


def redact(text: str) -> str:
    """`text` without the user:password part of any URL in it, nor the secrets of the AWS
    credentials in this environment."""
    text = _USER_PASSWORD.sub("***@", _USERINFO.sub(r"\1***@", text))
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        secret = os.environ.get(name, "")
        if len(secret) >= 16:
            text = text.replace(secret, "***")
    return text


def _remote(message: str) -> RemoteError:
    return RemoteError(redact(message))


def _config(message: str) -> ConfigError:
    return ConfigError(redact(message))


# --region and --profile of the command being run (the AWS CLI's flags; set by the CLI).
FLAGS: dict[str, str] = {}


def region(site: Site, service: str = "batch") -> tuple[Optional[str], str]:
    """The region and where it came from, in the AWS CLI's order: --region, AWS_REGION (which
    botocore itself ignores), AWS_DEFAULT_REGION, the site profile (its sagemaker section for
    SageMaker, else its batch section), or else the AWS profile's (left to botocore)."""
    if FLAGS.get("region"):
        return FLAGS["region"], "--region"
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(name):
            return os.environ[name], name
    key = "sagemaker" if service == "sagemaker" else "batch"
    section = getattr(site, key, None)
    if section is not None and section.region:
        return section.region, f"site {site.name}: {key}.region"
    profile = FLAGS.get("profile") or os.environ.get("AWS_PROFILE") or "default"
    return None, f"{_aws_file('AWS_CONFIG_FILE', 'config')} (region of profile {profile})"


def _endpoint_origin(endpoint_url: Optional[str], service: str) -> tuple[Optional[str], str]:
    """The endpoint URL that will be used, if jobgen can see it, and where it came from."""
    if endpoint_url is not None:
        return endpoint_url, "--endpoint-url"
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() != "true":
        for name in (f"AWS_ENDPOINT_URL_{SERVICE_ENV[service]}", "AWS_ENDPOINT_URL"):
            if os.environ.get(name):
                return os.environ[name], name
    return None, f"{_aws_file('AWS_CONFIG_FILE', 'config')} (endpoint_url)"


def _valid_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.scheme in ("http", "https") and bool(parts.hostname) and \
            (parts.port is None or parts.port > 0)
    except ValueError:   # e.g. a port that is not a number
        return False


def _setup_error(exc: Exception) -> Optional[JobgenError]:
    """AWS set-up mistakes (profile, config files, credentials, region) as one line that
    names what to fix; None for anything else."""
    from botocore import exceptions as bce

    kwargs = getattr(exc, "kwargs", {})
    if isinstance(exc, bce.ProfileNotFound):
        var = "AWS_PROFILE" if os.environ.get("AWS_PROFILE") else "AWS_DEFAULT_PROFILE"
        if FLAGS.get("profile"):
            return _config(f"--profile: no profile {kwargs.get('profile')!r} in "
                           f"{_aws_file('AWS_CONFIG_FILE', 'config')} or "
                           f"{_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}")
        return _remote(f"{var}: no profile {kwargs.get('profile')!r} in "
                       f"{_aws_file('AWS_CONFIG_FILE', 'config')} or "
                       f"{_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}")
    if isinstance(exc, bce.ConfigParseError):
        return _remote(f"{kwargs.get('path')}: not a valid AWS config or credentials file "
                       "(INI sections like [default] or [profile NAME], then key = value)")
    if isinstance(exc, bce.PartialCredentialsError):
        provider = kwargs.get("provider", "?")
        where = {"env": "in the environment",
                 "shared-credentials-file":
                     f"in {_aws_file('AWS_SHARED_CREDENTIALS_FILE', 'credentials')}",
                 "config-file": f"in {_aws_file('AWS_CONFIG_FILE', 'config')}"}.get(
                     provider, f"from {provider}")
        return _remote(f"incomplete AWS credentials {where}: {kwargs.get('cred_var')} is "
                       "missing (an access key id needs its secret access key)")
    if isinstance(exc, bce.NoCredentialsError):
        return _remote(NO_CREDENTIALS)
    if isinstance(exc, bce.InvalidRegionError):
        return _remote(f"{_aws_file('AWS_CONFIG_FILE', 'config')}: region "
                       f"{kwargs.get('region_name')!r} is not an AWS region name (like us-east-1)")
    if isinstance(exc, bce.NoRegionError):
        return _config("no AWS region: set batch.region in the site profile, or AWS_REGION")
    return None


def _aws_file(var: str, default: str) -> str:
    return os.environ.get(var) or f"~/.aws/{default}"


def client(site: Site, endpoint_url: Optional[str] = None, service: str = "batch",
           region_of: Optional[str] = None) -> Any:
    """A boto3 client for `service` ("batch" or "logs") in the site's region (else the
    environment's). Without `endpoint_url` boto3 itself honours AWS_ENDPOINT_URL. Set-up
    mistakes are blamed on what holds them: the site file, an option, a variable, a file."""
    require_sdk("jobgen batch")
    import boto3
    import botocore.config
    import botocore.exceptions as bce

    name, region_from = region(site, region_of or service)
    if name is not None and not REGION_RE.fullmatch(name):
        error = _config if region_from.startswith(("site ", "--")) else _remote
        raise error(f"{region_from}: {name!r} is not an AWS region name (like us-east-1)")
    url, url_from = _endpoint_origin(endpoint_url, service)
    if url is not None and not _valid_url(url):
        error = _config if url_from == "--endpoint-url" else _remote
        raise error(f"{url_from}: {url!r} is not an endpoint URL (like https://host:port)")
    try:
        session = boto3.session.Session(region_name=name,
                                        profile_name=FLAGS.get("profile") or None)
        config = botocore.config.Config(retries=_retries(session))
        # A fresh session per client: the default one caches credentials across calls.
        made = session.client(service, endpoint_url=endpoint_url, config=config)
    except bce.NoRegionError:
        raise _config(f"site {site.name}: no AWS region: set batch.region in the site profile, "
                      "or AWS_REGION") from None
    except bce.BotoCoreError as exc:
        raise _setup_error(exc) or _remote(f"AWS set-up: {_first_line(str(exc))}") from None
    except ValueError as exc:   # a malformed endpoint URL in the AWS config file
        raise _remote(f"{url_from}: {_first_line(str(exc))}") from None
    if url is None:
        url_from = f"region {made.meta.region_name} from {region_from}"
    _ORIGINS[made] = f"endpoint from {url_from}" if url is not None else url_from
    return made


def _retries(session: Any) -> dict[str, Any]:
    """botocore's retry settings: the user's (AWS_RETRY_MODE / AWS_MAX_ATTEMPTS, or retry_mode /
    max_attempts in the AWS config file) where set, else RETRY_MODE and MAX_ATTEMPTS."""
    core = session._session   # boto3's botocore session: its config store reads env and files
    retries: dict[str, Any] = {"mode": core.get_config_variable("retry_mode") or RETRY_MODE}
    if core.get_config_variable("max_attempts") is None:
        retries["total_max_attempts"] = MAX_ATTEMPTS
    return retries


def _call(method: Callable[..., Any], *, client: Any = None, **params: Any) -> Any:
    """`method(**params)` (a boto3 client method, or a paginator's of `client`; botocore
    retries throttling itself), with every AWS failure turned into one line (with no password
    or secret in it)."""
    from botocore import exceptions as bce

    owner = client if client is not None else getattr(method, "__self__", None)
    meta = getattr(owner, "meta", None)
    where = f"AWS {meta.service_model.service_id}" if meta else "AWS"
    try:
        return method(**params)
    except bce.ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), error.get("Message", str(exc))
        if code in THROTTLED:
            tries = int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)) + 1
            raise _remote(f"{where} {exc.operation_name}: throttled ({code}) after {tries} "
                          f"attempt{'s' if tries > 1 else ''}; try again later") from None
        raise _remote(f"{where} {exc.operation_name}: {message} ({code})") from None
    except bce.ParamValidationError as exc:
        raise _config(f"{where} request: {_first_line(str(exc))}") from None
    except bce.EndpointConnectionError as exc:
        origin = _ORIGINS.get(owner) if owner is not None else None
        raise _remote(f"cannot reach AWS: {exc}" + (f" ({origin})" if origin else "")) from None
    except bce.BotoCoreError as exc:
        raise _setup_error(exc) or _remote(f"{where}: {_first_line(str(exc))}") from None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # botocore's ParamValidationError starts with a generic header line.
    if len(lines) > 1 and lines[0].startswith("Parameter validation failed"):
        return lines[1]
    return lines[0] if lines else text


# --- job definitions and submission --------------------------------------------------------------

@record
class Definition:
    arn: str
    registered: bool   # False: an ACTIVE revision with the same content hash was reused


def _active_revisions(batch: Any, name: str) -> Iterator[dict[str, Any]]:
    """Every ACTIVE revision of the definition `name`, through botocore's paginator."""
    pages = batch.get_paginator("describe_job_definitions").paginate(
        jobDefinitionName=name, status="ACTIVE")
    yield from _call(pages.build_full_result, client=batch).get("jobDefinitions", [])


def ensure_definition(batch: Any, jd: dict[str, Any]) -> Definition:
    """The ARN of an ACTIVE revision of `jd` with the same content hash, registering a new
    revision only when there is none (so resubmitting never piles up identical revisions)."""
    digest = jd.get("tags", {}).get(HASH_TAG)
    for rev in sorted(_active_revisions(batch, jd["jobDefinitionName"]),
                      key=lambda r: -int(r.get("revision", 0))):
        tags = rev.get("tags")
        if tags is None:   # older APIs leave tags out of the description
            tags = _call(batch.list_tags_for_resource,
                         resourceArn=rev["jobDefinitionArn"]).get("tags", {})
        if digest and tags.get(HASH_TAG) == digest:
            return Definition(rev["jobDefinitionArn"], registered=False)
    return Definition(_call(batch.register_job_definition, **jd)["jobDefinitionArn"],
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
                   run_name: str) -> dict[str, Any]:
    """The SubmitJob request for a registered revision of `jd`."""
    return {"jobName": job_name(run_name), "jobQueue": queue, "jobDefinition": definition_arn,
            "nodeOverrides": {"numNodes": nodes}, "tags": dict(jd.get("tags", {})),
            "propagateTags": True}


def submit(batch: Any, jd: dict[str, Any], *, queue: str, nodes: int,
           run_name: str) -> Submitted:
    """Register `jd` if its content is new, then submit it on `nodes` nodes to `queue`."""
    definition = ensure_definition(batch, jd)
    request = submit_request(jd, definition.arn, queue=queue, nodes=nodes, run_name=run_name)
    response = _call(batch.submit_job, **request)
    return Submitted(response["jobId"], request["jobName"], definition)


def dry_run(jd: dict[str, Any], *, queue: str, nodes: int, run_name: str) -> dict[str, Any]:
    """The requests `submit` makes, offline: which revision SubmitJob names is only known
    once Batch answers, so it is written as `<the ACTIVE revision of NAME tagged HASH>`."""
    name, digest = jd["jobDefinitionName"], jd.get("tags", {}).get("jobgen:hash", "")
    arn = f"<the ACTIVE revision of {name} tagged jobgen:hash={digest}>"
    return {"calls": [
        {"operation": "RegisterJobDefinition",
         "when": f"no ACTIVE revision of {name} carries the tag jobgen:hash={digest}",
         "request": jd},
        {"operation": "SubmitJob",
         "request": submit_request(jd, arn, queue=queue, nodes=nodes, run_name=run_name)}]}


# --- following jobs ------------------------------------------------------------------------------

def describe(batch: Any, job_id: str) -> dict[str, Any]:
    jobs = _call(batch.describe_jobs, jobs=[job_id]).get("jobs", [])
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
        for node in _call(batch.describe_jobs, jobs=ids[start:start + 100]).get("jobs", []):
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
        _call(batch.cancel_job, jobId=job_id, reason=reason)
        return f"cancelled {job_id} (was {state})"
    if state in STARTED:
        _call(batch.terminate_job, jobId=job_id, reason=reason)
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
    found = _call(batch.describe_jobs, jobs=[f"{job_id}#{node}"]).get("jobs", [])
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
    params = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
    while True:
        page = _call(logs_client.get_log_events, **params)
        for event in page.get("events", []):
            echo(event.get("message", ""))
        token = page.get("nextForwardToken")
        if token and token != params.get("nextToken"):
            params["nextToken"] = token   # more may be waiting: read on at once
            continue
        if not follow or job.get("status") in DONE:
            return
        pause("running")
        job = describe(batch, job_id)
