"""The export stage on SageMaker (issue 51): `jobgen render|submit --backend sagemaker --stage
export` is one CreateTrainingJob on one CPU instance in the training job's image, reading the
run's training folder from its checkpoint S3 prefix as a FastFile channel and writing RUN/export
back to that prefix through its own checkpoint sync (jobgen/backends/sagemaker/stage.py);
`jobgen run --backend sagemaker --smoke --stage export` runs that job's container on an emulated
instance over what the training rehearsal's instances synced, through export_smp.py's merge,
transformers and the loss match."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from botocore.validate import ParamValidator

from jobgen import api
from jobgen.backends.sagemaker import rehearsal as sm_rehearsal
from jobgen.backends.sagemaker import stage as sm_stage
from jobgen.backends.sagemaker.request import _sdk, training_job
from jobgen.job.sizes import parameters
from jobgen.plumbing.errors import ConfigError
from tests.test_rehearsal_data import _port, jobgen, ok

ROOT = Path(__file__).resolve().parent.parent
Jobgen = Callable[..., Any]


def _spec(nodes: int = 16, smoke: bool = False, site: str = "sagemaker") -> Any:
    return api.job_spec("llama2-7b", nodes, site=site, backend="sagemaker", smoke=smoke)


def _pairs(words: list[str]) -> dict[str, str]:
    return dict(zip(words, words[1:]))


# --- fast: the rendered request -------------------------------------------------------------

def test_the_export_job_is_one_cpu_instance_on_the_runs_checkpoint_prefix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec()
    request = sm_stage.stage_job(spec, "export", (), 3000)
    train = training_job(spec)
    shape = _sdk().operation_model("CreateTrainingJob").input_shape
    assert not ParamValidator().validate(request, shape).has_errors()
    resources = request["ResourceConfig"]
    assert resources["InstanceCount"] == 1 and resources["InstanceType"].startswith("ml.r5.")
    assert request["AlgorithmSpecification"]["TrainingImage"] == \
        train["AlgorithmSpecification"]["TrainingImage"]
    (program,) = request["AlgorithmSpecification"]["ContainerEntrypoint"][1:]
    assert program == "/opt/jobgen/payload/smp_fsdp/export_smp.py"
    assert (ROOT / "payload" / "smp_fsdp" / "export_smp.py").is_file()
    # In: the training folder under the run's own checkpoint prefix, streamed; the data channel
    # the proof's batch is read from, as training has it.
    prefix = f"{train['CheckpointConfig']['S3Uri']}/{spec.run_name}"
    trained, *data = request["InputDataConfig"]
    assert (trained["ChannelName"], trained["InputMode"]) == ("run-train", "FastFile")
    assert trained["DataSource"]["S3DataSource"]["S3Uri"] == f"{prefix}/train/"
    assert data == train["InputDataConfig"]
    # Out: RUN/export, its checkpoint folder, synced to RUN/export under the same prefix.
    args = request["AlgorithmSpecification"]["ContainerArguments"]
    pairs = _pairs(args)
    assert request["CheckpointConfig"] == {"S3Uri": f"{prefix}/export",
                                           "LocalPath": pairs["--export-root"]}
    assert pairs["--export-root"] == f"/opt/ml/checkpoints/{spec.run_name}/export"
    assert pairs["--output-dir"] == "/opt/ml/input/data/run-train"
    assert pairs["--step"] == "3000" and args[-1] == "--on-node"
    # The arguments are export_smp.py's own, as its parser reads them.
    monkeypatch.syspath_prepend(str(ROOT / "payload" / "smp_fsdp"))
    import export_smp
    parsed = export_smp.parse_args(args)
    assert (parsed.step, str(parsed.output_dir), parsed.micro_batches, parsed.tensor_parallel) \
        == (3000, "/opt/ml/input/data/run-train", 8, 8)
    assert str(parsed.tokenizer) == pairs["--data-dir"]   # prepare saves it beside the blocks
    assert "--step" not in sm_stage.stage_job(spec, "export")["AlgorithmSpecification"][
        "ContainerArguments"]


def test_the_export_instance_holds_the_export_and_the_site_can_name_another() -> None:
    spec = _spec()
    kind = sm_stage.export_instance_type(spec)
    need = parameters(spec) * sm_stage.EXPORT_BYTES_PER_PARAM / 2 ** 30
    sizes = list(sm_stage.R5_GIB.items())
    at = [k for k, _ in sizes].index(kind)
    assert sizes[at][1] * sm_stage.USABLE >= need > sizes[at - 1][1] * sm_stage.USABLE
    import dataclasses
    site = dataclasses.replace(spec.site, sagemaker=dataclasses.replace(
        spec.site.sagemaker, export_instance_type="ml.m5.24xlarge"))
    assert sm_stage.stage_job(dataclasses.replace(spec, site=site), "export")[
        "ResourceConfig"]["InstanceType"] == "ml.m5.24xlarge"
    smoke = sm_stage.stage_job(_spec(2, smoke=True), "export")
    assert smoke["ResourceConfig"] == {"InstanceType": "ml.c5.4xlarge", "InstanceCount": 1,
                                       "VolumeSizeInGB": 500}
    assert [c["ChannelName"] for c in smoke["InputDataConfig"]] == ["run-train"]


def test_render_and_submit_print_the_export_job_and_refuse_in_one_line(jobgen: Jobgen) -> None:
    rendered = jobgen("render", "llama2-7b", "--backend", "sagemaker", "--site", "sagemaker",
                      "--nodes", "16", "--stage", "export", "--step", "3000")
    assert rendered.exit_code == 0, rendered.output
    assert json.loads(rendered.stdout) == sm_stage.stage_job(_spec(), "export", (), 3000)
    dry = jobgen("submit", "llama2-7b", "--backend", "sagemaker", "--site", "sagemaker",
                 "--nodes", "16", "--stages", "export", "--step", "3000", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["CreateTrainingJob"] == json.loads(rendered.stdout)
    for args, says in (
            (("render", "--stage", "export", "--step", "600000"),
             "error: --step 600000: recipes/llama2-7b.yaml trains 500000 steps, so no "
             "checkpoint of step 600000 can exist\n"),
            (("render", "--stage", "eval"),
             "error: --stage eval: --backend sagemaker runs the export stage only (slurm and "
             "batch run eval)\n"),
            (("submit", "--stages", "train,export", "--dry-run"),
             "--stages train,export: --backend sagemaker cannot run stages one after another "
             "(its jobs cannot wait for each other): submit each on its own, --stages export "
             "once training has completed\n")):
        refused = jobgen(args[0], "llama2-7b", "--backend", "sagemaker", "--site", "sagemaker",
                         *args[1:])
        assert (refused.exit_code, refused.stdout) == (2, ""), refused.output
        assert refused.stderr.endswith(says), refused.stderr   # click's usage lines before it
    other = jobgen("render", "neox20b", "--backend", "sagemaker", "--site", "sagemaker",
                   "--stage", "export")
    assert other.exit_code == 2 and "exports the runs of payload smp_fsdp only" in other.stderr


class _SageMaker:
    """CreateTrainingJob and DescribeTrainingJob as botocore's client takes them (no job of that
    name yet), recording what is created."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def describe_training_job(self, TrainingJobName: str) -> None:
        from botocore.exceptions import ClientError
        raise ClientError({"Error": {"Code": "ValidationException", "Message": "not found"}},
                          "DescribeTrainingJob")

    def create_training_job(self, **request: Any) -> dict[str, str]:
        self.created.append(request)
        return {"TrainingJobArn": f"arn:aws:sagemaker:::training-job/{request['TrainingJobName']}"}


