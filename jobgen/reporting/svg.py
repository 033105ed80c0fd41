"""The report's picture as inline SVG (no script, no network): the timeline, one row per
allocation and node with that node's own phases, and the loss, gradient-norm and learning-rate
curves with watch's marks. Every SVG scales to the page's width (viewBox), so nothing is cut
at a narrow window. The palette, the ticks and the rows are reporting/layout.py's, shared
with the PNG (reporting/png.py)."""
from __future__ import annotations

import math
from html import escape
from typing import Any, Sequence

from . import evals as evaluations
from .account import LABELS
from .layout import (
    COLOURS,
    MARKS,
    NARROW,
    allocation_colour,
    count_label,
    legend,
    log_ticks,
    plain,
    rows,
    spans_decades,
    task_style,
    time_ticks,
    value_ticks,
)
from .report import Report

WIDTH = 960
LABEL_W = 190        # the timeline's row labels
ROW_H, ROW_GAP = 16, 5

__all__ = ["COLOURS", "MARKS", "WIDTH", "charts", "eval_charts", "eval_legend", "legend_html",
           "picture", "timeline_svg"]


def _open(width: int, height: float) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height:.0f}" '
            f'width="100%" style="max-width:{width}px" font-family="sans-serif" '
            'font-size="11" role="img">')


def timeline_svg(r: Report) -> str:
    t = r.timeline
    if not t.allocations:
        return ""
    t0, t1 = t.allocations[0].start, max(a.end for a in t.allocations)
    span = max(t1 - t0, 1e-9)
    left, width = LABEL_W, WIDTH - LABEL_W - 110   # room on the right for "left out: ..."
    lines = rows(r)
    axis_y = 10 + len(lines) * (ROW_H + ROW_GAP) + 4
    svg = [_open(WIDTH, axis_y + 22)]

    def x(when: float) -> float:
        return left + (when - t0) / span * width

    for tick, label in time_ticks(span):
        tx = left + tick / span * width
        svg.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="6" y2="{axis_y}" stroke="#ddd"/>'
                   f'<text x="{tx:.1f}" y="{axis_y + 14}" text-anchor="middle">'
                   f'{escape(label)}</text>')
    for i, row in enumerate(lines):
        y = 10 + i * (ROW_H + ROW_GAP)
        svg.append(f'<text x="4" y="{y + 12}">{escape(row.label[:34])}'
                   f'<title>{escape(row.label)}</title></text>')
        for s in row.segments:
            wide = max(x(s.end) - x(s.start), NARROW.get(s.kind, 0.5))
            tall = s.kind in ("checkpoint", "gate")   # short events stand out of the row
            svg.append(f'<rect x="{x(s.start):.1f}" y="{y - 2 if tall else y}" '
                       f'width="{wide:.1f}" height="{ROW_H + 4 if tall else ROW_H}" '
                       f'fill="{COLOURS[s.kind]}"><title>{escape(LABELS[s.kind])}'
                       f'{"" if s.step is None else f" step {s.step}"}: '
                       f'{s.end - s.start:,.1f} s</title></rect>')
        a = t.allocations[row.allocation]
        if a.failure_at is not None and a.failed_node == row.node:
            fx = x(a.failure_at)
            svg.append(f'<path d="M{fx - 5:.1f},{y - 2} L{fx + 5:.1f},{y + ROW_H + 2} '
                       f'M{fx + 5:.1f},{y - 2} L{fx - 5:.1f},{y + ROW_H + 2}" stroke="#000" '
                       f'stroke-width="2"><title>failure of {escape(a.failed_host)}</title></path>')
        if a.excluded and row is next(w for w in lines if w.allocation == row.allocation):
            svg.append(f'<text x="{x(a.end) + 4:.1f}" y="{y + 12}" fill="{COLOURS["gate"]}">'
                       f'left out: {escape(", ".join(a.excluded))[:40]}</text>')
    svg.append("</svg>")
    return "".join(svg)


