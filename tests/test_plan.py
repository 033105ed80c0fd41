"""The plan: files written into a folder all or nothing, with their modes, and no temporary
files left behind, whether the write succeeds or fails."""
from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from jobgen import api
from jobgen.job.plan import Plan, PlannedFile
from jobgen.plumbing.errors import JobgenError

JOBGEN_EXE = Path(sys.executable).parent / "jobgen"


def sample_plan() -> Plan:
    return Plan(backend="test",
                files=(PlannedFile("job.sbatch", "#!/bin/bash\necho job\n", executable=True),
                       PlannedFile("job.json", '{"a": 1}\n'),
                       PlannedFile("notes.txt", "ünïcode ✓\n")),
                primary="job.sbatch", submit_argv=("sbatch", "--parsable", "{primary}"))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_puts_every_file_in_place_with_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "new" / "nested"            # created, parents included
    written = sample_plan().write(target)
    assert written == [target / "job.sbatch", target / "job.json", target / "notes.txt"]
    assert sorted(p.name for p in target.iterdir()) == ["job.json", "job.sbatch", "notes.txt"]
    assert (target / "job.sbatch").read_text() == "#!/bin/bash\necho job\n"
    assert (target / "notes.txt").read_text(encoding="utf-8") == "ünïcode ✓\n"
    assert mode(target / "job.sbatch") == 0o755
    assert mode(target / "job.json") == 0o644
    assert mode(target / "notes.txt") == 0o644


