"""Hostile input, second pass (issue 33): what operators' commands read from and write to disk,
and the numbers and names they take. In process, generated per family:

- writing over what is not a regular file (a FIFO, device nodes, a folder, symlinks): refused,
  the thing left as it was, nothing else written;
- reading what is not a regular file where a log, record or config should be: no hang, one
  error or nothing read, bounded memory;
- numbers outside their declared domain (`plan`'s options and the site's plan: section), and
  `--json` strict in every case;
- values from disk outside their domain (event times, TensorBoard wall times, run records,
  `runs.jsonl` lines), control characters escaped when printed;
- leaving the run folder (rollback), work before the limit (sweeps), overlong integers;
- names a service validates (Kubernetes, Slurm, AWS regions, from the environment too);
- judging what is not a run (`watch --run-dir`).

Device nodes are made with os.mknod in the test's own temporary folder (the numbers of
/dev/zero, /dev/urandom, /dev/full and /dev/null): never a real /dev path.
"""
from __future__ import annotations

import json
import math
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any, Callable

import pytest

from jobgen import cache, fsio, runrecord, runs, sweep, yaml12
from jobgen.errors import ConfigError, JobgenError, RenderError
from jobgen.plan import Plan, PlannedFile
from jobgen.watching import actions, command, readers, tfrecord
from jobgen.watching.observations import TIME_MAX, plausible_time

pytestmark = pytest.mark.timeout(30)   # a read that blocks fails the case, never the run

DEVICES = {"zero": (1, 5), "urandom": (1, 9), "full": (1, 7), "null": (1, 3)}
SPECIAL = ["fifo", *DEVICES, "folder", "socket"]            # not a regular file at all
LINKS = ["symlink-out", "symlink-dangling", "symlink-in"]   # a symlink, wherever it points
VICTIM = b"outside the folder: must not change\n"


