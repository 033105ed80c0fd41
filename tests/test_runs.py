"""jobgen/runs/ledger.py: the local record of submitted jobs, and the commands that read it (`jobgen
runs`, and status/logs/cancel by run name) where no scheduler is needed. With a scheduler: the
Batch flow in test_batch_client (moto over HTTP), the Slurm flow in test_slurm_e2e."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import pytest

from jobgen.runs import ledger as runs


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


# --- a run stays in its folder (issue 41) ---------------------------------------------------

def test_a_name_means_the_run_in_this_folder(jobgen: Callable, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Two folders each hold a run named r: from either folder the name is that folder's run
    (the other one is newer); from a third folder it is refused, naming both; a job id is
    always the one run."""
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
    here = _run("r", "local-1-10", "local", run_dir=str(tmp_path / "a" / "jobgen-runs" / "r"))
    there = _run("r", "local-1-11", "local", run_dir=str(tmp_path / "b" / "jobgen-runs" / "r"))
    runs.record(here)
    runs.record(there)
    monkeypatch.chdir(tmp_path / "a")
    assert runs.find("r") == here and runs.find("local-1-11") == there
    monkeypatch.chdir(tmp_path / "b")
    assert runs.find("r") == there
    monkeypatch.chdir(tmp_path / "c")
    for command in (("status", "r"), ("report", "r"), ("runs", "r")):
        result = jobgen(*command)
        assert result.exit_code == 2, command
        assert result.stderr == (
            f"error: r: runs of that name are in 2 folders ({tmp_path}/b/jobgen-runs/r, "
            f"{tmp_path}/a/jobgen-runs/r); run the command from the folder of the one you "
            "mean, or name it by its job id (`jobgen runs` lists them)\n"), command
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_local_job_ids_differ_within_one_second(tmp_path: Path) -> None:
    """Two `jobgen run`s started in the same second (the clock stands still here) on one
    machine get two job ids, so two log folders and two rows of `jobgen runs`."""
    import subprocess
    import sys
    script = ("import time; time.time = lambda: 1795750000.5; "
              "from jobgen.runs import ledger as runs; print(runs.local_job_id())")
    ids = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True).stdout.strip() for _ in range(2)}
    assert len(ids) == 2 and all(i.startswith("local-1795750000-") for i in ids)


def _local_run(tmp_path: Path, job_id: str) -> Path:
    folder = tmp_path / "jobgen-runs" / "r"
    (folder / "logs" / job_id / "node-0").mkdir(parents=True)
    runs.record(_run("r", job_id, "local", nodes=1, run_dir=str(folder)))
    return folder / "logs" / job_id


def test_status_of_a_cancelled_rehearsal(jobgen: Callable, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """What the nodes wrote on being stopped (143) is not a failure where jobgen run recorded
    the Ctrl-C: CANCELLED, with the step, the checkpoint and the command that resumes it."""
    monkeypatch.chdir(tmp_path)
    logs = _local_run(tmp_path, "local-5-1")
    (logs / "node-0" / "job.status").write_text("143 train\n")
    assert "FAILED" in jobgen("status", "r").stdout
    (logs / "cancelled.json").write_text(json.dumps(
        {"step": 7, "checkpoint_step": 4, "checkpoint": "jobgen-runs/r/train/step_4",
         "resume": "jobgen run bert1.5b --smoke"}))
    result = jobgen("status", "r")
    assert (result.exit_code, result.stdout) == (0, (
        "local-5-1: CANCELLED (Ctrl-C at step 7; last checkpoint: step 4; resume with: "
        "jobgen run bert1.5b --smoke)\n"))
    assert json.loads(jobgen("status", "r", "--json").stdout)["state"] == "CANCELLED"


def test_status_of_a_rehearsal_does_not_wait_on_a_fifo(jobgen: Callable, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    logs = _local_run(tmp_path, "local-5-2")
    os.mkfifo(logs / "node-0" / "job.status")
    result = jobgen("status", "r")
    assert result.exit_code == 0 and result.stdout.startswith("local-5-2: FAILED (node 0: ?")


def test_a_rehearsal_has_the_record_of_a_submission(jobgen: Callable, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What `jobgen run` records before its nodes start: a row of `jobgen runs` and the run's
    record in its folder, which `runs NAME` shows and `resubmit NAME` runs here again (its dry
    run: the emulated nodes' commands, not a scheduler's)."""
    from jobgen import api
    from jobgen.backends.local import rehearsal
    from jobgen.inputs.recipe import locate as locate_recipe
    from jobgen.inputs.site import locate as locate_site
    monkeypatch.chdir(tmp_path)
    spec = api.job_spec("bert1.5b", 1, backend="local", smoke=True)
    warnings = rehearsal.record(spec, "local-9-1", site_ref="local", overrides=[],
                                recipe_file=locate_recipe("bert1.5b")[0],
                                site_file=locate_site("local")[0])
    assert warnings == []
    assert (tmp_path / spec.run_dir / "jobgen-run.json").is_file()
    shown = jobgen("runs", spec.run_name)
    assert shown.exit_code == 0 and shown.stdout.startswith(
        f"# {tmp_path / spec.run_dir / 'jobgen-run.json'}\n")
    again = jobgen("resubmit", spec.run_name, "--dry-run")
    assert again.exit_code == 0, again.output
    assert [len(json.loads(again.stdout)["nodes"])] == [1]
