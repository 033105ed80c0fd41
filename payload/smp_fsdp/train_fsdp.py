"""Llama / GPT-NeoX pretraining with PyTorch FSDP and hybrid sharding, for SageMaker training
jobs and GPU nodes on EKS.

With SageMaker's model-parallel library v2 in the image (``torch.sagemaker``, the SageMaker
PyTorch training images) it trains as SageMaker's own SMP v2 example does (smp_v2.py,
fsdp_model.py, fsdp_checkpoint.py say how): SMP is initialised with the job's configuration (the
``mp_parameters`` hyperparameter jobgen renders, which SageMaker exposes as SM_HP_MP_PARAMETERS),
the model is transformed, FSDP hybrid-shards each of SMP's transformer layers over the process
groups SMP chooses (the program passes FSDP none, as the example does), and each tensor-parallel
rank checkpoints its own slices. Without it, the model is sharded by plain PyTorch FSDP
(``fully_shard``) over a two-dimensional device mesh: shards within groups of --hybrid-shard
ranks, replicas across groups, which is FSDP's hybrid sharding; tensor parallelism then needs SMP
and is refused.

The step/checkpoint/resume contract is payload/common/loop.py's, shared with every program of
jobgen: the compile pass (a warm-up on GPUs: the first steps build the kernels and the NCCL
communicators) runs exactly --compile-steps steps and saves nothing; the training pass resumes
from the newest complete checkpoint. A checkpoint is sharded (torch.distributed.checkpoint:
each rank writes its shards): SageMaker uploads each node's /opt/ml/checkpoints to the job's S3
URI and restores all of it on every node of a retried job.

On CPU (``--device cpu``, the rehearsal) the same program runs over gloo with a tiny model and the
synthetic token stream.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

# ``payload/`` importable for ``common``, and this folder for the program's own modules (a
# script has its folder on the path already; a caller that imports this file does not).
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]

import fsdp_checkpoint
import fsdp_flags as flags
import fsdp_model as sharding
import smp_v2 as smp
from common.events import EventLog, open_tensorboard
from common.init import process_group_timeout, scale_output_projections
from common.loop import run_invocation
from common.models import OUTPUT_PROJECTIONS, build_model, synthetic_tokens
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
from fsdp_flags import shard_or_default, validate

PROG = "train-fsdp"


def parser() -> argparse.ArgumentParser:
    return flags.parser(PROG, __doc__.splitlines()[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


class TokenData:
    """Sample ``position`` of the global stream: a row of the tokenized dataset (wrapping
    around), or the synthetic stream of rehearsals."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows: Any = None
        if args.data_dir is not None:
            import datasets  # type: ignore[import-not-found]
            if not args.data_dir.exists():
                raise PayloadError(f"--data-dir {args.data_dir}: no such folder")
            self.rows = datasets.load_from_disk(str(args.data_dir))
            if "input_ids" not in self.rows.column_names:
                raise PayloadError(f"--data-dir {args.data_dir}: no input_ids column "
                                   f"(columns: {', '.join(self.rows.column_names)})")

    def batch(self, torch: Any, positions: list[int]) -> Any:
        args = self.args
        if self.rows is None:
            rows = [synthetic_tokens(p, args.seq_length, args.vocab_size, args.seed)
                    for p in positions]
        else:
            rows = [list(self.rows[p % len(self.rows)]["input_ids"])[:args.seq_length]
                    for p in positions]
        return torch.tensor(rows, dtype=torch.long)


