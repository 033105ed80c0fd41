"""Initialisation shared by the payloads: the process group's collective timeout, and the scaled
initialisation of the output projections (the NxD Llama program and the smoke trainer, so that it
runs on CPU in the tests).

Every trainer hands ``process_group_timeout()`` to ``init_process_group`` (DeepSpeed's
``init_distributed``): a collective whose peer is gone fails after JOBGEN_COLLECTIVE_TIMEOUT
seconds (the node contract, jobgen/payloads/node.py) instead of waiting for the job's time limit.

HLAT (REFERENCE.md A.3) initialises the projections that write into the residual stream (the
attention output and the MLP down projection) with std / sqrt(2 x layers), so that the stream's
variance does not grow with depth; everything else keeps the base std.
"""
from __future__ import annotations

import datetime
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.runtime import PayloadError

COLLECTIVE_TIMEOUT_ENV = "JOBGEN_COLLECTIVE_TIMEOUT"
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800   # torch's own default; the node contract declares the job's


def process_group_timeout(env: Mapping[str, str] | None = None) -> datetime.timedelta:
    """The collective timeout the job declares (JOBGEN_COLLECTIVE_TIMEOUT seconds), for
    ``init_process_group(timeout=...)``; torch's default where a job started by hand has none."""
    text = str((os.environ if env is None else env).get(COLLECTIVE_TIMEOUT_ENV, "")).strip()
    if not text:
        return datetime.timedelta(seconds=DEFAULT_COLLECTIVE_TIMEOUT_S)
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 and math.isfinite(seconds)):
        raise PayloadError(f"{COLLECTIVE_TIMEOUT_ENV}={text!r} is not a positive number of "
                           "seconds")
    return datetime.timedelta(seconds=seconds)

# draw(name, param, std) -> a CPU tensor with param's shape holding its new values.
Draw = Callable[[str, Any, float], Any]


def scaled_std(std: float, num_layers: int) -> float:
    return std / math.sqrt(2 * num_layers)


def normal_draw(generator: Any = None) -> Draw:
    """N(0, std) in float32 on the CPU, from ``generator`` (None: torch's global generator)."""
    import torch

    def draw(name: str, param: Any, std: float) -> Any:
        return torch.empty(tuple(param.shape), dtype=torch.float32).normal_(
            0.0, std, generator=generator)
    return draw


def sharded_draw(parts: int, rank: int, dim: int, generator: Any = None) -> Draw:
    """This rank's slice of a full N(0, std) matrix, for a parameter split into ``parts`` equal
    slices along ``dim`` (a tensor-parallel shard).

    Every rank draws the whole matrix from the same generator and keeps its own slice, as NxD
    initialises its parallel layers: the initial model is the same for any tensor-parallel
    degree, and ranks holding the same shard (data-parallel replicas) get identical values."""
    import torch

    def draw(name: str, param: Any, std: float) -> Any:
        shape = list(param.shape)
        shape[dim] *= parts
        full = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
        return full.chunk(parts, dim=dim)[rank].contiguous()
    return draw


def scale_output_projections(model: Any, fragments: Sequence[str], std: float,
                             num_layers: int, generator: Any = None,
                             draw: Draw | None = None) -> list[str]:
    """Re-draw the weights of parameters whose names contain one of ``fragments`` with std
    ``scaled_std(std, num_layers)``; biases are left alone. Returns the names re-drawn.

    Values come from ``draw`` (default: ``normal_draw(generator)``) and are computed on the CPU
    and copied in, so parameters that already live on an accelerator are handled too."""
    import torch

    target = scaled_std(std, num_layers)
    pick = draw if draw is not None else normal_draw(generator)
    done = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("weight") and any(f in name for f in fragments):
                values = pick(name, param, target)
                if tuple(values.shape) != tuple(param.shape):
                    raise ValueError(f"{name}: drew {tuple(values.shape)} for a parameter of "
                                     f"shape {tuple(param.shape)}")
                param.copy_(values)
                done.append(name)
    return done
