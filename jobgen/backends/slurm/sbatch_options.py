"""#SBATCH options jobgen does not own, passed through: the site's `slurm.extra_options` and
`--sbatch-opt NAME=VALUE` (repeatable; the flag's value wins for the same name). Each becomes
`#SBATCH --NAME=VALUE` (or `#SBATCH --NAME` for a flag) and one of submitit's additional
parameters. Options jobgen sets itself are refused, naming what sets them."""
from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...inputs import schema
from ...plumbing.errors import ConfigError

if TYPE_CHECKING:
    from ...inputs.site import Site

NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# What sbatch reads on an #SBATCH line without quotes: no spaces, quotes, $, ` or #.
VALUE_RE = re.compile(r"[A-Za-z0-9_@%+=:,./\[\]&|()*!-]{1,200}")
OWNED = {
    "job-name": "the recipe's name", "nodes": "--nodes", "ntasks": "jobgen (one per node)",
    "ntasks-per-node": "jobgen (one per node)", "cpus-per-task": "the site's slurm.cpus_per_task",
    "exclusive": "the site's slurm.exclusive",
    "output": "jobgen (%x-%j.out)", "error": "jobgen (%x-%j.out)", "open-mode": "jobgen",
    "requeue": "jobgen (bounded requeue)", "no-requeue": "jobgen (bounded requeue)",
    "signal": "the site's slurm.time_limit_warning_s", "partition": "--partition",
    "account": "--account", "qos": "--qos", "reservation": "--reservation", "time": "--time",
    "exclude": "--exclude", "nodelist": "--nodelist", "export": "jobgen (the job needs the "
    "submitting environment)", "chdir": "jobgen (relative paths are the submission folder's)",
    "parsable": "jobgen submit", "test-only": "jobgen check --test-only",
    "wait": "jobgen submit --wait", "wrap": "jobgen (the script is the job)",
}


def _one(name: str, value: str, where: str) -> tuple[str, str]:
    if not NAME_RE.fullmatch(name) or len(name) < 2:
        raise ConfigError(f"{where}: {schema.describe(name)} is not an sbatch long option name "
                          "(like constraint, gres, mail-type)")
    if name in OWNED:
        raise ConfigError(f"{where}: --{name} is set by {OWNED[name]}, not by an extra option")
    if name == "array" and not re.fullmatch(r"%[1-9][0-9]{0,5}", value):
        raise ConfigError(f"{where}: --array is set by --sweep; give only its throttle, "
                          "array=%N (at most N of the sweep's jobs at once)")
    if value and not VALUE_RE.fullmatch(value):
        raise ConfigError(f"{where}: --{name}: {schema.describe(value)} cannot go on an #SBATCH "
                          "line (one line of at most 200 characters: letters, digits and "
                          "_ @ % + = : , . / [ ] & | ( ) * ! -; no spaces, quotes, $ or #)")
    return name, value


def extra_options(site: "Site", given: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The site's options, then the --sbatch-opt ones (a later one replaces an earlier one of
    the same name), checked."""
    options: dict[str, str] = {}
    for name, value in (site.slurm.extra_options or {}).items():
        if not isinstance(value, str):
            value = "" if value is None else str(value)
        key, text = _one(str(name), value, f"site {site.name}: slurm.extra_options.{name}")
        options[key] = text
    for text in given:
        name, sep, value = text.partition("=")
        key, value = _one(name.strip(), value, f"--sbatch-opt {schema.describe(text)}")
        if sep and not value:
            raise ConfigError(f"--sbatch-opt {text}: no value after '=' (give NAME alone for "
                              "a flag)")
        options[key] = value
    return tuple(options.items())
