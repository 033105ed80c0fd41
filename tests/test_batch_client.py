"""jobgen/batch_client.py and `jobgen batch ...`: real boto3 over HTTP against moto's server
(tests marked `moto`), botocore's Stubber only for what moto cannot show (queued and running jobs,
per-node states, throttling), and the no-credentials / no-endpoint paths.

moto's server: JOBGEN_TEST_MOTO_URL (tests/ci/run.sh starts one), else a ThreadedMotoServer in
this process on 127.0.0.1. Its batch_simple backend marks a job SUCCEEDED inside submit_job, or
FAILED when MOTO_SIMPLE_BATCH_FAIL_AFTER is set in the *server's* environment; that variable is
read at submit time, so the failing-job test uses the in-process server and sets it just then.
"""
from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from jobgen.backends import aws as aws_layer
from jobgen.backends.batch import client as batch_client
from jobgen.inputs import site as sites
from jobgen.plumbing.errors import ConfigError, RemoteError

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
QUEUE = "jobgen-queue"            # env/sites/local.yaml: batch.job_queue
LOG_GROUP = "/aws/batch/job"      # env/sites/local.yaml: batch.log_group
FAKE_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
Jobgen = Callable[..., Any]


# --- moto's server -------------------------------------------------------------------------------

def _missing(reason: str) -> None:
    if os.environ.get("JOBGEN_REQUIRE_ALL") == "1":
        pytest.fail(f"required component missing (JOBGEN_REQUIRE_ALL=1): {reason}", pytrace=False)
    pytest.skip(reason)


def _aws(url: str, service: str) -> Any:
    import boto3
    return boto3.session.Session(region_name=REGION, **FAKE_KEYS).client(service,
                                                                         endpoint_url=url)


