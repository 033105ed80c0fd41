"""The planner's inputs besides the recipe: the node-hour price and node MTBF (options over the
site's plan: section), the throughput finished runs logged, and a recipe's measured points."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..inputs.site import Site
from ..job.spec import JobSpec
from ..plumbing import fsio
from ..plumbing.errors import ConfigError
from . import measurements as meas


def price_of(site: Site, platform: str, price: Optional[float],
             rate: Optional[str]) -> tuple[Optional[float], str]:
    """The price of a node-hour (--price, else the site's --rate or plan.rate, else its
    on-demand price) and where it came from."""
    if price is not None:
        return price, "--price"
    facts = (site.plan.platforms or {}).get(platform)
    prices = dict(facts.prices or {}) if facts else {}
    wanted = rate or site.plan.rate
    where = f"site {site.name}"
    if rate is not None and rate not in prices:
        known = ", ".join(sorted(prices)) or "none"
        raise ConfigError(f"--rate {rate}: the site {site.name} has no such price for "
                          f"{platform} (plan.platforms.{platform}.prices: {known})")
    if wanted and wanted in prices:
        return prices[wanted], f"{platform} {wanted}, {where}"
    if "on_demand" in prices:
        why = f" (no {wanted} rate)" if wanted else ""
        return prices["on_demand"], f"{platform} on_demand{why}, {where}"
    return None, (f"no price: pass --price, or set plan.platforms.{platform}.prices in the "
                  f"site {site.name}")


def mtbf_of(site: Site, platform: str,
            node_mtbf_hours: Optional[float]) -> tuple[Optional[float], str]:
    """A node's mean hours between failures (--node-mtbf-hours, else the site's) and where it
    came from."""
    if node_mtbf_hours is not None:
        return node_mtbf_hours, "--node-mtbf-hours"
    facts = (site.plan.platforms or {}).get(platform)
    if facts and facts.node_mtbf_hours:
        return facts.node_mtbf_hours, f"site {site.name}"
    return None, (f"no node MTBF: pass --node-mtbf-hours, or set "
                  f"plan.platforms.{platform}.node_mtbf_hours in the site {site.name}")


def from_runs(refs: Sequence[str], recipe_name: str,
          resolve: Callable[[str, int], JobSpec]) -> list[meas.Measurement]:
    """The throughput each finished run logged in its metrics.jsonl."""
    from pathlib import Path

    from ..runs import ledger as runs
    found: list[meas.Measurement] = []
    for ref in refs:
        run = runs.find(ref)
        if run is None:
            raise ConfigError(f"--from-run {ref}: no run of that name or job id in "
                              f"{runs.state_dir() / runs.RECORD}")
        if run.smoke:
            raise ConfigError(f"--from-run {ref}: a --smoke rehearsal; its throughput is the CPU "
                              f"stand-in's, not {run.recipe}'s")
        path = Path(run.run_dir, "train", "metrics.jsonl")
        try:
            text = fsio.read_bytes(path, fsio.MAX_BYTES, partial=True).decode("utf-8", "replace")
        except fsio.NotRegularFile as exc:
            raise ConfigError(f"--from-run {ref}: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"--from-run {ref}: {path}: cannot read: {exc.strerror}") from None
        events = meas.read_events(text)
        rate, used = meas.run_throughput(events)
        if used < 3:
            raise ConfigError(f"--from-run {ref}: {path}: {used} timed steps after warm-up; "
                              "at least 3 are needed")
        spec = resolve(run.recipe, run.nodes)
        if spec.recipe.name != recipe_name:
            raise ConfigError(f"--from-run {ref}: the run trained {spec.recipe.name}, not "
                              f"{recipe_name}")
        batch = next((e.get("global_batch_size") for e in events if e.get("event") == "start"),
                     None)
        settings = meas.Settings(global_batch=batch if isinstance(batch, int) else None,
                                 seq_length=spec.recipe.model.seq_length)
        found.append(meas.Measurement(recipe_name, run.nodes, rate,
                                      f"run {run.name} ({used} steps of {path})", settings, "run"))
    return found


def recipe_points(name: str, table: meas.Table, extra: Sequence[meas.Measurement]
            ) -> tuple[list[meas.Measurement], list[str]]:
    """The recipe's measured points: published, then the user's (which replace a published
    point at the same node count)."""
    notes: list[str] = []
    points = {p.nodes: p for p in meas.measurements(table, "published") if p.recipe == name}
    for p in extra:
        if p.recipe != name:
            continue
        if p.nodes in points:
            notes.append(f"{p.nodes} nodes: {p.source} replaces {points[p.nodes].source}")
        points[p.nodes] = p
    return [points[n] for n in sorted(points)], notes
