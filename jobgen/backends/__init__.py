"""Backends: where a job spec runs, and the registry that knows them.

Each backend is a subpackage: its `__init__.py` holds only its `DECLARATION` (cheap to import:
what it is, what it can do, what it takes), its `backend` module what it does (`Backend`, typed in
protocol.py: `plan(spec)` pure, then `prepare`, `dry_run`, `submit`, `wait`, `status`, `logs`,
`cancel`), imported on first use so that rendering for Slurm loads no AWS SDK. The CLI, `check`,
`run` and `watch` ask this registry and name no backend. The registry imports nothing above
jobgen/plumbing/ (benchmarks/import_graph.py's layers). Adding a backend: docs/extending.md.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import os
from collections.abc import Mapping
from typing import Any, Callable, Optional, cast

from ..plumbing.errors import ConfigError
from ..plumbing.record import record

Echo = Callable[[str], None]

# The backend a command uses when none is named (--backend).
DEFAULT = "slurm"
# `jobgen submit --via` (the old spelling of --backend): how the job reaches Slurm.
VIA = {"sbatch": "slurm", "submitit": "submitit"}


class State(enum.Enum):
    """A job's state, whoever runs it (each backend maps its scheduler's words onto these)."""
    PENDING = "PENDING"        # accepted, not running yet (queued, starting, held, requeued)
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"    # ended with status 0
    FAILED = "FAILED"          # ended otherwise (an error, a time limit, a node failure)
    CANCELLED = "CANCELLED"    # stopped by someone
    UNKNOWN = "UNKNOWN"        # the scheduler no longer knows, or said something unmapped

    @property
    def ended(self) -> bool:
        return self in (State.COMPLETED, State.FAILED, State.CANCELLED)


@record
class JobStatus:
    """What a backend says about a job: the common `state`, the scheduler's own word for it
    (`native`), why it is in that state where the scheduler says, and the backend's details
    (nodes, exit codes, pods) as `detail`."""
    backend: str
    job_id: str
    state: State
    native: str
    reason: str = ""
    exit_code: Optional[int] = None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """For --json: the common fields, then the backend's details."""
        return {"backend": self.backend, "job_id": self.job_id, "state": self.state.value,
                "native_state": self.native, "reason": self.reason,
                "exit_code": self.exit_code, **dict(self.detail)}


def job_status(backend: str, job_id: str, native: str, reason: str = "",
               exit_code: Optional[int] = None, **detail: Any) -> JobStatus:
    """A backend's answer, its state mapped by what the backend declares."""
    state = declaration(backend).states.get(native.upper(), State.UNKNOWN)
    return JobStatus(backend, job_id, state, native, reason, exit_code, detail)


@record
class Declaration:
    """What a backend is and can do; asked of the registry, never written elsewhere."""
    name: str
    summary: str                          # one line: --help and `jobgen backends`
    # The site section that must be present (a Site attribute), and what it holds, for the
    # error when it is missing: (site attribute, what it holds, a built-in site that has one).
    site_section: str
    site_section_holds: str = ""
    site_example: str = ""
    site_empty: str = ""                  # the error where its section has max_nodes 0 (what the
    #                                       site lacks, and where to go instead)
    spec_backend: str = ""                # whose spec it runs ("" = its own; submitit: slurm)
    scheduler: str = ""                   # who answers for its jobs ("" = itself)
    container: bool = False               # the nodes run the site's image (not a snapshot)
    submits: bool = True                  # `jobgen submit` hands it to a scheduler
    checks: bool = True                   # `jobgen check --backend` renders its matrix
    rehearses: bool = False               # `jobgen run --backend` emulates its nodes here
    #                                       (container backends: its package's rehearsal.py)
    any_node_failure_ends: bool = False   # a node that fails ends the job (not only the main)
    run_dir_here: bool = False            # the run folder is on storage this machine reaches
    watch: bool = False                   # `jobgen watch` follows its jobs while they run
    watch_note: str = ""                  # where it cannot: what to do instead
    time_limit_requeue: bool = False      # a job at its time limit is requeued and resumes
    logs_per_node: bool = False           # `jobgen logs --node K`
    options: frozenset[str] = frozenset()   # the submit options it takes (SubmitOptions fields,
    #                                        plus region, profile)
    # Whose per-job scheduler options its jobs take ("" = none): the backend here whose
    # options.py holds their table (slurm/options.py); they ride in the spec as `options`.
    job_options: str = ""
    extra: str = ""                       # the pip extra its SDK comes in ("" = none)
    sdk_modules: tuple[str, ...] = ()     # the modules that extra brings
    renders_with_sdk: bool = False        # rendering validates with the SDK (needs the extra)
    job_id_pattern: str = ""              # a regular expression its job ids match (a guess for
    #                                       ids jobgen did not record)
    default_poll_s: float = 2.0           # how often --wait asks
    health_on_failure: str = ""           # what a bad node found by the health gate leads to
    # Its nodes, as the node contract tells the two-pass flow (jobgen/payloads/node.py):
    local_cache_step: bool = True         # the training pass reads a node-local copy of the
    #                                       compile cache (the site's paths.local_compile_cache)
    shared_fs: bool = True                # the nodes share the run folder's storage
    shared_fs_by_site: bool = False       # ... unless its site says (its backend module's
    #                                       shares_run_folder(site) then answers)
    spares: str = "its jobs have no spare nodes"   # why job.spare_nodes cannot apply to its
    #                                       nodes ("" = it allocates them: sbatch --no-kill)
    setup_on_main: bool = False           # the main node writes the job's files, once
    resolves_master: bool = False         # the flow finds the main node (slurm.master_resolver)
    forwards_stop_signal: bool = False    # the trainers get the stop signal (save, stop):
    #                                       Slurm's controller forwards its time-limit warning,
    #                                       a container's flow turns the service's SIGTERM into it
    stop_grace_s: int = 0                 # a container's seconds from SIGTERM to SIGKILL
    node_scratch: str = ""                # a node's own unsynced scratch folder, where its
    #                                       run folder is mirrored elsewhere (SageMaker's S3)
    command: bool = False                 # it brings `jobgen NAME ...` (its package's cli.py)
    shellcheck: bool = False              # what it renders is a shell script shellcheck reads
    # The scheduler's words (upper case) -> State.
    states: Mapping[str, State] = dataclasses.field(default_factory=dict)

    def takes(self, option: str) -> bool:
        return option in self.options


