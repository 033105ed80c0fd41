#!/usr/bin/env python3
"""How far one chaos rehearsal may fall from plan's model by chance alone.

benchmarks/chaos_rehearsal.py compares one run's measured effective utilisation with plan's
failure model (an expectation) for the run's own figures. This draws that run many times: the
same process (a first kill early in training, then exponential gaps; a failure during a restart
starts it over; a checkpoint every `--interval` seconds of training), the same estimates the
report makes (failures per second at risk; the restart as the mean of its parts, whose
requeue and queue wait the report measures whole even where a failure then cuts the start-up
short: here each drawn restart's length; a background save's seal lag added), the same model
and the same fixed costs around it, and prints how the difference is spread.

    python benchmarks/chaos_scatter.py                       # CI's short rehearsal, 1 kill
    python benchmarks/chaos_scatter.py --kills 0 --kill-every 120 --restart 40

No cluster needed; a few seconds.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from typing import Optional

from jobgen.planning import failures as model


def one_run(rng: random.Random, a: argparse.Namespace) -> tuple[float, int, list[float]]:
    """(seconds from the first training step to the end, failures, drawn restart lengths)."""
    t = saved = 0.0
    failures, restarts = 0, list[float]()
    seals: list[tuple[float, float]] = []   # (when a save is sealed, the training it keeps)
    kills_left = a.kills if a.kills > 0 else math.inf
    next_kill = rng.uniform(*a.first_kill)
    restarting_since: Optional[float] = None

    def strike() -> None:
        nonlocal failures, kills_left, next_kill, saved
        # Back to the newest save sealed by now: a background save is sealed a lag after it
        # is taken (at the step boundary after its last byte); one in flight is lost.
        seals[:] = [x for x in seals if x[0] <= t]
        saved = seals[-1][1] if seals else 0.0
        failures += 1
        kills_left -= 1
        next_kill = t + rng.expovariate(1 / a.kill_every) if kills_left > 0 else math.inf
    while True:
        if restarting_since is None:                    # train to the next save
            goal = min(saved + a.interval, a.work)
            took = goal - saved + a.write
            if t + took <= next_kill:
                t, saved = t + took, goal
                if saved >= a.work - 1e-9:
                    return t, failures, restarts
                seals.append((t + a.seal_lag, saved))
                continue
            t = next_kill
            strike()
            restarting_since = t
        restart = rng.uniform(0.8, 1.2) * a.restart
        restarts.append(restart)
        if t + restart <= next_kill:
            t += restart
            restarting_since = None
        else:                                           # the restart starts over
            t = next_kill
            strike()
            restarting_since = t


def difference(rng: random.Random, a: argparse.Namespace
               ) -> tuple[float, int, Optional[float]]:
    """(measured minus predicted utilisation in points, failures, and with --given, measured
    minus the model among its runs with this run's failure count) for one drawn run."""
    risk, failures, restarts = one_run(rng, a)
    measured = a.work / (a.fixed + risk)
    restart = statistics.fmean(restarts) if restarts else a.restart
    wall = (model.expected_wall(a.work, a.interval, a.write, restart + a.seal_lag,
                                risk / failures)
            if failures else a.work)
    given = None
    if a.given and failures:
        drawn = model.wall_given_failures(a.work, a.interval, a.write, restart + a.seal_lag,
                                          risk / failures, failures, draws=100,
                                          seed=rng.randrange(2**31))
        given = None if drawn is None else 100 * (measured - a.work / (a.fixed + drawn))
    return 100 * (measured - a.work / (a.fixed + wall)), failures, given


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=float, default=36.0, help="seconds of training (CI: 24 x 1.5)")
    p.add_argument("--interval", type=float, default=1.5, help="seconds of training per save")
    p.add_argument("--write", type=float, default=0.1, help="seconds per checkpoint write")
    p.add_argument("--seal-lag", type=float, default=0.0,
                   help="seconds from a save to its seal (background saves: the step after "
                        "it; 0: in place), added to the model's restart as the report adds it")
    p.add_argument("--restart", type=float, default=40.0,
                   help="seconds from a failure to training again (drawn +-20 %%)")
    p.add_argument("--fixed", type=float, default=140.0,
                   help="seconds the model leaves out (first start-up, time-limit stop, idle)")
    p.add_argument("--first-kill", type=float, nargs=2, default=(9.0, 18.0),
                   help="the first kill's window, seconds after the first training step")
    p.add_argument("--kill-every", type=float, default=120.0, help="mean gap after the first")
    p.add_argument("--kills", type=int, default=1, help="at most this many (0: no limit)")
    p.add_argument("--runs", type=int, default=4000)
    p.add_argument("--given", action="store_true",
                   help="also hold each drawn run to the model's runs with its failure count, "
                        "as jobgen report does (slower: about 10 s per 4,000 runs)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    if not (a.work > 0 and a.interval > 0 and a.write >= 0 and a.restart > 0 and a.fixed >= 0
            and a.seal_lag >= 0
            and a.kill_every > 0 and a.kills >= 0 and 0 <= a.first_kill[0] <= a.first_kill[1]
            and 0 < a.runs <= 1_000_000):
        p.error("every figure finite and in its range (times > 0, --runs 1 to 1,000,000)")
    rng = random.Random(a.seed)
    drawn = [difference(rng, a) for _ in range(a.runs)]
    diffs = sorted(d for d, _, _ in drawn)
    beyond = sum(abs(d) > 3 for d in diffs)
    print(f"{a.runs} drawn rehearsals: work {a.work:g} s, a save every {a.interval:g} s, "
          f"restart {a.restart:g} s, first kill {a.first_kill[0]:g}-{a.first_kill[1]:g} s, "
          f"then every {a.kill_every:g} s on average, "
          f"{'no limit' if a.kills == 0 else f'{a.kills} at most'}")
    print(f"  failures per run: mean {statistics.fmean(n for _, n, _ in drawn):.2f}, "
          f"most {max(n for _, n, _ in drawn)}")
    print(f"  measured - model, points: mean {statistics.fmean(diffs):+.2f}, "
          f"sd {statistics.pstdev(diffs):.2f}, 1st..99th percentile "
          f"{diffs[len(diffs) // 100]:+.2f}..{diffs[-1 - len(diffs) // 100]:+.2f}")
    print(f"  beyond 3 points: {beyond} of {a.runs} ({100 * beyond / a.runs:.1f} %)")
    if a.given:
        given = sorted(g for _, _, g in drawn if g is not None)
        if given:
            print(f"  measured - the model's runs with the same failure count, points: mean "
                  f"{statistics.fmean(given):+.2f}, sd {statistics.pstdev(given):.2f}, "
                  f"within 1.5: {100 * sum(abs(g) <= 1.5 for g in given) / len(given):.1f} %, "
                  f"beyond 3: {100 * sum(abs(g) > 3 for g in given) / len(given):.1f} % "
                  f"({len(given)} runs drawn)")
        for n in sorted({n for _, n, _ in drawn}):
            these = [(d, g) for d, m, g in drawn if m == n]
            held = [g for _, g in these if g is not None]
            if len(these) >= 0.01 * a.runs:
                print(f"    {n} failure{'' if n == 1 else 's'} ({len(these)} runs): at the run's "
                      f"rate {statistics.fmean(d for d, _ in these):+.2f}"
                      + (f", given the count {statistics.fmean(held):+.2f} "
                         f"(sd {statistics.pstdev(held):.2f})" if held else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
