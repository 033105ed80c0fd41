"""`jobgen report` right on every backend's run folder: `jobgen run`'s flat layout
(logs/JOB/node-K) held to the rehearsal's own clock (logs/JOB/held.json), the compile pass from
its launch to its exit (node-K/compile.times, written by the flow), a step trained again labelled
so everywhere, a folder of runs or of none refused in one line, a run in progress said to be one
(and a clock far ahead of this machine's bounded). The real rehearsal at the end checks the
allocated node-hours against nodes x the wall time the test measures around `jobgen run`; the
EKS emulation's rehearsal (tests/test_backends_sagemaker_eks.py) checks its account the same
way (`assert_account`)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import pytest

from jobgen.cli import main
from jobgen.reporting import held, report, svg

T0 = 1_700_000_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def _events(path: Path, events: list[tuple[str, float, dict[str, Any]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"event": e, **f, "time": _iso(t)}) + "\n"
                            for e, t, f in events))


def _flat_run(root: Path, end: Optional[float] = T0 + 100, steps_at: float = T0 + 40,
              nodes: int = 2) -> Path:
    """A `jobgen run` folder: held T0..end, gate T0+2..4, compile launched at T0+5 (its events
    T0+20..24), exited at T0+30 (node 1 at T0+31), training T0+35 (events from `steps_at`)."""
    run = root / "run"
    job = run / "logs" / "local-1700000000-7"
    for n in range(nodes):
        d = job / f"node-{n}"
        d.mkdir(parents=True)
        (d / "host").write_text("laptop\n")
        (d / "health.json").write_text(json.dumps({"seconds": 2.0, "ok": True}))
        os.utime(d / "health.json", (T0 + 4, T0 + 4))
        (d / "compile.times").write_text(f"launch {T0 + 5}\nexit {T0 + 30 + n} 0\n")
        (d / "train.times").write_text(f"launch {T0 + 35}\n" +
                                       (f"exit {T0 + 90} 0\n" if end else ""))
        if end:
            (d / "job.status").write_text("0 train\n")
            os.utime(d / "job.status", (T0 + 90, T0 + 90))
    _events(job / "node-0" / "compile.log", [
        ("start", T0 + 20, {"phase": "compile"}),
        ("step", T0 + 22, {"phase": "compile", "step": 1, "loss": 6.0}),
        ("done", T0 + 24, {"phase": "compile", "step": 1})])
    train = [("start", steps_at - 2, {"phase": "train"})]
    train += [("step", steps_at + 2 * s, {"phase": "train", "step": s, "loss": 5.0})
              for s in range(1, 11)]
    if end:
        train.append(("done", steps_at + 21, {"phase": "train", "step": 10}))
    _events(job / "node-0" / "train.log", train)
    held.write(job, held.Held(T0, end, nodes, "jobgen run"))
    return run


def _parts(made: report.Report) -> dict[str, float]:
    return {k: h * 3600 / made.account.nodes for k, h in made.account.parts}


def test_a_local_rehearsal_folder_is_one_allocation_held_to_the_commands_clock(
        tmp_path: Path) -> None:
    made = report.make(None, _flat_run(tmp_path), use_sacct=False, now=T0 + 500)
    (alloc,) = made.timeline.allocations
    assert (alloc.start, alloc.end, alloc.ending) == (T0, T0 + 100, "done")
    assert made.account.allocated_h == pytest.approx(2 * 100 / 3600)
    parts = _parts(made)
    # The compile pass from its launch (T0+5) to the last node's exit (T0+31), not its events.
    assert parts["compile"] == pytest.approx(26.0)
    assert parts["train"] == pytest.approx(22.0)   # start (steps_at - 2) to step 10
    assert sum(parts.values()) == pytest.approx(100.0)
    # A local job has no scheduler to miss; its clock is named.
    assert made.timeline.notes == ("job local-1700000000-7: nodes held from the command's start "
                                   "to its end, as jobgen run measured them "
                                   "(logs/local-1700000000-7/held.json)",)


def test_a_run_in_progress_is_said_to_be_one_and_a_clock_ahead_is_bounded(
        tmp_path: Path) -> None:
    # The nodes' clock is a year ahead of this machine's: their records lie in the future.
    run = _flat_run(tmp_path, end=None, steps_at=T0 + 365 * 86400)
    made = report.make(None, run, use_sacct=False, now=T0 + 60)
    (alloc,) = made.timeline.allocations
    assert alloc.ending == "running" and alloc.end == T0 + 60
    assert 0 <= made.account.utilisation <= 1
    assert made.account.closure < 0.01
    shown = report_text(run, T0 + 60)
    assert "(in progress: counted to now)" in shown.splitlines()[0]
    assert "past this machine's clock" in shown and "is in progress" in shown
    # Without the command's record (a Slurm job without sacct): bounded all the same.
    (run / "logs" / "local-1700000000-7" / held.FILE).unlink()
    made = report.make(None, run, use_sacct=False, now=T0 + 60)
    assert 0 <= made.account.utilisation <= 1 and made.account.allocated_h < 1


def report_text(run: Path, now: float) -> str:
    from jobgen.reporting import text
    made = report.make(None, run, use_sacct=False, now=now)
    return text.text(made.timeline, made.account, made.curves, made.name)


def test_a_step_trained_again_is_labelled_so_on_the_timeline_too(tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = run / "logs" / "77"
    for k, first in ((0, 1), (1, 3)):   # the second allocation resumed from step 2
        d = job / f"restart-{k}" / "node-0"
        d.mkdir(parents=True)
        t = T0 + 1000 * k
        events = [("start", t + 1, {"phase": "train"})]
        if k:
            events.append(("resume", t + 2, {"phase": "train", "step": 2}))
        events += [("step", t + 3 + s, {"phase": "train", "step": s, "loss": 1.0})
                   for s in range(first, 6)]
        _events(d / "train.log", events)
        (d / "job.status").write_text("1 train\n" if k == 0 else "0 train\n")
        os.utime(d / "job.status", (t + 20, t + 20))
    made = report.make(None, run, use_sacct=False, now=T0 + 5000)
    labelled = {(s.allocation, s.step): s.kind for s in made.timeline.segments if s.step}
    assert {labelled[(0, s)] for s in (3, 4, 5)} == {"repeat"}
    assert {labelled[(1, s)] for s in (3, 4, 5)} == {"train"}
    assert labelled[(0, 1)] == labelled[(0, 2)] == "train"
    timeline = svg.picture(made)[0]
    assert timeline.count("steps trained again after a restart step") == 3


@pytest.mark.parametrize("runs", [0, 2])
def test_a_folder_of_runs_or_of_none_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], runs: int) -> None:
    for i in range(runs):
        (tmp_path / f"run-{i}" / "logs").mkdir(parents=True)
    (tmp_path / "notes").mkdir()
    assert main(["report", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    if runs:
        assert "a folder of 2 runs (run-0, run-1), not one run" in err
    else:
        assert "no run in it" in err


# --- the real rehearsal -----------------------------------------------------------------------

def assert_account(run: Path, nodes: int, began: float, ended: float) -> None:
    """The report on a finished rehearsal: node-hours within 2 % of nodes x the wall time
    measured around the command, the parts adding up, and the compile pass from the main
    node's launch to the last node's exit as the flow recorded them."""
    made = report.make(None, run, use_sacct=False)
    outside_h = nodes * (ended - began) / 3600
    assert made.account.nodes == nodes
    assert abs(made.account.allocated_h - outside_h) <= 0.02 * outside_h, \
        (made.account.allocated_h, outside_h)
    assert sum(h for _, h in made.account.parts) == pytest.approx(made.account.allocated_h,
                                                                  rel=0.01)
    assert all(a.ending == "done" for a in made.timeline.allocations)
    (logs,) = [p for p in (run / "logs").iterdir() if p.is_dir()]
    folders = sorted({p.parent.parent for p in logs.glob("**/node-0/compile.times")})
    compile_s = 0.0
    for folder in folders:
        launch, _ = held.times(folder / "node-0" / "compile.times")
        exits = [held.times(p)[1] for p in folder.glob("node-*/compile.times")]
        assert launch is not None and None not in exits
        compile_s += max(e for e in exits if e is not None) - launch
    assert folders and compile_s > 0
    compile_h = dict(made.account.parts)["compile"]
    assert compile_h == pytest.approx(nodes * compile_s / 3600, rel=0.01)
    print(f"report: {made.account.allocated_h * 3600:.1f} node-s allocated, measured outside "
          f"{outside_h * 3600:.1f}; compile pass {compile_h * 3600 / nodes:.1f} s per node")


@pytest.mark.slow
def test_report_on_a_local_rehearsal_agrees_with_the_clock_outside(tmp_path: Path) -> None:
    """`jobgen run llama2-7b --nodes 2 --smoke` then `jobgen report NAME` (about 25 s here)."""
    with socket.socket() as sock:   # rehearsals may run side by side: not the recipe's port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBGEN_")}
    env["JOBGEN_STATE_DIR"] = str(tmp_path / "state")
    jobgen = Path(sys.executable).parent / "jobgen"
    began = time.time()
    proc = subprocess.run([str(jobgen), "run", "llama2-7b", "--nodes", "2", "--smoke",
                           "--set", f"job.master_port={port}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    ended = time.time()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "jobgen-runs" / "llama2-7b-2n-smoke"
    assert_account(run, 2, began, ended)
    shown = subprocess.run([str(jobgen), "report", "--run-dir", str(run), "--no-sacct"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("run llama2-7b-2n-smoke: 1 allocation(s) on 2 node(s)")
    refused = subprocess.run([str(jobgen), "report", "--run-dir", "jobgen-runs"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "it holds one run, llama2-7b-2n-smoke" in refused.stderr


def test_a_slurm_allocation_without_sacct_starts_when_its_controller_began(
        tmp_path: Path) -> None:
    """The batch script's setup before the health gate is held time too (allocation.times)."""
    run = _flat_run(tmp_path)
    job = run / "logs" / "local-1700000000-7"
    slurm = run / "logs" / "4242" / "restart-0"
    slurm.parent.mkdir(parents=True)
    job.rename(slurm)
    (slurm / "held.json").unlink()
    (slurm / "allocation.times").write_text(f"launch {T0 - 30}\n")
    made = report.make(None, run, use_sacct=False, now=T0 + 500)
    (alloc,) = made.timeline.allocations
    assert alloc.start == T0 - 30 and alloc.end == T0 + 90   # the last node's recorded end
    # Setup to the gate (T0-30..T0+2), the gate to the compile launch (T0+4..5), the compile
    # pass's exit to the trainer's start (T0+31..38).
    assert _parts(made)["startup"] == pytest.approx(32 + 1 + 7)


def test_a_rehearsal_killed_before_recording_its_end_is_not_in_progress(tmp_path: Path) -> None:
    run = _flat_run(tmp_path, end=None)
    dead = subprocess.Popen(["true"])
    dead.wait()
    held.write(run / "logs" / "local-1700000000-7",
               held.Held(T0, None, 2, "jobgen run", dead.pid, socket.gethostname()))
    made = report.make(None, run, use_sacct=False, now=T0 + 5000)
    (alloc,) = made.timeline.allocations
    assert alloc.ending == "ended" and alloc.end == T0 + 60   # its last record, not now
    assert "in progress" not in report_text(run, T0 + 5000)