def make(kind: str, path: Path, outside: Path) -> None:
    """A thing of `kind` at `path` (`outside`: a folder beside the one under test)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind in DEVICES:
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(*DEVICES[kind]))
        except PermissionError:
            pytest.skip("device nodes cannot be made here (no CAP_MKNOD)")
    elif kind == "folder":
        path.mkdir()
    elif kind == "socket":
        if len(str(path)) > 100:
            pytest.skip("the temporary path is too long for a socket")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    else:
        outside.mkdir(exist_ok=True)
        (outside / "victim").write_bytes(VICTIM)
        target = {"symlink-out": outside / "victim", "symlink-dangling": outside / "missing",
                  "symlink-in": path.parent / "sibling"}[kind]
        if kind == "symlink-in":
            target.write_bytes(b"sibling\n")
        os.symlink(target, path)


def fingerprint(path: Path) -> tuple[int, Any]:
    """What a path is (its lstat mode), and where a symlink points."""
    st = os.lstat(path)
    return st.st_mode, os.readlink(path) if stat.S_ISLNK(st.st_mode) else None


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# --- writing over what is not a regular file -------------------------------------------------

def _fsio(folder: Path, name: str) -> None:
    fsio.write_file(folder / name, b"new\n")


def _plan(folder: Path, name: str) -> None:
    files = (PlannedFile("first.txt", "1\n"), PlannedFile(name, "2\n"))
    Plan("local", files, name, ()).write(folder)


def _record(folder: Path, name: str) -> None:
    runrecord._write(folder / name, {"format": 1})


def _appended(folder: Path, name: str) -> None:
    fsio.append(folder / name, "{}\n")


def _rollback_latest(folder: Path, name: str) -> None:
    actions.roll_back(folder.parent.parent, 4, "jobgen")   # folder: RUN/train/checkpoints


WRITERS: dict[str, Callable[[Path, str], None]] = {
    "fsio": _fsio, "plan": _plan, "run-record": _record, "append": _appended,
    "rollback-latest": _rollback_latest}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("kind", SPECIAL + LINKS)
def test_writers_refuse_what_is_not_a_regular_file(tmp_path: Path, kind: str,
                                                   writer: str) -> None:
    folder = tmp_path / "run" / "train" / "checkpoints"
    name = "latest" if writer == "rollback-latest" else "target"
    make(kind, folder / name, tmp_path / "outside")
    (folder / "step_00000004").mkdir()    # the checkpoint a rollback would resume from
    before, names = fingerprint(folder / name), listing(folder)
    with pytest.raises(JobgenError) as info:
        WRITERS[writer](folder, name)
    message = str(info.value)
    assert "\n" not in message and ("regular file" in message or "outside" in message)
    assert fingerprint(folder / name) == before             # the thing is as it was
    assert listing(folder) == names                         # no temporary left, nothing new
    if kind.startswith("symlink"):
        assert (tmp_path / "outside" / "victim").read_bytes() == VICTIM


@pytest.mark.parametrize("kind", SPECIAL + LINKS)
def test_the_cache_writes_nothing_over_what_is_not_a_regular_file(tmp_path: Path,
                                                                   kind: str) -> None:
    make(kind, tmp_path / "entry", tmp_path / "outside")
    before, names = fingerprint(tmp_path / "entry"), listing(tmp_path)
    cache.write(str(tmp_path / "entry"), b"payload")         # never a reason to fail
    assert fingerprint(tmp_path / "entry") == before and listing(tmp_path) == names


def test_the_writer_replaces_a_regular_file_atomically_with_the_umask(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old")
    fsio.write_file(tmp_path / "f", "new")
    assert (tmp_path / "f").read_bytes() == b"new" and listing(tmp_path) == ["f"]
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o666 & ~fsio.current_umask()


# --- reading what is not a regular file ------------------------------------------------------

def _state_runs(tmp: Path, hostile: Path) -> Any:
    return runs.load()


def _events(tmp: Path, hostile: Path) -> Any:
    return tfrecord.EventFile(hostile).read()


def _lines(tmp: Path, hostile: Path) -> Any:
    return readers.LineReader(hostile).read(0.0)


def _node_end(tmp: Path, hostile: Path) -> Any:
    return readers.Allocation(0, "1", hostile.parent.parent).ends()


READERS: dict[str, tuple[str, Callable[[Path, Path], Any], Any]] = {
    # name: (where the hostile thing goes, relative to the state/run folder; the read; result)
    "bytes": ("x", lambda tmp, p: fsio.read_bytes(p), JobgenError),
    "records": ("x.jsonl", lambda tmp, p: fsio.read_records(p, dict), JobgenError),
    "runs.jsonl": ("state/runs.jsonl", _state_runs, JobgenError),
    "run-record": ("run/jobgen-run.json", lambda tmp, p: runrecord.read_file(p), JobgenError),
    "yaml": ("recipe.yaml", lambda tmp, p: yamlfile_load(p), JobgenError),
    "read_from": ("x", lambda tmp, p: tfrecord.read_from(p, 0), b""),
    "events": ("run/nemo/events.out.tfevents.1", _events, []),
    "node-log": ("run/logs/1/restart-0/node-0/train.log", _lines, []),
    "job.status": ("run/logs/1/restart-0/node-0/job.status", _node_end, "ends"),
    "host": ("run/logs/1/restart-0/node-0/host", lambda tmp, p: readers.Allocation(
        0, "1", p.parent.parent).host(0), ""),
    "progress": ("run/logs/1/restart-0/node-0/train.log",
                 lambda tmp, p: progress_step(tmp / "run"), None),
}


def yamlfile_load(path: Path) -> Any:
    from jobgen.yamlfile import load_yaml
    return load_yaml(path, path.name)


def progress_step(run: Path) -> Any:
    from jobgen.progress import newest_step
    return newest_step(str(run), "1")


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("kind", SPECIAL)
def test_readers_never_block_on_what_is_not_a_regular_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, reader: str) -> None:
    where, read, expected = READERS[reader]
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / where
    make(kind, path, tmp_path / "outside")
    if expected is JobgenError:
        with pytest.raises(JobgenError) as info:
            read(tmp_path, path)
        assert "\n" not in str(info.value) and str(path.name) in str(info.value)
    elif expected == "ends":
        assert [(e.node, e.status) for e in read(tmp_path, path)] == [(0, None)]
    else:
        assert read(tmp_path, path) == expected


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_user_config_that_is_not_a_file_is_refused_not_ignored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    from jobgen import userconfig
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("JOBGEN_SITE", raising=False)
    make(kind, tmp_path / "jobgen" / "config.yaml", tmp_path / "outside")
    with pytest.raises(ConfigError, match="config.yaml: is a"):
        userconfig.site(None)


def test_a_growing_log_is_read_in_bounded_chunks(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"x" * (fsio.MAX_LINE + 10) + b"\n" + b'{"event": "done"}\n')
    reader = readers.LineReader(path)
    assert reader.read(0.0) == ['{"event": "done"}'] and reader.skipped == 1
