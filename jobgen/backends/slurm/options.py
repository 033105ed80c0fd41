"""The Slurm options jobgen owns, in one table (OPTIONS): each one's name in the job spec and
`jobgen show`, its per-job flag (sbatch's own long option, so also its #SBATCH line), its kind
of value and check, and its site key. The CLI's flags, the site section's keys and schema, the
checks, `show`, the sbatch script, submitit's parameters, the run record and the docs' option
list are all read off this table: adding an option is a row here, then the regenerated schema
(`jobgen schema site`) and docs list (docs/extending.md says how). Below it, the #SBATCH options
jobgen does not own, which a site or --sbatch-opt passes through."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

from ...inputs import schema
from ...inputs.rules import TIME_LIMIT_RE, time_limit_ok
from ...plumbing.errors import ConfigError

NOUN = "Slurm"      # whose settings these are, in messages ("--qos: a Slurm setting; ...")
EXTRA = "extra"     # the spec's key of the #SBATCH options jobgen does not own (below)
MAX_HOSTS = 65536    # more hosts than any cluster jobgen submits to; Slurm expands the list
# A Slurm host list: names and bracketed ranges, comma-separated (n1,n[3-5],gpu-[01-04,07]).
_HOST = r"[A-Za-z0-9._-]*(?:\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\][A-Za-z0-9._-]*)*"
HOSTLIST_RE = re.compile(rf"(?=[A-Za-z0-9])({_HOST})(?:,(?=[A-Za-z0-9])({_HOST}))*", re.ASCII)


def hostlist_ok(text: str) -> bool:
    """Whether `text` is a Slurm host list of ascending ranges naming at most MAX_HOSTS hosts
    (its numbers are bounded before anything is counted)."""
    if len(text) > 4096 or HOSTLIST_RE.fullmatch(text) is None:
        return False
    for ranges in re.findall(r"\[([^\]]*)\]", text):
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


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of option value: its check, what the error says it must be, its JSON Schema."""
    check: Callable[[str], bool]
    rule: str
    json: Mapping[str, Any]


NAME = Kind(lambda v: schema.NAME_RE.fullmatch(v) is not None,
            f"a name matching {schema.NAME_RE.pattern}", {"pattern": schema.NAME_RE.pattern})
TIME = Kind(time_limit_ok, "a Slurm time limit (MINUTES, HH:MM:SS, D-HH:MM:SS or UNLIMITED)",
            {"pattern": TIME_LIMIT_RE.pattern})
HOSTS = Kind(hostlist_ok, f"a Slurm host list like n1,n[3-5] (ascending ranges, at most "
                          f"{MAX_HOSTS:,} hosts)", {"maxLength": 4096})


@dataclasses.dataclass(frozen=True)
class Owned:
    """One Slurm option jobgen owns. Its value: the per-job flag's, else the site's key, else
    the recipe's key; the job's #SBATCH --FLAG=VALUE line where there is one."""
    name: str                       # in the job spec, `jobgen show` (slurm.NAME)
    flag: str                       # --FLAG per job, and sbatch's #SBATCH --FLAG=VALUE
    kind: Kind
    metavar: str
    help: str                       # the flag's --help, and the docs' option list
    site_key: Optional[str] = None  # slurm.KEY in a site profile: its default
    site_help: str = ""             # that key's description in the site schema, if any
    recipe_key: Optional[str] = None  # a recipe key (job.time_limit) as the default instead


OPTIONS = (
    Owned("partition", "partition", NAME, "NAME",
          "Slurm: the partition (default: the site's slurm.partition).", "partition"),
    Owned("account", "account", NAME, "NAME",
          "Slurm: the account to charge (default: the site's).", "account"),
    Owned("qos", "qos", NAME, "NAME",
          "Slurm: the quality of service (default: the site's slurm.qos).", "qos"),
    Owned("reservation", "reservation", NAME, "NAME",
          "Slurm: run in this reservation (default: the site's).", "reservation"),
    Owned("time_limit", "time", TIME, "LIMIT",
          "Slurm: the time limit, e.g. 2-00:00:00 (default: the recipe's job.time_limit, else "
          "the partition's).", recipe_key="job.time_limit"),
    Owned("exclude", "exclude", HOSTS, "HOSTS", "Slurm: nodes not to use, e.g. n[3-4],n9."),
    Owned("nodelist", "nodelist", HOSTS, "HOSTS", "Slurm: nodes the job must include."),
)
FLAGS = (*(o.flag for o in OPTIONS), "sbatch_opt")   # what the CLI hands resolve()


