"""pretrain_bert.py's flags and their checks: the model, the data, the optimizer and its
schedule (warmup and hold as proportions of --max-steps), the pass; refused in one line before
DeepSpeed starts."""
from __future__ import annotations

import argparse
from pathlib import Path

from common import args as shared
from common.runtime import PayloadError, require_positive
from common.schedule import steps_from_proportion


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The program's flags: the shared ones (common/args.py) and BERT's and DeepSpeed's own."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    model = p.add_argument_group("model")
    shared.add(model, ("num-layers", "hidden-size", "num-heads", "intermediate-size",
                       "vocab-size", "max-position-embeddings"),
               required=("num-layers", "hidden-size", "num-heads", "intermediate-size",
                         "vocab-size"),
               defaults={"max-position-embeddings": 512})
    model.add_argument("--type-vocab-size", type=int, default=2)
    model.add_argument("--hidden-dropout", type=float, default=0.1)
    model.add_argument("--attention-dropout", type=float, default=0.1)
    model.add_argument("--layer-norm-eps", type=float, default=1e-12)
    shared.add(model, ("init-std",))
    model.add_argument("--layer-norm-large-model", action="store_true",
                       help="the LayerNorm placement of Model-References' large BERT configs "
                            "(bert_topology.py)")
    data = p.add_argument_group("data")
    data.add_argument("--input-dir", type=Path, required=True,
                      help="directory of hdf5 shards; files whose name contains 'training'")
    shared.add(data, ("seq-length",), defaults={"seq-length": 128})
    data.add_argument("--max-predictions", type=int, default=20)
    train = p.add_argument_group("training")
    shared.add(train, ("micro-batch-size", "gradient-accumulation", "lr"),
               required=("micro-batch-size", "lr"))
    train.add_argument("--warmup", type=float, default=0.0, help="proportion of --max-steps")
    train.add_argument("--constant", type=float, default=0.0, help="proportion of --max-steps")
    shared.add(train, ("max-steps", "min-lr", "decay-steps", "schedule"), required=("max-steps",),
               defaults={"schedule": "linear"})
    train.add_argument("--optimizer", choices=("lamb", "adamw"), default="lamb")
    shared.add(train, ("beta1", "beta2", "eps", "weight-decay", "no-decay", "grad-clip"),
               defaults={"eps": 1e-6, "weight-decay": 0.01},
               notes={"no-decay": "absent: the reference's list, bias gamma beta LayerNorm"})
    train.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=1)
    train.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    shared.add(train, ("seed",), defaults={"seed": 12439})
    run = p.add_argument_group("run")
    shared.add(run, ("phase", "compile-steps", "steps", "checkpoint-every", "keep-checkpoints",
                     "output-dir"))
    run.add_argument("--accelerator", choices=("auto", "hpu", "cuda", "cpu"), default="auto")
    # The deepspeed launcher appends --local_rank=N unless run with --no_local_rank; env wins.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def validate(args: argparse.Namespace) -> None:
    positive = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size",
                "seq_length", "max_predictions", "micro_batch_size", "gradient_accumulation",
                "max_steps", "compile_steps", "checkpoint_every", "keep_checkpoints")
    require_positive(args, positive)
    if args.hidden_size % args.num_heads:
        raise PayloadError(f"--hidden-size {args.hidden_size} is not divisible by "
                           f"--num-heads {args.num_heads}")
    if args.seq_length > args.max_position_embeddings:
        raise PayloadError("--seq-length exceeds --max-position-embeddings")
    if args.warmup + args.constant > 1.0 or min(args.warmup, args.constant) < 0:
        raise PayloadError("--warmup and --constant must be >= 0 and sum to at most 1")
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")
    for name in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= getattr(args, name) < 1.0:
            raise PayloadError(f"--{name.replace('_', '-')} must lie in [0, 1)")
    for name in ("layer_norm_eps", "init_std", "eps"):
        if not getattr(args, name) > 0:
            raise PayloadError(f"--{name.replace('_', '-')} must be positive")
    if not (0.0 <= args.beta1 < 1.0 and 0.0 <= args.beta2 < 1.0):
        raise PayloadError("--beta1 and --beta2 must lie in [0, 1)")
    if not 0.0 <= args.min_lr <= args.lr:
        raise PayloadError("--min-lr must lie between 0 and --lr")
    hold = (steps_from_proportion(args.warmup, args.max_steps)
            + steps_from_proportion(args.constant, args.max_steps))
    if args.decay_steps is not None and not hold <= args.decay_steps <= args.max_steps:
        raise PayloadError(f"--decay-steps must lie between the end of warmup and hold ({hold}) "
                           "and --max-steps")
