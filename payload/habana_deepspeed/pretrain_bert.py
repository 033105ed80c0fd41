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
import warnings
from pathlib import Path
from typing import Any

# Running as a script: make ``payload/`` (for ``common``) and this directory importable.
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import bert_flags as flags
from bert_flags import validate
from common.events import EventLog, open_tensorboard
from common.init import process_group_timeout
from common.loop import agreed_newest, run_invocation, sealed_save
from common.runtime import (
    PayloadError,
    batch_positions,
    dist_coords,
    ensure_process_env,
    finish_distributed,
    run_main,
    step_seed,
)
from common.schedule import learning_rate, steps_from_proportion

PROG = "pretrain_bert"


def parser() -> argparse.ArgumentParser:
    return flags.parser(PROG, __doc__.splitlines()[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


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
                         constant_steps=steps_from_proportion(args.constant, args.max_steps),
                         min_lr=args.min_lr, decay=args.schedule, decay_steps=args.decay_steps)


def build_model(args: argparse.Namespace) -> Any:
    from transformers import BertConfig, BertForPreTraining

    config = BertConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                        num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
                        intermediate_size=args.intermediate_size,
                        max_position_embeddings=args.max_position_embeddings,
                        type_vocab_size=args.type_vocab_size,
                        hidden_dropout_prob=args.hidden_dropout,
                        attention_probs_dropout_prob=args.attention_dropout,
                        layer_norm_eps=args.layer_norm_eps, initializer_range=args.init_std)
    model = BertForPreTraining(config)
    if args.layer_norm_large_model:
        from bert_topology import use_large_model_layer_norm
        use_large_model_layer_norm(model)
    return model


