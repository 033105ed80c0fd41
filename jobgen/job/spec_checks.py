"""The checks of a job spec (jobgen/job/spec.py's resolve): a recipe's values that do not depend on
the node count (ConfigError), then the parallelism arithmetic at one node count (RuleError:
`jobgen check` lists such combinations as skipped)."""
from __future__ import annotations

import math
import re
from typing import Optional, Protocol

from ..inputs import schema
from ..inputs.limits import MASTER_PORT_MAX, PORT_MIN, PORT_ROOM
from ..inputs.recipe import Recipe
from ..inputs.rules import (
    BLOCK_TYPES,
    ENV_MAX,
    SEED_MAX,
    SPLIT_NUMBER,
    check_limits,
    path_problem,
)
from ..plumbing.errors import ConfigError, RuleError


class Sized(Protocol):
    """What the arithmetic reads of a job spec (jobgen/job/spec.py's JobSpec, which imports this
    module: named by its shape, so that no import circle runs through the type)."""
    @property
    def recipe(self) -> Recipe: ...

    @property
    def source(self) -> str: ...

    @property
    def nodes(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def model_parallel(self) -> int: ...

    @property
    def workers_per_node(self) -> int: ...

    @property
    def data_parallel(self) -> int: ...


def _positive(where: str, key: str, value: Optional[float]) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{where}: {key}: must be positive, got {schema.describe(value)}")


def check_values(recipe: Recipe, where: str) -> None:
    """Per-field rules that do not depend on the node count."""
    m, p, s = recipe.model, recipe.parallelism, recipe.schedule
    for key, value in (("nodes", recipe.nodes), ("model.num_layers", m.num_layers),
                       ("model.hidden_size", m.hidden_size),
                       ("model.num_attention_heads", m.num_attention_heads),
                       ("model.seq_length", m.seq_length), ("model.vocab_size", m.vocab_size),
                       ("parallelism.tensor", p.tensor), ("parallelism.pipeline", p.pipeline),
                       ("parallelism.micro_batch_size", p.micro_batch_size),
                       ("parallelism.global_batch_size", p.global_batch_size),
                       ("parallelism.gradient_accumulation", p.gradient_accumulation),
                       ("optim.lr", recipe.optim.lr), ("schedule.max_steps", s.max_steps),
                       ("checkpoint.every_steps", recipe.checkpoint.every_steps),
                       ("checkpoint.every_seconds", recipe.checkpoint.every_seconds),
                       ("checkpoint.keep", recipe.checkpoint.keep),
                       ("compile.steps", recipe.compile.steps),
                       ("job.master_port", recipe.job.master_port)):
        _positive(where, key, value)
    if recipe.optim.lr_scaling is not None:
        _positive(where, "optim.lr_scaling.base_nodes", recipe.optim.lr_scaling.base_nodes)
    if (p.global_batch_size is None) == (p.gradient_accumulation is None):
        raise ConfigError(f"{where}: parallelism: set exactly one of global_batch_size and "
                          "gradient_accumulation")
    ckpt = recipe.checkpoint
    if (ckpt.every_steps is None) == (ckpt.every_seconds is None):
        raise ConfigError(f"{where}: checkpoint: set exactly one of every_steps and every_seconds")
    for a, b in (("warmup_steps", "warmup_fraction"), ("constant_steps", "constant_fraction")):
        if getattr(s, a) is not None and getattr(s, b) is not None:
            raise ConfigError(f"{where}: schedule: set at most one of {a} and {b}")
    for key in ("warmup_fraction", "constant_fraction"):
        value = getattr(s, key)
        if value is not None and not 0 <= value <= 1:
            raise ConfigError(f"{where}: schedule.{key}: must be between 0 and 1, got {value}")
    if recipe.job.max_restarts < 0:
        raise ConfigError(f"{where}: job.max_restarts: must be 0 or more")
    if m.num_kv_heads is not None and not (
            0 < m.num_kv_heads <= m.num_attention_heads
            and m.num_attention_heads % m.num_kv_heads == 0):
        raise ConfigError(f"{where}: model.num_kv_heads: {m.num_kv_heads} must divide "
                          f"model.num_attention_heads {m.num_attention_heads} (each key/value "
                          "head serves a whole group of query heads)")
    if m.ffn_hidden_size <= 0 or m.max_position_embeddings < m.seq_length:
        raise ConfigError(f"{where}: model.max_position_embeddings: {m.max_position_embeddings} "
                          f"is shorter than model.seq_length {m.seq_length}")
    _check_ranges(recipe, where)
    check_trainer_rules(recipe, where)


MAX_RESTARTS = 1000  # far beyond any useful retry count; keeps bash arithmetic trivially safe


def _check_ranges(recipe: Recipe, where: str) -> None:
    """Numbers that parse but cannot be meant: NaN/infinity, probabilities outside [0, 1),
    ports outside the unprivileged range, a schedule longer than its run."""
    o, s, m, j = recipe.optim, recipe.schedule, recipe.model, recipe.job
    floats = {"optim.lr": o.lr, "optim.eps": o.eps, "optim.weight_decay": o.weight_decay,
              "optim.grad_clip": o.grad_clip, "optim.betas[0]": o.betas[0],
              "optim.betas[1]": o.betas[1], "schedule.min_lr": s.min_lr,
              "model.hidden_dropout": m.hidden_dropout,
              "model.attention_dropout": m.attention_dropout,
              "model.layernorm_epsilon": m.layernorm_epsilon,
              "model.rotary_percentage": m.rotary_percentage,
              "model.init_method_std": m.init_method_std, "model.rope_theta": m.rope_theta}
    for key, value in floats.items():
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{where}: {key}: must be a finite number, got {value}")
    for key in ("optim.betas[0]", "optim.betas[1]", "model.hidden_dropout",
                "model.attention_dropout"):
        if not 0.0 <= floats[key] < 1.0:  # type: ignore[operator]
            raise ConfigError(f"{where}: {key}: must lie in [0, 1), got {floats[key]}")
    for key in ("optim.eps", "model.layernorm_epsilon"):
        if not floats[key] > 0:  # type: ignore[operator]
            raise ConfigError(f"{where}: {key}: must be positive, got {floats[key]}")
    if o.weight_decay < 0 or o.grad_clip <= 0:
        raise ConfigError(f"{where}: optim: weight_decay must be >= 0 and grad_clip positive")
    if not 0.0 <= s.min_lr <= o.lr:
        raise ConfigError(f"{where}: schedule.min_lr: {s.min_lr} must lie between 0 and "
                          f"optim.lr {o.lr}")
    if not PORT_MIN <= j.master_port <= MASTER_PORT_MAX:
        raise ConfigError(f"{where}: job.master_port: {j.master_port} is not a port between "
                          f"{PORT_MIN} and {MASTER_PORT_MAX} (a job opens {PORT_ROOM})")
    if j.max_restarts > MAX_RESTARTS:
        raise ConfigError(f"{where}: job.max_restarts: {j.max_restarts} is more than "
                          f"{MAX_RESTARTS}")
    warmup = (round(s.warmup_fraction * s.max_steps) if s.warmup_fraction is not None
              else s.warmup_steps or 0)
    hold = (round(s.constant_fraction * s.max_steps) if s.constant_fraction is not None
            else s.constant_steps or 0)
    if warmup < 0 or hold < 0 or warmup + hold > s.max_steps:
        raise ConfigError(f"{where}: schedule: warmup {warmup} + constant {hold} steps do not "
                          f"fit in max_steps {s.max_steps}")
    if s.decay_steps is not None and not warmup + hold <= s.decay_steps <= s.max_steps:
        raise ConfigError(f"{where}: schedule.decay_steps: {s.decay_steps} must lie between "
                          f"the end of warmup and hold ({warmup + hold}) and max_steps "
                          f"{s.max_steps}")


def check_arithmetic(spec: Sized) -> None:
    """The parallelism rules (RuleError: `jobgen check` lists these combinations as skipped)."""
    r, where, n = spec.recipe, spec.source, spec.nodes
    p, m = r.parallelism, r.model
    at = f"at {n} node{'s' if n != 1 else ''}"
    if spec.world_size % spec.model_parallel:
        raise RuleError(f"{where}: parallelism: tensor {p.tensor} x pipeline {p.pipeline} = "
                        f"{spec.model_parallel} does not divide the {spec.world_size} workers {at}")
    if p.tensor > spec.workers_per_node:
        # Tensor-parallel ranks exchange activations every layer: NeMo, NxD and DeepSpeed all
        # keep a tensor-parallel group inside one node's interconnect.
        raise RuleError(f"{where}: parallelism.tensor: {p.tensor} is wider than a node "
                        f"({spec.workers_per_node} workers per {r.platform} node)")
    if m.num_attention_heads % p.tensor:
        raise RuleError(f"{where}: model.num_attention_heads: {m.num_attention_heads} is not "
                        f"divisible by parallelism.tensor {p.tensor}")
    if m.num_kv_heads is not None and m.num_kv_heads % p.tensor:
        raise RuleError(f"{where}: model.num_kv_heads: {m.num_kv_heads} is not divisible by "
                        f"parallelism.tensor {p.tensor}")
    if m.num_layers % p.pipeline:
        raise RuleError(f"{where}: model.num_layers: {m.num_layers} is not divisible by "
                        f"parallelism.pipeline {p.pipeline}")
    if p.global_batch_size is not None:
        step = p.micro_batch_size * spec.data_parallel
        if p.global_batch_size % step:
            raise RuleError(
                f"{where}: parallelism.global_batch_size: {p.global_batch_size} is not divisible "
                f"by micro_batch_size {p.micro_batch_size} x data-parallel {spec.data_parallel} "
                f"= {step} {at}")


def check_trainer_rules(recipe: Recipe, where: str) -> None:
    """The rules a field's type cannot say (jobgen/inputs/rules.py's constants): enums of the
    upstream trainer, signs, cross-field arithmetic, what a process environment can carry."""
    m, p, s, d = recipe.model, recipe.parallelism, recipe.schedule, recipe.data
    if m.hidden_size % m.num_attention_heads:
        raise ConfigError(f"{where}: model.hidden_size: {m.hidden_size} is not divisible by "
                          f"model.num_attention_heads {m.num_attention_heads} (every head gets "
                          "the same width)")
    if m.ffn_hidden_size <= 0:
        raise ConfigError(f"{where}: model.ffn_hidden_size: must be positive, got "
                          f"{m.ffn_hidden_size}")
    if m.transformer_block_type is not None and m.transformer_block_type not in BLOCK_TYPES:
        raise ConfigError(f"{where}: model.transformer_block_type: {m.transformer_block_type!r} "
                          f"is not one the trainer accepts ({', '.join(BLOCK_TYPES)})")
    if not 0.0 < m.rotary_percentage <= 1.0:
        raise ConfigError(f"{where}: model.rotary_percentage: {m.rotary_percentage} must lie in "
                          "(0, 1]")
    if m.max_predictions is not None and not 0 < m.max_predictions <= m.seq_length:
        raise ConfigError(f"{where}: model.max_predictions: {m.max_predictions} must lie "
                          f"between 1 and model.seq_length {m.seq_length}")
    if p.sequence_parallel and p.tensor == 1:
        raise ConfigError(f"{where}: parallelism.sequence_parallel: needs parallelism.tensor "
                          "above 1 (Megatron would turn it off without saying so)")
    if p.hybrid_shard < 0 or p.activation_loading_horizon < 1:
        raise ConfigError(f"{where}: parallelism: hybrid_shard must be 0 or more and "
                          "activation_loading_horizon at least 1")
    ckpt = recipe.checkpoint
    if ckpt.every_steps is not None and ckpt.every_steps > s.max_steps:
        raise ConfigError(f"{where}: checkpoint.every_steps: {ckpt.every_steps} is more than "
                          f"schedule.max_steps {s.max_steps}: the run would never checkpoint")
    warmup = (round(s.warmup_fraction * s.max_steps) if s.warmup_fraction is not None
              else s.warmup_steps or 0)
    if warmup >= s.max_steps:
        raise ConfigError(f"{where}: schedule: warmup ({warmup} steps) must end before "
                          f"max_steps {s.max_steps}")
    if d.num_workers < 0:
        raise ConfigError(f"{where}: data.num_workers: must be 0 or more, got {d.num_workers}")
    if d.splits is not None:
        parts = re.split(r"[,/]", d.splits)
        if len(parts) != 3 or not all(re.fullmatch(SPLIT_NUMBER, x) for x in parts) or \
                sum(float(x) for x in parts) <= 0:
            raise ConfigError(f"{where}: data.splits: {d.splits!r} must be three non-negative "
                              "numbers with a positive sum (train,validation,test, like "
                              "980,10,10)")
    if not 0 <= recipe.seed <= SEED_MAX:
        raise ConfigError(f"{where}: seed: {recipe.seed} must lie between 0 and {SEED_MAX}")
    if recipe.job.log_every_steps < 1:
        raise ConfigError(f"{where}: job.log_every_steps: must be at least 1, got "
                          f"{recipe.job.log_every_steps}")
    for name, value in recipe.env.items():
        if "\0" in value:
            raise ConfigError(f"{where}: env.{name}: a value with a NUL byte cannot be in a "
                              "process environment")
        if len(name.encode()) + len(value.encode()) + 2 > ENV_MAX:
            raise ConfigError(f"{where}: env.{name}: {len(value.encode())} bytes is longer than "
                              f"Linux carries in one environment variable ({ENV_MAX} with its "
                              "name)")
    from ..inputs.limits import RECIPE_LIMITS
    check_limits(schema.to_plain(recipe), RECIPE_LIMITS, where)
    said = path_problem(recipe.data.path)
    if said is not None:   # a path the nodes open, as the site's are (site.py)
        raise ConfigError(f"{where}: data.path: {schema.describe(recipe.data.path)} {said}")