def test_write_replaces_existing_files(tmp_path: Path) -> None:
    (tmp_path / "job.sbatch").write_text("old\n")
    os.chmod(tmp_path / "job.sbatch", 0o600)
    sample_plan().write(tmp_path)
    assert (tmp_path / "job.sbatch").read_text() == "#!/bin/bash\necho job\n"
    assert mode(tmp_path / "job.sbatch") == 0o755
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_failed_write_leaves_nothing_half_written(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up while the second file is written (fault injected at the OS call)."""
    (tmp_path / "job.sbatch").write_text("old\n")
    calls = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(JobgenError) as info:
        sample_plan().write(tmp_path)
    assert str(info.value) == f"{tmp_path}: cannot write: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch"]   # no temporaries
    assert (tmp_path / "job.sbatch").read_text() == "old\n"                # not replaced


def test_a_folder_in_the_way_fails_before_any_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "job.sbatch").write_text("old\n")
    (tmp_path / "notes.txt").mkdir()
    with pytest.raises(JobgenError) as info:
        sample_plan().write(tmp_path)
    assert str(info.value) == (f"{tmp_path}/notes.txt: is a folder; jobgen writes only regular "
                               "files (give another path)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch", "notes.txt"]
    assert (tmp_path / "job.sbatch").read_text() == "old\n"


def test_unusable_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(JobgenError) as info:
        sample_plan().write(tmp_path / "file" / "sub")
    assert str(info.value) == f"{tmp_path}/file/sub: cannot create: Not a directory"


def test_plan_accessors() -> None:
    plan = sample_plan()
    assert plan.text == "#!/bin/bash\necho job\n"
    assert plan.file("job.json").content == '{"a": 1}\n'
    with pytest.raises(KeyError):
        plan.file("nope")
    assert plan.argv(Path("/d/job.sbatch")) == ["sbatch", "--parsable", "/d/job.sbatch"]


# --- through the command line --------------------------------------------------------------------

def test_render_to_folder(jobgen: Callable, tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    result = jobgen("render", "neox20b", "--nodes", "8", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{out / 'neox20b-8n.sbatch'}\n"
    assert [p.name for p in out.iterdir()] == ["neox20b-8n.sbatch"]
    assert mode(out / "neox20b-8n.sbatch") == 0o755
    expected = api.plan(api.job_spec("neox20b", 8)).text
    assert (out / "neox20b-8n.sbatch").read_text() == expected


def test_render_to_folder_when_a_write_fails(tmp_path: Path) -> None:
    """A real failing write: the file-size limit is below the script's size."""
    out = tmp_path / "jobs"
    proc = subprocess.run(["bash", "-c", 'ulimit -f 4 && exec "$@"', "bash", str(JOBGEN_EXE),
                           "render", "neox20b", "-o", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {out}: cannot write: File too large\n"
    assert proc.stdout == ""
    assert list(out.iterdir()) == []


def test_render_to_folder_with_bad_input_creates_nothing(jobgen: Callable, tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    result = jobgen("render", "neox20b", "--nodes", "3", "-o", str(out))
    assert result.exit_code == 2
    assert not out.exists()


# --- modes follow the umask; scripts alone are executable ----------------------------------------

@pytest.mark.parametrize("umask,script,other", [
    (0o022, 0o755, 0o644), (0o077, 0o700, 0o600), (0o002, 0o775, 0o664), (0o000, 0o777, 0o666),
    (0o027, 0o750, 0o640)])
def test_modes_follow_the_umask(tmp_path: Path, umask: int, script: int, other: int) -> None:
    plan = Plan(backend="test", primary="job.sbatch", submit_argv=(), files=(
        PlannedFile("job.sbatch", "echo no shebang, but a job script\n"),
        PlannedFile("prepare.sh", "echo a shell script\n"),
        PlannedFile("tool", "#!/usr/bin/env python3\nprint(1)\n"),
        PlannedFile("job.json", '{"a": 1}\n'),
        PlannedFile("notes.txt", "a #! that does not start the file\n")))
    previous = os.umask(umask)
    try:
        plan.write(tmp_path)
    finally:
        os.umask(previous)
    modes = {p.name: mode(p) for p in tmp_path.iterdir()}
    assert modes == {"job.sbatch": script, "prepare.sh": script, "tool": script,
                     "job.json": other, "notes.txt": other}


@pytest.mark.parametrize("umask,backend,name,expected", [
    ("077", "slurm", "neox20b-4n.sbatch", 0o700),
    ("002", "slurm", "neox20b-4n.sbatch", 0o775),
    ("077", "batch", "neox20b-4n.job-definition.json", 0o600),
    ("002", "batch", "neox20b-4n.job-definition.json", 0o664),
])
def test_render_honours_the_shells_umask(tmp_path: Path, umask: str, backend: str, name: str,
                                         expected: int) -> None:
    out = tmp_path / "jobs"
    proc = subprocess.run(["bash", "-c", f'umask {umask} && exec "$@"', "bash", str(JOBGEN_EXE),
                           "render", "neox20b", "--backend", backend, "-o", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    # Only notes on stderr (Batch: NeMo cannot save on its stop signal), no error.
    assert all(line.startswith("note: ") for line in proc.stderr.splitlines()), proc.stderr
    assert [p.name for p in out.iterdir()] == [name]
    assert mode(out / name) == expected


# --- SIGINT / SIGTERM while writing: no temporary file left, nothing half-replaced ----------------

# A test stand-in that holds the writer at a real system call: when jobgen sets the mode of one of
# its temporary files (the content is written, nothing renamed yet), it says so in a marker file
# and sleeps, so that the test can send the signal exactly then.
_PAUSE_AT_CHMOD = """\
import os, sys, time

_target = os.environ.get("JOBGEN_TEST_PAUSE_DIR", "")


def _pause(event, args):
    if event == "os.chmod" and _target and str(args[0]).startswith(_target + "/."):
        with open(os.environ["JOBGEN_TEST_PAUSE_MARK"], "w") as mark:
            mark.write(str(args[0]))
        time.sleep(120)


sys.addaudithook(_pause)
"""


@pytest.mark.parametrize("sig,status,stderr", [
    (signal.SIGTERM, 143, ""), (signal.SIGINT, 130, "error: interrupted\n")])
def test_signal_while_writing_leaves_no_temporary(tmp_path: Path, sig: int, status: int,
                                                  stderr: str) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_PAUSE_AT_CHMOD)
    out, mark = tmp_path / "jobs", tmp_path / "paused"
    out.mkdir()
    (out / "neox20b-4n.sbatch").write_text("previous\n")
    env = dict(os.environ, PYTHONPATH=str(hook), JOBGEN_TEST_PAUSE_DIR=str(out),
               JOBGEN_TEST_PAUSE_MARK=str(mark))
    # As from an interactive shell: SIGINT at its default even where the test runner was
    # started in the background (which makes a shell ignore SIGINT in what it starts).
    proc = subprocess.Popen([str(JOBGEN_EXE), "render", "neox20b", "-o", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for _ in range(600):   # up to a minute for the writer to reach the pause
            if mark.exists() and mark.read_text() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        temporary = Path(mark.read_text())
        assert temporary.parent == out and temporary.exists()   # caught mid-write
        proc.send_signal(sig)
        stdout, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, stdout, err) == (status, "", stderr)
    assert [p.name for p in out.iterdir()] == ["neox20b-4n.sbatch"]   # no temporary left
    assert (out / "neox20b-4n.sbatch").read_text() == "previous\n"   # not replaced


def test_ignored_sigint_stays_ignored(tmp_path: Path) -> None:
    """A writer started with SIGINT ignored (e.g. `nohup`, `cmd &` in a script) finishes."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_PAUSE_AT_CHMOD.replace("time.sleep(120)",
                                                                   "time.sleep(1)"))
    out, mark = tmp_path / "jobs", tmp_path / "paused"
    env = dict(os.environ, PYTHONPATH=str(hook), JOBGEN_TEST_PAUSE_DIR=str(out),
               JOBGEN_TEST_PAUSE_MARK=str(mark))
    proc = subprocess.Popen([str(JOBGEN_EXE), "render", "neox20b", "-o", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        for _ in range(600):
            if mark.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        stdout, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert mark.exists()
    assert (proc.returncode, stdout, err) == (0, f"{out / 'neox20b-4n.sbatch'}\n", "")
    assert [p.name for p in out.iterdir()] == ["neox20b-4n.sbatch"]
