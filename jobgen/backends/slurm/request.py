"""What a job asks of Slurm besides its size (partition, account, QoS, reservation, time limit,
host lists, extra #SBATCH options): the site's values, the recipe's time limit and the per-job
overrides over both, each override checked like the value it replaces (jobgen/job/spec.py resolves
it into the job spec)."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional

from ...inputs import schema
from ...inputs.recipe import Recipe
from ...inputs.site import Site
from ...plumbing.errors import ConfigError
from ...plumbing.record import record


@record
class SlurmRequest:
    """What the job asks of Slurm besides its size, resolved once: the site's values, the
    recipe's time limit, and the per-job overrides (`--partition`, `--time`, ...) over both.
    Every value reaches an #SBATCH line (or submitit's parameters) and `jobgen show`."""
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    reservation: Optional[str] = None
    time_limit: Optional[str] = None
    exclude: Optional[str] = None       # a Slurm host list: nodes the job must not use
    nodelist: Optional[str] = None      # a Slurm host list: nodes the job must include
    # #SBATCH options jobgen does not own: the site's slurm.extra_options, then --sbatch-opt.
    extra: tuple[tuple[str, str], ...] = ()


# The per-job overrides (`jobgen submit --partition ...`): option -> SlurmRequest field.
SLURM_OPTIONS = {"partition": "partition", "account": "account", "qos": "qos",
                 "reservation": "reservation", "time": "time_limit", "exclude": "exclude",
                 "nodelist": "nodelist"}
# A Slurm host list: names and bracketed ranges, comma-separated (n1,n[3-5],gpu-[01-04,07]).
_HOST = r"[A-Za-z0-9._-]*(?:\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\][A-Za-z0-9._-]*)*"
HOSTLIST_RE = re.compile(rf"(?=[A-Za-z0-9])({_HOST})(?:,(?=[A-Za-z0-9])({_HOST}))*", re.ASCII)


MAX_HOSTS = 65536    # more hosts than any cluster jobgen submits to; Slurm expands the list


def hostlist_ok(text: str) -> bool:
    """Whether `text` is a Slurm host list of ascending ranges naming at most MAX_HOSTS hosts
    (its numbers are bounded before anything is counted)."""
    if len(text) > 4096 or HOSTLIST_RE.fullmatch(text) is None:
        return False
    pairs = re.findall(r"\[([^\]]*)\]", text)
    for ranges in pairs:
        for a, b in re.findall(r"(\d+)(?:-(\d+))?", ranges):
            if len(a) > 9 or len(b) > 9 or (b and int(b) < int(a)):
                return False
    return hostlist_size(text) <= MAX_HOSTS


def hostlist_size(text: str) -> int:
    """How many hosts a Slurm host list names (n[1-4],n7 -> 5), for a valid list."""
    total = 0
    for host in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
        count = 1
        for ranges in re.findall(r"\[([^\]]*)\]", host):
            count *= sum(int(b) - int(a) + 1 if b else 1
                         for a, b in re.findall(r"(\d+)(?:-(\d+))?", ranges))
        total += count
    return total


def slurm_request(site: Site, recipe: Recipe, overrides: Mapping[str, Any],
                  nodes: int) -> SlurmRequest:
    """The job's Slurm request; an override is checked like the site value it replaces and
    named as its option in errors."""
    from ...inputs.rules import time_limit_ok
    from .sbatch_options import extra_options
    extra = extra_options(site, overrides.get("sbatch_opt") or ())
    given = {SLURM_OPTIONS[k]: v for k, v in overrides.items()
             if v is not None and k != "sbatch_opt"}
    for option, key in SLURM_OPTIONS.items():
        value = given.get(key)
        if value is None:
            continue
        if key == "time_limit":
            ok = time_limit_ok(value)
            rule = "a Slurm time limit (MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)"
        elif key in ("exclude", "nodelist"):
            ok = hostlist_ok(value)
            rule = (f"a Slurm host list like n1,n[3-5] (ascending ranges, at most "
                    f"{MAX_HOSTS:,} hosts)")
        else:
            ok = schema.NAME_RE.fullmatch(value) is not None
            rule = f"a name matching {schema.NAME_RE.pattern}"
        if not ok:
            raise ConfigError(f"--{option}: {schema.describe(value)} is not {rule}")
    request = SlurmRequest(
        partition=given.get("partition", site.slurm.partition),
        account=given.get("account", site.slurm.account),
        qos=given.get("qos", site.slurm.qos),
        reservation=given.get("reservation", site.slurm.reservation),
        time_limit=given.get("time_limit", recipe.job.time_limit),
        exclude=given.get("exclude"), nodelist=given.get("nodelist"), extra=extra)
    if request.nodelist and hostlist_size(request.nodelist) > nodes:
        raise ConfigError(f"--nodelist: {request.nodelist} names "
                          f"{hostlist_size(request.nodelist)} nodes, more than the job's "
                          f"{nodes} (Slurm refuses such a job)")
    return request
