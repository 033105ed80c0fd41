"""The site-path preflight: before anything is queued or written, look on the submitting host for
the paths of the site that a job's nodes open (the virtualenv's activate script, the trainer
checkout, the data folder) and for the folders jobgen makes there (runs, payload snapshots,
compile cache), and name, one line each, every one that is not there.

On Slurm the login node mounts the nodes' shared file systems, so a path missing here is missing
there too; container backends read the site's paths on their instances: nothing is looked for.
Paths only the nodes have (the site's `node_only_paths`, `paths.local_compile_cache`) are skipped.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Literal, Optional

from ..plumbing.errors import ConfigError

if TYPE_CHECKING:
    from ..inputs.recipe import Recipe
    from ..inputs.site import Site
    from .spec import JobSpec

Kind = Literal["file", "folder", "made"]


@dataclass(frozen=True, slots=True)
class SitePath:
    key: str          # the site key, as a user writes it (setup.activate, paths.data_dir)
    path: str         # absolute, or relative to the submission directory
    what: str         # what it is, for the message
    kind: Kind        # file, folder, or made: jobgen or the nodes make it


class MissingPaths(ConfigError):
    """Site paths not found on this host: one line each (the CLI prints every line)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def host_paths(site: Site, recipes: Iterable[Recipe], smoke: bool = False) -> list[SitePath]:
    """The site paths that jobs of `recipes` at `site` read or make, in the site's order, less
    those the site says only its nodes have. A --smoke rehearsal runs jobgen's own trainer on
    made-up data: it needs neither a trainer checkout nor the data."""
    p = site.paths
    used = {r.payload for r in recipes} if not smoke else set()
    relative_data = not smoke and any(not r.data.path.startswith("/") for r in recipes)
    found = [
        SitePath("setup.activate", site.setup.activate or "", "the virtualenv's activate "
                 "script", "file"),
        SitePath("paths.nemo_dir", (p.nemo_dir or "") if "neuron_nemo" in used else "",
                 "the neuronx-nemo-megatron checkout", "folder"),
        SitePath("paths.nxd_llama_dir", (p.nxd_llama_dir or "")
                 if "neuronx_distributed" in used else "", "the neuronx-distributed example",
                 "folder"),
        SitePath("paths.data_dir", p.data_dir if relative_data else "", "the data folder",
                 "folder"),
        SitePath("paths.work_dir", p.work_dir, "the run folders", "made"),
        SitePath("paths.payload_dir", p.payload_dir or "", "the payload snapshots", "made"),
        SitePath("paths.compile_cache", p.compile_cache, "the shared compile cache", "made"),
    ]
    skipped = set(site.node_only_paths or ())
    return [s for s in found if s.path and s.key not in skipped]


def _problem(need: SitePath, cwd: Path) -> Optional[str]:
    """Why `need` is not usable from this host (a phrase after its path), or None."""
    from ..inputs.rules import path_problem
    path = cwd / need.path
    said = path_problem(need.path)
    if said is not None:
        return f"cannot be used: it {said}"
    said = path_problem(str(path))   # under the submission directory, it may grow too long
    if said is not None:
        return f"cannot be used: there it {said}"
    try:
        return _looked_at(need, path)
    except OSError as exc:   # what the file system says of it (a loop, a name too long)
        return f"cannot be looked at: {exc.strerror}"


def _link(path: Path) -> Optional[str]:
    """What is wrong with `path` where it is a symbolic link that leads nowhere, or None."""
    if not path.is_symlink():
        return None
    try:
        path.resolve(strict=True)
    except RuntimeError:   # Python before 3.13 says a loop so
        return f"{path} is a symbolic link in a loop"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path} is a symbolic link in a loop"
        if exc.errno == errno.ENOENT:
            return f"{path} is a symbolic link to {os.readlink(path)}, which does not exist"
        return f"{path} is a symbolic link that cannot be followed ({exc.strerror})"
    return None


def _looked_at(need: SitePath, path: Path) -> Optional[str]:
    top = Path(*path.parts[:2]) if need.path.startswith("/") and len(path.parts) > 1 else None
    unmounted = top is not None and not top.exists()
    # The nearest of the path and its folders that is there (a symbolic link that leads
    # nowhere is there, and stops the search: nothing can be made through it).
    here = path
    while not os.path.lexists(here) and here != here.parent:
        here = here.parent
    broken = _link(here)
    if need.kind == "file" and not path.is_file() or need.kind == "folder" and not path.is_dir():
        why = broken or (f"{top} does not exist here" if unmounted else None)
        return f"is not on this host{f' ({why})' if why else ''}"
    if need.kind != "made":
        return None
    # Made by jobgen or by the nodes: under a file system mounted here (not a new top folder),
    # and the nearest folder that exists is one this user may write in.
    if unmounted:
        return f"cannot be made: {top} does not exist here"
    if broken is not None:
        return f"cannot be made: {broken}"
    if not here.is_dir():
        return f"cannot be made: {here} is not a folder"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"cannot be made: {here} is not writable by this user"
    return None


def _brief(path: str) -> str:
    """A path as a message shows it: whole, or its start and its end where it is long."""
    return path if len(path) <= 160 else f"{path[:80]}...{path[-60:]} ({len(path)} characters)"


def missing(shown: str, needs: list[SitePath], cwd: Optional[Path] = None) -> list[str]:
    """One line per path of `needs` that is not there: FILE: KEY: what it is, PATH, why."""
    cwd = cwd or Path.cwd()
    lines = []
    for need in needs:
        why = _problem(need, cwd)
        if why is not None:
            where = "" if need.path.startswith("/") else " (under the submission directory)"
            lines.append(f"{shown}: {need.key}: {need.what}, {_brief(need.path)}{where}, {why}")
    return lines


def refuse(lines: list[str], *, submitting: bool) -> None:
    """Raise the preflight's error when lines were found, with what to do as its last line."""
    if not lines:
        return
    instead = "; --no-check submits without this check" if submitting else ""
    raise MissingPaths([*lines, f"{len(lines)} site path{'s' * (len(lines) != 1)} not on this "
                        "host: create them or correct the site; a path only the nodes have "
                        "goes in node_only_paths" + instead])


def preflight(spec: JobSpec, shown: str, cwd: Optional[Path] = None) -> None:
    """At submit, before the payload snapshot is placed or anything is queued: raises
    MissingPaths naming every site path of the job that is not on this host. `shown`: the
    site file as messages name it."""
    refuse(missing(shown, host_paths(spec.site, [spec.recipe], spec.smoke), cwd),
           submitting=True)
