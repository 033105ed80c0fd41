"""Runs payload/smp_fsdp/train_fsdp.py's trainer under torchrun with the torch.sagemaker
stand-in installed, for tests/test_smp_fsdp.py: each rank writes what it saw as JSON.

usage: torchrun ... smp_scenarios.py train-save|load|plain-norm|run OUT_DIR TRAINER_FLAG...

- train-save: one step with the clip out of reach (the norm it reports, and the norm of the same
  step on the plain, unsharded Hugging Face model), two more steps, a checkpoint, and each rank's
  own model tensors (its FSDP shard of its TP slice) saved aside with torch.save.
- load: a fresh trainer resumes from that checkpoint; are its tensors the ones saved aside?
- plain-norm: without the stand-in (FSDP2): the first step's norm, and the unsharded model's.
- run: the program itself (train_fsdp.main: its loop, checkpoints and metrics.jsonl), with SMP.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent.parent / "payload" / "smp_fsdp"),
                str(HERE.parent.parent / "payload")]

import torch  # noqa: E402
import torch_sagemaker  # noqa: E402

if not sys.argv[1].startswith("plain"):
    torch_sagemaker.install()

import fsdp_checkpoint  # noqa: E402
import train_fsdp  # noqa: E402
from common.models import build_model  # noqa: E402
from common.runtime import batch_positions  # noqa: E402


def local_part(value: torch.Tensor) -> torch.Tensor:
    """This rank's shard: a DTensor's (FSDP over a device mesh) or a ShardedTensor's (FSDP
    over process groups, as with SMP)."""
    if hasattr(value, "to_local"):
        return value.to_local()
    if hasattr(value, "local_shards"):
        shards = value.local_shards()
        return shards[0].tensor if shards else torch.empty(0)
    return value


def local_model_state(trainer: Any) -> dict[str, torch.Tensor]:
    model_state = fsdp_checkpoint.state(trainer)["model"]
    return {name: local_part(v).detach().clone()
            for name, v in model_state.items() if isinstance(v, torch.Tensor)}


def reference_norm(trainer: Any) -> float:
    """Step 1's gradient norm on the unsharded, untransformed model: the mean loss over every
    data-parallel rank's samples, as FSDP averages it."""
    args = trainer.args
    torch.manual_seed(args.seed)
    model = build_model(args)
    dp_world = trainer.world // trainer.tp
    losses = []
    for dp_rank in range(dp_world):
        for positions in batch_positions(0, args.micro_batch_size, args.gradient_accumulation,
                                         dp_world, dp_rank):
            tokens = trainer.data.batch(torch, positions)
            losses.append(model(input_ids=tokens, labels=tokens, use_cache=False).loss)
    torch.stack(losses).mean().backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))


def main() -> None:
    scenario, out = sys.argv[1], Path(sys.argv[2])
    if scenario == "run":
        raise SystemExit(train_fsdp.main(sys.argv[3:]))
    args = train_fsdp.parse_args(sys.argv[3:])
    trainer = train_fsdp.FsdpTrainer(args, "launcher")
    rank = trainer.rank
    report: dict[str, Any] = {"tp_rank": trainer.tp_rank, "tp": trainer.tp}
    if trainer.smp is not None:
        report["shard_ranks"] = torch.distributed.get_process_group_ranks(
            trainer.sharded.process_group)
    if scenario in ("train-save", "plain-norm"):
        report["norm"] = trainer.train_step()["grad_norm"]
        report["reference_norm"] = reference_norm(trainer)
    if scenario == "train-save":
        trainer.train_step()
        trainer.train_step()
        trainer.save()
        from common import background
        background.finish(wait=True)   # saves run in the background: sealed once written
        state = local_model_state(trainer)
        torch.save(state, out / f"saved-rank{rank}.pt")
        report["mlp_slice_sum"] = float(sum(v.double().sum() for k, v in state.items()
                                            if "mlp" in k))
    elif scenario == "load":
        saved = torch.load(out / f"saved-rank{rank}.pt")
        fresh = local_model_state(trainer)
        report["difference_before_load"] = max(float((saved[k] - fresh[k]).abs().max())
                                               if saved[k].numel() else 0.0 for k in saved)
        trainer.resume()
        loaded = local_model_state(trainer)
        report["resumed_step"] = trainer.step
        report["same_names"] = sorted(saved) == sorted(loaded)
        report["max_difference"] = max(float((saved[k] - loaded[k]).abs().max())
                                       if saved[k].numel() else 0.0 for k in saved)
    (out / f"{scenario}-rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
