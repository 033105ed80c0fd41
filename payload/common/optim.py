"""Which parameters get weight decay, decided once for every payload.

Recipes say it with ``optim.no_decay``: a list of name fragments whose parameters are excluded
from weight decay. An empty list decays every parameter (HLAT: "weight decay 0.1 on all
parameters"); the usual Megatron/BERT practice excludes biases and normalisation weights.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def excluded(name: str, no_decay: Sequence[str]) -> bool:
    """True when the parameter ``name`` matches one of the ``no_decay`` fragments."""
    lowered = name.lower()
    return any(fragment.lower() in lowered for fragment in no_decay)


def parameter_groups(named_parameters: Iterable[tuple[str, Any]], weight_decay: float,
                     no_decay: Sequence[str]) -> list[dict[str, Any]]:
    """Optimizer parameter groups: decayed parameters first, then the excluded ones (a group is
    left out when it would be empty, which some optimizers refuse)."""
    decay: list[Any] = []
    plain: list[Any] = []
    for name, param in named_parameters:
        if not getattr(param, "requires_grad", True):
            continue
        (plain if excluded(name, no_decay) else decay).append(param)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    return groups
