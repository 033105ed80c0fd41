"""The `plan:` section of a site profile (jobgen/site.py): the facts `jobgen plan` needs about
the site: prices and node reliability per platform, checkpoint storage bandwidth, the time a
restart takes, and the check of those numbers when the site is loaded."""
from __future__ import annotations

import math
from typing import Optional

from . import schema
from .errors import ConfigError
from .record import record


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



def check_plan(plan: PlanSite, shown: str) -> None:
    """Prices, MTBFs, bandwidths more than 0; restart times 0 or more; every number finite."""
    positive: list[tuple[str, Optional[float]]] = []
    for platform, facts in (plan.platforms or {}).items():
        positive += [(f"plan.platforms.{platform}.prices.{rate}", price)
                     for rate, price in (facts.prices or {}).items()]
        positive.append((f"plan.platforms.{platform}.node_mtbf_hours", facts.node_mtbf_hours))
    if plan.storage is not None:
        positive += [("plan.storage.write_mb_s", plan.storage.write_mb_s),
                     ("plan.storage.read_mb_s", plan.storage.read_mb_s),
                     ("plan.storage.node_mb_s", plan.storage.node_mb_s)]
    for key, number in positive:
        if number is not None and not (math.isfinite(number) and number > 0):
            raise ConfigError(f"{shown}: {key}: {number} must be a number more than 0")
    for name in ("detect_s", "requeue_s", "rendezvous_s", "compile_s"):
        number = getattr(plan.restart, name)
        if not (math.isfinite(number) and number >= 0):
            raise ConfigError(f"{shown}: plan.restart.{name}: {number} must be 0 or more")
    if plan.rate is not None and not schema.NAME_RE.fullmatch(plan.rate):
        raise ConfigError(f"{shown}: plan.rate: {schema.describe(plan.rate)} must match "
                          f"{schema.NAME_RE.pattern}")
