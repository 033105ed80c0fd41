"""BERT phase-1 pretraining with DeepSpeed on Gaudi (HPU), CUDA or CPU.

Run under torchrun, the deepspeed launcher, or alone (one process). ``--phase compile`` runs
``--compile-steps`` optimizer steps from a fresh model and touches no files; ``--phase train``
resumes from the newest complete checkpoint under ``--output-dir`` and trains on. Rank 0 prints one
JSON object per line for every event (see common/events.py).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

# Running as a script: make ``payload/`` (for ``common``) and this directory importable.
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

from common import checkpoints  # noqa: E402
from common.events import EventLog  # noqa: E402
from common.runtime import (PayloadError, batch_positions, dist_coords,  # noqa: E402
                            ensure_process_env, run_main, step_seed)
from common.schedule import learning_rate, steps_from_proportion  # noqa: E402

PROG = "pretrain_bert"


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    model = p.add_argument_group("model")
    model.add_argument("--num-layers", type=int, required=True)
    model.add_argument("--hidden-size", type=int, required=True)
    model.add_argument("--num-heads", type=int, required=True)
    model.add_argument("--intermediate-size", type=int, required=True)
    model.add_argument("--vocab-size", type=int, required=True)
    model.add_argument("--max-position-embeddings", type=int, default=512)
    model.add_argument("--type-vocab-size", type=int, default=2)
    data = p.add_argument_group("data")
    data.add_argument("--input-dir", type=Path, required=True,
                      help="directory of hdf5 shards; files whose name contains 'training'")
    data.add_argument("--seq-length", type=int, default=128)
    data.add_argument("--max-predictions", type=int, default=20)
    train = p.add_argument_group("training")
    train.add_argument("--micro-batch-size", type=int, required=True)
    train.add_argument("--gradient-accumulation", type=int, default=1)
    train.add_argument("--lr", type=float, required=True)
    train.add_argument("--warmup", type=float, default=0.0, help="proportion of --max-steps")
    train.add_argument("--constant", type=float, default=0.0, help="proportion of --max-steps")
    train.add_argument("--max-steps", type=int, required=True)
    train.add_argument("--optimizer", choices=("lamb", "adamw"), default="lamb")
    train.add_argument("--weight-decay", type=float, default=0.01)
    train.add_argument("--grad-clip", type=float, default=1.0)
    train.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=1)
    train.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    train.add_argument("--seed", type=int, default=12439)
    run = p.add_argument_group("run")
    run.add_argument("--phase", choices=("compile", "train"), default="train")
    run.add_argument("--compile-steps", type=int, default=3)
    run.add_argument("--steps", type=int, default=-1,
                     help="optimizer steps this invocation may run (-1: until --max-steps)")
    run.add_argument("--checkpoint-every", type=int, default=1000)
    run.add_argument("--keep-checkpoints", type=int, default=3)
    run.add_argument("--output-dir", type=Path, default=Path("output"))
    run.add_argument("--accelerator", choices=("auto", "hpu", "cuda", "cpu"), default="auto")
    # The deepspeed launcher appends --local_rank=N unless run with --no_local_rank; env wins.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def validate(args: argparse.Namespace) -> None:
    positive = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size",
                "seq_length", "max_predictions", "micro_batch_size", "gradient_accumulation",
                "max_steps", "compile_steps", "checkpoint_every", "keep_checkpoints")
    for name in positive:
        if getattr(args, name) < 1:
            raise PayloadError(f"--{name.replace('_', '-')} must be at least 1")
    if args.hidden_size % args.num_heads:
        raise PayloadError(f"--hidden-size {args.hidden_size} is not divisible by "
                           f"--num-heads {args.num_heads}")
    if args.seq_length > args.max_position_embeddings:
        raise PayloadError("--seq-length exceeds --max-position-embeddings")
    if args.warmup + args.constant > 1.0 or min(args.warmup, args.constant) < 0:
        raise PayloadError("--warmup and --constant must be >= 0 and sum to at most 1")
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")


def deepspeed_config(args: argparse.Namespace, world_size: int) -> dict[str, Any]:
    """DeepSpeed's JSON config, derived from the flags so the two can never disagree."""
    return {
        "train_batch_size": args.micro_batch_size * args.gradient_accumulation * world_size,
        "train_micro_batch_size_per_gpu": args.micro_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation,
        "gradient_clipping": args.grad_clip,
        "zero_optimization": {"stage": args.zero_stage},
        "bf16": {"enabled": args.precision == "bf16"},
        # Our optimizer is a client object DeepSpeed does not know; ZeRO wants this opt-in.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,  # we log every step ourselves
        "wall_clock_breakdown": False,
    }


