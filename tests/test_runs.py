"""jobgen/runs.py: the local record of submitted jobs, and the commands that read it (`jobgen
runs`, and status/logs/cancel by run name) where no scheduler is needed. With a scheduler: the
Batch flow in test_batch_client (moto over HTTP), the Slurm flow in test_slurm_e2e."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import pytest

from jobgen import runs


def _run(name: str, job_id: str, backend: str = "slurm", **extra: object) -> runs.Run:
    fields = dict(name=name, backend=backend, job_id=job_id, recipe="neox20b", nodes=2, site="",
                  run_dir=f"/shared/runs/{name}", submitted="2026-11-23T10:00:00Z",
                  jobs=(job_id,))
    fields.update(extra)
    return runs.Run(**fields)  # type: ignore[arg-type]


def test_state_folder_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "b"))
    assert runs.state_dir() == tmp_path / "a"
    monkeypatch.delenv("JOBGEN_STATE_DIR")
    assert runs.state_dir() == tmp_path / "b" / "jobgen"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert runs.state_dir() == tmp_path / "home" / ".local" / "state" / "jobgen"


def test_record_load_find() -> None:
    assert runs.load() == [] and runs.find("x") is None
    first = _run("neox20b-2n", "101")
    again = _run("neox20b-2n", "205")        # a rerun of the same run name
    chain = _run("pythia-4n", "302", jobs=("301", "302"))
    for run in (first, again, chain):
        assert runs.record(run) is None
    assert runs.load() == [first, again, chain]
    assert runs.find("neox20b-2n") == again   # the newest with that name
    assert runs.find("101") == first          # by job id
    assert runs.find("301") == chain          # the compile job of a chain
    assert runs.find("nope") is None
    path = runs.state_dir() / runs.RECORD
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert [json.loads(line)["job_id"] for line in path.read_text().splitlines()] == \
        ["101", "205", "302"]


def test_broken_lines_and_unknown_fields_are_skipped() -> None:
    runs.record(_run("a", "1"))
    path = runs.state_dir() / runs.RECORD
    with path.open("a") as f:
        f.write("not json\n{\"name\": \"half\"}\n[1, 2]\n")
        f.write(json.dumps({**_run("b", "2").as_dict(), "from_a_newer_jobgen": 1}) + "\n")
    assert [r.name for r in runs.load()] == ["a", "b"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_record_that_cannot_be_written_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(locked / "state"))
    warning = runs.record(_run("a", "1"))
    assert warning is not None and warning.startswith("job 1 submitted, but not recorded in ")


def test_a_record_under_a_file_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "file" / "state"))
    warning = runs.record(_run("a", "1"))
    assert warning == (f"job 1 submitted, but not recorded in {tmp_path}/file/state/runs.jsonl: "
                       "Not a directory; `jobgen runs` will not list it")


def test_runs_command_without_asking_schedulers(jobgen: Callable) -> None:
    result = jobgen("runs", "--no-state")
    assert (result.exit_code, result.stdout) == (0, "")
    assert "no runs recorded in" in result.stderr
    runs.record(_run("neox20b-2n", "101"))
    runs.record(_run("bert-large-2n", "6a7c3f1e-0000-4000-8000-000000000001", "batch",
                     recipe="bert-large", run_dir="/mnt/efs/runs/bert-large-2n"))
    result = jobgen("runs", "--no-state")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["name", "backend", "job_id", "recipe", "nodes", "submitted",
                                "run_dir"]
    assert lines[1].split() == ["neox20b-2n", "slurm", "101", "neox20b", "2",
                                "2026-11-23T10:00:00Z", "/shared/runs/neox20b-2n"]
    assert lines[2].split()[:3] == ["bert-large-2n", "batch",
                                    "6a7c3f1e-0000-4000-8000-000000000001"]
    result = jobgen("runs", "--no-state", "--json", "--last", "1")
    data = json.loads(result.stdout)
    assert [r["name"] for r in data] == ["bert-large-2n"] and "state" not in data[0]


def test_runs_says_when_a_scheduler_cannot_answer(jobgen: Callable, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """No Slurm commands on PATH: the row's state is '?' and the reason is in the JSON."""
    monkeypatch.setenv("PATH", str(tmp_path))
    runs.record(_run("neox20b-2n", "101"))
    data = json.loads(jobgen("runs", "--json").stdout)
    assert data[0]["state"] == "?"
    assert data[0]["state_error"] == "squeue not found: is this a Slurm login node?"


def test_job_by_run_name_needs_the_recorded_backend(jobgen: Callable) -> None:
    runs.record(_run("neox20b-2n", "101"))
    result = jobgen("status", "neox20b-2n", "--backend", "batch")
    assert result.exit_code == 2
    assert result.stderr == "error: neox20b-2n: recorded as a slurm job, not batch\n"
    result = jobgen("logs", "neox20b-2n", "--node", "2")
    assert (result.exit_code, result.stderr) == (
        2, "error: --node: job 101 has 2 nodes (0 to 1)\n")


def test_slurm_node_logs_need_the_record(jobgen: Callable) -> None:
    result = jobgen("logs", "101", "--node", "0")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --node: job 101 has no run record")


def test_node_logs_of_every_restart_oldest_first(tmp_path: Path) -> None:
    from jobgen.backends.slurm import jobs as slurm_jobs
    folder = tmp_path / "logs" / "7"
    for restart in (10, 2, 0):
        for name in ("train.log", "compile.log"):
            path = folder / f"restart-{restart}" / "node-1" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{restart} {name}\n")
    (folder / "restart-2" / "node-0").mkdir()
    found = slurm_jobs.node_logs(folder, 1)
    assert [p.read_text() for p in found] == [
        "0 compile.log\n", "0 train.log\n", "2 compile.log\n", "2 train.log\n",
        "10 compile.log\n", "10 train.log\n"]
    assert slurm_jobs.node_logs(folder, 0) == []
