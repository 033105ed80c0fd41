"""train_fsdp.py's flags and their checks: the model, the schedule, the parallelism (tensor
parallel, the hybrid-shard degree as SMP v2 reads it) and the pass, refused in one line before
any process group starts."""
from __future__ import annotations

import argparse

from common import args as shared
from common.runtime import PayloadError, require_positive
from common.schedule import DECAY_SHAPES


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The program's flags: the shared ones (common/args.py) and FSDP's and SMP's own."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    shared.add(p, ("family", "num-layers", "hidden-size", "num-heads"),
               required=("family", "num-layers", "hidden-size", "num-heads"))
    p.add_argument("--num-kv-heads", type=int, default=None)
    shared.add(p, ("intermediate-size", "seq-length", "max-position-embeddings", "vocab-size"),
               required=("intermediate-size", "seq-length", "vocab-size"))
    p.add_argument("--rope-theta", type=float, default=None)
    p.add_argument("--norm-eps", type=float, default=None)
    p.add_argument("--rotary-pct", type=float, default=None,
                   help="GPT-NeoX: the share of each head's dimensions that is rotated")
    shared.add(p, ("micro-batch-size", "gradient-accumulation", "lr", "min-lr", "warmup-steps",
                   "constant-steps"),
               required=("micro-batch-size", "gradient-accumulation", "lr"))
    p.add_argument("--decay", choices=DECAY_SHAPES, default="cosine",
                   help="shape of the decay after warmup and hold")
    shared.add(p, ("decay-steps", "beta1", "beta2", "eps", "weight-decay", "no-decay",
                   "grad-clip", "init-std", "scaled-init"),
               defaults={"beta2": 0.95})
    p.add_argument("--tensor-parallel", type=int, default=1)
    p.add_argument("--hybrid-shard", type=int, default=0,
                   help="data-parallel ranks per sharding group (0: SMP's default: every "
                        "data-parallel rank with tensor parallelism, else one node's ranks)")
    p.add_argument("--activation-checkpointing", choices=("none", "selective", "full"),
                   default="none")
    p.add_argument("--activation-offloading", action="store_true")
    p.add_argument("--activation-loading-horizon", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    data = p.add_mutually_exclusive_group(required=True)
    shared.add(data, ("data-dir",))
    data.add_argument("--synthetic", action="store_true", help="the rehearsal's token stream")
    shared.add(p, ("max-steps", "seed", "phase", "compile-steps", "steps", "checkpoint-every",
                   "keep-checkpoints", "sync-save", "log-every", "output-dir"),
               required=("max-steps", "checkpoint-every", "output-dir"),
               defaults={"log-every": 1})
    return p


def validate(args: argparse.Namespace, world: int, local_world: int) -> None:
    require_positive(args, (
        "num_layers", "hidden_size", "num_heads", "intermediate_size", "seq_length",
        "micro_batch_size", "gradient_accumulation", "max_steps", "compile_steps",
        "checkpoint_every", "keep_checkpoints", "tensor_parallel", "log_every"))
    if args.hidden_size % args.num_heads:
        raise PayloadError(f"--hidden-size {args.hidden_size} is not divisible by --num-heads "
                           f"{args.num_heads}")
    shard = shard_or_default(args.hybrid_shard, world, args.tensor_parallel, local_world)
    if world % (shard * args.tensor_parallel):
        raise PayloadError(f"--hybrid-shard {shard} x --tensor-parallel {args.tensor_parallel} "
                           f"does not divide the {world} ranks")
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")


def shard_or_default(shard: int, world: int, tp: int, local_world: int) -> int:
    """The hybrid-shard degree, 0 read as SMP v2 reads it: with tensor parallelism, every
    data-parallel rank; without, FSDP's HYBRID_SHARD (one node's ranks)."""
    return shard or (world // tp if tp > 1 else local_world)
