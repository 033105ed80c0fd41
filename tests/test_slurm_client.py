"""jobgen/slurm_client.py. `jobgen submit --dry-run` prints what `jobgen submit` runs, as a
bash script that does it: piped into bash (with a recording stand-in for sbatch) it submits
exactly the scripts `jobgen render` prints, the second job of a chain after the first. The
job's state is read from Slurm's JSON (the shapes of 22.05 and 23.11) or, on a Slurm without
it, from scontrol's text."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from jobgen import api
from jobgen.backends.slurm import backend as slurm
from jobgen.backends.slurm import client as slurm_client
from jobgen.backends.slurm import jobs as slurm_jobs
from jobgen.plumbing.errors import RemoteError

FAKE_SBATCH = """#!/usr/bin/env bash
# Records its arguments and its stdin (the script), answers like `sbatch --parsable`.
n=$(( $(ls "$RECORD" | wc -l) / 2 + 1 ))
printf '%s\\n' "$@" > "$RECORD/$n.args"
cat > "$RECORD/$n.script"
echo "$((4240 + n));cluster"
"""


def run_dry(tmp_path: Path, text: str) -> tuple[str, list[list[str]], list[str]]:
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", RECORD=str(record))
    proc = subprocess.run(["bash"], input=text, env=env, capture_output=True, text=True,
                          check=True)
    count = len(list(record.glob("*.args")))
    args = [(record / f"{i}.args").read_text().splitlines() for i in range(1, count + 1)]
    scripts = [(record / f"{i}.script").read_text() for i in range(1, count + 1)]
    return proc.stdout, args, scripts


def test_dry_run_of_a_chain_submits_both_jobs_in_order(jobgen: Callable,
                                                        tmp_path: Path) -> None:
    result = jobgen("submit", "neox20b", "--nodes", "2", "--chain", "--dry-run")
    assert result.exit_code == 0, result.output
    out, args, scripts = run_dry(tmp_path, result.stdout)
    spec = api.job_spec("neox20b", 2)
    assert scripts == [slurm.plan(spec, "compile").text, slurm.plan(spec, "train").text]
    assert args == [["--parsable"], ["--parsable", "--dependency=afterok:4241",
                                     "--kill-on-invalid-dep=yes"]]
    assert out == "4241 4242\n"     # what `jobgen submit --chain` prints


def test_dry_run_of_one_job_is_what_render_prints(jobgen: Callable, tmp_path: Path) -> None:
    result = jobgen("submit", "llama2-7b", "--nodes", "4", "--dry-run")
    assert result.exit_code == 0, result.output
    rendered = jobgen("render", "llama2-7b", "--nodes", "4").stdout
    out, args, scripts = run_dry(tmp_path, result.stdout)
    assert scripts == [rendered] and args == [["--parsable"]] and out == "4241\n"


def test_a_script_that_contains_the_delimiter_cannot_end_the_here_document() -> None:
    plan = api.plan(api.job_spec("neox20b", 1))
    text = slurm_client.dry_run([plan])
    end = text.splitlines()[3].rpartition("<<'")[2].rstrip("'")
    assert plan.text.count(end) == 0 and text.count(end) == 2


def test_sbatch_command_is_shared_by_submit_and_dry_run() -> None:
    assert slurm_client.sbatch_argv(slurm_client.after("7")) == [
        "sbatch", "--parsable", "--dependency=afterok:7", "--kill-on-invalid-dep=yes"]


# --- reading the job's state: Slurm's JSON where it has one, scontrol's text where not --------
# The answers below are the shapes Slurm prints: 22.05's (OpenAPI v0.0.38, the local cluster's)
# and 23.11's and later (v0.0.40+: flag lists and {"set", "number"} objects).

SQUEUE_2205 = {"jobs": [
    {"job_id": 77, "job_state": "RUNNING", "state_reason": "None", "nodes": "n[1-2]",
     "restart_cnt": 1, "exit_code": 0, "name": "neox20b-smoke",
     "standard_output": "%x-%j.out", "current_working_directory": "/home/u/my runs"},
    {"job_id": 78, "job_state": "CANCELLED", "state_reason": "None", "nodes": "n1",
     "restart_cnt": 0, "exit_code": 15, "name": "x", "standard_output": "/abs/x.out",
     "current_working_directory": "/home/u"}]}
SQUEUE_2311 = {"jobs": [
    {"job_id": 79, "job_state": ["FAILED"], "state_reason": "NonZeroExitCode", "nodes": "n3",
     "restart_cnt": {"set": True, "infinite": False, "number": 2},
     "exit_code": {"status": ["EXITED"], "return_code": {"set": True, "number": 1},
                   "signal": {"id": {"set": False, "number": 0}, "name": ""}},
     "name": "pythia", "standard_output": "/runs/pythia-79.out",
     "current_working_directory": "/runs"}]}
SACCT_2205 = {"jobs": [
    {"job_id": 80, "name": "bert", "state": {"current": "TIMEOUT", "reason": "None"},
     "exit_code": {"status": "SIGNALED", "return_code": 0,
                   "signal": {"signal_id": 15, "name": "TERM"}}, "nodes": "n[1-4]"}]}


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, squeue: object = None,
               sacct: object = None, scontrol: str = "", json_ok: bool = True) -> None:
    """squeue, sacct and scontrol stand-ins that print the given answers (or refuse --json as
    a Slurm older than 20.11 does)."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name, answer in (("squeue", squeue), ("sacct", sacct)):
        refuse = "" if json_ok else (f'for a; do [ "$a" = --json ] && {{ echo "{name}: '
                                     "unrecognized option '--json'\" >&2; exit 1; }; done\n")
        text = json.dumps(answer or {"jobs": []}) if json_ok else ""
        (bin_dir / name).write_text(f"#!/bin/bash\n{refuse}cat <<'END'\n{text}\nEND\n")
    # `scontrol ping` answers as a controller that is up (jobgen asks it first).
    ping = ('[ "$1" = ping ] && { echo "Slurmctld(primary) at vm is UP"; exit 0; }\n')
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\n{ping}cat <<'END'\n{scontrol}\nEND\n"
                                      if scontrol else f"#!/bin/bash\n{ping}echo "
                                      "'slurm_load_jobs error: Invalid job id specified' >&2; "
                                      "exit 1\n")
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_state_from_squeue_json_2205(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_slurm(tmp_path, monkeypatch, squeue=SQUEUE_2205)
    assert slurm_jobs.status("77") == {
        "backend": "slurm", "job_id": "77", "state": "RUNNING", "finished": False, "reason": "",
        "exit_code": "", "nodes": "n[1-2]", "restarts": 1,
        "output": "/home/u/my runs/neox20b-smoke-77.out"}   # a folder with a space, whole
    assert slurm_jobs.status_lines("78") == [
        "job 78: CANCELLED, exit 0:15, nodes n1", "output /abs/x.out"]


def test_state_from_squeue_json_2311(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_slurm(tmp_path, monkeypatch, squeue=SQUEUE_2311)
    st = slurm_jobs.status("79")
    assert (st["state"], st["exit_code"], st["restarts"], st["reason"]) == (
        "FAILED", "1:0", 2, "NonZeroExitCode")


def test_state_from_accounting_once_the_controller_forgot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_slurm(tmp_path, monkeypatch, sacct=SACCT_2205)
    assert slurm_jobs.status_lines("80") == ["job 80: TIMEOUT, exit 0:15, nodes n[1-4]"]
    with pytest.raises(RemoteError, match="job 81 is unknown to the controller and to"):
        slurm_jobs.state("81")


def test_state_from_scontrol_text_where_slurm_has_no_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = ("JobId=82 JobName=neox20b UserId=u(1) JobState=RUNNING Reason=None Restarts=0 "
            "ExitCode=0:0 NodeList=n[1-2] StdOut=/home/u/my runs/neox20b-82.out "
            "StdErr=/home/u/my runs/neox20b-82.out Power=")
    fake_slurm(tmp_path, monkeypatch, scontrol=line, json_ok=False)
    st = slurm_jobs.state("82")
    assert (st.state, st.nodes, st.stdout) == ("RUNNING", "n[1-2]",
                                               "/home/u/my runs/neox20b-82.out")


def test_not_a_slurm_job_id() -> None:
    with pytest.raises(RemoteError, match="'abc' is not a Slurm job id"):
        slurm_jobs.state("abc")
