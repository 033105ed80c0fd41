"""jobgen's Llama pretraining program on NeuronX Distributed (Trainium).

It uses the model and data format of the NxD Llama example (modeling_llama_nxd.LlamaForCausalLM,
training_utils' rotary tables and mixed-precision settings, the tokenized dataset its
get_dataset.py writes) and owns the loop, so that a recipe trains what it says: AdamW with the
recipe's betas and eps, weight decay on the parameters the recipe names, a warmup/hold/decay
schedule with min_lr and decay steps (cosine or linear), scaled initialisation of the output
projections, ZeRO-1, sequence parallelism, selective activation checkpointing, BF16 with
stochastic rounding, and checkpoint/resume through NxD's own checkpoint API that continues the
data stream where it stopped (the upstream example restarts its epoch).

The same step/checkpoint contract as every jobgen payload (payload/common/loop.py):
``--phase compile`` runs exactly ``--compile-steps`` steps from a fresh model and writes
nothing; ``--phase train`` resumes from the newest checkpoint, saves every K steps and at the
end, keeps the newest M. The upstream folders come from ``--example-dir`` (the example's
tp_zero1_llama_hf_pretrain folder of a plain checkout; its parent holds the model and data
modules): no symlinks are needed. torch_xla, neuronx_distributed and the upstream modules are
imported only when training starts, so parsing and validating the flags work anywhere.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

# Running as a script: make ``payload/`` importable for ``common``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.events import EventLog, open_tensorboard
from common.init import scale_output_projections
from common.loop import run_invocation
from common.optim import parameter_groups
from common.runtime import PayloadError, batch_positions, run_main
from common.schedule import DECAY_SHAPES, learning_rate

PROG = "train-llama"
UPSTREAM_MODULES = ("modeling_llama_nxd.py", "training_utils.py")  # in the example's parent
OUTPUT_PROJECTIONS = ("o_proj", "down_proj")  # they write into the residual stream
EXAMPLE_NO_DECAY = ("bias", "norm")           # the example's rule, when the recipe names none
CHECKPOINT_WORKERS = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    where = p.add_argument_group("where")
    where.add_argument("--example-dir", type=Path, required=True,
                       help="the NxD example folder (tp_zero1_llama_hf_pretrain) of a checkout")
    where.add_argument("--model-config", type=Path, required=True,
                       help="Hugging Face LlamaConfig JSON")
    where.add_argument("--data-dir", type=Path, required=True,
                       help="tokenized dataset (datasets.save_to_disk) of the example")
    where.add_argument("--output-dir", type=Path, required=True)
    where.add_argument("--checkpoint-dir", type=Path, default=None)
    run = p.add_argument_group("run")
    run.add_argument("--phase", choices=("compile", "train"), default="train")
    run.add_argument("--compile-steps", type=int, default=3)
    run.add_argument("--steps", type=int, default=-1,
                     help="optimizer steps this invocation may run (-1: until --max-steps)")
    run.add_argument("--max-steps", type=int, required=True)
    run.add_argument("--checkpoint-every", type=int, default=1000)
    run.add_argument("--keep-checkpoints", type=int, default=5)
    run.add_argument("--log-every", type=int, default=10)
    run.add_argument("--seed", type=int, default=12349)
    par = p.add_argument_group("parallelism and precision")
    par.add_argument("--tensor-parallel-size", type=int, default=8)
    par.add_argument("--micro-batch-size", type=int, default=1)
    par.add_argument("--gradient-accumulation", type=int, default=1)
    par.add_argument("--seq-length", type=int, default=4096)
    par.add_argument("--sequence-parallel", action="store_true")
    par.add_argument("--selective-checkpoint", action="store_true")
    par.add_argument("--zero1", action="store_true")
    par.add_argument("--precision", choices=("bf16_sr", "bf16", "fp32"), default="bf16_sr")
    opt = p.add_argument_group("optimizer and schedule")
    opt.add_argument("--lr", type=float, required=True)
    opt.add_argument("--min-lr", type=float, default=0.0)
    opt.add_argument("--warmup-steps", type=int, default=0)
    opt.add_argument("--constant-steps", type=int, default=0)
    opt.add_argument("--decay-steps", type=int, default=None,
                     help="step at which the decay reaches --min-lr (default: --max-steps)")
    opt.add_argument("--schedule", choices=DECAY_SHAPES, default="cosine")
    opt.add_argument("--beta1", type=float, default=0.9)
    opt.add_argument("--beta2", type=float, default=0.999)
    opt.add_argument("--eps", type=float, default=1e-8)
    opt.add_argument("--weight-decay", type=float, default=0.0)
    opt.add_argument("--no-decay", nargs="*", default=None, metavar="FRAGMENT",
                     help="parameters whose names contain one of these get no weight decay "
                          "(given with none: every parameter is decayed; absent: biases and "
                          "norms are not, as in the NxD example)")
    opt.add_argument("--grad-clip", type=float, default=1.0)
    opt.add_argument("--init-std", type=float, default=0.02)
    opt.add_argument("--scaled-init", action="store_true",
                     help="output projections at --init-std / sqrt(2 x layers)")
    return p.parse_args(argv)


def validate(args: argparse.Namespace) -> None:
    for name in ("compile_steps", "max_steps", "checkpoint_every", "keep_checkpoints",
                 "log_every", "tensor_parallel_size", "micro_batch_size",
                 "gradient_accumulation", "seq_length"):
        if getattr(args, name) < 1:
            raise PayloadError(f"--{name.replace('_', '-')} must be at least 1")
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
    if args.phase == "train" and args.checkpoint_dir is None:
        raise PayloadError("--phase train needs --checkpoint-dir")
    if not args.model_config.is_file():
        raise PayloadError(f"--model-config {args.model_config}: no such file")


def use_example(example_dir: Path) -> None:
    """Make the example's model and data modules importable from a plain checkout."""
    parent = example_dir.resolve().parent
    missing = [name for name in UPSTREAM_MODULES if not (parent / name).is_file()]
    if not example_dir.is_dir() or missing:
        raise PayloadError(f"--example-dir {example_dir}: not the NxD Llama example folder of a "
                           f"checkout (its parent lacks {', '.join(missing) or 'the example'})")
    for path in (str(example_dir.resolve()), str(parent)):
        if path not in sys.path:
            sys.path.insert(0, path)


