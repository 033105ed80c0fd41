"""jobgen/backends/batch/backend.py: the multi-node job definition of every recipe, byte-compared
with tests/golden/batch/, validated offline as the AWS CLI would send it, and its Batch-specific
values (devices, retry strategy, node ranges, learning-rate scaling) checked one by one."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from jobgen import api
from jobgen.backends.batch import backend as batch
from jobgen.backends.batch import rules as batch_rules
from jobgen.plumbing.errors import JobgenError

SITE = "dl1-batch"
GOLDEN = [("bert1.5b", 8), ("bert1.5b", 16), ("bert-large", 8), ("neox20b", 4),
          ("llama2-7b", 4), ("pythia6.9b", 4)]


def rendered(recipe: str, nodes: int, *overrides: str) -> str:
    spec = api.job_spec(recipe, nodes, overrides=overrides, site=SITE, backend="batch")
    return api.plan(spec).text


def definition(recipe: str, nodes: int, *overrides: str) -> dict[str, Any]:
    return json.loads(rendered(recipe, nodes, *overrides))


def container(jd: dict[str, Any]) -> dict[str, Any]:
    (only,) = jd["nodeProperties"]["nodeRangeProperties"]
    return only["container"]


def arg_values(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, arg in enumerate(command) if arg == flag]


@pytest.mark.parametrize("recipe,nodes", GOLDEN, ids=[f"{r}-{n}n" for r, n in GOLDEN])
def test_golden(recipe: str, nodes: int, golden: Callable[[Path, str], None]) -> None:
    golden(Path("batch") / f"{recipe}-{nodes}n.json", rendered(recipe, nodes))


@pytest.mark.parametrize("recipe,nodes", GOLDEN, ids=[f"{r}-{n}n" for r, n in GOLDEN])
def test_botocore_accepts_the_file_as_is(recipe: str, nodes: int) -> None:
    """What `aws batch register-job-definition --cli-input-json file://...` would send."""
    from botocore.validate import validate_parameters
    jd = json.loads(rendered(recipe, nodes))
    assert batch_rules.botocore_errors(jd) == []
    validate_parameters(jd, batch_rules._input_shape())   # raises ParamValidationError if not
    batch_rules.multinode_errors(jd)


def test_cli_render_prints_the_golden_definition(jobgen: Callable[..., Any]) -> None:
    result = jobgen("render", "bert1.5b", "--backend", "batch", "--site", SITE, "--nodes", "8")
    assert result.exit_code == 0, result.output
    assert result.stdout == rendered("bert1.5b", 8)


def test_cli_validate_accepts_a_rendered_file(jobgen: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "jd.json"
    path.write_text(rendered("neox20b", 4))
    result = jobgen("batch", "validate", str(path))
    assert (result.exit_code, result.output) == (0, "ok\n")


@pytest.mark.parametrize("nodes,lr", [(8, "0.0015"), (16, "0.003")])
def test_bert_learning_rate_scales_with_nodes(nodes: int, lr: str) -> None:
    command = container(definition("bert1.5b", nodes))["command"]
    assert arg_values(command, "--lr") == [lr, lr]   # compile pass and training pass


def test_trn1_maps_8_efa_and_16_contiguous_neuron_devices() -> None:
    c = container(definition("llama2-7b", 4))
    paths = [d["hostPath"] for d in c["linuxParameters"]["devices"]]
    assert paths == ([f"/dev/infiniband/uverbs{i}" for i in range(8)]
                     + [f"/dev/neuron{i}" for i in range(16)])
    assert all(d["containerPath"] == d["hostPath"] for d in c["linuxParameters"]["devices"])
    assert c["privileged"] is False
    assert c["instanceType"] == "trn1.32xlarge"


def test_dl1_maps_4_efa_devices_and_is_privileged(write_site: Callable) -> None:
    site = write_site("dl1-batch", {"batch.efa_interfaces": {"dl1.24xlarge": 4}})
    spec = api.job_spec("bert1.5b", 8, site=str(site), backend="batch")
    c = container(json.loads(api.plan(spec).text))
    paths = [d["hostPath"] for d in c["linuxParameters"]["devices"]]
    assert paths == [f"/dev/infiniband/uverbs{i}" for i in range(4)]
    assert c["privileged"] is True   # Gaudi cards are not mappable devices on Batch
    assert c["instanceType"] == "dl1.24xlarge"


HF_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:jobgen/hf-token-AbCdEf"


def test_a_sites_secrets_reach_every_container_by_arn_never_as_a_value(
        write_site: Callable) -> None:
    """batch.secrets: HF_TOKEN for llama2-7b's gated tokenizer, in the prepare job's and the
    training job's container `secrets` (valueFrom, fetched by the execution role), not in their
    environment; an entry that is not a secret's or a parameter's ARN is one line."""
    from jobgen.backends.batch import stage
    ssm = "arn:aws:ssm:us-east-1:123456789012:parameter/jobgen/wandb"
    site = write_site("dl1-batch", {"batch.secrets": {"HF_TOKEN": HF_SECRET, "WANDB_KEY": ssm}})
    spec = api.job_spec("llama2-7b", 4, site=str(site), backend="batch")
    train = container(json.loads(api.plan(spec).text))       # validated against botocore too
    (argv,) = stage.argvs(spec, "prepare", ())
    prepare = stage.job_definition(spec, "prepare", argv)["containerProperties"]
    for c in (train, prepare):
        assert c["secrets"] == [{"name": "HF_TOKEN", "valueFrom": HF_SECRET},
                                {"name": "WANDB_KEY", "valueFrom": ssm}]
        assert not {"HF_TOKEN", "WANDB_KEY"} & {e["name"] for e in c["environment"]}
    assert "secrets" not in container(definition("llama2-7b", 4))   # the site names none
    import re
    for arn in ("hf_AbCdEf0123", "arn:aws:s3:::bucket/token",
                "arn:aws:ssm:us-east-1:1234:parameter/x"):
        bad = write_site("dl1-batch", {"batch.secrets": {"HF_TOKEN": arn}})
        with pytest.raises(JobgenError, match=f"batch.secrets.HF_TOKEN: '{re.escape(arn)}' is "
                                              "not the ARN of a Secrets Manager secret"):
            api.job_spec("llama2-7b", 4, site=str(bad), backend="batch")
    roleless = write_site("dl1-batch", {"batch.secrets": {"HF_TOKEN": HF_SECRET}},
                          delete=["batch.execution_role_arn"])
    with pytest.raises(JobgenError, match="HF_TOKEN: needs batch.execution_role_arn"):
        api.job_spec("llama2-7b", 4, site=str(roleless), backend="batch")


def test_retry_strategy_retries_host_failures_and_exits_on_the_rest() -> None:
    retry = definition("neox20b", 4)["retryStrategy"]
    conditions = retry["evaluateOnExit"]
    assert conditions[0] == {"onStatusReason": "Host EC2*", "action": "RETRY"}
    assert conditions[-1] == {"onReason": "*", "action": "EXIT"}
    assert len(conditions) <= 5
    assert 1 <= retry["attempts"] <= 10


def test_a_lost_child_node_is_retried_and_the_stop_signal_reaches_the_trainers() -> None:
    """Batch ends a multi-node job only on its main node's exit: the main node's watch ends the
    attempt with NODE_LOST_STATUS (env/containers/entrypoint.sh says the same number), which the
    retry strategy retries; a terminate or time-out's SIGTERM becomes the trainers' stop signal."""
    import re

    jd = definition("bert1.5b", 16)
    conditions = jd["retryStrategy"]["evaluateOnExit"]
    lost = {"onExitCode": str(batch.NODE_LOST_STATUS), "action": "RETRY"}
    assert lost in conditions and conditions.index(lost) < len(conditions) - 1
    entrypoint = (Path(__file__).resolve().parents[1] / "env" / "containers"
                  / "entrypoint.sh").read_text()
    assert re.findall(r"^node_lost_status=(\d+)$", entrypoint, re.M) == \
        [str(batch.NODE_LOST_STATUS)]
    env = {e["name"]: e["value"] for e in container(jd)["environment"]}
    assert env["JOBGEN_STOP_SIGNAL"] == "USR1"
    assert env["JOBGEN_NODE_SILENCE"] == str(batch.NODE_SILENCE_S)


@pytest.mark.parametrize("recipe, cut", [("llama2-7b", True), ("bert1.5b", False)])
def test_render_says_when_a_save_cannot_finish_in_batchs_stop_grace(
        jobgen: Callable[..., Any], recipe: str, cut: bool) -> None:
    """30 s from SIGTERM to SIGKILL; at dl1-batch's 1,000 MB/s a llama2-7b checkpoint (81 GB)
    takes about 81 s, a bert1.5b one (21 GB) 21 s."""
    from jobgen.payloads import base
    base._SAID.clear()   # notes are said once per process
    result = jobgen("render", recipe, "--backend", "batch", "--site", SITE, "--nodes", "4")
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "SIGTERM to SIGKILL" in line]
    if cut:
        assert said == [f"note: recipes/{recipe}.yaml: a Batch terminate or time-out gives the "
                        "trainers 30 s from SIGTERM to SIGKILL, and a checkpoint of 80.9 GB "
                        "takes about 81 s at the site's 1000 MB/s: that save is cut off and the "
                        "job resumes from its last periodic checkpoint (the ECS agent's "
                        "ECS_CONTAINER_STOP_TIMEOUT, set in the compute environment's launch "
                        "template, gives longer)"]
    else:
        assert said == []


@pytest.mark.parametrize("nodes", [1, 4, 16])
def test_one_open_ended_node_range_on_main_node_0(nodes: int) -> None:
    jd = definition("bert-large", nodes)
    props = jd["nodeProperties"]
    assert (props["numNodes"], props["mainNode"]) == (nodes, 0)
    assert [r["targetNodes"] for r in props["nodeRangeProperties"]] == ["0:"]
    assert jd["type"] == "multinode"


def test_content_hash_tag_is_stable_and_follows_the_content() -> None:
    jd = definition("bert1.5b", 8)
    tags = dict(jd["tags"])
    digest = tags.pop("jobgen:hash")
    without = dict(jd, tags=tags)
    assert digest == hashlib.sha256(json.dumps(without, sort_keys=True).encode()).hexdigest()[:16]
    assert definition("bert1.5b", 8)["tags"]["jobgen:hash"] == digest
    assert definition("bert1.5b", 8, "optim.lr=0.002")["tags"]["jobgen:hash"] != digest
    assert tags == {"jobgen:recipe": "bert1.5b", "jobgen:run": "bert1.5b-8n"}


def test_definition_name_is_a_valid_batch_name() -> None:
    spec = api.job_spec("bert1.5b", 8, site=SITE, backend="batch")
    assert batch.definition_name(spec) == "jobgen-bert1-5b"
    assert definition("bert1.5b", 8)["jobDefinitionName"] == "jobgen-bert1-5b"


def test_plan_registers_the_printed_file() -> None:
    plan = api.plan(api.job_spec("pythia6.9b", 4, site=SITE, backend="batch"))
    assert plan.primary == "pythia6.9b-4n.job-definition.json"
    assert plan.argv(Path("d") / plan.primary) == [
        "aws", "batch", "register-job-definition", "--cli-input-json",
        "file://d/pythia6.9b-4n.job-definition.json"]



def test_efa_devices_are_the_site_s_not_the_platform_s(write_site: Callable) -> None:
    """The DL1 workshop's launch template attaches one EFA interface: mapping uverbs1..3 as well
    would stop Docker from starting the container."""
    spec = api.job_spec("bert1.5b", 8, site="dl1-batch", backend="batch")
    c = api.plan(spec).text
    assert '"/dev/infiniband/uverbs0"' in c and "uverbs1" not in c
    site = write_site("dl1-batch", {"batch.efa_interfaces": {"trn1.32xlarge": 8}})
    with pytest.raises(JobgenError, match=r"batch\.efa_interfaces: no entry for dl1\.24xlarge: "
                                          r"say how many EFA interfaces"):
        api.plan(api.job_spec("bert1.5b", 8, site=str(site), backend="batch"))
    site = write_site("dl1-batch", {"batch.efa_interfaces": {"dl1.24xlarge": 5}})
    with pytest.raises(JobgenError, match=r"batch\.efa_interfaces\.dl1\.24xlarge: 5 is not "
                                          r"between 0 and 4"):
        api.plan(api.job_spec("bert1.5b", 8, site=str(site), backend="batch"))


def test_smoke_job_runs_on_the_sites_cpu_instance(write_site: Callable) -> None:
    """A rehearsal needs no accelerator: the site's CPU instance type, no devices, not
    privileged, a name of its own (so it never replaces the real job's definition)."""
    spec = api.job_spec("bert1.5b", 2, site="dl1-batch", backend="batch", smoke=True)
    jd = batch.job_definition(spec)
    c = container(jd)
    assert jd["jobDefinitionName"] == "jobgen-bert1-5b-smoke"
    assert c["instanceType"] == "c5.2xlarge"
    assert c["resourceRequirements"] == [{"type": "VCPU", "value": "8"},
                                         {"type": "MEMORY", "value": "15000"}]
    assert c["privileged"] is False and c["linuxParameters"]["devices"] == []
    assert c["linuxParameters"]["sharedMemorySize"] == 3750
    env = {e["name"]: e["value"] for e in c["environment"]}
    assert env["JOBGEN_SMOKE"] == "1"
    no_cpu = write_site("dl1-batch", delete=["batch.smoke"])
    with pytest.raises(JobgenError, match=r"batch\.smoke: no CPU instance type for --smoke"):
        batch.job_definition(api.job_spec("bert1.5b", 2, site=str(no_cpu), backend="batch",
                                          smoke=True))


@pytest.mark.parametrize("work_dir, volume, shared", [
    ("/mnt/efs/jobgen/runs", "/mnt/efs", True),      # the dl1-batch site: runs on EFS
    ("/mnt/efs", "/mnt/efs/", True),
    ("/mnt/efs2/runs", "/mnt/efs", False),           # a neighbour's name is not inside
    ("/scratch/runs", "/mnt/efs", False),            # each container's own disk
    ("jobgen-runs", "/mnt/efs", False),              # relative: inside the container's root
    ("/mnt/efs/../scratch/runs", "/mnt/efs", False),
])
def test_nodes_share_the_run_folder_only_where_it_is_on_the_shared_volume(
        write_site: Callable, work_dir: str, volume: str, shared: bool) -> None:
    """The job definition tells each node whether its peers see the same run folder: then rank 0
    alone clears, seals and prunes a checkpoint (each node's leader doing it on one shared folder
    would remove the others' shards mid-save), and the main node waits for every node's compile
    pass before it writes the cache marker."""
    site = write_site("dl1-batch", {"paths.work_dir": work_dir, "batch.shared_volume": volume})
    spec = api.job_spec("bert1.5b", 2, site=str(site), backend="batch")
    env = {e["name"]: e["value"] for e in container(json.loads(api.plan(spec).text))["environment"]}
    assert env.get("JOBGEN_SHARED_FS", "") == ("1" if shared else "")
    # No shared volume at all: each node's disk is its own.
    site = write_site("dl1-batch", {"paths.work_dir": work_dir}, delete=["batch.shared_volume"])
    spec = api.job_spec("bert1.5b", 2, site=str(site), backend="batch")
    env = {e["name"]: e["value"] for e in container(json.loads(api.plan(spec).text))["environment"]}
    assert "JOBGEN_SHARED_FS" not in env
