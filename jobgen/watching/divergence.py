"""The gradient-norm and loss detectors of jobgen watch (the rules: watching/detectors.py): the
gradient-norm spike against the run's recent norms and its sustained form, divergence as growth
over the lowest running median, and loss spikes. A mixin of `Detectors`, which holds the state
declared here."""
from __future__ import annotations

import math
from collections import deque
from typing import Optional

from .observations import Alert, Observation, fmt
from .rules import Rules, median_spread

MIN_HISTORY = 5        # steps before the recent norms or losses judge the next one (warm-up)


class DivergenceDetectors:
    rules: Rules
    now: float
    norms: deque[tuple[int, float]]
    losses: deque[tuple[int, float]]
    lowest: Optional[float]
    spike: Optional[tuple[int, float]]
    spike_len: int
    growth: Optional[tuple[int, float]]
    growth_len: int
    diverged: bool
    loss_open: bool

    def _norm(self, obs: Observation, norm: float) -> list[Alert]:
        rules, step, alerts = self.rules, obs.step, []
        assert step is not None
        limit = middle = None
        # (Norms of 0 give no scale to judge against.)
        logs = [math.log(v) for _, v in self.norms if v > 0]
        if len(logs) >= MIN_HISTORY:
            centre, spread = median_spread(logs)
            middle = math.exp(centre)
            # Relative to the run's own norms: a factor of their median, and clear of their
            # own spread (norms vary by ratios: in logs; a run whose norms wobble widely, as a
            # small batch's do, needs a bigger jump).
            reach = max(math.log(rules.spike_factor), rules.spike_mads * spread)
            limit = math.exp(min(centre + reach, 709.0))   # capped within float's range
        if limit is not None and middle is not None and norm > limit:
            values = {"grad_norm": norm, "median": middle, "limit": limit}
            if self.spike is None:
                self.spike, self.spike_len = (step, obs.time), 0
                alerts.append(Alert(
                    "grad_spike", step, f"step {step}: gradient-norm spike {fmt(norm)}, "
                    f"{norm / middle:.3g} x the median of the last {len(self.norms)} "
                    f"({fmt(middle)}; the limit is {fmt(limit)})", self.now, since_step=step,
                    fault_time=obs.time, values=values))
            self.spike_len += 1
            if self.spike_len == rules.spike_patience:
                first = self.spike[0]
                alerts.append(Alert(
                    "sustained_spike", step, f"step {step}: the gradient norm has stayed above "
                    f"the spike limit for {self.spike_len} steps since step {first} "
                    f"({fmt(norm)} against a median of {fmt(middle)}); HLAT saw such spikes "
                    "precede divergence", self.now, since_step=first, fault_time=self.spike[1],
                    values=values))
        else:
            self.spike, self.spike_len = None, 0
        # The window holds spikes too (as HLAT's r does): a level that stays is the new level.
        self.norms.append((step, norm))
        if len(self.norms) >= MIN_HISTORY:
            running, _ = median_spread(v for _, v in self.norms)
            self.lowest = running if self.lowest is None else min(self.lowest, running)
        if self.lowest and norm > rules.growth_factor * self.lowest:
            if self.growth is None:
                self.growth, self.growth_len = (step, obs.time), 0
            self.growth_len += 1
            if self.growth_len >= rules.growth_steps and not self.diverged:
                self.diverged = True
                alerts.append(Alert(
                    "divergence", step, f"step {step}: the gradient norm has been above "
                    f"{rules.growth_factor:g} x its lowest running median ({fmt(self.lowest)}) "
                    f"for {self.growth_len} steps since step {self.growth[0]} (now "
                    f"{fmt(norm)})", self.now, since_step=self.growth[0],
                    fault_time=self.growth[1], values={"grad_norm": norm, "lowest": self.lowest}))
        else:
            self.growth, self.growth_len = None, 0
        return alerts

    def _loss(self, obs: Observation, loss: float) -> list[Alert]:
        step = obs.step
        assert step is not None
        if len(self.losses) >= MIN_HISTORY:
            middle, _ = median_spread(v for _, v in self.losses)
            # Open above (1 + margin) x median; closed again only below (1 + margin / 2) x it.
            # (A loss whose median is not positive has no scale to spike against.)
            if middle > 0 and loss > (1 + self.rules.loss_spike /
                                      (2 if self.loss_open else 1)) * middle:
                if self.loss_open or self.diverged:
                    return []   # one alert per spike; a divergence already said it
                self.loss_open = True
                return [Alert("loss_spike", step, f"step {step}: loss {fmt(loss)} is "
                              f"{loss / middle - 1:.0%} above the median of the last "
                              f"{len(self.losses)} ({fmt(middle)})", self.now, since_step=step,
                              fault_time=obs.time, values={"loss": loss, "median": middle})]
        self.loss_open = False
        self.losses.append((step, loss))
        return []
