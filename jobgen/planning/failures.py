"""Failures, restarts and checkpoints: the expected wall time of a job of `work` seconds of
training that saves a checkpoint every `interval` seconds of training.

Failures arrive at a constant rate 1/mtbf (also during restarts and writes). Training runs in
segments of `interval` seconds, each followed by a write of `write` seconds; a failure loses the
segment in progress and costs `restart` seconds, which a failure starts over. One segment of w
seconds then takes exactly M e^(R/M) (e^(w/M) - 1) on average (Daly, 2006), so the expected wall
time is a sum over the segments; `simulate` draws the same process to check it.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Optional


def young(write: float, mtbf: float) -> float:
    """Young's interval (1974): sqrt(2 x write x MTBF), seconds of training between writes."""
    return math.sqrt(2.0 * write * mtbf)


def daly(write: float, mtbf: float) -> float:
    """Daly's higher-order optimum (2006): for write < 2 MTBF,
    sqrt(2 d M) [1 + sqrt(d / 2M) / 3 + (d / 2M) / 9] - d; else M."""
    if write >= 2.0 * mtbf:
        return mtbf
    ratio = write / (2.0 * mtbf)
    return math.sqrt(2.0 * write * mtbf) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - write


def segment_time(length: float, restart: float, mtbf: float) -> float:
    """Expected wall time to complete `length` seconds that a failure sends back to their
    start, each failure costing `restart` seconds that can fail too."""
    try:
        return mtbf * math.exp(restart / mtbf) * math.expm1(length / mtbf)
    except OverflowError:      # beyond any bound: the job would never finish (the caller says)
        return math.inf


