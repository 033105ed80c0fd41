"""Learning-rate schedule: linear warmup, a constant hold, then decay to a floor.

A pure function of the step, so a resumed run needs nothing from the checkpoint to continue the
schedule exactly where it stopped.
"""
from __future__ import annotations

import math

DECAY_SHAPES = ("linear", "cosine")


def steps_from_proportion(proportion: float, max_steps: int) -> int:
    """Turn a proportion of the run (``--warmup 0.05``) into a whole number of steps."""
    if not 0.0 <= proportion <= 1.0:
        raise ValueError(f"proportion must lie in [0, 1], got {proportion}")
    return round(proportion * max_steps)


def learning_rate(
    step: int,
    *,
    peak_lr: float,
    max_steps: int,
    warmup_steps: int = 0,
    constant_steps: int = 0,
    min_lr: float = 0.0,
    decay: str = "linear",
    decay_steps: int | None = None,
) -> float:
    """Learning rate for the update that follows ``step`` completed optimizer steps.

    Warmup ramps ``peak/W, 2·peak/W, … peak`` so that no update is taken with a zero rate; the
    decay starts at ``peak`` right after the hold and reaches ``min_lr`` at ``max_steps`` (the
    last real update, index ``max_steps - 1``, still gets a rate above the floor).

    ``decay_steps`` (Megatron's ``lr_decay_iters``) is the step at which the decay reaches
    ``min_lr`` when it should come before ``max_steps``; the rate then stays at the floor.
    """
    if decay not in DECAY_SHAPES:
        raise ValueError(f"decay must be one of {DECAY_SHAPES}, got {decay!r}")
    if step < 0 or max_steps <= 0:
        raise ValueError(f"need step >= 0 and max_steps > 0, got step={step} max_steps={max_steps}")
    decay_end = max_steps if decay_steps is None else decay_steps
    if not warmup_steps + constant_steps <= decay_end <= max_steps:
        raise ValueError(f"decay_steps {decay_end} must lie between the end of warmup and hold "
                         f"({warmup_steps + constant_steps}) and max_steps ({max_steps})")
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    hold_end = warmup_steps + constant_steps
    if step < hold_end:
        return peak_lr
    if step >= decay_end:
        return min_lr
    # Fraction of the decay span still ahead: 1 at the end of the hold, 0 at decay_end.
    remaining = (decay_end - step) / max(1, decay_end - hold_end)
    if decay == "cosine":
        remaining = 0.5 * (1.0 - math.cos(math.pi * remaining))
    return min_lr + (peak_lr - min_lr) * remaining
