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

# Running as a script: make ``payload/`` importable for ``common``.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import args as shared
from common.events import EventLog, open_tensorboard
from common.init import process_group_timeout, scale_output_projections, sharded_draw
from common.loop import run_invocation
from common.optim import parameter_groups
from common.runtime import PayloadError, run_main
from common.schedule import learning_rate
from common.stream import RankStream

PROG = "train-llama"
UPSTREAM_MODULES = ("modeling_llama_nxd.py", "training_utils.py")  # in the example's parent
OUTPUT_PROJECTIONS = ("o_proj", "down_proj")  # they write into the residual stream
# Kept out of weight decay when the recipe names nothing: the example's rule from NxD 2.22 on
# (at 2.20 it named "LayerNorm", which no Llama parameter contains).
EXAMPLE_NO_DECAY = ("bias", "norm")
CHECKPOINT_WORKERS = 8
ROW_PARALLEL_DIM = 1  # NxD's RowParallelLinear splits its weight along the input dimension


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


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
        self.model = nxd.initialize_parallel_model(config, self._build_model)
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
        # As the example's 7B script and model config set them: fused QKV, the NKI flash
        # attention kernel, no KV replication, each MLP moved to the device as it is built.
        config.kv_shared_group_size = 1
        config.qkv_linear = True
        config.use_flash_attention = True
        for name, value in (("move_model_to_device", True), ("pretraining_tp", 1),
                            # read from NxD 2.21 / 2.23 on, set as those examples default them
                            ("fuse_qkv", True), ("transpose_nki_inputs", True)):
            if not hasattr(config, name):
                setattr(config, name, value)
        config.initializer_range = args.init_std
        model = LlamaForCausalLM(config)
        with self.torch.no_grad():
            # One sine/cosine table for every layer (the example's trick: the compiler then
            # keeps a single lookup).
            cos, sin = get_sin_cos_matrix(config)
            for layer in model.model.layers:
                layer.self_attn.rotary_emb.cos_cached = cos
                layer.self_attn.rotary_emb.sin_cached = sin
        if args.scaled_init:
            # Draw each full matrix from one seeded stream and keep this rank's slice, as NxD
            # initialises its parallel layers: the same model for any tensor-parallel degree.
            draw = sharded_draw(self.parallel_state.get_tensor_model_parallel_size(),
                                self.parallel_state.get_tensor_model_parallel_rank(),
                                ROW_PARALLEL_DIM, self.torch.Generator().manual_seed(args.seed))
            names = scale_output_projections(model, OUTPUT_PROJECTIONS, args.init_std,
                                             config.num_hidden_layers, draw=draw)
            if len(names) != 2 * config.num_hidden_layers:
                raise PayloadError(f"--scaled-init: expected {2 * config.num_hidden_layers} "
                                   f"output projections ({', '.join(OUTPUT_PROJECTIONS)}), "
                                   f"the example's model has {len(names)}")
        return model

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
