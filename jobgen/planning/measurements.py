"""Measured throughput: the published rows (recipes/measurements/published.yaml), rows of the
user's own (`--measurements FILE`), and the throughput a finished run logged (`--from-run RUN`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from ..inputs import schema
from ..plumbing import resources
from ..plumbing.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Row:
    nodes: int
    samples_per_s: float
    per_dollar: Optional[float] = None   # the source's own figure, for checking


@dataclass(frozen=True, slots=True)
class Settings:
    global_batch: Optional[int] = None
    batch_per_accelerator: Optional[int] = None
    seq_length: Optional[int] = None
    micro_batch: Optional[int] = None
    tensor: Optional[int] = None
    pipeline: Optional[int] = None
    precision: Optional[str] = None


@dataclass(frozen=True, slots=True)
class Group:
    recipe: str
    source: str
    rows: tuple[Row, ...]
    settings: Settings = Settings()
    price: Optional[float] = None        # the price basis of the rows' per_dollar


@dataclass(frozen=True, slots=True)
class Transfer:
    recipe: str
    why: str
    # `from` is a Python keyword: the file's key is mapped onto this field.
    source_recipe: str = ""


@dataclass(frozen=True, slots=True)
class Table:
    measurements: tuple[Group, ...] = ()
    transfers: tuple[Transfer, ...] = ()


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured point as the planner uses it."""
    recipe: str
    nodes: int
    samples_per_s: float
    source: str
    settings: Settings
    origin: str            # published | file | run


def load_table(path: Path, shown: str) -> Table:
    from ..inputs.yamlfile import load_yaml
    data = load_yaml(path, shown)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{shown}: expected a mapping with `measurements` (and `transfers`)")
    data = dict(data)
    transfers = data.get("transfers")
    if isinstance(transfers, list):
        fixed = []
        for i, item in enumerate(transfers):
            if isinstance(item, Mapping):
                item = dict(item)
                if "from" not in item:
                    raise ConfigError(f"{shown}: transfers[{i}].from: required key is missing")
                item["source_recipe"] = item.pop("from")
            fixed.append(item)
        data["transfers"] = fixed
    table = schema.build(Table, data, shown)
    for i, group in enumerate(table.measurements):
        where = f"{shown}: measurements[{i}]"
        if not group.rows:
            raise ConfigError(f"{where}.rows: no rows")
        seen: set[int] = set()
        for j, row in enumerate(group.rows):
            if row.nodes < 1:
                raise ConfigError(f"{where}.rows[{j}].nodes: {row.nodes} must be at least 1")
            if not (math.isfinite(row.samples_per_s) and row.samples_per_s > 0):
                raise ConfigError(f"{where}.rows[{j}].samples_per_s: {row.samples_per_s} must "
                                  "be a number more than 0")
            if row.nodes in seen:
                raise ConfigError(f"{where}.rows[{j}].nodes: {row.nodes} appears twice")
            seen.add(row.nodes)
        if group.price is not None and not (math.isfinite(group.price) and group.price > 0):
            raise ConfigError(f"{where}.price: {group.price} must be a number more than 0")
    return table


def measurements(table: Table, origin: str) -> list[Measurement]:
    return [Measurement(g.recipe, r.nodes, r.samples_per_s, g.source, g.settings, origin)
            for g in table.measurements for r in g.rows]


def published() -> Table:
    return load_table(resources.folder("recipes") / "measurements" / "published.yaml",
                      "recipes/measurements/published.yaml")


def user_file(path: str) -> list[Measurement]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--measurements {path}: no such file")
    table = load_table(file, path)
    if table.transfers:
        raise ConfigError(f"{path}: transfers: only the project's measurements name transfers")
    return measurements(table, "file")


# --- a finished run's own throughput ------------------------------------------------------------
WARMUP_INTERVALS = 2   # intervals after each start that include graph warm-up, left out


def run_throughput(events: list[dict[str, Any]]) -> tuple[float, int]:
    """Samples per second of the training pass from a run's `metrics.jsonl` events: the
    samples consumed over the time taken, between consecutive logged steps, leaving out the first
    intervals after each (re)start. Returns (samples/s, intervals used)."""
    from datetime import datetime
    samples = 0.0
    seconds = 0.0
    used = 0
    last: Optional[tuple[float, float]] = None
    since_start = 0
    for event in events:
        kind = event.get("event")
        if kind == "start":
            last, since_start = None, 0
            continue
        if kind != "step" or event.get("phase", "train") != "train":
            continue
        try:
            when = datetime.fromisoformat(str(event["time"])).timestamp()
            consumed = float(event["consumed_samples"])
        except (KeyError, TypeError, ValueError):
            continue
        if last is not None and consumed > last[1] and when > last[0]:
            since_start += 1
            if since_start > WARMUP_INTERVALS:
                samples += consumed - last[1]
                seconds += when - last[0]
                used += 1
        last = (when, consumed)
    if used == 0 or seconds <= 0:
        return 0.0, 0
    return samples / seconds, used


def read_events(text: str) -> list[dict[str, Any]]:
    """The event lines of a metrics.jsonl (or a log that mixes them with other output)."""
    import json
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('{"event"'):
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if isinstance(item, dict):
                events.append(item)
    return events
