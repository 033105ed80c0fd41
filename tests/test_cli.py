"""The command line, in process (CliRunner): list, show, render, check, --version. Bad input is
in test_errors.py; the scripts' content in test_backends_slurm.py."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import yaml

from jobgen import __version__, api
from jobgen.inputs import recipe as recipes


def test_version(jobgen: Callable) -> None:
    result = jobgen("--version")
    assert result.exit_code == 0
    assert result.stdout == f"jobgen, version {__version__}\n"


def test_help_lists_the_commands(jobgen: Callable) -> None:
    result = jobgen("--help")
    assert result.exit_code == 0
    for command in ("list", "show", "render", "check"):
        assert f"\n  {command} " in result.stdout


def test_list(jobgen: Callable) -> None:
    result = jobgen("list")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == recipes.recipe_names()
    neox = next(line for line in lines if line.startswith("neox20b "))
    assert neox.split()[1:4] == ["neuron_nemo", "trn1.32xlarge", "4n"]
    assert neox.endswith(
        "GPT-NeoX 20B (44 layers, hidden 6144), TP 8 x PP 4, GPT-2 BPE, Neuron NeMo")
    llama = next(line for line in lines if line.startswith("llama2-7b "))
    assert llama.split()[1:4] == ["neuronx_distributed", "trn1.32xlarge", "128n"]
    # Aligned columns: the payload column starts at the same place on every line.
    assert len({line.index(line.split()[1]) for line in lines}) == 1


def test_show_prints_the_derived_numbers(jobgen: Callable) -> None:
    result = jobgen("show", "neox20b", "--nodes", "4")
    assert result.exit_code == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["derived"]["world_size"] == 128
    assert shown["derived"]["data_parallel"] == 4
    assert shown["derived"]["gradient_accumulation"] == 64
    assert shown["derived"]["tokens_per_step"] == 524288
    assert (shown["recipe"], shown["site"], shown["nodes"]) == ("recipes/neox20b.yaml", "local", 4)
    assert shown["spec"]["model"]["num_layers"] == 44
    assert list(shown)[:4] == ["recipe", "site", "site_from", "backend"]   # in order, not sorted


def test_show_follows_options(jobgen: Callable) -> None:
    result = jobgen("show", "llama2-7b", "--nodes", "128", "--site", "trn1-pcluster",
                    "--set", "optim.lr=1e-4", "--compile", "never", "--run-name", "hlat")
    assert result.exit_code == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["derived"]["data_parallel"] == 512
    assert shown["derived"]["gradient_accumulation"] == 2
    assert shown["derived"]["tokens_per_step"] == 4194304
    assert shown["derived"]["lr"] == 1e-4
    assert (shown["compile_mode"], shown["run_name"], shown["run_dir"]) == \
        ("never", "hlat", "/fsx/jobgen/runs/hlat")


def test_render_to_stdout(jobgen: Callable) -> None:
    result = jobgen("render", "pythia6.9b", "--nodes", "2", "--site", "trn1-pcluster")
    assert result.exit_code == 0, result.stderr
    if not Path("/fsx").exists():   # said, not refused: the job checks when it starts
        assert result.stderr.startswith("warning: payload snapshot not placed: /fsx does not "
                                        "exist on this machine")
        assert result.stderr.count("\n") == 1
    expected = api.plan(api.job_spec("pythia6.9b", 2, site="trn1-pcluster")).text
    assert result.stdout == expected
    assert "#SBATCH --nodes=2\n" in result.stdout


def test_render_a_recipe_file(jobgen: Callable, write_recipe: Callable) -> None:
    path = write_recipe("neox20b", {"name": "my-neox", "nodes": 2})
    result = jobgen("render", str(path))
    assert result.exit_code == 0, result.stderr
    assert "#SBATCH --job-name=my-neox\n" in result.stdout
    assert "#SBATCH --nodes=2\n" in result.stdout
    assert f'Rendered by jobgen from "{path}"' in result.stdout


def test_render_output_dir(jobgen: Callable, tmp_path: Path) -> None:
    result = jobgen("render", "llama2-7b", "-n", "4", "--run-name", "try1",
                    "--output-dir", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    written = tmp_path / "out" / "try1.sbatch"
    assert result.stdout == f"{written}\n"
    assert written.read_text().startswith("#!/bin/bash\n#SBATCH --job-name=llama2-7b\n")


def test_check_command(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "pythia6.9b", "--no-shellcheck", "--max-nodes", "8")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "4 ok, 4 skipped, 0 failed"
    assert "pythia6.9b  skipped  4 at 3, 5-7      recipes/pythia6.9b.yaml: parallelism." \
        "global_batch_size" in result.stdout


def test_check_failure_exits_1(jobgen: Callable, tmp_path: Path) -> None:
    """A recipe that exists but does not render fails every row of the table (exit 1)."""
    bad = tmp_path / "bad.yaml"
    text = recipes.locate("pythia6.9b")[0].read_text(encoding="utf-8")
    bad.write_text(text.replace("\n  lr: ", "\n  lr: -", 1), encoding="utf-8")
    result = jobgen("check", "--recipe", str(bad), "--no-shellcheck", "--max-nodes", "16")
    assert result.exit_code == 1
    assert "0 ok, 0 skipped, 16 failed" in result.stdout
    assert "optim.lr: must be positive" in result.stdout


def test_check_unknown_recipe_or_site_is_one_error(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "nope", "--no-shellcheck")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: unknown recipe 'nope' (built-in recipes:")
    result = jobgen("check", "--site", "nowhere", "--no-shellcheck")
    assert result.exit_code == 2 and result.stderr.startswith("error: unknown site 'nowhere'")
    result = jobgen("check", "--site", "dl1-batch", "--no-shellcheck")
    assert result.exit_code == 2
    assert result.stderr == ("error: site dl1-batch has no Slurm cluster (slurm.max_nodes: 0): "
                             "use it with --backend batch (AWS Batch)\n")


# --- `jobgen submit` checks what it can before submitting -----------------------------------------

import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
from conftest import cluster_partitions  # noqa: E402

JOBGEN_EXE = Path(sys.executable).parent / "jobgen"


def submit_proc(cwd: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """`jobgen submit ...` from `cwd` (the submission directory); `path`: PATH instead of ours."""
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run([str(JOBGEN_EXE), "submit", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120, check=False)


@pytest.fixture
def no_slurm(tmp_path: Path) -> str:
    """A PATH with bash and coreutils but none of Slurm's commands (as on a laptop)."""
    folder = tmp_path / "bin-without-slurm"
    folder.mkdir()
    for tool in ("bash", "env", "sh"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)


