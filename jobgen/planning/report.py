"""The plan shown: a table for people, JSON for programs, a PNG for a slide (matplotlib,
imported only for --plot)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from ..plumbing import extras
from .goodput import Interval
from .planner import Result


def _money(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    if hours < 1:
        return f"{seconds / 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} d"


def _sci(value: float) -> str:
    return f"{value:.3g}" if value < 1e6 else f"{value:.2e}"


def _interval_cells(iv: Interval) -> list[str]:
    cells = [f"{iv.steps:,} ({_duration(iv.seconds)})", f"{100 * iv.goodput:.2f} %"]
    if iv.simulation is not None:
        sim = iv.simulation
        cells.append(f"{100 * sim.goodput:.2f} [{100 * sim.goodput_low:.2f}-"
                     f"{100 * sim.goodput_high:.2f}]")
    cells += [_duration(iv.wall_s), _money(iv.cost)]
    return cells


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(header)] + [line(r) for r in rows]


def text(result: Result) -> str:
    r = result
    out: list[str] = []
    nodes = ", ".join(str(row.nodes) for row in r.rows)
    priced = (f"priced at ${r.price:g} per node-hour: {r.price_basis}" if r.price is not None
              else "no price")
    out.append(f"{r.recipe} on {r.platform}, site {r.site}: {_sci(r.target)} {r.unit} "
               f"({r.target_basis}); {priced}")
    out.append(f"  nodes: {nodes}")
    out.append("  price: " + (f"${r.price:g} per node-hour ({r.price_basis})"
                               if r.price is not None else r.price_basis))
    if r.on_demand is not None and r.price is not None:
        out.append(f"  on demand: ${r.on_demand:g} per node-hour (site {r.site}): every cost "
                   f"below x {r.on_demand / r.price:.2f}")
    if r.node_mtbf_hours is not None:
        out.append(f"  node MTBF: {r.node_mtbf_hours:,.0f} h ({r.mtbf_basis})")
    store = (f"; storage {r.write_mb_s:,.0f} MB/s write, {r.read_mb_s:,.0f} MB/s read"
             if r.write_mb_s is not None and r.read_mb_s is not None else "")
    out.append(f"  checkpoint: {r.checkpoint_bytes / 1e9:,.1f} GB ({r.checkpoint_basis}){store}")
    out.append(f"  restart: {r.restart_basis}, plus the checkpoint load")

    flag_ids: dict[str, int] = {}
    per_row_flags: list[str] = []
    for row in r.rows:
        ids = []
        for flag in (row.throughput.detail, *row.throughput.flags):
            if row.throughput.basis == "measured" and flag == row.throughput.detail:
                continue
            flag_ids.setdefault(flag, len(flag_ids) + 1)
            ids.append(f"[{flag_ids[flag]}]")
        per_row_flags.append(" ".join(ids))

    per = f"{r.unit}/$"
    cells = [[str(row.nodes), f"{row.throughput.samples_per_s:,.2f}", row.throughput.basis,
              f"{row.tokens_per_s:,.0f}", f"{row.step_s:.2f}", f"{row.steps:,}",
              _duration(row.work_s), _money(row.cost),
              "-" if row.per_dollar is None else f"{row.per_dollar:,.0f}", flags]
             for row, flags in zip(r.rows, per_row_flags)]
    out += ["", "Throughput, time and cost without failures:"]
    out += ["  " + x for x in _table(["nodes", "samples/s", "basis", "tokens/s", "step s",
                                      "steps", "time", "cost $", per, "notes"],
                                     cells, {0, 1, 3, 4, 5, 6, 7, 8})]

    with_fail = [row for row in r.rows if row.failures is not None]
    if with_fail:
        sim = any(row.failures.recipe.simulation for row in with_fail if row.failures)
        head = ["nodes", "job MTBF", "stall/write", "restart", "recipe: every (steps)",
                "goodput"]
        head += ["simulated [95 % CI]"] if sim else []
        head += ["time", "cost $", "recommended: every", "goodput"]
        head += ["simulated [95 % CI]"] if sim else []
        head += ["time", "cost $"]
        cells = []
        for row in with_fail:
            f = row.failures
            assert f is not None
            stall = f.write_s if f.stall_s is None else f.stall_s
            cells.append([str(row.nodes), _duration(f.job_mtbf_s),
                          f"{stall:,.3g}/{f.write_s:,.0f} s",
                          f"{f.restart_s:,.0f} s", *_interval_cells(f.recipe),
                          *_interval_cells(f.best)])
        right = set(range(len(head))) - {4, 8 + (1 if sim else 0)}
        out += ["", "Failures: expected goodput (training time / wall time) and wall time, at the "
                    "recipe's checkpoint interval and at the recommended one (Daly's optimum):"]
        out += ["  " + x for x in _table(head, cells, right)]
        if sim:
            runs = with_fail[0].failures.recipe.simulation  # type: ignore[union-attr]
            out.append(f"  simulated: {runs.runs:,} runs with seed {runs.seed} "  # type: ignore
                       "(Monte Carlo of failures and restarts)")
    if r.skipped:
        out += ["", "Not planned:"] + [f"  {s.nodes} nodes: {s.reason}" for s in r.skipped]
    if flag_ids or r.notes:
        out += ["", "Notes:"]
        out += [f"  [{i}] {flag}" for flag, i in flag_ids.items()]
        out += [f"  - {note}" for note in r.notes]
    return "\n".join(out) + "\n"


def as_json(result: Result) -> dict[str, Any]:
    data = dataclasses.asdict(result)
    for row in data["rows"]:
        row["throughput"]["modelled"] = row["throughput"]["basis"] != "measured"
    # A share of process failures, and what it comes to; left out where it is 0 (as before).
    if result.process is None:
        del data["process"]
    else:
        data["process"] = result.process.figures()
    return data


def plot(result: Result, path: Path) -> None:
    """Time to target and goodput against the node count, as a PNG written atomically."""
    extras.write_png(path, lambda plt: _figure(result, plt), 110)


def _figure(result: Result, plt: Any) -> Any:
    rows = list(result.rows)
    xs = [row.nodes for row in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    days = [row.work_s / 86400 for row in rows]
    ax1.plot(xs, days, "-", color="tab:blue", label="no failures")
    for row, d in zip(rows, days):
        measured = row.throughput.basis == "measured"
        ax1.plot([row.nodes], [d], "o", color="tab:blue",
                 markerfacecolor="tab:blue" if measured else "white")
    fail = [row for row in rows if row.failures is not None]
    if fail:
        fx = [row.nodes for row in fail]
        ax1.plot(fx, [row.failures.recipe.wall_s / 86400 for row in fail],  # type: ignore
                 "s--", color="tab:red", label="failures, recipe's interval")
        ax1.plot(fx, [row.failures.best.wall_s / 86400 for row in fail],  # type: ignore
                 "^--", color="tab:green", label="failures, recommended interval")
        ax2.plot(fx, [100 * row.failures.recipe.goodput for row in fail],  # type: ignore
                 "s-", color="tab:red", label="recipe's interval")
        ax2.plot(fx, [100 * row.failures.best.goodput for row in fail],  # type: ignore
                 "^-", color="tab:green", label="recommended interval")
        ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel("nodes")
        ax.grid(True, alpha=0.3)
    ax1.set_yscale("log")
    from matplotlib.ticker import FuncFormatter
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax1.yaxis.set_major_formatter(plain)
    ax1.yaxis.set_minor_formatter(plain)
    ax1.set_ylabel(f"days to {_sci(result.target)} {result.unit}")
    ax1.set_title("time to target (filled: measured, open: modelled)", fontsize=10)
    ax1.legend()
    ax2.set_ylabel("goodput %")
    ax2.set_title("goodput with failures", fontsize=10)
    fig.suptitle(f"jobgen plan {result.recipe} ({result.platform}, site {result.site})",
                 parse_math=False)   # a `$` in a site's name is a dollar, not maths
    fig.tight_layout()
    return fig