class Trainer:
    """Owns the engine, the data and the step counters of one invocation (a ``loop.Runner``)."""

    def __init__(self, args: argparse.Namespace, data: Any, ranks_from: str) -> None:
        import torch
        import torch.distributed as dist
        from accelerators import build_optimizer, choose_accelerator, communication_start

        self.args, self.data, self.torch, self.dist = args, data, torch, dist
        self.rank, self.world, local_rank = dist_coords()
        self.accel = choose_accelerator(args.accelerator, local_rank)
        import deepspeed  # only now: choose_accelerator has set DS_ACCELERATOR
        import deepspeed.utils

        deepspeed.utils.logger.setLevel("WARNING")
        # DeepSpeed's ZeRO-1 gathers with a call torch 2.x deprecates: a warning per rank and
        # pass that says nothing about this run.
        warnings.filterwarnings("ignore", category=FutureWarning,
                                message=r"`torch\.distributed\.all_gather_into_tensor` is "
                                        "deprecated")
        with communication_start(self.accel, self.rank):
            deepspeed.init_distributed(dist_backend=self.accel.backend,
                                       timeout=process_group_timeout())
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        # On its device before the optimizer is built, as Habana's reference does it
        # (Model-References deepspeed-bert run_pretraining.py, prepare_model_and_optimizer): the
        # optimizer then holds the parameters where they train. (The reference's bf16 cast there
        # is its workaround; here DeepSpeed's bf16 setting owns the dtype.)
        model = build_model(args).to(self.accel.device)
        self.optimizer, opt_name = build_optimizer(args.optimizer, model, self.accel, args.lr,
                                                   args.weight_decay, (args.beta1, args.beta2),
                                                   args.eps, args.no_decay)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=self.optimizer,
                                               config=deepspeed_config(args, self.world))
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * self.world
        self.ckpt_root = args.output_dir / "checkpoints"
        self.training = args.phase == "train"
        if self.training and self.rank == 0:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        # The compile pass leaves no trace on disk: no metrics file, no TensorBoard, no checkpoint.
        self.log = EventLog(self.rank,
                            args.output_dir / "metrics.jsonl" if self.training else None)
        self.log.emit("start", phase=args.phase, accelerator=self.accel.name,
                      device=str(self.accel.device), backend=self.accel.backend,
                      optimizer=opt_name, precision=args.precision, zero_stage=args.zero_stage,
                      world_size=self.world, ranks_from=ranks_from,
                      global_batch_size=self.global_batch, shards=len(data.files),
                      samples=data.total)
        self.tensorboard = (open_tensorboard(args.output_dir / "tensorboard", self.log)
                            if self.training else None)
        self.step, self.consumed = 0, 0

    def _device_batch(self, positions: list[int]) -> dict[str, Any]:
        arrays = self.data.batch(positions)
        return {k: self.torch.from_numpy(v).to(self.accel.device) for k, v in arrays.items()}

    def train_step(self) -> dict[str, Any]:
        """One optimizer step (all its micro-batches); returns the numbers for the step event."""
        torch, args = self.torch, self.args
        torch.manual_seed(step_seed(args.seed, self.step + 1, self.rank))
        lr = schedule(args, self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float32, device=self.accel.device)
        norm = None
        for positions in batch_positions(self.consumed, args.micro_batch_size,
                                         args.gradient_accumulation, self.world, self.rank):
            loss = self.engine(**self._device_batch(positions)).loss
            self.engine.backward(loss)
            self.accel.mark_step()
            if self.engine.is_gradient_accumulation_boundary():
                norm = self._unwrapped_grad_norm()
            self.engine.step()  # DeepSpeed only updates at the accumulation boundary
            self.accel.mark_step()
            loss_sum += loss.detach().float()
        self.dist.all_reduce(loss_sum)
        mean_loss = loss_sum.item() / (args.gradient_accumulation * self.world)
        elapsed = time.perf_counter() - started
        self.step += 1
        self.consumed += self.global_batch
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        return {"loss": mean_loss, "grad_norm": None if norm is None else float(norm), "lr": lr,
                "samples_per_s": round(self.global_batch / elapsed, 2)}

    def _unwrapped_grad_norm(self) -> Any:
        """Gradient norm where DeepSpeed keeps none: without ZeRO or bf16 its optimizer wrapper
        does not record it, but the reduced full gradients sit on the parameters before step()."""
        if self.args.zero_stage != 0 or self.args.precision != "fp32":
            return None
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        return self.torch.linalg.vector_norm(
            self.torch.stack([self.torch.linalg.vector_norm(g) for g in grads]))

    def resume(self) -> None:
        tag = agreed_newest(self.ckpt_root, self.rank)
        if tag is None:
            return
        path, client = self.engine.load_checkpoint(str(self.ckpt_root), tag=tag)
        if path is None or not client:
            raise PayloadError(f"could not load checkpoint {self.ckpt_root / tag}")
        self.step, self.consumed = int(client["step"]), int(client["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed,
                      checkpoint=str(self.ckpt_root / tag),
                      global_batch_changed=client.get("global_batch_size") != self.global_batch)

    def save(self, root: Path | None = None) -> None:
        state = {"step": self.step, "consumed_samples": self.consumed, "seed": self.args.seed,
                 "world_size": self.world, "global_batch_size": self.global_batch}

        def write(directory: Path) -> None:
            # Collective: every rank writes its ZeRO shard, rank 0 also the module states.
            self.engine.save_checkpoint(str(directory.parent), tag=directory.name,
                                        client_state=state, save_latest=False)

        sealed_save(root or self.ckpt_root, self.step, state, self.rank, self.args.keep_checkpoints,
                    self.log, write)

    def run(self) -> None:
        run_invocation(self, self.args)
        finish_distributed(self.dist)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    validate(args)
    from bert_data import ShardedSamples, find_training_files

    # Data problems surface before any distributed setup, so every rank fails fast alike.
    data = ShardedSamples(find_training_files(args.input_dir), args.seq_length,
                          args.max_predictions, args.seed)
    ranks_from = ensure_process_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    Trainer(args, data, ranks_from).run()
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
