"""The Slurm backend: the sbatch script of every recipe, byte for byte (golden files), and the
properties users rely on: the #SBATCH header, the environment block, a compile pass that differs
from the training pass only where documented, determinism.

The generated-values block of a script is read back by running it through bash, so these tests
see what the job will see, after shell quoting."""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from jobgen import api, payloads
from jobgen.images import snapshot

GOLDEN = [("neox20b", 4), ("neox20b", 16), ("pythia6.9b", 1), ("pythia6.9b", 4),
          ("llama2-7b", 4), ("llama2-7b", 128)]
NEURON_RECIPES = ("neox20b", "pythia6.9b", "llama2-7b")
END_OF_VALUES = "# ---- end of generated values"


def render(jobgen: Callable, *args: str) -> str:
    result = jobgen("render", *args)
    assert result.exit_code == 0, result.stderr
    assert result.exception is None
    return result.stdout


@dataclass
class Values:
    """The generated-values block of a script, as bash sees it."""
    shell: dict[str, str]      # every NAME=value assigned there (exported or not)
    env: dict[str, str]        # the exported environment
    compile_args: list[str]
    train_args: list[str]


def generated_values(script: str, tmp_path: Path) -> Values:
    head, sep, _ = script.partition(END_OF_VALUES)
    assert sep, "the script has no end-of-generated-values marker"
    names = sorted(set(re.findall(r"^(?:export )?([A-Z_][A-Z0-9_]*)=(?!\()", head, re.M)))
    out = [tmp_path / f"values-{i}" for i in range(4)]
    dump = "\n".join([
        head,
        f"for n in {' '.join(names)}; do printf '%s=%s\\0' \"$n\" \"${{!n}}\"; done > \"$1\"",
        'printf "%s\\0" "${COMPILE_ARGS[@]}" > "$2"',
        'printf "%s\\0" "${TRAIN_ARGS[@]}" > "$3"',
        'env -0 > "$4"',
        "}",   # the script's one { ... } block (see test_a_script_cut_short_runs_nothing)
    ])
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-c", dump, "values", *map(str, out)],
                          env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    def pairs(path: Path) -> dict[str, str]:
        items = path.read_text().split("\0")[:-1]
        return dict(item.split("=", 1) for item in items)

    def words(path: Path) -> list[str]:
        return path.read_text().split("\0")[:-1]

    return Values(pairs(out[0]), pairs(out[3]), words(out[1]), words(out[2]))


def hydra_overrides(args: list[str]) -> dict[str, str]:
    """NeMo's arguments: --config-name=X then key=value overrides."""
    assert args[0].startswith("--config-name=")
    return dict(a.split("=", 1) for a in args)


def nxd_flags(args: list[str]) -> dict[str, object]:
    """argparse-style flags: --flag value, or a bare --flag (True)."""
    flags: dict[str, object] = {}
    i = 0
    while i < len(args):
        assert args[i].startswith("--"), args[i]
        if i + 1 < len(args) and not re.match(r"^--[a-z]", args[i + 1]):
            flags[args[i]] = args[i + 1]
            i += 2
        else:
            flags[args[i]] = True
            i += 1
    return flags


# --- golden files ------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,nodes", GOLDEN, ids=[f"{r}-{n}n" for r, n in GOLDEN])
def test_matches_golden(jobgen: Callable, golden: Callable, recipe: str, nodes: int) -> None:
    script = render(jobgen, recipe, "--nodes", str(nodes), "--site", "trn1-pcluster")
    golden(Path("slurm") / f"{recipe}-{nodes}n.sbatch", script)


