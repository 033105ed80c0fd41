"""The recovery arms' figures (benchmarks/recovery_arms.py): one run's figures from its
`jobgen report --json`, the arms summarised over repetitions, their tables and issue 40's goals.
Nothing here touches Slurm: `recovery_arms.py --from-json` prints these from an earlier run."""
from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any, Optional

CAUSES = ("process", "node", "hang")
# arm: (restarts in place, spare nodes, synchronous saves, requeue delay cut)
ARMS: dict[str, tuple[int, int, bool, bool]] = {
    "A": (0, 0, True, False), "A-cut": (0, 0, True, True), "B": (3, 0, True, False),
    "C": (3, 1, True, False), "D": (3, 1, False, False)}


def measure(arm: str, report: dict[str, Any], failures: list[dict[str, Any]], state: str,
            run_dir: Path) -> dict[str, Any]:
    """One run's figures from its report: utilisation, and per failure its restart cost (its
    time to the start of the first counted step after it) and the steps trained again (repeat
    segments since the failure before it)."""
    segs = report["timeline"]["segments"]
    allocs = report["timeline"]["allocations"]
    by_cause: dict[str, dict[str, Optional[float]]] = {}
    before = 0.0
    for f in sorted(failures, key=lambda f: f["time"]):
        t = f["time"]
        after = [s["start"] for s in segs if s["kind"] == "train" and s["start"] >= t - 0.5]
        again = {s["step"] for s in segs if s["kind"] == "repeat" and s["step"] is not None
                 and before <= s["start"] < t}
        by_cause[f["cause"]] = {"restart_s": (min(after) - t) if after else None,
                                "again": float(len(again))}
        before = t
    saves = [(s[1], s[2]) for al in allocs for s in al["saves"] if s[1] is not None]
    return {
        "arm": arm, "state": state, "run_dir": str(run_dir),
        "utilisation": report["account"]["utilisation"], "causes": by_cause,
        "stall_s": sum(s for s, _ in saves), "save_stall_s": [s for s, _ in saves],
        "save_write_s": [w for _, w in saves if w is not None],
        "requeues": len(allocs) - 1 - sum(al["ending"] == "unhealthy" for al in allocs[:-1]),
        "in_place": sum(al.get("restarts_in_place", 0) for al in allocs),
        "allocations": len(allocs), "failures": failures,
        "endings": [al["ending"] for al in allocs],
    }


def _mean(values: list[float]) -> Optional[float]:
    return statistics.fmean(values) if values else None


