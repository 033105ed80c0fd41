"""Checkpoint directory bookkeeping shared by every payload.

Layout under ``<output>/checkpoints``::

    step_00000006/            one directory per saved step (engine files inside)
    step_00000006/COMPLETE.node-00001  each node's seal: the files its disk holds, with sizes
    step_00000006/COMPLETE    marker: JSON {"step", "consumed_samples", "nodes", ...}; written last
    latest                    text: the tag of the newest complete checkpoint; written after it

A directory counts only once its marker exists and, where the marker names the job's node count,
every node's seal is there and every file a seal lists is there at its size. Nodes that share no
file system (SageMaker's instances: each syncs its own folder to one S3 prefix, and a retry
restores the whole prefix on every instance) each seal their own part, so a restore that lacks
one instance's shards of a step never offers that step.

On such disks every key of the S3 prefix has one owner, the node that wrote it: its files of each
step, its seal, and on node 0 the marker and ``latest``. SageMaker mirrors the container's writes
and deletes to S3 ("if a checkpoint is deleted in the container, it will also be deleted in the
S3 folder"), so a node deletes only its own keys: when it saves a step again, or prunes, it
removes its own seal and the files its seals name, never the restored copies of other nodes'
files (their owners delete those keys; the copies stay on this disk, unsynced, until the instance
ends). What a node's seal lists is what its own save wrote (files new or changed since the step
folder was prepared), never a restored copy. With each node pruning its own keys to ``keep``
steps, the prefix a retry restores (on every instance: all nodes' files) holds at most the ``keep``
newest steps, plus the part of a save an attempt died in.

Both the marker and ``latest`` are written to a temporary name and renamed into place, so a crash
mid-save leaves either the old state or the new one, never a half-written marker that a resumed
run would trust. The marker, not ``latest``, is the authority: ``latest`` is kept for DeepSpeed's
own tools (zero_to_fp32.py reads it) and for humans.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = "COMPLETE"
LATEST = "latest"
SEAL = MARKER + ".node-"   # + the node index, 5 digits
_TAG_RE = re.compile(r"^step_(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint as recorded by its marker."""

    path: Path
    step: int
    info: dict[str, Any]

    @property
    def tag(self) -> str:
        return self.path.name


def tag_for(step: int) -> str:
    """Directory name for a step; zero-padded so a plain listing sorts by step."""
    return f"step_{step:08d}"


