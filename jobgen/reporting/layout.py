"""What the report's two pictures (the HTML page's SVG, reporting/svg.py, and the PNG,
reporting/png.py) share, so that they agree: the palette (declared once here), the round
ticks of the time and value axes, and each node's own row of the timeline."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from .account import LABELS, counted
from .report import Report
from .timeline import Allocation, NodeInfo, Segment

# One colour per segment kind (the legend names each with account.LABELS), none reused by the
# allocations' curve colours or the marks.
COLOURS = {
    "startup": "#b0b7c3", "gate": "#7b4fc4", "compile": "#e0a030", "train": "#3a9a52",
    "repeat": "#f08a8a", "checkpoint": "#1f4fa8", "failure": "#b3161c", "stop": "#f2c84b",
    "idle": "#e6e6e6", "gap": "#f6dcc0",
}
# The curves' colour per allocation (the legend says "allocation N").
ALLOCATIONS = ("#1f77b4", "#17becf", "#e377c2", "#bcbd22", "#393b79", "#9edae5", "#637939")
MARKS = {"grad_spike": "#e07b00", "sustained_spike": "#e07b00", "loss_spike": "#a0522d",
         "divergence": "#c0282d", "nonfinite": "#c0282d", "throughput_drop": "#777777",
         "bad_node": "#c0282d", "rollback": "#7b3fb0", "restart": "#222222"}
# The evaluation chart's colour per task (the legend names each), dashed after the first ten.
TASKS = ("#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#5254a3", "#e7ba52",
         "#843c39", "#8ca252", "#de9ed6")
# Kinds drawn at least this wide (pixels in the SVG), so that a 2-second save shows.
NARROW = {"gate": 3.0, "checkpoint": 3.0, "failure": 2.0, "gap": 3.0}


def allocation_colour(index: int) -> str:
    return ALLOCATIONS[index % len(ALLOCATIONS)]


def task_style(index: int) -> tuple[str, bool]:
    """The `index`-th evaluated task's colour, and whether its line is dashed."""
    return TASKS[index % len(TASKS)], (index // len(TASKS)) % 2 == 1


def count_label(value: float) -> str:
    """A count of tokens as a tick label: 512, 8,000, 12 k, 3.5 M, 1.8 T."""
    for scale, suffix in ((1e12, " T"), (1e9, " B"), (1e6, " M"), (1e4, " k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return plain(value)


_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
               43200, 86400, 172800, 604800)


def time_ticks(span_s: float, most: int = 8) -> list[tuple[float, str]]:
    """(seconds since the start, label) at a round interval (1, 2, 5, 10, 15, 30 s, 1, 2, 5 ...
    min, 1, 2, 3, 6, 12 h, days) from 0 to past `span_s`, at most `most` + 1 of them."""
    span_s = span_s if math.isfinite(span_s) and span_s > 0 else 1.0
    step = next((s for s in _TIME_STEPS if span_s / s <= most), None)
    if step is None:
        step = 604800 * math.ceil(span_s / most / 604800)
    count = int(span_s // step)
    return [(k * step, _time_label(k * step, step)) for k in range(count + 1)]


def _time_label(value: float, step: float) -> str:
    if step < 60:
        return f"{value:g} s"
    if step < 1800:
        return f"{value / 60:g} min"
    if step < 86400:
        return f"{value / 3600:g} h"
    return f"{value / 86400:g} d"


def value_ticks(low: float, high: float, most: int = 5) -> list[float]:
    """Round values (1, 2, 5 times a power of ten apart) from `low` to `high`."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        return [low]
    raw = (high - low) / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    first = math.ceil(low / step)
    return [k * step for k in range(first, int(math.floor(high / step)) + 1)]


def plain(value: float) -> str:
    """A tick label as a plain number (0.0003, 2.5, 12,000), never 1.2×10^0."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-4:
        return f"{value:.3g}"
    text = f"{value:,.6f}".rstrip("0").rstrip(".")
    return text


def spans_decades(values: Sequence[float]) -> bool:
    """Whether positive `values` span two decades or more (a log axis reads them better)."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return bool(positive) and max(positive) / min(positive) >= 100


def log_ticks(low: float, high: float) -> list[float]:
    """1, 2, 5 times each power of ten from `low` to `high` (positive), thinned to about 6."""
    out = [m * 10.0 ** e for e in range(math.floor(math.log10(low)),
                                        math.ceil(math.log10(high)) + 1) for m in (1, 2, 5)]
    out = [v for v in out if low <= v <= high]
    if len(out) > 7:
        out = [v for v in out if math.isclose(math.log10(v) % 1, 0, abs_tol=1e-9)
               or math.isclose(math.log10(v) % 1, 1, abs_tol=1e-9)]
    return out


@dataclass(frozen=True, slots=True)
class Row:
    allocation: int
    node: int
    label: str
    segments: tuple[Segment, ...]   # this node's own phases, and the gap before the next


def rows(r: Report) -> list[Row]:
    """One row per allocation and node, each with that node's own phases: the allocation's
    training (the gang trains together), with this node's own health gate and end."""
    segs = counted(r.timeline.segments)
    out = []
    for a in r.timeline.allocations:
        mine = [s for s in segs if s.allocation == a.index and s.kind != "gap"]
        gap = [s for s in segs if s.kind == "gap" and s.allocation == a.index + 1]
        for n in a.nodes or ():
            label = f"#{a.index} node {n.node} {n.host}".strip()
            out.append(Row(a.index, n.node, label, tuple(_own(a, n, mine) + gap)))
        if not a.nodes:
            out.append(Row(a.index, 0, f"#{a.index}", tuple(mine + gap)))
    return out


def _own(a: Allocation, n: NodeInfo, segments: list[Segment]) -> list[Segment]:
    """The allocation's segments as node `n` lived them: its own gate (start-up before it,
    waiting for the other nodes' gates after it), and after its own end, if it ended early,
    its failure (the failed node) or idle."""
    out = list(segments)
    if n.gate is not None:
        gate_end = max((m.gate[1] for m in a.nodes if m.gate), default=n.gate[1])
        out = _paint(out, a.start, n.gate[0], "startup")
        out = _paint(out, n.gate[0], n.gate[1], "gate")
        out = _paint(out, n.gate[1], gate_end, "startup")
    if n.ended_at is not None and n.ended_at < a.end - 0.5:
        kind = "failure" if a.ending != "cancelled" and (
            a.failed_node == n.node or (n.status or 0) not in (0, 143)) else "idle"
        out = _paint(out, n.ended_at, a.end, kind)
    return out


def _paint(segments: list[Segment], start: float, end: float, kind: str) -> list[Segment]:
    """`segments` with [start, end) relabelled `kind` (pieces cut where they overlap)."""
    if not end > start:
        return segments
    out: list[Segment] = []
    alloc = segments[0].allocation if segments else 0
    for s in segments:
        if s.end <= start or s.start >= end:
            out.append(s)
            continue
        if s.start < start:
            out.append(Segment(s.kind, s.start, start, s.allocation, s.step))
        if s.end > end:
            out.append(Segment(s.kind, end, s.end, s.allocation, s.step))
    out.append(Segment(kind, start, end, alloc, None))
    return sorted(out, key=lambda s: s.start)


def legend(kinds: Optional[set[str]] = None) -> list[tuple[str, str]]:
    """(colour, words) for every segment colour (or those among `kinds`), in the account's
    order."""
    return [(COLOURS[k], LABELS[k]) for k in COLOURS if kinds is None or k in kinds]
