"""What the Llama program (train_llama.py) settles before torch_xla starts, importable anywhere:
its flags and their checks, the NxD example checkout's folders on sys.path, and the precision
variables torch_xla, NxD and the Neuron runtime read when they start.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from common import args as shared
from common.runtime import PayloadError, require_positive

UPSTREAM_MODULES = ("modeling_llama_nxd.py", "training_utils.py")  # in the example's parent


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The program's flags: the shared ones (common/args.py) and the NxD example's own."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    where = p.add_argument_group("where")
    where.add_argument("--example-dir", type=Path, required=True,
                       help="the NxD example folder (tp_zero1_llama_hf_pretrain) of a checkout")
    where.add_argument("--model-config", type=Path, required=True,
                       help="Hugging Face LlamaConfig JSON")
    shared.add(where, ("data-dir", "output-dir"), required=("data-dir", "output-dir"),
               notes={"data-dir": "the NxD example's"})
    where.add_argument("--checkpoint-dir", type=Path, default=None)
    run = p.add_argument_group("run")
    shared.add(run, ("phase", "compile-steps", "steps", "max-steps", "checkpoint-every",
                     "keep-checkpoints", "sync-save", "log-every", "seed"),
               required=("max-steps",), defaults={"keep-checkpoints": 5, "seed": 12349})
    par = p.add_argument_group("parallelism and precision")
    par.add_argument("--tensor-parallel-size", type=int, default=8)
    shared.add(par, ("micro-batch-size", "gradient-accumulation", "seq-length"),
               defaults={"seq-length": 4096})
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument("--selective-checkpoint", action="store_true")
    par.add_argument("--zero1", action="store_true")
    par.add_argument("--precision", choices=("bf16_sr", "bf16", "fp32"), default="bf16_sr")
    opt = p.add_argument_group("optimizer and schedule")
    shared.add(opt, ("lr", "min-lr", "warmup-steps", "constant-steps", "decay-steps", "schedule",
                     "beta1", "beta2", "eps", "weight-decay", "no-decay", "grad-clip",
                     "init-std", "scaled-init"),
               required=("lr",),
               notes={"no-decay": "absent: biases and norms are not, as in the NxD example"})
    return p


def validate(args: argparse.Namespace) -> None:
    require_positive(args, ("compile_steps", "max_steps", "checkpoint_every", "keep_checkpoints",
                            "log_every", "tensor_parallel_size", "micro_batch_size",
                            "gradient_accumulation", "seq_length"))
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")
    for name in ("lr", "eps", "init_std"):
        if not getattr(args, name) > 0:
            raise PayloadError(f"--{name.replace('_', '-')} must be positive")
    if not 0.0 <= args.min_lr <= args.lr:
        raise PayloadError("--min-lr must lie between 0 and --lr")
    if not (0.0 <= args.beta1 < 1.0 and 0.0 <= args.beta2 < 1.0):
        raise PayloadError("--beta1 and --beta2 must lie in [0, 1)")
    if args.weight_decay < 0 or args.grad_clip <= 0:
        raise PayloadError("--weight-decay must be >= 0 and --grad-clip positive")
    hold = args.warmup_steps + args.constant_steps
    if min(args.warmup_steps, args.constant_steps) < 0 or hold > args.max_steps:
        raise PayloadError("--warmup-steps + --constant-steps must lie within --max-steps")
    if args.decay_steps is not None and not hold <= args.decay_steps <= args.max_steps:
        raise PayloadError(f"--decay-steps must lie between the end of warmup and hold ({hold}) "
                           "and --max-steps")
    if uses_master_weights(args.precision) and not args.zero1:
        raise PayloadError("--precision bf16 keeps FP32 master weights, which NxD holds only in "
                           "its ZeRO-1 optimizer: add --zero1 (or use --precision bf16_sr)")
    if args.phase == "train" and args.checkpoint_dir is None:
        raise PayloadError("--phase train needs --checkpoint-dir")
    if not args.model_config.is_file():
        raise PayloadError(f"--model-config {args.model_config}: no such file")
    if not args.data_dir.is_dir():
        raise PayloadError(f"--data-dir {args.data_dir}: no such folder")
    example_folders(args.example_dir)


def example_folders(example_dir: Path) -> tuple[Path, Path]:
    """(the example folder, its parent holding the model and data modules) of a checkout."""
    parent = example_dir.resolve().parent
    missing = [name for name in UPSTREAM_MODULES if not (parent / name).is_file()]
    if not example_dir.is_dir() or missing:
        raise PayloadError(f"--example-dir {example_dir}: not the NxD Llama example folder of a "
                           f"checkout (its parent lacks {', '.join(missing) or 'the example'})")
    return example_dir.resolve(), parent


def use_example(example_dir: Path) -> None:
    """Make the example's model and data modules importable from a plain checkout."""
    for folder in example_folders(example_dir):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def precision_environment(precision: str) -> dict[str, str | None]:
    """The variables torch_xla, NxD and the Neuron runtime read at start-up, decided as the NxD
    example decides them (None: the variable must be absent, since some NxD code tests only
    whether it is set):

    - bf16_sr: everything in BF16 (XLA_USE_BF16) with stochastic rounding, no master weights
      (the example with --use_gpu_compatible_precision 0, no --use_mix_precision);
    - bf16: BF16 compute with FP32 master weights, FP32 gradient accumulation and optimizer
      states (XLA_DOWNCAST_BF16), rounding to nearest (the example's default, "GPU-compatible
      precision" with --use_mix_precision);
    - fp32: neither.
    """
    return {"XLA_USE_BF16": "1" if precision == "bf16_sr" else None,
            "XLA_DOWNCAST_BF16": "1" if precision == "bf16" else None,
            "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1" if precision == "bf16_sr" else "0"}


def apply_precision_environment(precision: str, environ: Any = os.environ) -> None:
    for name, value in precision_environment(precision).items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def uses_master_weights(precision: str) -> bool:
    """FP32 master weights and gradient accumulation (NxD's mixed_precision_config through the
    example's get_mixed_precision_config) only in the bf16 mode."""
    return precision == "bf16"


def patch_for_bf16(torch: Any, precision: str) -> None:
    """What the NxD example does at import time, kept: autocast may ask whether BF16 is
    supported (it is on Neuron), and under BF16 Hugging Face must see the model's dtype as BF16
    (its attention masks take the dtype's minimum; the FP32 minimum overflows BF16 to -inf and
    the loss turns NaN: aws-neuron-sdk issue 593)."""
    torch.cuda.is_bf16_supported = lambda *a, **k: True
    if precision in ("bf16", "bf16_sr"):
        import transformers.modeling_utils as modeling_utils

        modeling_utils.get_parameter_dtype = lambda module: torch.bfloat16