def segments(work: float, interval: float) -> tuple[int, float]:
    """(full segments, the last segment's training seconds, 0 if none)."""
    if not interval > 0:
        return 0, work
    full = int(work // interval)
    rest = work - full * interval
    if rest <= interval * 1e-9:
        rest = 0.0
    return full, rest


def expected_wall(work: float, interval: float, write: float, restart: float,
                  mtbf: float) -> float:
    full, rest = segments(work, interval)
    total = full * segment_time(interval + write, restart, mtbf)
    if rest:
        total += segment_time(rest + write, restart, mtbf)
    return total


def goodput(work: float, interval: float, write: float, restart: float, mtbf: float) -> float:
    return work / expected_wall(work, interval, write, restart, mtbf)


@dataclass(frozen=True, slots=True)
class Simulation:
    runs: int
    seed: int
    mean_wall: float          # seconds
    stderr_wall: float
    mean_failures: float
    goodput: float            # work / mean wall
    goodput_low: float        # the 95 % confidence interval
    goodput_high: float

    def within(self, value: float, z: float = 1.96) -> bool:
        low = self.mean_wall - z * self.stderr_wall
        high = self.mean_wall + z * self.stderr_wall
        return low <= value <= high


@dataclass(frozen=True, slots=True)
class Routes:
    """Failures of two kinds with two restart costs (planning/in_place.py): each failure is a
    process's with probability `process_share`, else a node's. A process failure restarts in
    place while the current launch has `restarts` left, a node failure while a spare remains
    (`spares`; a spare's relaunch is a new launch); any other failure is requeued and both
    budgets start whole again. `restart` is then only the expected cost, for the closed form."""
    process_share: float
    restarts: int
    spares: int
    in_place: float            # seconds: a restart inside the allocation
    requeue: float             # seconds: a requeue


class _Fixed:
    """Every failure costs `restart` and is a requeue (the plan without routes): no draw."""

    def __init__(self, restart: float) -> None:
        self.cost = restart

    def restart(self) -> tuple[float, bool]:
        return self.cost, True


class _Budgets:
    """The restarts left in one allocation, failure by failure."""

    def __init__(self, routes: Routes, rng: random.Random) -> None:
        self.routes, self.rng = routes, rng
        self.used = self.spares_used = 0

    def restart(self) -> tuple[float, bool]:
        """A failure: its kind drawn, its budget spent; what its restart costs, and whether it
        is a requeue."""
        r = self.routes
        if self.rng.random() < r.process_share:
            if self.used < r.restarts:
                self.used += 1
                return r.in_place, False
        elif self.spares_used < r.spares:
            self.spares_used += 1
            self.used = 0          # the step runs again on a spare: a fresh torchrun
            return r.in_place, False
        self.used = self.spares_used = 0       # requeued: a new allocation
        return r.requeue, True


def _one_segment(rng: random.Random, length: float, budgets: "_Fixed | _Budgets",
                 mtbf: float, most: Optional[int] = None) -> tuple[float, int]:
    """One segment of `length` seconds: failures arrive at rate 1/mtbf, each loses what the
    segment had done and costs the restart its budgets give (_Fixed: always the same). A failure
    during a restart in place is routed like any other (a crash while the workers meet again
    costs another restart, or the requeue once the budget is spent); one during a requeue starts
    the requeue over (no workers run yet, and the new allocation's budgets stay whole).
    With `most`, it gives up once more than `most` failures struck (the count returned is then
    above `most`): a segment long beside the MTBF takes e^(length/mtbf) failures to get through."""
    spent, failures = 0.0, 0
    piece, restarting, requeued = length, False, False   # the segment, or a restart before it
    while True:
        t = rng.expovariate(1.0 / mtbf)
        if t >= piece:
            spent += piece
            if not restarting:
                return spent, failures
            piece, restarting = length, False    # the restart got through: the segment again
            continue
        spent += t
        failures += 1
        if most is not None and failures > most:
            return spent, failures
        if not (restarting and requeued):      # a requeue struck starts over, not routed
            piece, requeued = budgets.restart()
        restarting = True


def simulate(work: float, interval: float, write: float, restart: float, mtbf: float,
             runs: int, seed: int = 0, routes: Optional[Routes] = None) -> Simulation:
    """Monte Carlo of the process above: `runs` whole jobs, seeded (the same seed, the same
    figures). The wall time's 95 % interval is mean +- 1.96 standard errors. With `routes`,
    each failure's restart is drawn by its kind and the budgets left (each run starts in a fresh
    allocation) instead of costing `restart`."""
    rng = random.Random(seed)
    full, rest = segments(work, interval)
    lengths = [interval + write] * full + ([rest + write] if rest else [])
    walls: list[float] = []
    fails = 0
    for _ in range(runs):
        wall = 0.0
        budgets = _Budgets(routes, rng) if routes is not None else _Fixed(restart)
        for length in lengths:
            spent, n = _one_segment(rng, length, budgets, mtbf)
            wall += spent
            fails += n
        walls.append(wall)
    mean = sum(walls) / runs
    var = sum((w - mean) ** 2 for w in walls) / (runs - 1) if runs > 1 else 0.0
    err = math.sqrt(var / runs)
    return Simulation(runs, seed, mean, err, fails / runs, work / mean,
                      work / (mean + 1.96 * err), work / max(mean - 1.96 * err, work))


def wall_given_failures(work: float, interval: float, write: float, restart: float,
                        mtbf: float, failures: int, draws: int = 400, seed: int = 0,
                        budget: int = 400_000) -> Optional[float]:
    """The expected wall time of the process above among the runs that see exactly `failures`
    failures: what the model expects of one run once its failure count is known (drawn, seeded;
    a draw is kept only if its count comes out at `failures`). None where `budget` segment draws
    do not yield `draws` such runs (a long run, or a count far from the expected one); a draw
    stops at the failure past `failures`, and each failure drawn counts against `budget` too, so
    a write or restart long beside the MTBF ends in None, not in a draw that never ends.

    This, not expected_wall at the run's own rate, is what one finished run can be held to. At a
    given rate some failures strike a restart and cost only the part of it they cut short, but a
    run's first failure always strikes training: a run with one failure costs the whole restart
    and half an interval for it, where the model at that run's rate (say one failure expected)
    counts a fifth of its failures at the cheaper price (docs/reports.md)."""
    if failures < 0 or draws < 1:
        raise ValueError("failures >= 0 and draws >= 1")
    rng = random.Random(seed)
    full, rest = segments(work, interval)
    lengths = [interval + write] * full + ([rest + write] if rest else [])
    kept: list[float] = []
    spent = 0
    while len(kept) < draws:
        wall, seen = 0.0, 0
        budgets = _Fixed(restart)
        for length in lengths:
            took, n = _one_segment(rng, length, budgets, mtbf, failures - seen)
            spent += 1 + n
            wall, seen = wall + took, seen + n
            if seen > failures or spent >= budget:
                break
        if seen == failures and spent < budget:
            kept.append(wall)
        if spent >= budget and len(kept) < draws:
            return None
    return sum(kept) / len(kept)


def interval_steps(interval: float, step_time: float, max_steps: Optional[int] = None) -> int:
    """An interval in seconds as a whole number of steps (at least 1, at most the run)."""
    steps = max(1, round(interval / step_time))
    return min(steps, max_steps) if max_steps else steps