def legend_html(items: Sequence[tuple[str, str]], marker: str = "box") -> str:
    """A legend that wraps with the page (HTML, not SVG: never cut at a narrow window)."""
    out = []
    for colour, words in items:
        swatch = (f'<span class="sw" style="background:{colour}"></span>' if marker == "box"
                  else f'<span class="ln" style="border-top:3px {marker} {colour}"></span>')
        out.append(f"<li>{swatch}{escape(words)}</li>")
    return f'<ul class="legend">{"".join(out)}</ul>'


def timeline_legend(r: Report) -> str:
    kinds = {s.kind for row in rows(r) for s in row.segments}
    items = legend(kinds)
    if any(a.failure_at is not None for a in r.timeline.allocations):
        items.append(("#000000", "x: the node whose failure ended the allocation"))
    return legend_html(items)


def _chart(title: str, points: Sequence[tuple[float, float, int]], marks: list[dict[str, Any]],
           restarts: list[dict[str, Any]], log: bool = False) -> str:
    width, height, left = WIDTH, 180, 70
    finite = [(s, v, a) for s, v, a in points if v is not None and math.isfinite(v)
              and (v > 0 or not log)]
    svg = [_open(width, height + 30), f'<text x="4" y="14">{escape(title)}</text>']
    if not finite:
        svg.append('<text x="70" y="60">no values</text></svg>')
        return "".join(svg)
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    s0, s1 = min(p[0] for p in finite), max(p[0] for p in finite)
    v0, v1 = min(f(p[1]) for p in finite), max(f(p[1]) for p in finite)
    if v1 - v0 < 1e-12:
        v0, v1 = v0 - (abs(v0) * 0.05 or 0.5), v1 + (abs(v1) * 0.05 or 0.5)
    sx = (width - left - 20) / max(s1 - s0, 1)
    sy = (height - 30) / (v1 - v0)

    def xy(step: float, value: float) -> tuple[float, float]:
        return left + (step - s0) * sx, 20 + (v1 - f(value)) * sy

    ticks = log_ticks(10 ** v0, 10 ** v1) if log else value_ticks(v0, v1)
    for v in ticks:
        _, ty = xy(s0, v)
        svg.append(f'<line x1="{left}" x2="{width - 20}" y1="{ty:.1f}" y2="{ty:.1f}" '
                   f'stroke="#e4e4e4"/><text x="{left - 6}" y="{ty + 4:.1f}" '
                   f'text-anchor="end">{plain(v)}</text>')
    for st in value_ticks(s0, s1, 8) if s1 > s0 else [s0]:
        if float(st).is_integer():
            sx_, _ = xy(st, finite[0][1])
            svg.append(f'<text x="{sx_:.1f}" y="{height + 6}" text-anchor="middle">'
                       f'{plain(st)}</text>')
    svg.append(f'<text x="{width - 20}" y="{height + 22}" text-anchor="end">step</text>')
    for m in restarts:
        if m.get("step") is not None and s0 <= m["step"] <= s1:
            x, _ = xy(m["step"], finite[0][1])
            svg.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="20" y2="{height - 10}" '
                       f'stroke="{MARKS["restart"]}" stroke-dasharray="4,3"><title>allocation '
                       f'{m["allocation"]} resumed from step {m["step"]}</title></line>')
    for alloc in sorted({p[2] for p in finite}):
        mine = [p for p in finite if p[2] == alloc]
        path = " ".join(f"{'M' if i == 0 else 'L'}{xy(s, v)[0]:.1f},{xy(s, v)[1]:.1f}"
                        for i, (s, v, _) in enumerate(mine))
        svg.append(f'<path d="{path}" fill="none" stroke="{allocation_colour(alloc)}" '
                   'stroke-width="1.5"/>')
    for m in marks:
        if m.get("step") is None or m["step"] < s0 or m["step"] > s1:
            continue
        x, _ = xy(m["step"], finite[0][1])
        svg.append(f'<circle cx="{x:.1f}" cy="24" r="4" fill="{MARKS.get(m["kind"], "#000")}">'
                   f'<title>{escape(m["kind"])}: {escape(m["message"])}</title></circle>')
    svg.append("</svg>")
    return "".join(svg)


