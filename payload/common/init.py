"""Scaled initialisation of the output projections, shared by the NxD Llama program and the
smoke trainer (so that it runs on CPU in the tests).

HLAT (REFERENCE.md A.3) initialises the projections that write into the residual stream (the
attention output and the MLP down projection) with std / sqrt(2 x layers), so that the stream's
variance does not grow with depth; everything else keeps the base std.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def scaled_std(std: float, num_layers: int) -> float:
    return std / math.sqrt(2 * num_layers)


def scale_output_projections(model: Any, fragments: Sequence[str], std: float,
                             num_layers: int, generator: Any = None) -> list[str]:
    """Re-draw the weights of parameters whose names contain one of ``fragments`` from
    N(0, scaled_std(std, num_layers)); biases are left alone. Returns the names re-drawn.
    ``generator`` (a torch.Generator) lets tensor-parallel ranks draw different shards."""
    import torch

    target = scaled_std(std, num_layers)
    done = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("weight") and any(f in name for f in fragments):
                param.normal_(0.0, target, generator=generator)
                done.append(name)
    return done
