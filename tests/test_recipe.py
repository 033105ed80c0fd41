"""Recipes: the built-in files load strictly into frozen records; `--set KEY=VALUE` overrides are
typed by the schema (a number is a number, a string stays verbatim) and checked like the file."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest

from jobgen.inputs import recipe as recipes
from jobgen.inputs.recipe import Recipe
from jobgen.plumbing.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def load(ref: str = "neox20b", *overrides: str) -> Recipe:
    rec, _ = recipes.load(ref, list(overrides))
    return rec


def load_error(ref: str = "neox20b", *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        recipes.load(ref, list(overrides))
    return str(info.value)


# --- the built-in recipes ------------------------------------------------------------------------

def test_recipe_names_are_the_files() -> None:
    names = recipes.recipe_names()
    assert names == sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert {"neox20b", "pythia6.9b", "llama2-7b"} <= set(names)


@pytest.mark.parametrize("name", recipes.recipe_names())
def test_every_builtin_recipe_loads_under_its_own_name(name: str) -> None:
    rec, shown = recipes.load(name)
    assert rec.name == name
    assert shown == f"recipes/{name}.yaml"
    assert rec.compile.steps == 3      # the compile pass is exactly 3 steps


@pytest.mark.parametrize("name", recipes.recipe_names())
def test_a_description_states_the_parallelism_as_the_file_does(name: str) -> None:
    """`jobgen list` (and the recipes page, its sample) shows the description: a TP, PP, global
    batch or samples per accelerator it names is the recipe's own."""
    rec, _ = recipes.load(name)
    par, said = rec.parallelism, rec.description
    checks = {r"\bTP (\d+)": par.tensor, r"\bPP (\d+)": par.pipeline,
              r"global batch (\d+)": par.global_batch_size,
              r"(\d+) samples/HPU/step": par.micro_batch_size * (par.gradient_accumulation or 0)}
    for pattern, value in checks.items():
        for number in re.findall(pattern, said):
            assert int(number) == value, f"{name}: description {said!r}"


def test_neox20b_values() -> None:
    rec = load("neox20b")
    assert (rec.payload, rec.platform, rec.nodes) == ("neuron_nemo", "trn1.32xlarge", 4)
    assert (rec.model.num_layers, rec.model.hidden_size, rec.model.num_attention_heads) == \
        (44, 6144, 64)
    assert (rec.parallelism.tensor, rec.parallelism.pipeline) == (8, 4)
    assert rec.parallelism.global_batch_size == 256
    assert rec.parallelism.gradient_accumulation is None
    assert rec.precision == "bf16_sr"
    assert rec.optim.betas == (0.9, 0.95)
    assert rec.optim.lr == 9.7e-5
    assert rec.data.splits == "980,10,10"
    assert rec.checkpoint.every_steps == 200 and rec.checkpoint.every_seconds is None
    assert rec.launch["config_name"] == "megatron_neox_config"
    assert rec.env["MALLOC_ARENA_MAX"] == "128"


