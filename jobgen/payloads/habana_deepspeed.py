"""jobgen's own BERT pretraining program (payload/habana_deepspeed/pretrain_bert.py): DeepSpeed
ZeRO-1 on Gaudi (HPU), CUDA or CPU, data-parallel only. Every model, optimizer and schedule
value of a BERT recipe is one of its flags."""
from __future__ import annotations

import posixpath

from ..errors import ConfigError
from ..spec import JobSpec
from .base import COMMON_KEYS, STOP_SIGNAL, Fixed, Launch, Pass, Payload, number


def arguments(spec: JobSpec, which: Pass, data_dir: str) -> tuple[str, ...]:
    r = spec.recipe
    m, p, o, s, c = r.model, r.parallelism, r.optim, r.schedule, r.checkpoint
    args = [
        "--input-dir", data_dir,
        "--output-dir", posixpath.join(spec.run_dir, "train" if which == "train" else "compile"),
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--num-heads", str(m.num_attention_heads),
        "--intermediate-size", str(m.ffn_hidden_size),
        "--vocab-size", str(m.vocab_size),
        "--max-position-embeddings", str(m.max_position_embeddings),
        "--seq-length", str(m.seq_length),
        "--max-predictions", str(m.max_predictions or 20),
        "--hidden-dropout", number(m.hidden_dropout),
        "--attention-dropout", number(m.attention_dropout),
        "--layer-norm-eps", number(m.layernorm_epsilon),
        "--init-std", number(m.init_method_std or 0.02),
        "--micro-batch-size", str(p.micro_batch_size),
        "--gradient-accumulation", str(spec.gradient_accumulation),
        "--lr", number(spec.lr),
        "--min-lr", number(s.min_lr),
        "--warmup", repr(spec.warmup_steps / s.max_steps),
        "--constant", repr(spec.constant_steps / s.max_steps),
        "--max-steps", str(s.max_steps),
        "--decay-steps", str(s.decay_steps if s.decay_steps is not None else s.max_steps),
        "--schedule", s.name,
        "--optimizer", o.name,
        "--beta1", number(o.betas[0]),
        "--beta2", number(o.betas[1]),
        "--eps", number(o.eps),
        "--weight-decay", number(o.weight_decay),
        "--grad-clip", number(o.grad_clip),
        "--zero-stage", "1" if p.zero1 else "0",
        "--precision", "fp32" if r.precision == "fp32" else "bf16",
        "--seed", str(r.seed),
        "--checkpoint-every", str(c.every_steps),
        "--keep-checkpoints", str(c.keep),
        "--phase", which,
        "--compile-steps", str(r.compile.steps),
        "--accelerator", "cpu" if spec.smoke else "auto",
    ]
    if o.no_decay is not None:
        args += ["--no-decay", *o.no_decay]
    if m.layer_norm_large_model:
        args.append("--layer-norm-large-model")
    return tuple(args)


def build(spec: JobSpec) -> Launch:
    r = spec.recipe
    if r.checkpoint.every_steps is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the BERT program "
                          "checkpoints by step only; set checkpoint.every_steps")
    data_dir = spec.data_path(r.data.path)
    workdir = posixpath.join(spec.payload_dir, "habana_deepspeed")
    return Launch(stop_signal=STOP_SIGNAL, launcher="habana_deepspeed/launch.sh", workdir=workdir,
                  program="pretrain_bert.py", compile_wrapper="",
                  compile_args=arguments(spec, "compile", data_dir),
                  train_args=arguments(spec, "train", data_dir))


_DATA_PARALLEL_ONLY = "the DeepSpeed BERT program is data-parallel only"

PAYLOAD = Payload(
    name="habana_deepspeed",
    accelerator="hpu",
    families=("bert",),
    honours=COMMON_KEYS | {
        "model.vocab_size", "model.max_predictions", "model.hidden_dropout",
        "model.attention_dropout", "model.layernorm_epsilon", "model.init_method_std",
        "model.layer_norm_large_model", "parallelism.zero1", "optim.eps", "optim.no_decay",
        "schedule.min_lr", "schedule.decay_steps",
    },
    build=build,
    fixed={"parallelism.tensor": Fixed(1, _DATA_PARALLEL_ONLY),
           "parallelism.pipeline": Fixed(1, _DATA_PARALLEL_ONLY)},
    refused_values={"precision": {"bf16_sr": "Gaudi's bf16 has no stochastic-rounding switch "
                                             "in this program; use bf16"}},
)
