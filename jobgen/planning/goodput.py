"""Goodput at one node count: the job's MTBF, checkpoint write and load times, the expected
wall time and failures at the recipe's checkpoint interval and at the recommended one (Young's
and Daly's), optionally simulated (jobgen/planning/failures.py holds the formulas)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError, RuleError
from . import failures
from .failures import Routes, Simulation
from .in_place import InPlace

# Longer than this is "never" (a million years): beyond it the figures are not worth printing.
WALL_LIMIT_S = 3.15576e13
# Random draws a --simulate may take (about 10 s of Python per 10^7).
SIMULATION_LIMIT = 2e7
# A background save stalls training only while it copies the state into host memory (then the
# write goes on beside training): modelled at this many GB/s per node (a device-to-host copy
# over PCIe; CPU tensors are copied in memory). An assumption, not a measurement.
STAGE_GB_S_PER_NODE = 10.0
# Payloads whose library has no background save (DeepSpeed on Gaudi at Habana's 1.16.0).
SYNC_ONLY = frozenset({"habana_deepspeed"})


def seal_lag(write: float, step_s: float, seconds: float) -> float:
    """How long a background save stays unsealed after it began: the training loop seals it at
    the first step boundary after its last byte (at least one step on), and the next save waits
    for it (at most the interval). A failure meanwhile resumes from the save before and trains
    that interval again, so a failure costs this much more on average (failures fall uniformly
    in time): added to the restart. `jobgen report` measures it as the seal's lag."""
    return min(seconds, step_s * max(1, math.ceil(write / step_s))) if step_s > 0 else 0.0


def saves_in_background(spec: JobSpec) -> bool:
    """Whether the job's saves run beside training (checkpoint.async_save; unset: where the
    payload's library can and its upstream does by default)."""
    from .. import payloads
    wanted = spec.recipe.checkpoint.async_save
    if wanted is None:
        wanted = payloads.REGISTRY[spec.recipe.payload].background_save_default
    return wanted and spec.recipe.payload not in SYNC_ONLY


@dataclass(frozen=True, slots=True)
class Interval:
    steps: int
    seconds: float           # training seconds between checkpoints
    goodput: float           # training time / expected wall time
    wall_s: float            # expected wall time, failures included
    failures: float          # expected failures on the way
    cost: Optional[float]
    simulation: Optional[Simulation] = None


@dataclass(frozen=True, slots=True)
class Failures:
    job_mtbf_s: float
    write_s: float
    load_s: float
    restart_s: float         # detection + requeue + rendezvous + compile + load
    young_s: float
    daly_s: float
    recipe: Interval
    best: Interval
    stall_s: Optional[float] = None   # what a save stops training for (= write_s if in place)


def failures_at(spec: JobSpec, nodes: int, step_s: float, work: float, mtbf_h: float,
                ckpt_bytes: int, write_mb_s: float, read_mb_s: float,
                node_mb_s: Optional[float], restart_fixed: float, price: Optional[float],
                steps: int, simulate: int = 0, seed: int = 0,
                in_place_fixed: Optional[float] = None,
                process: Optional[InPlace] = None) -> Failures:
    """What failures take at `nodes` nodes, at the recipe's checkpoint interval and at the
    recommended one (Daly's); `simulate` > 0 also draws that many runs (seeded by `seed`).
    With spare nodes (job.spare_nodes), `in_place_fixed` is a restart's fixed cost inside the
    allocation (detection and torchrun's rendezvous: no requeue, gate or compile pass).
    `process`: the share of failures that are a process's and the budgets that keep them in the
    allocation (planning/in_place.py); where it applies, it decides the restarts in place."""
    mtbf = mtbf_h * 3600 / nodes
    write_bw = min(write_mb_s, node_mb_s * nodes) if node_mb_s else write_mb_s
    read_bw = min(read_mb_s, node_mb_s * nodes) if node_mb_s else read_mb_s
    write = ckpt_bytes / (write_bw * 1e6)
    load = ckpt_bytes / (read_bw * 1e6)
    restart = restart_fixed + load
    # The checkpoint's cost to training is its stall. In place, that is the whole write. In the
    # background, it is the copy into host memory, plus any wait for the previous save when
    # saves come closer than a write (one in flight); and a failure before a save is sealed
    # resumes from the one before (seal_lag, added to every restart below).
    background = saves_in_background(spec)
    stall = ckpt_bytes / (STAGE_GB_S_PER_NODE * 1e9 * nodes) if background else write
    # Spare nodes: in each allocation the first k node failures (k: the spares) are restarts in
    # place, the next one a requeue, which brings a fresh allocation with its spares: k of every
    # k + 1 failures stay inside the allocation.
    # The spares are billed all along; a spare's own failure is not modelled (it costs no
    # training time, only the spare).
    job = spec.recipe.job
    billed = nodes + job.spare_nodes
    kept = job.spare_nodes
    routed = process if process is not None and process.applies else None
    if routed is not None and in_place_fixed is not None:
        # Process failures too (in_place.py): the long-run share of failures kept inside.
        share = 1.0 - routed.requeued()
        restart = share * (restart - restart_fixed + in_place_fixed) + (1 - share) * restart
    elif kept and in_place_fixed is not None:
        share = kept / (kept + 1)
        restart = share * (restart - restart_fixed + in_place_fixed) + (1 - share) * restart
    ckpt = spec.recipe.checkpoint
    if ckpt.every_steps:
        recipe_steps = ckpt.every_steps
    else:
        recipe_steps = failures.interval_steps(float(ckpt.every_seconds or 0), step_s)
    best_s = failures.daly(stall, mtbf)
    if background:
        best_s = max(best_s, write)   # closer saves would wait for each other
    best_steps = failures.interval_steps(best_s, step_s, steps)

    def lag(seconds: float) -> float:
        return seal_lag(write, step_s, seconds) if background else 0.0

    def interval(k: int) -> Interval:
        seconds = min(k, steps) * step_s
        per_save = stall + (max(0.0, write - seconds) if background else 0.0)
        wall = failures.expected_wall(work, seconds, per_save, restart + lag(seconds), mtbf)
        if not math.isfinite(wall) or wall > WALL_LIMIT_S:
            raise RuleError(
                f"at {nodes} nodes a job fails every {mtbf:.3g} s (a node's MTBF of "
                f"{mtbf_h:g} h over {nodes} nodes), against a restart of "
                f"{restart + lag(seconds):.3g} s and "
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
            routes = None
            if routed is not None and in_place_fixed is not None:
                routes = Routes(routed.process_share, routed.restarts, routed.spares,
                                in_place_fixed + load + lag(seconds),
                                restart_fixed + load + lag(seconds))
            sim = failures.simulate(work, seconds, per_save, restart + lag(seconds), mtbf,
                                    simulate, seed, routes)
        cost = wall / 3600 * billed * price if price is not None else None
        return Interval(k, seconds, work / wall, wall, wall / mtbf, cost, sim)

    shown = lag(min(recipe_steps, steps) * step_s)   # at the recipe's interval
    return Failures(mtbf, write, load, restart + shown, failures.young(stall, mtbf),
                    failures.daly(stall, mtbf), interval(recipe_steps), interval(best_steps),
                    stall)
