"""The report as text (a team's Monday-morning read) and as strict JSON (every figure)."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional

from .account import LABELS, Account
from .curves import Curves
from .timeline import Timeline

# A save's wait for its own write shown from this long (a shorter one is the agreement's poll).
WAIT_SHOWN_S = 0.1


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"


def _num(x: Optional[float], unit: str = "s") -> str:
    return "-" if x is None else f"{x:,.1f} {unit}"


def _secs(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def plan_options(a: Account) -> list[str]:
    """The run's cluster figures as `jobgen plan` options."""
    c = a.cluster
    out = []
    if c.node_mtbf_hours is not None:
        out.append(f"--node-mtbf-hours {c.node_mtbf_hours:.4g}")
    if c.restart_s is not None:
        out.append(f"--restart-s {max(0.0, c.restart_s - (c.load_s or 0.0)):.4g}")
    return out


def text(t: Timeline, a: Account, curves: Curves, name: str) -> str:
    running = bool(t.allocations) and t.allocations[-1].ending == "running"
    lines = [f"run {name}: {len(t.allocations)} allocation(s) on {a.nodes} node(s)"
             + (f", {_clock(t.allocations[0].start)} to {_clock(t.allocations[-1].end)} UTC"
                if t.allocations else "")
             + (" (in progress: counted to now)" if running else "")]
    lines.append("")
    lines.append("node-hours")
    lines.append(f"  {'waiting for nodes (not allocated)':44} {a.waiting_h:10.4f}")
    lines.append(f"  {'allocated':44} {a.allocated_h:10.4f}  100.00 %")
    for kind, hours in a.parts:
        share = hours / a.allocated_h if a.allocated_h else 0.0
        lines.append(f"    {LABELS[kind]:42} {hours:10.4f} {100 * share:7.2f} %")
    lines.append(f"  parts add up to the allocated total within {100 * a.closure:.2f} %")
    lines.append("")
    lines.append(f"effective utilisation: {_pct(a.utilisation)} (training steps that count / "
                 "allocated node time)")
    lines.append("  attempt  job        ending     nodes  allocated h  counted h  share   own")
    for at in a.attempts:
        lines.append(f"  {at.index:7}  {at.job:10} {at.ending:10} {len(at.hosts):5}  "
                     f"{at.allocated_h:11.4f}  {at.counted_h:9.4f}  {100 * at.share:5.1f} %  "
                     f"{100 * at.utilisation:5.1f} %  steps {at.steps}"
                     f"{'  hosts ' + ','.join(h for h in at.hosts if h) if any(at.hosts) else ''}")
    lines.append("")
    c = a.cluster
    lines.append("the cluster, as this run measured it")
    lines.append(f"  failures {c.failures} ({c.failures_per_node_hour:.3g} per node-hour), "
                 f"time-limit stops {c.stops}, health-gate requeues {c.health_requeues}")
    lines.append(f"  restarts in place {sum(x.restarts_in_place for x in t.allocations)} "
                 f"(torchrun's, inside an allocation), requeues {max(0, len(t.allocations) - 1)} "
                 "(allocations after the first)")
    lines.append(f"  restart cost {_num(c.restart_s)} (failure to training again; checkpoint "
                 f"load {_num(c.load_s)}), checkpoint stall {_num(c.checkpoint_stall_s)} "
                 f"(write {_num(c.checkpoint_write_s)}"
                 + (f", sealed {_num(c.seal_lag_s)} after its copy" if c.seal_lag_s else "")
                 + "), "
                 f"every {_num(c.checkpoint_interval_s)} of training; step {_num(c.step_s)}")
    saves = [save for alloc in t.allocations for save in alloc.saves]
    if saves:   # each save: what the training loop waited for, apart from the write
        shown = ", ".join(f"{step}: {_secs(stall)}/{_secs(write)}"
                          for step, stall, write in saves[-12:])
        more = f" (the last 12 of {len(saves)})" if len(saves) > 12 else ""
        lines.append(f"  saves, step: stall/write in s{more}: {shown}")
    waits = [w for alloc in t.allocations for _, w in alloc.save_waits if w >= WAIT_SHOWN_S]
    if waits:   # the stall was the write's: a save came before the previous one was written
        lines.append(f"  saves closer together than a write: {len(waits)} of {len(saves)} waited "
                     f"{_secs(sum(waits))} s in all for their own write when the next save came "
                     "(in their stall; save less often to keep the stall to the copy)")
    options = plan_options(a)
    if options:
        lines.append(f"  as plan's inputs: {' '.join(options)}")
    lines.append(f"  plan's failure model for these figures: {_pct(a.predicted_failures_only)} "
                 f"of the wall time trains; with this run's start-up, stops and idle time: "
                 f"{_pct(a.predicted)} (measured {_pct(a.utilisation)})")
    if a.predicted_given_failures is not None:
        lines.append(f"  the same model among its runs with {c.failures} failure"
                     f"{'' if c.failures == 1 else 's'}, as this one (drawn): "
                     f"{_pct(a.predicted_given_failures)} (measured {_pct(a.utilisation)})")
    for alloc in t.allocations:
        if alloc.ending == "failed" and alloc.failure_at:
            who = alloc.failed_host or (f"node {alloc.failed_node}"
                                        if alloc.failed_node is not None else "a node")
            lines.append(f"  failure: allocation {alloc.index} at {_clock(alloc.failure_at)}, "
                         f"{who}, after step {alloc.last_step or 0}")
        if alloc.excluded:
            lines.append(f"  health gate: allocation {alloc.index} left out "
                         f"{', '.join(alloc.excluded)}")
    if curves.marks:
        lines.append("")
        lines.append("watch's marks")
        for m in curves.marks:
            lines.append(f"  step {m['step'] if m['step'] is not None else '-':>6}  "
                         f"{m['kind']:16} {m['message']}")
    for note in t.notes + curves.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def as_json(t: Timeline, a: Account, curves: Curves, name: str) -> dict[str, Any]:
    data = {"run": name, "timeline": dataclasses.asdict(t), "account": dataclasses.asdict(a),
            "parts": {k: h for k, h in a.parts}, "plan_options": plan_options(a),
            "curves": {"series": curves.series, "marks": curves.marks,
                       "restarts": curves.restarts}}
    return _clean(data)
