"""train_fsdp.py's checkpoints: the step's folder holds trainer_state.json (rank 0) and the
model and optimizer as torch.distributed.checkpoint writes them (each rank its own shards).

Without SMP: one checkpoint over the world (its plan keeps one writer per replicated item).
With SMP, as SageMaker's SMP v2 example does (checkpoints.py): tensor-parallel slices share
parameter names and offsets, so each TP rank's part goes to its own ``tp{degree}-{tp_rank}``
folder, written over the FSDP shard group (the model's process group, as SMP made it) by the
ranks of the first replica (SMP's ranker says which); every rank loads its own TP folder over
the same group.

Saves run in the background unless --sync-save (torch.distributed.checkpoint.async_save, as
PyTorch's asynchronous checkpointing recipe does it): the state is staged into CPU memory (see
_stager) before the call returns, and the write, with DCP's own collectives, runs on a thread over
a gloo twin of the save's group (common/background.py), so it never shares a communicator with the
training loop. The step is sealed only once every rank's write is complete.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import smp_v2 as smp
from common.background import gloo_group
from common.loop import agreed_newest, sealed_save
from common.runtime import PayloadError

INFO_FILE = "trainer_state.json"


def state(trainer: Any) -> dict[str, Any]:
    """The model's and optimizer's state as this rank holds it (sharded)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(trainer.sharded, trainer.optimizer)
    return {"model": model_state, "optimizer": optim_state}


def placement(trainer: Any) -> tuple[str, Any, bool]:
    """(sub-folder, process group, whether this rank writes) of this rank's part."""
    if trainer.smp is None:
        return "", None, True
    return (smp.checkpoint_folder(trainer.smp), trainer.sharded.process_group,
            smp.replica_rank(trainer.smp, trainer.rank) == 0)


def resume(trainer: Any) -> None:
    """Load the newest complete checkpoint, if any (every rank)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    tag = agreed_newest(trainer.ckpt_root, trainer.rank)
    if tag is None:
        return
    directory = trainer.ckpt_root / tag
    info = [None]
    if trainer.rank == 0:
        info = [json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))]
    trainer.dist.broadcast_object_list(info, src=0)
    found: dict[str, Any] = info[0] or {}
    saved_tp = int(found.get("sharding", {}).get("tensor_parallel", 1))
    if saved_tp != trainer.tp:
        raise PayloadError(f"{directory}: written with tensor parallel degree {saved_tp}, "
                           f"this run has {trainer.tp}: its TP slices do not fit")
    folder, group, _ = placement(trainer)
    current = state(trainer)
    dcp.load(current, checkpoint_id=str(directory / folder), process_group=group)
    set_state_dict(trainer.sharded, trainer.optimizer, model_state_dict=current["model"],
                   optim_state_dict=current["optimizer"])
    trainer.step, trainer.consumed = int(found["step"]), int(found["consumed_samples"])
    trainer.log.emit("resume", step=trainer.step, consumed_samples=trainer.consumed,
                     checkpoint=str(directory),
                     global_batch_changed=found["global_batch_size"] != trainer.global_batch)


class _CopyStager:
    """Stages a state dict holding ShardedTensors (FSDP1 under SMP: its sharded state dict), which
    DCP's default stager in torch 2.13 cannot copy: a CPU copy of every local shard and tensor,
    so the next optimizer step cannot change what the background write reads."""

    should_synchronize_after_execute = False

    def stage(self, state_dict: Any) -> Any:
        return _copied(state_dict)

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


def _copied(value: Any) -> Any:
    import torch
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

    if isinstance(value, ShardedTensor):
        shards = [Shard(s.tensor.detach().to("cpu", copy=True), s.metadata)
                  for s in value.local_shards()]
        return ShardedTensor._init_from_local_shards_and_global_metadata(
            shards, value.metadata(), process_group=value._process_group)
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copied(item) for item in value)
    return value


def _stager(state_dict: Any) -> dict[str, Any]:
    """async_save's staging argument, as this torch takes it: nothing on a torch whose async_save
    has no `async_stager` argument (2.4.1, SMP v2's image: passing one is a TypeError there, and
    its DCP copies FSDP1's ShardedTensors itself); ours (_CopyStager) for a state holding
    ShardedTensors, which DCP's default stager cannot copy in 2.13; else DCP's default.

    On a GPU (one H200, torch 2.11, FSDP2, a 6.6-GB checkpoint) benchmarks/async_save_bench.py
    --cuda measured 9.7 s of stall against 9.3 s synchronous, but with saves 4 steps apart
    against a 10-s write: the stall was the wait for the previous write (at most one save in
    flight), not the staging (docs/trainers.md). Until it is measured with saves spaced wider
    than a write, DCP's default staging stays."""
    import inspect

    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    if "async_stager" not in inspect.signature(dcp.async_save).parameters:
        return {}

    def sharded(value: Any) -> bool:
        if isinstance(value, dict):
            return any(sharded(item) for item in value.values())
        if isinstance(value, (list, tuple)):
            return any(sharded(item) for item in value)
        return isinstance(value, ShardedTensor)

    return {"async_stager": _CopyStager()} if sharded(state_dict) else {}


def _done() -> Any:
    """A resolved future: a rank that writes nothing has finished its part at once."""
    from concurrent.futures import Future

    future: Future[None] = Future()
    future.set_result(None)
    return future


def save(trainer: Any, root: Path | None = None) -> None:
    """Write the checkpoint of the current step, sealed across ranks (common.loop), under the
    run's checkpoints or `root` (the compile pass's scratch save)."""
    import torch.distributed.checkpoint as dcp

    info = {"step": trainer.step, "consumed_samples": trainer.consumed,
            "seed": trainer.args.seed, "world_size": trainer.world,
            "global_batch_size": trainer.global_batch, "family": trainer.args.family,
            "sharding": trainer.sharding, "schedule": trainer.schedule_params()}

    def write(directory: Path) -> Any:
        current = state(trainer)   # on every rank: building it may be collective
        folder, group, writes = placement(trainer)
        if trainer.rank == 0:
            (directory / INFO_FILE).write_text(json.dumps(info) + "\n", encoding="utf-8")
        if trainer.args.sync_save:
            if writes:
                dcp.save(current, checkpoint_id=str(directory / folder), process_group=group)
            return None
        twin = gloo_group("dcp-save", group)   # every rank makes it, writer or not
        if not writes:
            return _done()
        return dcp.async_save(current, checkpoint_id=str(directory / folder),
                              process_group=twin, **_stager(current))

    sealed_save(root or trainer.ckpt_root, trainer.step, info, trainer.rank,
                trainer.args.keep_checkpoints, trainer.log, write)