@record
class SubmitOptions:
    chain: bool = False                 # Slurm: compile and training as two dependent jobs
    check: bool = True                  # Slurm: preflight from this host before submitting
    queue: Optional[str] = None         # Batch: the job queue (default: the site's)
    endpoint_url: Optional[str] = None  # AWS: an endpoint (moto) instead of AWS's own
    say: Optional[Echo] = None          # where to say, as it happens, what was not checked
    stages: tuple[str, ...] = ("train",)   # the stages, chained (payloads/stages.py)
    sources: tuple[str, ...] = ()       # the prepare stage's --from inputs
    step: Optional[int] = None          # the export stage's --step (None: the newest sealed)
    every: Optional[int] = None         # --every K: a follower exports as training goes


@record
class Submitted:
    job_ids: tuple[str, ...]            # printed on stdout (the last one trains)
    notes: tuple[str, ...] = ()         # said on stderr
    queue: Optional[str] = None
    stages: tuple[str, ...] = ()        # each job's stage (payloads/stages.py); () all train

    @property
    def job_id(self) -> str:
        return self.job_ids[-1]


_ORDER = ("slurm", "batch", "submitit", "local", "sagemaker", "eks")   # help text order


_NAMES: list[tuple[str, ...]] = []


def names() -> tuple[str, ...]:
    """Every backend here (the subpackages of this package: a folder listing, nothing
    imported; listed once per process)."""
    if not _NAMES:
        found = [entry.name for folder in __path__ for entry in os.scandir(folder)
                 if entry.is_dir() and entry.name.isidentifier()
                 and os.path.isfile(os.path.join(entry.path, "__init__.py"))]
        _NAMES.append(tuple(sorted(set(found), key=lambda n: (
            _ORDER.index(n) if n in _ORDER else 99, n))))
    return _NAMES[0]


def declaration(name: str) -> Declaration:
    if name not in names():
        raise ConfigError(f"unknown backend {name!r} (one of {', '.join(names())})")
    return cast(Declaration, importlib.import_module(f"{__name__}.{name}").DECLARATION)


def declarations() -> list[Declaration]:
    return [declaration(name) for name in names()]


def having(test: Callable[[Declaration], bool]) -> tuple[str, ...]:
    """The names of the backends whose declaration passes `test`."""
    return tuple(d.name for d in declarations() if test(d))


def get(name: str) -> Any:
    """A backend's implementation: its `backend` module, which does what `Backend` in
    jobgen/backends/protocol.py says (`protocol.backend(name)` is this, typed). The registry
    does not name the spec's types, so that the spec may ask it without an import circle."""
    declaration(name)
    return importlib.import_module(f"{__name__}.{name}.backend")


def module(name: str, part: str) -> Any:
    """A part of a backend's package (its watch controller, its rehearsal): imported now."""
    declaration(name)
    return importlib.import_module(f"{__name__}.{name}.{part}")


def spec_backend(name: str) -> str:
    """The backend a spec is resolved for: submitit's nodes are Slurm's (same paths, same
    payload folder)."""
    return declaration(name).spec_backend or name


def scheduler(name: str) -> str:
    """Who answers for a job of backend `name` once submitted (submitit's jobs are Slurm's)."""
    return declaration(name).scheduler or name


def job_options(name: str) -> Any:
    """The table of per-job options a backend's jobs take (its declaration's `job_options`), as
    a module (slurm/options.py: OPTIONS, FLAGS, resolve, ...), or None."""
    table = declaration(name).job_options
    return module(table, "options") if table else None


def option_tables() -> list[Any]:
    """Every table of per-job options a backend here declares, once each (for the CLI's flags
    and the refusal of a flag that a backend does not take)."""
    tables = dict.fromkeys(d.job_options for d in declarations() if d.job_options)
    return [module(table, "options") for table in tables]


def shares_run_folder(name: str, site: Any) -> bool:
    """Whether backend `name`'s nodes share the run folder at `site`: its declaration, or where
    its site decides (Batch's shared volume, EKS's claim), its backend module."""
    if declaration(name).shared_fs_by_site:
        return bool(get(name).shares_run_folder(site))
    return declaration(name).shared_fs


def require_extra(name: str, what: str) -> None:
    """The one rule for extras: what needs a backend's SDK where its extra is not installed is
    refused in one line naming the extra (exit 2), before anything is written."""
    decl = declaration(name)
    if decl.extra and decl.sdk_modules:
        from ..plumbing.extras import require
        require(what, decl.sdk_modules, decl.extra)