def precision_environment(precision: str) -> dict[str, str]:
    """What torch_xla and the Neuron runtime read at start-up, as the example sets it:
    BF16 everywhere (XLA_USE_BF16) with stochastic rounding for bf16_sr; bf16 without rounding
    keeps FP32 master weights (the example's "GPU-compatible precision"); fp32 is fp32."""
    return {"XLA_USE_BF16": "0" if precision == "fp32" else "1",
            "NEURON_RT_STOCHASTIC_ROUNDING_EN": "1" if precision == "bf16_sr" else "0"}


def sample_rows(positions: list[int], dataset_rows: int) -> list[int]:
    """Dataset rows for stream positions (the stream repeats the dataset epoch after epoch)."""
    return [p % dataset_rows for p in positions]


class LlamaRunner:
    """One invocation on Trainium (a ``common.loop.Runner``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        os.environ.update(precision_environment(args.precision))
        use_example(args.example_dir)
        import datasets
        import neuronx_distributed as nxd
        import torch
        import torch.distributed as dist
        import torch_xla.core.xla_model as xm
        from modeling_llama_nxd import CoreAttention
        from neuronx_distributed.parallel_layers import parallel_state
        from neuronx_distributed.parallel_layers.utils import requires_init_pg_override
        from neuronx_distributed.utils.adamw_fp32_optim_params import AdamW_FP32OptimParams
        from training_utils import get_mixed_precision_config
        from transformers import set_seed

        if requires_init_pg_override():
            import torch_xla.experimental.pjrt_backend  # noqa: F401  (registers pjrt://)
            dist.init_process_group("xla", init_method="pjrt://")
        else:
            dist.init_process_group("xla")
        set_seed(args.seed)
        self.args, self.torch, self.xm, self.nxd = args, torch, xm, nxd
        self.parallel_state = parallel_state
        config = nxd.neuronx_distributed_config(
            tensor_parallel_size=args.tensor_parallel_size,
            optimizer_config={"zero_one_enabled": args.zero1, "grad_clipping": True,
                              "max_grad_norm": args.grad_clip},
            sequence_parallel=args.sequence_parallel,
            activation_checkpoint_config=CoreAttention if args.selective_checkpoint else None,
            mixed_precision_config=get_mixed_precision_config(args.precision != "bf16_sr"),
        )
        self.model = nxd.initialize_parallel_model(config, self._build_model)
        no_decay = EXAMPLE_NO_DECAY if args.no_decay is None else tuple(args.no_decay)
        groups = parameter_groups(self.model.named_parameters(), args.weight_decay, no_decay)
        self.optimizer = nxd.initialize_parallel_optimizer(
            config, AdamW_FP32OptimParams, groups, lr=args.lr, betas=(args.beta1, args.beta2),
            eps=args.eps, weight_decay=args.weight_decay)
        self.optimizer.zero_grad()
        self.device = xm.xla_device()
        self.dp_size = parallel_state.get_data_parallel_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.data = datasets.load_from_disk(str(args.data_dir))
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * self.dp_size
        self.training = args.phase == "train"
        # Every rank makes the folder before anyone opens a file in it (the upstream example
        # created only its output folder and crashed opening a metrics file elsewhere).
        args.output_dir.mkdir(parents=True, exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        self.log = EventLog(rank, args.output_dir / "metrics.jsonl" if self.training else None)
        self.tensorboard = (open_tensorboard(args.output_dir / "tensorboard", self.log)
                            if self.training and rank == 0 else None)
        self.step, self.consumed = 0, 0
        self.log.emit("start", phase=args.phase, data_parallel=self.dp_size,
                      global_batch_size=self.global_batch, rows=len(self.data),
                      precision=args.precision, zero1=args.zero1)

    def _build_model(self) -> Any:
        from modeling_llama_nxd import LlamaForCausalLM
        from training_utils import get_sin_cos_matrix
        from transformers import LlamaConfig

        args = self.args
        config = LlamaConfig.from_json_file(str(args.model_config))
        config.use_cache = False
        config.max_position_embeddings = max(config.max_position_embeddings, args.seq_length)
        config.sequence_parallel_enabled = args.sequence_parallel
        config.selective_checkpoint_enabled = args.selective_checkpoint
        config.kv_shared_group_size = 1
        config.qkv_linear = False
        config.use_flash_attention = True
        config.initializer_range = args.init_std
        model = LlamaForCausalLM(config)
        with self.torch.no_grad():
            cos, sin = get_sin_cos_matrix(config)
            for layer in model.model.layers:
                layer.self_attn.rotary_emb.cos_cached = cos
                layer.self_attn.rotary_emb.sin_cached = sin
        if args.scaled_init:
            # Each tensor-parallel rank holds its own shard: draw it from its own stream.
            generator = self.torch.Generator().manual_seed(
                args.seed * 1009 + self.parallel_state.get_tensor_model_parallel_rank())
            scale_output_projections(model, OUTPUT_PROJECTIONS, args.init_std,
                                     config.num_hidden_layers, generator)
        return model

    def _micro_batches(self) -> list[dict[str, Any]]:
        from transformers import default_data_collator

        rows = len(self.data)
        batches = []
        for positions in batch_positions(self.consumed, self.args.micro_batch_size,
                                         self.args.gradient_accumulation, self.dp_size,
                                         self.dp_rank):
            batch = default_data_collator([self.data[r] for r in sample_rows(positions, rows)])
            batches.append({k: v.to(self.device) for k, v in batch.items()})
        return batches

    def train_step(self) -> dict[str, Any]:
        args, torch, xm = self.args, self.torch, self.xm
        lr = learning_rate(self.step, peak_lr=args.lr, max_steps=args.max_steps,
                           warmup_steps=args.warmup_steps, constant_steps=args.constant_steps,
                           min_lr=args.min_lr, decay=args.schedule,
                           decay_steps=args.decay_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        running = torch.zeros(1, dtype=torch.double, device=self.device)
        for batch in self._micro_batches():
            loss = self.model(**batch).loss / args.gradient_accumulation
            loss.backward()
            running += loss.detach()
        xm.mark_step()
        loss_sum = xm.all_reduce(xm.REDUCE_SUM, running / self.dp_size,
                                 groups=self.parallel_state.get_data_parallel_group(as_list=True))
        self.optimizer.step()
        norm = self.optimizer.grad_norm  # the global norm before clipping
        self.optimizer.zero_grad()
        xm.mark_step()
        self.step += 1
        self.consumed += self.global_batch
        numbers: dict[str, Any] = {"lr": lr}
        if self.step % args.log_every == 0 or self.step == 1:
            # Reading values back syncs with the device: only every --log-every steps.
            numbers.update(loss=float(loss_sum.cpu().item()), grad_norm=float(norm.cpu().item()),
                           seconds=time.perf_counter() - started)
        return numbers

    def save(self) -> None:
        self.nxd.save_checkpoint(
            str(self.args.checkpoint_dir), f"step_{self.step}", model=self.model,
            optimizer=self.optimizer, scheduler=None,
            user_content={"global_step": self.step, "consumed_samples": self.consumed},
            num_workers=CHECKPOINT_WORKERS, use_xser=True,
            num_kept_ckpts=self.args.keep_checkpoints)
        self.log.emit("checkpoint", step=self.step, path=str(self.args.checkpoint_dir))

    def resume(self) -> None:
        directory = str(self.args.checkpoint_dir)
        if not self.nxd.has_checkpoint(directory):
            return
        content = self.nxd.load_checkpoint(directory, tag=None, model=self.model,
                                           optimizer=self.optimizer, scheduler=None)
        self.step = int(content["global_step"])
        self.consumed = int(content["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    validate(args)
    runner = LlamaRunner(args)
    run_invocation(runner, args)
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