# --- the #SBATCH options jobgen does not own, passed through -----------------------------------
# The site's `slurm.extra_options` and `--sbatch-opt NAME=VALUE` (repeatable; the flag's value
# wins for the same name). Each becomes `#SBATCH --NAME=VALUE` (or `#SBATCH --NAME` for a flag)
# and one of submitit's additional parameters. Options jobgen sets itself are refused, naming
# what sets them.
SBATCH_NAME_RE = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# What sbatch reads on an #SBATCH line without quotes: no spaces, quotes, $, ` or #.
VALUE_RE = re.compile(r"[A-Za-z0-9_@%+=:,./\[\]&|()*!-]{1,200}")
OWNED = {
    "job-name": "the recipe's name", "nodes": "--nodes", "ntasks": "jobgen (one per node)",
    "ntasks-per-node": "jobgen (one per node)", "cpus-per-task": "the site's slurm.cpus_per_task",
    "exclusive": "the site's slurm.exclusive",
    "output": "jobgen (%x-%j.out)", "error": "jobgen (%x-%j.out)", "open-mode": "jobgen",
    "requeue": "jobgen (bounded requeue)", "no-requeue": "jobgen (bounded requeue)",
    "signal": "the site's slurm.time_limit_warning_s",
    "export": "jobgen (the job needs the submitting environment)",
    "chdir": "jobgen (relative paths are the submission folder's)",
    "parsable": "jobgen submit", "test-only": "jobgen check --test-only",
    "wait": "jobgen submit --wait", "wrap": "jobgen (the script is the job)",
}
OWNED.update({o.flag: f"--{o.flag}" for o in OPTIONS})


def _one(name: str, value: str, where: str) -> tuple[str, str]:
    if not SBATCH_NAME_RE.fullmatch(name) or len(name) < 2:
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


def extra_options(site: Any, given: Iterable[str]) -> tuple[tuple[str, str], ...]:
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


def site_fields(cls: type) -> type:
    """The site's Slurm section: the record `cls` with a field for each option's site key,
    after its required fields (its description in the schema: the option's site_help)."""
    def copied(f: dataclasses.Field) -> tuple[str, Any, Any]:
        return f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata,
                                                 default_factory=f.default_factory)
    own = dataclasses.fields(cls)  # type: ignore[arg-type]
    required = [copied(f) for f in own if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    keys = [(o.site_key, Optional[str], dataclasses.field(
        default=None, metadata={"description": o.site_help} if o.site_help else {}))
        for o in OPTIONS if o.site_key]
    rest = [copied(f) for f in own[len(required):]]
    made = dataclasses.make_dataclass(cls.__name__, required + keys + rest, frozen=True)
    made.__module__, made.__qualname__ = cls.__module__, cls.__qualname__
    return made


def check_site(section: Any, shown: str) -> None:
    """A site profile's values of the options, checked as a per-job flag's are."""
    for o in OPTIONS:
        value = getattr(section, o.site_key) if o.site_key else None
        if value is not None and not o.kind.check(value):
            raise ConfigError(f"{shown}: slurm.{o.site_key}: {schema.describe(value)} is not "
                              f"{o.kind.rule}")


def resolve(site: Any, recipe: Any, given: Mapping[str, Any], nodes: int) -> dict[str, Any]:
    """The job's options: each flag's value in `given` (keyed by flag; `sbatch_opt`, the
    pass-through) checked, else the site's, else the recipe's; unset ones are left out."""
    extra = extra_options(site, given.get("sbatch_opt") or ())
    values: dict[str, Any] = {}
    for o in OPTIONS:
        value = given.get(o.flag)
        if value is not None and not o.kind.check(value):
            raise ConfigError(f"--{o.flag}: {schema.describe(value)} is not {o.kind.rule}")
        if value is None and o.site_key:
            value = getattr(site.slurm, o.site_key)
        if value is None and o.recipe_key:
            value = recipe
            for part in o.recipe_key.split("."):
                value = getattr(value, part)
        if value is not None:
            values[o.name] = value
    nodelist = values.get("nodelist")
    if nodelist and hostlist_size(nodelist) > nodes:
        raise ConfigError(f"--nodelist: {nodelist} names {hostlist_size(nodelist)} nodes, more "
                          f"than the job's {nodes} (Slurm refuses such a job)")
    return {**values, **({EXTRA: extra} if extra else {})}


def sbatch_lines(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(option, value) of the #SBATCH lines of the options a job has, in the table's order."""
    return [(o.flag, values[o.name]) for o in OPTIONS if values.get(o.name)]


def shown(values: Mapping[str, Any]) -> dict[str, Any]:
    """For `jobgen show`: the options, then the pass-through ones as a mapping."""
    return {k: dict(v) if k == EXTRA else v for k, v in values.items()}


def recorded(values: Mapping[str, Any]) -> dict[str, Any]:
    """For the run's record: each option by its flag, and the pass-through as --sbatch-opt
    texts (a resubmission hands them back to resolve())."""
    return {**{o.flag: values[o.name] for o in OPTIONS if o.name in values},
            "sbatch_opt": [f"{k}={v}" if v else k for k, v in values.get(EXTRA, ())]}


def markdown() -> str:
    """The docs' option list (docs/slurm.md, between its owned-options markers)."""
    rows = ["| flag | value | site key | what it sets |", "|---|---|---|---|"]
    for o in OPTIONS:
        site = f"`slurm.{o.site_key}`" if o.site_key else (
            f"(recipe `{o.recipe_key}`)" if o.recipe_key else "-")
        rows.append(f"| `--{o.flag}` | {o.metavar} | {site} | "
                    f"{o.help.removeprefix(NOUN + ': ')} |")
    return "\n".join(rows) + "\n"