def step_of(name: str) -> int | None:
    match = _TAG_RE.match(name)
    return int(match.group(1)) if match else None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the whole new one, nothing between."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _read_marker(directory: Path, name: str = MARKER) -> dict[str, Any] | None:
    try:
        info = json.loads((directory / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def seal_name(node: int) -> str:
    return f"{SEAL}{node:05d}"


def _holds(directory: Path, listed: Any) -> bool:
    """Whether every file a seal lists is in ``directory`` at its recorded size."""
    if not isinstance(listed, dict):
        return False
    for name, size in listed.items():
        try:
            if (directory / name).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def node_sealed(directory: Path, step: int, node: int) -> bool:
    """Whether ``node``'s part of the step is all in ``directory`` (its seal and its files)."""
    seal = _read_marker(directory, seal_name(node))
    return seal is not None and seal.get("step") == step and _holds(directory, seal.get("files"))


def _complete(directory: Path, step: int, info: dict[str, Any] | None) -> bool:
    if info is None or info.get("step") != step:
        return False
    nodes = info.get("nodes")   # absent: written before seals per node (one shared folder)
    return not isinstance(nodes, int) or all(node_sealed(directory, step, node)
                                             for node in range(nodes))


def seal_node(root: Path, step: int, node: int) -> dict[str, int]:
    """Record this node's part of ``step``: every file under the step directory on this node's
    disk (on a shared file system, everyone's, which is as true), once all of its ranks wrote;
    on its own disk, only the files new or changed since ``prepare_save_dir`` (its own keys).
    Seals and a writer's temporaries (``*.tmp*``) are not part of a checkpoint; hidden files are
    (torch.distributed.checkpoint's ``.metadata``)."""
    directory = root / tag_for(step)
    before = _BEFORE.pop(directory, {})   # own disk: what the save found there is not its own
    files = {name: path.stat().st_size for name, path in _parts(directory).items()
             if before.get(name) != _stamp(path)}
    write_atomic(directory / seal_name(node),
                 json.dumps({"step": step, "node": node, "files": files}, sort_keys=True) + "\n")
    return files


def list_checkpoints(root: Path, node: int | None = None) -> tuple[list[Checkpoint], list[Path]]:
    """Complete checkpoints (oldest first) and the step directories that lack a valid marker.
    With ``node``: the steps whose part on this node is sealed (what a node that shares no file
    system with the main node has of a checkpoint)."""
    complete: list[Checkpoint] = []
    incomplete: list[Path] = []
    if not root.is_dir():
        return complete, incomplete
    for entry in sorted(root.iterdir()):
        step = step_of(entry.name)
        if step is None or not entry.is_dir():
            continue
        if node is not None:
            ok = node_sealed(entry, step, node)
            info = {"step": step}
        else:
            info = _read_marker(entry)
            ok = _complete(entry, step, info)
        if ok and info is not None:
            complete.append(Checkpoint(entry, step, info))
        else:
            incomplete.append(entry)
    complete.sort(key=lambda ckpt: ckpt.step)
    return complete, incomplete


def newest_complete(root: Path) -> Checkpoint | None:
    complete, _ = list_checkpoints(root)
    return complete[-1] if complete else None


# Own disks: the files a step folder held when this node prepared its save (restored copies,
# mostly other nodes'), by folder: name -> (size, mtime, inode). ``seal_node`` leaves them out.
_BEFORE: dict[Path, dict[str, tuple[int, int, int]]] = {}


def _parts(directory: Path) -> dict[str, Path]:
    """A step folder's checkpoint files: not seals, the marker or a writer's temporaries."""
    return {str(path.relative_to(directory)): path for path in sorted(directory.rglob("*"))
            if path.is_file() and not path.name.lstrip(".").startswith(MARKER)
            and ".tmp" not in path.name}


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _drop_own(directory: Path, node: int, names: set[str]) -> None:
    """Delete this node's keys in a step folder on its own disk: on node 0 the marker first (the
    step stops counting before anything goes), then its files (those its seal there lists, and
    ``names``), its seal last (a crash between leaves a seal whose files are missing: no part,
    and the next prune finds the rest by it); then folders left empty (not keys)."""
    if node == 0:
        (directory / MARKER).unlink(missing_ok=True)
    seal = _read_marker(directory, seal_name(node)) or {}
    listed = seal.get("files")
    for name in set(listed if isinstance(listed, dict) else ()) | names:
        (directory / name).unlink(missing_ok=True)
    (directory / seal_name(node)).unlink(missing_ok=True)
    for sub in sorted((p for p in directory.rglob("*") if p.is_dir()), reverse=True):
        _rmdir_if_empty(sub)
    _rmdir_if_empty(directory)


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def prepare_save_dir(root: Path, step: int, node: int | None = None) -> Path:
    """Make an empty directory for ``step``; debris of an earlier crashed save there is removed.

    Call on one rank only (with ``node``: each node's leader, on its own disk), then barrier:
    every rank then writes its shard into it. With ``node``, only this node's keys go (see the
    module's note): other nodes' restored files stay, and ``seal_node`` will not list them.
    """
    root.mkdir(parents=True, exist_ok=True)
    target = root / tag_for(step)
    if node is not None:
        if target.exists():
            _drop_own(target, node, set())
        target.mkdir(exist_ok=True)
        _BEFORE[target] = {name: _stamp(path) for name, path in _parts(target).items()}
        return target
    if target.exists():
        # Drop the marker first: a crash inside rmtree must not leave a sealed, gutted directory.
        (target / MARKER).unlink(missing_ok=True)
        shutil.rmtree(target)
    target.mkdir()
    return target


def mark_complete(root: Path, step: int, info: dict[str, Any]) -> Checkpoint:
    """Seal a checkpoint once every rank's files are on disk: the marker, then ``latest``."""
    directory = root / tag_for(step)
    record = dict(info, step=step)
    write_atomic(directory / MARKER, json.dumps(record, sort_keys=True) + "\n")
    write_atomic(root / LATEST, directory.name)
    return Checkpoint(directory, step, record)


def prune(root: Path, keep: int, node: int | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints, and incomplete debris older
    than the newest complete one (an incomplete directory newer than that may be a save still in
    progress elsewhere, so it is left alone). Returns the removed paths. With ``node``: on a
    node's own disk, judged by that node's seals (see ``list_checkpoints``), and only this node's
    keys go (see the module's note). In its debris, those are the files its seal there names, or
    else the names its newest seal lists (a node's files are named alike at every step) that no
    other node's seal there claims: nobody writes a step older than the newest one sealed."""
    if keep < 1:
        raise ValueError(f"keep must be at least 1, got {keep}")
    complete, incomplete = list_checkpoints(root, node)
    doomed = [ckpt.path for ckpt in complete[:-keep]]
    debris: list[Path] = []
    if complete:
        newest = complete[-1].step
        debris = [path for path in incomplete if (step_of(path.name) or 0) < newest]
    if node is None:
        for path in doomed + debris:
            shutil.rmtree(path, ignore_errors=True)
        return doomed + debris
    seal = _read_marker(complete[-1].path, seal_name(node)) if complete else None
    usual = set(seal.get("files") or ()) if seal else set()
    for path in doomed:
        _drop_own(path, node, set())
    for path in debris:
        theirs: set[str] = set()
        for other in path.glob(SEAL + "*"):
            if other.name != seal_name(node):
                listed = (_read_marker(path, other.name) or {}).get("files")
                theirs |= set(listed) if isinstance(listed, dict) else set()
        _drop_own(path, node, {name for name in usual - theirs if (path / name).is_file()})
    return doomed + debris
