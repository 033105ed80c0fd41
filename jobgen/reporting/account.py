"""The node-hour account of a run (its timeline's segments times the nodes held), its effective
utilisation (the reference run's figure: training time that counts / allocated time), each
attempt's share, and what its failures say about the cluster, in `jobgen plan`'s inputs form."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

from ..planning import failures as model
from .bounds import relabel
from .stalls import seal_lags
from .timeline import KINDS, Segment, Timeline

LABELS = {
    "startup": "start-up, rendezvous, checkpoint load", "gate": "health gate",
    "compile": "compile pass", "train": "training steps that count",
    "repeat": "steps trained again after a restart", "checkpoint": "checkpoint writes",
    "failure": "failure to allocation end", "stop": "time-limit stop",
    "idle": "idle at the end", "gap": "restart gaps (nodes held, no allocation)",
}


@dataclass(frozen=True, slots=True)
class Attempt:
    index: int
    job: str
    hosts: tuple[str, ...]
    ending: str
    allocated_h: float          # node-hours
    counted_h: float
    share: float                # of the run's counted training
    utilisation: float          # its own counted / allocated
    steps: str                  # "9-16"


@dataclass(frozen=True, slots=True)
class Cluster:
    failures: int
    failures_per_node_hour: float
    node_mtbf_hours: Optional[float]
    restart_s: Optional[float]        # failure to training again, checkpoint load included
    load_s: Optional[float]           # of which: loading the checkpoint
    checkpoint_write_s: Optional[float]
    checkpoint_interval_s: Optional[float]   # training seconds between writes
    step_s: Optional[float]
    stops: int                        # time-limit stops (planned, not failures)
    health_requeues: int
    risk_h: float                     # node-hours at risk of a failure
    # What each save stopped training for, from the checkpoint events (the cost plan's model
    # takes); None where the trainer does not say. checkpoint_write_s is then the write itself.
    checkpoint_stall_s: Optional[float] = None
    # A background save's exposure: from the end of its copy to its seal (at a step boundary
    # after its last byte); a failure in it trains the interval before again. None: none sealed
    # after a step (saves in place, whose write is the model's checkpoint segment).
    seal_lag_s: Optional[float] = None


@dataclass(frozen=True, slots=True)
class Account:
    nodes: int
    waiting_h: float                  # node-hours waited for nodes (not allocated)
    allocated_h: float
    parts: tuple[tuple[str, float], ...]    # (kind, node-hours)
    utilisation: float
    attempts: tuple[Attempt, ...]
    cluster: Cluster
    predicted: Optional[float]        # plan's model for this run's figures
    predicted_failures_only: Optional[float]
    closure: float                    # |sum of parts - allocated| / allocated
    # The same model among its runs with this run's failure count (failures.wall_given_failures):
    # what this one run is held to. None where `predicted` is, where the run had no failure, or
    # where that count could not be drawn.
    predicted_given_failures: Optional[float] = None


def counted(segments: tuple[Segment, ...]) -> list[Segment]:
    """Relabel steps: a step trained again later (after a restart resumed before it) counts
    only in its last training; its earlier runs are `repeat` (the timeline is built so
    already: reporting/bounds.py)."""
    return relabel(list(segments))


def _mean(values: list[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def _cluster(t: Timeline, segs: list[Segment], risk_h: float) -> Cluster:
    """The cluster's figures. Failures are counted per node-hour at risk: from the first
    training step on, less time-limit stops and idle at the end (plan's model, too, lets
    failures strike training, checkpoint writes and restarts, not the job's first start)."""
    allocs = t.allocations
    fails = [a for a in allocs if a.ending == "failed"]
    # A restart in three parts, each mean over every complete measurement of it: the failure to
    # its allocation's end, the requeue and queue wait (the gap to the next allocation: complete
    # even when a failure then cuts that allocation's start-up short), and the start-up to the
    # first training step (only where it got there). Taking whole restarts only where no failure
    # cut them would drop the waits of those that were cut, the longest under a loaded queue.
    ends, waits, starts, loads = [], [], [], []
    for a in fails:
        after = allocs[a.index + 1] if a.index + 1 < len(allocs) else None
        if after is None or a.failure_at is None:
            continue
        # From the failure, or from the allocation's end where the scheduler's clock (whole
        # seconds) ends it before the failed node's record: the gap is counted from there.
        ends.append(max(0.0, a.end - a.failure_at))
        waits.append(max(0.0, after.start - a.end))
        if after.training_at is not None:
            starts.append(after.training_at - after.start)
            if after.load_s is not None:
                loads.append(after.load_s)
    if not starts:   # every start-up after a failure was cut short: those after a stop
        starts = [a.training_at - a.start for a in allocs[1:] if a.training_at is not None]
    restart = (_mean(ends) + _mean(waits) + _mean(starts)  # type: ignore[operator]
               if ends and starts else None)
    writes = [s.end - s.start for s in segs if s.kind == "checkpoint" and s.step is not None]
    steps = [s.end - s.start for s in segs if s.kind in ("train", "repeat") and s.step]
    ckpt_steps = sorted({s.step for s in segs if s.kind == "checkpoint" and s.step})
    gaps = [b - a for a, b in zip(ckpt_steps, ckpt_steps[1:]) if b > a]
    step_s = statistics.median(steps) if steps else None
    interval = (statistics.median(gaps) * step_s) if gaps and step_s else None
    rate = len(fails) / risk_h if risk_h > 0 else 0.0
    saves = [save for a in allocs for save in a.saves]
    stalls = [s for _, s, _ in saves if s is not None]
    written = [w for _, _, w in saves if w is not None]
    return Cluster(len(fails), rate, (risk_h / len(fails)) if fails else None,
                   restart, _mean(loads), _mean(written) if written else _mean(writes),
                   interval, step_s, sum(a.ending == "stopped" for a in allocs),
                   sum(a.ending == "unhealthy" for a in allocs), risk_h, _mean(stalls),
                   _mean(seal_lags(list(allocs), segs)))


def _prediction(c: Cluster, work: float, fixed: float, nodes: int
                ) -> tuple[Optional[float], Optional[float]]:
    """Plan's failure model (planning/failures.py, Daly's expected wall time) for this run's
    work, checkpoint interval and write time, restart cost and failure rate; then with the run's
    own costs that model leaves out (first start-up and compile, health requeues, time-limit
    stops, idle at the end) added to the wall time. A failure costs its restart and, with saves
    in the background, the seal's lag: one before the seal trains the interval before again."""
    # A save costs training its stall (a background save's write goes on beside training).
    cost = c.checkpoint_stall_s if c.checkpoint_stall_s is not None else c.checkpoint_write_s
    if not (work > 0 and c.checkpoint_interval_s and cost is not None):
        return None, None
    mtbf = (c.node_mtbf_hours * 3600 / nodes) if c.node_mtbf_hours else float("inf")
    restart = (c.restart_s or 0.0) + (c.seal_lag_s or 0.0)
    if mtbf == float("inf"):
        full, rest = model.segments(work, c.checkpoint_interval_s)
        wall = work + (full + (1 if rest else 0)) * cost
    else:
        wall = model.expected_wall(work, c.checkpoint_interval_s, cost, restart, mtbf)
    return work / wall, work / (wall + fixed)


def _given_failures(c: Cluster, work: float, fixed: float, nodes: int) -> Optional[float]:
    """_prediction's second figure among the model's runs that fail as often as this one did:
    the run's own count of failures, at its own rate, restart and costs (seeded draws)."""
    cost = c.checkpoint_stall_s if c.checkpoint_stall_s is not None else c.checkpoint_write_s
    if not (work > 0 and c.checkpoint_interval_s and cost is not None and c.node_mtbf_hours):
        return None
    restart = (c.restart_s or 0.0) + (c.seal_lag_s or 0.0)
    wall = model.wall_given_failures(work, c.checkpoint_interval_s, cost, restart,
                                     c.node_mtbf_hours * 3600 / nodes, c.failures)
    return work / (wall + fixed) if wall is not None else None


def _fixed(t: Timeline, segs: list[Segment]) -> float:
    """Seconds the failure model leaves out: everything before the first training step (start-up,
    health gate and its requeue, compile), each time-limit stop's own restart (to the end of its
    allocation, the gap, and the next allocation's start-up, measured where it reached training;
    one a failure cut short counts as long as the run's others: that failure is the model's),
    and idle at the end."""
    allocs = t.allocations
    started = [a for a in allocs if a.training_at is not None]
    if not started:
        return 0.0
    first = started[0]
    fixed = first.training_at - allocs[0].start   # type: ignore[operator]
    startups = [a.training_at - a.start for a in started[1:]]   # type: ignore[operator]
    typical = statistics.fmean(startups) if startups else fixed
    for a in allocs:
        # A stop before the first training step is within `fixed` already.
        if a.ending == "stopped" and a.index >= first.index:
            stop = next((s.start for s in segs if s.allocation == a.index and s.kind == "stop"),
                        a.end)
            gap = sum(s.end - s.start for s in segs if s.kind == "gap" and
                      s.allocation == a.index + 1)
            after = allocs[a.index + 1] if a.index + 1 < len(allocs) else None
            own = (after.training_at - after.start if after is not None
                   and after.training_at is not None else typical)
            fixed += (a.end - stop) + gap + own
    return fixed + sum(s.end - s.start for s in segs if s.kind == "idle")


def account(t: Timeline) -> Account:
    segs = counted(t.segments)
    n = max(t.node_count, 1)
    by_alloc_nodes = {a.index: len(a.nodes) or n for a in t.allocations}
    hours: dict[str, float] = {k: 0.0 for k in KINDS}
    for s in segs:
        # A gap holds the nodes of the allocation it leads to (a reservation keeps them).
        hours[s.kind] += (s.end - s.start) * by_alloc_nodes.get(s.allocation, n) / 3600
    if t.allocations:
        allocated = sum((a.end - a.start) * by_alloc_nodes[a.index] for a in t.allocations)
        allocated += sum((s.end - s.start) * by_alloc_nodes.get(s.allocation, n)
                         for s in segs if s.kind == "gap")
        allocated_h = allocated / 3600
    else:
        allocated_h = 0.0
    total = sum(hours.values())
    counted_h = hours["train"]
    attempts = []
    for a in t.allocations:
        mine = [s for s in segs if s.allocation == a.index and s.kind != "gap"]
        a_h = (a.end - a.start) * by_alloc_nodes[a.index] / 3600
        c_h = sum((s.end - s.start) for s in mine if s.kind == "train") * \
            by_alloc_nodes[a.index] / 3600
        trained = [s.step for s in mine if s.kind in ("train", "repeat") and s.step]
        attempts.append(Attempt(a.index, a.job, tuple(x.host for x in a.nodes), a.ending, a_h,
                                c_h, c_h / counted_h if counted_h else 0.0,
                                c_h / a_h if a_h else 0.0,
                                f"{min(trained)}-{max(trained)}" if trained else "-"))
    fixed = _fixed(t, segs)
    cluster = _cluster(t, segs, max(0.0, allocated_h - fixed * n / 3600))
    work = counted_h * 3600 / n
    pure, predicted = _prediction(cluster, work, fixed, n)
    given = _given_failures(cluster, work, fixed, n) if predicted is not None else None
    return Account(n, t.waiting_s * n / 3600, allocated_h,
                   tuple((k, hours[k]) for k in KINDS), counted_h / allocated_h
                   if allocated_h else 0.0, tuple(attempts), cluster, predicted, pure,
                   abs(total - allocated_h) / allocated_h if allocated_h else 0.0, given)
