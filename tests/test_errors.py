"""Bad input through the real command line: one line `error: ...` on stderr naming the file and
the key path, exit status 2, no traceback, nothing on stdout and nothing written.

Every case runs twice: in process (CliRunner) and as the installed `jobgen` console script."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from jobgen.inputs.recipe import Model
from jobgen.plumbing import errors

ROOT = Path(__file__).resolve().parent.parent
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
LIBYAML = False  # jobgen/inputs/yaml12.py: the pure-Python loader


def names(folder: str) -> str:
    return ", ".join(sorted(p.stem for p in (ROOT / folder).glob("*.yaml")))


class Case(NamedTuple):
    args: list[str]
    message: str


# Each builder gets (write_recipe, write_site) and returns the arguments and the exact message;
# "{recipe}" / "{site}" in a message stand for the file written for that case.
CASES: dict[str, Callable[[Callable, Callable], Case]] = {
    "unknown recipe": lambda r, s: Case(
        ["render", "nope"], f"unknown recipe 'nope' (built-in recipes: {names('recipes')})"),
    "hostile recipe reference": lambda r, s: Case(
        ["render", "$(touch x)"],
        f"unknown recipe '$(touch x)' (built-in recipes: {names('recipes')})"),
    "missing recipe file": lambda r, s: Case(
        ["render", "no/such.yaml"], "no/such.yaml: no such recipe file"),
    "unknown key, nested": lambda r, s: Case(
        ["render", str(r("neox20b", {"model.hidden_sizes": 6144}))],
        "{recipe}: model.hidden_sizes: unknown key (known keys: "
        + ", ".join(f.name for f in dataclasses.fields(Model)) + ")"),
    "unknown key, top level": lambda r, s: Case(
        ["show", str(r("neox20b", {"optimizer": {"lr": 1}}))],
        "{recipe}: optimizer: unknown key (known keys: name, description, payload, platform, "
        "nodes, model, parallelism, precision, optim, schedule, data, checkpoint, compile, job, "
        "eval, seed, env, launch)"),
    "wrong type, nested": lambda r, s: Case(
        ["render", str(r("neox20b", {"parallelism.tensor": "eight"}))],
        "{recipe}: parallelism.tensor: expected an integer, got 'eight'"),
    "wrong type, list item": lambda r, s: Case(
        ["render", str(r("neox20b", {"optim.betas": [0.9, "x"]}))],
        "{recipe}: optim.betas[1]: expected a number, got 'x'"),
    "missing required key": lambda r, s: Case(
        ["render", str(r("neox20b", delete=["model.num_layers"]))],
        "{recipe}: model.num_layers: required key is missing"),
    "top level not a mapping": lambda r, s: Case(
        ["render", str(r(text="- neox20b\n- pythia6.9b\n"))],
        "{recipe}: expected a mapping at the top level"),
    "invalid YAML": lambda r, s: Case(
        ["render", str(r(text="name: neox20b\nnodes: [4\n"))],
        "{recipe}: invalid YAML (line 3): " + (
            "did not find expected ',' or ']'" if LIBYAML
            else "expected ',' or ']', but got '<stream end>'")),
    "hostile recipe name": lambda r, s: Case(
        ["render", str(r("neox20b", {"name": "x\n#SBATCH --wrap=id"}))],
        "{recipe}: name: 'x\\n#SBATCH --wrap=id' must match " + NAME_PATTERN),
    "TP x PP does not divide the workers": lambda r, s: Case(
        ["render", "neox20b", "--nodes", "1", "--set", "parallelism.pipeline=3"],
        "recipes/neox20b.yaml: parallelism: tensor 8 x pipeline 3 = 24 does not divide the "
        "32 workers at 1 node"),
    "heads not divisible by TP": lambda r, s: Case(
        ["render", str(r("pythia6.9b", {"model.num_attention_heads": 4}))],
        "{recipe}: model.num_attention_heads: 4 is not divisible by parallelism.tensor 8"),
    "layers not divisible by PP": lambda r, s: Case(
        ["render", "neox20b", "--set", "model.num_layers=45"],
        "recipes/neox20b.yaml: model.num_layers: 45 is not divisible by parallelism.pipeline 4"),
    "GBS not divisible by micro x DP": lambda r, s: Case(
        ["render", "pythia6.9b", "--nodes", "64"],
        "recipes/pythia6.9b.yaml: parallelism.global_batch_size: 256 is not divisible by "
        "micro_batch_size 2 x data-parallel 256 = 512 at 64 nodes"),
    "--nodes 0": lambda r, s: Case(["render", "neox20b", "--nodes", "0"],
                                   "--nodes 0: must be at least 1"),
    "--nodes over the site's limit": lambda r, s: Case(
        ["render", "neox20b", "--nodes", "256", "--site", "trn1-pcluster"],
        "--nodes 256: site trn1-pcluster allows at most 128 nodes (slurm.max_nodes)"),
    "--set unknown key": lambda r, s: Case(
        ["render", "neox20b", "--set", "optim.learning_rate=1e-4"],
        "--set: optim.learning_rate: unknown key (known keys: name, lr, betas, eps, "
        "weight_decay, grad_clip, lr_scaling, no_decay)"),
    "--set bad type": lambda r, s: Case(
        ["show", "neox20b", "--set", "parallelism.tensor=eight"],
        "--set: parallelism.tensor: expected an integer, got 'eight'"),
    "--set bad choice": lambda r, s: Case(
        ["render", "neox20b", "--set", "precision=fp16"],
        "--set: precision: expected one of bf16_sr, bf16, fp32, got 'fp16'"),
    "--set malformed": lambda r, s: Case(
        ["render", "neox20b", "--set", "optim.lr"],
        "--set: optim.lr: expected KEY=VALUE (for example optim.lr=1e-4)"),
    "unknown site": lambda r, s: Case(
        ["render", "neox20b", "--site", "nope"],
        f"unknown site 'nope' (sites: {names('env/sites')})"),
    "hostile partition in a site": lambda r, s: Case(
        ["render", "neox20b", "--site", str(s("trn1-pcluster",
                                              {"slurm.partition": "x --wrap 'id'"}))],
        "{site}: slurm.partition: \"x --wrap 'id'\" is not a name matching " + NAME_PATTERN),
    "unknown key in a site": lambda r, s: Case(
        ["render", "neox20b", "--site", str(s("local", {"paths.workdir": "x"}))],
        "{site}: paths.workdir: unknown key (known keys: work_dir, data_dir, compile_cache, "
        "local_compile_cache, payload_dir, nemo_dir, nxd_llama_dir, data_read_only, hf_home, "
        "eval_tasks_dir, hub_access)"),
    "site without the trainer checkout": lambda r, s: Case(
        ["render", "neox20b", "--site", str(s("local", {"name": "bare"},
                                              delete=["paths.nemo_dir"]))],
        "site bare: paths.nemo_dir is required by payload neuron_nemo (the neuronx-nemo-megatron "
        "language_modeling directory)"),
    "both every_steps and every_seconds": lambda r, s: Case(
        ["render", str(r("neox20b", {"checkpoint.every_seconds": 48000}))],
        "{recipe}: checkpoint: set exactly one of every_steps and every_seconds"),
    "both global_batch_size and gradient_accumulation": lambda r, s: Case(
        ["render", "llama2-7b", "--set", "parallelism.gradient_accumulation=2"],
        "recipes/llama2-7b.yaml: parallelism: set exactly one of global_batch_size and "
        "gradient_accumulation"),
    "hostile run name": lambda r, s: Case(
        ["render", "neox20b", "--run-name", "../../etc"],
        "--run-name: '../../etc' must match " + NAME_PATTERN),
    "NxD recipe with a time-based checkpoint": lambda r, s: Case(
        ["render", "llama2-7b", "--set", "checkpoint.every_steps=null",
         "--set", "checkpoint.every_seconds=3600"],
        "recipes/llama2-7b.yaml: checkpoint.every_seconds: the NxD trainer checkpoints by step "
        "only; set checkpoint.every_steps"),
    "hostile time limit": lambda r, s: Case(
        ["render", "neox20b", "--set", "job.time_limit=1:00\n#SBATCH --wrap=id"],
        "recipes/neox20b.yaml: job.time_limit: '1:00\\n#SBATCH --wrap=id' is not a Slurm time "
        "limit (MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)"),
}



@pytest.fixture(params=sorted(CASES), ids=sorted(CASES))
def case(request: pytest.FixtureRequest, write_recipe: Callable, write_site: Callable,
         tmp_path: Path) -> Case:
    built = CASES[request.param](write_recipe, write_site)
    message = built.message.replace("{recipe}", str(tmp_path / "recipes" / "recipe.yaml"))
    message = message.replace("{site}", str(tmp_path / "sites" / "site.yaml"))
    return Case(built.args, message)


def test_error_in_process(case: Case, jobgen: Callable) -> None:
    result = jobgen(*case.args)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2
    assert result.stderr == f"error: {case.message}\n"
    assert result.stdout == ""


def test_error_from_the_console_script(case: Case, jobgen_proc: Callable,
                                       tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = case.args + (["-o", str(out)] if case.args[0] == "render" else [])
    proc = jobgen_proc(*args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {case.message}\n"      # one line: no traceback, no usage
    assert proc.stdout == ""
    assert not out.exists()                                # nothing written


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 15


def test_exit_codes_of_the_error_family() -> None:
    assert errors.ConfigError("x").exit_code == 2
    assert errors.RuleError("x").exit_code == 2
    assert errors.RenderError("x").exit_code == 2
    assert errors.RemoteError("x").exit_code == 1
    assert issubclass(errors.RuleError, errors.ConfigError)
    assert all(issubclass(e, errors.JobgenError) for e in (
        errors.ConfigError, errors.RenderError, errors.RemoteError))


def test_usage_errors_are_clicks(jobgen_proc: Callable) -> None:
    """Malformed options: exit 2 with click's message as one `error:` line, no traceback."""
    proc = jobgen_proc("render", "neox20b", "--nodes", "four")
    assert proc.returncode == 2
    assert proc.stderr == ("error: jobgen render: Invalid value for '--nodes' / '-n': 'four' is "
                           "not a valid integer (see 'jobgen render --help')\n")
    assert "Traceback" not in proc.stderr
    proc = jobgen_proc("render", "neox20b", "--compile", "sometimes")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
