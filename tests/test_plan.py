"""The plan: files written into a folder all or nothing, with their modes, and no temporary
files left behind, whether the write succeeds or fails."""
from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from jobgen import api
from jobgen.errors import JobgenError
from jobgen.plan import Plan, PlannedFile

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
    assert str(info.value) == f"{tmp_path}: cannot write: notes.txt is a directory"
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