def test_golden_mismatch_shows_a_diff_and_how_to_regenerate(
        golden: Callable, tmp_path: Path, pytestconfig: pytest.Config) -> None:
    if pytestconfig.getoption("--update-golden"):
        pytest.skip("comparing is switched off by --update-golden")
    path = tmp_path / "x.sbatch"              # an absolute path: outside tests/golden/
    path.write_text("a\nold\nc\n")
    with pytest.raises(pytest.fail.Exception) as info:
        golden(path, "a\nnew\nc\n")
    message = str(info.value)
    assert f"--- {path} (golden)\n+++ rendered now\n" in message
    assert "\n-old\n+new\n" in message
    assert message.endswith("regenerate with: pytest tests/test_backends_slurm.py --update-golden")
    assert path.read_text() == "a\nold\nc\n"     # never rewritten without the flag
    with pytest.raises(pytest.fail.Exception, match="x-missing.sbatch is missing; if the change"):
        golden(tmp_path / "x-missing.sbatch", "a\n")
    golden(path, "a\nold\nc\n")                  # equal: passes


def test_golden_files_hold_no_machine_paths() -> None:
    """Goldens are rendered for trn1-pcluster (/fsx/..., and the ubuntu user's home where AWS's
    samples install the venv and checkouts): nothing of this checkout leaks in."""
    files = sorted((Path(__file__).parent / "golden" / "slurm").glob("*.sbatch"))
    assert {f.name for f in files} >= {f"{r}-{n}n.sbatch" for r, n in GOLDEN}
    checkout = str(Path(__file__).resolve().parent.parent)
    for f in files:
        text = f.read_text()
        assert checkout not in text, f.name
        assert not re.search(r"/home/(?!ubuntu/)", text) and "/tmp/" not in text, f.name


