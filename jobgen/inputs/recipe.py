"""Recipes: one YAML file per model, loaded strictly into frozen records.

A recipe states what is trained and how (payload, platform, model, parallelism, optimizer and
schedule, data, checkpointing, compile pass, default node count). Where a job runs (paths,
partition) is the site profile's business (`site.py`); numbers derived from the node count are the
job spec's (`spec.py`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from ..plumbing import resources
from ..plumbing.errors import ConfigError
from ..plumbing.record import record
from . import schema
from .overlays import apply_overlay
from .rules import check_env_name, time_limit_ok, time_limit_seconds  # noqa: F401
from .yamlfile import load_yaml

PayloadName = str   # a registered payload (jobgen/payloads: built-in, or an entry point)


@record
class Model:
    family: Literal["gpt_neox", "llama", "bert"]
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    max_position_embeddings: int
    num_kv_heads: Optional[int] = None
    init_method_std: Optional[float] = None
    layernorm_epsilon: float = 1e-5
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    position_embedding_type: Literal["rope", "learned_absolute"] = "learned_absolute"
    rotary_percentage: float = 1.0
    rope_theta: Optional[float] = None
    transformer_block_type: Optional[str] = None
    activation_checkpointing: Literal["full", "selective", "none"] = "none"
    max_predictions: Optional[int] = None  # masked-LM predictions per sequence (BERT)
    # Output projections (attention out, MLP down) initialised with std / sqrt(2 x layers) (HLAT).
    scaled_init: bool = False
    # BERT: the LayerNorm placement of Model-References' large-model configs (BERT 1.5B).
    layer_norm_large_model: bool = False


@record
class Parallelism:
    micro_batch_size: int
    tensor: int = 1
    pipeline: int = 1
    sequence_parallel: bool = False
    zero1: bool = False
    # Exactly one of the two: the global batch (Megatron style) or the accumulation (DeepSpeed
    # style, where the global batch grows with the node count).
    global_batch_size: Optional[int] = None
    gradient_accumulation: Optional[int] = None
    # Sharded data parallelism (FSDP/SMP v2): parameters, gradients and optimizer state are
    # sharded over groups of this many ranks and replicated across groups (hybrid sharding);
    # 0: not used by the trainer.
    hybrid_shard: int = 0
    # SMP v2 activation offloading to host memory, and how many layers ahead it loads back.
    activation_offloading: bool = False
    activation_loading_horizon: int = 2


@record
class LrScaling:
    """The learning rate as a stated function of the node count (BERT 1.5B: 0.0015 at 8 nodes,
    0.003 at 16): lr = base_lr * (nodes / base_nodes) for rule `linear`."""
    base_nodes: int
    rule: Literal["linear", "sqrt", "none"] = "linear"


@record
class Optim:
    name: Literal["adamw", "lamb"]
    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lr_scaling: Optional[LrScaling] = None
    # Name fragments of parameters excluded from weight decay; [] decays every parameter; unset:
    # the payload's own rule (Megatron/NeMo: biases and norms).
    no_decay: Optional[tuple[str, ...]] = None


@record
class Schedule:
    name: Literal["cosine", "linear"]
    max_steps: int
    warmup_steps: Optional[int] = None
    warmup_fraction: Optional[float] = None
    constant_steps: Optional[int] = None
    constant_fraction: Optional[float] = None
    min_lr: float = 0.0
    decay_steps: Optional[int] = None


@record
class Data:
    path: str  # relative paths are under the site's data_dir
    vocab_file: Optional[str] = None
    merge_file: Optional[str] = None
    tokenizer: Optional[str] = None  # the prepare stage's tokenizer (a hub name or a folder)
    num_workers: int = 1
    splits: Optional[str] = None
    # Megatron datasets: how many prefixes the prepare stage writes (one per --from input) and
    # training blends: 1 is `path` itself, N are path_part0 ... path_part{N-1}.
    shards: int = 1


@record
class Checkpoint:
    # Exactly one trigger: every N optimizer steps, or every N seconds of training.
    every_steps: Optional[int] = None
    every_seconds: Optional[int] = None
    keep: int = 3
    # Write checkpoints in the background, sealed once complete (DCP async_save, NxD's and NeMo's
    # async saves); unset: wherever the payload's library can (not DeepSpeed on Gaudi).
    async_save: Optional[bool] = None


@record
class Compile:
    steps: int = 3


@record
class Job:
    max_restarts: int = 10
    # Restarts of the training pass inside one allocation (torchrun's elastic agent, per node)
    # before the job goes back to the scheduler; 0: every failure goes back to it.
    restarts_in_place: int = 0
    # Slurm: nodes allocated beyond the ones that train (sbatch --no-kill); the health gate picks
    # which train, and the job step runs again on a spare when it lost a node.
    spare_nodes: int = 0
    # Seconds a collective waits for a peer before it fails (init_process_group's timeout, in
    # the trainers whose loop is jobgen's). A hung rank makes the others' next collective fail:
    # with restarts_in_place the workers restart inside the allocation, else the job requeues.
    # Longer than any healthy wait between ranks (a save's barrier, a restart's start-up skew).
    collective_timeout_s: int = 1800
    master_port: int = 41000
    time_limit: Optional[str] = None
    log_every_steps: int = 1
    health_gate: bool = True       # check every node before the compile pass (jobgen/job/health.py)
    data_check: bool = True        # read the dataset's headers first (payload/common/data_check.py)


@record
class Eval:
    """What `--stage eval` scores an exported step on (payload/common/eval_lm.py: lm-eval)."""
    tasks: Mapping[str, int] = dataclasses.field(default_factory=dict)  # lm-eval task: shots


@record
class Recipe:
    name: str
    description: str
    payload: PayloadName
    platform: str                  # a platform file's name (jobgen/inputs/platforms.py)
    nodes: int
    model: Model
    parallelism: Parallelism
    precision: Literal["bf16_sr", "bf16", "fp32"]
    optim: Optim
    schedule: Schedule
    data: Data
    checkpoint: Checkpoint
    compile: Compile = Compile()
    job: Job = Job()
    eval: Eval = Eval()            # what `--stage eval` scores an export on (lm-eval)
    seed: int = 1234
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Payload-specific launch knobs that are not part of the model (e.g. NeMo's config name).
    launch: Mapping[str, str] = dataclasses.field(default_factory=dict)


def recipe_names() -> list[str]:
    """The built-in recipes, by file stem."""
    return sorted(p.stem for p in resources.folder("recipes").glob("*.yaml"))


def locate(ref: str) -> tuple[Path, str]:
    """Resolve a recipe reference (built-in name or a path) to (file, name shown in messages)."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = Path(ref)
        if not path.is_file():
            raise ConfigError(f"{ref}: no such recipe file")
        return path, ref
    path = resources.folder("recipes") / f"{ref}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown recipe {ref!r} (built-in recipes: {', '.join(recipe_names())})")
    return path, f"recipes/{ref}.yaml"