def test_submit_refuses_a_missing_trainer(tmp_path: Path) -> None:
    """The local site's NeMo checkout is relative to the submission directory: the folder is
    there (with the data: tests/test_site_paths.py refuses them missing), its trainer is not."""
    (tmp_path / "neuronx-nemo-megatron/nemo/examples/nlp/language_modeling").mkdir(parents=True)
    (tmp_path / "jobgen-data").mkdir()
    proc = submit_proc(tmp_path, "neox20b", "--nodes", "2")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: site local: paths.nemo_dir: no trainer at neuronx-nemo-megatron/nemo/examples/"
        "nlp/language_modeling/megatron_gpt_pretraining.py (relative to the submission "
        "directory); pass --no-check to submit anyway\n")


def _nemo_checkout(root: Path, config: bool = True) -> None:
    workdir = root / "neuronx-nemo-megatron/nemo/examples/nlp/language_modeling"
    (workdir / "conf").mkdir(parents=True)
    (root / "jobgen-data").mkdir()   # the local site's data folder
    (workdir / "megatron_gpt_pretraining.py").write_text("# stand-in\n")
    if config:
        (workdir / "conf" / "megatron_neox_config.yaml").write_text("name: x\n")


def test_submit_refuses_a_missing_nemo_config(tmp_path: Path) -> None:
    _nemo_checkout(tmp_path, config=False)
    proc = submit_proc(tmp_path, "neox20b", "--nodes", "2")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: site local: paths.nemo_dir: no NeMo config at neuronx-nemo-megatron/nemo/"
        "examples/nlp/language_modeling/conf/megatron_neox_config.yaml (relative to the "
        "submission directory); pass --no-check to submit anyway\n")


