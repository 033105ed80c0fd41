"""The SageMaker and EKS backends: what they render for every recipe (validated with botocore's
SageMaker model and with kubernetes-validate's Kubernetes schemas), the recipe overlay that moves
Llama 2-7B to SMP v2, submission over HTTP to moto's server (SageMaker), and CPU rehearsals of the
rendered containers (`jobgen run --backend sagemaker|eks --smoke`) that complete both passes."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from conftest import recipe_names

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_batch_client import _aws_env, aws, moto_inprocess, moto_url  # noqa: E402,F401

from jobgen import api  # noqa: E402
from jobgen.backends.eks import backend as eks  # noqa: E402
from jobgen.backends.sagemaker import backend as sagemaker  # noqa: E402
from jobgen.inputs import recipe
from jobgen.plumbing.errors import ConfigError, JobgenError, RuleError  # noqa: E402

RECIPES = tuple(recipe_names())   # as found in recipes/
Jobgen = Callable[..., Any]


def spec(name: str, backend: str, nodes: int | None = None, *overrides: str,
         site: str = "sagemaker", smoke: bool = False) -> Any:
    return api.job_spec(name, nodes, overrides=overrides, site=site, backend=backend,
                        smoke=smoke)


# --- SageMaker: the request ---------------------------------------------------------------------

@pytest.mark.parametrize("name", RECIPES)
def test_sagemaker_renders_or_refuses_every_recipe(name: str) -> None:
    nodes = 16 if name == "llama2-7b" else 4
    if name.startswith("bert"):
        # botocore's model lists no ml.dl1.24xlarge training instances.
        with pytest.raises(RuleError, match="SageMaker training has no ml.dl1.24xlarge"):
            sagemaker.training_job(spec(name, "sagemaker", nodes))
        return
    s = spec(name, "sagemaker", nodes)
    req = sagemaker.training_job(s)   # validated with botocore's model inside
    assert req["ResourceConfig"]["InstanceCount"] == nodes
    assert req["ResourceConfig"]["InstanceType"] == f"ml.{s.platform.name}"
    assert req["CheckpointConfig"] == {"S3Uri": f"s3://jobgen-example-bucket/checkpoints/"
                                                f"{s.run_name}",
                                         "LocalPath": "/opt/ml/checkpoints"}
    # The run and its compile cache are both in the folder SageMaker restores on a retry.
    assert s.run_dir.startswith("/opt/ml/checkpoints/")
    assert req["Environment"]["JOBGEN_COMPILE_CACHE"].startswith("/opt/ml/checkpoints/")
    assert req["RetryStrategy"] == {"MaximumRetryAttempts": s.recipe.job.max_restarts}
    assert req["VpcConfig"]["Subnets"] == ["subnet-0123456789abcdef0"]
    channel = req["InputDataConfig"][0]
    assert channel["ChannelName"] == "train"
    assert channel["DataSource"]["FileSystemDataSource"]["FileSystemType"] == "FSxLustre"
    # The flow's arguments survive the trip through the hyperparameters, in order.
    pieces = sorted(k for k in req["HyperParameters"] if k.startswith("jobgen_args_"))
    args = json.loads("".join(req["HyperParameters"][k] for k in pieces))
    from jobgen import payloads
    from jobgen.payloads import node
    lau = payloads.for_spec(s, "sagemaker")
    assert args == node.flow_args(lau)
    assert req["AlgorithmSpecification"]["ContainerArguments"] == [lau.launcher]
    assert all(len(v) <= 512 for v in req["Environment"].values())
    assert req["Environment"]["JOBGEN_RUN_DIR"] == s.run_dir


def test_sagemaker_request_for_llama_carries_smp_v2_configuration() -> None:
    req = sagemaker.training_job(spec("llama2-7b", "sagemaker"))
    assert req["ResourceConfig"] == {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 128,
                                     "VolumeSizeInGB": 500}
    assert json.loads(req["HyperParameters"]["mp_parameters"]) == {
        "tensor_parallel_degree": 8, "hybrid_shard_degree": 16,
        "sm_activation_offloading": True, "activation_loading_horizon": 2,
        "random_seed": 1234}
    args = json.loads(req["HyperParameters"]["jobgen_args_00"])
    assert args[args.index("--tensor-parallel") + 1] == "8"
    assert args[args.index("--data-dir") + 1] == (
        "/opt/ml/input/data/train/wikicorpus_llama2_tokenized_4k")
    # The Neuron runtime settings of the recipe do not follow it to the GPUs.
    assert not any(k.startswith("NEURON_") for k in req["Environment"])
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": 120 * 3600}


# SMP v2's core configuration keys (the SageMaker Python SDK's SMP class, which serialises them
# into mp_parameters; the SMP v2 reference lists the same).
SMP_KEYS = {"hybrid_shard_degree", "sm_activation_offloading", "activation_loading_horizon",
            "fsdp_cache_flush_warnings", "allow_empty_shards", "tensor_parallel_degree",
            "context_parallel_degree", "expert_parallel_degree", "random_seed"}


@pytest.mark.parametrize("smoke", [False, True])
def test_fsdp_arguments_parse_with_the_programs_own_parser(smoke: bool) -> None:
    """Both passes' rendered arguments, real job and rehearsal, through train_fsdp.py's own
    argparse; the values it receives are the recipe's."""
    from jobgen import payloads
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "payload" / "smp_fsdp"))
    import train_fsdp
    s = spec("llama2-7b", "sagemaker", 2 if smoke else 16, smoke=smoke)
    lau = payloads.for_spec(s, "sagemaker")
    for which, args in (("compile", lau.compile_args), ("train", lau.train_args)):
        parsed = train_fsdp.parse_args(list(args))
        assert parsed.phase == which
        if smoke:
            assert (parsed.device, parsed.synthetic, parsed.hybrid_shard) == ("cpu", True, 2)
        else:
            assert (parsed.tensor_parallel, parsed.hybrid_shard, parsed.gradient_accumulation,
                    parsed.lr, parsed.warmup_steps, parsed.decay_steps) == (
                8, 16, 1024 // 16, 3.0e-4, 2000, 480000)
            assert parsed.activation_offloading and parsed.activation_checkpointing == "full"
            # The SMP example's optimizer: AdamW's default eps, the program's own rule for
            # weight decay (norms and biases excluded), not HLAT's eps 1e-5 and decay on all.
            assert parsed.eps == 1.0e-8 and parsed.no_decay is None and parsed.scaled_init
    req = sagemaker.training_job(spec("llama2-7b", "sagemaker", 16))
    assert set(json.loads(req["HyperParameters"]["mp_parameters"])) <= SMP_KEYS


def test_sagemaker_requests_pass_the_aws_cli_json_shape() -> None:
    """What `aws sagemaker create-training-job --cli-input-json` reads: the operation's input
    members, nothing else."""
    import botocore.session
    shape = botocore.session.get_session().get_service_model("sagemaker") \
        .operation_model("CreateTrainingJob").input_shape
    req = sagemaker.training_job(spec("neox20b", "sagemaker", 4))
    assert set(req) <= set(shape.members)
    assert set(shape.required_members) <= set(req)


@pytest.mark.parametrize("change, message", [
    (lambda r: r["Environment"].update(X="y" * 513), "513 characters"),
    (lambda r: r["AlgorithmSpecification"].update(ContainerArguments=["a"] * 101), "101 items"),
    (lambda r: r["ResourceConfig"].update(InstanceType="ml.nope.24xlarge"), "not one SageMaker"),
    (lambda r: r.update(TrainingJobName="bad_name"), "does not match"),
    (lambda r: r["ResourceConfig"].update(InstanceCount="4"), "InstanceCount"),
    (lambda r: r.pop("RoleArn"), "RoleArn"),
])
def test_sagemaker_validation_refuses_what_sagemaker_would(change: Callable[[dict], Any],
                                                           message: str) -> None:
    req = copy.deepcopy(sagemaker.training_job(spec("neox20b", "sagemaker", 4)))
    change(req)
    with pytest.raises(ConfigError, match=message):
        sagemaker.validate(req, "test")


def test_sagemaker_time_limit_and_smoke_instance() -> None:
    req = sagemaker.training_job(spec("neox20b", "sagemaker", 4, "job.time_limit=1-02:00:00"))
    assert req["StoppingCondition"]["MaxRuntimeInSeconds"] == 26 * 3600
    smoke = sagemaker.training_job(spec("llama2-7b", "sagemaker", 2, smoke=True))
    assert smoke["ResourceConfig"]["InstanceType"] == "ml.c5.4xlarge"
    assert "InputDataConfig" not in smoke and "mp_parameters" not in smoke["HyperParameters"]


def test_smp_payload_refuses_what_it_cannot_do(jobgen: Jobgen) -> None:
    result = jobgen("render", "llama2-7b", "--backend", "sagemaker", "--site", "sagemaker",
                    "--nodes", "16", "--set", "precision=bf16_sr")
    assert result.exit_code == 2, result.output
    assert "precision: payload smp_fsdp cannot use 'bf16_sr'" in result.output
    result = jobgen("render", "llama2-7b", "--backend", "sagemaker", "--site", "sagemaker",
                    "--nodes", "16", "--set", "parallelism.zero1=true")
    assert "parallelism.zero1: payload smp_fsdp accepts only False" in result.output


# The SMP example trains Llama 2-7B from one p4d.24xlarge up ("You need >= 1 p4 for 7b"); with
# TP 8 on a p4d's 8 GPUs each node is one data-parallel rank, and the hybrid-shard degree is
# derived: at most the recipe's 16 (the SMP blog's), a divisor of the data-parallel ranks.
@pytest.mark.parametrize(("nodes", "degree"), [(1, 1), (2, 2), (4, 4), (8, 8), (16, 16),
                                               (32, 16)])
def test_llama_on_sagemaker_renders_at_every_node_count_with_a_derived_shard_degree(
        jobgen: Jobgen, tmp_path: Path, nodes: int, degree: int) -> None:
    result = jobgen("render", "llama2-7b", "--backend", "sagemaker", "--site", "sagemaker",
                    "--nodes", str(nodes), "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    req = json.loads((tmp_path / f"llama2-7b-{nodes}n.training-job.json").read_text())
    smp = json.loads(req["HyperParameters"]["mp_parameters"])
    assert (smp["tensor_parallel_degree"], smp["hybrid_shard_degree"]) == (8, degree)
    args = json.loads("".join(v for k, v in sorted(req["HyperParameters"].items())
                              if k.startswith("jobgen_args_")))
    assert args[args.index("--hybrid-shard") + 1] == str(degree)


@pytest.mark.parametrize(("hybrid_shard", "tensor", "nodes", "degree"), [
    (0, 8, 4, 4),     # SMP's default with TP: every data-parallel rank
    (0, 1, 2, 8),     # without TP: FSDP's HYBRID_SHARD, one node's GPUs
    (8, 8, 2, 2),     # at most 8, but only 2 data-parallel ranks
    (12, 8, 16, 8),   # the largest divisor of 16 up to 12
    (16, 2, 2, 8),    # TP 2: 8 data-parallel ranks
])
def test_shard_degree_is_derived_from_the_recipe_and_the_node_count(
        hybrid_shard: int, tensor: int, nodes: int, degree: int,
        capsys: pytest.CaptureFixture[str]) -> None:
    from jobgen.payloads.smp_fsdp import shard_degree
    s = spec("llama2-7b", "sagemaker", nodes, f"parallelism.hybrid_shard={hybrid_shard}",
             f"parallelism.tensor={tensor}", "parallelism.global_batch_size=2048")
    assert shard_degree(s) == degree
    assert ("does not divide" in capsys.readouterr().err) == (hybrid_shard == 12)
    assert shard_degree(spec("llama2-7b", "sagemaker", 2, smoke=True)) == 2   # CPU pairs


# --- the overlay ------------------------------------------------------------------------------

def test_overlay_applies_only_to_its_backend() -> None:
    assert spec("llama2-7b", "slurm", site="local").recipe.payload == "neuronx_distributed"
    s = spec("llama2-7b", "sagemaker", 16)
    assert (s.recipe.payload, s.recipe.platform, s.recipe.precision) == (
        "smp_fsdp", "p4d.24xlarge", "bf16")
    assert s.recipe.env == {}                 # replaced whole, not merged
    assert s.recipe.optim.lr == 3.0e-4        # the rest of the recipe is the recipe's
    assert s.recipe.parallelism.micro_batch_size == 1   # merged key by key
    # --set comes after the overlay.
    assert spec("llama2-7b", "sagemaker", 16, "parallelism.hybrid_shard=8") \
        .recipe.parallelism.hybrid_shard == 8


def test_overlay_errors_name_the_file_and_key(write_recipe: Any) -> None:
    bad = write_recipe("llama2-7b", {"backends": {"kubernetes": {"precision": "bf16"}}})
    with pytest.raises(ConfigError, match=r"backends\.kubernetes: not a backend"):
        recipe.load(str(bad), backend="sagemaker")
    bad = write_recipe("llama2-7b", {"backends": {"eks": {"name": "other"}}})
    with pytest.raises(ConfigError, match=r"backends\.eks\.name: cannot be changed"):
        recipe.load(str(bad), backend="eks")
    bad = write_recipe("llama2-7b", {"backends": {"eks": {"optim": {"lr": "fast"}}}})
    with pytest.raises(JobgenError, match="optim.lr"):
        recipe.load(str(bad), backend="eks")


# --- SageMaker: submission against moto's server -------------------------------------------------

@pytest.mark.moto
def test_sagemaker_submit_status_logs_cancel_over_http(jobgen: Jobgen, aws: str,  # noqa: F811
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    monkeypatch.chdir(tmp_path)
    run = f"t-{uuid.uuid4().hex[:8]}"
    first = jobgen("submit", "llama2-7b", "--backend", "sagemaker", "--nodes", "16",
                   "--run-name", run)
    assert first.exit_code == 0, first.output
    name = first.stdout.strip().splitlines()[-1]
    assert name.startswith(run + "-")
    client = boto3.client("sagemaker", region_name="us-east-1", endpoint_url=aws)
    stored = client.describe_training_job(TrainingJobName=name)
    # What moto stored is what `jobgen render` prints (the same request, sent over HTTP).
    rendered = json.loads(jobgen("render", "llama2-7b", "--backend", "sagemaker", "--nodes",
                                 "16", "--run-name", run).stdout)
    assert stored["HyperParameters"] == rendered["HyperParameters"]
    assert stored["ResourceConfig"]["InstanceCount"] == 16
    assert stored["CheckpointConfig"] == rendered["CheckpointConfig"]
    # Names are never reused: the same request again gets -2.
    again = jobgen("submit", "llama2-7b", "--backend", "sagemaker", "--nodes", "16",
                   "--run-name", run)
    assert again.exit_code == 0 and again.stdout.strip().endswith(name + "-2"), again.output
    status = jobgen("status", name, "--backend", "sagemaker", "--site", "local")
    assert status.exit_code == 0 and f"{name}: Completed" in status.output, status.output
    # CloudWatch: the stream of instance 2 (algo-2), as SageMaker names it.
    logs = boto3.client("logs", region_name="us-east-1", endpoint_url=aws)
    try:
        logs.create_log_group(logGroupName=sagemaker.LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    for host, text in (("algo-1", "node zero"), ("algo-2", "node one says hello")):
        stream = f"{name}/{host}-1700000000"
        logs.create_log_stream(logGroupName=sagemaker.LOG_GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=sagemaker.LOG_GROUP, logStreamName=stream,
                            logEvents=[{"timestamp": int(time.time() * 1000),
                                        "message": text}])
    shown = jobgen("logs", name, "--backend", "sagemaker", "--site", "local", "--node", "1")
    assert shown.exit_code == 0 and shown.stdout == "node one says hello\n", shown.output
    # moto has no StopTrainingJob: the request reaches it and its refusal is one line, exit 1.
    stop = jobgen("cancel", name, "--backend", "sagemaker", "--site", "local")
    assert stop.exit_code == 1 and "StopTrainingJob" in stop.output
    assert "Traceback" not in stop.output and len(stop.output.strip().splitlines()) == 1


def _events(steps: range, spike_at: int) -> list[str]:
    """The JSON events a training pass prints (payload/common/events.py's format)."""
    from datetime import datetime, timezone

    def at(n: int) -> str:
        return datetime.fromtimestamp(1_700_000_000 + n, timezone.utc).isoformat(
            timespec="milliseconds")
    lines = [json.dumps({"event": "start", "phase": "train", "step": 0, "time": at(0)})]
    lines += [json.dumps({"event": "step", "phase": "train", "step": n, "loss": 5.0 - 0.01 * n,
                          "grad_norm": 40.0 if n == spike_at else 1.0 + 0.01 * (n % 3),
                          "consumed_samples": n * 8, "time": at(n)}) for n in steps]
    return lines


@pytest.mark.moto
def test_watch_follows_a_sagemaker_job_through_its_cloudwatch_logs(
        jobgen: Jobgen, aws: str, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`jobgen watch` on a SageMaker job reads its instances' CloudWatch streams (moto over
    HTTP): the gradient-norm spike in algo-1's events is found, and the job's end (Completed)
    is the watch's exit 0."""
    import boto3
    monkeypatch.chdir(tmp_path)
    run = f"w-{uuid.uuid4().hex[:8]}"
    submitted = jobgen("submit", "llama2-7b", "--backend", "sagemaker", "--nodes", "16",
                       "--run-name", run)
    assert submitted.exit_code == 0, submitted.output
    name = submitted.stdout.strip().splitlines()[-1]
    logs = boto3.client("logs", region_name="us-east-1", endpoint_url=aws)
    try:
        logs.create_log_group(logGroupName=sagemaker.LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    now_ms = int(time.time() * 1000)   # CloudWatch keeps recent events only
    for host, lines in (("algo-1", _events(range(1, 61), spike_at=30)),
                        ("algo-2", ["plain text from the second instance"])):
        stream = f"{name}/{host}-1700000000"
        logs.create_log_stream(logGroupName=sagemaker.LOG_GROUP, logStreamName=stream)
        logs.put_log_events(logGroupName=sagemaker.LOG_GROUP, logStreamName=stream,
                            logEvents=[{"timestamp": now_ms + i, "message": line}
                                       for i, line in enumerate(lines)])
    watched = jobgen("watch", run, "--json", "--poll", "0.1")
    assert watched.exit_code == 0, watched.output
    records = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(r["kind"], r["step"]) for r in records if r["type"] == "alert"] == \
        [("grad_spike", 30)]
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 61))
    assert records[-1]["type"] == "summary" and records[-1]["state"] == "Completed"
    # Rolling back needs the run folder here; a SageMaker job's is in S3: refused up front.
    refused = jobgen("watch", run, "--on-diverge", "rollback")
    assert refused.exit_code == 2 and "needs the run folder on this machine" in refused.output


def test_stream_reader_counts_restarts_and_speaks_for_rank_zero() -> None:
    """The reader of a service's node logs: node 0's events are the job's, other nodes count
    for their beats only, and a second training start is a new allocation."""
    from jobgen.watching.target import StreamReader, lines_after
    first = _events(range(1, 4), spike_at=-1)
    again = _events(range(3, 5), spike_at=-1)
    beat = json.dumps({"event": "beat", "phase": "train", "step": 4, "node": 1,
                       "time": "2023-11-14T22:13:24.000+00:00"})
    batches = [{0: first, 1: [beat, json.dumps({"event": "step", "step": 9,
                                                "time": "2023-11-14T22:13:24.000+00:00"})]},
               {0: [*again, '{"event": "step", "step": 5, "lo']}, {}]
    reader = StreamReader(lambda: batches.pop(0), Path("."), clock=lambda: 100.0)
    seen = reader.read()
    assert [(o.kind, o.step, o.restart) for o in seen if o.kind != "beat"] == \
        [("start", 0, 0), ("step", 1, 0), ("step", 2, 0), ("step", 3, 0)]
    assert [(o.kind, o.node) for o in seen if o.kind == "beat"] == [("beat", 1)]
    assert [(o.kind, o.step, o.restart) for o in reader.read()] == \
        [("start", 0, 1), ("step", 3, 1), ("step", 4, 1)]
    assert reader.read() == [] and reader.silence(130.0) == {0: 30.0, 1: 30.0}
    # The line cut short is counted, and said once at the end (watch's summary).
    assert reader.skipped_notes() == ["1 line(s) of the nodes' logs skipped (events that are "
                                      "not JSON objects)"]
    # A pod's log re-read whole: only the complete lines not seen yet.
    assert lines_after("a\nb\nc", 0) == (["a", "b"], 2)
    assert lines_after("a\nb\nc\nd\n", 2) == (["c", "d"], 4)


# --- EKS: the manifests --------------------------------------------------------------------------

@pytest.mark.parametrize("name", RECIPES)
def test_eks_manifests_validate_for_every_recipe(name: str) -> None:
    """The one form, a JobSet (against its CRD: test_eks_gang.py)."""
    pytest.importorskip("kubernetes_validate")
    s = api.job_spec(name, 4, site="sagemaker", backend="eks")
    docs = eks.manifests(s)
    eks.validate(docs, "test")   # strict: unknown fields are errors
    (job,) = docs
    assert job["kind"] == "JobSet"
    child = job["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert child["completions"] == child["parallelism"] == 4
    assert child["backoffLimit"] == 0   # any pod failure fails the child Job
    assert job["spec"]["failurePolicy"]["maxRestarts"] == s.recipe.job.max_restarts
    pod = child["template"]["spec"]
    limits = pod["containers"][0]["resources"]["limits"]
    resource = s.platform.device_resource
    assert limits[resource] == s.platform.devices
    assert limits["vpc.amazonaws.com/efa"] == s.platform.efa_interfaces
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shared"]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
    assert volumes["local-compile-cache"]["hostPath"]["path"] == "/local/jobgen-compile-cache"
    assert pod["restartPolicy"] == "Never"
    assert child["podFailurePolicy"]["rules"][1] == {"action": "FailJob", "onExitCodes": {
        "containerName": "trainer", "operator": "In", "values": [75, 78]}}
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": s.platform.name}


def test_eks_validation_catches_a_bad_manifest() -> None:
    """A JobSet's child Job is validated as the Job it is (the rest against the CRD:
    test_eks_gang.py)."""
    pytest.importorskip("kubernetes_validate")
    docs = eks.manifests(api.job_spec("neox20b", 2, site="sagemaker", backend="eks"))
    child = ("spec", "replicatedJobs", 0, "template", "spec")

    def at(doc: Any, *path: Any) -> Any:
        for key in path:
            doc = doc[key]
        return doc
    bad = copy.deepcopy(docs)
    at(bad[0], *child, "template", "spec", "containers", 0, "resources")["limit"] = {}
    with pytest.raises(ConfigError, match="limit"):
        eks.validate(bad, "test")
    bad = copy.deepcopy(docs)
    at(bad[0], *child)["completions"] = "four"
    with pytest.raises(ConfigError, match="completions"):
        eks.validate(bad, "test")


def test_kubectl_client_dry_run_accepts_the_manifests(tmp_path: Path) -> None:
    """`kubectl apply --dry-run=client` needs an API server for discovery only; a static
    discovery document (the groups and kinds the manifests use) stands in for it. Schema
    validation is kubernetes-validate's, above."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    import http.server
    import threading
    discovery = {
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}},
            {"name": "jobset.x-k8s.io", "versions": [
                {"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}],
             "preferredVersion": {"groupVersion": "jobset.x-k8s.io/v1alpha2",
                                  "version": "v1alpha2"}}]},
        "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "services", "namespaced": True, "kind": "Service",
             "verbs": ["create", "get", "patch"]}]},
        "/apis/batch/v1": {"kind": "APIResourceList", "groupVersion": "batch/v1", "resources": [
            {"name": "jobs", "namespaced": True, "kind": "Job",
             "verbs": ["create", "get", "patch"]}]},
        "/apis/jobset.x-k8s.io/v1alpha2": {
            "kind": "APIResourceList", "groupVersion": "jobset.x-k8s.io/v1alpha2", "resources": [
                {"name": "jobsets", "namespaced": True, "kind": "JobSet",
                 "verbs": ["create", "get", "patch"]}]},
    }

    class Discovery(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802
            path = self.path.split("?")[0]
            body = json.dumps(discovery[path]).encode() if path in discovery else b"{}"
            # Objects do not exist yet: apply creates them.
            self.send_response(200 if path in discovery else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        texts = [eks.render_yaml(eks.manifests(api.job_spec("llama2-7b", 2, site="sagemaker",
                                                            backend="eks")))]
        procs = [subprocess.run(
            [kubectl, "apply", "--dry-run=client", "--validate=false", "-o", "name",
             f"--server=http://127.0.0.1:{server.server_port}", "-f", "-"],
            input=text, capture_output=True, text=True, timeout=60,
            env={**os.environ, "KUBECONFIG": str(tmp_path / "none")}) for text in texts]
    finally:
        server.shutdown()
    assert [p.returncode for p in procs] == [0], [p.stderr for p in procs]
    assert [p.stdout.split() for p in procs] == [["jobset.jobset.x-k8s.io/llama2-7b-2n"]]


def test_eks_submit_without_a_cluster_is_one_line(jobgen_proc: Any, tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    proc = jobgen_proc("submit", "neox20b", "--backend", "eks", "--site", "sagemaker",
                       "--nodes", "2", cwd=tmp_path,
                       env={"KUBECONFIG": str(tmp_path / "missing-kubeconfig")})
    assert proc.returncode == 2, proc.stderr
    # One error line (a render note may precede it: NeMo's trainer cannot save at a time limit).
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("note: ")]
    assert len(errors) == 1 and errors[0].startswith("error: kubeconfig:"), proc.stderr


@pytest.mark.parametrize("backend", ["sagemaker", "eks"])
def test_check_covers_the_backend(jobgen: Jobgen, backend: str) -> None:
    if backend == "eks":
        pytest.importorskip("kubernetes_validate")
    result = jobgen("check", "--backend", backend, "--site", "sagemaker", "--max-nodes", "16",
                    "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {(r["recipe"], r["nodes"]): r["status"] for r in report["rows"]}
    assert rows[("llama2-7b", 16)] == "ok"
    assert rows[("neox20b", 4)] == "ok"
    expected_bert = "skipped" if backend == "sagemaker" else "ok"
    assert rows[("bert1.5b", 8)] == expected_bert


# --- rehearsals on CPU ------------------------------------------------------------------------

# A whole rehearsal (both passes, 4 trainer processes) took 111 s in a full run here and over
# 120 s in CI, where three test runs share two cores: the limit is there to end a hang only.
REHEARSAL_TIMEOUT_S = 600


def _rehearse(jobgen_proc: Any, tmp_path: Path, backend: str) -> str:
    import socket
    with socket.socket() as sock:   # rehearsals may run side by side: not the recipe's port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = jobgen_proc("run", "llama2-7b", "--backend", backend, "--smoke", "--nodes", "2",
                       "--run-name", f"rh-{backend}", "--set", f"job.master_port={port}",
                       cwd=tmp_path, timeout=REHEARSAL_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_sagemaker_rehearsal_runs_both_passes_on_two_emulated_instances(
        jobgen_proc: Any, tmp_path: Path) -> None:
    began = time.time()
    out = _rehearse(jobgen_proc, tmp_path, "sagemaker")
    ended = time.time()
    assert "jobgen[sagemaker algo-1]" in out and "jobgen[sagemaker algo-2]" in out
    starts = [json.loads(line.split("] ", 1)[1]) for line in out.splitlines()
              if '"event": "start"' in line]
    # The FSDP program itself: 2 instances x 2 processes, sharded in pairs, on gloo.
    assert {s["phase"] for s in starts} == {"compile", "train"}
    assert all(s["world_size"] == 4 and s["sharding"] == {"replicas": 2, "shard_group": 2,
                                                           "tensor_parallel": 1}
               and s["smp"] is False for s in starts)
    steps = [json.loads(line.split("] ", 1)[1]) for line in out.splitlines()
             if '"event": "step"' in line]
    assert [s["step"] for s in steps if s["phase"] == "compile"] == [1, 2, 3]
    assert max(s["step"] for s in steps if s["phase"] == "train") == 24
    # Each instance has its own /opt/ml; node 0's holds the run's sharded checkpoints.
    # Beside the image tree the rehearsal lays out (and the shared claim), the job's own folder.
    root = next(p for p in (tmp_path / ".jobgen-rehearsal").iterdir()
                if p.name not in ("image", "shared", ".gitignore"))
    ckpt = root / "algo-1/opt/ml/checkpoints/rh-sagemaker/train/checkpoints/step_00000024"
    # The closing line names that folder as it lies here, not the instance's /opt/ml.
    assert f"its folder: {root.relative_to(tmp_path)}/algo-1/opt/ml/checkpoints/rh-sagemaker;" \
        in out
    assert (ckpt / "COMPLETE").is_file()
    # Sharded: each instance wrote its own ranks' shards to its own disk (SageMaker uploads
    # both to the job's S3 URI and restores all of them on every instance of a retry).
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    other = root / "algo-2/opt/ml/checkpoints/rh-sagemaker/train/checkpoints/step_00000024"
    assert sorted(p.name for p in other.glob("*.distcp")) == ["__2_0.distcp", "__3_0.distcp"]
    assert not (other / "COMPLETE").exists()
    # `jobgen report` on the run folder of node 0's disk (node 1's logs are on its own): both
    # instances held from the command's start to its end (tests/test_report_accounts.py).
    from test_report_accounts import assert_account
    assert_account(root / "algo-1/opt/ml/checkpoints/rh-sagemaker", 2, began, ended)


@pytest.mark.slow
def test_eks_rehearsal_runs_both_passes_as_jobset_pods(jobgen_proc: Any,
                                                       tmp_path: Path) -> None:
    began = time.time()
    out = _rehearse(jobgen_proc, tmp_path, "eks")
    ended = time.time()
    assert "jobgen[eks pod 0]" in out and "jobgen[eks pod 1]" in out
    assert "training pass finished" in out
    run = tmp_path / "jobgen-runs" / "rh-eks"
    # `jobgen report` on it: node-hours as measured around the command, the compile pass from
    # its launch to its exit (tests/test_report_accounts.py).
    from test_report_accounts import assert_account
    assert_account(run, 2, began, ended)
    assert (run / "train" / "checkpoints" / "step_00000024" / "COMPLETE").is_file()
    (logs,) = (run / "logs").iterdir()
    # The nodes' logs only, in the attempt JobSet's first restart-attempt label (0) names.
    assert sorted(p.name for p in (logs / "attempt-1").iterdir() if p.is_dir()) == [
        "node-0", "node-1"]
    # The training pass read the compile cache from each pod's node-local copy.
    # Beside the image tree the rehearsal lays out (and the shared claim), the job's own folder.
    root = next(p for p in (tmp_path / ".jobgen-rehearsal").iterdir()
                if p.name not in ("image", "shared", ".gitignore"))
    assert sorted(p.name for p in root.iterdir()) == ["node-0", "node-1"]


@pytest.mark.parametrize("backend", ["sagemaker", "eks"])
def test_rehearsal_dry_run_prints_the_containers_and_writes_nothing(jobgen_proc: Any,
                                                                    tmp_path: Path,
                                                                    backend: str) -> None:
    """`jobgen run --backend sagemaker|eks --dry-run`: each emulated container's command and
    environment as JSON, and not one file written (the instance files wait for the real run)."""
    proc = jobgen_proc("run", "llama2-7b", "--nodes", "2", "--smoke", "--backend", backend,
                       "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    nodes = [json.loads(chunk) for chunk in proc.stdout.replace("}\n{", "}\0{").split("\0")]
    assert [n["node"] for n in nodes] == [0, 1]
    assert all(n["argv"] and n["env"] for n in nodes)
    assert list(tmp_path.iterdir()) == []


# --- the Kubernetes client against a stand-in API server ---------------------------------------

NAMESPACE = "training"   # env/sites/sagemaker.yaml's eks.namespace


class _KubeAPI:
    """A stand-in Kubernetes API server on 127.0.0.1: it answers the calls jobgen makes with
    the API's own shapes and records each (method, path), so the real client's requests show
    which object kind every command acts on. No cluster can run here (see the README)."""

    def __init__(self) -> None:
        import http.server
        import threading
        self.calls: list[tuple[str, str]] = []
        # The cluster's JobSet CRD (submit reads it): the pinned release's; None: not installed.
        self.crd: Any = yaml.safe_load((Path(__file__).parent / "k8s" /
                                        "jobset-crd-v0.12.0.yaml").read_text())
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                api.calls.append((self.command, path))
                status = 201 if self.command == "POST" else 200
                if self.command == "POST":
                    answer = body
                elif "/customresourcedefinitions/" in path:
                    answer = api.crd or {"kind": "Status", "apiVersion": "v1", "code": 404,
                                         "status": "Failure", "reason": "NotFound"}
                    status = 200 if api.crd else 404
                elif path.endswith("/pods"):
                    answer = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": [
                        {"metadata": {"name": "p0", "labels": {
                            "batch.kubernetes.io/job-completion-index": "0"}},
                         "status": {"phase": "Running"}}]}
                elif "/jobsets/" in path and path.endswith("/status"):
                    answer = {"status": {"conditions": [], "restarts": 1,
                                         "restartsCountTowardsMax": 0,
                                         "replicatedJobsStatus": [{"name": "node", "active": 1}]}}
                else:
                    answer = {"kind": "Status", "apiVersion": "v1", "status": "Success"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def kubeconfig(self, path: Path) -> Path:
        url = f"http://127.0.0.1:{self.server.server_address[1]}"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "c", "cluster": {"server": url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "c", "user": "u"}}]}))
        return path


@pytest.mark.slow   # several seconds: the full tier runs it
def test_eks_commands_act_on_the_jobset_that_was_submitted(jobgen_proc: Any,
                                                          tmp_path: Path) -> None:
    """submit, status, logs and cancel through the Kubernetes client: a JobSet (its job id
    says so: jobsets/NAME), read and deleted as the JobSet it is."""
    pytest.importorskip("kubernetes")
    api = _KubeAPI()
    try:
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}
        run = "k-jobset"
        proc = jobgen_proc("submit", "llama2-7b", "--nodes", "2", "--smoke", "--backend", "eks",
                           "--site", "sagemaker", "--run-name", run, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip()
        name = job_id.split("/")[-1]
        base = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NAMESPACE}"
        assert job_id == f"jobsets/{name}"
        created = [path for method, path in api.calls if method == "POST"]
        assert created == [f"{base}/jobsets"]
        api.calls.clear()

        status = jobgen_proc("status", run, "--json", cwd=tmp_path, env=env)
        assert status.returncode == 0, status.stderr
        data = json.loads(status.stdout)
        assert data["kind"] == "JobSet"
        assert (data["state"], data["native_state"]) == ("RUNNING", "Running")
        # Its counts are its pods' (the stand-in lists one), its restarts JobSet's.
        assert data["active"] == 1 and data["pods"] == {"0": "Running"}
        assert (data["restarts"], data["counted_restarts"]) == (1, 0)
        read = [p for m, p in api.calls if m == "GET" and p.endswith("/status")]
        assert read == [f"{base}/jobsets/{name}/status"]
        api.calls.clear()

        cancel = jobgen_proc("cancel", run, cwd=tmp_path, env=env)
        assert cancel.returncode == 0, cancel.stderr
        assert [p for m, p in api.calls if m == "DELETE"] == [f"{base}/jobsets/{name}"]
    finally:
        api.server.shutdown()


def _without(data: Any, key: str) -> Any:
    if isinstance(data, dict):
        return {k: _without(v, key) for k, v in data.items() if k != key}
    if isinstance(data, list):
        return [_without(v, key) for v in data]
    return data


@pytest.mark.slow   # a few seconds: two submits through the client
def test_eks_submit_refuses_a_cluster_without_a_jobset_that_can_tell_a_drain_apart(
        jobgen_proc: Any, tmp_path: Path) -> None:
    """A cluster without JobSet, or with one older than v0.10.0 (whose API server would drop
    the rules' message patterns, so that 78 would restart like a drain): one line that says how
    to install it, nothing created."""
    pytest.importorskip("kubernetes")
    api = _KubeAPI()
    try:
        env = {"KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig"))}
        for crd, says in ((None, "the cluster has no JobSet (jobsets.jobset.x-k8s.io)"),
                          (_without(api.crd, "onJobFailureMessagePatterns"),
                           "the cluster's JobSet is older than v0.10.0")):
            api.crd = crd
            proc = jobgen_proc("submit", "llama2-7b", "--nodes", "2", "--smoke", "--backend",
                               "eks", "--site", "sagemaker", cwd=tmp_path, env=env)
            errors = [line for line in proc.stderr.splitlines()
                      if not line.startswith("note: ")]
            assert proc.returncode == 1 and len(errors) == 1, proc.stderr
            assert says in errors[0], proc.stderr
            assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/" \
                "releases/download/v0.12.0/manifests.yaml" in errors[0], proc.stderr
            assert [m for m, _ in api.calls if m == "POST"] == []
    finally:
        api.server.shutdown()
