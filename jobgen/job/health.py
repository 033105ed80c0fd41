"""The health gate, jobgen's side: which checks a job's nodes run before the compile pass, and
with which thresholds. The platform file names its accelerator's checks (`health:`), the site
overrides any value, and a recipe turns the gate off with `job.health_gate: false`. The result
reaches every node as JSON in JOBGEN_HEALTH (the node contract); payload/common/health.py runs it.

A rehearsal (`--smoke`) has no accelerators, EFA or synchronised clock to check: its gate checks
the storage only, with the rehearsal's sizes, and says what it left out.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..inputs.platforms import Health
from .spec import JobSpec

# What a value left out everywhere is.
DEFAULTS = Health(enabled=True, device_files=None, device_command=None,
                  device_count_pattern=None, efa_interfaces=None, local_free_gib=0.0,
                  shared_free_gib=None, clock_max_offset_ms=100.0, collective_command=None,
                  collective_pattern=None, collective_floor_gbps=0.0, timeout_s=20,
                  max_requeues=3, cost_s=20.0)
GIB = 1 << 30


def merged(spec: JobSpec) -> Health:
    """The platform's checks, overridden by the site's values, over jobgen's defaults."""
    layers = (DEFAULTS, spec.platform.health, spec.site.health)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Health):
        for layer in layers:
            value = getattr(layer, f.name)
            if value is not None:
                values[f.name] = value
    return Health(**values)


def enabled(spec: JobSpec) -> bool:
    return bool(merged(spec).enabled) and spec.recipe.job.health_gate


def _checkpoint_gib(spec: JobSpec) -> float:
    from .sizes import checkpoint_bytes
    if spec.rehearsal is not None:
        # The rehearsal's tiny model: its checkpoint is a few MB; ask for a little room anyway.
        return 0.5
    return checkpoint_bytes(spec) / GIB


def settings(spec: JobSpec) -> Optional[dict[str, Any]]:
    """What the nodes check (JOBGEN_HEALTH's JSON), or None where the gate is off."""
    if not enabled(spec):
        return None
    h = merged(spec)
    out: dict[str, Any] = {"timeout_s": h.timeout_s, "max_requeues": h.max_requeues}
    from .. import backends
    needs_local = bool(spec.site.paths.local_compile_cache) and \
        backends.declaration(spec.backend).local_cache_step
    if spec.smoke:
        out["shared_free_gib"] = round(_checkpoint_gib(spec), 3)
        out["skipped"] = ["devices", "EFA", "clock", "collective"]
        return out
    platform = spec.platform
    devices: dict[str, Any] = {"count": platform.devices}
    if h.device_files:
        devices["files"] = h.device_files
    if h.device_command:
        devices["command"] = list(h.device_command)
        if h.device_count_pattern:
            devices["count_pattern"] = h.device_count_pattern
    if len(devices) > 1:
        out["devices"] = devices
    efa = h.efa_interfaces
    if efa is None:
        # A backend whose site says how many interfaces a node gets (Batch's launch template,
        # EKS's device plugin request) declares `efa_interfaces(spec)`; else all the platform has.
        from .. import backends
        declared = getattr(backends.get(spec.backend), "efa_interfaces", None)
        efa = declared(spec) if declared is not None else platform.efa_interfaces
    if efa:
        out["efa_interfaces"] = efa
    # Room for the next checkpoint, sized from the model, unless the site says how much.
    out["shared_free_gib"] = round(_checkpoint_gib(spec) if h.shared_free_gib is None
                                   else h.shared_free_gib, 3)
    if needs_local and h.local_free_gib:
        out["local_free_gib"] = h.local_free_gib
    if h.clock_max_offset_ms:
        out["clock_max_offset_ms"] = h.clock_max_offset_ms
    if h.collective_command and h.collective_floor_gbps:
        out["collective"] = {"command": list(h.collective_command),
                             "pattern": h.collective_pattern,
                             "floor_gbps": h.collective_floor_gbps}
    return out


def describe(spec: JobSpec) -> dict[str, Any]:
    """For `jobgen show`: whether the gate runs, what it checks, and where each value came from."""
    if not enabled(spec):
        why = "job.health_gate: false" if not spec.recipe.job.health_gate else \
            f"site {spec.site.name}: health.enabled: false"
        return {"enabled": False, "why": why}
    found = settings(spec) or {}
    h = merged(spec)
    checks: dict[str, Any] = {}
    if "devices" in found:
        d = found["devices"]
        checks["devices"] = (f"{d['count']} present" + (f" ({d['files']})" if "files" in d else "")
                             + (f", `{' '.join(d['command'])}` exits 0" if "command" in d else "")
                             + (" and lists each" if "count_pattern" in d else ""))
    if "efa_interfaces" in found:
        checks["efa"] = f"{found['efa_interfaces']} interfaces up (/sys/class/infiniband)"
    checks["shared_storage"] = (f"run folder and compile cache writable, "
                                f"{found['shared_free_gib']:g} GiB free")
    if "local_free_gib" in found:
        checks["local_storage"] = (f"node-local compile cache writable, "
                                   f"{found['local_free_gib']:g} GiB free")
    if "clock_max_offset_ms" in found:
        checks["clock"] = f"synchronised, error at most {found['clock_max_offset_ms']:g} ms"
    if "collective" in found:
        c = found["collective"]
        checks["collective"] = f"`{' '.join(c['command'])}` reaches {c['floor_gbps']:g} GB/s"
    out: dict[str, Any] = {"enabled": True, "checks": checks,
                           "timeout_s": found["timeout_s"], "cost_s": h.cost_s}
    from .. import backends
    out["on_failure"] = backends.declaration(spec.backend).health_on_failure.replace(
        "health.max_requeues", f"{found['max_requeues']} (health.max_requeues)")
    if found.get("skipped"):
        out["skipped"] = "a CPU rehearsal: " + ", ".join(found["skipped"])
    return out


def cost_s(spec: JobSpec) -> float:
    """Seconds the gate adds to each start of the job (0 where it is off)."""
    return float(merged(spec).cost_s or 0.0) if enabled(spec) else 0.0

