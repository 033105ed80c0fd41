"""Recipe values checked against what the trainers accept, before anything is rendered: the
rules a single field's type cannot say (enums of the upstream trainer, signs, cross-field
arithmetic, what a process environment can carry), and the names that reach #SBATCH lines, file
names and the job's environment (check_names). Each refusal is one line naming the file,
the key and the rule. Where an upstream trainer only warns and changes the value (Megatron turns
sequence parallelism off at tensor parallelism 1), jobgen refuses: a silent change is worse."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from . import schema
from .errors import ConfigError

if TYPE_CHECKING:   # the records only: jobgen/recipe.py imports this module
    from .recipe import Recipe

# neuronx-nemo-megatron at the SDK 2.20 release the payload is pinned to (d22aabf; the same at
# 2.21), nemo/collections/nlp/modules/common/megatron/transformer.py: the block types
# ParallelTransformerLayer_ accepts.
BLOCK_TYPES = ("pre_ln", "post_ln", "normformer", "gpt_j")
# numpy's and torch's seeding both take a 32-bit unsigned seed in the trainers.
SEED_MAX = 2**32 - 1
# Linux refuses one argument or environment string longer than this (MAX_ARG_STRLEN, 32 pages),
# counted with the name, the '=' and the terminating NUL.
ENV_MAX = 131072
_NUMBER = r"\s*(?:\d+(?:\.\d*)?|\.\d+)\s*"


def check(recipe: Recipe, where: str) -> None:
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
        if len(parts) != 3 or not all(re.fullmatch(_NUMBER, x) for x in parts) or \
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
    from .limits import RECIPE_LIMITS
    check_limits(schema.to_plain(recipe), RECIPE_LIMITS, where)


def check_site_paths(work_dir: str, compile_cache: str, local_compile_cache: "str | None",
                     shown: str) -> None:
    """Folders a job writes into, or a cache step refreshes, that would harm what is there: the
    root, the home folder, and a cache that is the run folders' own folder or above it."""
    import os
    import posixpath
    home = os.path.expanduser("~").rstrip("/") or "/"

    def norm(path: str) -> str:
        return posixpath.normpath(path) if path else path

    runs = norm(work_dir)
    for key, value in (("paths.work_dir", work_dir), ("paths.compile_cache", compile_cache),
                       ("paths.local_compile_cache", local_compile_cache)):
        if value is None:
            continue
        path = norm(value)
        if path in ("", "/", home, "."):
            raise ConfigError(f"{shown}: {key}: {value!r} is the root, the home folder or the "
                              "submission folder itself: give a folder of its own")
        if key != "paths.work_dir" and (path == runs or runs.startswith(path.rstrip("/") + "/")):
            raise ConfigError(f"{shown}: {key}: {value!r} holds the run folders "
                              f"(paths.work_dir {work_dir!r}): give the cache a folder of its "
                              "own")


def check_limits(data: Any, limits: dict[str, dict[str, Any]], where: str) -> None:
    """The single-value rules of a JSON Schema table (jobgen/limits.py), applied to the
    loaded record as plain data: the schema and the loader refuse the same values."""
    for key, rule in limits.items():
        value: Any = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or isinstance(value, bool):
            continue
        shown = repr(value) if isinstance(value, str) else value
        if isinstance(value, (int, float)):
            for word, ok, say in (("minimum", lambda v, m: v >= m, "at least"),
                                  ("maximum", lambda v, m: v <= m, "at most"),
                                  ("exclusiveMinimum", lambda v, m: v > m, "more than"),
                                  ("exclusiveMaximum", lambda v, m: v < m, "less than")):
                if word in rule and not ok(value, rule[word]):
                    raise ConfigError(f"{where}: {key}: {shown} must be {say} {rule[word]}")
        if isinstance(value, str):
            if len(value) < rule.get("minLength", 0):
                raise ConfigError(f"{where}: {key}: must not be empty")
            if "enum" in rule and value not in rule["enum"]:
                raise ConfigError(f"{where}: {key}: {shown} is not one of "
                                  f"{', '.join(rule['enum'])}")
            if "pattern" in rule and not re.search(rule["pattern"], value):
                raise ConfigError(f"{where}: {key}: {shown} does not match {rule['pattern']}")


# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or no limit.
TIME_LIMIT_RE = re.compile(r"\d+(?::\d+){0,2}|\d+-\d+(?::\d+){0,2}|UNLIMITED|INFINITE",
                           re.IGNORECASE)


# `env:` names a recipe may not set, in one place. Names jobgen's own scripts own (the sbatch
# template, payload/common/node_launch.sh, env/containers/entrypoint.sh): a recipe value would
# silently replace what the job computed.
JOBGEN_OWNED = frozenset({
    "RUN_DIR", "PAYLOAD_DIR", "LAUNCHER", "ACTIVATE", "MAX_RESTARTS", "COMPILE_MODE",
    "COMPILE_CACHE", "LOCAL_COMPILE_CACHE", "COMPILE_KEY", "COMPILE_ARGS", "TRAIN_ARGS",
    "PREPARE", "MASTER_RESOLVER", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK",
    "LOCAL_RANK", "NEURON_COMPILE_CACHE_URL", "PT_HPU_RECIPE_CACHE_CONFIG",
})
# Names that change how a shell or the dynamic loader behaves: one of these in the job's
# environment can run an arbitrary file (BASH_ENV, ENV, LD_PRELOAD) or change what every later
# line means (IFS, PATH, SHELLOPTS). LD_LIBRARY_PATH stays allowed: Gaudi's EFA setup sets it.
SHELL_AND_LOADER = frozenset({
    "BASH_ENV", "ENV", "IFS", "PATH", "CDPATH", "GLOBIGNORE", "SHELLOPTS", "BASHOPTS", "PS4",
    "PROMPT_COMMAND", "HOME", "SHELL", "LD_PRELOAD", "LD_AUDIT", "PYTHONSTARTUP",
    "PYTHONPATH", "PYTHONHOME", "PYTHONINSPECT",
})
RESERVED_PREFIXES = ("JOBGEN_", "SLURM_", "SBATCH_", "SRUN_", "AWS_BATCH_", "BASH_FUNC_")


def check_env_name(name: str, where: str) -> None:
    if name in JOBGEN_OWNED or name.startswith(RESERVED_PREFIXES):
        raise ConfigError(f"{where}: env.{name}: set by jobgen or the scheduler; a recipe may "
                          "not set it")
    if name in SHELL_AND_LOADER:
        raise ConfigError(f"{where}: env.{name}: changes how the job's shell or loader "
                          "behaves; a recipe may not set it")


def check_names(recipe: Recipe, where: str) -> None:
    """Names that reach #SBATCH lines and file names, and env names, use a safe alphabet."""
    if not schema.NAME_RE.fullmatch(recipe.name):
        raise ConfigError(f"{where}: name: {schema.describe(recipe.name)} must match "
                          f"{schema.NAME_RE.pattern}")
    for key in list(recipe.env) + list(recipe.launch):
        if not schema.ENV_NAME_RE.fullmatch(key):
            section = "env" if key in recipe.env else "launch"
            raise ConfigError(f"{where}: {section}.{key}: not a valid variable name")
    for key in recipe.env:
        check_env_name(key, where)
    limit = recipe.job.time_limit  # goes on an #SBATCH line, where no quoting helps
    if limit is not None and not TIME_LIMIT_RE.fullmatch(limit):
        raise ConfigError(f"{where}: job.time_limit: {schema.describe(limit)} is not a Slurm "
                          "time limit (MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)")
