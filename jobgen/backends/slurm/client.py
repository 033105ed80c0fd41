"""Talking to a Slurm controller: submit a plan with `sbatch --parsable`, and status, logs and
cancel by job id. Everything here runs Slurm's own commands; nothing is rendered here."""
from __future__ import annotations

import posixpath
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from ...job.plan import Plan
from ...plumbing.errors import ConfigError, RemoteError

if TYPE_CHECKING:
    from ...job.spec import JobSpec
    from ...payloads import Launch



def _run(argv: Sequence[str], *, stdin: Optional[str] = None, timeout: float = 60) -> str:
    """Run a Slurm command; a missing command or a refusal becomes a one-line RemoteError."""
    if shutil.which(argv[0]) is None:
        raise RemoteError(f"{argv[0]} not found: is this a Slurm login node?")
    try:
        proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"{argv[0]} did not answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"exit {proc.returncode}"]
        last = lines[-1].strip()
        # Slurm's commands start their own messages with their name: not twice.
        raise RemoteError(last if last.startswith(f"{argv[0]}: ") else f"{argv[0]}: {last}")
    return proc.stdout


def parse_job_id(text: str) -> str:
    """`sbatch --parsable` prints `ID` or `ID;CLUSTER`."""
    match = re.match(r"^\s*(\d+)(?:;\S+)?\s*$", text)
    if not match:
        raise RemoteError(f"sbatch: unexpected answer {text.strip()[:80]!r}")
    return match.group(1)


def sbatch_argv(extra: Sequence[str] = ()) -> list[str]:
    """The sbatch command of a submission; the script goes on its stdin."""
    return ["sbatch", "--parsable", *extra]


def after(first: str) -> list[str]:
    """The second job of a chain starts only if the first succeeded, and is cancelled (not
    left pending forever) if it failed."""
    return [f"--dependency=afterok:{first}", "--kill-on-invalid-dep=yes"]


def submit(plan: Plan, extra: Sequence[str] = ()) -> str:
    """Submit the plan's script exactly as `jobgen render` prints it (on sbatch's stdin)."""
    return parse_job_id(_run(sbatch_argv(extra), stdin=plan.text))


def follows(first: str) -> list[str]:
    """A follower job (jobgen/payloads/follow.py) starts once the one before has started, not
    ended, and is told its id (JOBGEN_FOLLOW_JOB) to follow it until squeue no longer lists it;
    it is cancelled where that job is (an invalid dependency)."""
    from ...payloads.follow import SLURM_ENV
    return [f"--dependency=after:{first}", "--kill-on-invalid-dep=yes",
            f"--export=ALL,{SLURM_ENV}={first}"]


def submit_chain(*plans: Plan, last_follows: bool = False) -> tuple[str, ...]:
    """Jobs that each start once the one before succeeded (see `after`): compile and training,
    a stage before them; `last_follows`: the last one follows the one before (`follows`)."""
    ids: list[str] = []
    for k, plan in enumerate(plans):
        link = follows if last_follows and k == len(plans) - 1 else after
        ids.append(submit(plan, link(ids[-1]) if ids else ()))
    return tuple(ids)


def dry_run(plans: Sequence[Plan], last_follows: bool = False) -> str:
    """What `jobgen submit` runs for `plans` (one job, or the two of a chain), as a bash script
    that does exactly that: each sbatch command with its script on stdin, printing the job ids
    as `jobgen submit` does."""
    import hashlib
    import shlex

    lines = ["#!/bin/bash",
             "# What `jobgen submit` runs (printed by --dry-run; `| bash` submits it).",
             "set -euo pipefail"]
    ids: list[str] = []
    for i, plan in enumerate(plans, 1):
        # A here-document delimiter that the script cannot contain: its own hash.
        end = "JOBGEN_SCRIPT_" + hashlib.sha256(plan.text.encode()).hexdigest()[:16]
        link = follows if last_follows and i == len(plans) else after
        extra = link("${job_%d%%%%;*}" % (i - 1)) if ids else []
        argv = " ".join(shlex.quote(a) for a in sbatch_argv()) + "".join(
            f' "{a}"' if "$" in a else f" {shlex.quote(a)}" for a in extra)
        text = plan.text if plan.text.endswith("\n") else plan.text + "\n"
        lines += [f"job_{i}=$({argv} <<'{end}'", text + end, ")"]
        ids.append(f"${{job_{i}%%;*}}")
    lines.append(f'echo "{" ".join(ids)}"')
    return "\n".join(lines) + "\n"


# --- what can be checked from the submission host before submitting ----------------------------

@dataclass(frozen=True, slots=True)
class Needed:
    """A file (or folder) the job needs on the nodes, as the site names it."""
    path: str    # absolute, or relative to the submission directory (as on the nodes)
    what: str    # "launcher", "trainer", ...
    key: str     # the site key it comes from
    folder: bool = False