def apply_overrides(data: dict[str, Any], overrides: list[str], where: str) -> dict[str, Any]:
    """Apply `--set a.b=value` overrides to raw recipe data; the path must exist in the schema and
    the value is parsed as YAML, then type-checked by the same constructor as the file."""
    import copy
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set: {item}: expected KEY=VALUE (for example optim.lr=1e-4)")
        target = schema.field_type(Recipe, key, "--set")
        value = _parse_value(text, target)
        schema.coerce(target, value, "--set", key)  # type errors name --set, not the file
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set: {key}: {part} is not a mapping in {where}")
            node = child
        node[parts[-1]] = value
    return data


def _parse_value(text: str, target: Any) -> Any:
    """Parse a --set value as YAML 1.2 (jobgen/inputs/yaml12.py), except where the field is a string
    (kept verbatim)."""
    import yaml
    if target in (str, Optional[str]):
        return text
    if target in (float, Optional[float]):
        try:
            return float(text)
        except ValueError:
            pass
    from .yaml12 import YamlError, loads
    try:
        return loads(text) if text.strip() else None
    except YamlError as exc:
        raise ConfigError(f"--set: {exc}") from None
    except yaml.YAMLError:
        return text


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
    if limit is not None and not time_limit_ok(limit):
        raise ConfigError(f"{where}: job.time_limit: {schema.describe(limit)} is not a Slurm "
                          "time limit (MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)")


def check_eval(recipe: Recipe, where: str) -> None:
    """The eval: section's task names (they reach a job's command line) and shot counts; an
    encoder has no lm-eval tasks to run."""
    from .limits import EVAL_MAX_SHOTS, EVAL_TASK_RE
    for task, shots in recipe.eval.tasks.items():
        if not EVAL_TASK_RE.fullmatch(task):
            raise ConfigError(f"{where}: eval.tasks.{task}: not an lm-eval task name "
                              f"(must match {EVAL_TASK_RE.pattern})")
        if not 0 <= shots <= EVAL_MAX_SHOTS:
            raise ConfigError(f"{where}: eval.tasks.{task}: {shots} few-shot examples; must lie "
                              f"in [0, {EVAL_MAX_SHOTS}]")
    if recipe.eval.tasks and recipe.model.family == "bert":
        raise ConfigError(f"{where}: eval.tasks: model.family bert is an encoder, and lm-eval's "
                          "tasks score a causal language model's log-likelihoods: leave eval: "
                          "out")


def load(ref: str, overrides: Optional[list[str]] = None,
         backend: Optional[str] = None) -> tuple[Recipe, str]:
    """Load and strictly validate a recipe, with its overlay for `backend` applied, then the
    overrides; returns it with the name used in error messages."""
    path, shown = locate(ref)
    return load_file(path, shown, overrides, backend)


def load_file(path: Path, shown: str, overrides: Optional[list[str]] = None,
              backend: Optional[str] = None) -> tuple[Recipe, str]:
    """`load` of a file named `shown` in messages (a run's recorded copy of its recipe)."""
    data = apply_overlay(load_yaml(path, shown), backend, shown)
    if overrides:
        data = apply_overrides(data, overrides, shown)
    recipe = schema.build(Recipe, data, shown)
    check_names(recipe, shown)
    check_eval(recipe, shown)
    from .platforms import get as platform
    platform(recipe.platform, shown)
    return recipe, shown
