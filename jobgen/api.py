"""The library's front door: recipe reference + options -> JobSpec -> Plan. The CLI and the
Python API both go through here, so they cannot drift apart."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from . import backends
from .inputs import recipe
from .inputs import site as sites
from .job.plan import Plan
from .job.spec import Backend, CompileMode, JobSpec
from .payloads import resolved as resolve


def job_spec(ref: str, nodes: Optional[int] = None, *, overrides: Sequence[str] = (),
             site: Optional[str] = None, backend: Backend = backends.DEFAULT,
             compile_mode: CompileMode = "auto", smoke: bool = False,
             run_name: Optional[str] = None,
             options: Optional[Mapping[str, Any]] = None) -> JobSpec:
    """Load (with the recipe's overlay for `backend`), override, validate and resolve a recipe
    for a node count on a site; `options`: the scheduler's per-job options by flag (Slurm's
    `{"partition": ..., "time": ..., "sbatch_opt": (...)}`, over the site's values)."""
    rec, source = recipe.load(ref, list(overrides), backend)
    return resolve(rec, source, sites.load(site), nodes, backend=backend,
                   compile_mode=compile_mode, smoke=smoke, run_name=run_name, options=options,
                   name_suffix=name_suffix(ref, rec, overrides, backend, run_name))


def steps_for_target(spec: JobSpec, tokens: Optional[float] = None,
                     samples: Optional[float] = None) -> int:
    """The schedule's steps that train `tokens` (or `samples`) at this spec's global batch, as
    `jobgen plan` counts them: ceil(samples / global batch), samples = tokens / seq_length."""
    import math

    from .plumbing.errors import ConfigError
    if tokens is not None and samples is not None:
        raise ConfigError("--tokens and --samples: give one target")
    if spec.smoke:
        raise ConfigError("--tokens/--samples: a --smoke rehearsal trains its own short "
                          "schedule; set the target for the real job")
    target = tokens / spec.recipe.model.seq_length if tokens is not None else samples
    assert target is not None
    return max(1, math.ceil(target / spec.global_batch_size))


def name_suffix(ref: str, rec: recipe.Recipe, overrides: Sequence[str], backend: Optional[str],
                run_name: Optional[str]) -> str:
    """The default run name's suffix: a short digest of the training values where the
    overrides change them (so `--set optim.lr=...` never resumes the recipe's own run)."""
    if run_name is not None or not overrides:
        return ""
    from .runs import runrecord
    base, _ = recipe.load(ref, [], backend)
    if runrecord.recipe_training(base) == runrecord.recipe_training(rec):
        return ""
    return runrecord.suffix(rec)


def plan(spec: JobSpec, backend: Optional[str] = None) -> Plan:
    """The backend's plan for a spec (pure: no clock, no network); `backend` where it is not
    the one the spec was resolved for (submitit resolves as Slurm)."""
    return backends.get(backend or spec.backend).plan(spec)
