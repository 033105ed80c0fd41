"""Detectors: the observations of a run in, alerts out. Pure (the clock is passed in), so that a
recorded stream is judged exactly as a live one. Every rule is relative to the run's own
numbers (watching/rules.py), so that a healthy run of any scale raises nothing. The rules, their
defaults and how benchmarks/watch_alarms.py measured them: docs/watching.md.

One module per family: divergence.py (gradient norm, divergence, loss), pace.py (throughput,
hang), restarts.py (the node behind repeated restarts); `Detectors` below combines them over one
run's state.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Optional

from .divergence import DivergenceDetectors
from .observations import Alert, Observation, finite
from .pace import PaceDetectors
from .restarts import RestartDetector
from .rules import Rules

__all__ = ["Detectors", "Rules"]
DEFAULT_RULES = Rules()


class Detectors(DivergenceDetectors, PaceDetectors, RestartDetector):
    """Every detector over one run: the gradient norm and the loss (watching/divergence.py),
    step times, throughput and hangs (watching/pace.py), and nodes that end allocations
    (watching/restarts.py), sharing the run's state below."""

    def __init__(self, rules: Rules = DEFAULT_RULES) -> None:
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
        self.paused = False                           # a save or resume since the last step
        self.dropped = False
        self.hang_alerted = False
        self.ended = False                            # the training pass said done or stopped
        self.beats: dict[int, tuple[int, float]] = {}  # node -> (newest step started, its time)
        self.max_step: dict[int, int] = {}            # allocation -> the newest step trained
        self.steps_lost = 0
        self.bad_hosts: set[str] = set()
        self.now = 0.0
        # Starts of the training pass inside an allocation after its first: torchrun's restarts
        # in place (job.restarts_in_place), apart from the requeues (new allocations).
        self.restarts_in_place = 0
        self.started_in: set[int] = set()
        # The newest start's word on hangs: torchrun's restarts left in place and the collective
        # timeout that ends a hung rank's peers (the hang allowance waits for them: pace.py).
        self.in_place_left = 0
        self.collective_timeout_s: Optional[float] = None

    # --- observations ---------------------------------------------------------------------------

    def observe(self, obs: Observation, now: float) -> list[Alert]:
        self.now = now
        if obs.restart > self.restart:
            self._new_allocation(obs.restart, now)
        if obs.phase != "train":
            return []
        if obs.kind == "start":
            if obs.restart in self.started_in:
                self.restarts_in_place += 1
                # What this allocation trained before the restart is trained again after it
                # (kept under a negative key: _resumed counts it as an earlier allocation's).
                self.max_step[-1 - obs.restart] = max(self.max_step.get(-1 - obs.restart, 0),
                                                      self.max_step.pop(obs.restart, 0))
            self.started_in.add(obs.restart)
            self._started(now)
            self._hang_recovery(obs.extra)
        elif obs.kind == "resume" and obs.step is not None:
            self._resumed(obs.step)
            self.paused = True
        elif obs.kind == "checkpoint":
            self.paused = True
        elif obs.kind in ("done", "stopped"):
            self.ended = True
        elif obs.kind == "beat" and obs.node is not None and obs.step is not None:
            self.beats[obs.node] = (obs.step, obs.time)
            self.last_progress = now
            self.hang_alerted = False
        elif obs.training_step:
            return self._step(obs, now)
        return []

    def _hang_recovery(self, said: dict) -> None:
        """What the newest start says ends a hang; anything but a count and a finite positive
        number of seconds is taken as unsaid (watch then judges hangs as without it)."""
        def count(value: object) -> Optional[int]:
            return value if isinstance(value, int) and not isinstance(value, bool) \
                and value >= 0 else None

        budget, used = count(said.get("restarts_in_place_max")), count(
            said.get("restart_in_place", 0))
        timeout = said.get("collective_timeout_s")
        self.in_place_left = budget - used if budget is not None and used is not None else 0
        self.collective_timeout_s = (float(timeout) if isinstance(timeout, (int, float))
                                     and not isinstance(timeout, bool)
                                     and math.isfinite(timeout) and timeout > 0 else None)

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
        self.paused = False
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
