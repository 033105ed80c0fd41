"""What a run was submitted with, kept with the run: a run is what it trains.

`jobgen-run.json` in the run folder (where this machine reaches it: Slurm, submitit, jobgen run)
and a copy in jobgen's state folder (every backend) hold each submission of the run: the resolved
spec, the training values, the recipe and site files as they were read, the overrides, the
jobgen version and the payload digest. The first submission is never rewritten. A submission
whose training values or payload differ from the run's newest is refused unless it says --amend;
`jobgen resubmit RUN` submits the newest again from the recorded files and payload.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ..inputs import schema
from ..inputs.recipe import Recipe
from ..job.spec import JobSpec
from ..plumbing.errors import ConfigError

FILE = "jobgen-run.json"
HEALTH_FILE = "jobgen-health.jsonl"   # the health gate's findings, beside it
FORMAT = 1
# Recipe sections that do not change what is trained: where and how the job runs, how often it
# saves and how it compiles. Everything else of the recipe is a training value.
NOT_TRAINING = ("name", "description", "nodes", "job", "compile", "checkpoint", "eval")
SUFFIX_LENGTH = 6


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for key in sorted(data):
            out.update(_flat(data[key], f"{prefix}{key}."))
        if not data and prefix:
            out[prefix[:-1]] = {}
        return out
    return {prefix[:-1]: list(data) if isinstance(data, tuple) else data}


def recipe_training(recipe: Recipe) -> dict[str, Any]:
    """The recipe's training values, by dotted key."""
    plain = schema.to_plain(recipe)
    return _flat({k: v for k, v in plain.items() if k not in NOT_TRAINING})


def training(spec: JobSpec) -> dict[str, Any]:
    """What the run trains: the recipe's training values, the node count (the learning rate
    and batch that follow from it), the site's data folder, the rehearsal, and the payload's
    digest."""
    values = recipe_training(spec.recipe)
    values.update({"nodes": spec.nodes, "smoke": spec.smoke,
                   "site.data_dir": spec.site.paths.data_dir, "payload": spec.payload_digest})
    return values


def suffix(recipe: Recipe) -> str:
    """The short digest that tells a run of changed training values from the recipe's own."""
    blob = json.dumps(recipe_training(recipe), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:SUFFIX_LENGTH]


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """'key: old -> new' for every training value that differs."""
    out = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            def shown(v: Any) -> str:
                text = "(unset)" if v is None else json.dumps(v, default=str)
                return text if len(text) <= 40 else text[:37] + "..."
            out.append(f"{key}: {shown(old.get(key))} -> {shown(new.get(key))}")
    return out


# --- where records live -------------------------------------------------------------------

def state_path(spec_backend: str, site: str, run: str) -> Path:
    from .ledger import state_dir
    return state_dir() / "records" / site / spec_backend / f"{run}.json"


def _run_dir_file(spec: JobSpec, here: bool) -> Optional[Path]:
    return Path(spec.run_dir, FILE) if here else None


def read(spec: JobSpec, here: bool) -> Optional[dict[str, Any]]:
    """The run's record: the run folder's where this machine reaches it (a run of the same name
    in another folder, whose state copy this may be, is another run), else the state copy."""
    paths = [_run_dir_file(spec, here)] if here else [state_path(spec.backend, spec.site.name,
                                                                 spec.run_name)]
    for path in paths:
        if path is None:
            continue
        data = read_file(path)
        if data is not None:
            return data
    return None


# What a submission must hold, and of which type, for `resubmit` and `admit` to use it.
SUBMISSION_KEYS: dict[str, Any] = {
    "backend": str, "recipe": str, "recipe_text": str, "site": str, "site_shown": str,
    "site_text": str, "overrides": list, "nodes": int, "compile_mode": str, "smoke": bool,
    "slurm": dict, "training": dict, "payload_digest": str, "jobgen": str, "job_ids": list,
    "cwd": str, "spec": dict}