def test_submit_creates_the_export_job_alone_and_records_its_stage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.backends import SubmitOptions
    from jobgen.backends.sagemaker import backend
    client = _SageMaker()
    monkeypatch.setattr(backend, "_client", lambda *args, **kwargs: client)
    spec = _spec()
    done = backend.submit(spec, SubmitOptions(stages=("export",), step=3000))
    (created,) = client.created
    assert created == sm_stage.stage_job(spec, "export", (), 3000)
    assert (done.job_ids, done.stages) == ((created["TrainingJobName"],), ("export",))
    assert done.notes == (f"created SageMaker training job {created['TrainingJobName']} "
                          f"(1 x {created['ResourceConfig']['InstanceType']})",)
    with pytest.raises(ConfigError, match="cannot run stages one after another"):
        backend.submit(spec, SubmitOptions(stages=("train", "export")))
    assert len(client.created) == 1


# --- fast: the emulated instance ------------------------------------------------------------

def _disk(tmp: Path, job: str, host: int, relative: str, files: dict[str, str]) -> None:
    """An emulated instance's checkpoint folder, as a rehearsal job left it."""
    for name, text in files.items():
        path = tmp / ".jobgen-rehearsal" / job / f"algo-{host}" / "opt/ml/checkpoints" / \
            relative / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_instance_reads_what_every_earlier_instance_synced_newest_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = _spec(2, smoke=True, site="local")
    run = spec.run_name
    step = "checkpoints/step_00000004"
    _disk(tmp_path, "local-100-5", 1, f"{run}/train", {"metrics.jsonl": "old\n",
                                                       f"{step}/__0_0.distcp": "a"})
    _disk(tmp_path, "local-200-7", 1, f"{run}/train", {"metrics.jsonl": "new\n",
                                                       f"{step}/COMPLETE": ""})
    _disk(tmp_path, "local-200-7", 2, f"{run}/train", {f"{step}/__2_0.distcp": "b"})
    _disk(tmp_path, "local-250-9", 1, f"{run}/export", {"step-4/config.json": "{}"})
    _disk(tmp_path, "local-260-3", 1, "another-run/train", {"metrics.jsonl": "other\n"})
    instance = sm_rehearsal.stage_instance(spec, "export", "local-300-1")
    channel = tmp_path / ".jobgen-rehearsal/local-300-1/algo-1/opt/ml/input/data/run-train"
    assert instance.trained == channel
    assert sorted(str(p.relative_to(channel)) for p in channel.rglob("*") if p.is_file()) == [
        f"{step}/COMPLETE", f"{step}/__0_0.distcp", f"{step}/__2_0.distcp", "metrics.jsonl"]
    assert (channel / "metrics.jsonl").read_text() == "new\n"   # the later upload
    # The export folder restored, as SageMaker restores a job's checkpoint folder.
    assert Path(instance.run_dir, "export", "step-4", "config.json").read_text() == "{}"
    assert instance.shown.startswith(f"s3://jobgen-local/checkpoints/{run}/{run}/train/")
    argv, env = instance.command(4)
    assert argv[1].endswith("/opt/jobgen/payload/smp_fsdp/export_smp.py")
    pairs = _pairs(argv)
    assert (pairs["--output-dir"], pairs["--step"]) == (str(channel), "4")
    assert pairs["--export-root"] == str(Path(instance.run_dir, "export"))
    assert env["TRAINING_JOB_NAME"] == "local-300-1"


