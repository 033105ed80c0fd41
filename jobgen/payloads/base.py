"""What every payload module provides, and the parts of a launch they share.

A payload module (one per trainer) declares, in one ``Payload`` record: the recipe keys its
trainer honours, the `launch:` knobs it accepts, the model families and platforms it runs, and a
``build(spec) -> Launch`` that generates the trainer's arguments for the two passes. Everything
else (environment, compile key) is common and lives here.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal, Optional

from ..inputs import schema
from ..inputs.recipe import Recipe
from ..job.spec import JobSpec
from ..plumbing.record import record

_SAID: set[str] = set()


def say_once(note: str) -> None:
    """A note on stderr, once per process (`jobgen check` renders hundreds of jobs)."""
    if note not in _SAID:
        _SAID.add(note)
        print(note, file=sys.stderr)


Pass = Literal["compile", "train"]
# What the Slurm job's controller forwards on the time-limit warning, for the trainers that run
# payload/common/loop.py (ours): they save the step just trained and stop.
STOP_SIGNAL = "USR1"


@record
class Launch:
    launcher: str                 # script under payload/, run once per node
    workdir: str                  # the directory the trainer runs in
    program: str                  # the trainer, relative to workdir
    compile_wrapper: str          # prefix for the compile pass ("" when none)
    compile_args: tuple[str, ...]
    train_args: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()  # (path under the run dir, content) written first
    # A command run once before the compile pass: (script under payload/, its arguments).
    prepare: tuple[str, ...] = ()
    # The signal on which the trainer saves a checkpoint and stops (payload/common/
    # stop_request.py's StopRequest), or "" for a trainer that cannot: it resumes from its last
    # periodic one.
    stop_signal: str = ""

    def args(self, which: Pass) -> tuple[str, ...]:
        return self.compile_args if which == "compile" else self.train_args


@record
class Fixed:
    """A recipe key the trainer takes from elsewhere: only ``value`` is accepted, and ``why``
    says where the trainer gets it (e.g. the vocabulary from the tokenizer files)."""
    value: Any
    why: str


@record
class Payload:
    name: str
    accelerator: Literal["neuron", "hpu", "cuda"]  # the platforms it runs on
    families: tuple[str, ...]                 # model.family values it can train
    honours: frozenset[str]                   # recipe keys that reach the trainer or the job
    build: Callable[[JobSpec], Launch]
    # Keys with one accepted value (anything else is refused with the reason).
    fixed: Mapping[str, Fixed] = field(default_factory=dict)
    # Allowed `launch:` knobs and their defaults.
    launch_keys: Mapping[str, str] = field(default_factory=dict)
    # Literal values of honoured keys this trainer cannot do, with the reason.
    refused_values: Mapping[str, Mapping[Any, str]] = field(default_factory=dict)
    upstream: str = ""                         # facts file under jobgen/payloads/upstream/
    # What the trainer's runtime reads from the environment for this recipe (the compiler's
    # flags, the precision switches), exported after the platform's and before the recipe's.
    environment: Optional[Callable[[Recipe], Mapping[str, str]]] = None
    # Its builder renders a --smoke rehearsal itself (a program that runs on CPU as it is),
    # instead of the smoke trainer standing in.
    rehearses_itself: bool = False
    # Whether its saves run in the background when the recipe leaves checkpoint.async_save
    # unset (False: only when the recipe asks, where upstream's default is off).
    background_save_default: bool = True
    # The dataset it reads, for the data check (payload/common/data_check.py): the format
    # ("megatron", "hf_blocks" or "bert_hdf5"), then the columns a Hugging Face dataset needs.
    data: tuple[str, ...] = ()


# Keys every payload honours: they shape the job itself (nodes, restarts, environment, the
# compile pass) or the batch arithmetic every trainer receives.
COMMON_KEYS = frozenset({
    "name", "description", "payload", "platform", "nodes", "precision", "seed", "env", "launch",
    "model.family", "model.num_layers", "model.hidden_size", "model.num_attention_heads",
    "model.ffn_hidden_size", "model.seq_length", "model.max_position_embeddings",
    "parallelism.micro_batch_size", "parallelism.global_batch_size",
    "parallelism.gradient_accumulation", "parallelism.tensor", "parallelism.pipeline",
    "optim.name", "optim.lr", "optim.betas", "optim.weight_decay", "optim.grad_clip",
    "optim.lr_scaling", "optim.lr_scaling.base_nodes", "optim.lr_scaling.rule",
    "schedule.name", "schedule.max_steps", "schedule.warmup_steps", "schedule.warmup_fraction",
    "schedule.constant_steps", "schedule.constant_fraction",
    "data.path", "checkpoint.every_steps", "checkpoint.every_seconds", "checkpoint.keep",
    "checkpoint.async_save",
    "compile.steps", "job.max_restarts", "job.restarts_in_place", "job.spare_nodes",
    "job.collective_timeout_s", "job.master_port",
    "job.time_limit", "job.health_gate", "job.data_check",
})


NEURON_CC_BASE = "--model-type transformer --distribution-strategy=llm-training"


def neuron_environment(recipe: Recipe, *, fp32_accumulation: bool, bf16_downcasts: bool,
                       extra: Mapping[str, str] = {}) -> dict[str, str]:
    """What the Neuron compiler and runtime read, for a recipe's precision:
    `fp32_accumulation`: bf16 with stochastic rounding accumulates in FP32 inside the compiler
    (NeMo's bf16SR); `bf16_downcasts`: plain bf16 keeps FP32 master weights and downcasts the
    parameters (NxD) instead of running all in bf16 (NeMo)."""
    cc = NEURON_CC_BASE
    if fp32_accumulation and recipe.precision == "bf16_sr":
        cc += " --enable-mixed-precision-accumulation"
    env = {"NEURON_CC_FLAGS": cc, "NEURON_FUSE_SOFTMAX": "1"}
    # fp32 sets neither variable: torch_xla and NxD treat any non-empty XLA_USE_BF16 as on.
    if recipe.precision == "bf16_sr" or (recipe.precision == "bf16" and not bf16_downcasts):
        env["XLA_USE_BF16"] = "1"
    elif recipe.precision == "bf16":
        env["XLA_DOWNCAST_BF16"] = "1"
    env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1" if recipe.precision == "bf16_sr" else "0"
    env.update(extra)
    return env


def compile_cache_env(spec: JobSpec, cache_dir: str) -> dict[str, str]:
    """Where the accelerator keeps compiled graphs, as the platform file says (Neuron's
    persistent cache, Habana's recipe cache with its options, the CUDA inductor cache)."""
    platform = spec.platform
    return {platform.compile_cache_var: platform.compile_cache_value.replace("{dir}", cache_dir)}


def launch_value(spec: JobSpec, payload: Payload, key: str) -> str:
    """A `launch:` knob of the recipe, or the payload's default for it."""
    return spec.recipe.launch.get(key, payload.launch_keys[key])


def number(value: float) -> str:
    """A float as the trainers' argparse reads it back exactly."""
    return repr(float(value))


def plain(value: Any) -> Any:
    return schema.to_plain(value)
