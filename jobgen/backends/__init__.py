"""Backends turn a job spec into a plan. Each is a plain module satisfying `Backend`; they are
imported on first use so that rendering for Slurm never loads the AWS SDK."""
from __future__ import annotations

import importlib
from typing import Protocol, cast

from ..plan import Plan
from ..spec import JobSpec

BACKENDS = ("slurm", "batch")


class Backend(Protocol):
    def plan(self, spec: JobSpec) -> Plan: ...


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}")
    return cast(Backend, importlib.import_module(f"{__name__}.{name}"))