class FsdpTrainer:
    """Implements ``common.loop.Runner``."""

    def __init__(self, args: argparse.Namespace, ranks_from: str) -> None:
        import torch
        import torch.distributed as dist

        self.args, self.torch, self.dist = args, torch, dist
        self.rank, self.world, self.local_rank = dist_coords()
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        validate(args, self.world, local_world)
        if args.device == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        # NCCL where the example's default is SMDDP (``smddp``: SageMaker's collectives, on
        # SageMaker training jobs only): the same program runs on EKS GPU nodes, and nothing
        # here can rehearse SMDDP.
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo",
                                timeout=process_group_timeout())
        self.smp = smp.load()
        self._place(local_world)
        self.model = self._build()
        # The example's AdamW, eps given (its default, 1e-8, unless the recipe says otherwise).
        self.optimizer = torch.optim.AdamW(
            sharding.param_groups(self.sharded, self.decay), lr=args.lr,
            betas=(args.beta1, args.beta2), eps=args.eps)
        self.data = TokenData(args)
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * (
            self.world // self.tp)
        self.ckpt_root = args.output_dir / "checkpoints"
        self.training = args.phase == "train"
        if self.training:
            args.output_dir.mkdir(parents=True, exist_ok=True)
        self.log = EventLog(self.rank,
                            args.output_dir / "metrics.jsonl" if self.training else None)
        self.log.emit("start", phase=args.phase, family=args.family, accelerator=args.device,
                      backend=dist.get_backend(), sharding=self.sharding,
                      smp=self.smp is not None, world_size=self.world, ranks_from=ranks_from,
                      global_batch_size=self.global_batch,
                      parameters=sum(p.numel() for p in self.model.parameters()))
        self.tensorboard = (open_tensorboard(args.output_dir / "tensorboard", self.log)
                            if self.training else None)
        self.step, self.consumed = 0, 0

    def _place(self, local_world: int) -> None:
        """SMP's configuration and tensor-parallel degree (with SMP: SMP makes the process
        groups), or the device mesh of plain FSDP's hybrid sharding (without)."""
        args = self.args
        self.offloading = args.activation_offloading
        self.sharding: dict[str, Any] = {}
        self.mesh: Any = None
        if self.smp is not None:
            config = smp.config(args)
            self.smp.init(config)
            self.tp_rank, self.tp = smp.tp_coords(self.smp)
            # SMP's state, not the flag: mp_parameters may say otherwise (and they win).
            self.offloading = bool(self.smp.state.sm_activation_offloading)
            self.sharding["smp"] = config
            return   # the shard group is known once FSDP has it (_build)
        if args.tensor_parallel > 1:
            raise PayloadError(f"--tensor-parallel {args.tensor_parallel} needs SageMaker's "
                               "model-parallel library v2 (torch.sagemaker), which this image "
                               "does not have; use a SageMaker PyTorch training image or "
                               "parallelism.tensor 1")
        self.tp_rank, self.tp = 0, 1
        shard = shard_or_default(args.hybrid_shard, self.world, 1, local_world)
        if self.world % shard:
            raise PayloadError(f"hybrid shard degree {shard} does not divide the {self.world} "
                               "ranks")
        self.mesh = sharding.device_mesh(self.device.type, self.world, shard)
        self.sharding.update(replicas=self.world // shard, shard_group=shard, tensor_parallel=1)

    def _build(self) -> Any:
        """The model, transformed (SMP), sharded, checkpointed and offloaded; ``self.sharded``
        is the FSDP root, ``self.decay`` the weight decay of each parameter name."""
        args, torch = self.args, self.torch
        torch.manual_seed(args.seed)   # identical initial weights on every rank
        model = build_model(args)      # fp32 parameters, as FSDP's mixed precision expects
        if args.scaled_init:
            scale_output_projections(model, OUTPUT_PROJECTIONS[args.family], args.init_std,
                                     args.num_layers)
        bf16 = args.precision == "bf16"
        if self.smp is not None:
            model = self.smp.transform(model)   # the example transforms whenever SMP is used
            layer = smp.layer_class()
            self.decay = sharding.decay_plan(model, args.weight_decay, args.no_decay)
            model = sharding.shard_smp(model, layer, bf16, self.device)
            # What SMP chose: FSDP's shard group, within one tensor-parallel rank's peers.
            shard = self.dist.get_world_size(model.process_group)
            self.sharding.update(replicas=self.world // (shard * self.tp), shard_group=shard,
                                 tensor_parallel=self.tp)
            # After FSDP, re-entrant, as in the example (its offloading needs re-entrant).
            sharding.checkpoint_layers(model, layer, args.activation_checkpointing, True)
        else:
            layer = sharding.hf_layer_class(model, args.family)
            self.decay = sharding.decay_plan(model, args.weight_decay, args.no_decay)
            model.to(self.device)
            sharding.checkpoint_layers(model, layer, args.activation_checkpointing, False)
            model = sharding.shard_plain(model, self.mesh, layer, bf16)
        self.sharded = model
        return sharding.offload(model) if self.offloading else model

    def schedule_params(self) -> dict[str, Any]:
        a = self.args
        return {"peak_lr": a.lr, "min_lr": a.min_lr, "max_steps": a.max_steps,
                "warmup_steps": a.warmup_steps, "constant_steps": a.constant_steps,
                "decay": a.decay, "decay_steps": a.decay_steps}

    def train_step(self) -> dict[str, Any]:
        torch, args = self.torch, self.args
        torch.manual_seed(step_seed(args.seed, self.step + 1, self.rank))
        lr = learning_rate(self.step, **self.schedule_params())
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        # Tensor-parallel peers train on the same samples (the example's rank // tp_degree).
        dp_rank, dp_world = self.rank // self.tp, self.world // self.tp
        micro = batch_positions(self.consumed, args.micro_batch_size,
                                args.gradient_accumulation, dp_world, dp_rank)
        loss_sum = torch.zeros((), device=self.device)
        for index, positions in enumerate(micro):
            tokens = self.data.batch(torch, positions).to(self.device)
            # FSDP2 reduces gradients once per optimizer step, after the last micro-batch.
            # FSDP1 (SMP's path) reduces after each micro-batch: the example trains one
            # micro-batch per step, and FSDP1's no_sync would keep whole gradients on each rank.
            if hasattr(self.sharded, "set_requires_gradient_sync"):
                self.sharded.set_requires_gradient_sync(index == len(micro) - 1)
            loss = self.model(input_ids=tokens, labels=tokens, use_cache=False).loss
            (loss / len(micro)).backward()
            loss_sum += loss.detach()
        # The global norm, the same on every rank: SMP's clip with SMP (FSDP shards and TP
        # slices), FSDP2's DTensor norm without.
        norm = smp.clip(self.model, args.grad_clip) if self.smp is not None \
            else sharding.clip_plain(self.sharded, args.grad_clip)
        self.optimizer.step()
        self.dist.all_reduce(loss_sum)
        elapsed = time.perf_counter() - started
        self.step += 1
        self.consumed += self.global_batch
        numbers = {"loss": loss_sum.item() / (len(micro) * self.world), "grad_norm": norm,
                   "lr": lr, "samples_per_s": round(self.global_batch / elapsed, 2)}
        if self.device.type == "cuda":
            numbers["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        return numbers

    def save(self, root: Path | None = None) -> None:
        fsdp_checkpoint.save(self, root)

    def resume(self) -> None:
        fsdp_checkpoint.resume(self)

    def run(self) -> None:
        run_invocation(self, self.args)
        finish_distributed(self.dist)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ranks_from = ensure_process_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    FsdpTrainer(args, ranks_from).run()
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
