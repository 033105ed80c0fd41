"""The job spec: derived numbers (world size, DP, gradient accumulation, tokens per step, learning
rate at this node count) and the rules checked before anything is rendered."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import pytest

from jobgen import api, payloads
from jobgen.inputs import recipe as recipes
from jobgen.inputs import site as sites
from jobgen.job.spec import JobSpec, resolve
from jobgen.plumbing.errors import ConfigError, RuleError


def spec(ref: str, nodes: Any = None, *overrides: str, **kw: Any) -> JobSpec:
    return api.job_spec(ref, nodes, overrides=overrides, **kw)


def spec_error(ref: str, nodes: Any = None, *overrides: str, **kw: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        spec(ref, nodes, *overrides, **kw)
    return info.value


@pytest.mark.parametrize("recipe,nodes,world,model_parallel,dp,ga,gbs,tokens", [
    ("neox20b", 4, 128, 32, 4, 64, 256, 524288),
    ("neox20b", 16, 512, 32, 16, 16, 256, 524288),
    ("pythia6.9b", 1, 32, 8, 4, 32, 256, 524288),
    ("pythia6.9b", 2, 64, 8, 8, 16, 256, 524288),
    ("pythia6.9b", 32, 1024, 8, 128, 1, 256, 524288),
    ("llama2-7b", 4, 128, 8, 16, 64, 1024, 4194304),
    ("llama2-7b", 128, 4096, 8, 512, 2, 1024, 4194304),
])
def test_derived_numbers(recipe: str, nodes: int, world: int, model_parallel: int, dp: int,
                         ga: int, gbs: int, tokens: int) -> None:
    s = spec(recipe, nodes)
    assert s.workers_per_node == 32
    assert (s.world_size, s.model_parallel, s.data_parallel) == (world, model_parallel, dp)
    assert (s.gradient_accumulation, s.global_batch_size, s.tokens_per_step) == (ga, gbs, tokens)


def test_gradient_accumulation_style_grows_the_batch_with_nodes() -> None:
    """DeepSpeed style (BERT 1.5B): the accumulation is fixed, the global batch follows DP."""
    at8, at16 = spec("bert1.5b", 8), spec("bert1.5b", 16)
    assert (at8.workers_per_node, at8.data_parallel, at8.gradient_accumulation) == (8, 64, 24)
    assert at8.global_batch_size == 16 * 24 * 64
    assert at16.global_batch_size == 2 * at8.global_batch_size
    assert at16.tokens_per_step == at16.global_batch_size * 128


def test_learning_rate_scales_as_the_recipe_says() -> None:
    assert spec("bert1.5b", 8).lr == 0.0015      # base_nodes 8, rule linear
    assert spec("bert1.5b", 16).lr == 0.003      # exactly, not 0.0030000000000000001
    assert spec("neox20b", 16).lr == 9.7e-5      # no scaling stated
    sqrt = spec("neox20b", 8, "optim.lr_scaling.base_nodes=2", "optim.lr_scaling.rule=sqrt")
    assert sqrt.lr == pytest.approx(2 * 9.7e-5)
    off = spec("neox20b", 8, "optim.lr_scaling.base_nodes=2", "optim.lr_scaling.rule=none")
    assert off.lr == 9.7e-5


def test_warmup_and_constant_steps() -> None:
    assert (spec("neox20b").warmup_steps, spec("neox20b").constant_steps) == (100, 0)
    bert = spec("bert1.5b", 16)
    assert (bert.warmup_steps, bert.constant_steps) == (1938, 9688)    # 5 % and 25 % of 38750


def test_defaults_and_names() -> None:
    s = spec("neox20b")
    assert s.nodes == 4                         # the recipe's default node count
    assert (s.run_name, s.run_dir) == ("neox20b-4n", "jobgen-runs/neox20b-4n")
    assert s.site.name == "local" and s.backend == "slurm" and s.compile_mode == "auto"
    assert spec("neox20b", 2, run_name="mine").run_dir == "jobgen-runs/mine"
    assert spec("neox20b", 2, site="trn1-pcluster").run_dir == "/fsx/jobgen/runs/neox20b-2n"
    assert s.data_path("gpt2/x") == "jobgen-data/gpt2/x"
    assert spec("neox20b", 2, smoke=True).run_name == "neox20b-2n-smoke"


def test_smoke_runs_one_worker_per_node_but_is_refused_where_the_real_job_is() -> None:
    smoke = spec("llama2-7b", 2, smoke=True)
    assert smoke.workers_per_node == 1
    error = spec_error("pythia6.9b", 64, smoke=True)
    assert isinstance(error, RuleError)
    assert str(error) == spec_error("pythia6.9b", 64).args[0]


def test_the_rehearsal_saves_every_4_steps_or_as_often_as_the_recipe_asks() -> None:
    assert spec("pythia6.9b", 2, smoke=True).rehearsal.checkpoint_every == 4   # recipe: 500
    often = spec("pythia6.9b", 2, "checkpoint.every_steps=1", smoke=True)
    assert often.rehearsal.checkpoint_every == 1
    args = list(payloads.for_spec(often).train_args)
    assert args[args.index("--checkpoint-every") + 1] == "1"


def test_spec_is_frozen_and_compares_by_content() -> None:
    s = spec("neox20b", 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.nodes = 8  # type: ignore[misc]
    assert s == spec("neox20b", 4)
    assert s != spec("neox20b", 8)
    assert s.recipe != spec("neox20b", 4, "optim.lr=1e-4").recipe


def test_as_dict_shows_every_derived_number() -> None:
    d = spec("llama2-7b", 128).as_dict()
    assert d["derived"] == {
        "workers_per_node": 32, "world_size": 4096, "model_parallel": 8, "data_parallel": 512,
        "gradient_accumulation": 2, "global_batch_size": 1024, "tokens_per_step": 4194304,
        "lr": 3e-4, "warmup_steps": 2000, "constant_steps": 0}
    assert (d["recipe"], d["site"], d["nodes"], d["run_name"]) == \
        ("recipes/llama2-7b.yaml", "local", 128, "llama2-7b-128n")
    assert d["spec"]["parallelism"]["tensor"] == 8
    assert d["spec"]["optim"]["betas"] == [0.9, 0.95]


# --- rules ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,nodes,overrides,message", [
    ("neox20b", 4, ["parallelism.tensor=3"],
     "recipes/neox20b.yaml: parallelism: tensor 3 x pipeline 4 = 12 does not divide the "
     "128 workers at 4 nodes"),
    ("neox20b", 1, ["parallelism.tensor=64", "parallelism.pipeline=1"],
     "recipes/neox20b.yaml: parallelism: tensor 64 x pipeline 1 = 64 does not divide the "
     "32 workers at 1 node"),
    ("neox20b", 4, ["model.num_attention_heads=12"],
     "recipes/neox20b.yaml: model.num_attention_heads: 12 is not divisible by "
     "parallelism.tensor 8"),
    ("llama2-7b", 4, ["model.num_kv_heads=4"],
     "recipes/llama2-7b.yaml: model.num_kv_heads: 4 is not divisible by parallelism.tensor 8"),
    ("neox20b", 4, ["model.num_layers=42"],
     "recipes/neox20b.yaml: model.num_layers: 42 is not divisible by parallelism.pipeline 4"),
    ("neox20b", 3, [],
     "recipes/neox20b.yaml: parallelism.global_batch_size: 256 is not divisible by "
     "micro_batch_size 1 x data-parallel 3 = 3 at 3 nodes"),
    ("pythia6.9b", 64, [],
     "recipes/pythia6.9b.yaml: parallelism.global_batch_size: 256 is not divisible by "
     "micro_batch_size 2 x data-parallel 256 = 512 at 64 nodes"),
    ("neox20b", 137, [], "--nodes 137: site local allows at most 136 nodes (slurm.max_nodes)"),
])
def test_rules_are_rule_errors(recipe: str, nodes: int, overrides: list[str],
                               message: str) -> None:
    error = spec_error(recipe, nodes, *overrides)
    assert isinstance(error, RuleError)          # `jobgen check` lists these as skipped
    assert str(error) == message


def test_platform_limit(write_site: Callable) -> None:
    site = write_site("local", {"slurm.max_nodes": 5000})
    error = spec_error("neox20b", 1001, site=str(site))
    assert isinstance(error, RuleError)
    assert str(error) == "--nodes 1001: trn1.32xlarge jobs are limited to 1000 nodes"
    assert spec("neox20b", 1000, "parallelism.global_batch_size=8000",
                site=str(site)).data_parallel == 1000


@pytest.mark.parametrize("overrides,message", [
    (["model.num_layers=0"], "recipes/neox20b.yaml: model.num_layers: must be positive, got 0"),
    (["optim.lr=-1e-4"], "recipes/neox20b.yaml: optim.lr: must be positive, got -0.0001"),
    (["parallelism.micro_batch_size=0"],
     "recipes/neox20b.yaml: parallelism.micro_batch_size: must be positive, got 0"),
    (["compile.steps=0"], "recipes/neox20b.yaml: compile.steps: must be positive, got 0"),
    (["parallelism.gradient_accumulation=4"],
     "recipes/neox20b.yaml: parallelism: set exactly one of global_batch_size and "
     "gradient_accumulation"),
    (["parallelism.global_batch_size=null"],
     "recipes/neox20b.yaml: parallelism: set exactly one of global_batch_size and "
     "gradient_accumulation"),
    (["checkpoint.every_seconds=3600"],
     "recipes/neox20b.yaml: checkpoint: set exactly one of every_steps and every_seconds"),
    (["schedule.warmup_fraction=0.1"],
     "recipes/neox20b.yaml: schedule: set at most one of warmup_steps and warmup_fraction"),
    (["schedule.warmup_steps=null", "schedule.warmup_fraction=1.5"],
     "recipes/neox20b.yaml: schedule.warmup_fraction: must be between 0 and 1, got 1.5"),
    (["job.max_restarts=-1"], "recipes/neox20b.yaml: job.max_restarts: must be 0 or more"),
    (["model.seq_length=4096"],
     "recipes/neox20b.yaml: model.max_position_embeddings: 2048 is shorter than "
     "model.seq_length 4096"),
])
def test_value_errors(overrides: list[str], message: str) -> None:
    error = spec_error("neox20b", 4, *overrides)
    assert not isinstance(error, RuleError)
    assert str(error) == message


@pytest.mark.parametrize("nodes,message", [
    (0, "--nodes 0: must be at least 1"),
    (-2, "--nodes -2: must be at least 1"),
])
def test_node_count_must_be_positive(nodes: int, message: str) -> None:
    assert str(spec_error("neox20b", nodes)) == message


def test_run_name_is_restricted() -> None:
    assert str(spec_error("neox20b", 4, run_name="../x")) == \
        "--run-name: '../x' must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def test_resolve_is_the_same_as_the_api() -> None:
    rec, source = recipes.load("pythia6.9b")
    direct = resolve(rec, source, sites.load("trn1-pcluster"), 2)
    assert direct == spec("pythia6.9b", 2, site="trn1-pcluster")
