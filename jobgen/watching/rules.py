"""The detectors' thresholds (`jobgen watch`'s options): their own module, so that the detector
mixins (divergence.py, pace.py, restarts.py) and `Detectors` that combines them all read it
without importing each other."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    spike_window: int = 20
    spike_margin: float = 0.1
    spike_patience: int = 5
    growth_factor: float = 3.0
    growth_steps: int = 5
    loss_spike: float = 0.5
    hang_factor: float = 10.0
    hang_min_s: float = 300.0
    drop: float = 0.3
    drop_steps: int = 5
    restarts_per_node: int = 2
