"""Sweeps: `--sweep optim.lr=1e-4,3e-4 --sweep parallelism.micro_batch_size=1,2` is one job per
combination (their cartesian product, in the order given), each an ordinary `--set` of the
recipe with its own run name, so that every run has its own folder and resumes on its own."""
from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..plumbing.errors import ConfigError
from . import schema

MAX_JOBS = 1000   # Slurm's default MaxArraySize is 1001 (task ids 0-1000)


@dataclass(frozen=True, slots=True)
class Point:
    """One combination: its `--set` overrides and its run name."""
    overrides: tuple[str, ...]
    run_name: str


def parse(sweeps: Sequence[str]) -> list[tuple[str, list[str]]]:
    """`KEY=V1,V2,...` options -> [(key, [values])], refusing what cannot be meant."""
    axes: list[tuple[str, list[str]]] = []
    count = 1
    for text in sweeps:
        key, sep, values = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--sweep {text!r}: expected KEY=VALUE1,VALUE2,...")
        if any(key == seen for seen, _ in axes):
            raise ConfigError(f"--sweep {key}: given twice (list all its values in one option)")
        if key.split(".")[0] in ("name", "nodes"):
            raise ConfigError(f"--sweep {key}: not a sweepable key (the job array shares the "
                              "recipe's name and one node count; submit each node count)")
        items = [v.strip() for v in values.split(",")]
        if any(not v for v in items):
            raise ConfigError(f"--sweep {key}: an empty value in {values!r}")
        if len(set(items)) != len(items):
            raise ConfigError(f"--sweep {key}: a value is listed twice in {values!r}")
        count *= len(items)     # counted before any combination is built
        if count > MAX_JOBS:
            raise ConfigError(f"--sweep {key}: {count:,} combinations with the keys before "
                              f"it, more than {MAX_JOBS} (one job each)")
        axes.append((key, items))
    return axes


def _slug(key: str, value: str) -> str:
    """`optim.lr`, `3e-4` -> `lr3e-4`: the leaf key and the value, in run-name characters."""
    return key.rsplit(".", 1)[-1] + re.sub(r"[^A-Za-z0-9.-]+", "_", value)


def points(sweeps: Sequence[str], base: str) -> list[Point]:
    """Every combination, with run names `BASE-<leaf><value>-...`, or `BASE-sweepK` where
    those would be too long, invalid or not unique."""
    axes = parse(sweeps)
    combos = list(itertools.product(*[[(key, v) for v in values] for key, values in axes]))
    names = [f"{base}-" + "-".join(_slug(k, v) for k, v in combo) for combo in combos]
    if len(set(names)) != len(names) or not all(schema.NAME_RE.fullmatch(n) for n in names):
        names = [f"{base}-sweep{i}" for i in range(len(combos))]
        if not schema.NAME_RE.fullmatch(names[-1]):
            raise ConfigError(f"--run-name: {base!r} is too long for a sweep's run names")
    return [Point(tuple(f"{k}={v}" for k, v in combo), name)
            for combo, name in zip(combos, names)]


def port_override(point: Point, index: int, port: int, sweeps: Sequence[str]) -> tuple[str, ...]:
    """Job K of a sweep meets at job.master_port + K (unless the sweep sets the port itself):
    jobs that share a node (rehearsals, non-exclusive partitions) must not share a port."""
    if any(s.partition("=")[0].strip() == "job.master_port" for s in sweeps):
        return ()
    from .limits import MASTER_PORT_MAX, PORT_ROOM
    if port + index > MASTER_PORT_MAX:
        raise ConfigError(f"--sweep: job {index} would meet at port {port + index} (job."
                          f"master_port + its index), beyond {MASTER_PORT_MAX} (a job opens "
                          f"{PORT_ROOM})")
    return (f"job.master_port={port + index}",)
