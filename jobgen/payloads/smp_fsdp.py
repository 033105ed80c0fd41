"""Llama and GPT-NeoX pretraining with PyTorch FSDP (hybrid sharding) on GPU instances: jobgen's
own program (payload/smp_fsdp/train_fsdp.py), which uses SageMaker's model-parallel library v2
(``torch.sagemaker``) where the image has it (tensor parallelism, activation offloading) and
plain PyTorch FSDP otherwise. It runs on SageMaker training jobs (recipes/SOURCES.md: SMP v2,
hybrid shard degree, tensor parallel degree, activation offloading) and on EKS GPU nodes.

Its rehearsal (`--smoke`) runs this same program on CPU processes, two per node, so that the
sharding, the sharded checkpoints and the resume are the real ones."""
from __future__ import annotations

import posixpath

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from . import flags
from .base import COMMON_KEYS, STOP_SIGNAL, Fixed, Launch, Pass, Payload, number


def shard_degree(spec: JobSpec) -> int:
    """The hybrid-shard degree (ranks per sharding group, counted in data-parallel ranks: the
    world over the tensor-parallel degree), derived from the node count rather than fixed.

    `parallelism.hybrid_shard` 0 is SMP v2's own default: with tensor parallelism, the largest
    degree the data-parallel ranks allow (all of them); without, FSDP's HYBRID_SHARD (one node's
    ranks). A number is the most ranks a group may have: the degree is the largest divisor of
    the data-parallel ranks up to it, so llama2-7b's 16 (the SMP blog's) holds from 16 nodes up
    and fewer nodes shard over what they have (SMP's limit: 0 to world / tensor). A rehearsal
    shards over each node's CPU processes."""
    p = spec.recipe.parallelism
    if spec.rehearsal is not None:
        return spec.workers_per_node
    tensor = max(p.tensor, 1)
    ranks = spec.world_size // tensor
    if p.hybrid_shard == 0:
        return ranks if tensor > 1 else spec.workers_per_node
    most = min(p.hybrid_shard, ranks)
    degree = next(d for d in range(max(most, 1), 0, -1) if ranks % d == 0)
    if degree < most:
        from .base import say_once
        say_once(f"note: {spec.source}: parallelism.hybrid_shard: {most} does not divide the "
                 f"{ranks} data-parallel ranks; sharding over {degree}")
    return degree


def smp_parameters(spec: JobSpec) -> dict[str, object]:
    """SMP v2's core configuration (the `mp_parameters` hyperparameter of a SageMaker job), with
    the hybrid-shard degree as derived (shard_degree): what SMP builds its groups from."""
    p = spec.recipe.parallelism
    return {"tensor_parallel_degree": p.tensor, "hybrid_shard_degree": shard_degree(spec),
            "sm_activation_offloading": p.activation_offloading,
            "activation_loading_horizon": p.activation_loading_horizon,
            "random_seed": spec.recipe.seed}


# The program's flags in the order they are written: the shared ones (flags.py) and its own;
# a real job's model, batch and schedule flags, then the rehearsal's.
DIMS = (
    "num-layers", "hidden-size", "num-heads", "intermediate-size", "seq-length",
    "max-position-embeddings", "vocab-size", "micro-batch-size", "gradient-accumulation",
    "max-steps", "lr", "min-lr", "warmup-steps", "constant-steps", "decay-steps",
    "tensor-parallel", "hybrid-shard", "precision", "device", "data-dir", "checkpoint-every",
    "keep-checkpoints", "log-every", "num-kv-heads", "rope-theta", "norm-eps", "rotary-pct",
    "activation-offloading", "activation-loading-horizon",
)
REHEARSAL_DIMS = (
    "num-layers", "hidden-size", "num-heads", "intermediate-size", "seq-length", "vocab-size",
    "micro-batch-size", "gradient-accumulation", "max-steps", "lr", "min-lr", "warmup-steps",
    "decay-steps", "hybrid-shard", "precision", "device", "synthetic", "checkpoint-every",
    "keep-checkpoints",
)
TAIL = (
    "decay", "beta1", "beta2", "eps", "weight-decay", "grad-clip", "init-std",
    "activation-checkpointing", "seed", "phase", "compile-steps", "output-dir", "no-decay",
    "scaled-init", "sync-save",
)


