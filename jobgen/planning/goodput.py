"""Goodput at one node count: the job's MTBF, checkpoint write and load times, the expected
wall time and failures at the recipe's checkpoint interval and at the recommended one (Young's
and Daly's), optionally simulated (jobgen/planning/failures.py holds the formulas)."""
from __future__ import annotations

import math
from typing import Optional

from ..errors import ConfigError, RuleError
from ..record import record
from ..spec import JobSpec
from . import failures
from .failures import Simulation

# Longer than this is "never" (a million years): beyond it the figures are not worth printing.
WALL_LIMIT_S = 3.15576e13
# Random draws a --simulate may take (about 10 s of Python per 10^7).
SIMULATION_LIMIT = 2e7


@record
class Interval:
    steps: int
    seconds: float           # training seconds between checkpoints
    goodput: float           # training time / expected wall time
    wall_s: float            # expected wall time, failures included
    failures: float          # expected failures on the way
    cost: Optional[float]
    simulation: Optional[Simulation] = None


@record
class Failures:
    job_mtbf_s: float
    write_s: float
    load_s: float
    restart_s: float         # detection + requeue + rendezvous + compile + load
    young_s: float
    daly_s: float
    recipe: Interval
    best: Interval


def failures_at(spec: JobSpec, nodes: int, step_s: float, work: float, mtbf_h: float,
                ckpt_bytes: int, write_mb_s: float, read_mb_s: float,
                node_mb_s: Optional[float], restart_fixed: float, price: Optional[float],
                steps: int, simulate: int = 0, seed: int = 0) -> Failures:
    """What failures take at `nodes` nodes, at the recipe's checkpoint interval and at the
    recommended one (Daly's); `simulate` > 0 also draws that many runs (seeded by `seed`)."""
    mtbf = mtbf_h * 3600 / nodes
    write_bw = min(write_mb_s, node_mb_s * nodes) if node_mb_s else write_mb_s
    read_bw = min(read_mb_s, node_mb_s * nodes) if node_mb_s else read_mb_s
    write = ckpt_bytes / (write_bw * 1e6)
    load = ckpt_bytes / (read_bw * 1e6)
    restart = restart_fixed + load
    ckpt = spec.recipe.checkpoint
    if ckpt.every_steps:
        recipe_steps = ckpt.every_steps
    else:
        recipe_steps = failures.interval_steps(float(ckpt.every_seconds or 0), step_s)
    best_steps = failures.interval_steps(failures.daly(write, mtbf), step_s, steps)

    def interval(k: int) -> Interval:
        seconds = min(k, steps) * step_s
        wall = failures.expected_wall(work, seconds, write, restart, mtbf)
        if not math.isfinite(wall) or wall > WALL_LIMIT_S:
            raise RuleError(
                f"at {nodes} nodes a job fails every {mtbf:.3g} s (a node's MTBF of "
                f"{mtbf_h:g} h over {nodes} nodes), against a restart of {restart:.3g} s and "
                f"{seconds:.3g} s between checkpoints: it would not finish in "
                f"{WALL_LIMIT_S / 3.15576e7:g} years; check --node-mtbf-hours, --restart-s, "
                "--checkpoint-gb and --storage-mb-s")
        sim = None
        if simulate:
            draws = simulate * (work / seconds + 2 * wall / mtbf)
            if draws > SIMULATION_LIMIT:
                raise ConfigError(f"--simulate {simulate}: at {nodes} nodes with a "
                                  f"checkpoint every {k:,} steps that is about {draws:.2g} "
                                  f"random draws (at most {SIMULATION_LIMIT:.0e}); use fewer runs")
            sim = failures.simulate(work, seconds, write, restart, mtbf, simulate, seed)
        cost = wall / 3600 * nodes * price if price is not None else None
        return Interval(k, seconds, work / wall, wall, wall / mtbf, cost, sim)

    return Failures(mtbf, write, load, restart, failures.young(write, mtbf),
                    failures.daly(write, mtbf), interval(recipe_steps), interval(best_steps))