def _log_scale(values: Sequence[float]) -> bool:
    return spans_decades(values)


def charts(r: Report) -> list[str]:
    c = r.curves
    out = []
    for key, title in (("loss", "loss"), ("grad_norm", "gradient norm"),
                       ("lr", "learning rate")):
        points = [(p["step"], p[key], p["allocation"]) for p in c.series]
        log = _log_scale([v for _, v, _ in points if v is not None])
        out.append(_chart(title + (" (log scale)" if log else ""), points, c.marks, c.restarts,
                          log))
    return out


def curves_legend(r: Report) -> str:
    c = r.curves
    items = [(allocation_colour(a), f"allocation {a}")
             for a in sorted({p["allocation"] for p in c.series})]
    lines = legend_html(items, "solid")
    extra = []
    if c.restarts:
        lines += legend_html([(MARKS["restart"], "an allocation resumed at this step")],
                             "dashed")
    for kind in sorted({m["kind"] for m in c.marks}):
        extra.append((MARKS.get(kind, "#000000"), f"dot: watch's {kind.replace('_', ' ')}"))
    return lines + (legend_html(extra) if extra else "")


def eval_groups(r: Report) -> list[tuple[str, list[int]]]:
    """The evaluation's charts: (title, indices into evals.columns) for the tasks whose scores
    all lie in [0, 1] (accuracies) together, then each other task on its own axis."""
    columns = evaluations.columns(r.evals)
    unit: list[int] = []
    other: list[int] = []
    for i, column in enumerate(columns):
        values = [s.value for _, s in evaluations.series(r.evals, column)]
        (unit if all(0 <= v <= 1 for v in values) else other).append(i)
    out = [("accuracy", unit)] if unit else []
    return out + [(f"{columns[i][0]} {columns[i][1]}", [i]) for i in other]


def eval_axis(r: Report) -> str:
    """What the evaluation's charts measure along: tokens trained, or the step where a results
    file does not say its tokens (lm-eval's own file, without jobgen's entry)."""
    return "tokens" if all(e.tokens is not None for e in r.evals) else "step"


def column_words(column: tuple[str, str, str, Any]) -> str:
    task, metric, filt, shots = column
    return (f"{task} {metric}" + ("" if filt == "none" else f" ({filt})")
            + ("" if shots is None else f", {shots}-shot"))


def eval_charts(r: Report) -> list[str]:
    """Each task's headline score against tokens trained (bars: +- its stderr), one point per
    evaluated step; [] where the run has no evaluation."""
    if not r.evals:
        return []
    columns = evaluations.columns(r.evals)
    axis = eval_axis(r)
    return [_eval_chart(f"{title} against {'tokens trained' if axis == 'tokens' else 'step'}",
                        [(i, columns[i]) for i in group], r, axis)
            for title, group in eval_groups(r)]


