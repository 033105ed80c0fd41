"""The step-time detectors of jobgen watch (the rules: watching/detectors.py): the step times
and rates of the current allocation, a throughput drop against its own steady throughput, and a
hang (no step for too long) with the nodes behind it. A mixin of `Detectors`, which holds the
state declared here."""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Optional

from .observations import Alert, Observation, fmt
from .rules import Rules, median_spread

WARM_STEPS = 2         # steps after each start left out of the throughput baseline


class PaceDetectors:
    rules: Rules
    now: float
    last_progress: Optional[float]
    last_step: Optional[Observation]
    intervals: deque[float]
    rates: list[float]
    since_start: int
    paused: bool
    dropped: bool
    hang_alerted: bool
    ended: bool
    beats: dict[int, tuple[int, float]]
    in_place_left: int
    collective_timeout_s: Optional[float]

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
        paused, self.paused = self.paused, False
        # A step whose time holds a save (or a resume) says nothing about the training's pace.
        if self.since_start > WARM_STEPS + 1 and not paused:
            rate = 1.0 / per_step
            if prev.consumed is not None and obs.consumed is not None \
                    and obs.consumed > prev.consumed:
                try:
                    rate = (obs.consumed - prev.consumed) / elapsed
                except OverflowError:   # a count past float's range: not a sample count
                    pass
            if 0 < rate < math.inf:
                self.rates.append(rate)

    def _throughput(self, obs: Observation, now: float) -> list[Alert]:
        """The median rate of the last `drop_steps` steps against the allocation's steady rate
        before them (warm-up and saves left out): a drop is more than `drop` below it, and
        beyond the run's own step-to-step spread (`drop_mads` x the robust spread of the log
        rates), so that a run whose pace wobbles (a shared CPU) needs a bigger fall."""
        n = self.rules.drop_steps
        if len(self.rates) < 3 * n:
            return []
        recent = statistics.median(self.rates[-n:])
        earlier = self.rates[:-n][-50:]
        baseline = statistics.median(earlier)
        _, spread = median_spread(math.log(r) for r in earlier)
        fall = math.log(baseline / recent)
        if recent < (1 - self.rules.drop) * baseline and fall > self.rules.drop_mads * spread:
            if self.dropped:
                return []
            self.dropped = True
            unit = "samples/s" if obs.consumed is not None else "steps/s"
            return [Alert("throughput_drop", obs.step, f"step {obs.step}: {fmt(recent)} {unit} "
                          f"over the last {n} steps, {1 - recent / baseline:.0%} below this "
                          f"allocation's steady median of {fmt(baseline)} (its steps vary by "
                          f"{math.expm1(spread):.0%})", now,
                          since_step=(obs.step or 0) - n + 1, fault_time=obs.time,
                          values={"recent": recent, "baseline": baseline, "spread": spread})]
        if recent >= (1 - self.rules.drop / 2) * baseline:
            self.dropped = False
        return []

    # --- the clock ------------------------------------------------------------------------------

    def median_step_s(self) -> Optional[float]:
        return statistics.median(self.intervals) if len(self.intervals) >= 3 else None

    def hang_allowance(self) -> float:
        median = self.median_step_s()
        floor = self.rules.hang_min_s
        allowed = floor if median is None else max(self.rules.hang_factor * median, floor)
        in_place = self.in_place_wait()
        return allowed if in_place is None else max(allowed, in_place)

    def in_place_wait(self) -> Optional[float]:
        """While torchrun has restarts left in place, a hung rank ends by itself: its peers'
        collectives fail after the collective timeout and torchrun restarts every worker. The
        hang is watch's only after that and a restart's time (the hang floor) have passed."""
        if self.in_place_left > 0 and self.collective_timeout_s is not None:
            return self.collective_timeout_s + self.rules.hang_min_s
        return None

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
                        + f"at least {self.rules.hang_min_s:g} s"
                        + (f"; after the collective timeout of {self.collective_timeout_s:g} s "
                           "and a restart in place" if self.in_place_wait() is not None else "")
                        + ")", now,
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