def test_recipes_are_frozen() -> None:
    rec = load("llama2-7b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.nodes = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.parallelism.tensor = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        rec.env["MALLOC_ARENA_MAX"] = "1"  # type: ignore[index]


def test_defaults_apply_where_a_recipe_is_silent(write_recipe: Callable) -> None:
    path = write_recipe("neox20b", {"compile": None, "job": None, "env": None, "launch": None,
                                    "seed": None})
    text = path.read_text()
    for key in ("compile", "job", "env", "launch", "seed"):   # remove the keys entirely
        text = "\n".join(line for line in text.splitlines() if not line.startswith(f"{key}:"))
    path.write_text(text + "\n")
    rec = load(str(path))
    assert rec.compile.steps == 3
    assert rec.job.max_restarts == 10 and rec.job.time_limit is None
    assert rec.seed == 1234 and dict(rec.env) == {} and dict(rec.launch) == {}


# --- finding a recipe ----------------------------------------------------------------------------

def test_a_path_is_shown_as_given(write_recipe: Callable, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_recipe("pythia6.9b", filename="mine.yaml")
    rec, shown = recipes.load(str(path))
    assert rec.name == "pythia6.9b" and shown == str(path)
    monkeypatch.chdir(tmp_path)
    assert recipes.load("recipes/mine.yaml")[1] == "recipes/mine.yaml"


@pytest.mark.parametrize("ref,message", [
    ("nope", "unknown recipe 'nope' (built-in recipes: {names})"),
    ("$(touch x)", "unknown recipe '$(touch x)' (built-in recipes: {names})"),
    ("missing.yaml", "missing.yaml: no such recipe file"),
    ("../etc/passwd", "../etc/passwd: no such recipe file"),
])
def test_unknown_recipes(ref: str, message: str) -> None:
    names = ", ".join(sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml")))
    assert load_error(ref) == message.format(names=names)


# PyYAML words its problems differently with and without libyaml (CSafeLoader, used if present).
LIBYAML = False  # jobgen/inputs/yaml12.py: the pure-Python loader (YAML 1.2 resolvers, bounds)


@pytest.mark.parametrize("text,message", [
    ("name: [unclosed\n", "{f}: invalid YAML (line 2): " + (
        "did not find expected ',' or ']'" if LIBYAML
        else "expected ',' or ']', but got '<stream end>'")),
    ("a: b\n  c: d\n", "{f}: invalid YAML (line 2): " + (
        "mapping values are not allowed in this context" if LIBYAML
        else "mapping values are not allowed here")),
    ("- a\n- b\n", "{f}: expected a mapping at the top level"),
    ("just text\n", "{f}: expected a mapping at the top level"),
    ("", "{f}: expected a mapping at the top level"),
])
def test_unparsable_files(write_recipe: Callable, text: str, message: str) -> None:
    path = write_recipe(text=text)
    assert load_error(str(path)) == message.format(f=path)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    assert load_error(str(path)).startswith(f"{path}: cannot read: 'utf-8' codec can't decode")


@pytest.mark.parametrize("changes,message", [
    ({"name": "x; rm -rf ~"},
     "{f}: name: 'x; rm -rf ~' must match ^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$"),
    ({"name": "neox\n"}, "{f}: name: 'neox\\n' must match ^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$"),
    ({"env.BAD-NAME": "1"}, "{f}: env.BAD-NAME: not a valid variable name"),
    ({"env.X; id": "1"}, "{f}: env.X; id: not a valid variable name"),
    ({"launch.config name": "x"}, "{f}: launch.config name: not a valid variable name"),
])
def test_names_are_restricted(write_recipe: Callable, changes: dict[str, Any],
                              message: str) -> None:
    path = write_recipe("neox20b", changes)
    assert load_error(str(path)) == message.format(f=path)


@pytest.mark.parametrize("limit", ["30", "30:00", "12:00:00", "2-00", "2-12:30",
                                   "7-00:00:00", "UNLIMITED", "infinite"])
def test_slurm_time_limits(limit: str) -> None:
    assert load("neox20b", f"job.time_limit={limit}").job.time_limit == limit


@pytest.mark.parametrize("limit", ["", "1h", "1:2:3:4", "-1", "2-", "$(id)", "10\n"])
def test_bad_time_limits(limit: str) -> None:
    assert load_error("neox20b", f"job.time_limit={limit}") == (
        f"recipes/neox20b.yaml: job.time_limit: {limit!r} is not a Slurm time limit "
        "(MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)")


# --- --set ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("override,attribute,value", [
    ("optim.lr=1e-4", "optim.lr", 1e-4),            # YAML 1.1 would read a string
    ("optim.lr=3", "optim.lr", 3.0),
    ("optim.lr=.5", "optim.lr", 0.5),
    ("model.layernorm_epsilon=1E-6", "model.layernorm_epsilon", 1e-6),
    ("parallelism.tensor=4", "parallelism.tensor", 4),
    ("parallelism.sequence_parallel=false", "parallelism.sequence_parallel", False),
    ("optim.betas=[0.8, 0.99]", "optim.betas", (0.8, 0.99)),
    ("precision=fp32", "precision", "fp32"),
    # strings stay verbatim, whatever YAML would make of them
    ("description=1e-4", "description", "1e-4"),
    ("description=yes", "description", "yes"),
    ("description=  spaced  ", "description", "  spaced  "),
    ("description=", "description", ""),
    ("description=a=b", "description", "a=b"),
    ("data.splits=980,10,10", "data.splits", "980,10,10"),
    ("job.time_limit=1:00:00", "job.time_limit", "1:00:00"),   # YAML 1.1: 3600
    ("job.time_limit=60", "job.time_limit", "60"),
    ("model.transformer_block_type=null", "model.transformer_block_type", "null"),
    ("data.path=[a, b]", "data.path", "[a, b]"),
    ("env.NEW_VARIABLE=on", "env.NEW_VARIABLE", "on"),
    ("launch.config_name=megatron_gpt_config", "launch.config_name", "megatron_gpt_config"),
    ("optim.lr_scaling.base_nodes=2", "optim.lr_scaling.base_nodes", 2),
    ("parallelism.global_batch_size=null", "parallelism.global_batch_size", None),
])
def test_set_values_are_typed_by_the_schema(override: str, attribute: str, value: Any) -> None:
    node: Any = load("neox20b", override)
    for part in attribute.split("."):
        node = node[part] if isinstance(node, Mapping) else getattr(node, part)
    assert node == value
    assert type(node) is type(value)


def test_set_overrides_apply_in_order_and_leave_the_file_alone() -> None:
    rec = load("neox20b", "optim.lr=1e-4", "optim.lr=2e-4", "nodes=8")
    assert rec.optim.lr == 2e-4 and rec.nodes == 8
    assert load("neox20b").optim.lr == 9.7e-5
    data = {"optim": {"lr": 1.0}}
    assert recipes.apply_overrides(data, ["optim.lr=2"], "f") == {"optim": {"lr": 2.0}}
    assert data == {"optim": {"lr": 1.0}}


def test_set_creates_an_optional_section() -> None:
    rec = load("neox20b", "optim.lr_scaling.base_nodes=2", "optim.lr_scaling.rule=sqrt")
    assert rec.optim.lr_scaling is not None
    assert (rec.optim.lr_scaling.base_nodes, rec.optim.lr_scaling.rule) == (2, "sqrt")


KNOWN_TOP = ("name, description, payload, platform, nodes, model, parallelism, precision, optim, "
             "schedule, data, checkpoint, compile, job, eval, seed, env, launch")


@pytest.mark.parametrize("override,message", [
    ("nope=1", f"--set: nope: unknown key (known keys: {KNOWN_TOP})"),
    ("optim.nope=1", "--set: optim.nope: unknown key (known keys: name, lr, betas, eps, "
                     "weight_decay, grad_clip, lr_scaling, no_decay)"),
    ("optim.lr.x=1", "--set: optim.lr.x: optim.lr is not a mapping"),
    ("parallelism.tensor=eight", "--set: parallelism.tensor: expected an integer, got 'eight'"),
    ("parallelism.tensor=2.5", "--set: parallelism.tensor: expected an integer, got 2.5"),
    ("optim.lr=fast", "--set: optim.lr: expected a number, got 'fast'"),
    ("optim.betas=[1]", "--set: optim.betas: expected a list of 2 items, got [1]"),
    ("precision=fp16", "--set: precision: expected one of bf16_sr, bf16, fp32, got 'fp16'"),
    ("parallelism.sequence_parallel=maybe",
     "--set: parallelism.sequence_parallel: expected true or false, got 'maybe'"),
    ("nodes=", "--set: nodes: expected an integer, got None"),
    ("optim.lr", "--set: optim.lr: expected KEY=VALUE (for example optim.lr=1e-4)"),
    ("=1", "--set: =1: expected KEY=VALUE (for example optim.lr=1e-4)"),
])
def test_set_errors(override: str, message: str) -> None:
    assert load_error("neox20b", override) == message


def test_set_on_a_file_that_has_a_scalar_where_a_section_goes(write_recipe: Callable) -> None:
    path = write_recipe("neox20b", {"optim": "adamw"})
    assert load_error(str(path), "optim.lr=1") == \
        f"--set: optim.lr: optim is not a mapping in {path}"


# --- the YAML reader (jobgen/inputs/yaml12.py): YAML 1.2 numbers, duplicates, bounds --------------

def _bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,message", [
    ("name: x\nnodes: 4\nnodes: 64\n", "(line 3): nodes: duplicate key (first on line 2)"),
    ("optim:\n  lr: 1e-4\n  lr: 1e-2\n", "(line 3): lr: duplicate key (first on line 2)"),
    (_bomb(), "more than 64 aliases (*name)"),
    ("a: " + "[" * 5000 + "]" * 5000 + "\n", "(line 1): nested more than 32 levels deep"),
])
def test_yaml_input_that_must_be_refused(write_recipe: Callable, jobgen: Callable, text: str,
                                         message: str) -> None:
    path = write_recipe(None, text=text)
    result = jobgen("render", str(path))
    assert result.exit_code == 2 and result.exception is None or \
        isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(f"error: {path}")
    assert message in result.stderr and result.stderr.count("\n") == 1


