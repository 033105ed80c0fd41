"""CPU stand-in for the Trainium recipes: trains a tiny GPT-NeoX or Llama for real with torch DDP.

Rehearses a Neuron job on machines without Neuron devices while honouring the same contract as
the real payloads: ``--phase compile`` runs ``--compile-steps`` steps and writes nothing;
``--phase train`` resumes from the newest complete checkpoint, saves every K steps and at the end,
keeps the newest M; rank 0 prints one JSON event per line. Runs under torchrun or alone.

Fault-injection knobs for rehearsing failures: smoke_faults.py. The checkpoint format (sharded as
ZeRO-1 shards it, written in the background unless --sync-save): smoke_checkpoint.py.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import zlib
from contextlib import nullcontext
from pathlib import Path
from typing import Any

# Running as a script or loaded by path: make ``payload/`` importable for ``common``, and this
# folder for the program's own modules.
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import smoke_flags as flags
from common.events import EventLog, node_index, open_tensorboard
from common.init import process_group_timeout, scale_output_projections
from common.loop import run_invocation
from common.models import OUTPUT_PROJECTIONS, build_model, synthetic_tokens
from common.optim import parameter_groups
from common.runtime import (
    PayloadError,
    batch_positions,
    dist_coords,
    ensure_process_env,
    finish_distributed,
    run_main,
    step_seed,
)
from common.schedule import learning_rate
from smoke_checkpoint import Checkpoints
from smoke_faults import (
    DIVERGE_LR_FACTOR,
    FAIL_AT_ENV,
    FAULT_STEPS,
    LOSS_SPIKE_FACTOR,
    ONCE_PER_RUN,
    SPIKE_FACTOR,
    InjectedFailure,
    fault_knobs,
    watch_faults,
)
from smoke_flags import validate

PROG = "smoke-train"


def parser() -> argparse.ArgumentParser:
    return flags.parser(PROG, __doc__.splitlines()[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    if args.intermediate_size is None:
        args.intermediate_size = 4 * args.hidden_size
    return args


def samples_digest(tokens: Any, previous: int = 0) -> int:
    """CRC-32 of the token rows a rank read, chained over its micro-batches: the step events
    carry one per rank, so a test can see which samples a resumed run read."""
    return zlib.crc32(tokens.contiguous().numpy().tobytes(), previous)


class SmokeTrainer(Checkpoints):
    """DDP training of the tiny model; implements ``common.loop.Runner`` (its saves and resume:
    smoke_checkpoint.Checkpoints)."""

    def __init__(self, args: argparse.Namespace, ranks_from: str) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        self.args, self.torch, self.dist = args, torch, dist
        self.step_delay, self.fail_at = fault_knobs()
        self.faults = watch_faults()
        self.rank, self.world, self.local_rank = dist_coords()
        self.node = node_index(os.environ)
        self.nnodes = max(1, self.world // int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        dist.init_process_group("gloo", timeout=process_group_timeout())
        torch.manual_seed(args.seed)  # identical initial weights on every rank
        self.model = build_model(args)
        if args.scaled_init:  # the same code as the NxD program's (payload/common/init.py)
            scale_output_projections(self.model, OUTPUT_PROJECTIONS[args.family],
                                     args.init_std, args.num_layers)
        self.ddp = DistributedDataParallel(self.model)
        if args.no_decay is None:
            decay = [p for p in self.model.parameters() if p.ndim >= 2]
            plain = [p for p in self.model.parameters() if p.ndim < 2]
            groups = [{"params": decay, "weight_decay": args.weight_decay},
                      {"params": plain, "weight_decay": 0.0}]
        else:
            groups = parameter_groups(self.model.named_parameters(), args.weight_decay,
                                      args.no_decay)
        self.optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2),
                                           eps=args.eps)
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * self.world
        self.index: list[int] | None = None
        if args.index_dir is not None:
            self._load_index(args.index_dir)
        self.rows = None        # a prepared dataset's samples (prepared_data.py), else made up
        if args.data_format is not None:
            import prepared_data
            self.rows = prepared_data.open_rows(args.data_format,
                                                args.data_prefix or [str(args.data_dir)],
                                                args.seq_length)
        self.ckpt_root = args.output_dir / "checkpoints"
        self.training = args.phase == "train"
        if self.training:  # every rank, before anyone opens a file in it
            args.output_dir.mkdir(parents=True, exist_ok=True)
        self.log = EventLog(self.rank,
                            args.output_dir / "metrics.jsonl" if self.training else None)
        self.log.emit("start", phase=args.phase, family=args.family, accelerator="cpu",
                      backend="gloo", optimizer="torch.AdamW", world_size=self.world,
                      ranks_from=ranks_from, global_batch_size=self.global_batch,
                      data=args.data_format or "made-up",
                      parameters=sum(p.numel() for p in self.model.parameters()))
        self.tensorboard = (open_tensorboard(args.output_dir / "tensorboard", self.log)
                            if self.training else None)
        self.step, self.consumed = 0, 0
        # Once-per-run faults: armed unless an earlier invocation of this run already had them.
        self.armed = {fault for fault in ONCE_PER_RUN
                      if self.training and fault in self.faults
                      and not self._fault_marker(fault).exists()}

    def _load_index(self, folder: Path) -> None:
        """NeMo's index build, stood in: samples = the pass's steps x the global batch."""
        import indexed_data
        from common.node_indices import install

        install(indexed_data)   # a builder on every node where the disks are the nodes' own
        args = self.args
        steps = args.compile_steps if args.phase == "compile" else args.max_steps
        self.index, built = indexed_data.build_or_load(
            folder, steps * self.global_batch, args.seq_length, args.seed)
        if built:
            path = indexed_data.index_path(folder, len(self.index), args.seq_length, args.seed)
            print(f"{PROG}: node {self.node} (rank {self.rank}) built the {args.phase} pass's "
                  f"index file {path}", file=sys.stderr, flush=True)

    def _fault_marker(self, fault: str) -> Path:
        return self.args.output_dir / f".jobgen-smoke-{fault}"

    def _fires(self, fault: str, step: int) -> bool:
        """Whether ``fault`` acts on ``step`` (the step about to run); remembers a once-per-run
        fault on disk the first time it acts."""
        at = self.faults.get(fault)
        if not self.training or at is None:
            return False
        if fault not in ONCE_PER_RUN:
            return step >= at if fault == "slow" else step == at
        if fault not in self.armed or step < at:
            return False
        if step == at and self.local_rank == 0:
            self._fault_marker(fault).write_text(f"{step}\n", encoding="utf-8")
        return True

    def before_step(self) -> None:
        """The injected hang: this node stops before the step, before it says it started it."""
        step = self.step + 1
        hang_node = self.faults.get("hang_node")
        hang_node = self.nnodes - 1 if hang_node is None else hang_node
        if self.node == hang_node and self._fires("hang", step):
            print(f"{PROG}: {FAULT_STEPS['hang']}={step}: node {self.node} (rank {self.rank}) "
                  f"stops before step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)

    def schedule_params(self) -> dict[str, Any]:
        args = self.args
        return {"peak_lr": args.lr, "min_lr": args.min_lr, "max_steps": args.max_steps,
                "warmup_steps": args.warmup_steps, "constant_steps": args.constant_steps,
                "decay": args.decay, "decay_steps": args.decay_steps}

    def _micro_batch(self, positions: list[int]) -> Any:
        args = self.args
        if self.index is not None:   # read through the index, as NeMo's samples are
            n = len(self.index)
            positions = [self.index[p % n] + p // n * n for p in positions]
        if self.rows is not None:
            rows = [self.rows.row(p) for p in positions]
            top = max(max(row) for row in rows)
            if top >= args.vocab_size:
                raise PayloadError(f"the dataset holds token {top}, outside --vocab-size "
                                   f"{args.vocab_size}")
        else:
            rows = [synthetic_tokens(p, args.seq_length, args.vocab_size, args.seed)
                    for p in positions]
        return self.torch.tensor(rows, dtype=self.torch.long)

    def train_step(self) -> dict[str, Any]:
        torch, args = self.torch, self.args
        step = self.step + 1
        fail_node = self.faults.get("fail_node")
        if self.fail_at == step and fail_node in (None, self.node):
            raise InjectedFailure(f"{FAIL_AT_ENV}={self.fail_at}: injected failure before step "
                                  f"{self.fail_at} of the {args.phase} pass (rank {self.rank})")
        if self.step_delay:
            time.sleep(self.step_delay)
        if self._fires("slow", step):
            time.sleep(self.faults["slow_seconds"])
        diverging = self._fires("diverge", step)
        loss_scale = SPIKE_FACTOR if self._fires("spike", step) else 1.0
        if self._fires("nan", step):
            loss_scale = float("nan")
        if self._fires("loss_spike", step):
            with torch.no_grad():
                self.model.get_output_embeddings().weight.mul_(LOSS_SPIKE_FACTOR)
        torch.manual_seed(step_seed(args.seed, self.step + 1, self.rank))
        lr = learning_rate(self.step, **self.schedule_params())
        if diverging:
            lr *= DIVERGE_LR_FACTOR
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        micro_batches = batch_positions(self.consumed, args.micro_batch_size,
                                        args.gradient_accumulation, self.world, self.rank)
        loss_sum = torch.zeros(())
        read = 0
        for index, positions in enumerate(micro_batches):
            tokens = self._micro_batch(positions)
            read = samples_digest(tokens, read)
            last = index == len(micro_batches) - 1
            # Gradients are all-reduced once per optimizer step, on the last micro-batch.
            with nullcontext() if last else self.ddp.no_sync():
                loss = self.ddp(input_ids=tokens, labels=tokens).loss
                (loss * loss_scale / len(micro_batches)).backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              float("inf") if diverging else args.grad_clip)
        self.optimizer.step()
        self.dist.all_reduce(loss_sum)
        digests = [torch.zeros((), dtype=torch.int64) for _ in range(self.world)]
        self.dist.all_gather(digests, torch.tensor(read, dtype=torch.int64))
        elapsed = time.perf_counter() - started
        self.step += 1
        self.consumed += self.global_batch
        return {"loss": loss_sum.item() / (len(micro_batches) * self.world),
                "grad_norm": float(norm), "lr": lr,
                "samples_per_s": round(self.global_batch / elapsed, 2),
                "data_crc32": [int(d) for d in digests]}

    def run(self) -> None:
        run_invocation(self, self.args)
        finish_distributed(self.dist)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    validate(args)
    ranks_from = ensure_process_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    SmokeTrainer(args, ranks_from).run()
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
