"""The report as text (a team's Monday-morning read) and as strict JSON (every figure)."""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional, Sequence

from . import evals as evaluations
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


def text(t: Timeline, a: Account, curves: Curves, name: str,
         evals: Sequence[evaluations.Evaluated] = (),
         exports: Sequence[evaluations.Exported] = ()) -> str:
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
    if exports:
        lines.append("")
        lines += exported(exports)
    if evals:
        lines.append("")
        lines += evaluation(evals)
    if curves.marks:
        lines.append("")
        lines.append("watch's marks")
        for m in curves.marks:
            lines.append(f"  step {m['step'] if m['step'] is not None else '-':>6}  "
                         f"{m['kind']:16} {m['message']}")
    for note in t.notes + curves.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def _score(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 100 else f"{value:,.1f}"


def _tokens(value: Optional[int]) -> str:
    return "-" if value is None else f"{value:,}"


def exported(exports: Sequence[evaluations.Exported]) -> list[str]:
    """One row per exported step: its folder and its proof (the exported model's loss on the
    step after it against the trainer's)."""
    lines = ["exports (Hugging Face folders, RUN/export/step-N: the proof, the exported "
             "model's loss against the trainer's)"]
    for e in exports:
        losses = "" if e.measured_loss is None or e.logged_loss is None else \
            f": {e.measured_loss:.6g} against {e.logged_loss:.6g}"
        lines.append(f"  step {e.step:>8}  {e.outcome}{losses}"
                     f"{f' ({e.precision})' if e.precision else ''}  {e.folder}")
    return lines


def evaluation(evals: Sequence[evaluations.Evaluated]) -> list[str]:
    """One row per evaluated step: its tokens trained and each task's headline metric (+-
    its stderr); then each task's change from its first evaluated step to its last."""
    columns = evaluations.columns(evals)
    heads = [(task, label + ("" if shots is None else f", {shots}-shot"))
             for task, metric, filt, shots in columns
             for label in [metric + ("" if filt == "none" else f" ({filt})")]]
    widths = [max(len(task), len(label), 15) for task, label in heads]
    lines = ["evaluation (lm-eval on the exported steps, RUN/eval/step-N.json: each task's "
             "headline metric +- its stderr)",
             f"  {'step':>8}  {'tokens':>17}  " + "  ".join(f"{task:{w}}" for (task, _), w
                                                            in zip(heads, widths)).rstrip(),
             f"  {'':>8}  {'':>17}  " + "  ".join(f"{label:{w}}" for (_, label), w
                                                  in zip(heads, widths)).rstrip()]
    for e in evals:
        mine = {s.column: s for s in e.scores}
        cells = []
        for column, w in zip(columns, widths):
            s = mine.get(column)
            cell = "-" if s is None else _score(s.value) + (
                "" if s.stderr is None else f" +-{_score(s.stderr)}")
            cells.append(f"{cell:{w}}")
        lines.append(f"  {e.step:>8}  {_tokens(e.tokens):>17}  " + "  ".join(cells).rstrip())
    moved = evaluations.changes(evals)
    if not moved:
        lines.append("  one evaluated step per task: no change to show yet")
    for c in moved:
        label = c.metric + ("" if c.filter == "none" else f" ({c.filter})")
        lines.append(f"  {c.task} {label}: {c.change:+.4f} from step {c.first_step} "
                     f"({_tokens(c.first_tokens)} tokens) to step {c.last_step} "
                     f"({_tokens(c.last_tokens)} tokens): {_score(c.first)} to "
                     f"{_score(c.last)}")
    return lines


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def as_json(t: Timeline, a: Account, curves: Curves, name: str,
            evals: Sequence[evaluations.Evaluated] = (),
            exports: Sequence[evaluations.Exported] = ()) -> dict[str, Any]:
    data: dict[str, Any] = {"run": name, "timeline": dataclasses.asdict(t),
                            "account": dataclasses.asdict(a),
                            "parts": {k: h for k, h in a.parts},
                            "plan_options": plan_options(a),
                            "curves": {"series": curves.series, "marks": curves.marks,
                                       "restarts": curves.restarts}}
    if exports:   # likewise for RUN/export/step-N/
        data["exports"] = [dataclasses.asdict(e) for e in exports]
    if evals:   # a run with no RUN/eval/step-N.json prints what it printed before
        data["eval"] = [dataclasses.asdict(e) for e in evals]
        data["eval_change"] = [dataclasses.asdict(c) for c in evaluations.changes(evals)]
    return _clean(data)