def arguments(spec: JobSpec, which: Pass) -> tuple[str, ...]:
    r = spec.recipe
    m, p = r.model, r.parallelism
    t = spec.rehearsal
    own: dict[str, flags.Value]
    if t is None:
        own = {"tensor-parallel": str(p.tensor), "hybrid-shard": str(shard_degree(spec)),
               "precision": "fp32" if r.precision == "fp32" else "bf16", "device": "cuda",
               "num-kv-heads": str(m.num_kv_heads) if m.num_kv_heads is not None else None,
               "rope-theta": number(m.rope_theta) if m.rope_theta is not None else None,
               "norm-eps": number(m.layernorm_epsilon) if m.family == "llama" else None,
               "rotary-pct": number(m.rotary_percentage) if m.family != "llama" else None,
               "activation-offloading": bool(p.activation_offloading),
               "activation-loading-horizon": str(p.activation_loading_horizon)
               if p.activation_offloading else None,
               "activation-checkpointing": m.activation_checkpointing}
    else:
        # The rehearsal: the recipe's model family, optimizer and schedule shape at the tiny
        # size, sharded over each node's two CPU processes.
        own = {"hybrid-shard": str(t.workers_per_node), "precision": "fp32", "device": "cpu",
               "synthetic": True, "activation-checkpointing": "none"}
    own["decay"] = r.schedule.name   # the program's name for the shared --schedule
    order = ("family", *(DIMS if t is None else REHEARSAL_DIMS), *TAIL)
    return tuple(flags.render(order, flags.shared(spec, which), own))


def build(spec: JobSpec) -> Launch:
    if spec.recipe.checkpoint.every_steps is None and spec.rehearsal is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the FSDP program "
                          "checkpoints by step only; set checkpoint.every_steps")
    # The tensor degree divides the world (spec_checks.check_arithmetic), so a degree exists
    # at every node count; deriving it here says so once where it is smaller than asked.
    shard_degree(spec)
    # Gradient accumulation and the other batch numbers come from the spec (COMMON_KEYS).
    return Launch(stop_signal=STOP_SIGNAL, launcher="smp_fsdp/launch.sh",
                  workdir=posixpath.join(spec.payload_dir, "smp_fsdp"),
                  program="train_fsdp.py", compile_wrapper="",
                  compile_args=arguments(spec, "compile"), train_args=arguments(spec, "train"))


PAYLOAD = Payload(
    name="smp_fsdp",
    data=("hf_blocks", "input_ids"),
    rehearses_itself=True,
    accelerator="cuda",
    families=("llama", "gpt_neox"),
    honours=COMMON_KEYS | {
        "data.tokenizer",                       # the prepare stage's (prepare_tokenized.py)
        "job.log_every_steps",
        "model.num_kv_heads", "model.vocab_size", "model.layernorm_epsilon", "model.rope_theta",
        "model.init_method_std", "model.scaled_init", "model.activation_checkpointing",
        "model.rotary_percentage",
        "optim.eps", "optim.no_decay", "schedule.min_lr", "schedule.decay_steps",
        "parallelism.hybrid_shard", "parallelism.activation_offloading",
        "parallelism.activation_loading_horizon",
    },
    build=build,
    fixed={
        "parallelism.pipeline": Fixed(1, "FSDP with SMP v2 has no pipeline parallelism"),
        "parallelism.sequence_parallel": Fixed(False, "SMP v2's tensor parallelism decides its "
                                                      "own activation sharding"),
        "parallelism.zero1": Fixed(False, "FSDP shards the optimizer state (and parameters and "
                                          "gradients) already"),
        "model.position_embedding_type": Fixed("rope", "the Hugging Face Llama and GPT-NeoX "
                                                       "models use rotary embeddings"),
    },
    refused_values={
        "optim.name": {"lamb": "the FSDP program trains with AdamW"},
        "precision": {"bf16_sr": "GPUs have no stochastic rounding: use bf16 (BF16 compute, "
                                 "FP32 gradient reduction) or fp32"},
    },
)
