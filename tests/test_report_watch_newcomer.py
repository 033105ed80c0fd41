"""Issue 49's report and watch families, on run folders laid out as jobs write them
(test_report.make_run): save figures outside their domain left out and counted, a draw of the
failure model that cannot end bounded, a health entry with no host, a record with no spec, a
control character in an output's name, watch on a failed, a cancelled and a good run, the time
between two jobs not billed, a Ctrl-C not a failure, and a run found only in another folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_report import T0, _log, _node, _steps, make_run

from jobgen.planning.failures import wall_given_failures
from jobgen.reporting import report
from jobgen.runs import ledger

JOBGEN = Path(sys.executable).with_name("jobgen")


def jobgen(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, **env), check=False)


def with_save(run: Path, **figures: object) -> Path:
    """The run's last save (step 12 of allocation 2) carrying `figures`."""
    log = run / "logs" / "7" / "restart-2" / "node-0" / "train.log"
    lines = []
    for line in log.read_text().splitlines():
        if line.startswith('{"event": "checkpoint"') and '"step": 12' in line:
            line = json.dumps(dict(json.loads(line), **figures))
        lines.append(line)
    log.write_text("\n".join(lines) + "\n")
    return run


@pytest.mark.parametrize("stall", [-5.0, -1e308, 1e308, 3e5, 1e9, int("9" * 400)])
def test_a_save_figure_outside_its_domain_is_left_out_and_counted(tmp_path: Path,
                                                                  stall: object) -> None:
    run = with_save(make_run(tmp_path), stall_s=stall, write_s=stall)
    began = time.monotonic()
    proc = jobgen(tmp_path, "report", "--run-dir", str(run), "--no-sacct")
    assert time.monotonic() - began < 30
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "12: -/-" in proc.stdout
    assert ("note: 1 save event(s) left out of the checkpoint figures: a stall_s or write_s "
            "below 0, longer than its allocation, or not a number") in proc.stdout
    assert " -" not in proc.stdout.split("plan's failure model")[-1].split("%")[0]


def test_the_given_failures_draw_ends_when_a_write_dwarfs_the_mtbf() -> None:
    for write in (3e5, 1e9, 1e308):
        began = time.monotonic()
        assert wall_given_failures(1200, 40, write, 25, 360, 1) is None
        assert time.monotonic() - began < 5
    assert wall_given_failures(120, 40, 2, 25, 360, 1) is not None