def test_render_is_deterministic(jobgen: Callable, jobgen_proc: Callable) -> None:
    """Same inputs, byte-identical output: twice in process, and in processes with different
    hash seeds (set and dict ordering), matching the in-process result."""
    args = ("render", "neox20b", "--nodes", "8", "--site", "trn1-pcluster")
    first = render(jobgen, *args[1:])
    assert render(jobgen, *args[1:]) == first
    for seed in ("1", "2"):
        proc = jobgen_proc(*args, env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == first


def test_plan_has_one_executable_sbatch_file() -> None:
    plan = api.plan(api.job_spec("neox20b", 4, site="trn1-pcluster"))
    assert plan.backend == "slurm"
    assert [f.name for f in plan.files] == ["neox20b-4n.sbatch"]
    assert plan.file().executable
    assert plan.text.startswith("#!/bin/bash\n") and plan.text.endswith("\n")
    assert plan.argv(Path("/x/neox20b-4n.sbatch")) == ["sbatch", "--parsable",
                                                       "/x/neox20b-4n.sbatch"]


# --- the #SBATCH header ------------------------------------------------------------------------

def sbatch_lines(script: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in script.splitlines() if line.startswith("#SBATCH")]


def test_sbatch_header_for_pcluster(jobgen: Callable) -> None:
    script = render(jobgen, "neox20b", "--nodes", "16", "--site", "trn1-pcluster")
    assert sbatch_lines(script) == [
        "--job-name=neox20b", "--nodes=16", "--ntasks-per-node=1", "--cpus-per-task=128",
        "--exclusive", "--partition=compute1", "--output=%x-%j.out", "--open-mode=append",
        "--requeue", "--signal=B:USR1@600"]


def test_sbatch_header_for_local_site_and_options(jobgen: Callable, write_site: Callable) -> None:
    script = render(jobgen, "llama2-7b", "--nodes", "2")
    assert sbatch_lines(script) == [
        "--job-name=llama2-7b", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2",
        "--exclusive", "--output=%x-%j.out", "--open-mode=append", "--requeue",
        "--signal=B:USR1@600"]
    site = write_site("trn1-pcluster", {"slurm.account": "ml-team", "slurm.exclusive": False,
                                        "slurm.cpus_per_task": 96})
    script = render(jobgen, "llama2-7b", "--nodes", "2", "--site", str(site),
                    "--set", "job.time_limit=2-00:00:00")
    lines = sbatch_lines(script)
    assert "--exclusive" not in lines
    assert {"--cpus-per-task=96", "--partition=compute1", "--account=ml-team",
            "--time=2-00:00:00"} <= set(lines)


def test_per_job_overrides_replace_the_site_and_recipe_values(jobgen: Callable,
                                                               write_site: Callable) -> None:
    site = write_site("trn1-pcluster", {"slurm.account": "ml-team", "slurm.qos": "normal",
                                        "slurm.time_limit_warning_s": 900})
    script = render(jobgen, "llama2-7b", "--nodes", "4", "--site", str(site),
                    "--set", "job.time_limit=2-00:00:00", "--partition", "big",
                    "--account", "other", "--time", "12:00:00", "--qos", "high",
                    "--reservation", "hlat", "--exclude", "n[3-4],n9", "--nodelist", "n[1-2]")
    lines = sbatch_lines(script)
    assert lines[4:] == ["--exclusive", "--partition=big", "--account=other", "--qos=high",
                         "--reservation=hlat", "--time=12:00:00", "--exclude=n[3-4],n9",
                         "--nodelist=n[1-2]", "--output=%x-%j.out", "--open-mode=append",
                         "--requeue", "--signal=B:USR1@900"]
    # Without overrides: the site's and the recipe's values.
    lines = sbatch_lines(render(jobgen, "llama2-7b", "--nodes", "4", "--site", str(site),
                                "--set", "job.time_limit=2-00:00:00"))
    assert {"--account=ml-team", "--qos=normal", "--time=2-00:00:00"} <= set(lines)


def test_show_lists_the_slurm_request(jobgen: Callable) -> None:
    import json
    out = jobgen("show", "llama2-7b", "--nodes", "2", "--site", "trn1-pcluster", "--qos", "high",
                 "--time", "60", "--json").stdout
    assert json.loads(out)["slurm"] == {"partition": "compute1", "qos": "high", "time_limit": "60"}


@pytest.mark.parametrize(("args", "message"), [
    (("--partition", "a b"), "--partition: 'a b' is not a name matching"),
    (("--account", "$(id)"), "--account: '$(id)' is not a name matching"),
    (("--time", "tomorrow"), "--time: 'tomorrow' is not a Slurm time limit"),
    (("--exclude", "n1;reboot"), "--exclude: 'n1;reboot' is not a Slurm host list"),
    (("--nodelist", "n[1-"), "--nodelist: 'n[1-' is not a Slurm host list"),
    (("--nodelist", "n[1-3],n7"), "--nodelist: n[1-3],n7 names 4 nodes, more than the job's 2"),
    (("--qos", ""), "'--qos': must not be empty"),
])
def test_bad_overrides_are_refused(jobgen: Callable, args: tuple[str, ...],
                                   message: str) -> None:
    result = jobgen("render", "llama2-7b", "--nodes", "2", *args)
    assert result.exit_code == 2 and result.stdout == "" and result.exception is not None
    assert message in result.stderr


def test_slurm_overrides_are_refused_where_no_slurm_runs(jobgen: Callable) -> None:
    result = jobgen("render", "bert1.5b", "--backend", "batch", "--site", "local", "--qos", "x")
    assert result.exit_code == 2 and "--qos: a Slurm setting" in result.stderr
    result = jobgen("run", "llama2-7b", "--smoke", "--time", "5")
    assert result.exit_code == 2 and "--time is a Slurm setting" in result.stderr


@pytest.mark.parametrize("recipe", NEURON_RECIPES)
def test_sbatch_lines_come_before_the_first_command(jobgen: Callable, recipe: str) -> None:
    """sbatch stops reading #SBATCH lines at the first command: all must come first."""
    lines = render(jobgen, recipe, "--nodes", "2").splitlines()
    assert lines[0] == "#!/bin/bash"
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(not line.startswith("#SBATCH") for line in lines[first_command:])
    assert len(sbatch_lines("\n".join(lines[:first_command]))) >= 7


# --- the generated values ----------------------------------------------------------------------

def test_generated_values_as_bash_sees_them(jobgen: Callable, tmp_path: Path) -> None:
    values = generated_values(
        render(jobgen, "neox20b", "--nodes", "4", "--site", "trn1-pcluster"), tmp_path)
    # The node contract (jobgen/payloads/node.py), exported for the flow and the nodes.
    assert values.env["JOBGEN_RUN_DIR"] == "/fsx/jobgen/runs/neox20b-4n"
    # The payload snapshot under the site's paths.payload_dir, named by the payload's digest.
    assert values.env["JOBGEN_PAYLOAD_DIR"] == \
        f"/fsx/jobgen/payload/{values.env['JOBGEN_PAYLOAD_DIGEST'][:16]}"
    assert values.env["JOBGEN_PAYLOAD_DIGEST"] == snapshot.digest()
    assert values.env["JOBGEN_LAUNCHER"] == "neuron_nemo/launch.sh"
    assert values.env["JOBGEN_ACTIVATE"] == "/home/ubuntu/aws_neuron_venv_pytorch/bin/activate"
    assert values.env["JOBGEN_MAX_RESTARTS"] == "10"
    assert values.env["JOBGEN_COMPILE_CACHE"] == "/fsx/neuron-compile-cache"
    assert values.env["JOBGEN_LOCAL_COMPILE_CACHE"] == "/local_storage/neuron-compile-cache"
    assert values.env["JOBGEN_MASTER_RESOLVER"] == "nslookup"
    assert values.env["JOBGEN_CACHE_VAR"] == "NEURON_COMPILE_CACHE_URL"
    assert values.env["JOBGEN_COMPILE_STEPS"] == "3"
    assert re.fullmatch(r"neox20b-4n-[0-9a-f]{16}", values.env["JOBGEN_COMPILE_KEY"])
    assert values.env["MASTER_PORT"] == "41000"
    assert values.env["JOBGEN_WORKERS_PER_NODE"] == "32"
    assert values.env["JOBGEN_WORKDIR"] == \
        "/home/ubuntu/neuronx-nemo-megatron/nemo/examples/nlp/language_modeling"
    assert values.env["JOBGEN_PROGRAM"] == "megatron_gpt_pretraining.py"


@pytest.mark.parametrize("recipe", NEURON_RECIPES)
def test_environment_block(jobgen: Callable, tmp_path: Path, recipe: str) -> None:
    env = generated_values(render(jobgen, recipe, "--nodes", "4"), tmp_path).env
    flags = env["NEURON_CC_FLAGS"]
    assert flags.startswith("--model-type transformer --distribution-strategy=llm-training")
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["FI_EFA_FORK_SAFE"] == "1"
    assert env["MALLOC_ARENA_MAX"] == ("64" if recipe == "llama2-7b" else "128")
    assert env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "1"   # every recipe trains bf16_sr
    assert env["XLA_USE_BF16"] == "1"
    assert env["NEURON_FUSE_SOFTMAX"] == "1"
    if recipe == "llama2-7b":
        assert "--enable-mixed-precision-accumulation" not in flags
        assert "HYDRA_FULL_ERROR" not in env
    else:
        assert flags.endswith(" --enable-mixed-precision-accumulation")
        assert env["HYDRA_FULL_ERROR"] == "1"


def test_environment_follows_precision(jobgen: Callable, tmp_path: Path) -> None:
    bf16 = generated_values(render(jobgen, "neox20b", "--set", "precision=bf16"), tmp_path).env
    assert bf16["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "0"
    assert bf16["XLA_USE_BF16"] == "1"
    assert bf16["NEURON_CC_FLAGS"] == \
        "--model-type transformer --distribution-strategy=llm-training"
    fp32 = generated_values(render(jobgen, "neox20b", "--set", "precision=fp32"), tmp_path).env
    # Unset, not "0": torch_xla and NxD treat any non-empty XLA_USE_BF16 as on.
    assert "XLA_USE_BF16" not in fp32 and "XLA_DOWNCAST_BF16" not in fp32
    assert fp32["NEURON_RT_STOCHASTIC_ROUNDING_EN"] == "0"
    nxd = generated_values(render(jobgen, "llama2-7b", "--nodes", "4", "--set", "precision=bf16"),
                           tmp_path).env
    assert nxd["XLA_DOWNCAST_BF16"] == "1" and "XLA_USE_BF16" not in nxd


def test_recipe_env_overrides_and_extends_defaults(jobgen: Callable, tmp_path: Path) -> None:
    script = render(jobgen, "neox20b", "--set", "env.MALLOC_ARENA_MAX=32",
                    "--set", "env.EXTRA_SETTING=a b 'c'")
    env = generated_values(script, tmp_path).env
    assert env["MALLOC_ARENA_MAX"] == "32"
    assert env["EXTRA_SETTING"] == "a b 'c'"
    assert "export MALLOC_ARENA_MAX=32\n" in script
    assert script.count("export MALLOC_ARENA_MAX=") == 1


# --- the two passes ----------------------------------------------------------------------------

NEMO_DIFFERENCES = {
    # steps
    "trainer.max_steps", "trainer.val_check_interval",
    # log dir
    "exp_manager.explicit_log_dir",
    # TensorBoard
    "exp_manager.create_tensorboard_logger",
    # checkpointing and resuming (payload/neuron_nemo/launch.sh)
    "exp_manager.create_checkpoint_callback", "+exp_manager.checkpoint_callback_params.dirpath",
    "exp_manager.resume_if_exists",
}


@pytest.mark.parametrize("recipe,nodes", [("neox20b", 4), ("pythia6.9b", 2)])
def test_nemo_passes_differ_only_where_documented(jobgen: Callable, tmp_path: Path,
                                                  recipe: str, nodes: int) -> None:
    values = generated_values(
        render(jobgen, recipe, "--nodes", str(nodes), "--site", "trn1-pcluster"), tmp_path)
    compile_pass = hydra_overrides(values.compile_args)
    train_pass = hydra_overrides(values.train_args)
    assert compile_pass.keys() == train_pass.keys()
    differing = {k for k in compile_pass if compile_pass[k] != train_pass[k]}
    assert differing == NEMO_DIFFERENCES
    run_dir = f"/fsx/jobgen/runs/{recipe}-{nodes}n"
    assert compile_pass["trainer.max_steps"] == compile_pass["trainer.val_check_interval"] == "3"
    assert train_pass["trainer.max_steps"] == "10000"
    assert compile_pass["exp_manager.explicit_log_dir"] == f"{run_dir}/compile"
    assert train_pass["exp_manager.explicit_log_dir"] == f"{run_dir}/nemo"
    key = "+exp_manager.checkpoint_callback_params.dirpath"
    assert (compile_pass[key], train_pass[key]) == (f"{run_dir}/compile/checkpoints",
                                                    f"{run_dir}/nemo/checkpoints")
    for key in NEMO_DIFFERENCES - {"trainer.max_steps", "trainer.val_check_interval",
                                   "exp_manager.explicit_log_dir",
                                   "+exp_manager.checkpoint_callback_params.dirpath"}:
        assert (compile_pass[key], train_pass[key]) == ("False", "True"), key
    assert train_pass["trainer.num_nodes"] == str(nodes)
    assert train_pass["trainer.devices"] == "32"
    assert train_pass["--config-name"] == "megatron_neox_config"


def test_nxd_passes_differ_only_where_documented(jobgen: Callable, tmp_path: Path) -> None:
    values = generated_values(
        render(jobgen, "llama2-7b", "--nodes", "128", "--site", "trn1-pcluster"), tmp_path)
    compile_pass, train_pass = nxd_flags(values.compile_args), nxd_flags(values.train_args)
    run_dir = "/fsx/jobgen/runs/llama2-7b-128n"
    checkpointing = {"--checkpoint-dir": f"{run_dir}/checkpoints", "--checkpoint-every": "1000",
                     "--keep-checkpoints": "5"}
    # The compile pass neither loads nor saves a checkpoint; the rest is the training pass's.
    assert {k: train_pass[k] for k in set(train_pass) - set(compile_pass)} == checkpointing
    assert set(compile_pass) <= set(train_pass)
    differing = {k for k in compile_pass if compile_pass[k] != train_pass[k]}
    assert differing == {"--phase", "--output-dir"}
    assert (compile_pass["--phase"], train_pass["--phase"]) == ("compile", "train")
    assert compile_pass["--compile-steps"] == "3"
    assert compile_pass["--output-dir"] == f"{run_dir}/compile"
    assert train_pass["--output-dir"] == f"{run_dir}/train"
    assert train_pass["--gradient-accumulation"] == "2"
    assert train_pass["--tensor-parallel-size"] == "8"
    assert train_pass["--precision"] == "bf16_sr"
    # The HLAT hyperparameters (REFERENCE.md A.3) reach the program.
    assert {k: train_pass[k] for k in ("--lr", "--min-lr", "--warmup-steps", "--decay-steps",
                                        "--max-steps", "--schedule", "--beta1", "--beta2",
                                        "--eps", "--weight-decay", "--grad-clip")} == {
        "--lr": "0.0003", "--min-lr": "3e-05", "--warmup-steps": "2000",
        "--decay-steps": "480000", "--max-steps": "500000", "--schedule": "cosine",
        "--beta1": "0.9", "--beta2": "0.95", "--eps": "1e-05", "--weight-decay": "0.1",
        "--grad-clip": "1.0"}
    assert {"--sequence-parallel", "--zero1", "--selective-checkpoint",
            "--scaled-init"} <= set(train_pass)
    # --no-decay with no fragments: weight decay on every parameter.
    assert train_pass["--no-decay"] is True


def test_compile_steps_come_from_the_recipe(jobgen: Callable, tmp_path: Path) -> None:
    values = generated_values(render(jobgen, "neox20b", "--set", "compile.steps=5"), tmp_path)
    assert hydra_overrides(values.compile_args)["trainer.max_steps"] == "5"
    assert hydra_overrides(values.train_args)["trainer.max_steps"] == "10000"


@pytest.mark.parametrize("recipe", NEURON_RECIPES)
def test_neuron_parallel_compile_wraps_only_the_compile_pass(jobgen: Callable, tmp_path: Path,
                                                             recipe: str) -> None:
    script = render(jobgen, recipe, "--nodes", "4")
    values = generated_values(script, tmp_path)
    assert values.env["JOBGEN_COMPILE_WRAPPER"] == "neuron_parallel_compile"
    assert "neuron_parallel_compile" not in values.compile_args + values.train_args
    # The flow hands the launcher the pass name; it applies the wrapper for `compile` only
    # (payload/common/node_launch.sh; executed in test_hostile.py). The script only passes
    # both argument lists to the flow, the compile pass's first, with their count.
    call = [line for line in script.splitlines() if line.startswith("flow_slurm_job ")]
    assert call == ['flow_slurm_job "${#COMPILE_ARGS[@]}" '
                    '${COMPILE_ARGS[@]+"${COMPILE_ARGS[@]}"} ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}']
    assert len(values.compile_args) > 0
    assert script.count("neuron_parallel_compile") == 1


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_compile_mode_reaches_the_script(jobgen: Callable, tmp_path: Path, mode: str) -> None:
    script = render(jobgen, "neox20b", "--compile", mode)
    assert generated_values(script, tmp_path).env["JOBGEN_COMPILE_MODE"] == mode
    default = render(jobgen, "neox20b")
    # Nothing else changes: the same graphs, so the same compile key.
    assert script.replace(f"JOBGEN_COMPILE_MODE={mode}\n", "JOBGEN_COMPILE_MODE=auto\n") \
        == default


def test_compile_key_identifies_the_graphs(jobgen: Callable, tmp_path: Path) -> None:
    def key(*args: str) -> str:
        return generated_values(render(jobgen, "neox20b", *args),
                                tmp_path).env["JOBGEN_COMPILE_KEY"]

    base = key("--nodes", "4")
    assert base == key("--nodes", "4", "--compile", "always")
    assert base == key("--nodes", "4", "--set", "schedule.max_steps=20000")
    assert base != key("--nodes", "8")
    assert base != key("--nodes", "4", "--set", "model.num_layers=40")
    assert base != key("--nodes", "4", "--set", "env.NEURON_RT_EXEC_TIMEOUT=20")
    spec = api.job_spec("neox20b", 4)
    assert base == payloads.compile_key(spec, payloads.for_spec(spec))


def test_llama_writes_its_model_config_before_training(jobgen: Callable,
                                                       tmp_path: Path) -> None:
    """The model's config travels as JOBGEN_FILES_JSON; the flow writes it once, before the
    passes (executed in test_hostile.py)."""
    env = generated_values(render(jobgen, "llama2-7b", "--nodes", "4"), tmp_path).env
    files = json.loads(env["JOBGEN_FILES_JSON"])
    assert list(files) == ["model/config.json"]
    assert json.loads(files["model/config.json"])["hidden_size"] == 4096


# --- a script cut short runs nothing ------------------------------------------------------------

@pytest.mark.parametrize("name", ["neox20b", "bert-large"])
def test_a_script_cut_short_runs_nothing(name: str, tmp_path: Path) -> None:
    """`jobgen render ... | sbatch` where the render died half-way would hand sbatch half a
    script. Everything after `set -uo pipefail` is one { ... } block, so bash refuses any prefix
    that ends inside it and runs none of its commands (here: no `say` line, no file made)."""
    import subprocess

    text = api.plan(api.job_spec(name, 2)).text
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line == "{\n") + 1
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1",
           "SLURM_SUBMIT_DIR": str(tmp_path), "HOME": str(tmp_path)}
    cuts = sorted({start, len(lines) - 1, *range(start, len(lines) - 1, 7)})
    for cut in cuts:
        # Cut at the line, and inside it (but the last line is the closing brace itself).
        fragment = lines[cut][:5] if cut < len(lines) - 1 else ""
        for partial in {"".join(lines[:cut]), "".join(lines[:cut]) + fragment}:
            script = tmp_path / "cut.sh"
            script.write_text(partial)
            proc = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                                  env=env, cwd=tmp_path, timeout=30, check=False)
            assert proc.returncode != 0, cut
            assert re.search(r"syntax error|unexpected EOF", proc.stderr), (cut, proc.stderr)
            assert "jobgen:" not in proc.stderr, cut
            assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.sh"], cut
    assert subprocess.run(["bash", "-n"], input=text, text=True, check=False).returncode == 0


