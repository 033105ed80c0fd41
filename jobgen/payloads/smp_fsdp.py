"""Llama and GPT-NeoX pretraining with PyTorch FSDP (hybrid sharding) on GPU instances: jobgen's
own program (payload/smp_fsdp/train_fsdp.py), which uses SageMaker's model-parallel library v2
(``torch.sagemaker``) where the image has it (tensor parallelism, activation offloading) and
plain PyTorch FSDP otherwise. It runs on SageMaker training jobs (recipes/SOURCES.md: SMP v2,
hybrid shard degree, tensor parallel degree, activation offloading) and on EKS GPU nodes.

Its rehearsal (`--smoke`) runs this same program on CPU processes, two per node, so that the
sharding, the sharded checkpoints and the resume are the real ones."""
from __future__ import annotations

import posixpath

from ..errors import ConfigError, RuleError
from ..spec import JobSpec
from .base import COMMON_KEYS, STOP_SIGNAL, Fixed, Launch, Pass, Payload, number


def smp_parameters(spec: JobSpec) -> dict[str, object]:
    """SMP v2's core configuration (the `mp_parameters` hyperparameter of a SageMaker job)."""
    p = spec.recipe.parallelism
    return {"tensor_parallel_degree": p.tensor, "hybrid_shard_degree": p.hybrid_shard,
            "sm_activation_offloading": p.activation_offloading,
            "activation_loading_horizon": p.activation_loading_horizon,
            "random_seed": spec.recipe.seed}


def arguments(spec: JobSpec, which: Pass) -> tuple[str, ...]:
    r = spec.recipe
    m, p, o, s, c = r.model, r.parallelism, r.optim, r.schedule, r.checkpoint
    t = spec.rehearsal
    run = spec.run_dir
    if t is None:
        dims = ["--num-layers", str(m.num_layers), "--hidden-size", str(m.hidden_size),
                "--num-heads", str(m.num_attention_heads),
                "--intermediate-size", str(m.ffn_hidden_size),
                "--seq-length", str(m.seq_length),
                "--max-position-embeddings", str(m.max_position_embeddings),
                "--vocab-size", str(m.vocab_size),
                "--micro-batch-size", str(p.micro_batch_size),
                "--gradient-accumulation", str(spec.gradient_accumulation),
                "--max-steps", str(s.max_steps), "--lr", number(spec.lr),
                "--min-lr", number(s.min_lr), "--warmup-steps", str(spec.warmup_steps),
                "--constant-steps", str(spec.constant_steps),
                "--decay-steps", str(s.decay_steps if s.decay_steps is not None
                                     else s.max_steps),
                "--tensor-parallel", str(p.tensor), "--hybrid-shard", str(p.hybrid_shard),
                "--precision", "fp32" if r.precision == "fp32" else "bf16",
                "--device", "cuda", "--data-dir", spec.data_path(r.data.path),
                "--checkpoint-every", str(c.every_steps), "--keep-checkpoints", str(c.keep),
                "--log-every", str(r.job.log_every_steps)]
        if m.num_kv_heads is not None:
            dims += ["--num-kv-heads", str(m.num_kv_heads)]
        if m.rope_theta is not None:
            dims += ["--rope-theta", number(m.rope_theta)]
        if m.family == "llama":
            dims += ["--norm-eps", number(m.layernorm_epsilon)]
        else:
            dims += ["--rotary-pct", number(m.rotary_percentage)]
        if p.activation_offloading:
            dims += ["--activation-offloading",
                     "--activation-loading-horizon", str(p.activation_loading_horizon)]
    else:
        # The rehearsal: the recipe's model family, optimizer and schedule shape at the tiny
        # size, sharded over each node's two CPU processes.
        dims = ["--num-layers", str(t.num_layers), "--hidden-size", str(t.hidden_size),
                "--num-heads", str(t.num_heads), "--intermediate-size", str(t.intermediate_size),
                "--seq-length", str(t.seq_length), "--vocab-size", str(t.vocab_size),
                "--micro-batch-size", str(t.micro_batch_size),
                "--gradient-accumulation", str(t.gradient_accumulation),
                "--max-steps", str(t.max_steps), "--lr", number(t.lr),
                "--min-lr", number(t.min_lr), "--warmup-steps", str(t.warmup_steps),
                "--decay-steps", str(t.decay_steps),
                "--hybrid-shard", str(t.workers_per_node), "--precision", "fp32",
                "--device", "cpu", "--synthetic",
                "--checkpoint-every", str(t.checkpoint_every),
                "--keep-checkpoints", str(t.keep_checkpoints)]
    args = ["--family", m.family, *dims,
            "--decay", s.name, "--beta1", number(o.betas[0]), "--beta2", number(o.betas[1]),
            "--eps", number(o.eps), "--weight-decay", number(o.weight_decay),
            "--grad-clip", number(o.grad_clip), "--init-std", number(m.init_method_std or 0.02),
            "--activation-checkpointing", m.activation_checkpointing if t is None else "none",
            "--seed", str(r.seed), "--phase", which, "--compile-steps", str(r.compile.steps),
            "--output-dir", posixpath.join(run, "train" if which == "train" else "compile")]
    if o.no_decay is not None:
        args += ["--no-decay", *o.no_decay]
    if m.scaled_init:
        args.append("--scaled-init")
    return tuple(args)


def build(spec: JobSpec) -> Launch:
    if spec.recipe.checkpoint.every_steps is None and spec.rehearsal is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the FSDP program "
                          "checkpoints by step only; set checkpoint.every_steps")
    p = spec.recipe.parallelism
    shard = (p.hybrid_shard or spec.workers_per_node) if spec.rehearsal is None \
        else spec.workers_per_node
    tensor = p.tensor if spec.rehearsal is None else 1
    if spec.world_size % (shard * tensor):
        raise RuleError(f"{spec.source}: parallelism.hybrid_shard: {shard} x tensor {tensor} "
                        f"does not divide the {spec.world_size} GPUs of {spec.nodes} nodes")
    # Gradient accumulation and the other batch numbers come from the spec (COMMON_KEYS).
    return Launch(stop_signal=STOP_SIGNAL, launcher="smp_fsdp/launch.sh",
                  workdir=posixpath.join(spec.payload_dir, "smp_fsdp"),
                  program="train_fsdp.py", compile_wrapper="",
                  compile_args=arguments(spec, "compile"), train_args=arguments(spec, "train"))


PAYLOAD = Payload(
    name="smp_fsdp",
    accelerator="cuda",
    families=("llama", "gpt_neox"),
    honours=COMMON_KEYS | {
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
