"""The stand-in's process groups and its FSDP patch: what SMP v2 does with
``hybrid_shard_degree``, as its documentation describes it.

- The degree: 0 falls back to PyTorch's own FSDP when ``tensor_parallel_degree`` is 1 (here:
  HYBRID_SHARD over one node's ranks), and with tensor parallelism takes the largest degree the
  world allows (every data-parallel rank); otherwise it is the number of data-parallel ranks
  each sharding group holds, between 1 and world / tensor_parallel_degree.
- "PyTorch FSDP calls can stay as is": the training script passes no process group and no device
  mesh; SMP gives FSDP its own (shard group, replication group). A script that passes a
  device mesh as well meets FSDP's refusal of both ("Cannot pass both process_group and
  device_mesh"), which is what the real patch would meet.
- A degree of 2 or more turns any sharding strategy into HYBRID_SHARD.
- ``state.ranker``: ``get_rep_rank(rank)`` and ``get_rep_groups()``, which SageMaker's SMP v2
  example calls (checkpoints.py: the first replica's ranks write a sharded checkpoint).

The layout: tensor-parallel ranks are consecutive (the example's data-parallel rank is
``rank // tp_degree``); sharding groups are consecutive data-parallel ranks of one TP rank, and
the replication groups cross them.
"""
from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist


def degree(config_degree: int, world: int, tp: int, local_world: int) -> int:
    if config_degree < 0 or config_degree > world // tp:
        raise ValueError(f"hybrid_shard_degree {config_degree} is not between 0 and "
                         f"world size / tensor_parallel_degree = {world // tp}")
    if config_degree:
        if (world // tp) % config_degree:
            raise ValueError(f"hybrid_shard_degree {config_degree} does not divide the "
                             f"{world // tp} data-parallel ranks")
        return config_degree
    return world // tp if tp > 1 else max(1, min(local_world, world))


class Ranker:
    """Replica coordinates of a rank: which copy of its sharding group it is in."""

    def __init__(self, world: int, tp: int, shard: int) -> None:
        self.world, self.tp, self.shard = world, tp, shard

    def get_rep_rank(self, rank: int) -> int:
        return (rank // self.tp) // self.shard

    def shard_groups(self) -> list[list[int]]:
        dp = self.world // self.tp
        return [[(block * self.shard + i) * self.tp + t for i in range(self.shard)]
                for t in range(self.tp) for block in range(dp // self.shard)]

    def get_rep_groups(self) -> list[list[int]]:
        dp = self.world // self.tp
        return [[(block * self.shard + i) * self.tp + t for block in range(dp // self.shard)]
                for t in range(self.tp) for i in range(self.shard)]


def build(state: Any, config_degree: int, local_world: int) -> None:
    """Every rank creates every group in the same order (torch.distributed's rule)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    shard = degree(config_degree, world, state.tp_size, local_world)
    ranker = Ranker(world, state.tp_size, shard)
    for name, layout in (("shard_process_group", ranker.shard_groups()),
                         ("replication_process_group", ranker.get_rep_groups())):
        for ranks in layout:
            group = dist.new_group(ranks)
            if rank in ranks:
                setattr(state, name, group)
    state.hybrid_shard_degree, state.ranker = shard, ranker
    _patch_fsdp()


_PATCHED = False


def _patch_fsdp() -> None:
    """FSDP (FSDP1's ``FullyShardedDataParallel``) built after ``init`` shards over SMP's
    groups; before ``init`` (or after a test swapped the state out) it is PyTorch's own."""
    global _PATCHED
    if _PATCHED:
        return
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    original = FullyShardedDataParallel.__init__

    @functools.wraps(original)
    def init(self: Any, module: Any, process_group: Any = None,
             sharding_strategy: Any = None, *args: Any, **kwargs: Any) -> None:
        from . import state
        if state.initialized:
            if state.hybrid_shard_degree >= 2 or sharding_strategy in (
                    ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2):
                if sharding_strategy != ShardingStrategy._HYBRID_SHARD_ZERO2:
                    sharding_strategy = ShardingStrategy.HYBRID_SHARD
                if process_group is None:
                    process_group = (state.shard_process_group,
                                     state.replication_process_group)
        original(self, module, process_group, sharding_strategy, *args, **kwargs)

    FullyShardedDataParallel.__init__ = init  # type: ignore[method-assign]
    _PATCHED = True
