"""The stand-in's ``torch.sagemaker.grad_norm.clip_grad_norm_``: the gradient norm of the whole
model, however FSDP shards it and TP splits it, the same on every rank; gradients are scaled in
place when it exceeds ``max_norm``."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .transformer import TP_SPLIT


def clip_grad_norm_(model: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if norm_type != 2.0:
        raise NotImplementedError("the stand-in computes the 2-norm only")
    from . import state

    fsdp = next(m for m in model.modules() if isinstance(m, FullyShardedDataParallel))
    params = [p for p in model.parameters() if p.grad is not None]
    # Squares of TP-split slices and of replicated tensors, summed over this rank's FSDP shards.
    squares = torch.zeros(2, dtype=torch.float32)
    for p in params:
        squares[0 if getattr(p, TP_SPLIT, False) else 1] += p.grad.detach().float().pow(2).sum()
    dist.all_reduce(squares, group=fsdp.process_group)    # all shards of the replica
    if state.tp_size > 1:
        split = squares[:1].clone()
        dist.all_reduce(split, group=state.tp_process_group)   # every TP slice, once
        squares[0] = split[0]
    total = squares.sum().sqrt()
    coefficient = max_norm / (float(total) + 1e-6)
    if coefficient < 1.0:
        for p in params:
            p.grad.detach().mul_(coefficient)
    return total