def _prepare(url: str) -> None:
    """Batch without Docker, and the compute environment and queue the local site names
    (idempotent: CI's server is shared by the whole test session)."""
    request = urllib.request.Request(f"{url}/moto-api/config", method="POST",
                                     data=json.dumps({"batch": {"use_docker": False}}).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).close()
    batch = _aws(url, "batch")
    if batch.describe_job_queues(jobQueues=[QUEUE])["jobQueues"]:
        return
    iam = _aws(url, "iam")
    try:
        role = iam.create_role(RoleName="jobgen-batch-service",
                               AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        role = iam.get_role(RoleName="jobgen-batch-service")["Role"]["Arn"]
    ces = batch.describe_compute_environments(computeEnvironments=["jobgen-ce"])
    arn = (ces["computeEnvironments"][0]["computeEnvironmentArn"] if ces["computeEnvironments"]
           else batch.create_compute_environment(computeEnvironmentName="jobgen-ce",
                                                 type="UNMANAGED", state="ENABLED",
                                                 serviceRole=role)["computeEnvironmentArn"])
    batch.create_job_queue(jobQueueName=QUEUE, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": arn}])


@pytest.fixture(scope="session")
def moto_inprocess() -> Iterator[str]:
    """moto's server in a thread of this process (so this process's environment is its)."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        _missing("moto[server] is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _prepare(url)
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_url(request: pytest.FixtureRequest) -> str:
    url = os.environ.get("JOBGEN_TEST_MOTO_URL")
    if not url:
        return str(request.getfixturevalue("moto_inprocess"))
    try:
        _prepare(url)
    except OSError as exc:
        _missing(f"moto server at JOBGEN_TEST_MOTO_URL={url} does not answer: {exc}")
    return url


def _aws_env(monkeypatch: pytest.MonkeyPatch, url: str | None) -> None:
    """Fake credentials and nothing from the user's own AWS setup; no instance-metadata lookups
    (they would leave 127.0.0.1)."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    if url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI talks to moto through AWS_ENDPOINT_URL with fake credentials."""
    _aws_env(monkeypatch, moto_url)
    return moto_url


def run_name() -> str:
    """A fresh run name: its job definition content (and hash) is new on a shared server."""
    return f"t-{uuid.uuid4().hex[:10]}"


def submit(jobgen: Jobgen, *args: str) -> tuple[str, str]:
    """`jobgen batch submit bert-large -n 2 ...` -> (job id, stderr)."""
    result = jobgen("batch", "submit", "bert-large", "--nodes", "2", *args)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert len(job_id.splitlines()) == 1 and job_id
    return job_id, result.stderr


def revisions(url: str, name: str = "jobgen-bert-large") -> list[dict[str, Any]]:
    pages = _aws(url, "batch").get_paginator("describe_job_definitions").paginate(
        jobDefinitionName=name, status="ACTIVE")
    return [d for page in pages for d in page["jobDefinitions"]]


# --- against moto --------------------------------------------------------------------------------

@pytest.mark.moto
def test_submit_registers_only_changed_definitions(jobgen: Jobgen, aws: str) -> None:
    name = run_name()
    before = len(revisions(aws))
    first, err1 = submit(jobgen, "--run-name", name)
    second, err2 = submit(jobgen, "--run-name", name)
    assert first != second
    mine = [r for r in revisions(aws) if r["tags"]["jobgen:run"] == name]
    assert len(mine) == 1 and len(revisions(aws)) == before + 1
    arn = mine[0]["jobDefinitionArn"]
    assert err1 == f"registered {arn}; submitted {name} to {QUEUE}\n"
    assert err2 == f"reusing unchanged {arn}; submitted {name} to {QUEUE}\n"
    job = _aws(aws, "batch").describe_jobs(jobs=[second])["jobs"][0]
    assert (job["jobName"], job["jobDefinition"]) == (name, arn)
    assert job["jobQueue"].endswith(f":job-queue/{QUEUE}")
    assert job["tags"] == mine[0]["tags"]   # the definition's tags, hash included

    _, err3 = submit(jobgen, "--run-name", name, "--set", "optim.lr=0.0002", "--amend")
    mine = [r for r in revisions(aws) if r["tags"]["jobgen:run"] == name]
    assert len(mine) == 2 and err3.startswith("registered ")


@pytest.mark.moto
def test_status_shows_the_job_and_its_main_node(jobgen: Jobgen, aws: str) -> None:
    name = run_name()
    job_id, _ = submit(jobgen, "--run-name", name)
    result = jobgen("batch", "status", job_id)
    assert result.exit_code == 0, result.output
    stream = _aws(aws, "batch").describe_jobs(jobs=[job_id])["jobs"][0]["container"][
        "logStreamName"]
    # moto describes no `<id>#<n>` node jobs: node 0 is the parent's own record, node 1 unknown.
    assert result.stdout.splitlines() == [
        f"{job_id}  {name}  SUCCEEDED  2 nodes",
        f"  node 0 (main): SUCCEEDED  exit -  log {stream}",
        "  node 1: no details from Batch",
    ]


@pytest.mark.moto
def test_wait_exits_0_when_the_job_succeeded(jobgen: Jobgen, aws: str) -> None:
    started = time.perf_counter()
    result = jobgen("batch", "submit", "bert-large", "-n", "2", "--run-name", run_name(),
                    "--wait", "--poll", "0.05")
    elapsed = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert result.stderr.splitlines()[-1].endswith(f" {job_id} job: SUCCEEDED")
    print(f"moto round trip (register + submit -> SUCCEEDED, via the CLI): {elapsed:.3f} s")


@pytest.mark.moto
def test_wait_exits_1_when_the_job_failed(jobgen: Jobgen, moto_inprocess: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Read by moto's server at submit time from *its* environment: this process's.
    _aws_env(monkeypatch, moto_inprocess)
    monkeypatch.setenv("MOTO_SIMPLE_BATCH_FAIL_AFTER", "0")
    result = jobgen("batch", "submit", "bert-large", "-n", "2", "--run-name", run_name(),
                    "--wait", "--poll", "0.05")
    assert result.exit_code == 1, result.output
    job_id = result.stdout.strip()
    assert result.stderr.splitlines()[-1].endswith(f" {job_id} job: FAILED")


@pytest.mark.moto
def test_cancel_of_a_finished_job_says_so(jobgen: Jobgen, aws: str) -> None:
    job_id, _ = submit(jobgen, "--run-name", run_name())
    result = jobgen("batch", "cancel", job_id)
    assert (result.exit_code, result.stdout) == (
        0, f"{job_id} already finished (SUCCEEDED): nothing to cancel\n")


@pytest.mark.moto
def test_logs_print_the_nodes_log_stream(jobgen: Jobgen, aws: str) -> None:
    job_id, _ = submit(jobgen, "--run-name", run_name())
    stream = _aws(aws, "batch").describe_jobs(jobs=[job_id])["jobs"][0]["container"][
        "logStreamName"]
    # moto without Docker runs nothing, so write what the main node's container would have.
    logs = _aws(aws, "logs")
    try:
        logs.create_log_group(logGroupName=LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    now = int(time.time() * 1000)
    lines = ["[jobgen] node 0 of 2: main", "step 1 loss 10.2", "[jobgen] training exited 0"]
    logs.put_log_events(logGroupName=LOG_GROUP, logStreamName=stream,
                        logEvents=[{"timestamp": now + i, "message": m}
                                   for i, m in enumerate(lines)])
    result = jobgen("batch", "logs", job_id, "--node", "0")
    assert (result.exit_code, result.stdout.splitlines()) == (0, lines), result.output
    result = jobgen("batch", "logs", job_id, "--follow")   # the job has ended: no waiting
    assert (result.exit_code, result.stdout.splitlines()) == (0, lines), result.output
    result = jobgen("batch", "logs", job_id, "--node", "1")
    assert (result.exit_code, result.stderr) == (
        1, f"error: job {job_id} node 1: no log stream (job SUCCEEDED)\n")
    result = jobgen("batch", "logs", job_id, "--node", "2")
    assert (result.exit_code, result.stderr) == (
        2, f"error: --node: job {job_id} has 2 nodes (0 to 1)\n")


@pytest.mark.moto
def test_unknown_queue_is_one_line_exit_1(jobgen: Jobgen, aws: str) -> None:
    result = jobgen("batch", "submit", "bert-large", "-n", "2", "--queue", "no-such-queue")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "error: AWS Batch SubmitJob: Job queue no-such-queue does not exist (ClientException)")


@pytest.mark.moto
def test_unknown_job_is_one_line_exit_1(jobgen: Jobgen, aws: str) -> None:
    result = jobgen("batch", "status", "00000000-no-such-job")
    assert (result.exit_code, result.stderr) == (
        1, ("error: AWS Batch: no job '00000000-no-such-job' (Batch forgets jobs 7 days "
            "after they finish)\n"))


@pytest.mark.moto
def test_explicit_endpoint_url(jobgen: Jobgen, aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    result = jobgen("batch", "submit", "bert-large", "-n", "2", "--run-name", run_name(),
                    "--endpoint-url", aws)
    assert result.exit_code == 0, result.output
    result = jobgen("batch", "status", result.stdout.strip(), "--endpoint-url", aws)
    assert result.exit_code == 0 and " SUCCEEDED " in result.stdout.splitlines()[0] + " "


# --- without a server -----------------------------------------------------------------------------

def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true", **extra)
    return env


def _jobgen_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60, check=False, cwd=ROOT)


def test_no_credentials_is_one_line_exit_1() -> None:
    result = _jobgen_process("batch", "submit", "bert-large", "-n", "2", env=_clean_env())
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"error: {aws_layer.NO_CREDENTIALS}\n"


def test_unreachable_endpoint_is_one_line_exit_1() -> None:
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _jobgen_process("batch", "status", "abc", "--endpoint-url",
                             f"http://127.0.0.1:{port}",
                             env=_clean_env(AWS_ACCESS_KEY_ID="testing",
                                            AWS_SECRET_ACCESS_KEY="testing"))
    assert result.returncode == 1
    assert result.stderr == ("error: cannot reach AWS: Could not connect to the endpoint URL: "
                             f'"http://127.0.0.1:{port}/v1/describejobs" '
                             "(endpoint from --endpoint-url)\n")


@pytest.mark.parametrize("args", [["render", "neox20b", "--nodes", "4"]])
def test_render_and_import_do_not_load_the_aws_sdk(args: list[str]) -> None:
    code = (
        "import contextlib, io, sys\n"
        "import jobgen.cli\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')]\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    try:\n"
        f"        jobgen.cli.main({args!r})\n"
        "    except SystemExit as exc:\n"
        "        assert not exc.code, exc.code\n"
        "assert out.getvalue()\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'boto3', 'botocore'}))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False, cwd=ROOT)
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")


# --- the client itself --------------------------------------------------------------------------

def test_client_region_and_endpoint(monkeypatch: pytest.MonkeyPatch, write_site: Any) -> None:
    _aws_env(monkeypatch, None)
    local = sites.load("local")
    assert aws_layer.client(local).meta.region_name == "us-east-1"
    explicit = aws_layer.client(local, "http://127.0.0.1:9", service="logs")
    assert (explicit.meta.endpoint_url, explicit.meta.service_model.service_name) == (
        "http://127.0.0.1:9", "logs")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8")
    assert aws_layer.client(local).meta.endpoint_url == "http://127.0.0.1:8"
    no_region = sites.load(str(write_site("local", {"batch.region": None})))
    with pytest.raises(ConfigError, match=r"^site local: no AWS region: set batch.region"):
        aws_layer.client(no_region)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert aws_layer.client(no_region).meta.region_name == "eu-west-1"


@pytest.mark.parametrize("run,name", [("bert1.5b-16n", "bert1-5b-16n"), ("a b/c", "a-b-c"),
                                      ("_x", "x"), ("é" * 3, "jobgen"), ("n" * 200, "n" * 128)])
def test_job_name(run: str, name: str) -> None:
    assert batch_client.job_name(run) == name


# --- Stubber: what moto cannot show ---------------------------------------------------------------

@pytest.fixture
def stubbed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """A real boto3 Batch client whose calls are answered by botocore's Stubber (checked against
    the API's request and response shapes); no request leaves the process."""
    import boto3
    from botocore.stub import Stubber
    _aws_env(monkeypatch, None)
    client = boto3.session.Session(region_name=REGION, **FAKE_KEYS).client("batch")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def job(job_id: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"jobName": "bert-large-2n", "jobId": job_id, "jobQueue": QUEUE, "status": status,
            "startedAt": 1, "jobDefinition": "jobgen-bert-large:1", **extra}


def mnp(job_id: str, status: str, nodes: int = 2, **extra: Any) -> dict[str, Any]:
    props = {"numNodes": nodes, "mainNode": 0, "nodeRangeProperties": [{"targetNodes": "0:"}]}
    return job(job_id, status, nodeProperties=props, **extra)


def node(job_id: str, index: int, status: str, **container: Any) -> dict[str, Any]:
    return job(f"{job_id}#{index}", status, container=container,
               nodeDetails={"nodeIndex": index, "isMainNode": index == 0})


@pytest.mark.parametrize("state,call,said", [
    ("RUNNABLE", "cancel_job", "cancelled j1 (was RUNNABLE)"),
    ("SUBMITTED", "cancel_job", "cancelled j1 (was SUBMITTED)"),
    ("STARTING", "terminate_job", "terminating j1 (was STARTING): its nodes are being stopped"),
    ("RUNNING", "terminate_job", "terminating j1 (was RUNNING): its nodes are being stopped"),
])
def test_cancel_queued_or_started_job(stubbed: tuple[Any, Any], jobgen: Jobgen,
                                      monkeypatch: pytest.MonkeyPatch, state: str, call: str,
                                      said: str) -> None:
    client, stub = stubbed
    stub.add_response("describe_jobs", {"jobs": [mnp("j1", state)]}, {"jobs": ["j1"]})
    stub.add_response(call, {}, {"jobId": "j1", "reason": "cancelled with jobgen"})
    monkeypatch.setattr(aws_layer, "client", lambda *a, **k: client)
    result = jobgen("batch", "cancel", "j1")
    assert (result.exit_code, result.stdout) == (0, said + "\n"), result.output


def test_wait_prints_job_and_node_transitions(stubbed: tuple[Any, Any]) -> None:
    client, stub = stubbed
    polls = [
        (mnp("j1", "RUNNING"), [node("j1", 0, "RUNNING"), node("j1", 1, "STARTING")]),
        (mnp("j1", "RUNNING"), [node("j1", 0, "RUNNING"), node("j1", 1, "RUNNING")]),
        (mnp("j1", "FAILED", statusReason="Essential container in task exited"),
         [node("j1", 0, "FAILED", exitCode=3), node("j1", 1, "SUCCEEDED", exitCode=0)]),
    ]
    for parent, nodes in polls:
        stub.add_response("describe_jobs", {"jobs": [parent]}, {"jobs": ["j1"]})
        stub.add_response("describe_jobs", {"jobs": nodes}, {"jobs": ["j1#0", "j1#1"]})
    said: list[str] = []
    assert batch_client.wait(client, "j1", echo=said.append, poll_s=0) == 1
    assert [line.split(" ", 1)[1] for line in said[:-1]] == [
        "j1 job: RUNNING", "j1 node 0: RUNNING", "j1 node 1: STARTING",
        "j1 node 1: RUNNING",
        "j1 job: FAILED", "j1 node 0: FAILED", "j1 node 1: SUCCEEDED"]
    assert said[-1] == "j1: FAILED: Essential container in task exited"


def test_status_lists_every_node(stubbed: tuple[Any, Any]) -> None:
    client, stub = stubbed
    stub.add_response("describe_jobs", {"jobs": [mnp("j1", "RUNNING", nodes=3)]})
    stub.add_response("describe_jobs", {"jobs": [
        node("j1", 0, "RUNNING", logStreamName="jd/default/t0"),
        node("j1", 1, "FAILED", exitCode=137, logStreamName="jd/default/t1",
             reason="OutOfMemoryError: Container killed due to memory usage")]},
        {"jobs": ["j1#0", "j1#1", "j1#2"]})
    assert batch_client.status_lines(client, "j1") == [
        "j1  bert-large-2n  RUNNING  3 nodes",
        "  node 0 (main): RUNNING  exit -  log jd/default/t0",
        ("  node 1: FAILED  exit 137  log jd/default/t1  "
         "(OutOfMemoryError: Container killed due to memory usage)"),
        "  node 2: not started",
    ]


class _Throttling(http.server.BaseHTTPRequestHandler):
    """A Batch endpoint that answers 429 TooManyRequests `throttle` times, then a job."""

    throttle = 0
    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).seen.append(self.path)
        if type(self).throttle > 0:
            type(self).throttle -= 1
            body, code = {"message": "Too Many Requests"}, 429
            extra = {"x-amzn-ErrorType": "TooManyRequestsException"}
        else:
            body, code, extra = {"jobs": [job("j1", "RUNNING")]}, 200, {}
        data = json.dumps(body).encode()
        self.send_response(code)
        for key, value in {"Content-Type": "application/json", **extra}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def throttling(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Throttling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _aws_env(monkeypatch, None)
    _Throttling.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow   # several seconds: the full tier runs it
def test_throttling_is_retried_by_botocore_then_reported(
        throttling: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's own retries (standard mode) over real HTTP: two 429s, then the answer; a
    user's AWS_MAX_ATTEMPTS is honoured, and running out of attempts is one line."""
    local = sites.load("local")
    _Throttling.throttle = 2
    assert batch_client.describe(aws_layer.client(local, throttling), "j1")["status"] \
        == "RUNNING"
    assert _Throttling.seen == ["/v1/describejobs"] * 3
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    _Throttling.throttle, _Throttling.seen = 5, []
    with pytest.raises(RemoteError) as info:
        batch_client.describe(aws_layer.client(local, throttling), "j1")
    assert str(info.value) == ("AWS Batch DescribeJobs: throttled (TooManyRequestsException) "
                               "after 2 attempts; try again later")
    assert len(_Throttling.seen) == 2


def test_retry_settings_default_and_from_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    _aws_env(monkeypatch, None)
    local = sites.load("local")
    made = aws_layer.client(local, "http://127.0.0.1:9")
    assert made.meta.config.retries == {"mode": "standard",
                                        "total_max_attempts": aws_layer.MAX_ATTEMPTS}
    monkeypatch.setenv("AWS_RETRY_MODE", "adaptive")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    made = aws_layer.client(local, "http://127.0.0.1:9")
    assert made.meta.config.retries == {"mode": "adaptive", "total_max_attempts": 3}


def test_bad_request_parameters_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore checks the request before it needs credentials or a connection."""
    _aws_env(monkeypatch, None)
    client = aws_layer.client(sites.load("local"), "http://127.0.0.1:9")
    with pytest.raises(ConfigError) as info:
        batch_client.describe(client, 42)  # type: ignore[arg-type]
    assert str(info.value) == ("AWS Batch request: Invalid type for parameter jobs[0], value: 42, "
                               "type: <class 'int'>, valid types: <class 'str'>")


def test_definition_tags_from_list_tags_when_not_described(stubbed: tuple[Any, Any]) -> None:
    """Reuse also works where describe_job_definitions leaves the tags out."""
    client, stub = stubbed
    arn = "arn:aws:batch:us-east-1:123456789012:job-definition/jobgen-x:"
    described = [{"jobDefinitionName": "jobgen-x", "jobDefinitionArn": f"{arn}{i}",
                  "revision": i, "type": "multinode", "status": "ACTIVE"} for i in (1, 2)]
    stub.add_response("describe_job_definitions", {"jobDefinitions": described},
                      {"jobDefinitionName": "jobgen-x", "status": "ACTIVE"})
    stub.add_response("list_tags_for_resource", {"tags": {"jobgen:hash": "new"}},
                      {"resourceArn": f"{arn}2"})
    stub.add_response("list_tags_for_resource", {"tags": {"jobgen:hash": "abc"}},
                      {"resourceArn": f"{arn}1"})
    found = batch_client.ensure_definition(client, {"jobDefinitionName": "jobgen-x",
                                                    "tags": {"jobgen:hash": "abc"}})
    assert found == batch_client.Definition(f"{arn}1", registered=False)


def test_follow_reads_on_until_the_job_ends(stubbed: tuple[Any, Any],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from botocore.stub import Stubber
    batch, stub = stubbed
    logs = boto3.session.Session(region_name=REGION, **FAKE_KEYS).client("logs")
    where = {"logGroupName": LOG_GROUP, "logStreamName": "jd/default/t0", "startFromHead": True}
    stub.add_response("describe_jobs", {"jobs": [mnp("j1", "RUNNING")]}, {"jobs": ["j1"]})
    stub.add_response("describe_jobs", {"jobs": [node("j1", 0, "RUNNING",
                                                      logStreamName="jd/default/t0")]},
                      {"jobs": ["j1#0"]})
    stub.add_response("describe_jobs", {"jobs": [mnp("j1", "SUCCEEDED")]}, {"jobs": ["j1"]})

    def events(*messages: str) -> list[dict[str, Any]]:
        return [{"timestamp": i, "message": m} for i, m in enumerate(messages)]

    with Stubber(logs) as log_stub:
        log_stub.add_response("get_log_events", {"events": events("a", "b"),
                                                 "nextForwardToken": "f/1"}, where)
        log_stub.add_response("get_log_events", {"events": [], "nextForwardToken": "f/1"},
                              {**where, "nextToken": "f/1"})
        # caught up, job still RUNNING: wait, ask again; now it has ended: read to the end
        log_stub.add_response("get_log_events", {"events": events("c"),
                                                 "nextForwardToken": "f/2"},
                              {**where, "nextToken": "f/1"})
        log_stub.add_response("get_log_events", {"events": [], "nextForwardToken": "f/2"},
                              {**where, "nextToken": "f/2"})
        said: list[str] = []
        batch_client.logs(batch, logs, "j1", node=0, echo=said.append, follow=True, poll_s=0,
                          timeout_s=30)
        log_stub.assert_no_pending_responses()
    assert said == ["a", "b", "c"]


def test_follow_gives_up_after_its_timeout(stubbed: tuple[Any, Any]) -> None:
    batch, stub = stubbed
    # No log stream yet (the job is queued), and the deadline has passed.
    stub.add_response("describe_jobs", {"jobs": [mnp("j1", "RUNNABLE")]}, {"jobs": ["j1"]})
    stub.add_response("describe_jobs", {"jobs": []}, {"jobs": ["j1#0"]})
    with pytest.raises(RemoteError) as info:
        batch_client.logs(batch, None, "j1", node=0, echo=print, follow=True, poll_s=0.01,
                          timeout_s=0)
    assert str(info.value) == "job j1: still without a log stream after 0 s"


# --- AWS set-up mistakes: one line, blaming what holds the mistake, no secret echoed ------------

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"   # the shape of a real secret access key
PASSWORD = "pa55-w0rd-in-url"


@pytest.fixture
def aws_files(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """``aws_files(config=TEXT, credentials=TEXT, **env)``: a clean AWS environment (the real
    files written under tmp_path, HOME there too, no AWS_* variable of the user's)."""
    def make(config: str = "", credentials: str = "", **extra: str) -> dict[str, str]:
        home = tmp_path / "home"
        (home / ".aws").mkdir(parents=True, exist_ok=True)
        (home / ".aws" / "config").write_text(config)
        (home / ".aws" / "credentials").write_text(credentials)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(HOME=str(home), AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=str(home / ".aws" / "config"),
                   AWS_SHARED_CREDENTIALS_FILE=str(home / ".aws" / "credentials"), **extra)
        return env
    return make


def _one_line(result: subprocess.CompletedProcess[str], status: int) -> str:
    assert (result.returncode, result.stdout) == (status, ""), result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stderr and PASSWORD not in result.stderr
    return result.stderr[len("error: "):-1]


def test_mistyped_profile(aws_files: Callable[..., dict[str, str]]) -> None:
    env = aws_files(config="[profile dev]\nregion = us-east-1\n",
                    credentials=f"[dev]\naws_access_key_id = AKIAEXAMPLE\n"
                                f"aws_secret_access_key = {SECRET}\n", AWS_PROFILE="deve")
    said = _one_line(_jobgen_process("batch", "status", "abc", env=env), 1)
    assert said == (f"AWS_PROFILE: no profile 'deve' in {env['AWS_CONFIG_FILE']} or "
                    f"{env['AWS_SHARED_CREDENTIALS_FILE']}")


@pytest.mark.parametrize("which", ["config", "credentials"])
def test_malformed_aws_file(aws_files: Callable[..., dict[str, str]], which: str) -> None:
    broken = f"[default\naws_access_key_id = AKIAEXAMPLE\naws_secret_access_key = {SECRET}\n"
    env = aws_files(**{which: broken})
    said = _one_line(_jobgen_process("batch", "cancel", "abc", env=env), 1)
    path = env["AWS_CONFIG_FILE" if which == "config" else "AWS_SHARED_CREDENTIALS_FILE"]
    assert said == (f"{path}: not a valid AWS config or credentials file (INI sections like "
                    "[default] or [profile NAME], then key = value)")


def test_key_id_without_secret_in_the_environment(aws_files: Callable[..., dict[str, str]]
                                                  ) -> None:
    env = aws_files(AWS_ACCESS_KEY_ID="AKIAEXAMPLE")
    said = _one_line(_jobgen_process("batch", "status", "abc", env=env), 1)
    assert said == ("incomplete AWS credentials in the environment: AWS_SECRET_ACCESS_KEY is "
                    "missing (an access key id needs its secret access key)")


def test_key_id_without_secret_in_the_credentials_file(
        aws_files: Callable[..., dict[str, str]]) -> None:
    env = aws_files(credentials="[default]\naws_access_key_id = AKIAEXAMPLE\n")
    said = _one_line(_jobgen_process("batch", "logs", "abc", env=env), 1)
    assert said == (f"incomplete AWS credentials in {env['AWS_SHARED_CREDENTIALS_FILE']}: "
                    "aws_secret_access_key is missing (an access key id needs its secret "
                    "access key)")


KEYS = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET}


def test_no_region_anywhere(aws_files: Callable[..., dict[str, str]], write_site: Any) -> None:
    site = write_site("local", delete=["batch.region"])
    said = _one_line(_jobgen_process("batch", "status", "abc", "--site", str(site),
                                     env=aws_files(**KEYS)), 2)
    assert said == ("site local: no AWS region: set batch.region in the site profile, "
                    "or AWS_REGION")


def test_region_from_aws_region_which_botocore_ignores(
        monkeypatch: pytest.MonkeyPatch, write_site: Any) -> None:
    _aws_env(monkeypatch, None)
    no_region = sites.load(str(write_site("local", delete=["batch.region"])))
    monkeypatch.setenv("AWS_REGION", "ap-south-2")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert aws_layer.client(no_region).meta.region_name == "ap-south-2"
    # The AWS CLI's order: the environment before the site (and --region before both).
    assert aws_layer.client(sites.load("local")).meta.region_name == "ap-south-2"
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert aws_layer.client(sites.load("local")).meta.region_name == "us-east-1"
    monkeypatch.setitem(aws_layer.FLAGS, "region", "sa-east-1")
    monkeypatch.setenv("AWS_REGION", "ap-south-2")
    assert aws_layer.client(sites.load("local")).meta.region_name == "sa-east-1"


@pytest.mark.parametrize("where,status,said", [
    ("site", 2, "{site}: batch.region: 'us east 1' is not an AWS region name (like us-east-1)"),
    ("AWS_REGION", 1, "AWS_REGION: 'us east 1' is not an AWS region name (like us-east-1)"),
    ("AWS_DEFAULT_REGION", 1,
     "AWS_DEFAULT_REGION: 'us east 1' is not an AWS region name (like us-east-1)"),
    ("config", 1, "{config}: region 'us east 1' is not an AWS region name (like us-east-1)"),
])
def test_bad_region_is_blamed_on_where_it_was_set(
        aws_files: Callable[..., dict[str, str]], write_site: Any, where: str, status: int,
        said: str) -> None:
    bad = "us east 1"
    site = write_site("local", {"batch.region": bad} if where == "site" else {},
                      delete=[] if where == "site" else ["batch.region"])
    env = aws_files(config=f"[default]\nregion = {bad}\n" if where == "config" else "",
                    **({where: bad} if where.startswith("AWS_") else {}), **KEYS)
    result = _jobgen_process("batch", "status", "abc", "--site", str(site), env=env)
    assert _one_line(result, status) == said.format(site=site, config=env["AWS_CONFIG_FILE"])
    assert "--endpoint-url" not in result.stderr


@pytest.mark.parametrize("where,status", [
    ("--endpoint-url", 2), ("AWS_ENDPOINT_URL", 1), ("AWS_ENDPOINT_URL_BATCH", 1)])
@pytest.mark.parametrize("url", ["not a url", f"ftp://user:{PASSWORD}@host",
                                 f"http://user:{PASSWORD}@host:port"])
def test_bad_endpoint_is_blamed_on_where_it_was_set(
        aws_files: Callable[..., dict[str, str]], where: str, status: int, url: str) -> None:
    args = ["--endpoint-url", url] if where == "--endpoint-url" else []
    env = aws_files(**({where: url} if where.startswith("AWS_") else {}), **KEYS)
    said = _one_line(_jobgen_process("batch", "status", "abc", *args, env=env), status)
    shown = url.replace(f"user:{PASSWORD}", "***")
    assert said == f"{where}: {shown!r} is not an endpoint URL (like https://host:port)"


def test_bad_endpoint_in_the_config_file(aws_files: Callable[..., dict[str, str]]) -> None:
    env = aws_files(config=f"[default]\nendpoint_url = htp:/user:{PASSWORD}@\n", **KEYS)
    said = _one_line(_jobgen_process("batch", "status", "abc", env=env), 1)
    assert said.startswith(f"{env['AWS_CONFIG_FILE']} (endpoint_url): ")


def test_empty_endpoint_url_is_refused(aws_files: Callable[..., dict[str, str]]) -> None:
    said = _one_line(_jobgen_process("batch", "status", "abc", "--endpoint-url", "",
                                     env=aws_files(**KEYS)), 2)
    assert said == ("jobgen batch status: Invalid value for '--endpoint-url': must not be "
                    "empty (see 'jobgen batch status --help')")


@pytest.mark.parametrize("where", ["--endpoint-url", "AWS_ENDPOINT_URL"])
def test_password_in_an_unreachable_endpoint_is_not_shown(
        aws_files: Callable[..., dict[str, str]], where: str) -> None:
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://jobgen:{PASSWORD}@127.0.0.1:{port}"
    args = ["--endpoint-url", url] if where == "--endpoint-url" else []
    env = aws_files(**({where: url} if where.startswith("AWS_") else {}), **KEYS)
    said = _one_line(_jobgen_process("batch", "status", "abc", *args, env=env), 1)
    assert said == ("cannot reach AWS: Could not connect to the endpoint URL: "
                    f'"http://***@127.0.0.1:{port}/v1/describejobs" (endpoint from {where})')


def test_redact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "short")   # too short to be told from words
    assert aws_layer.redact(f"a https://u:{PASSWORD}@h/x and HTTP://u@h b {SECRET} short"
                               ) == "a https://***@h/x and HTTP://***@h b *** short"
    assert aws_layer.redact(f"htp:/u:{PASSWORD}@h") == "htp:/***@h"
    assert aws_layer.redact("mailto me@example.com, s3://bucket/key@v") == \
        "mailto me@example.com, s3://bucket/key@v"


@pytest.mark.moto
def test_profile_from_real_config_files(jobgen: Jobgen, moto_url: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same named profile works (against moto) and, mistyped, is one line."""
    _aws_env(monkeypatch, moto_url)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    (tmp_path / "config").write_text("[profile dev]\nregion = us-east-1\n")
    (tmp_path / "credentials").write_text(
        f"[dev]\naws_access_key_id = testing\naws_secret_access_key = {SECRET}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_PROFILE", "dev")
    job_id, _ = submit(jobgen, "--run-name", run_name())
    assert jobgen("batch", "status", job_id).exit_code == 0
    monkeypatch.setenv("AWS_PROFILE", "Dev")
    result = jobgen("batch", "status", job_id)
    assert (result.exit_code, result.stdout, result.stderr) == (
        1, "", f"error: AWS_PROFILE: no profile 'Dev' in {tmp_path / 'config'} or "
               f"{tmp_path / 'credentials'}\n")


# --- without the [batch] extra: one line naming it, nothing written ------------------------------

_REFUSE_AWS_SDK = '''\
"""Test stand-in for an installation without the [batch] extra: boto3 and botocore cannot be
imported, as if they were not installed."""
import sys
import threading


class _NoAwsSdk:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("boto3", "botocore"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoAwsSdk())
'''


@pytest.mark.parametrize("args,needs", [
    (["render", "bert-large", "-n", "2", "--backend", "batch"], "--backend batch needs botocore"),
    (["render", "bert-large", "-n", "2", "--backend", "batch", "-o", "{tmp}/out"],
     "--backend batch needs botocore"),
    (["check", "--backend", "batch", "--recipe", "bert-large"], "--backend batch needs botocore"),
    # The aliases are the commands with --backend batch, and say so; their --help needs nothing.
    (["batch", "submit", "bert-large", "-n", "2"], "--backend batch needs botocore"),
    (["batch", "status", "abc"], "--backend batch needs botocore"),
    (["batch", "logs", "abc"], "--backend batch needs botocore"),
    (["batch", "cancel", "abc"], "--backend batch needs botocore"),
    (["batch", "validate", "{tmp}/jd.json"], "jobgen batch validate needs botocore"),
])
def test_without_the_batch_extra(tmp_path: Path, args: list[str], needs: str) -> None:
    hook = tmp_path / "no-aws-sdk"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_REFUSE_AWS_SDK)
    (tmp_path / "jd.json").write_text("{}")
    env = _clean_env(PYTHONPATH=str(hook), AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b")
    before = sorted(tmp_path.rglob("*"))
    result = _jobgen_process(*[a.format(tmp=tmp_path) for a in args], env=env)
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", f"error: {needs}, which is not installed: pip install 'jobgen[batch]'\n")
    assert sorted(tmp_path.rglob("*")) == before
    # The stand-in hides exactly the SDK: with it, the Slurm backend still renders.
    assert _jobgen_process("render", "bert-large", "-n", "2", env=env).returncode == 0


@pytest.mark.moto
def test_runs_and_status_by_run_name(jobgen: Jobgen, moto_url: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`jobgen submit --backend batch` with --endpoint-url records where the job went, so that
    `jobgen runs`, `status RUN`, `logs RUN` and `cancel RUN` reach the same endpoint."""
    _aws_env(monkeypatch, None)    # no AWS_ENDPOINT_URL: only the record knows the endpoint
    name = run_name()
    result = jobgen("submit", "bert-large", "-n", "2", "--backend", "batch", "--run-name",
                    name, "--endpoint-url", moto_url)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    rows = json.loads(jobgen("runs", "--json").stdout)
    assert [(r["name"], r["backend"], r["job_id"], r["endpoint_url"], r["queue"]) for r in rows] \
        == [(name, "batch", job_id, moto_url, QUEUE)]
    # The common state, and Batch's own word for it.
    assert rows[0]["state"] in ("PENDING", "RUNNING", "COMPLETED", "FAILED"), rows[0]
    assert rows[0]["native_state"] in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING",
                                       "SUCCEEDED", "FAILED"), rows[0]
    by_name = json.loads(jobgen("status", name, "--json").stdout)
    assert (by_name["backend"], by_name["job_id"], by_name["run"]["name"]) == (
        "batch", job_id, name)
    assert jobgen("batch", "status", name).stdout == jobgen("status", job_id).stdout
    table = jobgen("runs").stdout.splitlines()
    assert table[1].split()[:3] == [name, "batch", job_id]
    cancelled = jobgen("cancel", name)
    assert cancelled.exit_code == 0, cancelled.output
    assert job_id in cancelled.stdout