def needed_files(spec: "JobSpec", lau: "Launch") -> list[Needed]:
    """What the job's nodes open before training starts: the launcher and the trainer, and what
    the payload's trainer reads from the site's upstream checkouts."""
    payload_key = "paths.payload_dir" if spec.site.paths.payload_dir else "jobgen's payload/"
    workdir_key = payload_key if lau.workdir.startswith(spec.payload_dir) else {
        "neuron_nemo": "paths.nemo_dir"}.get(spec.recipe.payload, "the payload's workdir")
    needed = [Needed(posixpath.join(spec.payload_dir, lau.launcher), "launcher", payload_key),
              Needed(posixpath.join(lau.workdir, lau.program), "trainer", workdir_key)]
    if lau.prepare:
        needed.append(Needed(posixpath.join(spec.payload_dir, lau.prepare[0]),
                             "preparation script", payload_key))
    if spec.smoke:
        return needed
    if spec.recipe.payload == "neuron_nemo":
        config = next((a.split("=", 1)[1] for a in lau.train_args
                       if a.startswith("--config-name=")), None)
        if config:
            needed.append(Needed(posixpath.join(lau.workdir, "conf", f"{config}.yaml"),
                                 "NeMo config", "paths.nemo_dir"))
    if spec.recipe.payload == "neuronx_distributed" and spec.site.paths.nxd_llama_dir:
        example = spec.site.paths.nxd_llama_dir.rstrip("/") or "/"
        needed.append(Needed(example, "NxD Llama example", "paths.nxd_llama_dir", folder=True))
        for module in ("modeling_llama_nxd.py", "training_utils.py"):
            needed.append(Needed(posixpath.join(posixpath.dirname(example), module),
                                 "NxD example module", "paths.nxd_llama_dir"))
    return needed


def _visible(path: Path) -> bool:
    """Whether this host sees the file system the path is on: its top folder (/fsx, /shared,
    /opt, ...) exists here. Relative paths are under the submission directory: always."""
    return not path.is_absolute() or len(path.parts) < 2 or \
        Path(path.parts[0], path.parts[1]).exists()


def partition_size(partition: Optional[str]) -> tuple[str, int]:
    """(partition, its node count) from sinfo: the named partition, or the default one."""
    sizes: dict[str, int] = {}
    default = None
    for line in _run(["sinfo", "-h", "-o", "%P %D"], timeout=30).splitlines():
        fields = line.split()
        if len(fields) != 2 or not (fields[1].isascii() and fields[1].isdigit()):
            continue
        name = fields[0].rstrip("*")
        if fields[0].endswith("*"):
            default = name
        sizes[name] = sizes.get(name, 0) + int(fields[1])
    if partition is None and default is None:
        raise RemoteError("sinfo shows no default partition")
    name = partition or default or ""
    if name not in sizes:
        raise ConfigError(f"slurm.partition: sinfo shows no partition {name!r} "
                          f"(partitions: {', '.join(sorted(sizes)) or 'none'})")
    return name, sizes[name]


def preflight(spec: "JobSpec", lau: "Launch", cwd: Optional[Path] = None) -> list[str]:
    """Check from this host what would otherwise fail on the nodes or in the queue: the files
    in `needed_files` and the node count against the partition. Raises ConfigError at the
    first failed check; returns what could not be checked here (one phrase each)."""
    cwd = cwd or Path.cwd()
    site = spec.site
    unseen: dict[str, list[str]] = {}   # file system not mounted here -> what is on it
    node_only = set(site.node_only_paths or ())   # the site says only the nodes have these
    for need in needed_files(spec, lau):
        path = Path(need.path)
        if need.key in node_only:
            whats = unseen.setdefault(f"{need.key}, only on the nodes", [])
            whats.extend([] if need.what in whats else [need.what])
            continue
        if not _visible(path):
            whats = unseen.setdefault(str(Path(path.parts[0], path.parts[1])), [])
            whats.extend([] if need.what in whats else [need.what])
            continue
        found = (cwd / path).is_dir() if need.folder else (cwd / path).is_file()
        if not found:
            where = "" if path.is_absolute() else " (relative to the submission directory)"
            raise ConfigError(f"site {site.name}: {need.key}: no {need.what} at "
                              f"{need.path}{where}; pass --no-check to submit anyway")
    unchecked = [f"{', '.join(whats)} ({top})" if top.endswith("only on the nodes") else
                 f"{', '.join(whats)} (on {top}, not mounted here)"
                 for top, whats in unseen.items()]
    try:
        partition, size = partition_size(spec.options.get("partition"))
    except RemoteError as exc:
        unchecked.append(f"the node count ({exc})")
    except ConfigError as exc:
        raise ConfigError(f"site {site.name}: {exc}") from None
    else:
        spares = spec.recipe.job.spare_nodes
        if spec.nodes + spares > size:
            asked = f"{spec.nodes} nodes" + (f" and {spares} spare(s)" if spares else "")
            raise ConfigError(f"{asked}: partition {partition} has {size} (sinfo); "
                              "ask for fewer, or pass --no-check to queue it anyway")
    return unchecked