@pytest.mark.parametrize("missing,what", [
    ("tp_zero1_llama_hf_pretrain", "NxD Llama example"),
    ("modeling_llama_nxd.py", "NxD example module"),
    ("training_utils.py", "NxD example module")])
def test_submit_refuses_a_missing_nxd_example(tmp_path: Path, write_site: Callable,
                                              missing: str, what: str) -> None:
    llama = tmp_path / "nxd" / "examples" / "training" / "llama"
    (llama / "tp_zero1_llama_hf_pretrain").mkdir(parents=True)
    for module in ("modeling_llama_nxd.py", "training_utils.py"):
        (llama / module).write_text("# stand-in\n")
    gone = llama / missing
    shutil.rmtree(gone) if gone.is_dir() else gone.unlink()
    site = write_site("local", {"paths.nxd_llama_dir": str(llama / "tp_zero1_llama_hf_pretrain")})
    (tmp_path / "jobgen-data").mkdir()
    proc = submit_proc(tmp_path, "llama2-7b", "--nodes", "4", "--site", str(site))
    assert (proc.returncode, proc.stdout) == (2, "")
    if missing == "tp_zero1_llama_hf_pretrain":   # the site's own path: the site-path preflight
        assert proc.stderr.splitlines()[0] == (
            f"error: {site}: paths.nxd_llama_dir: the neuronx-distributed example, {gone}, is "
            "not on this host")
        return
    assert proc.stderr == (f"error: site local: paths.nxd_llama_dir: no {what} at {gone}; "
                           "pass --no-check to submit anyway\n")


def test_submit_needs_the_sites_storage_for_the_payload_snapshot(tmp_path: Path,
                                                                  no_slurm: str) -> None:
    """trn1-pcluster keeps runs and payload snapshots on /fsx, which this host does not mount:
    the job's payload cannot be placed, so nothing is submitted (even unchecked: the site-path
    preflight, tests/test_site_paths.py, would have said so first)."""
    if Path("/fsx").exists():
        pytest.skip("this host mounts /fsx")
    proc = submit_proc(tmp_path, "llama2-7b", "--nodes", "4", "--site", "trn1-pcluster",
                       "--no-check", path=no_slurm)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: payload snapshot not placed: /fsx does not exist on this machine (the site "
        "keeps snapshots in /fsx/jobgen/payload); render or submit on a machine that mounts "
        "it\n")
    assert list(tmp_path.iterdir()) == [tmp_path / "bin-without-slurm"]


def test_submit_says_what_it_could_not_check(tmp_path: Path, no_slurm: str,
                                             write_site: Callable) -> None:
    """The trainer's checkout, the venv and the data are only the nodes' (node_only_paths; the
    runs and the payload snapshot are here); without Slurm's commands the node count cannot be
    checked either. Then sbatch itself is missing."""
    if Path("/fsx").exists():
        pytest.skip("this host mounts /fsx")
    site = write_site("trn1-pcluster", {"paths.work_dir": str(tmp_path / "runs"),
                                        "paths.payload_dir": None,
                                        "paths.compile_cache": str(tmp_path / "cache"),
                                        "node_only_paths": ["setup.activate", "paths.data_dir",
                                                            "paths.nxd_llama_dir"]})
    proc = submit_proc(tmp_path, "llama2-7b", "--nodes", "4", "--site", str(site),
                       path=no_slurm)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        "not checked from this host: NxD Llama example, NxD example module "
        "(paths.nxd_llama_dir, only on the nodes); the node count (sinfo not found: is this a "
        "Slurm login node?)",
        "data: not checked from this host (it does not see /home/ubuntu/examples_datasets); "
        "the nodes check it before the compile pass",
        "error: sbatch not found: is this a Slurm login node?"]


def test_submit_no_check_skips_the_checks(tmp_path: Path, no_slurm: str) -> None:
    proc = submit_proc(tmp_path, "neox20b", "--nodes", "2", "--no-check", path=no_slurm)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        1, "", "error: sbatch not found: is this a Slurm login node?\n")


