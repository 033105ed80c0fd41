"""jobgen's own BERT pretraining program (payload/habana_deepspeed/pretrain_bert.py): DeepSpeed
ZeRO-1 on Gaudi (HPU), CUDA or CPU, data-parallel only. Every model, optimizer and schedule
value of a BERT recipe is one of its flags."""
from __future__ import annotations

import posixpath

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError
from . import flags
from .base import COMMON_KEYS, STOP_SIGNAL, Fixed, Launch, Pass, Payload, number

# The program's flags in the order they are written: the shared ones (flags.py) and its own.
ORDER = (
    "input-dir", "output-dir", "num-layers", "hidden-size", "num-heads", "intermediate-size",
    "vocab-size", "max-position-embeddings", "seq-length", "max-predictions", "hidden-dropout",
    "attention-dropout", "layer-norm-eps", "init-std", "micro-batch-size",
    "gradient-accumulation", "lr", "min-lr", "warmup", "constant", "max-steps", "decay-steps",
    "schedule", "optimizer", "beta1", "beta2", "eps", "weight-decay", "grad-clip", "zero-stage",
    "precision", "seed", "checkpoint-every", "keep-checkpoints", "phase", "compile-steps",
    "accelerator", "no-decay", "layer-norm-large-model",
)


def arguments(spec: JobSpec, which: Pass, data_dir: str) -> tuple[str, ...]:
    r = spec.recipe
    m, p, o, s = r.model, r.parallelism, r.optim, r.schedule
    return tuple(flags.render(ORDER, flags.shared(spec, which), {
        "input-dir": data_dir,
        "max-predictions": str(m.max_predictions or 20),
        "hidden-dropout": number(m.hidden_dropout),
        "attention-dropout": number(m.attention_dropout),
        "layer-norm-eps": number(m.layernorm_epsilon),
        # The program takes warmup and hold as proportions of the run.
        "warmup": repr(spec.warmup_steps / s.max_steps),
        "constant": repr(spec.constant_steps / s.max_steps),
        "optimizer": o.name,
        "zero-stage": "1" if p.zero1 else "0",
        "precision": "fp32" if r.precision == "fp32" else "bf16",
        "accelerator": "cpu" if spec.smoke else "auto",
        "layer-norm-large-model": bool(m.layer_norm_large_model),
    }))


def build(spec: JobSpec) -> Launch:
    r = spec.recipe
    if r.checkpoint.every_steps is None:
        raise ConfigError(f"{spec.source}: checkpoint.every_seconds: the BERT program "
                          "checkpoints by step only; set checkpoint.every_steps")
    # Habana's DeepSpeed 1.16.0 (DeepSpeed 0.14.0) has no non-blocking save: its checkpoint
    # engines are torch.save and Nebula, which needs Azure's torch_nebula service; the async
    # and decoupled engines came in later DeepSpeed releases. Its saves stay synchronous.
    if r.checkpoint.async_save:
        raise ConfigError(f"{spec.source}: checkpoint.async_save: DeepSpeed on Gaudi (Habana's "
                          "1.16.0 fork) has no background save; leave it unset or false")
    data_dir = spec.data_path(r.data.path)
    workdir = posixpath.join(spec.payload_dir, "habana_deepspeed")
    return Launch(stop_signal=STOP_SIGNAL, launcher="habana_deepspeed/launch.sh", workdir=workdir,
                  program="pretrain_bert.py", compile_wrapper="",
                  compile_args=arguments(spec, "compile", data_dir),
                  train_args=arguments(spec, "train", data_dir))


_DATA_PARALLEL_ONLY = "the DeepSpeed BERT program is data-parallel only"

PAYLOAD = Payload(
    name="habana_deepspeed",
    data=("bert_hdf5",),
    accelerator="hpu",
    families=("bert",),
    honours=COMMON_KEYS | {
        "data.tokenizer",                       # the prepare stage's (prepare_tokenized.py)
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
