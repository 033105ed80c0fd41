"""A stand-in for SageMaker's model-parallel library v2 (``torch.sagemaker``), for CPU tests.

SMP v2 installs only inside SageMaker's PyTorch training images, so CI cannot import the real one.
This package reproduces the small part of SMP v2's *documented* surface that
payload/smp_fsdp/ calls, written from the SageMaker developer guide (“Use the SageMaker model
parallelism library v2”, its reference for the ``torch.sagemaker`` package, and the pages on
tensor parallelism, activation checkpointing and activation offloading) — not from SMP's code,
which is not public, and not from what the program happens to call:

- ``init(config)``: SMP's core configuration (``tensor_parallel_degree``,
  ``hybrid_shard_degree``, ``sm_activation_offloading``, ``activation_loading_horizon``,
  ``random_seed``; the same keys as the ``mp_parameters`` hyperparameter) after
  ``torch.distributed`` is initialised.
- ``state``: ``tp_rank``, ``tp_size`` (= ``tensor_parallel_degree``), ``tp_process_group``,
  ``hybrid_shard_degree`` (as SMP resolved it), ``sm_activation_offloading``, and ``ranker``
  (replica coordinates, which SageMaker's example reads to pick a checkpoint's writers).
- FSDP without process groups: after ``init``, FSDP shards over SMP's own groups, built from
  ``hybrid_shard_degree`` (groups.py says how, and what the documentation says of it).
- ``transform(model)``: replaces the Hugging Face decoder layers with SMP's own transformer layer
  class, ``torch.sagemaker.tensor_parallel.transformer.TransformerLayer`` (which is why a wrap or
  checkpoint policy must name that class), with weights split over the tensor-parallel group.
- ``grad_norm.clip_grad_norm_(model, max_norm)``: the gradient clip that knows FSDP shards and
  tensor-parallel slices: one global norm, the same on every rank.

What it leaves out on purpose: Transformer Engine kernels, attention split over TP ranks (only the
MLP is split here: enough to give TP ranks different slices under the same parameter names, which
is what checkpoints must keep apart), context and expert parallelism, delayed parameter
initialisation, FP8, SMP's own checkpoint formats.

``install()`` registers this package as ``torch.sagemaker`` (and its submodules) in
``sys.modules``, so ``import torch.sagemaker`` finds it; call it in every process before the
program imports SMP.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from . import grad_norm, groups, transformer

_NAMES = {"torch.sagemaker": __name__, "torch.sagemaker.grad_norm": grad_norm.__name__,
          "torch.sagemaker.tensor_parallel": transformer.__name__,
          "torch.sagemaker.tensor_parallel.transformer": transformer.__name__}


@dataclass
class _State:
    tp_rank: int = 0
    tp_size: int = 1
    tp_process_group: Any = None
    hybrid_shard_degree: int = 0
    sm_activation_offloading: bool = False
    activation_loading_horizon: int = 2
    initialized: bool = False
    shard_process_group: Any = None
    replication_process_group: Any = None
    ranker: Any = None

    @property
    def tensor_parallel_degree(self) -> int:
        return self.tp_size


state = _State()
calls: list[str] = []   # what the program asked of SMP, in order (the tests read it)


def install() -> None:
    for alias, real in _NAMES.items():
        sys.modules[alias] = sys.modules[real]


def init(config: dict[str, Any] | None = None) -> None:
    """SMP v2: ``torch.sagemaker.init(config)``. Tensor-parallel groups are blocks of
    consecutive ranks (the example's data-parallel rank is ``rank // tp_degree``)."""
    import torch.distributed as dist

    config = dict(config or {})
    tp = int(config.get("tensor_parallel_degree", 1) or 1)
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % tp:
        raise ValueError(f"tensor_parallel_degree {tp} does not divide world size {world}")
    for start in range(0, world, tp):   # every rank creates every group, in the same order
        group = dist.new_group(list(range(start, start + tp)))
        if start <= rank < start + tp:
            state.tp_process_group = group
    state.tp_size, state.tp_rank = tp, rank % tp
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    groups.build(state, int(config.get("hybrid_shard_degree", 0) or 0), local_world)
    state.sm_activation_offloading = bool(config.get("sm_activation_offloading", False))
    state.activation_loading_horizon = int(config.get("activation_loading_horizon", 2))
    state.initialized = True
    calls.append("init")


def transform(model: Any, **_: Any) -> Any:
    """SMP v2: ``torch.sagemaker.transform(model)``: the model with SMP's layers in place."""
    if not state.initialized:
        raise RuntimeError("torch.sagemaker.init() must run before transform()")
    calls.append("transform")
    return transformer.replace_layers(model, state.tp_rank, state.tp_size,
                                      state.tp_process_group)