def test_yaml_1_2_numbers_and_words() -> None:
    from jobgen.inputs.yaml12 import loads
    data = loads("port: 041000\nlr: 1e-4\nwd: 3.0E-2\nflag: yes\non: on\nt: true\nn: ~\n"
                 "hex: 0x10\nbig: 1_000\n")
    assert data == {"port": 41000, "lr": 1e-4, "wd": 0.03, "flag": "yes", "on": "on",
                    "t": True, "n": None, "hex": 16, "big": "1_000"}


def test_set_values_follow_yaml_1_2(jobgen: Callable) -> None:
    result = jobgen("show", "neox20b", "--set", "job.master_port=041000")
    assert result.exit_code == 0, result.stderr
    assert "master_port: 41000" in result.stdout
    deep = "[" * 100 + "]" * 100
    result = jobgen("render", "neox20b", "--set", f"optim.betas={deep}")
    assert result.exit_code == 2
    assert result.stderr == "error: --set: nested more than 32 levels deep\n"


@pytest.mark.parametrize("name,why", [
    ("BASH_ENV", "changes how the job's shell or loader behaves"),
    ("LD_PRELOAD", "changes how the job's shell or loader behaves"),
    ("IFS", "changes how the job's shell or loader behaves"),
    ("PATH", "changes how the job's shell or loader behaves"),
    ("PAYLOAD_DIR", "set by jobgen or the scheduler"),
    ("RUN_DIR", "set by jobgen or the scheduler"),
    ("MAX_RESTARTS", "set by jobgen or the scheduler"),
    ("MASTER_PORT", "set by jobgen or the scheduler"),
    ("SLURM_RESTART_COUNT", "set by jobgen or the scheduler"),
    ("AWS_BATCH_JOB_NODE_INDEX", "set by jobgen or the scheduler"),
    ("JOBGEN_RDZV_TIMEOUT", "set by jobgen or the scheduler"),
])
def test_env_names_a_recipe_may_not_set(jobgen: Callable, name: str, why: str) -> None:
    result = jobgen("render", "neox20b", "--set", f"env.{name}=x")
    assert result.exit_code == 2
    assert result.stderr == (f"error: recipes/neox20b.yaml: env.{name}: {why}; a recipe may "
                             "not set it\n")


