"""The gradient-norm and loss detectors of jobgen watch (the rules: watching/detectors.py): HLAT's
gradient-norm spike and its sustained form, divergence as growth over the lowest running mean,
and loss spikes. A mixin of `Detectors`, which holds the state declared here."""
from __future__ import annotations

import statistics
from collections import deque
from typing import Optional

from .observations import Alert, Observation, fmt
from .rules import Rules

MIN_HISTORY = 5        # steps before the running mean judges a norm or a loss


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
        mean = statistics.fmean(v for _, v in self.norms) if len(self.norms) >= MIN_HISTORY \
            else None
        if mean is not None and norm > mean + rules.spike_margin:
            if self.spike is None:
                self.spike, self.spike_len = (step, obs.time), 0
                alerts.append(Alert(
                    "grad_spike", step, f"step {step}: gradient-norm spike {fmt(norm)} > "
                    f"{fmt(mean)} (mean of the last {len(self.norms)}) + {rules.spike_margin}",
                    self.now, since_step=step, fault_time=obs.time,
                    values={"grad_norm": norm, "mean": mean}))
            self.spike_len += 1
            if self.spike_len == rules.spike_patience:
                first = self.spike[0]
                alerts.append(Alert(
                    "sustained_spike", step, f"step {step}: the gradient norm has stayed above "
                    f"its running mean + {rules.spike_margin} for {self.spike_len} steps since "
                    f"step {first} ({fmt(norm)} against {fmt(mean)}); HLAT saw such spikes "
                    "precede divergence", self.now, since_step=first, fault_time=self.spike[1],
                    values={"grad_norm": norm, "mean": mean}))
        else:
            self.spike, self.spike_len = None, 0
        # HLAT's r: the mean of the last `spike_window` steps, spikes included.
        self.norms.append((step, norm))
        if len(self.norms) >= MIN_HISTORY:
            running = statistics.fmean(v for _, v in self.norms)
            self.lowest = running if self.lowest is None else min(self.lowest, running)
        if self.lowest is not None and norm > rules.growth_factor * self.lowest:
            if self.growth is None:
                self.growth, self.growth_len = (step, obs.time), 0
            self.growth_len += 1
            if self.growth_len >= rules.growth_steps and not self.diverged:
                self.diverged = True
                alerts.append(Alert(
                    "divergence", step, f"step {step}: the gradient norm has been above "
                    f"{rules.growth_factor:g} x its lowest running mean ({fmt(self.lowest)}) "
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
            mean = statistics.fmean(v for _, v in self.losses)
            # Open above (1 + margin) x mean; closed again only below (1 + margin / 2) x mean.
            if loss > (1 + self.rules.loss_spike / (2 if self.loss_open else 1)) * mean:
                if self.loss_open or self.diverged:
                    return []   # one alert per spike; a divergence already said it
                self.loss_open = True
                return [Alert("loss_spike", step, f"step {step}: loss {fmt(loss)} is "
                              f"{loss / mean - 1:.0%} above the mean of the last "
                              f"{len(self.losses)} ({fmt(mean)})", self.now, since_step=step,
                              fault_time=obs.time, values={"loss": loss, "mean": mean})]
        self.loss_open = False
        self.losses.append((step, loss))
        return []
