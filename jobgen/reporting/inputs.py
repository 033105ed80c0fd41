"""`jobgen plan --from-run RUN`: besides the throughput a run logged (planning/inputs.py), the
cluster figures its report measured: node MTBF (node-hours at risk per failure) and restart cost
(failure to training again, less the checkpoint load, which plan adds from the checkpoint size).
An option given on the command line wins."""
from __future__ import annotations

from typing import Any, Sequence

from ..plumbing.errors import ConfigError
from .report import make


def fill(options: dict[str, Any], refs: Sequence[str]) -> list[str]:
    """Set options["node_mtbf_hours"] and options["restart_s"] from the runs' reports where the
    user did not; returns what was taken, as lines for the user."""
    risk_h, failures, restarts = 0.0, 0, []
    for ref in refs:
        try:
            cluster = make(ref, None, with_evals=False).account.cluster
        except ConfigError:   # not found or nothing written: plan's own check says which
            continue
        risk_h += cluster.risk_h
        failures += cluster.failures
        if cluster.restart_s is not None:
            restarts += [max(0.0, cluster.restart_s - (cluster.load_s or 0.0))] * \
                max(cluster.failures, 1)
    taken = []
    if failures and options.get("node_mtbf_hours") is None:
        options["node_mtbf_hours"] = risk_h / failures
        taken.append(f"node MTBF {risk_h / failures:,.4g} h: {failures} failure(s) in "
                     f"{risk_h:,.4g} node-hours at risk (--from-run)")
    if restarts and options.get("restart_s") is None:
        options["restart_s"] = sum(restarts) / len(restarts)
        taken.append(f"restart {options['restart_s']:,.1f} s before the checkpoint load, "
                     "measured (--from-run)")
    return taken