@pytest.mark.parametrize("name,args", [
    # BERT on a Slurm cluster of Gaudi nodes (the local site with its payload where an image
    # would put it, so that no path of this machine is in the file).
    ("bert-large-2n.sbatch", ("bert-large", "--nodes", "2")),
    # The rehearsal: a job named apart, sharing its nodes, the tiny model's arguments.
    ("neox20b-2n-smoke.sbatch", ("neox20b", "--nodes", "2", "--smoke")),
], ids=["bert-large-2n", "neox20b-2n-smoke"])
def test_matches_golden_more(jobgen: Callable, golden: Callable, write_site: Callable,
                             name: str, args: tuple[str, ...]) -> None:
    site = write_site("local", {"paths.payload_dir": "/opt/jobgen/payload",
                                "paths.work_dir": "/shared/runs"})
    golden(Path("slurm") / name, render(jobgen, *args, "--site", str(site)))


def test_chain_dry_run_matches_golden(jobgen: Callable, golden: Callable) -> None:
    """--chain: the two sbatch commands with their scripts, the second after the first."""
    result = jobgen("submit", "pythia6.9b", "--nodes", "4", "--chain", "--dry-run",
                    "--site", "trn1-pcluster")
    assert result.exit_code == 0, result.stderr
    golden(Path("slurm") / "pythia6.9b-4n-chain.dry-run.sh", result.stdout)


def test_smoke_job_is_named_apart_and_shares_its_nodes(jobgen: Callable) -> None:
    real = render(jobgen, "neox20b", "--nodes", "2")
    smoke = render(jobgen, "neox20b", "--nodes", "2", "--smoke")
    assert "#SBATCH --job-name=neox20b\n" in real and "#SBATCH --exclusive\n" in real
    assert "#SBATCH --job-name=neox20b-smoke\n" in smoke
    assert "--exclusive" not in smoke
