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

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from . import flags
from .base import (
    COMMON_KEYS,
    STOP_SIGNAL,
    Fixed,
    Launch,
    Pass,
    Payload,
    neuron_environment,
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


# The program's flags in the order they are written: the shared ones (flags.py) and its own.
ORDER = (
    "example-dir", "model-config", "data-dir", "output-dir", "phase", "compile-steps",
    "max-steps", "tensor-parallel-size", "micro-batch-size", "gradient-accumulation",
    "seq-length", "lr", "min-lr", "warmup-steps", "constant-steps", "decay-steps", "schedule",
    "beta1", "beta2", "eps", "weight-decay", "grad-clip", "init-std", "seed", "precision",
    "log-every",
    # Absent: the program's own rule (the NxD example's: biases and norms); given with no
    # fragments: every parameter is decayed.
    "no-decay", "scaled-init", "sequence-parallel", "selective-checkpoint", "zero1",
)
# The compile pass neither loads nor saves a checkpoint.
TRAIN_ONLY = ("checkpoint-dir", "checkpoint-every", "keep-checkpoints", "sync-save")


def arguments(spec: JobSpec, which: Pass) -> tuple[str, ...]:
    r = spec.recipe
    m, p = r.model, r.parallelism
    example = spec.site.paths.nxd_llama_dir
    assert example is not None
    order = ORDER + (TRAIN_ONLY if which == "train" else ())
    return tuple(flags.render(order, flags.shared(spec, which), {
        "example-dir": example,
        "model-config": posixpath.join(spec.run_dir, "model", "config.json"),
        "tensor-parallel-size": str(p.tensor),
        "precision": r.precision,
        "sequence-parallel": bool(p.sequence_parallel),
        "selective-checkpoint": m.activation_checkpointing == "selective",
        "zero1": bool(p.zero1),
        "checkpoint-dir": posixpath.join(spec.run_dir, "checkpoints"),
    }))


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
    data=("hf_blocks", "input_ids", "attention_mask", "labels"),
    accelerator="neuron",
    families=("llama",),
    honours=COMMON_KEYS | {
        "data.tokenizer",                       # the prepare stage's (prepare_tokenized.py)
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
