"""The report's picture as inline SVG (no script, no network): the timeline, one row per
allocation and node, and the loss, gradient-norm and learning-rate curves with watch's marks.
The colours are declared once here and used by the PNG too (reporting/png.py)."""
from __future__ import annotations

import math
from html import escape
from typing import Any, Sequence

from .account import LABELS
from .report import Report

COLOURS = {
    "startup": "#b0b7c3", "gate": "#8e6cc2", "compile": "#e0a030", "train": "#3a9a52",
    "repeat": "#e07b7b", "checkpoint": "#3577c4", "failure": "#c0282d", "stop": "#f2c84b",
    "idle": "#e6e6e6", "gap": "#ffffff",
}
MARKS = {"grad_spike": "#e07b00", "sustained_spike": "#e07b00", "loss_spike": "#a0522d",
         "divergence": "#c0282d", "nonfinite": "#c0282d", "throughput_drop": "#777777",
         "bad_node": "#c0282d", "rollback": "#7b3fb0", "restart": "#222222"}
WIDTH = 960


def rows(r: Report) -> list[tuple[int, int, str]]:
    """(allocation, node, label) for every row of the timeline."""
    out = []
    for a in r.timeline.allocations:
        for n in a.nodes or ():
            out.append((a.index, n.node, f"#{a.index} node {n.node} {n.host}".strip()))
        if not a.nodes:
            out.append((a.index, 0, f"#{a.index}"))
    return out


def _timeline(r: Report) -> str:
    t = r.timeline
    if not t.allocations:
        return ""
    t0, t1 = t.allocations[0].start, max(a.end for a in t.allocations)
    span = max(t1 - t0, 1e-9)
    left, width, height = 170, WIDTH - 190, 16
    lines = rows(r)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
           f'height="{len(lines) * (height + 4) + 60}" font-family="sans-serif" font-size="11">']

    def x(when: float) -> float:
        return left + (when - t0) / span * width

    for i, (alloc, node, label) in enumerate(lines):
        y = 10 + i * (height + 4)
        svg.append(f'<text x="4" y="{y + 12}">{escape(label)}</text>')
        for s in r.timeline.segments:
            if s.allocation != alloc and not (s.kind == "gap" and s.allocation == alloc + 1):
                continue
            kind = s.kind
            if kind == "train" and s.step is not None and _repeated(r, s.allocation, s.step):
                kind = "repeat"
            wide = max(x(s.end) - x(s.start), 0.5)
            svg.append(f'<rect x="{x(s.start):.1f}" y="{y}" width="{wide:.1f}"'
                       f' height="{height}" fill="{COLOURS[kind]}"><title>{escape(LABELS[kind])}'
                       f'{"" if s.step is None else f" step {s.step}"}: {s.end - s.start:.1f} s'
                       f'</title></rect>')
        a = t.allocations[alloc]
        if a.failure_at is not None and a.failed_node == node:
            fx = x(a.failure_at)
            svg.append(f'<path d="M{fx - 5:.1f},{y - 2} L{fx + 5:.1f},{y + height + 2} '
                       f'M{fx + 5:.1f},{y - 2} L{fx - 5:.1f},{y + height + 2}" stroke="#000" '
                       f'stroke-width="2"><title>failure of {escape(a.failed_host)}</title></path>')
        if a.excluded and node == 0:
            svg.append(f'<text x="{x(a.end) + 4:.1f}" y="{y + 12}" fill="#8e6cc2">left out: '
                       f'{escape(", ".join(a.excluded))}</text>')
    y = 10 + len(lines) * (height + 4) + 12
    svg.append(f'<text x="{left}" y="{y}">0 s</text><text x="{left + width - 60}" y="{y}">'
               f'{span / 60:.1f} min</text>')
    lx = left
    for kind in COLOURS:
        if kind == "gap":
            continue
        svg.append(f'<rect x="{lx}" y="{y + 10}" width="10" height="10" fill="{COLOURS[kind]}"/>'
                   f'<text x="{lx + 13}" y="{y + 19}">{escape(kind)}</text>')
        lx += 13 + 7 * len(kind) + 12
    svg.append("</svg>")
    return "".join(svg)


def _repeated(r: Report, allocation: int, step: int) -> bool:
    later = [s for s in r.timeline.segments
             if s.kind == "train" and s.step == step and s.allocation > allocation]
    return bool(later)


def _chart(title: str, points: Sequence[tuple[float, float, int]], marks: list[dict[str, Any]],
           restarts: list[dict[str, Any]], log: bool = False) -> str:
    width, height, left = WIDTH, 180, 60
    finite = [(s, v, a) for s, v, a in points if v is not None and math.isfinite(v)
              and (v > 0 or not log)]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 30}" '
           f'font-family="sans-serif" font-size="11"><text x="4" y="14">{escape(title)}</text>']
    if not finite:
        svg.append('<text x="60" y="60">no values</text></svg>')
        return "".join(svg)
    f = (lambda v: math.log10(v)) if log else (lambda v: v)
    s0, s1 = min(p[0] for p in finite), max(p[0] for p in finite)
    v0, v1 = min(f(p[1]) for p in finite), max(f(p[1]) for p in finite)
    sx = (width - left - 20) / max(s1 - s0, 1)
    sy = (height - 30) / max(v1 - v0, 1e-12)

    def xy(step: float, value: float) -> tuple[float, float]:
        return left + (step - s0) * sx, 20 + (v1 - f(value)) * sy

    for m in restarts:
        if m.get("step") is not None:
            x, _ = xy(m["step"], finite[0][1])
            svg.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="20" y2="{height - 10}" '
                       f'stroke="{MARKS["restart"]}" stroke-dasharray="3,3"><title>allocation '
                       f'{m["allocation"]} resumed from step {m["step"]}</title></line>')
    for alloc in sorted({p[2] for p in finite}):
        mine = [p for p in finite if p[2] == alloc]
        path = " ".join(f"{'M' if i == 0 else 'L'}{xy(s, v)[0]:.1f},{xy(s, v)[1]:.1f}"
                        for i, (s, v, _) in enumerate(mine))
        svg.append(f'<path d="{path}" fill="none" stroke="{_shade(alloc)}" stroke-width="1.5"/>')
    for m in marks:
        if m.get("step") is None or m["step"] < s0 or m["step"] > s1:
            continue
        x, _ = xy(m["step"], finite[0][1])
        svg.append(f'<circle cx="{x:.1f}" cy="24" r="4" fill="{MARKS.get(m["kind"], "#000")}">'
                   f'<title>{escape(m["kind"])}: {escape(m["message"])}</title></circle>')
    top = f"{10 ** v1:.3g}" if log else f"{v1:.3g}"
    bottom = f"{10 ** v0:.3g}" if log else f"{v0:.3g}"
    svg.append(f'<text x="4" y="28">{top}</text><text x="4" y="{height - 10}">{bottom}</text>'
               f'<text x="{left}" y="{height + 20}">step {s0:g}</text>'
               f'<text x="{width - 90}" y="{height + 20}">step {s1:g}</text></svg>')
    return "".join(svg)


def _shade(allocation: int) -> str:
    palette = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
    return palette[allocation % len(palette)]


def charts(r: Report) -> list[str]:
    c = r.curves
    out = []
    for key, title, log in (("loss", "loss", False), ("grad_norm", "gradient norm (log)", True),
                            ("lr", "learning rate", False)):
        points = [(p["step"], p[key], p["allocation"]) for p in c.series]
        out.append(_chart(title, points, c.marks, c.restarts, log))
    return out


def picture(r: Report) -> list[str]:
    return [_timeline(r), *charts(r)]