def _malformed(data: Any) -> Optional[str]:
    """What is wrong with a run record's shape, or None (the one check of its schema)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a jobgen run record (format {FORMAT})"
    if not isinstance(data.get("run"), str) or not data["run"]:
        return "its run name is missing"
    subs = data.get("submissions")
    if not isinstance(subs, list) or not subs:
        return "it has no submissions"
    for index, sub in enumerate(subs):
        if not isinstance(sub, dict):
            return f"submission {index + 1} is not a mapping"
        for key, kind in SUBMISSION_KEYS.items():
            value = sub.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return f"submission {index + 1}: {key} is missing or not a {kind.__name__}"
        if not all(isinstance(item, str) for item in sub["overrides"]):
            return f"submission {index + 1}: overrides holds a value that is not text"
        staged = sub.get("job_stages", sub["job_ids"])   # optional: each job's stage
        if not isinstance(staged, list) or len(staged) != len(sub["job_ids"]) or \
                not all(isinstance(item, str) for item in staged):
            return f"submission {index + 1}: job_stages is not one stage name per job id"
    return None


def read_file(path: Path) -> Optional[dict[str, Any]]:
    from ..plumbing import fsio
    try:
        data = fsio.loads(fsio.read_bytes(path, fsio.MAX_BYTES))
    except FileNotFoundError:
        return None
    except fsio.NotRegularFile as exc:
        raise ConfigError(f"{exc}; move it aside to start the run afresh") from None
    except (OSError, ValueError, fsio.TooLarge) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(f"{path}: cannot read the run's record: {why}; move it aside to "
                          "start the run afresh") from None
    problem = _malformed(data)
    if problem:
        raise ConfigError(f"{path}: {problem}; move it aside")
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` atomically (a temporary file renamed over it; a regular file only)."""
    from ..plumbing import fsio
    path.parent.mkdir(parents=True, exist_ok=True)
    fsio.write_file(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n",
                    mode=0o600)


# --- submissions --------------------------------------------------------------------------

def submission(spec: JobSpec, *, backend: str, overrides: Sequence[str], site_ref: str,
               recipe_file: Path, site_file: Path, amend: bool = False,
               resubmit: bool = False) -> dict[str, Any]:
    """One submission as it is recorded (its job ids are added once it is submitted)."""
    from .. import __version__
    return {
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cwd": os.getcwd(),          # relative site paths are taken from here
        "jobgen": __version__,
        "backend": backend,
        "payload_digest": spec.payload_digest,
        "recipe": spec.source,
        "recipe_text": recipe_file.read_text(encoding="utf-8"),
        "site": site_ref,
        "site_shown": spec.site.name,
        "site_text": site_file.read_text(encoding="utf-8"),
        "overrides": list(overrides),
        "nodes": spec.nodes,
        "compile_mode": spec.compile_mode,
        "smoke": spec.smoke,
        # The scheduler's options by flag (kept as "slurm": the records' own key since FORMAT 1).
        "slurm": _recorded_options(spec),
        "amend": amend,
        "resubmit": resubmit,
        "training": training(spec),
        "spec": spec.as_dict(),
        "job_ids": [],
    }


def _recorded_options(spec: JobSpec) -> dict[str, Any]:
    """What a resubmission hands back as the per-job options: the backend's table's."""
    from .. import backends
    table = backends.job_options(spec.backend)
    return table.recorded(spec.options) if table else {"sbatch_opt": []}


def admit(spec: JobSpec, new: dict[str, Any], here: bool, amend: bool) -> Optional[dict]:
    """Refuse a submission into an existing run whose training values (or payload) differ,
    unless `amend`. Returns the run's record, None for a new run."""
    old = read(spec, here)
    if old is None:
        return None
    changed = differences(old["submissions"][-1]["training"], new["training"])
    if changed and not amend:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise ConfigError(f"run {spec.run_name} was submitted with other training values: "
                          f"{'; '.join(changed[:3])}{more}; give a new --run-name, or pass "
                          "--amend to change this run deliberately")
    return old


