"""The chaos rehearsal's comparison (benchmarks/chaos_rehearsal.py): what `jobgen report --json`
shows against plan's failure model and against what was injected, the figures and their
printing."""
from __future__ import annotations

import time
from typing import Any, Optional

TOLERANCE = 0.03            # points of effective utilisation, as a fraction


def check(report: dict[str, Any], injected: list[dict[str, Any]]) -> list[str]:
    """What does not hold, as sentences (empty: the rehearsal holds)."""
    problems = []
    acc, allocs = report["account"], report["timeline"]["allocations"]
    # One run is held to the model's runs with its own failure count where that was drawn (a
    # run's first failure always strikes training; the expectation at its rate, which lets some
    # strike a restart, sits above such a run: jobgen/planning/failures.py), else to that
    # expectation.
    measured = acc["utilisation"]
    predicted = acc.get("predicted_given_failures") or acc["predicted"]
    if predicted is None or abs(measured - predicted) > TOLERANCE:
        problems.append(f"measured {measured:.4f} vs plan's {predicted}: more than 3 points")
    if acc["closure"] > 0.01:
        problems.append(f"the parts miss the allocated total by {100 * acc['closure']:.2f} %")
    step_s = acc["cluster"]["step_s"] or 0.0
    failed = [a for a in allocs if a["ending"] == "failed"]
    for item in injected:
        if item["what"] == "kill":
            near = [a for a in failed if a["failure_at"] is not None
                    and item["time"] - 2 <= a["failure_at"] <= item["time"] + step_s + 15]
            if not any(a["failed_node"] == item["node"] for a in near):
                problems.append(f"the kill of node {item['node']} at {item['time']:.1f} is not on "
                                "the timeline")
        elif item["what"] == "time-limit":
            if not any(a["ending"] == "stopped" and a["start"] <= item["time"] <= a["end"]
                       for a in allocs):
                problems.append(f"the time-limit warning at {item['time']:.1f} is not on the "
                                "timeline")
    if not allocs or allocs[0]["ending"] != "unhealthy" or not allocs[0]["excluded"]:
        problems.append("the unhealthy node at start is not on the timeline")
    return problems


def detection(report: dict[str, Any], injected: list[dict[str, Any]]) -> Optional[float]:
    """Mean seconds from a kill (this script's clock) to the failure the timeline records (the
    killed node's flow ending): a cost the run's own records cannot show, measured from outside."""
    found = []
    for item in injected:
        if item["what"] != "kill":
            continue
        near = [a["failure_at"] for a in report["timeline"]["allocations"]
                if a["ending"] == "failed" and a["failure_at"] is not None
                and 0 <= a["failure_at"] - item["time"] <= 60]
        if near:
            found.append(min(near) - item["time"])
    return round(sum(found) / len(found), 2) if found else None


def figures(run: dict[str, Any], report: dict[str, Any], injected: list[dict[str, Any]],
            state: str) -> dict[str, Any]:
    """The rehearsal's figures: `run` (what it ran), what was injected, the report's cluster
    figures, measured against predicted, and what does not hold."""
    problems = check(report, injected) + ([] if state == "COMPLETED" else [f"job {state}"])
    acc = report["account"]
    return {
        **run, "injected": injected,
        "failures_per_node_hour": acc["cluster"]["failures_per_node_hour"],
        "restart_s": acc["cluster"]["restart_s"],
        "checkpoint_write_s": acc["cluster"]["checkpoint_write_s"],
        "seal_lag_s": acc["cluster"].get("seal_lag_s"),
        "kill_to_failure_s": detection(report, injected),
        "measured_utilisation": acc["utilisation"], "plan_predicts": acc["predicted"],
        "difference_points": None if acc["predicted"] is None
        else round(100 * (acc["utilisation"] - acc["predicted"]), 2),
        # the same model among its runs with this run's failure count: what one run is held to
        "model_given_failures": acc.get("predicted_given_failures"),
        "difference_given_points": None if acc.get("predicted_given_failures") is None
        else round(100 * (acc["utilisation"] - acc["predicted_given_failures"]), 2),
        "problems": problems,
    }


def show(figures: dict[str, Any]) -> None:
    """The figures, what was injected, and whether the rehearsal holds."""
    print("\nchaos rehearsal figures")
    for key in ("wall_s", "step_delay_s", "failures_per_node_hour", "restart_s",
                "checkpoint_write_s", "seal_lag_s", "kill_to_failure_s", "measured_utilisation",
                "plan_predicts", "difference_points", "model_given_failures",
                "difference_given_points"):
        print(f"  {key}: {figures[key]}")
    for item in figures["injected"]:
        when = time.strftime("%H:%M:%S", time.gmtime(item["time"]))
        print(f"  injected: {item['what']} at {when} UTC"
              f"{'' if 'node' not in item else ' on node ' + str(item['node'])}")
    problems = figures["problems"]
    print("  holds" if not problems else "  DOES NOT HOLD: " + "; ".join(problems))
