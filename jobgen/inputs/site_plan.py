"""The `plan:` section of a site profile (jobgen/inputs/site.py): the facts `jobgen plan` needs
about the site: prices and node reliability per platform, checkpoint storage bandwidth, the time a
restart takes, and the check of those numbers when the site is loaded."""
from __future__ import annotations

import math
from typing import Optional

from ..plumbing.errors import ConfigError
from ..plumbing.record import record
from . import schema


@record
class PlatformFacts:
    """What `jobgen plan` needs to know about one instance type at this site."""
    # Rate name (on_demand, reserved_3y, ...) -> US dollars per node-hour.
    prices: Optional[dict[str, float]] = None
    # Mean hours between failures of one node that end a job (hardware, host, network).
    node_mtbf_hours: Optional[float] = None


@record
class Storage:
    """The file system checkpoints go to: sustained aggregate bandwidth in MB/s (10^6 bytes),
    and what one node can move to or from it (left out: no per-node limit)."""
    write_mb_s: float
    read_mb_s: float
    node_mb_s: Optional[float] = None


@record
class Restart:
    """Seconds from a failure to training again, before the checkpoint is loaded: noticing it,
    getting nodes back, meeting again, and compiling when the cache misses."""
    detect_s: float = 600.0
    requeue_s: float = 300.0
    rendezvous_s: float = 120.0
    compile_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.detect_s + self.requeue_s + self.rendezvous_s + self.compile_s


@record
class PlanSite:
    """The site's facts for `jobgen plan`: prices, node reliability, checkpoint storage."""
    rate: Optional[str] = None            # which of the prices to use unless --price/--rate
    platforms: Optional[dict[str, PlatformFacts]] = None
    storage: Optional[Storage] = None
    restart: Restart = Restart()
    # A worker's crash, a hang torchrun's watchdog ends, an error in user code: not a node lost.
    # Default 0 (every failure a node's); with job.restarts_in_place they restart in place.
    process_failure_share: float = 0.0   # of failures, a process's on healthy nodes (0 to 1)



def check_plan(plan: PlanSite, shown: str) -> None:
    """Prices, MTBFs, bandwidths and restart times within the domains `jobgen plan` declares
    for them (limits.PLAN_DOMAINS: the same as its options')."""
    from .limits import PLAN_DOMAINS
    numbers: list[tuple[str, str, Optional[float]]] = []
    for platform, facts in (plan.platforms or {}).items():
        numbers += [(f"plan.platforms.{platform}.prices.{rate}", "price", price)
                    for rate, price in (facts.prices or {}).items()]
        numbers.append((f"plan.platforms.{platform}.node_mtbf_hours", "node_mtbf_hours",
                        facts.node_mtbf_hours))
    if plan.storage is not None:
        numbers += [(f"plan.storage.{k}", "storage_mb_s", getattr(plan.storage, k))
                    for k in ("write_mb_s", "read_mb_s", "node_mb_s")]
    numbers += [(f"plan.restart.{k}", "restart_s", getattr(plan.restart, k))
                for k in ("detect_s", "requeue_s", "rendezvous_s", "compile_s")]
    numbers.append(("plan.process_failure_share", "process_failure_share",
                    plan.process_failure_share))
    for key, domain, number in numbers:
        low, high, unit = PLAN_DOMAINS[domain]
        if number is not None and not (math.isfinite(number) and low <= number <= high):
            raise ConfigError(f"{shown}: {key}: {number} must be from {low:g} to {high:g}"
                              + (f" {unit}" if unit else ""))
    if plan.rate is not None and not schema.NAME_RE.fullmatch(plan.rate):
        raise ConfigError(f"{shown}: plan.rate: {schema.describe(plan.rate)} must match "
                          f"{schema.NAME_RE.pattern}")
