"""Llama / GPT-NeoX pretraining with PyTorch FSDP and hybrid sharding, for SageMaker training
jobs and GPU nodes on EKS.

With SageMaker's model-parallel library v2 in the image (``torch.sagemaker``, the SageMaker
PyTorch training images), it is initialised with the job's configuration (tensor-parallel degree,
hybrid-shard degree, activation offloading: the ``mp_parameters`` hyperparameter jobgen renders,
which SageMaker exposes as SM_HP_MP_PARAMETERS) and the model is transformed for tensor
parallelism. Without it, the model is sharded by plain PyTorch FSDP (``fully_shard``) over a
two-dimensional device mesh: shards within groups of --hybrid-shard ranks, replicas across
groups, which is FSDP's hybrid sharding; tensor parallelism then needs SMP and is refused.

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
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Running as a script: make ``payload/`` importable for ``common``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import args as shared
from common.events import EventLog, open_tensorboard
from common.init import scale_output_projections
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

PROG = "train-fsdp"
INFO_FILE = "trainer_state.json"
SMP_ENV = "SM_HP_MP_PARAMETERS"   # SageMaker: the mp_parameters hyperparameter, as JSON
DECODER_LAYERS = {"llama": "LlamaDecoderLayer", "gpt_neox": "GPTNeoXLayer"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    shared.add(p, ("family", "num-layers", "hidden-size", "num-heads"),
               required=("family", "num-layers", "hidden-size", "num-heads"))
    p.add_argument("--num-kv-heads", type=int, default=None)
    shared.add(p, ("intermediate-size", "seq-length", "max-position-embeddings", "vocab-size"),
               required=("intermediate-size", "seq-length", "vocab-size"))
    p.add_argument("--rope-theta", type=float, default=None)
    p.add_argument("--norm-eps", type=float, default=None)
    p.add_argument("--rotary-pct", type=float, default=None,
                   help="GPT-NeoX: the share of each head's dimensions that is rotated")
    shared.add(p, ("micro-batch-size", "gradient-accumulation", "lr", "min-lr", "warmup-steps",
                   "constant-steps"),
               required=("micro-batch-size", "gradient-accumulation", "lr"))
    p.add_argument("--decay", choices=DECAY_SHAPES, default="cosine",
                   help="shape of the decay after warmup and hold")
    shared.add(p, ("decay-steps", "beta1", "beta2", "eps", "weight-decay", "no-decay",
                   "grad-clip", "init-std", "scaled-init"),
               defaults={"beta2": 0.95})
    p.add_argument("--tensor-parallel", type=int, default=1)
    p.add_argument("--hybrid-shard", type=int, default=0,
                   help="ranks per sharding group (0: all ranks of a node)")
    p.add_argument("--activation-checkpointing", choices=("none", "selective", "full"),
                   default="none")
    p.add_argument("--activation-offloading", action="store_true")
    p.add_argument("--activation-loading-horizon", type=int, default=2)
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    data = p.add_mutually_exclusive_group(required=True)
    shared.add(data, ("data-dir",))
    data.add_argument("--synthetic", action="store_true", help="the rehearsal's token stream")
    shared.add(p, ("max-steps", "seed", "phase", "compile-steps", "steps", "checkpoint-every",
                   "keep-checkpoints", "log-every", "output-dir"),
               required=("max-steps", "checkpoint-every", "output-dir"),
               defaults={"log-every": 1})
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


def validate(args: argparse.Namespace, world: int, local_world: int) -> None:
    for name in ("num_layers", "hidden_size", "num_heads", "intermediate_size", "seq_length",
                 "micro_batch_size", "gradient_accumulation", "max_steps", "compile_steps",
                 "checkpoint_every", "keep_checkpoints", "tensor_parallel", "log_every"):
        if getattr(args, name) < 1:
            raise PayloadError(f"--{name.replace('_', '-')} must be at least 1")
    if args.hidden_size % args.num_heads:
        raise PayloadError(f"--hidden-size {args.hidden_size} is not divisible by --num-heads "
                           f"{args.num_heads}")
    shard = args.hybrid_shard or local_world
    if world % (shard * args.tensor_parallel):
        raise PayloadError(f"--hybrid-shard {shard} x --tensor-parallel {args.tensor_parallel} "
                           f"does not divide the {world} ranks")
    if args.steps < -1:
        raise PayloadError("--steps must be -1 (no bound) or >= 0")


def smp_config(args: argparse.Namespace) -> dict[str, Any]:
    """SMP v2's core configuration for this run: SageMaker's mp_parameters where the job has
    them (they win, as in SageMaker's own launcher), else the flags."""
    mine = {"tensor_parallel_degree": args.tensor_parallel,
            "hybrid_shard_degree": args.hybrid_shard,
            "sm_activation_offloading": args.activation_offloading,
            "activation_loading_horizon": args.activation_loading_horizon,
            "random_seed": args.seed}
    given = os.environ.get(SMP_ENV)
    if given:
        try:
            mine.update(json.loads(given))
        except ValueError:
            raise PayloadError(f"{SMP_ENV} is not JSON: {given[:80]!r}") from None
    return mine


def load_smp() -> Any:
    """torch.sagemaker where the image has it (SageMaker's PyTorch training images), else None."""
    try:
        import torch.sagemaker as tsm  # type: ignore[import-not-found]
    except ImportError:
        return None
    return tsm


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
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        self.smp = load_smp()
        if self.smp is not None:
            self.smp.init(smp_config(args))
        elif args.tensor_parallel > 1:
            raise PayloadError(f"--tensor-parallel {args.tensor_parallel} needs SageMaker's "
                               "model-parallel library v2 (torch.sagemaker), which this image "
                               "does not have; use a SageMaker PyTorch training image or "
                               "parallelism.tensor 1")
        torch.manual_seed(args.seed)   # identical initial weights on every rank
        model = build_model(args)
        if args.scaled_init:
            scale_output_projections(model, OUTPUT_PROJECTIONS[args.family], args.init_std,
                                     args.num_layers)
        if self.smp is not None and args.tensor_parallel > 1:
            model = self.smp.transform(model)
        if args.activation_checkpointing != "none":
            model.gradient_checkpointing_enable()
        self.model = self._shard(model, local_world)
        groups = parameter_groups(self.model.named_parameters(), args.weight_decay,
                                  args.no_decay) if args.no_decay is not None else [
            {"params": [p for p in self.model.parameters() if p.ndim >= 2],
             "weight_decay": args.weight_decay},
            {"params": [p for p in self.model.parameters() if p.ndim < 2],
             "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2),
                                           eps=args.eps)
        self.data = TokenData(args)
        self.global_batch = args.micro_batch_size * args.gradient_accumulation * (
            self.world // args.tensor_parallel)
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

    def _shard_smp(self, model: Any) -> Any:
        """With SMP v2: FSDP's hybrid sharding, whose groups SMP sizes from hybrid_shard_degree
        and places beside its tensor-parallel groups (SMP v2's documented use of FSDP). Not run
        here: no image with torch.sagemaker is available to the tests."""
        import functools

        from torch.distributed.fsdp import (
            FullyShardedDataParallel,
            MixedPrecision,
            ShardingStrategy,
        )
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        args, torch = self.args, self.torch
        layers = {type(m) for m in model.modules()
                  if type(m).__name__ == DECODER_LAYERS[args.family]}
        dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
        self.sharding = {"smp": smp_config(args)}
        return FullyShardedDataParallel(
            model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                      transformer_layer_cls=layers),
            sharding_strategy=ShardingStrategy.HYBRID_SHARD,
            mixed_precision=MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32,
                                           buffer_dtype=dtype),
            device_id=torch.cuda.current_device(), limit_all_gathers=True)

    def _shard(self, model: Any, local_world: int) -> Any:
        """FSDP over a (replicate, shard) mesh: hybrid sharding with groups of --hybrid-shard
        ranks (default: one node), each decoder layer its own unit."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        args, torch = self.args, self.torch
        if self.smp is not None:
            return self._shard_smp(model)
        shard = args.hybrid_shard or local_world
        replicas = self.world // (shard * args.tensor_parallel)
        mesh = init_device_mesh(self.device.type, (replicas, shard),
                                mesh_dim_names=("replicate", "shard"))
        self.sharding = {"replicas": replicas, "shard_group": shard}
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if args.precision == "bf16" and args.device == "cuda" else MixedPrecisionPolicy()
        model.to(self.device)
        layer = DECODER_LAYERS[args.family]
        for module in model.modules():
            if type(module).__name__ == layer:
                fully_shard(module, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model

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
        dp_rank, dp_world = self.rank // args.tensor_parallel, self.world // args.tensor_parallel
        micro = batch_positions(self.consumed, args.micro_batch_size,
                                args.gradient_accumulation, dp_world, dp_rank)
        loss_sum = torch.zeros((), device=self.device)
        for index, positions in enumerate(micro):
            tokens = self.data.batch(torch, positions).to(self.device)
            # FSDP reduces gradients once per optimizer step, after the last micro-batch.
            if hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(index == len(micro) - 1)
            loss = self.model(input_ids=tokens, labels=tokens).loss
            (loss / len(micro)).backward()
            loss_sum += loss.detach()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), args.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.dist.all_reduce(loss_sum)
        elapsed = time.perf_counter() - started
        self.step += 1
        self.consumed += self.global_batch
        return {"loss": loss_sum.item() / (len(micro) * self.world), "grad_norm": float(norm),
                "lr": lr, "samples_per_s": round(self.global_batch / elapsed, 2)}

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def resume(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict
        tag = agreed_newest(self.ckpt_root, self.rank)
        if tag is None:
            return
        directory = self.ckpt_root / tag
        state = self._state()
        dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        info = [None]
        if self.rank == 0:
            info = [json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))]
        self.dist.broadcast_object_list(info, src=0)
        found: dict[str, Any] = info[0] or {}
        self.step, self.consumed = int(found["step"]), int(found["consumed_samples"])
        self.log.emit("resume", step=self.step, consumed_samples=self.consumed,
                      checkpoint=str(directory),
                      global_batch_changed=found["global_batch_size"] != self.global_batch)

    def save(self, root: Path | None = None) -> None:
        import torch.distributed.checkpoint as dcp
        info = {"step": self.step, "consumed_samples": self.consumed, "seed": self.args.seed,
                "world_size": self.world, "global_batch_size": self.global_batch,
                "family": self.args.family, "sharding": self.sharding,
                "schedule": self.schedule_params()}

        def write(directory: Path) -> None:
            # Sharded: every rank writes its own shards (torch.distributed.checkpoint), so a
            # node needs only its part, and a resume on another world size re-shards.
            dcp.save(self._state(), checkpoint_id=str(directory))
            if self.rank == 0:
                (directory / INFO_FILE).write_text(json.dumps(info) + "\n", encoding="utf-8")

        sealed_save(root or self.ckpt_root, self.step, info, self.rank, self.args.keep_checkpoints,
                    self.log, write)

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
