"""Detectors: the observations of a run in, alerts out. Pure (the clock is passed in), so that a
recorded stream is judged exactly as a live one.

- gradient-norm spike (HLAT, arXiv 2404.10630): a step whose norm exceeds r + margin, r the mean
  of the last `spike_window` (20) norms, spikes included as HLAT defines it; r needs
  `MIN_HISTORY` steps first. A spike that has not come back after `spike_patience` steps is
  reported as sustained (HLAT saw those precede divergence). It is not acted on: with an absolute
  margin, a norm that settles a little higher (the end of warmup does that) looks the same, and a
  rollback on that signal would throw good steps away.
- divergence: `growth_steps` consecutive norms above `growth_factor` (3) x the lowest r seen
  (HLAT: growth above 3x the lowest value precedes divergence).
- a non-finite loss or gradient norm: divergence, at once.
- loss spike: a loss above (1 + `loss_spike`) x the mean of the last `spike_window` losses (one
  alert until it is back below (1 + `loss_spike` / 2) x the mean; none once divergence is known).
- hang: no training step and no node starting one for max(`hang_factor` x the median step time,
  `hang_min_s`) while the job runs; the nodes that did not start the newest step (or whose logs
  went quiet while others grew) are named.
- throughput drop: the median rate of the last `drop_steps` steps below (1 - `drop`) x the median
  of the steps before them in this allocation (at least 2 x `drop_steps` of them; the first 2
  steps after each start are left out).
- a node that repeatedly causes restarts: the same host (node index where no host is recorded)
  failing first (the earliest exit status 1-127 recorded; the others then lose their peer) in
  `restarts_per_node` allocations.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence

from .observations import Alert, Observation, finite
from .readers import NodeEnd

MIN_HISTORY = 5        # steps before the running mean judges a norm or a loss
WARM_STEPS = 2         # steps after each start left out of the throughput baseline


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


def _fmt(value: float) -> str:
    return f"{value:.4g}"


class Detectors:
    def __init__(self, rules: Rules = Rules()) -> None:
        self.rules = rules
        self.norms: deque[tuple[int, float]] = deque(maxlen=rules.spike_window)
        self.losses: deque[tuple[int, float]] = deque(maxlen=rules.spike_window)
        self.lowest: Optional[float] = None           # the lowest running mean of the norm
        self.spike: Optional[tuple[int, float]] = None     # (first step, its time) of an open spike
        self.spike_len = 0
        self.growth: Optional[tuple[int, float]] = None    # (first step, time) above the factor
        self.growth_len = 0
        self.diverged = False                         # one divergence incident until a resume
        self.loss_open = False
        self.restart = 0
        self.last_progress: Optional[float] = None    # watcher's clock: the newest step or beat
        self.last_step: Optional[Observation] = None
        self.intervals: deque[float] = deque(maxlen=50)
        self.rates: list[float] = []
        self.since_start = 0
        self.dropped = False
        self.hang_alerted = False
        self.ended = False                            # the training pass said done or stopped
        self.beats: dict[int, tuple[int, float]] = {}  # node -> (newest step started, its time)
        self.max_step: dict[int, int] = {}            # allocation -> the newest step trained
        self.steps_lost = 0
        self.bad_hosts: set[str] = set()
        self.now = 0.0

    # --- observations ---------------------------------------------------------------------------

    def observe(self, obs: Observation, now: float) -> list[Alert]:
        self.now = now
        if obs.restart > self.restart:
            self._new_allocation(obs.restart, now)
        if obs.phase != "train":
            return []
        if obs.kind == "start":
            self._started(now)
        elif obs.kind == "resume" and obs.step is not None:
            self._resumed(obs.step)
        elif obs.kind in ("done", "stopped"):
            self.ended = True
        elif obs.kind == "beat" and obs.node is not None and obs.step is not None:
            self.beats[obs.node] = (obs.step, obs.time)
            self.last_progress = now
            self.hang_alerted = False
        elif obs.training_step:
            return self._step(obs, now)
        return []

    def _new_allocation(self, restart: int, now: float) -> None:
        self.restart = restart
        self._started(now)

    def _started(self, now: float) -> None:
        self.beats.clear()
        self.last_step = None
        self.last_progress = now
        self.hang_alerted = False
        self.ended = False
        self.rates = []
        self.since_start = 0
        self.dropped = False

    def _resumed(self, step: int) -> None:
        before = [s for r, s in self.max_step.items() if r < self.restart]
        if before:
            self.steps_lost += max(0, max(before) - step)
        # What came after the checkpoint is trained again: forget it.
        self.norms = deque(((s, v) for s, v in self.norms if s <= step), self.norms.maxlen)
        self.losses = deque(((s, v) for s, v in self.losses if s <= step), self.losses.maxlen)
        if self.spike and self.spike[0] > step:
            self.spike, self.spike_len = None, 0
        if self.growth and self.growth[0] > step:
            self.growth, self.growth_len = None, 0
        self.diverged = False
        self.loss_open = False

    def _step(self, obs: Observation, now: float) -> list[Alert]:
        assert obs.step is not None
        alerts: list[Alert] = []
        self.last_progress = now
        self.hang_alerted = False
        self.max_step[obs.restart] = max(self.max_step.get(obs.restart, 0), obs.step)
        self._timing(obs)
        bad = [name for name, value in (("loss", obs.loss), ("gradient norm", obs.grad_norm))
               if value is not None and not math.isfinite(value)]
        if bad and not self.diverged:
            self.diverged = True
            verb = "is" if len(bad) == 1 else "are"
            alerts.append(Alert("nonfinite", obs.step, f"step {obs.step}: the "
                                f"{' and the '.join(bad)} {verb} not finite", now,
                                since_step=obs.step, fault_time=obs.time))
        if finite(obs.grad_norm):
            alerts += self._norm(obs, float(obs.grad_norm))  # type: ignore[arg-type]
        if finite(obs.loss):
            alerts += self._loss(obs, float(obs.loss))  # type: ignore[arg-type]
        alerts += self._throughput(obs, now)
        return alerts

    def _norm(self, obs: Observation, norm: float) -> list[Alert]:
        rules, step, alerts = self.rules, obs.step, []
        assert step is not None
        mean = statistics.fmean(v for _, v in self.norms) if len(self.norms) >= MIN_HISTORY \
            else None
        if mean is not None and norm > mean + rules.spike_margin:
            if self.spike is None:
                self.spike, self.spike_len = (step, obs.time), 0
                alerts.append(Alert(
                    "grad_spike", step, f"step {step}: gradient-norm spike {_fmt(norm)} > "
                    f"{_fmt(mean)} (mean of the last {len(self.norms)}) + {rules.spike_margin}",
                    self.now, since_step=step, fault_time=obs.time,
                    values={"grad_norm": norm, "mean": mean}))
            self.spike_len += 1
            if self.spike_len == rules.spike_patience:
                first = self.spike[0]
                alerts.append(Alert(
                    "sustained_spike", step, f"step {step}: the gradient norm has stayed above "
                    f"its running mean + {rules.spike_margin} for {self.spike_len} steps since "
                    f"step {first} ({_fmt(norm)} against {_fmt(mean)}); HLAT saw such spikes "
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
                    f"{rules.growth_factor:g} x its lowest running mean ({_fmt(self.lowest)}) "
                    f"for {self.growth_len} steps since step {self.growth[0]} (now "
                    f"{_fmt(norm)})", self.now, since_step=self.growth[0],
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
                return [Alert("loss_spike", step, f"step {step}: loss {_fmt(loss)} is "
                              f"{loss / mean - 1:.0%} above the mean of the last "
                              f"{len(self.losses)} ({_fmt(mean)})", self.now, since_step=step,
                              fault_time=obs.time, values={"loss": loss, "mean": mean})]
        self.loss_open = False
        self.losses.append((step, loss))
        return []

    def _timing(self, obs: Observation) -> None:
        prev, self.last_step = self.last_step, obs
        self.since_start += 1
        if prev is None or prev.restart != obs.restart or prev.step is None or obs.step is None \
                or obs.step <= prev.step:
            return
        elapsed = obs.time - prev.time
        if elapsed <= 0:
            return
        per_step = elapsed / (obs.step - prev.step)
        self.intervals.append(per_step)
        if self.since_start > WARM_STEPS + 1:
            if prev.consumed is not None and obs.consumed is not None \
                    and obs.consumed > prev.consumed:
                self.rates.append((obs.consumed - prev.consumed) / elapsed)
            else:
                self.rates.append(1.0 / per_step)

    def _throughput(self, obs: Observation, now: float) -> list[Alert]:
        n = self.rules.drop_steps
        if len(self.rates) < 3 * n:
            return []
        recent = statistics.median(self.rates[-n:])
        baseline = statistics.median(self.rates[:-n][-50:])
        if recent < (1 - self.rules.drop) * baseline:
            if self.dropped:
                return []
            self.dropped = True
            unit = "samples/s" if obs.consumed is not None else "steps/s"
            return [Alert("throughput_drop", obs.step, f"step {obs.step}: {_fmt(recent)} {unit} "
                          f"over the last {n} steps, {1 - recent / baseline:.0%} below this "
                          f"allocation's median of {_fmt(baseline)}", now,
                          since_step=(obs.step or 0) - n + 1, fault_time=obs.time,
                          values={"recent": recent, "baseline": baseline})]
        if recent >= (1 - self.rules.drop / 2) * baseline:
            self.dropped = False
        return []

    # --- the clock ------------------------------------------------------------------------------

    def median_step_s(self) -> Optional[float]:
        return statistics.median(self.intervals) if len(self.intervals) >= 3 else None

    def hang_allowance(self) -> float:
        median = self.median_step_s()
        floor = self.rules.hang_min_s
        return floor if median is None else max(self.rules.hang_factor * median, floor)

    def tick(self, now: float, silence: Optional[dict[int, float]] = None,
             hosts: Optional[dict[int, str]] = None) -> list[Alert]:
        """Time-based checks, while the job runs. `silence`: seconds since each node's log grew."""
        self.now = now
        if self.ended or self.last_progress is None or self.last_step is None:
            return []
        quiet = now - self.last_progress
        allowance = self.hang_allowance()
        if quiet <= allowance or self.hang_alerted:
            return []
        self.hang_alerted = True
        hosts = hosts or {}
        step = self.last_step.step or 0
        median = self.median_step_s()
        alerts = [Alert("hang", step, f"no training step for {quiet:.0f} s after step {step} "
                        f"(allowed {allowance:.0f} s: "
                        + (f"{self.rules.hang_factor:g} x the median step time {median:.3g} s, "
                           if median is not None else "")
                        + f"at least {self.rules.hang_min_s:g} s)", now,
                        since_step=step, fault_time=self.last_progress,
                        values={"quiet_s": quiet, "allowance_s": allowance})]
        for node, why in self.lagging(silence or {}, allowance).items():
            host = hosts.get(node) or None
            alerts.append(Alert("node_silent", step, f"node {node}{f' ({host})' if host else ''}"
                                f" {why}", now, since_step=step, node=node, host=host,
                                fault_time=self.last_progress))
        if len(alerts) > 1:   # the hang is that node's
            alerts[0].node, alerts[0].host = alerts[1].node, alerts[1].host
        return alerts

    def lagging(self, silence: dict[int, float], allowance: float) -> dict[int, str]:
        """The nodes behind the others: by the step each started, else by their logs."""
        if len(self.beats) >= 2:
            newest = max(step for step, _ in self.beats.values())
            return {node: f"never started step {newest}; the other nodes did (its newest: "
                          f"step {step})"
                    for node, (step, _) in sorted(self.beats.items()) if step < newest}
        if len(silence) >= 2 and min(silence.values()) < allowance:
            return {node: f"has written nothing for {quiet:.0f} s while others wrote within "
                          f"{min(silence.values()):.0f} s"
                    for node, quiet in sorted(silence.items()) if quiet > allowance}
        return {}

    # --- restarts -------------------------------------------------------------------------------

    def restarts(self, ended: Sequence[Sequence[NodeEnd]],
                 blamed: Optional[dict[int, int]] = None) -> list[Alert]:
        """`ended`: for each finished allocation, how its nodes ended; `blamed`: allocation ->
        the node a hang was pinned on. A node caused an allocation's end when it failed by
        itself (an exit status 1-127, not a signal from the others being stopped)."""
        counts: dict[str, list[int]] = {}
        for index, nodes in enumerate(ended):
            failed = sorted((n for n in nodes if n.status is not None and 0 < n.status < 128),
                            key=lambda n: n.at)
            culprits = failed[:1]   # the first to fail; the others lost their peer
            if blamed and index in blamed:
                culprits += [n for n in nodes if n.node == blamed[index]]
            for end in {(n.host or f"node {n.node}"): n for n in culprits}.values():
                counts.setdefault(end.host or f"node {end.node}", []).append(index)
        alerts = []
        for who, allocations in counts.items():
            if len(allocations) >= self.rules.restarts_per_node and who not in self.bad_hosts:
                self.bad_hosts.add(who)
                drain = (f"; drain it: scontrol update nodename={who} state=drain "
                         f"reason=jobgen-watch" if not who.startswith("node ") else "")
                alerts.append(Alert("bad_node", None, f"{who} ended {len(allocations)} "
                                    f"allocations of this job (restarts "
                                    f"{', '.join(map(str, allocations))}){drain}",
                                    self.now, host=who if not who.startswith("node ") else None,
                                    values={"allocations": allocations}))
        return alerts
