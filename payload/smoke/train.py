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
  step N, in every invocation and either pass (N <= --compile-steps fails the compile pass too).
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

from common.events import EventLog, open_tensorboard
from common.init import scale_output_projections
from common.loop import agreed_newest, run_invocation, sealed_save
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
# The projections that write into the residual stream, per family (Hugging Face names).
OUTPUT_PROJECTIONS = {"gpt_neox": ("attention.dense", "mlp.dense_4h_to_h"),
                      "llama": ("o_proj", "down_proj")}
STATE_FILE = "state.pt"
STEP_DELAY_ENV = "JOBGEN_SMOKE_STEP_DELAY"
FAIL_AT_ENV = "JOBGEN_SMOKE_FAIL_AT_STEP"


class InjectedFailure(RuntimeError):
    """The failure asked for with JOBGEN_SMOKE_FAIL_AT_STEP."""


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=("gpt_neox", "llama"), default="gpt_neox")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=None, help="default 4 × hidden")
    p.add_argument("--seq-length", type=int, default=32)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--gradient-accumulation", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--decay", "--schedule", dest="decay", choices=DECAY_SHAPES, default="cosine",
                   help="shape of the decay after warmup and hold (--schedule: the NxD "
                        "program's name for it)")
    p.add_argument("--constant-steps", type=int, default=0)
    p.add_argument("--decay-steps", type=int, default=None,
                   help="step at which the decay reaches --min-lr (default: --max-steps)")
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--no-decay", nargs="*", default=None, metavar="FRAGMENT",
                   help="name fragments kept out of weight decay (none given: decay all; "
                        "absent: matrices are decayed, vectors are not)")
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--scaled-init", action="store_true",
                   help="output projections at --init-std / sqrt(2 x layers) (common/init.py)")
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--phase", choices=("compile", "train"), default="train")
    p.add_argument("--compile-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=-1,
                   help="optimizer steps this invocation may run (-1: until --max-steps)")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--output-dir", type=Path, default=Path("output"))
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
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


def synthetic_tokens(position: int, seq_length: int, vocab_size: int, seed: int) -> list[int]:
    """Sample ``position`` of the stream: an arithmetic run ``a, a+d, a+2d, … (mod vocab)``.

    Start and stride come from the position and seed alone (no RNG state to checkpoint); after two
    tokens the rest is predictable, so the loss falls quickly and visibly.
    """
    start = (seed * 7_919 + position * 104_729) % vocab_size
    stride = 1 + (position * 31 + seed) % 5
    return [(start + k * stride) % vocab_size for k in range(seq_length)]


def samples_digest(tokens: Any, previous: int = 0) -> int:
    """CRC-32 of the token rows a rank read, chained over its micro-batches: the step events
    carry one per rank, so a test can see which samples a resumed run read."""
    return zlib.crc32(tokens.contiguous().numpy().tobytes(), previous)


def build_model(args: argparse.Namespace) -> Any:
    import transformers

    common: dict[str, Any] = {
        "vocab_size": args.vocab_size, "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_heads,
        "intermediate_size": args.intermediate_size,
        "max_position_embeddings": args.seq_length, "initializer_range": args.init_std}
    if args.family == "gpt_neox":
        # GPT-NeoX 20B / Pythia style: rotary on a quarter of each head, parallel residual.
        # ``rotary_pct`` is the 4.x name; 5.x still accepts it (into rope_parameters).
        common.update(rotary_pct=0.25, use_parallel_residual=True)
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**common))
    llama = transformers.LlamaConfig(num_key_value_heads=args.num_heads, **common)
    return transformers.LlamaForCausalLM(llama)


class SmokeTrainer:
    """DDP training of the tiny model; implements ``common.loop.Runner``."""

    def __init__(self, args: argparse.Namespace, ranks_from: str) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        self.args, self.torch, self.dist = args, torch, dist
        self.step_delay, self.fail_at = fault_knobs()
        self.rank, self.world, _ = dist_coords()
        dist.init_process_group("gloo")
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

    def schedule_params(self) -> dict[str, Any]:
        args = self.args
        return {"peak_lr": args.lr, "min_lr": args.min_lr, "max_steps": args.max_steps,
                "warmup_steps": args.warmup_steps, "constant_steps": args.constant_steps,
                "decay": args.decay, "decay_steps": args.decay_steps}

    def _micro_batch(self, positions: list[int]) -> Any:
        args = self.args
        rows = [synthetic_tokens(p, args.seq_length, args.vocab_size, args.seed)
                for p in positions]
        return self.torch.tensor(rows, dtype=self.torch.long)

    def train_step(self) -> dict[str, Any]:
        torch, args = self.torch, self.args
        if self.fail_at is not None and self.step + 1 == self.fail_at:
            raise InjectedFailure(f"{FAIL_AT_ENV}={self.fail_at}: injected failure before step "
                                  f"{self.fail_at} of the {args.phase} pass (rank {self.rank})")
        if self.step_delay:
            time.sleep(self.step_delay)
        torch.manual_seed(step_seed(args.seed, self.step + 1, self.rank))
        lr = learning_rate(self.step, **self.schedule_params())
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
                (loss / len(micro_batches)).backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.grad_clip)
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
        state = self.torch.load(self.ckpt_root / tag / STATE_FILE, map_location="cpu",
                                weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.consumed = int(state["step"]), int(state["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed,
                      checkpoint=str(self.ckpt_root / tag),
                      global_batch_changed=state["global_batch_size"] != self.global_batch)

    def save(self) -> None:
        info = {"step": self.step, "consumed_samples": self.consumed, "seed": self.args.seed,
                "world_size": self.world, "global_batch_size": self.global_batch,
                "family": self.args.family}

        def write(directory: Path) -> None:
            if self.rank != 0:
                return  # DDP replicas are identical: one copy is the checkpoint
            state = dict(info, model=self.model.state_dict(),
                         optimizer=self.optimizer.state_dict(), schedule=self.schedule_params())
            tmp = directory / f".{STATE_FILE}.tmp"
            self.torch.save(state, tmp)
            os.replace(tmp, directory / STATE_FILE)

        sealed_save(self.ckpt_root, self.step, info, self.rank, self.args.keep_checkpoints,
                    self.log, write)

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
