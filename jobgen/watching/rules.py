"""The detectors' thresholds (`jobgen watch`'s options): their own module, so that the detector
mixins (divergence.py, pace.py, restarts.py) and `Detectors` that combines them all read it
without importing each other.

Every threshold is relative to the run's own numbers: a factor of its recent gradient norms or
losses, its own spread (the median absolute deviation, MAD), a fraction of its own steady
throughput; none is an absolute margin, so the same rules suit a run whose norms are near 0.3 and
one whose norms are near 6. Only the hang's floor is in seconds (a save may take minutes)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable

MAD_SIGMA = 1.4826     # the MAD of normal data x this = its standard deviation


@dataclass(frozen=True)
class Rules:
    spike_window: int = 20
    spike_factor: float = 4.0
    spike_mads: float = 6.0
    spike_patience: int = 5
    growth_factor: float = 3.0
    growth_steps: int = 5
    loss_spike: float = 0.5
    hang_factor: float = 10.0
    hang_min_s: float = 300.0
    drop: float = 0.3
    drop_steps: int = 5
    drop_mads: float = 4.0
    restarts_per_node: int = 2


def median_spread(values: Iterable[float]) -> tuple[float, float]:
    """The median of `values` and their robust spread (MAD x 1.4826: one standard deviation
    where the values are normal, unmoved by the odd outlier)."""
    data = list(values)
    middle = statistics.median(data)
    return middle, MAD_SIGMA * statistics.median(abs(v - middle) for v in data)
