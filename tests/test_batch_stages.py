"""The prepare stage on AWS Batch (jobgen/backends/batch/stage.py): its single-node container
job definition, the training job that depends on it (SubmitJob's dependsOn), each job's stage
in the run record, and status/cancel of every stage's job (against moto's server)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
from click.testing import Result
from test_batch_client import aws, moto_inprocess, moto_url  # noqa: E402,F401 (fixtures)

from jobgen.runs import ledger

Jobgen = Callable[..., Result]


def _submit_shape() -> Any:
    """SubmitJob's request shape from the botocore model in this environment."""
    import botocore.loaders
    import botocore.model
    data = botocore.loaders.create_loader().load_service_model("batch", "service-2")
    return botocore.model.ServiceModel(data, service_name="batch").operation_model(
        "SubmitJob").input_shape


def _valid(request: dict[str, Any], shape: Any) -> None:
    from botocore.validate import ParamValidator
    report = ParamValidator().validate(request, shape)
    assert not report.has_errors(), report.generate_report()


def test_the_prepare_job_is_one_container_in_the_training_image(jobgen: Jobgen) -> None:
    staged = jobgen("render", "neox20b", "--backend", "batch", "--stage", "prepare")
    assert staged.exit_code == 0, staged.output
    jd = json.loads(staged.stdout)
    train = json.loads(jobgen("render", "neox20b", "--backend", "batch").stdout)
    node = train["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert jd["type"] == "container" and "nodeProperties" not in jd
    assert jd["jobDefinitionName"] == train["jobDefinitionName"] + "-prepare"
    container = jd["containerProperties"]
    assert container["image"] == node["image"]
    assert container["command"][:2] == ["python3", "/opt/jobgen/payload/neuron_nemo/prepare.py"]
    assert container["command"][container["command"].index("--output") + 1] == \
        "gpt2/my-gpt2_text_document"
    assert not container.get("linuxParameters") and "instanceType" not in container
    assert jd["tags"]["jobgen:stage"] == "prepare"
    # A config error of the program (78) is not retried; a host that went away is.
    assert {"onReason": "*", "action": "EXIT"} in jd["retryStrategy"]["evaluateOnExit"]
    from jobgen.backends.batch.rules import botocore_errors
    assert botocore_errors(jd) == []


def test_training_depends_on_every_prepare_task(jobgen: Jobgen) -> None:
    result = jobgen("submit", "neox20b", "--backend", "batch", "--stages", "prepare,train",
                    "--from", "s3://bucket/a.jsonl", "--from", "b.txt",
                    "--set", "data.shards=2", "--dry-run")
    assert result.exit_code == 0, result.output
    calls = json.loads(result.stdout)["calls"]
    assert [c["operation"] for c in calls] == ["RegisterJobDefinition", "SubmitJob",
                                               "SubmitJob", "RegisterJobDefinition",
                                               "SubmitJob"]
    shape = _submit_shape()
    prepares, train = [c["request"] for c in calls[1:3]], calls[4]["request"]
    for k, request in enumerate(prepares):
        command = request["containerOverrides"]["command"]
        assert command[command.index("--from") + 1] == ("s3://bucket/a.jsonl", "b.txt")[k]
        assert "nodeOverrides" not in request and "dependsOn" not in request
        _valid(request, shape)
    assert train["dependsOn"] == [{"jobId": "<job id of the prepare job 1>"},
                                  {"jobId": "<job id of the prepare job 2>"}]
    assert train["nodeOverrides"]["numNodes"] >= 1 and "containerOverrides" not in train
    _valid(train, shape)


def test_more_inputs_than_batch_can_depend_on_is_one_line(jobgen: Jobgen) -> None:
    sources = [word for k in range(21) for word in ("--from", f"part{k}.txt")]
    result = jobgen("submit", "neox20b", "--backend", "batch", "--stages", "prepare,train",
                    *sources, "--set", "data.shards=21", "--dry-run")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0
    assert "21 prepare tasks, and a Batch job depends on at most 20 jobs" in result.stderr


def test_sagemaker_and_eks_say_they_cannot_chain_stages(jobgen: Jobgen) -> None:
    for backend, says in (("sagemaker", "cannot run stages one after another (its jobs cannot "
                                        "wait for each other)"),
                          ("eks", "cannot run stages other than train yet (slurm and batch "
                                  "can)")):
        result = jobgen("submit", "neox20b", "--backend", backend, "--stages",
                        "prepare,train", "--dry-run")
        assert result.exit_code == 2
        assert f"--backend {backend} {says}" in result.stderr


def _run(**extra: Any) -> ledger.Run:
    return ledger.Run(name="r1", backend="slurm", job_id="12", recipe="neox20b", nodes=1,
                      site="", run_dir="/runs/r1", submitted=ledger.now(), **extra)


def test_the_ledger_keeps_each_jobs_stage_and_reads_old_records() -> None:
    assert ledger.record(_run(jobs=("11", "12"), stages=("prepare", "train"))) is None
    old = _run().as_dict()
    del old["stages"]   # a line written before stages
    bad = dict(_run(jobs=("11", "12")).as_dict(), stages=["prepare"])   # one short
    with open(Path(os.environ["JOBGEN_STATE_DIR"], ledger.RECORD), "a",
              encoding="utf-8") as f:
        f.write(json.dumps(old) + "\n" + json.dumps(bad) + "\n")
    runs, skipped = ledger.load_counted()
    assert skipped == 1
    assert runs[0].staged() == [("prepare", "11"), ("train", "12")]
    assert runs[1].stages == () and runs[1].staged() == [("train", "12")]


# --- against moto --------------------------------------------------------------------------

@pytest.mark.moto
def test_submit_stages_chains_on_batch_and_status_cancel_name_each_stage(
        jobgen: Jobgen, aws: str) -> None:  # noqa: F811
    from test_batch_client import _aws, run_name
    name = run_name()
    result = jobgen("submit", "neox20b", "--backend", "batch", "--stages", "prepare,train",
                    "--run-name", name)
    assert result.exit_code == 0, result.output
    prepare_id, train_id = result.stdout.split()
    job = _aws(aws, "batch").describe_jobs(jobs=[train_id])["jobs"][0]
    assert [d["jobId"] for d in job.get("dependsOn", [])] == [prepare_id]
    found = ledger.find(name)
    assert found is not None and found.staged() == [("prepare", prepare_id), ("train", train_id)]
    status = jobgen("status", name)
    assert status.exit_code == 0, status.output
    assert status.stdout.startswith(f"prepare: {prepare_id}  {name}-prepare  ")
    assert f"\ntrain: {train_id}  {name}  " in status.stdout
    shown = jobgen("runs", name)
    assert f"# jobs: prepare {prepare_id}, train {train_id}" in shown.stdout
    cancel = jobgen("cancel", name)
    assert cancel.exit_code == 0, cancel.output
    lines = cancel.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["train", "prepare"]
