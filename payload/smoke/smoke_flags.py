"""The stand-in trainer's (train.py's) flags and their checks: the shared trainer flags with a
tiny model's defaults, the decay shape under both programs' names, the index folder, and the
prepared dataset to read instead of made-up batches."""
from __future__ import annotations

import argparse
from pathlib import Path

from common import args as shared
from common.runtime import PayloadError, require_positive
from common.schedule import DECAY_SHAPES


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The stand-in's flags: the shared ones (common/args.py), defaulted to a tiny model."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    shared.add(p, ("family", "num-layers", "hidden-size", "num-heads", "intermediate-size",
                   "seq-length", "vocab-size", "micro-batch-size", "gradient-accumulation", "lr",
                   "min-lr", "warmup-steps"),
               defaults={"family": "gpt_neox", "num-layers": 2, "hidden-size": 64,
                         "num-heads": 4, "seq-length": 32, "vocab-size": 512,
                         "micro-batch-size": 4, "lr": 3e-3, "min-lr": 3e-4, "warmup-steps": 2},
               notes={"intermediate-size": "default 4 × hidden"})
    p.add_argument("--decay", "--schedule", dest="decay", choices=DECAY_SHAPES, default="cosine",
                   help="shape of the decay after warmup and hold (--schedule: the NxD "
                        "program's name for it)")
    shared.add(p, ("constant-steps", "decay-steps", "beta1", "beta2", "eps", "no-decay",
                   "init-std", "scaled-init", "max-steps", "weight-decay", "grad-clip", "seed",
                   "phase", "compile-steps", "steps", "checkpoint-every", "keep-checkpoints",
                   "sync-save", "output-dir"),
               defaults={"beta2": 0.95, "max-steps": 20, "weight-decay": 0.01,
                         "checkpoint-every": 10},
               notes={"no-decay": "absent: matrices are decayed, vectors are not"})
    p.add_argument("--index-dir", type=Path, default=None,
                   help="build (global rank 0) and read (every rank) a sample index file here "
                        "first, as NeMo's GPT dataset does (indexed_data.py); on nodes with "
                        "disks of their own, each node builds its own (common/node_indices.py)")
    p.add_argument("--data-format", choices=("megatron", "hf_blocks"), default=None,
                   help="train on a prepared dataset (prepared_data.py) instead of made-up "
                        "batches: megatron with --data-prefix, hf_blocks with --data-dir")
    p.add_argument("--data-prefix", nargs="+", default=None,
                   help="megatron: the .bin/.idx prefixes (the recipe's data.path, or its "
                        "shards), read one after another")
    shared.add(p, ("data-dir",))    # hf_blocks: the folder saved with save_to_disk
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def validate(args: argparse.Namespace) -> None:
    positive = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "seq_length",
                "micro_batch_size", "gradient_accumulation", "max_steps", "compile_steps",
                "checkpoint_every", "keep_checkpoints")
    require_positive(args, positive)
    if args.hidden_size % args.num_heads:
        raise PayloadError(f"--hidden-size {args.hidden_size} is not divisible by "
                           f"--num-heads {args.num_heads}")
    if args.vocab_size < 16:
        raise PayloadError("--vocab-size must be at least 16")
    if args.warmup_steps < 0 or args.warmup_steps > args.max_steps:
        raise PayloadError("--warmup-steps must lie in [0, --max-steps]")
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")
    need = {"megatron": "data_prefix", "hf_blocks": "data_dir"}.get(args.data_format or "")
    for name in ("data_prefix", "data_dir"):
        flag = "--" + name.replace("_", "-")
        if getattr(args, name) is not None and name != need:
            raise PayloadError(f"{flag} goes with --data-format "
                               f"{'megatron' if name == 'data_prefix' else 'hf_blocks'}")
        if name == need and not getattr(args, name):
            raise PayloadError(f"--data-format {args.data_format} needs {flag}")
