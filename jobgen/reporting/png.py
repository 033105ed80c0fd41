"""`jobgen report --plot FILE.png`: the HTML page's picture as one image (matplotlib, the
`plot` extra): the timeline per allocation and node, then loss, gradient norm and LR."""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from ..errors import ConfigError
from .account import counted
from .report import Report
from .svg import COLOURS, MARKS, rows


def write(r: Report, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'jobgen[plot]'") from None
    t = r.timeline
    lines = rows(r)
    fig, axes = plt.subplots(4, 1, figsize=(11, 3 + 0.28 * len(lines) + 6),
                             gridspec_kw={"height_ratios": [max(2, 0.3 * len(lines)), 2, 2, 1.5]})
    ax = axes[0]
    t0 = t.allocations[0].start if t.allocations else 0.0
    segs = counted(t.segments)
    for i, (alloc, node, _) in enumerate(lines):
        y = len(lines) - 1 - i
        for s in segs:
            if s.allocation == alloc and s.kind != "gap":
                ax.barh(y, (s.end - s.start) / 60, left=(s.start - t0) / 60, height=0.8,
                        color=COLOURS[s.kind], linewidth=0)
        a = t.allocations[alloc]
        if a.failure_at is not None and a.failed_node == node:
            ax.plot([(a.failure_at - t0) / 60], [y], "x", color="black", markersize=9, mew=2)
        if a.excluded and node == 0:
            ax.text((a.end - t0) / 60, y, f"  left out {', '.join(a.excluded)}", va="center",
                    fontsize=8, color=COLOURS["gate"])
    ax.set_yticks(range(len(lines)))
    ax.set_yticklabels([label for *_, label in reversed(lines)], fontsize=7)
    ax.set_xlabel("minutes since the first allocation started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in COLOURS.items() if k != "gap"]
    ax.legend(handles, [k for k in COLOURS if k != "gap"], ncol=9, fontsize=7, loc="upper center",
              bbox_to_anchor=(0.5, -0.35))
    ax.set_title(f"jobgen report {r.name}: effective utilisation "
                 f"{100 * r.account.utilisation:.2f} % of {r.account.allocated_h:.3f} node-hours",
                 fontsize=10)
    c = r.curves
    for ax, key, label in zip(axes[1:], ("loss", "grad_norm", "lr"),
                              ("loss", "gradient norm", "learning rate")):
        for alloc in sorted({p["allocation"] for p in c.series}):
            pts = [(p["step"], p[key]) for p in c.series if p["allocation"] == alloc
                   and p[key] is not None and math.isfinite(p[key])]
            if pts:
                ax.plot(*zip(*pts), "-", linewidth=1.2, label=f"allocation {alloc}")
        for m in c.restarts:
            ax.axvline(m["step"], color=MARKS["restart"], linestyle=":", linewidth=0.8)
        for m in c.marks:
            if m["step"] is not None:
                ax.axvline(m["step"], color=MARKS.get(m["kind"], "black"), linewidth=1.2,
                           alpha=0.7)
        if key == "grad_norm" and any((p[key] or 0) > 0 for p in c.series):
            ax.set_yscale("log")
        ax.set_ylabel(label, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step (dotted: an allocation resumed there; solid: watch's marks)")
    fig.tight_layout()
    _save(fig, plt, path)


def _save(fig: object, plt: object, path: Path) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=folder)
    except OSError as exc:
        plt.close(fig)  # type: ignore[attr-defined]
        raise ConfigError(f"--plot {path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            fig.savefig(out, format="png", dpi=100)  # type: ignore[attr-defined]
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"--plot {path}: cannot write: {exc.strerror}") from None
    finally:
        plt.close(fig)  # type: ignore[attr-defined]
        if os.path.exists(tmp):
            os.unlink(tmp)
