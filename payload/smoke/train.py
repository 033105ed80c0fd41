"""CPU stand-in for the Trainium recipes: trains a tiny GPT-NeoX or Llama for real with torch DDP.

Rehearses a Neuron job on machines without Neuron devices while honouring the same contract as
the real payloads: ``--phase compile`` runs ``--compile-steps`` steps and writes nothing;
``--phase train`` resumes from the newest complete checkpoint, saves every K steps and at the end,
keeps the newest M; rank 0 prints one JSON event per line. Runs under torchrun or alone.

Fault-injection knobs for rehearsing failures (environment variables, read by every rank; sbatch
passes the submitter's environment on to the job, so ``VAR=... jobgen submit ...`` reaches it):

- ``JOBGEN_SMOKE_STEP_DELAY=SECONDS``: sleep this long in every optimizer step (both passes), so
  that a job runs long enough to be killed mid-training.
- ``JOBGEN_SMOKE_FAIL_AT_STEP=N``: fail with an error (exit status 1) when about to run optimizer
  step N, in every invocation and either pass (N <= --compile-steps fails the compile pass too);
  with ``JOBGEN_SMOKE_FAIL_NODE=K`` only on node K (the job's node index, from 0).

What ``jobgen watch`` catches, in the training pass only (the compile pass trains as usual):

- ``JOBGEN_SMOKE_SPIKE_AT_STEP=N``: a gradient-norm spike at step N: that step's loss is
  back-propagated x100, so the norm before clipping is 100 times the usual (clipping keeps the
  update sane, and the next step is normal again, as most real spikes are).
- ``JOBGEN_SMOKE_LOSS_SPIKE_AT_STEP=N``: before step N the output layer's weights are multiplied
  by 30, as a bad update would do: the loss jumps (the tiny model is still near ln(vocab), so
  a bad batch alone would not show), and training pulls it back down over the next steps.
- ``JOBGEN_SMOKE_SLOW_AT_STEP=N``: from step N on, every step takes
  ``JOBGEN_SMOKE_SLOW_SECONDS`` (default 1) longer: a throughput drop.
- ``JOBGEN_SMOKE_DIVERGE_AT_STEP=N``: from step N on, the learning rate is 1000 times the
  schedule's and gradients are not clipped: the run really diverges.
- ``JOBGEN_SMOKE_NAN_AT_STEP=N``: step N's loss is NaN, and so are the weights after it.
- ``JOBGEN_SMOKE_SAVE_FAIL_AT_STEP=N``: the save of step N fails after writing part of its
  files (in the background unless --sync-save): the step is never sealed.
- ``JOBGEN_SMOKE_SAVE_DELAY=SECONDS``: every save's write takes this much longer (a slow disk).
- ``JOBGEN_SMOKE_HANG_AT_STEP=N``: node ``JOBGEN_SMOKE_HANG_NODE`` (default: the last) stops before
  step N and never goes on; the others wait for it in the next collective.

The last three happen once per run (a file in --output-dir remembers it), so that the job a
watcher requeued or rolled back trains on normally.
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

# Running as a script: make ``payload/`` importable for ``common``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import args as shared
from common.events import EventLog, node_index, open_tensorboard
from common.init import process_group_timeout, scale_output_projections
from common.loop import agreed_newest, run_invocation, sealed_save
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
from common.schedule import DECAY_SHAPES, learning_rate

PROG = "smoke-train"
STATE_FILE = "state.pt"
SHARD_FILE = "optim-rank-{rank:05d}.pt"
STEP_DELAY_ENV = "JOBGEN_SMOKE_STEP_DELAY"
FAIL_AT_ENV = "JOBGEN_SMOKE_FAIL_AT_STEP"
FAIL_NODE_ENV = "JOBGEN_SMOKE_FAIL_NODE"
SAVE_FAIL_ENV = "JOBGEN_SMOKE_SAVE_FAIL_AT_STEP"
SAVE_DELAY_ENV = "JOBGEN_SMOKE_SAVE_DELAY"
FAULT_STEPS = {fault: f"JOBGEN_SMOKE_{fault.upper()}_AT_STEP"
               for fault in ("spike", "loss_spike", "slow", "diverge", "nan", "hang")}
SLOW_SECONDS_ENV = "JOBGEN_SMOKE_SLOW_SECONDS"
HANG_NODE_ENV = "JOBGEN_SMOKE_HANG_NODE"
ONCE_PER_RUN = ("diverge", "nan", "hang")
SPIKE_FACTOR = 100.0
DIVERGE_LR_FACTOR = 1000.0
LOSS_SPIKE_FACTOR = 30.0


class InjectedFailure(RuntimeError):
    """The failure asked for with JOBGEN_SMOKE_FAIL_AT_STEP."""


def _staged(value: Any, torch: Any) -> Any:
    """A copy of ``value`` whose tensors are detached clones (dicts and lists copied alike)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: _staged(item, torch) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_staged(item, torch) for item in value)
    return value