def test_a_health_entry_with_no_host_is_passed_over(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    with (run / "jobgen-health.jsonl").open("a") as f:
        f.write(json.dumps({"job": "7", "allocation": "1", "node": 0, "check": "devices"}) + "\n")
    made = report.make(None, run, use_sacct=False)
    assert [a.excluded for a in made.timeline.allocations] == [("n2",), (), ()]


def test_a_record_with_no_spec_is_one_line(tmp_path: Path) -> None:
    from jobgen.runs import runrecord
    sub = {key: False if kind is bool else 1 if kind is int else kind()
           for key, kind in runrecord.SUBMISSION_KEYS.items()}
    del sub["spec"]
    path = tmp_path / runrecord.FILE
    path.write_text(json.dumps({"format": runrecord.FORMAT, "run": "r", "submissions": [sub]}))
    with pytest.raises(Exception, match="submission 1: spec is missing or not a dict"):
        runrecord.read_file(path)


@pytest.mark.parametrize("option", ["--html"])
def test_a_control_character_in_an_output_name_is_escaped(tmp_path: Path, option: str) -> None:
    run = make_run(tmp_path)
    proc = jobgen(tmp_path, "report", "--run-dir", str(run), "--no-sacct", option,
                  "r\x1b[2J\x07.html")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "html: r\\x1b[2J\\x07.html" in proc.stdout


def test_watch_says_a_failed_run_failed_and_stays_quiet_on_a_good_one(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    good = jobgen(tmp_path, "watch", "--run-dir", str(run))
    assert good.returncode == 0, good.stdout + good.stderr
    assert "failed" not in good.stdout.split("summary:")[1] and "no alerts" in good.stdout
    (run / "logs" / "7" / "restart-2" / "node-1" / "job.status").write_text("1 train\n")
    bad = jobgen(tmp_path, "watch", "--run-dir", str(run))
    assert bad.returncode == 1
    assert ("the run failed: allocation 2 (job 7), node 1 (n3) ended its train pass with "
            "status 1, after step 12") in bad.stdout
    as_json = jobgen(tmp_path, "watch", "--run-dir", str(run), "--json")
    summary = json.loads(as_json.stdout.splitlines()[-1])
    assert (as_json.returncode, summary["failed"]) == (1, True)


def test_watch_refuses_a_window_too_large_to_hold(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    for option in ("--spike-window", "--drop-steps"):
        proc = jobgen(tmp_path, "watch", "--run-dir", str(run), option, "9" * 30)
        assert (proc.returncode, proc.stdout) == (2, "")
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
        assert f"Invalid value for '{option}'" in proc.stderr


def two_commands(root: Path, pause: float, cancel_first: bool) -> Path:
    """One run of two `jobgen run` commands (two job folders, each with the span its command
    held the nodes), `pause` s apart; the first stopped by Ctrl-C where `cancel_first`."""
    run = root / "jobgen-runs" / "rehearsal"
    t = T0
    for job, first, last in (("local-1-1", 1, 4), ("local-2-2", 5, 8)):
        folder = run / "logs" / job
        steps, end = _steps(first, last, t + 5)
        events = [{"event": "start", "phase": "train", "t": t + 5}, *steps]
        if job == "local-2-2" or not cancel_first:
            events.append({"event": "done", "phase": "train", "step": last, "t": end + 1})
        _log(folder / "node-0" / "train.log", events)
        status = 130 if cancel_first and job == "local-1-1" else 0
        for node, host in ((0, "h1"), (1, "h2")):
            _node(folder, node, host, (t + 1, t + 2), (status, end + 2))
        (folder / "held.json").write_text(json.dumps(
            {"by": "jobgen run", "nodes": 2, "start": t, "end": end + 3, "pid": 1, "host": "x"}))
        if status:
            (folder / ledger.CANCELLED).write_text(json.dumps({"step": last}) + "\n")
        os.utime(folder, (end + 3, end + 3))
        t = end + 3 + pause
    return run


def test_the_time_between_two_commands_is_not_held(tmp_path: Path) -> None:
    run = two_commands(tmp_path, 25.0, cancel_first=False)
    made = report.make(None, run, use_sacct=False)
    a = made.account
    held = sum((x.end - x.start) * 2 for x in made.timeline.allocations) / 3600
    assert a.allocated_h == pytest.approx(held)
    assert dict(a.parts)["gap"] == 0
    assert any("25.0 s between the run's jobs" in n for n in made.timeline.notes)


def test_a_ctrl_c_is_a_cancel_not_a_failure(tmp_path: Path) -> None:
    run = two_commands(tmp_path, 5.0, cancel_first=True)
    made = report.make(None, run, use_sacct=False)
    assert [x.ending for x in made.timeline.allocations] == ["cancelled", "done"]
    c = made.account.cluster
    assert (c.failures, c.node_mtbf_hours) == (0, None)
    proc = jobgen(tmp_path, "report", "--run-dir", str(run), "--no-sacct")
    assert "--node-mtbf-hours" not in proc.stdout and "failure:" not in proc.stdout
    first = run / "logs" / "local-2-2"
    os.utime(first, (T0 - 10, T0 - 10))   # the cancelled command the newest: watch says so
    watched = jobgen(tmp_path, "watch", "--run-dir", str(run), "--json")
    # A cancel is said as one, not as a failure; the run did not complete: 1.
    summary = json.loads(watched.stdout.splitlines()[-1])
    assert summary["ended"] == ("the run was cancelled (Ctrl-C) in allocation 1 (job "
                                "local-1-1), after step 4")
    assert (watched.returncode, summary["failed"], summary["cancelled"]) == (1, False, True)
    assert summary["steps_read"] == 8 and summary["allocations"] == 2


def test_watch_reads_each_jobgen_run_command_as_an_allocation(tmp_path: Path) -> None:
    """A run folder of two `jobgen run` commands (RUN/logs/JOB/node-K, no restart-N): watch
    reads every step from the nodes' logs (no metrics.jsonl here), stays quiet and exits 0
    when the newest ended well, and says which command, node, pass, step and status when it
    failed."""
    run = two_commands(tmp_path, 5.0, cancel_first=False)
    assert not (run / "train").exists()
    good = jobgen(tmp_path, "watch", "--run-dir", str(run))
    assert good.returncode == 0, good.stdout + good.stderr
    (summary, *rest) = good.stdout.split("summary: ")[1].splitlines()
    assert summary == ("job - RECORDED, last step 8, 2 allocation(s), 0 restart(s) in place, "
                       "0 step(s) trained again after restarts")
    assert rest == ["  no alerts"]
    (run / "logs" / "local-2-2" / "node-1" / "job.status").write_text("1 train\n")
    bad = jobgen(tmp_path, "watch", "--run-dir", str(run))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.split("summary: ")[1].splitlines()[1:] == [
        "  the run failed: allocation 1 (job local-2-2), node 1 (h2) ended its train pass "
        "with status 1, after step 8", "  no alerts before it"]


def _record(state: Path, runs: list[dict[str, object]]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    base = {"backend": "local", "recipe": "neox20b", "nodes": 2, "site": "",
            "submitted": "2026-01-01T00:00:00Z"}
    (state / ledger.RECORD).write_text("".join(json.dumps(dict(base, **r)) + "\n" for r in runs))


def test_a_run_found_only_in_another_folder_is_said(tmp_path: Path) -> None:
    run = make_run(tmp_path / "elsewhere")
    state, here = tmp_path / "state", tmp_path / "here"
    here.mkdir()
    _record(state, [{"name": "demo", "job_id": "7", "run_dir": str(run)}])
    proc = jobgen(here, "report", "demo", "--no-sacct", JOBGEN_STATE_DIR=str(state))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (f"note: demo: the run in {run}, the only one recorded, is not under "
                           f"this folder ({here})\n")


def test_one_job_id_in_two_folders_is_refused_naming_both(tmp_path: Path) -> None:
    one, two = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    state, here = tmp_path / "state", tmp_path / "here"
    here.mkdir()
    _record(state, [{"name": "demo", "job_id": "local-5-9", "run_dir": str(one)},
                    {"name": "other", "job_id": "local-5-9", "run_dir": str(two)}])
    proc = jobgen(here, "report", "local-5-9", "--no-sacct", JOBGEN_STATE_DIR=str(state))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("error: local-5-9: runs with that job id are in 2 folders (")
    assert str(one) in proc.stderr and str(two) in proc.stderr
    inside = jobgen(one, "report", "local-5-9", "--no-sacct", JOBGEN_STATE_DIR=str(state))
    assert inside.returncode == 0 and inside.stdout.startswith("run demo:"), inside.stderr
