"""Llama pretraining on NeuronX Distributed: jobgen's own training program
(payload/neuronx_distributed/train_llama.py), which owns the loop (optimizer, schedule,
initialisation, checkpoint/resume, data position) and uses the model and data code of the NxD
Llama example checked out at the site's paths.nxd_llama_dir (the release named in
upstream/neuronx_distributed.json). The upstream example script itself cannot train the HLAT
recipe: it has no cosine schedule, min_lr, decay steps, eps or scaled initialisation."""
from __future__ import annotations

import json
import posixpath
from typing import Any

from ..errors import ConfigError
from ..spec import JobSpec
from .base import (
    COMMON_KEYS,
    STOP_SIGNAL,
    Fixed,
    Launch,
    Pass,
    Payload,
    neuron_environment,
    number,
)


def llama_config(spec: JobSpec) -> dict[str, Any]:
    """The Hugging Face LlamaConfig the program reads from --model-config."""
    m = spec.recipe.model
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": m.hidden_size,
        "intermediate_size": m.ffn_hidden_size,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_attention_heads,
        "num_key_value_heads": m.num_kv_heads or m.num_attention_heads,
        "vocab_size": m.vocab_size,
        "max_position_embeddings": m.max_position_embeddings,
        "rms_norm_eps": m.layernorm_epsilon,
        "rope_theta": m.rope_theta or 10000.0,
        "initializer_range": m.init_method_std or 0.02,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }


def arguments(spec: JobSpec, which: Pass) -> tuple[str, ...]:
    r = spec.recipe
    m, p, o, s, c = r.model, r.parallelism, r.optim, r.schedule, r.checkpoint
    run = spec.run_dir
    example = spec.site.paths.nxd_llama_dir
    assert example is not None
    args: list[str] = [
        "--example-dir", example,
        "--model-config", posixpath.join(run, "model", "config.json"),
        "--data-dir", spec.data_path(r.data.path),
        "--output-dir", posixpath.join(run, "train" if which == "train" else "compile"),
        "--phase", which,
        "--compile-steps", str(r.compile.steps),
        "--max-steps", str(s.max_steps),
        "--tensor-parallel-size", str(p.tensor),
        "--micro-batch-size", str(p.micro_batch_size),
        "--gradient-accumulation", str(spec.gradient_accumulation),
        "--seq-length", str(m.seq_length),
        "--lr", number(spec.lr),
        "--min-lr", number(s.min_lr),
        "--warmup-steps", str(spec.warmup_steps),
        "--constant-steps", str(spec.constant_steps),
        "--decay-steps", str(s.decay_steps if s.decay_steps is not None else s.max_steps),
        "--schedule", s.name,
        "--beta1", number(o.betas[0]),
        "--beta2", number(o.betas[1]),
        "--eps", number(o.eps),
        "--weight-decay", number(o.weight_decay),
        "--grad-clip", number(o.grad_clip),
        "--init-std", number(m.init_method_std or 0.02),
        "--seed", str(r.seed),
        "--precision", r.precision,
        "--log-every", str(r.job.log_every_steps),
    ]
    # Absent: the program's own rule (the NxD example's: biases and norms); given with no
    # fragments: every parameter is decayed.
    if o.no_decay is not None:
        args += ["--no-decay", *o.no_decay]
    if m.scaled_init:
        args.append("--scaled-init")
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if m.activation_checkpointing == "selective":
        args.append("--selective-checkpoint")
    if p.zero1:
        args.append("--zero1")
    if which == "train":  # the compile pass neither loads nor saves a checkpoint
        args += ["--checkpoint-dir", posixpath.join(run, "checkpoints"),
                 "--checkpoint-every", str(c.every_steps),
                 "--keep-checkpoints", str(c.keep)]
    return tuple(args)


def build(spec: JobSpec) -> Launch:
    paths = spec.site.paths
    if not paths.nxd_llama_dir:
        raise ConfigError(f"site {spec.site.name}: paths.nxd_llama_dir is required by payload "
                          "neuronx_distributed (the NxD Llama pretraining example directory)")
    if spec.recipe.checkpoint.every_steps is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the NxD trainer "
                          "checkpoints by step only; set checkpoint.every_steps")
    config = json.dumps(llama_config(spec), indent=2, sort_keys=True) + "\n"
    return Launch(stop_signal=STOP_SIGNAL, launcher="neuronx_distributed/launch.sh",
                  workdir=posixpath.join(spec.payload_dir, "neuronx_distributed"),
                  program="train_llama.py", compile_wrapper="neuron_parallel_compile",
                  compile_args=arguments(spec, "compile"), train_args=arguments(spec, "train"),
                  files=(("model/config.json", config),))


PAYLOAD = Payload(
    name="neuronx_distributed",
    accelerator="neuron",
    families=("llama",),
    honours=COMMON_KEYS | {
        "job.log_every_steps",
        "model.num_kv_heads", "model.vocab_size", "model.layernorm_epsilon", "model.rope_theta",
        "model.init_method_std", "model.scaled_init", "model.activation_checkpointing",
        "parallelism.sequence_parallel", "parallelism.zero1", "optim.eps", "optim.no_decay",
        "schedule.min_lr", "schedule.decay_steps",
    },
    build=build,
    # NxD's bf16 without rounding keeps FP32 master weights: the parameters are downcast.
    environment=lambda recipe: neuron_environment(recipe, fp32_accumulation=False,
                                                  bf16_downcasts=True),
    fixed={
        "parallelism.pipeline": Fixed(1, "the NxD Llama TP + ZeRO-1 program has no pipeline "
                                         "parallelism (PP > 1 would only multiply the global "
                                         "batch)"),
        "model.position_embedding_type": Fixed("rope", "Llama uses rotary embeddings"),
        "model.rotary_percentage": Fixed(1.0, "Llama rotates every head dimension"),
    },
    refused_values={
        "optim.name": {"lamb": "the NxD program trains with AdamW"},
        "model.activation_checkpointing": {
            "full": "the NxD Llama model checkpoints selectively (attention) only"},
    },
    upstream="neuronx_distributed.json",
)