def test_smoke_rehearsal_needs_only_jobgens_payload(tmp_path: Path, no_slurm: str) -> None:
    proc = submit_proc(tmp_path, "neox20b", "--nodes", "2", "--smoke", path=no_slurm)
    assert proc.stderr.splitlines()[0] == (
        "not checked from this host: the node count (sinfo not found: is this a Slurm login "
        "node?)")


# Against the real local cluster (tests/ci/slurm-up.sh: partition debug, 4 nodes).

@pytest.mark.slurm
def test_submit_refuses_more_nodes_than_the_partition(slurm_cluster: int, tmp_path: Path,
                                                      write_site: Callable) -> None:
    nodes = slurm_cluster * 2
    site = write_site("local", {"slurm.partition": "debug"})
    proc = submit_proc(tmp_path, "neox20b", "--nodes", str(nodes), "--smoke", "--site", str(site))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"error: {nodes} nodes: partition debug has {slurm_cluster} (sinfo); ask for "
               "fewer, or pass --no-check to queue it anyway\n")
    # The default partition (none named) is the same one; --no-check leaves it to sbatch.
    proc = submit_proc(tmp_path, "neox20b", "--nodes", str(nodes), "--smoke")
    assert proc.returncode == 2 and "partition debug has" in proc.stderr
    # Unchecked, Slurm queues the job, and it would pend for ever (Reason=PartitionConfig).
    proc = submit_proc(tmp_path, "neox20b", "--nodes", str(nodes), "--smoke", "--no-check")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    try:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                               text=True, timeout=30, check=True).stdout
        assert "JobState=PENDING" in shown and "Reason=PartitionConfig" in shown, shown
    finally:
        subprocess.run(["scancel", job_id], timeout=30, check=False)


@pytest.mark.slurm
def test_submit_refuses_an_unknown_partition(slurm_cluster: int, tmp_path: Path,
                                             write_site: Callable) -> None:
    site = write_site("local", {"slurm.partition": "nosuch"})
    proc = submit_proc(tmp_path, "neox20b", "--nodes", "2", "--smoke", "--site", str(site))
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "error: site local: slurm.partition: sinfo shows no partition 'nosuch' "
               f"(partitions: {cluster_partitions()})\n")


# --- one command tree: submit/status/logs/cancel --backend, aliases, --json ---------------------