def _eval_chart(title: str, lines: list[tuple[int, tuple[str, str, str, Any]]], r: Report,
                axis: str) -> str:
    width, height, left, right = WIDTH, 200, 70, 30
    drawn = [(i, column, [(float(e.tokens if axis == "tokens" and e.tokens is not None
                                 else e.step), e, s)
                          for e, s in evaluations.series(r.evals, column)])
             for i, column in lines]
    xs = [x for _, _, pts in drawn for x, _, _ in pts]
    lows = [s.value - (s.stderr or 0.0) for _, _, pts in drawn for _, _, s in pts]
    highs = [s.value + (s.stderr or 0.0) for _, _, pts in drawn for _, _, s in pts]
    x0, x1 = min(xs), max(xs)
    if x1 - x0 < 1e-9:
        x0, x1 = x0 - (abs(x0) * 0.1 or 1.0), x1 + (abs(x1) * 0.1 or 1.0)
    v0, v1 = min(lows), max(highs)
    if title.startswith("accuracy"):
        v0, v1 = max(0.0, v0), min(1.0, v1)
    if v1 - v0 < 0.05:
        mid = (v0 + v1) / 2
        v0, v1 = mid - 0.025, mid + 0.025
    pad = (v1 - v0) * 0.05
    v0, v1 = v0 - pad, v1 + pad
    sx = (width - left - right - 20) / (x1 - x0)
    sy = (height - 30) / (v1 - v0)

    def xy(x: float, v: float) -> tuple[float, float]:
        return left + 10 + (x - x0) * sx, 20 + (v1 - v) * sy

    svg = [_open(width, height + 30), f'<text x="4" y="14">{escape(title)} (lm-eval; bars: '
           '+- stderr)</text>']
    for v in value_ticks(v0, v1):
        _, ty = xy(x0, v)
        svg.append(f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" '
                   f'stroke="#e4e4e4"/><text x="{left - 6}" y="{ty + 4:.1f}" '
                   f'text-anchor="end">{plain(v)}</text>')
    for tick in value_ticks(x0, x1, 8):
        tx, _ = xy(tick, v0)
        if axis == "step" and not float(tick).is_integer():
            continue
        svg.append(f'<text x="{tx:.1f}" y="{height + 6}" text-anchor="middle">'
                   f'{count_label(tick) if axis == "tokens" else plain(tick)}</text>')
    svg.append(f'<text x="{width - right}" y="{height + 22}" text-anchor="end">'
               f'{"tokens trained" if axis == "tokens" else "step"}</text>')
    for i, column, pts in drawn:
        colour, dashed = task_style(i)
        if len(pts) > 1:
            path = " ".join(f"{'M' if k == 0 else 'L'}{xy(x, s.value)[0]:.1f},"
                            f"{xy(x, s.value)[1]:.1f}" for k, (x, _, s) in enumerate(pts))
            svg.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.5"'
                       + (' stroke-dasharray="6,3"' if dashed else "") + "/>")
        for x, e, s in pts:
            px, py = xy(x, s.value)
            if s.stderr:
                _, top = xy(x, s.value + s.stderr)
                _, bottom = xy(x, s.value - s.stderr)
                svg.append(f'<path d="M{px:.1f},{top:.1f} L{px:.1f},{bottom:.1f} '
                           f'M{px - 3:.1f},{top:.1f} L{px + 3:.1f},{top:.1f} '
                           f'M{px - 3:.1f},{bottom:.1f} L{px + 3:.1f},{bottom:.1f}" '
                           f'stroke="{colour}" stroke-width="1"/>')
            said = (f"step {e.step}, "
                    + ("tokens unknown" if e.tokens is None else f"{e.tokens:,} tokens")
                    + f": {column_words(column)} {s.value:.4f}"
                    + ("" if s.stderr is None else f" +- {s.stderr:.4f}"))
            svg.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{colour}">'
                       f'<title>{escape(said)}</title></circle>')
    svg.append("</svg>")
    return "".join(svg)


def eval_legend(r: Report) -> str:
    columns = evaluations.columns(r.evals)
    styled = [(task_style(i), column_words(c)) for i, c in enumerate(columns)]
    solid = [(colour, words) for (colour, dashed), words in styled if not dashed]
    dashed = [(colour, words) for (colour, dashed), words in styled if dashed]
    return (legend_html(solid, "solid") if solid else "") + (
        legend_html(dashed, "dashed") if dashed else "")


def picture(r: Report) -> list[str]:
    return [timeline_svg(r), *charts(r)]