def schedule(args: argparse.Namespace, step: int) -> float:
    """Learning rate for the update after ``step`` completed steps (linear warmup/hold/decay)."""
    return learning_rate(step, peak_lr=args.lr, max_steps=args.max_steps,
                         warmup_steps=steps_from_proportion(args.warmup, args.max_steps),
                         constant_steps=steps_from_proportion(args.constant, args.max_steps))


def build_model(args: argparse.Namespace) -> Any:
    from transformers import BertConfig, BertForPreTraining

    config = BertConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                        num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
                        intermediate_size=args.intermediate_size,
                        max_position_embeddings=args.max_position_embeddings,
                        type_vocab_size=args.type_vocab_size)
    return BertForPreTraining(config)


class Trainer:
    """Owns the engine, the data and the step counters of one invocation."""

    def __init__(self, args: argparse.Namespace, files: list[Path]) -> None:
        import torch
        import torch.distributed as dist

        from accelerators import build_optimizer, choose_accelerator
        from bert_data import ShardedSamples

        self.args, self.torch, self.dist = args, torch, dist
        self.rank, self.world, local_rank = dist_coords()
        self.accel = choose_accelerator(args.accelerator, local_rank)
        import deepspeed  # only now: DS_ACCELERATOR is set
        import deepspeed.utils

        deepspeed.utils.logger.setLevel("WARNING")
        deepspeed.init_distributed(dist_backend=self.accel.backend)
        self.data = ShardedSamples(files, args.seq_length, args.max_predictions, args.seed)
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        model = build_model(args)
        self.optimizer, opt_name = build_optimizer(args.optimizer, model, self.accel, args.lr,
                                                   args.weight_decay)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=self.optimizer,
                                               config=deepspeed_config(args, self.world))
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * self.world
        self.ckpt_root = args.output_dir / "checkpoints"
        train = args.phase == "train"
        if train and self.rank == 0:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        self.log = EventLog(self.rank, args.output_dir / "metrics.jsonl" if train else None)
        self.log.emit("start", phase=args.phase, accelerator=self.accel.name,
                      device=str(self.accel.device), backend=self.accel.backend,
                      optimizer=opt_name, precision=args.precision, zero_stage=args.zero_stage,
                      world_size=self.world, global_batch_size=self.global_batch,
                      shards=len(files), samples=self.data.total)
        self.tensorboard = self._open_tensorboard() if train else None
        self.step, self.consumed = 0, 0

    def _open_tensorboard(self) -> Any:
        if self.rank != 0:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.log.emit("notice", message="tensorboard not installed; TensorBoard logging off")
            return None
        return SummaryWriter(str(self.args.output_dir / "tensorboard"))

    def _device_batch(self, positions: list[int]) -> dict[str, Any]:
        arrays = self.data.batch(positions)
        return {k: self.torch.from_numpy(v).to(self.accel.device) for k, v in arrays.items()}

    def train_step(self) -> dict[str, float]:
        """One optimizer step (all its micro-batches); returns the numbers for the step event."""
        torch, args = self.torch, self.args
        torch.manual_seed(step_seed(args.seed, self.step + 1, self.rank))
        lr = schedule(args, self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.accel.device)
        for positions in batch_positions(self.consumed, args.micro_batch_size,
                                         args.gradient_accumulation, self.world, self.rank):
            loss = self.engine(**self._device_batch(positions)).loss
            self.engine.backward(loss)
            self.accel.mark_step()
            self.engine.step()  # DeepSpeed only updates at the accumulation boundary
            self.accel.mark_step()
            loss_sum += loss.detach().float()
        self.dist.all_reduce(loss_sum)
        mean_loss = loss_sum.item() / (args.gradient_accumulation * self.world)
        elapsed = time.perf_counter() - started
        self.step += 1
        self.consumed += self.global_batch
        norm = self.engine.get_global_grad_norm()
        return {"loss": mean_loss, "grad_norm": float(norm) if norm is not None else None,
                "lr": lr, "samples_per_s": self.global_batch / elapsed}

    def resume(self) -> None:
        """Load the newest complete checkpoint, as chosen by rank 0 for everyone."""
        choice = [None]
        if self.rank == 0:
            newest = checkpoints.newest_complete(self.ckpt_root)
            choice = [newest.tag if newest else None]
        self.dist.broadcast_object_list(choice, src=0)
        if choice[0] is None:
            return
        path, client = self.engine.load_checkpoint(str(self.ckpt_root), tag=choice[0])
        if path is None or not client:
            raise PayloadError(f"could not load checkpoint {self.ckpt_root / choice[0]}")
        self.step, self.consumed = int(client["step"]), int(client["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed,
                      checkpoint=str(self.ckpt_root / choice[0]),
                      global_batch_changed=client.get("global_batch_size") != self.global_batch)

    def save(self) -> None:
        """Every rank writes its shard; rank 0 seals the checkpoint only after all are done."""
        if self.rank == 0:
            checkpoints.prepare_save_dir(self.ckpt_root, self.step)
        self.dist.barrier()
        state = {"step": self.step, "consumed_samples": self.consumed, "seed": self.args.seed,
                 "world_size": self.world, "global_batch_size": self.global_batch}
        self.engine.save_checkpoint(str(self.ckpt_root), tag=checkpoints.tag_for(self.step),
                                    client_state=state, save_latest=False)
        self.dist.barrier()
        if self.rank == 0:
            checkpoints.mark_complete(self.ckpt_root, self.step, state)
            checkpoints.prune(self.ckpt_root, self.args.keep_checkpoints)
            self.log.emit("checkpoint", step=self.step,
                          path=str(self.ckpt_root / checkpoints.tag_for(self.step)))

    def record(self, numbers: dict[str, float]) -> None:
        self.log.emit("step", phase=self.args.phase, step=self.step,
                      consumed_samples=self.consumed, **numbers)
        if self.tensorboard is not None:
            for key, value in numbers.items():
                if value is not None:
                    self.tensorboard.add_scalar(f"train/{key}", value, self.step)

    def run(self) -> None:
        args = self.args
        if args.phase == "compile":
            target = args.compile_steps  # from the fresh model; nothing loaded or saved
        else:
            self.resume()
            target = args.max_steps
            if args.steps >= 0:
                target = min(target, self.step + args.steps)
        saved_at = self.step
        while self.step < target:
            self.record(self.train_step())
            if args.phase == "train" and self.step % args.checkpoint_every == 0:
                self.save()
                saved_at = self.step
        if args.phase == "train" and self.step != saved_at:
            self.save()  # end of a bounded (or finished) run: keep what was trained
        self.log.emit("done", phase=args.phase, step=self.step, consumed_samples=self.consumed)
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.dist.barrier()
        self.dist.destroy_process_group()


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    validate(args)
    from bert_data import find_training_files

    # Checked before any distributed setup, so a bad path fails fast on every rank alike.
    files = find_training_files(args.input_dir)
    ensure_process_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    Trainer(args, files).run()
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