def commit(spec: JobSpec, new: dict[str, Any], old: Optional[dict], job_ids: Sequence[str],
           here: bool, stages: Sequence[str] = ()) -> Optional[str]:
    """Add the submission to the run's record (the run folder's and the state copy), with
    each job's stage where they are given (`job_stages`; older records have none: all train);
    a warning instead of an error: the job is already submitted."""
    new = dict(new, job_ids=list(job_ids))
    if stages:
        new["job_stages"] = list(stages)
    data: dict[str, Any] = dict(old) if old else {"format": FORMAT, "run": spec.run_name,
                                                   "submissions": []}
    data["submissions"] = list(data["submissions"]) + [new]
    problems = []
    for path in (_run_dir_file(spec, here),
                 state_path(spec.backend, spec.site.name, spec.run_name)):
        if path is None:
            continue
        try:
            _write(path, data)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
        except ConfigError as exc:     # a device or symlink where the record goes
            problems.append(str(exc))
    if problems:
        return f"the run's record was not written: {'; '.join(problems)}"
    return None


def note(spec: JobSpec, job_id: str, key: str, value: Any) -> Optional[str]:
    """Set `key` of the submission of `job_id` (a local stage's outcome, once it ended), in the
    run folder's record and the state copy; a warning instead of an error."""
    problems = []
    for path in (_run_dir_file(spec, True),
                 state_path(spec.backend, spec.site.name, spec.run_name)):
        if path is None:
            continue
        try:
            data = read_file(path)
            if data is None:
                continue
            for sub in data["submissions"]:
                if job_id in sub["job_ids"]:
                    sub[key] = value
            _write(path, data)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        return f"the run's record was not updated: {'; '.join(problems)}"
    return None


def health_events(run: str) -> list[dict[str, Any]]:
    """What the health gate found in this run (payload/common/health.py appends a line per failed
    check to jobgen-health.jsonl in the run folder), where this machine reaches the folder."""
    from ..plumbing import fsio
    from .ledger import find as find_run
    found = find_run(run)
    if found is None:
        return []
    try:    # a line cut short by a node that died while writing it is skipped
        events, _ = fsio.read_records(Path(found.run_dir, HEALTH_FILE), lambda item: item)
    except (OSError, ConfigError):
        return []
    return events


def find(run: str) -> Optional[tuple[Path, dict[str, Any]]]:
    """The record of a run by name (the newest submission's run folder first, then every state
    copy of that name)."""
    from .ledger import find as find_run
    from .ledger import state_dir
    found = find_run(run)
    candidates: list[Path] = []
    if found is not None:
        candidates.append(Path(found.run_dir, FILE))
    candidates += sorted((state_dir() / "records").glob(f"*/*/{run}.json"),
                         key=lambda p: p.stat().st_mtime, reverse=True)
    for path in candidates:
        try:
            data = read_file(path)
        except ConfigError:
            continue
        if data is not None and data.get("run") == run:
            return path, data
    return None


def recorded_spec(data: dict[str, Any], folder: Path) -> tuple[JobSpec, Path, Path, dict]:
    """The run's newest submission resolved again from its recorded recipe and site files,
    overrides and payload (files written into `folder`); refused where this jobgen resolves it
    to other training values. Returns (spec, recipe file, site file, that submission)."""
    from .. import payloads
    from ..backends import spec_backend
    from ..inputs import recipe as recipes
    from ..inputs import site as sites
    from ..plumbing import fsio
    last = data["submissions"][-1]
    recipe_file, site_file = folder / "recipe.yaml", folder / "site.yaml"
    fsio.write_file(recipe_file, last["recipe_text"])
    fsio.write_file(site_file, last["site_text"])
    backend = spec_backend(last["backend"])
    rec, source = recipes.load_file(recipe_file, last["recipe"], list(last["overrides"]),
                                    backend)
    site_shown = last["site"] if "/" in last["site"] else f"env/sites/{last['site_shown']}.yaml"
    spec = payloads.resolved(rec, source, sites.load_file(site_file, site_shown), last["nodes"],
                   backend=backend, compile_mode=last["compile_mode"],  # type: ignore[arg-type]
                   smoke=last["smoke"], run_name=data["run"], options=last["slurm"],
                   payload_digest=last["payload_digest"])
    changed = differences(last["training"], training(spec))
    if changed:
        raise ConfigError(f"run {data['run']}: this jobgen resolves its recorded submission to "
                          f"other training values ({'; '.join(changed[:3])}); resubmit it with "
                          f"jobgen {last['jobgen']}, or submit it anew with --amend")
    return spec, recipe_file, site_file, last
