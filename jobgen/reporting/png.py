"""`jobgen report --plot FILE.png`: the HTML page's picture as one image (matplotlib, the
`plot` extra): the timeline per allocation and node, then loss, gradient norm and LR, in the
page's colours, ticks and legends (reporting/layout.py). Text is drawn as it stands (no
mathtext: a `$` in a run name is a dollar sign), and the file goes through the one writer."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..plumbing import extras
from . import evals as evaluations
from .layout import (
    COLOURS,
    MARKS,
    allocation_colour,
    count_label,
    legend,
    log_ticks,
    plain,
    rows,
    spans_decades,
    task_style,
    time_ticks,
)
from .report import Report

# Text as it stands: no TeX, no $...$ maths (a run may be named "a$b$c").
RC: dict[str, Any] = {"text.usetex": False, "text.parse_math": False,
                      "axes.formatter.useoffset": False, "axes.formatter.use_mathtext": False}


def write(r: Report, path: Path) -> None:
    extras.write_png(path, lambda plt: _figure(r, plt), 100, RC)


def _figure(r: Report, plt: Any) -> Any:
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter
    t = r.timeline
    lines = rows(r)
    scored = 1 if r.evals else 0     # the evaluation's chart, beside (under) the loss curve
    fig, axes = plt.subplots(4 + scored, 1, figsize=(11, 5 + 0.3 * len(lines) + 7 + 2.5 * scored),
                             layout="constrained", gridspec_kw={"height_ratios": [
                                 max(2, 0.32 * len(lines)), 2, *[2.5] * scored, 2, 2]})
    ax = axes[0]
    t0 = t.allocations[0].start if t.allocations else 0.0
    span = max((max(a.end for a in t.allocations) - t0) if t.allocations else 1.0, 1e-9)
    narrow = span / 300          # the SVG's 3-pixel least width, on this axis
    for i, row in enumerate(lines):
        y = len(lines) - 1 - i
        for s in row.segments:
            tall = s.kind in ("checkpoint", "gate")
            ax.barh(y, max(s.end - s.start, narrow if s.kind in ("checkpoint", "gate", "gap")
                           else 0), left=s.start - t0, height=0.95 if tall else 0.75,
                    color=COLOURS[s.kind], linewidth=0)
        a = t.allocations[row.allocation]
        if a.failure_at is not None and a.failed_node == row.node:
            ax.plot([a.failure_at - t0], [y], "x", color="black", markersize=9, mew=2)
        if a.excluded and row is next(w for w in lines if w.allocation == row.allocation):
            ax.text(a.end - t0, y, f"  left out: {', '.join(a.excluded)}", va="center",
                    fontsize=8, color=COLOURS["gate"])
    ticks = time_ticks(span)
    ax.xaxis.set_major_locator(FixedLocator([v for v, _ in ticks]))
    ax.set_xticklabels([label for _, label in ticks])
    ax.set_xlim(0, span * 1.12)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_yticks(range(len(lines)))
    ax.set_yticklabels([row.label for row in reversed(lines)], fontsize=7)
    ax.set_xlabel("time since the first allocation started")
    kinds = {s.kind for row in lines for s in row.segments}
    handles = [Patch(color=c, label=words) for c, words in legend(kinds)]
    if any(a.failure_at is not None for a in t.allocations):
        handles.append(plt.Line2D([], [], marker="x", color="black", linestyle="none",
                                  label="the node whose failure ended the allocation"))
    ax.legend(handles=handles, ncol=3, fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.2))
    ax.set_title(f"jobgen report {r.name}: effective utilisation "
                 f"{100 * r.account.utilisation:.2f} % of {r.account.allocated_h:.3f} node-hours",
                 fontsize=10)
    c = r.curves
    plain_ticks = FuncFormatter(lambda v, _: plain(v))
    if scored:
        _evaluations(r, axes[2])
    for ax, key, label in zip([axes[1], *axes[2 + scored:]], ("loss", "grad_norm", "lr"),
                              ("loss", "gradient norm", "learning rate")):
        values = []
        for alloc in sorted({p["allocation"] for p in c.series}):
            pts = [(p["step"], p[key]) for p in c.series if p["allocation"] == alloc
                   and p[key] is not None and math.isfinite(p[key])]
            values += [v for _, v in pts]
            if pts:
                ax.plot(*zip(*pts), "-", linewidth=1.2, color=allocation_colour(alloc),
                        label=f"allocation {alloc}")
        for m in c.restarts:
            if m.get("step") is not None:
                ax.axvline(m["step"], color=MARKS["restart"], linestyle="--", linewidth=0.8)
        for m in c.marks:
            if m["step"] is not None:
                ax.axvline(m["step"], color=MARKS.get(m["kind"], "black"), linewidth=1.2,
                           alpha=0.7)
        if spans_decades(values):
            ax.set_yscale("log")
            positive = [v for v in values if v > 0]
            ax.yaxis.set_major_locator(FixedLocator(log_ticks(min(positive), max(positive))))
            ax.yaxis.set_minor_formatter(NullFormatter())
            label += " (log scale)"
        ax.yaxis.set_major_formatter(plain_ticks)
        ax.xaxis.set_major_formatter(plain_ticks)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(True, alpha=0.3)
        if values and ax is axes[1]:
            if c.restarts:
                ax.plot([], [], color=MARKS["restart"], linestyle="--", linewidth=0.8,
                        label="an allocation resumed at this step")
            for kind in sorted({m["kind"] for m in c.marks if m["step"] is not None}):
                ax.plot([], [], color=MARKS.get(kind, "black"), linewidth=1.2,
                        label=f"watch's {kind.replace('_', ' ')}")
            ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("step (dashed: an allocation resumed there; solid: watch's marks)")
    return fig


def _evaluations(r: Report, ax: Any) -> None:
    """Each task's headline score against tokens trained, bars +- its stderr (the page's
    accuracy chart; a task scored outside [0, 1] on a second axis)."""
    from matplotlib.ticker import FuncFormatter

    from .svg import column_words, eval_axis
    tokens = eval_axis(r) == "tokens"
    other = None
    for i, column in enumerate(evaluations.columns(r.evals)):
        pts = evaluations.series(r.evals, column)
        xs = [e.tokens if tokens else e.step for e, _ in pts]
        values = [s.value for _, s in pts]
        on = ax
        if not all(0 <= v <= 1 for v in values):
            other = other or ax.twinx()
            on = other
        colour, dashed = task_style(i)
        on.errorbar(xs, values, yerr=[s.stderr or 0.0 for _, s in pts], color=colour,
                    linestyle="--" if dashed else "-", marker="o", markersize=4, linewidth=1.2,
                    capsize=3, label=column_words(column))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: count_label(v) if tokens
                                               else plain(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: plain(v)))
    ax.set_xlabel("tokens trained" if tokens else "step (a results file without its tokens)",
                  fontsize=9)
    ax.set_ylabel("lm-eval score", fontsize=9)
    ax.grid(True, alpha=0.3)
    handles = [h for a in (ax, other) if a is not None for h in a.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.24), ncol=3,
              title="each task's headline metric (bars: +- stderr)", title_fontsize=7,
              alignment="left")
