"""The local record of the jobs jobgen submitted, so that a run can be found again by its name.

One JSON object per line in `runs.jsonl`, appended once per submission, in the state folder:
$JOBGEN_STATE_DIR, else $XDG_STATE_HOME/jobgen, else ~/.local/state/jobgen. The record says where
a job went (backend, job ids, site, endpoint) and what it is (recipe, nodes, run name, run
folder); what state it is in is always asked of the scheduler, never stored.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..plumbing.errors import ConfigError

RECORD = "runs.jsonl"
# In RUN_DIR/logs/JOB/: Ctrl-C stopped that job (`jobgen run`), with the step it reached: a
# cancel, which `status`, `report` and `watch` tell apart from a node's failure.
CANCELLED = "cancelled.json"


@dataclass(frozen=True, slots=True)
class Run:
    name: str                  # the run name (the run folder's name; reruns of it resume)
    backend: str               # a backend's name (jobgen.backends.names())
    job_id: str                # the job that trains (the second one of a --chain)
    recipe: str
    nodes: int
    site: str                  # the --site given (a name, or an absolute path), "" for default
    run_dir: str               # absolute where it is on this host's file systems
    submitted: str             # UTC, ISO 8601
    jobs: tuple[str, ...] = ()  # every job id of the submission (compile, train for --chain)
    smoke: bool = False
    endpoint_url: Optional[str] = None   # Batch: the --endpoint-url given, if any
    queue: Optional[str] = None          # Batch: the job queue
    max_steps: Optional[int] = None      # the training pass's last step (jobgen watch: eta)
    seq_length: Optional[int] = None     # tokens per sample (jobgen watch: tokens/s)
    # The stage of each of `jobs` (prepare, train: jobgen/payloads/stages.py); () in records
    # written before stages, whose jobs all train.
    stages: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["jobs"] = list(self.jobs)
        data["stages"] = list(self.stages)
        return data

    def staged(self) -> list[tuple[str, str]]:
        """(stage, job id) of every job of the submission, in order."""
        jobs = self.jobs or (self.job_id,)
        return list(zip(self.stages if self.stages else ("train",) * len(jobs), jobs))


def state_dir() -> Path:
    if os.environ.get("JOBGEN_STATE_DIR"):
        return Path(os.environ["JOBGEN_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"),
                                                           ".local", "state")
    return Path(base, "jobgen")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def record(run: Run) -> Optional[str]:
    """Append `run` to the record (one write of one line, so concurrent submissions do not
    interleave). Returns a warning instead of raising: the job is already submitted."""
    from ..plumbing import fsio
    folder = state_dir()
    line = json.dumps(run.as_dict(), sort_keys=True) + "\n"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fsio.append(folder / RECORD, line, 0o600)
    except OSError as exc:
        return (f"job {run.job_id} submitted, but not recorded in {folder / RECORD}: "
                f"{exc.strerror}; `jobgen runs` will not list it")
    except ConfigError as exc:   # a FIFO, a device or a symlink where the record goes
        return (f"job {run.job_id} submitted, but not recorded: {exc}; `jobgen runs` will "
                "not list it")
    return None


def _run(data: dict[str, Any]) -> Run:
    """One line of the record checked against Run's fields and types (ValueError if not)."""
    fields = {f.name for f in dataclasses.fields(Run)}
    data = {k: v for k, v in data.items() if k in fields}
    jobs = data.get("jobs") or ()
    if not isinstance(jobs, (list, tuple)) or not all(isinstance(j, str) for j in jobs):
        raise ValueError("jobs")
    data["jobs"] = tuple(jobs)
    stages = data.get("stages") or ()
    if not isinstance(stages, (list, tuple)) or not all(isinstance(s, str) for s in stages) \
            or (stages and len(stages) != len(jobs)):
        raise ValueError("stages")
    data["stages"] = tuple(stages)
    for key in ("name", "backend", "job_id", "recipe", "site", "run_dir", "submitted"):
        if not isinstance(data.get(key), str):
            raise ValueError(key)
    for key in ("endpoint_url", "queue"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ValueError(key)
    for key in ("nodes", "max_steps", "seq_length"):
        value = data.get(key)
        if (value is not None or key == "nodes") and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(key)
    if not isinstance(data.get("smoke", False), bool):
        raise ValueError("smoke")
    return Run(**data)


def load() -> list[Run]:
    """Every recorded submission, oldest first (lines that are not a record are skipped)."""
    return load_counted()[0]


def load_counted() -> tuple[list[Run], int]:
    """Every recorded submission, oldest first, and how many lines were not a record."""
    from ..plumbing import fsio
    path = state_dir() / RECORD
    try:
        return fsio.read_records(path, _run)
    except fsio.NotRegularFile as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def local_job_id() -> str:
    """The job id of a `jobgen run`: its start time and this process's id, so that two
    rehearsals started in the same second on one machine do not share one (or one log folder)."""
    return f"local-{int(time.time())}-{os.getpid()}"


def _roots() -> list[str]:
    """The folders whose runs a name means first: the current folder, and the default site's
    work_dir (taken from here where it is relative)."""
    from ..inputs import site as sites
    from ..plumbing.errors import JobgenError
    roots = [os.path.abspath(os.getcwd())]
    try:
        roots.append(os.path.abspath(sites.load(None).paths.work_dir))
    except (JobgenError, OSError):
        pass
    return roots


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def find(ref: str, say: Optional[Callable[[str], None]] = None) -> Optional[Run]:
    """The submission named `ref` (its newest), or the one with job id `ref`; None if neither.
    A name (or a job id) means the run in this folder (or the default site's work_dir) first;
    where the runs it names are in several other folders, it is refused, naming them. A run
    found only in another folder is said to `say`, in one line, before it is used."""
    runs = load()
    named = [run for run in runs if run.name == ref]
    what = "runs of that name"
    if not named:   # a job id: two `jobgen run`s in two folders can share one
        named = [run for run in runs if ref == run.job_id or ref in run.jobs]
        what = "runs with that job id"
    if not named:
        return None
    from ..plumbing.errors import printable
    folders = list(dict.fromkeys(run.run_dir for run in reversed(named)))
    roots = _roots()
    here = [folder for folder in folders if _under(folder, roots)]
    if len(here) == 1 or len(folders) == 1:
        chosen = here[0] if here else folders[0]
        if not here and say is not None:
            say(f"note: {printable(ref)}: the run in {printable(chosen)}, the only one "
                f"recorded, is not under this folder ({printable(roots[0])})")
        return [run for run in named if run.run_dir == chosen][-1]
    shown = ", ".join(printable(f) for f in (here or folders)[:5])
    more = f" and {len(here or folders) - 5} more" if len(here or folders) > 5 else ""
    raise ConfigError(f"{printable(ref)}: {what} are in {len(here or folders)} folders "
                      f"({shown}{more}); run the command from the folder of the one you mean"
                      + (", or name it by its job id" if what.endswith("name") else "")
                      + " (`jobgen runs` lists them)")
