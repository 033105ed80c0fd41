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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Running as a script or loaded by path: make ``payload/`` importable for ``common``, and this
# folder for the program's own modules.
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import llama_setup as setup
from common.events import EventLog, open_tensorboard
from common.init import process_group_timeout
from common.loop import run_invocation
from common.optim import parameter_groups
from common.runtime import PayloadError, run_main
from common.schedule import learning_rate
from common.stream import RankStream
from llama_model import build_model
from llama_setup import (
    apply_precision_environment,
    patch_for_bf16,
    use_example,
    uses_master_weights,
    validate,
)

PROG = "train-llama"
# Kept out of weight decay when the recipe names nothing: the example's rule from NxD 2.22 on
# (at 2.20 it named "LayerNorm", which no Llama parameter contains).
EXAMPLE_NO_DECAY = ("bias", "norm")
CHECKPOINT_WORKERS = 8


def parser() -> argparse.ArgumentParser:
    return setup.parser(PROG, __doc__.splitlines()[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


class LlamaRunner:
    """One invocation on Trainium (a ``common.loop.Runner``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.training = args.phase == "train"
        if self.training:
            # Every rank makes the folder before anyone opens a file in it (the upstream
            # example made only its output folder and crashed opening a metrics file elsewhere).
            args.output_dir.mkdir(parents=True, exist_ok=True)
        # Read by torch_xla and the Neuron runtime when they start: before the first import.
        apply_precision_environment(args.precision)
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

        patch_for_bf16(torch, args.precision)
        torch.set_default_dtype(torch.float32)
        if requires_init_pg_override():
            import torch_xla.experimental.pjrt_backend  # noqa: F401  (registers pjrt://)
            dist.init_process_group("xla", init_method="pjrt://",
                                    timeout=process_group_timeout())
        else:
            dist.init_process_group("xla", timeout=process_group_timeout())
        set_seed(args.seed)
        self.args, self.torch, self.xm, self.nxd = args, torch, xm, nxd
        self.parallel_state = parallel_state
        config = nxd.neuronx_distributed_config(
            tensor_parallel_size=args.tensor_parallel_size,
            optimizer_config={"zero_one_enabled": args.zero1, "grad_clipping": True,
                              "max_grad_norm": args.grad_clip},
            sequence_parallel=args.sequence_parallel,
            activation_checkpoint_config=CoreAttention if args.selective_checkpoint else None,
            mixed_precision_config=get_mixed_precision_config(
                uses_master_weights(args.precision)),
        )
        self.model = nxd.initialize_parallel_model(
            config, lambda: build_model(args, torch, parallel_state))
        no_decay = EXAMPLE_NO_DECAY if args.no_decay is None else tuple(args.no_decay)
        groups = parameter_groups(self.model.named_parameters(), args.weight_decay, no_decay)
        # The example's optimizer for mixed precision; without XLA_DOWNCAST_BF16 it is the same
        # update as the transformers AdamW the example takes for pure BF16 (bias-corrected,
        # decoupled weight decay), and it is part of NxD, so it stays.
        self.optimizer = nxd.initialize_parallel_optimizer(
            config, AdamW_FP32OptimParams, groups, lr=args.lr, betas=(args.beta1, args.beta2),
            eps=args.eps, weight_decay=args.weight_decay)
        self.optimizer.zero_grad()
        self.device = xm.xla_device()
        self.dp_size = parallel_state.get_data_parallel_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.data = datasets.load_from_disk(str(args.data_dir))
        self.batches: Iterator[dict[str, Any]] | None = None  # made after resume() ran
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * self.dp_size
        rank = int(os.environ.get("RANK", "0"))
        self.log = EventLog(rank, args.output_dir / "metrics.jsonl" if self.training else None)
        self.tensorboard = (open_tensorboard(args.output_dir / "tensorboard", self.log)
                            if self.training and rank == 0 else None)
        self.step, self.consumed = 0, 0
        self.log.emit("start", phase=args.phase, data_parallel=self.dp_size,
                      global_batch_size=self.global_batch, rows=len(self.data),
                      precision=args.precision, zero1=args.zero1)

    def _device_batches(self) -> Iterator[dict[str, Any]]:
        """Micro-batches on the device, from the current consumed-sample count onward. As in the
        example, torch_xla's MpDeviceLoader copies them ahead and ends a graph at each one."""
        import torch_xla.distributed.parallel_loader as pl
        from torch.utils.data import DataLoader
        from transformers import default_data_collator

        a = self.args
        stream = RankStream(self.consumed, a.micro_batch_size, a.gradient_accumulation,
                            self.dp_size, self.dp_rank, len(self.data))
        loader = DataLoader(self.data, batch_size=a.micro_batch_size, sampler=stream,
                            collate_fn=default_data_collator, num_workers=0, drop_last=True,
                            pin_memory=True)
        return iter(pl.MpDeviceLoader(loader, self.device))

    def train_step(self) -> dict[str, Any]:
        args, torch, xm = self.args, self.torch, self.xm
        if self.batches is None:
            self.batches = self._device_batches()
        lr = learning_rate(self.step, peak_lr=args.lr, max_steps=args.max_steps,
                           warmup_steps=args.warmup_steps, constant_steps=args.constant_steps,
                           min_lr=args.min_lr, decay=args.schedule,
                           decay_steps=args.decay_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        running = torch.zeros(1, dtype=torch.double, device=self.device)
        for _ in range(args.gradient_accumulation):
            batch = next(self.batches)
            loss = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              labels=batch["labels"]).loss / args.gradient_accumulation
            loss.backward()
            running += loss.detach()
        xm.mark_step()
        # Mean over data-parallel ranks (the all-reduce is normalised by the DP degree).
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
            # Reading values back waits for the device: only every --log-every steps.
            numbers.update(loss=float(loss_sum.cpu().item()), grad_norm=float(norm.cpu().item()),
                           seconds=time.perf_counter() - started)
        return numbers

    @property
    def ckpt_root(self) -> Path:
        """Its checkpoint folder (the compile pass has none: its scratch save goes beside)."""
        return self.args.checkpoint_dir or self.args.output_dir / "checkpoints"

    def save(self, root: Path | None = None) -> None:
        # NxD seals and prunes its own checkpoints (its "done" marker, num_kept_ckpts): whether
        # a restore on nodes without a shared file system holds every node's part is NxD's to
        # decide, on the real trainer only; jobgen's flow gives it one shared folder (FSx).
        # With async_save (NxD >= 2.19, as HLAT's 70B script saves) the call stages the state
        # and returns; NxD writes in a thread, and writes the step's "done" marker only after
        # every rank's write finished, when the next save begins (it waits for this one: one in
        # flight) or at finalize_checkpoint. So a step's event is emitted once it is sealed.
        directory = root or self.ckpt_root
        background = not self.args.sync_save
        began = time.monotonic()
        self.nxd.save_checkpoint(
            str(directory), f"step_{self.step}", model=self.model,
            optimizer=self.optimizer, scheduler=None,
            user_content={"global_step": self.step, "consumed_samples": self.consumed},
            num_workers=CHECKPOINT_WORKERS, use_xser=True,
            num_kept_ckpts=self.args.keep_checkpoints, async_save=background)
        if background and root is not None:
            self.nxd.finalize_checkpoint()   # the compile pass removes its scratch save next
        stall = time.monotonic() - began
        self._sealed()   # the save before this one, which NxD sealed as this one began
        event = "checkpoint" if root is None else "compile_save"
        if background and root is None:
            self._unsealed = (self.step, str(directory), stall)
        else:
            self.log.emit(event, step=self.step, path=str(directory), stall_s=round(stall, 3),
                          write_s=None if background else round(stall, 3),
                          **{"async": background})

    def _sealed(self) -> None:
        """Report the background save NxD has sealed since (write time: NxD does not say)."""
        pending, self._unsealed = getattr(self, "_unsealed", None), None
        if pending is not None:
            step, path, stall = pending
            self.log.emit("checkpoint", step=step, path=path, stall_s=round(stall, 3),
                          write_s=None, **{"async": True})

    def resume(self) -> None:
        """Continue from the newest complete checkpoint, as the example's ``--loading_step
        latest_if_exists`` does (NxD picks the newest tag that has its ``done`` marker)."""
        directory = str(self.args.checkpoint_dir)
        if not self.nxd.has_checkpoint(directory):
            return
        content = self.nxd.load_checkpoint(directory, tag=None, model=self.model,
                                           optimizer=self.optimizer, scheduler=None)
        if not content or "consumed_samples" not in content:
            raise PayloadError(f"--checkpoint-dir {directory}: the newest checkpoint was not "
                               "written by this program (no consumed_samples in its user content)")
        self.step = int(content["global_step"])
        self.consumed = int(content["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed)

    def settle_saves(self) -> None:
        """The pass's last background save: written, then sealed (common.loop.run_steps)."""
        if getattr(self, "_unsealed", None) is not None:
            began = time.monotonic()
            self.nxd.finalize_checkpoint()
            step, path, stall = self._unsealed
            self._unsealed = (step, path, stall + time.monotonic() - began)
            self._sealed()

    def finish(self) -> None:
        self.xm.rendezvous("train_llama finished")  # nobody exits while others still write


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    validate(args)
    runner = LlamaRunner(args)
    run_invocation(runner, args)
    runner.finish()
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