ROOM = " (a job opens job.master_port + 1 for the Batch node watch)"


@pytest.mark.parametrize("override,message", [
    ("optim.lr_scaling.base_nodes=0", "optim.lr_scaling.base_nodes: must be positive, got 0"),
    ("optim.lr=.nan", "optim.lr: must be a finite number, got nan"),
    ("optim.lr=.inf", "optim.lr: must be a finite number, got inf"),
    ("job.master_port=80", f"job.master_port: 80 is not a port between 1024 and 65534{ROOM}"),
    ("job.master_port=70000", f"job.master_port: 70000 is not a port between 1024 and 65534{ROOM}"),
    # The node watch of a Batch job listens at job.master_port + 1: 65535 leaves it no port.
    ("job.master_port=65535", f"job.master_port: 65535 is not a port between 1024 and 65534{ROOM}"),
    ("schedule.min_lr=1", "schedule.min_lr: 1.0 must lie between 0 and optim.lr 9.7e-05"),
    ("schedule.warmup_steps=20000",
     "schedule: warmup 20000 + constant 0 steps do not fit in max_steps 10000"),
    ("job.max_restarts=99999999999", "job.max_restarts: 99999999999 is more than 1000"),
    ("model.hidden_dropout=1.5", "model.hidden_dropout: must lie in [0, 1), got 1.5"),
    ("checkpoint.keep=0", "checkpoint.keep: must be positive, got 0"),
])
def test_values_that_cannot_be_meant(jobgen: Callable, override: str, message: str) -> None:
    result = jobgen("render", "neox20b", "--set", override)
    assert result.exit_code == 2
    assert result.stderr == f"error: recipes/neox20b.yaml: {message}\n"