def summarise(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: mean utilisation and its range over repetitions; per cause the mean restart cost
    and steps trained again; the mean stall per run and the median stall and write per save."""
    out: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        util = [r["utilisation"] for r in mine]
        causes = {c: {k: _mean([v for r in mine if c in r["causes"]
                                if (v := r["causes"][c][k]) is not None])
                      for k in ("restart_s", "again")} for c in CAUSES}
        stalls = [s for r in mine for s in r["save_stall_s"]]
        writes = [w for r in mine for w in r["save_write_s"]]
        out[arm] = {"runs": len(mine), "utilisation": statistics.fmean(util),
                    "low": min(util), "high": max(util), "causes": causes,
                    "stall_s": statistics.fmean(r["stall_s"] for r in mine),
                    "save_stall_s": statistics.median(stalls) if stalls else None,
                    "save_write_s": statistics.median(writes) if writes else None,
                    "requeues": statistics.fmean(r["requeues"] for r in mine),
                    "in_place": statistics.fmean(r["in_place"] for r in mine),
                    "completed": sum(r["state"] == "COMPLETED" for r in mine)}
    return out


def _f(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _ratio(value: Optional[float], base: Optional[float]) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def table(arms: dict[str, dict[str, Any]]) -> list[str]:
    """Two tables: utilisation and saves per arm; restart cost and steps again by cause."""
    base = arms.get("A", {})
    lines = ["arm    runs  utilisation %  (low-high)      x A   stall s/run  x A   "
             "per save: stall s  write s  requeues  in place"]
    for arm, s in arms.items():
        lines.append(
            f"{arm:6s} {s['runs']:4d}  {100 * s['utilisation']:13.2f}  "
            f"({100 * s['low']:5.2f}-{100 * s['high']:5.2f})  "
            f"{_ratio(s['utilisation'], base.get('utilisation')):>5s}  {s['stall_s']:11.2f}  "
            f"{_ratio(s['stall_s'], base.get('stall_s')):>4s}  "
            f"{_f(s['save_stall_s'], '{:.3f}'):>17s}  {_f(s['save_write_s'], '{:.3f}'):>7s}  "
            f"{s['requeues']:8.1f}  {s['in_place']:8.1f}")
    lines.append("")
    lines.append("arm    restart s by cause (failure to the next counted step)      "
                 "steps trained again")
    lines.append("       " + "".join(f"{k:>9s}  {'x A':>5s}   " for k in CAUSES)
                 + "process  node  hang")
    for arm, s in arms.items():
        c, bc = s["causes"], base.get("causes", {})
        cells = "".join(f"{_f(c[k]['restart_s']):>9s}  "
                        f"{_ratio(c[k]['restart_s'], bc.get(k, {}).get('restart_s')):>5s}   "
                        for k in CAUSES)
        lines.append(f"{arm:6s} {cells}{_f(c['process']['again']):>7s}  "
                     f"{_f(c['node']['again']):>4s}  {_f(c['hang']['again']):>4s}")
    return lines


def goals(arms: dict[str, dict[str, Any]]) -> list[tuple[str, Optional[bool], str]]:
    out: list[tuple[str, Optional[bool], str]] = []
    b = arms.get("B", {}).get("causes", {}).get("process", {}).get("restart_s")
    a = arms.get("A-cut", {}).get("causes", {}).get("process", {}).get("restart_s")
    out.append(("B's restart cost after a process failure <= 1/3 of A-cut's",
                None if a is None or b is None else b <= a / 3,
                f"B {_f(b)} s, A-cut {_f(a)} s, ratio {_ratio(b, a)}"))
    sync_arm = "C" if "C" in arms else "B"
    sync = arms.get(sync_arm, {}).get("save_stall_s")
    d = arms.get("D", {}).get("save_stall_s")
    out.append((f"D's save stall <= 1/5 of the synchronous one ({sync_arm}), at a sync save "
                ">= 1 s", None if sync is None or d is None or sync < 1 else d <= sync / 5,
                f"D {_f(d, '{:.3f}')} s, {sync_arm} {_f(sync, '{:.3f}')} s per save, ratio "
                f"{_ratio(d, sync)}"))
    chain = [x for x in ("A", "B", "C", "D") if x in arms]
    for lo, hi in zip(chain, chain[1:]):
        ok = arms[hi]["low"] > arms[lo]["high"]
        out.append((f"utilisation {lo} -> {hi} rises beyond the spread", ok,
                    f"{lo} {100 * arms[lo]['low']:.2f}-{100 * arms[lo]['high']:.2f} %, "
                    f"{hi} {100 * arms[hi]['low']:.2f}-{100 * arms[hi]['high']:.2f} %"))
    return out


def show(arms: dict[str, dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    loads = [r["load"] for r in runs if "load" in r]
    if loads:
        # The cores of the machine that ran them (runs kept before it was recorded: this one's).
        cores = sorted({r.get("cores") or os.cpu_count() for r in runs})
        print(f"load average (1 min) at each run's start: {min(loads):.1f}-{max(loads):.1f} on "
              f"{'/'.join(map(str, cores))} cores")
    print("\n".join(table(arms)))
    print("goals (issue 40 item 4):")
    for what, ok, detail in goals(arms):
        print(f"  {'PASS' if ok else 'not measured' if ok is None else 'FAIL'}: {what} ({detail})")