def fault_knobs(env: Any = os.environ) -> tuple[float, int | None]:
    """(seconds to sleep per step, step to fail at or None) from the environment."""
    delay_text = env.get(STEP_DELAY_ENV, "").strip()
    fail_text = env.get(FAIL_AT_ENV, "").strip()
    try:
        delay = float(delay_text) if delay_text else 0.0
    except ValueError:
        raise PayloadError(f"{STEP_DELAY_ENV}={delay_text!r} is not a number of seconds") from None
    if not delay >= 0 or delay == float("inf"):
        raise PayloadError(f"{STEP_DELAY_ENV}={delay_text!r} must be a finite number >= 0")
    if not fail_text:
        return delay, None
    if not fail_text.isdigit() or int(fail_text) < 1:
        raise PayloadError(f"{FAIL_AT_ENV}={fail_text!r} must be a step number >= 1")
    return delay, int(fail_text)


def _step_number(name: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PayloadError(f"{name}={text!r} must be a step number >= 1")
    return int(text)


def watch_faults(env: Any = os.environ) -> dict[str, Any]:
    """The faults asked for that `jobgen watch` catches: {"spike": step, ...} for those set, with
    "slow_seconds", "hang_node" (None: the last node) and "fail_node" (None: every node)."""
    faults: dict[str, Any] = {}
    for fault, name in FAULT_STEPS.items():
        text = env.get(name, "").strip()
        if text:
            faults[fault] = _step_number(name, text)
    slow = env.get(SLOW_SECONDS_ENV, "").strip() or "1"
    try:
        faults["slow_seconds"] = float(slow)
    except ValueError:
        raise PayloadError(f"{SLOW_SECONDS_ENV}={slow!r} is not a number of seconds") from None
    if not 0 <= faults["slow_seconds"] < float("inf"):
        raise PayloadError(f"{SLOW_SECONDS_ENV}={slow!r} must be a finite number >= 0")
    for key, name in (("hang_node", HANG_NODE_ENV), ("fail_node", FAIL_NODE_ENV)):
        text = env.get(name, "").strip()
        if text and not text.isdigit():
            raise PayloadError(f"{name}={text!r} must be a node index (0, 1, ...)")
        faults[key] = int(text) if text else None
    return faults


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
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
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = parser().parse_args(argv)
    if args.intermediate_size is None:
        args.intermediate_size = 4 * args.hidden_size
    return args


def validate(args: argparse.Namespace) -> None:
    positive = ("num_layers", "hidden_size", "num_heads", "intermediate_size", "seq_length",
                "micro_batch_size", "gradient_accumulation", "max_steps", "compile_steps",
                "checkpoint_every", "keep_checkpoints")
    for name in positive:
        if getattr(args, name) < 1:
            raise PayloadError(f"--{name.replace('_', '-')} must be at least 1")
    if args.hidden_size % args.num_heads:
        raise PayloadError(f"--hidden-size {args.hidden_size} is not divisible by "
                           f"--num-heads {args.num_heads}")
    if args.vocab_size < 16:
        raise PayloadError("--vocab-size must be at least 16")
    if args.warmup_steps < 0 or args.warmup_steps > args.max_steps:
        raise PayloadError("--warmup-steps must lie in [0, --max-steps]")
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")


def samples_digest(tokens: Any, previous: int = 0) -> int:
    """CRC-32 of the token rows a rank read, chained over its micro-batches: the step events
    carry one per rank, so a test can see which samples a resumed run read."""
    return zlib.crc32(tokens.contiguous().numpy().tobytes(), previous)


class SmokeTrainer:
    """DDP training of the tiny model; implements ``common.loop.Runner``."""

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
        self.ckpt_root = args.output_dir / "checkpoints"
        self.training = args.phase == "train"
        if self.training:  # every rank, before anyone opens a file in it
            args.output_dir.mkdir(parents=True, exist_ok=True)
        self.log = EventLog(self.rank,
                            args.output_dir / "metrics.jsonl" if self.training else None)
        self.log.emit("start", phase=args.phase, family=args.family, accelerator="cpu",
                      backend="gloo", optimizer="torch.AdamW", world_size=self.world,
                      ranks_from=ranks_from, global_batch_size=self.global_batch,
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

    def resume(self) -> None:
        tag = agreed_newest(self.ckpt_root, self.rank)
        if tag is None:
            return
        directory = self.ckpt_root / tag
        state = self.torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        self.model.load_state_dict(state["model"])
        optimizer = state["optimizer"]
        if not optimizer["state"]:   # sharded: every rank of the saving job wrote its slice
            for rank in range(int(state["world_size"])):
                optimizer["state"].update(self.torch.load(
                    directory / SHARD_FILE.format(rank=rank), map_location="cpu",
                    weights_only=False))
        self.optimizer.load_state_dict(optimizer)
        self.step, self.consumed = int(state["step"]), int(state["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed,
                      checkpoint=str(self.ckpt_root / tag),
                      global_batch_changed=state["global_batch_size"] != self.global_batch)

    def _save_file(self, value: Any, path: Path) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        self.torch.save(value, tmp)
        os.replace(tmp, path)

    def _write_files(self, files: list[tuple[Any, Path]], step: int) -> None:
        """Write a save's files (on the caller's thread or the background one); the fault knobs
        slow it or fail it after its first file."""
        delay = float(os.environ.get(SAVE_DELAY_ENV, "0") or 0)
        for index, (value, path) in enumerate(files):
            self._save_file(value, path)
            if delay > 0:
                time.sleep(delay / len(files))
            if index == 0 and os.environ.get(SAVE_FAIL_ENV, "").strip() == str(step):
                raise OSError(f"{SAVE_FAIL_ENV}={step}: the save failed mid-write")

    def save(self, root: Path | None = None) -> None:
        info = {"step": self.step, "consumed_samples": self.consumed, "seed": self.args.seed,
                "world_size": self.world, "global_batch_size": self.global_batch,
                "family": self.args.family}
        step = self.step

        def write(directory: Path) -> Any:
            # Sharded as ZeRO-1 shards it (NxD's and DeepSpeed's optimizers): each rank writes
            # its slice of the optimizer state, rank 0 the weights, so a checkpoint needs every
            # node's part (on SageMaker, each instance's own files).
            optimizer = self.optimizer.state_dict()
            mine = {i: v for i, v in optimizer["state"].items() if i % self.world == self.rank}
            files: list[tuple[Any, Path]] = [(mine, directory / SHARD_FILE.format(rank=self.rank))]
            if self.rank == 0:
                state = dict(info, model=self.model.state_dict(),
                             optimizer={"state": {}, "param_groups": optimizer["param_groups"]},
                             schedule=self.schedule_params())
                files.append((state, directory / STATE_FILE))
            if self.args.sync_save:
                self._write_files(files, step)
                return None
            # Staged: a copy of every tensor, so the next optimizer step cannot change what the
            # background thread writes (as DCP's async_save stages to CPU memory first).
            staged = [(_staged(value, self.torch), path) for value, path in files]
            return self._writer().submit(self._write_files, staged, step)

        sealed_save(root or self.ckpt_root, self.step, info, self.rank, self.args.keep_checkpoints,
                    self.log, write)

    def _writer(self) -> Any:
        if getattr(self, "_pool", None) is None:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="save")
        return self._pool

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