def test_show_json_is_the_same_spec(jobgen: Callable) -> None:
    as_yaml = yaml.safe_load(jobgen("show", "llama2-7b", "-n", "4").stdout)
    result = jobgen("show", "llama2-7b", "-n", "4", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == as_yaml
    assert "rehearsal" not in as_yaml


def test_show_smoke_says_what_the_rehearsal_trains(jobgen: Callable) -> None:
    shown = json.loads(jobgen("show", "llama2-7b", "-n", "2", "--smoke", "--json").stdout)
    rehearsal = shown["rehearsal"]
    assert (rehearsal["family"], rehearsal["trainer"], rehearsal["device"]) == (
        "llama", "smoke/train.py", "cpu")
    assert (rehearsal["num_layers"], rehearsal["hidden_size"], rehearsal["max_steps"]) == (
        2, 64, 24)
    # The derived sizes are the rehearsal's: one CPU process per node, unsharded.
    derived = shown["derived"]
    assert (derived["workers_per_node"], derived["model_parallel"], derived["world_size"],
            derived["global_batch_size"]) == (1, 1, 2, 4)
    bert = json.loads(jobgen("show", "bert1.5b", "-n", "2", "--smoke", "--json").stdout)
    assert bert["rehearsal"]["trainer"] == "habana_deepspeed/pretrain_bert.py"


def test_check_json(jobgen: Callable) -> None:
    result = jobgen("check", "--recipe", "pythia6.9b", "--no-shellcheck", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert [r["nodes"] for r in report["rows"]] == list(range(1, 129))
    assert report["counts"]["failed"] == 0 and report["problems"] == []
    assert report["counts"]["ok"] + report["counts"]["skipped"] == 128


def test_batch_submit_is_an_alias_of_submit_backend_batch(jobgen: Callable) -> None:
    args = ("bert-large", "-n", "2", "--dry-run")
    one = jobgen("submit", *args, "--backend", "batch")
    two = jobgen("batch", "submit", *args)
    assert one.exit_code == 0, one.stderr
    assert one.stdout == two.stdout
    calls = json.loads(one.stdout)["calls"]
    assert [c["operation"] for c in calls] == ["RegisterJobDefinition", "SubmitJob"]
    assert calls[0]["request"] == json.loads(jobgen("render", "bert-large", "-n", "2",
                                                    "--backend", "batch").stdout)


def test_via_submitit_is_kept_as_the_old_spelling(jobgen: Callable) -> None:
    one = jobgen("submit", "pythia6.9b", "-n", "2", "--smoke", "--dry-run", "--via",
                 "submitit")
    two = jobgen("submit", "pythia6.9b", "-n", "2", "--smoke", "--dry-run", "--backend",
                 "submitit")
    assert one.exit_code == 0, one.stderr
    assert one.stdout == two.stdout == jobgen("render", "pythia6.9b", "-n", "2", "--smoke",
                                              "--backend", "submitit").stdout
    assert json.loads(one.stdout)["submitit"]["parameters"]["name"] == "pythia6.9b-smoke"


@pytest.mark.parametrize("args,said", [
    (("--queue", "q"), "--queue is for --backend batch"),
    (("--endpoint-url", "http://127.0.0.1:9"), "--endpoint-url is for --backend batch"),
    (("--backend", "batch", "--chain"), "--chain is for --backend slurm (batch runs both "
                                        "passes in one job)"),
    (("--backend", "submitit", "--chain"), "--chain is for --backend slurm (submitit runs "
                                           "both passes in one job)"),
])
def test_submit_options_of_another_backend_are_refused(jobgen: Callable, args: tuple[str, ...],
                                                       said: str) -> None:
    result = jobgen("submit", "bert-large", "-n", "2", "--dry-run", *args)
    assert result.exit_code == 2
    assert said in result.stderr


def test_run_dry_run_prints_each_nodes_command(jobgen: Callable) -> None:
    result = jobgen("run", "neox20b", "-n", "2", "--smoke", "--dry-run")
    assert result.exit_code == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    assert [n["env"]["JOBGEN_NODE_RANK"] for n in nodes] == ["0", "1"]
    assert nodes[0]["argv"][:3] == ["bash", nodes[0]["argv"][1], "node"]
    # The job's payload snapshot (jobgen/images/snapshot.py), never jobgen's own folder.
    assert re.search(r"/jobgen-runs/\.jobgen/payload/[0-9a-f]{16}/common/job_flow\.sh$",
                     nodes[0]["argv"][1])


def test_a_batch_job_id_goes_to_batch(jobgen: Callable) -> None:
    """A UUID that jobgen did not record is a Batch job id (Slurm's are numbers)."""
    result = jobgen("status", "6a7c3f1e-0000-4000-8000-000000000001", "--site", "local",
                    "--endpoint-url", "not a url")
    assert result.exit_code == 2
    assert "--endpoint-url: 'not a url' is not an endpoint URL" in result.stderr
    result = jobgen("status", "123", "--endpoint-url", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert "--endpoint-url is for batch and sagemaker jobs" in result.stderr


def test_render_loads_only_rendering() -> None:
    """The command line is a package of command groups loaded when asked for: rendering imports
    no other command group, nor planning, watching or any cloud SDK."""
    code = ("import contextlib, io, sys\n"
            "import jobgen.cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert jobgen.cli.main(['render', 'neox20b', '--nodes', '4']) == 0\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith(('jobgen.cli.', "
            "'jobgen.planning', 'jobgen.watching', 'boto3', 'botocore', 'kubernetes', "
            "'submitit')))))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["jobgen.cli.app", "jobgen.cli.options",
                                     "jobgen.cli.param_types", "jobgen.cli.render_cmds"]