def test_a_step_not_synced_or_no_rehearsal_is_one_line_and_leaves_no_instance(
        tmp_path: Path) -> None:
    base = ("run", "llama2-7b", "--backend", "sagemaker", "--smoke", "--nodes", "2",
            "--stage", "export")
    done = jobgen(tmp_path, *base)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no SageMaker rehearsal of run llama2-7b-2n-smoke to export (train first: jobgen " \
           "run llama2-7b --smoke --backend sagemaker --nodes 2)" in done.stderr
    _disk(tmp_path, "local-100-5", 1, "llama2-7b-2n-smoke/train",
          {"checkpoints/step_00000004/COMPLETE": ""})
    jobs = sorted(p.name for p in (tmp_path / ".jobgen-rehearsal").iterdir())
    done = jobgen(tmp_path, *base, "--step", "7")
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr == (
        "error: --step 7: s3://jobgen-local/checkpoints/llama2-7b-2n-smoke/llama2-7b-2n-smoke/"
        "train/checkpoints (as the SageMaker rehearsals here left it) has no complete "
        "checkpoint of step 7 (complete: 4)\n")
    assert sorted(p.name for p in (tmp_path / ".jobgen-rehearsal").iterdir()) == jobs


# --- slow: the rehearsal, trained then exported -------------------------------------------------

@pytest.mark.slow   # two emulated instances train (about 20 s), then the export and its proof
def test_the_rehearsal_exports_what_both_instances_synced_and_transformers_loads_it(
        tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    common = ("llama2-7b", "--backend", "sagemaker", "--smoke", "--nodes", "2")
    ok(jobgen(tmp_path, "run", *common, "--compile", "never", "--set",
              f"job.master_port={_port()}"))
    done = jobgen(tmp_path, "run", *common, "--stage", "export")
    ok(done)
    (job,) = [p for p in (tmp_path / ".jobgen-rehearsal").iterdir()
              if (p / "algo-1/opt/ml/input/data/run-train").is_dir()]
    run = job / "algo-1/opt/ml/checkpoints/llama2-7b-2n-smoke"
    folder = run / "export" / "step-20"   # 24, the newest, has no step 25 to prove it with
    assert f"smp-export: {folder}: exported and proven: loss " in done.stdout
    # Each training instance wrote its own ranks' shards; the export read all four.
    channel = job / "algo-1/opt/ml/input/data/run-train/checkpoints/step_00000020"
    assert sorted(p.name for p in channel.glob("*.distcp")) == [
        f"__{r}_0.distcp" for r in range(4)]
    record = json.loads((folder / "jobgen-export.json").read_text())
    assert record["proof"]["ok"] and record["proof"]["precision"] == "fp32"
    assert (record["model_class"], record["tensor_parallel"]) == ("LlamaForCausalLM", 1)
    assert done.stdout.splitlines()[-1].startswith(
        "jobgen: the export stage ended with status 0: proven; the model folders are in "
        f"{run.relative_to(tmp_path)}/export ")
    # The proof loaded the folder with transformers alone, in a fresh isolated interpreter
    # (payload/common/export_loss.py), as tests/test_export_smp.py's LOAD_ALONE does.
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()}
