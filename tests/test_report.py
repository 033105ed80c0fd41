"""`jobgen report` on run folders laid out as jobs write them (node logs with the payloads' events,
health.json, job.status, jobgen-health.jsonl), with known times: the account, the utilisation,
the failure on its node, counted and repeated steps, the outputs. The rehearsal on the real
cluster is tests/test_chaos_rehearsal.py."""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from jobgen.cli import main
from jobgen.reporting import report, timeline

T0 = 1_700_000_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


def _log(path: Path, events: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["torch says hello"]
    lines += [json.dumps({"event": e.pop("event"), **e, "time": _iso(e.pop("t"))}) for e in events]
    path.write_text("\n".join(lines) + "\n")


def _node(folder: Path, node: int, host: str, gate: tuple[float, float],
          status: tuple[int, float] | None) -> None:
    d = folder / f"node-{node}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "host").write_text(host + "\n")
    (d / "health.json").write_text(json.dumps({"seconds": gate[1] - gate[0], "ok": True}))
    os.utime(d / "health.json", (gate[1], gate[1]))
    if status is not None:
        (d / "job.status").write_text(f"{status[0]} train\n")
        os.utime(d / "job.status", (status[1], status[1]))


def _steps(first: int, last: int, start: float, step_s: float = 10.0,
           every: int = 4) -> tuple[list[dict[str, Any]], float]:
    out, t = [], start
    for s in range(first, last + 1):
        t += step_s
        out.append({"event": "step", "phase": "train", "step": s, "t": t, "loss": 5.0 - s / 10,
                    "grad_norm": 1.0, "lr": 1e-3})
        if s % every == 0:
            t += 2.0
            out.append({"event": "checkpoint", "step": s, "t": t})
    return out, t


def make_run(root: Path) -> Path:
    """Allocation 0: node 1 fails the gate (n2 left out). Allocation 1 (n1, n3): compile, steps
    1-10, node 1 (n3) fails 5 s after step 10. Allocation 2: resumes from 8, trains 9-12, done."""
    run = root / "jobgen-runs" / "demo"
    job = run / "logs" / "7"
    a0 = job / "restart-0"
    _node(a0, 0, "n1", (T0 + 1, T0 + 2), None)
    _node(a0, 1, "n2", (T0 + 1, T0 + 2), None)
    (run / "jobgen-health.jsonl").write_text(json.dumps(
        {"job": "7", "allocation": "0", "node": 1, "host": "n2", "check": "devices",
         "action": "left out n2; requeued"}) + "\n")
    a1, s1 = job / "restart-1", T0 + 10
    _log(a1 / "node-0" / "compile.log", [{"event": "start", "phase": "compile", "t": s1 + 5},
                                         {"event": "done", "phase": "compile", "t": s1 + 15}])
    steps, end = _steps(1, 10, s1 + 20)
    _log(a1 / "node-0" / "train.log", [{"event": "start", "phase": "train", "t": s1 + 20},
                                       *steps])
    failed = end + 5
    _node(a1, 0, "n1", (s1 + 1, s1 + 3), (1, failed + 1))
    _node(a1, 1, "n3", (s1 + 1, s1 + 3), (1, failed))
    a2, s2 = job / "restart-2", failed + 20
    steps, end = _steps(9, 12, s2 + 10)
    _log(a2 / "node-0" / "train.log", [{"event": "start", "phase": "train", "t": s2 + 5},
                                       {"event": "resume", "phase": "train", "step": 8,
                                        "t": s2 + 10}, *steps,
                                       {"event": "done", "phase": "train", "step": 12,
                                        "t": end + 1}])
    _node(a2, 0, "n1", (s2 + 1, s2 + 3), (0, end + 3))
    _node(a2, 1, "n3", (s2 + 1, s2 + 3), (0, end + 3))
    return run


def test_the_account_adds_up_and_counts_only_the_steps_that_survive(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    made = report.make(None, run, use_sacct=False)
    t, a = made.timeline, made.account
    assert [x.ending for x in t.allocations] == ["unhealthy", "failed", "done"]
    assert t.allocations[0].excluded == ("n2",)
    one = t.allocations[1]
    assert (one.failed_node, one.failed_host) == (1, "n3")
    assert one.failure_at == pytest.approx(T0 + 10 + 20 + 100 + 4 + 5)
    parts = dict(a.parts)
    assert a.closure < 1e-9
    # Steps 9 and 10 of allocation 1 were trained again in allocation 2.
    counted = {s.step for s in t.segments if s.kind == "train"}
    assert counted == set(range(1, 13))
    assert parts["train"] == pytest.approx(2 * 12 * 10 / 3600)
    assert parts["repeat"] == pytest.approx(2 * (2 * 10 + 5) / 3600)   # 9, 10, and the 5 s lost
    assert parts["gap"] > 0 and parts["compile"] == pytest.approx(2 * 10 / 3600)
    assert a.utilisation == pytest.approx(parts["train"] / a.allocated_h)
    c = a.cluster
    assert c.failures == 1 and c.health_requeues == 1
    assert c.restart_s == pytest.approx(one.failure_at and (t.allocations[2].training_at or 0)
                                        - one.failure_at)
    assert c.load_s == pytest.approx(5.0) and c.checkpoint_write_s == pytest.approx(2.0)
    assert c.checkpoint_interval_s == pytest.approx(40.0)
    assert a.predicted is not None and 0 < a.predicted < 1
    # Held to the model's runs with one failure: that failure struck training (lost 25 s of a
    # 42-s segment), so the run sits nearer them than the expectation at its own rate, which
    # lets a share of its failures strike a restart and cost less.
    given = a.predicted_given_failures
    assert given is not None and given < a.predicted
    assert abs(given - a.utilisation) < abs(a.predicted - a.utilisation)


def test_report_text_json_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    page = tmp_path / "r.html"
    assert main(["report", "--run-dir", str(run), "--no-sacct", "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"effective utilisation: \d+\.\d\d %", out)
    assert "failure: allocation 1 at" in out and "n3, after step 10" in out
    assert "health gate: allocation 0 left out n2" in out
    assert "as plan's inputs: --node-mtbf-hours" in out
    assert "the same model among its runs with 1 failure, as this one (drawn): " in out
    html = page.read_text()
    assert "<svg" in html and "left out: n2" in html
    assert not re.search(r"(src|href)=\"?(https?:)?//", html)   # nothing fetched
    import xml.dom.minidom
    pictures = re.findall(r"<svg.*?</svg>", html, re.S)
    assert len(pictures) == 4    # the timeline, loss, gradient norm, learning rate
    for picture in pictures:
        xml.dom.minidom.parseString(picture)   # well-formed, or a browser shows nothing
    assert main(["report", "--run-dir", str(run), "--no-sacct", "--json"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert data["parts"]["train"] > 0 and len(data["curves"]["series"]) == 14
    assert data["curves"]["restarts"] == [{"step": 8, "time": pytest.approx(
        data["timeline"]["allocations"][2]["training_at"]), "allocation": 2, "kind": "resume"}]


def test_a_run_in_progress_is_reported_up_to_now(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    last = run / "logs" / "7" / "restart-2"
    for node in (0, 1):
        (last / f"node-{node}" / "job.status").unlink()
    text = (last / "node-0" / "train.log").read_text().splitlines()
    (last / "node-0" / "train.log").write_text("\n".join(text[:-2]) + "\n")
    made = timeline.build(run, now=T0 + 10_000, use_sacct=False)
    assert made.allocations[-1].ending == "running"
    assert made.allocations[-1].end == T0 + 10_000


def test_a_missing_run_is_one_line_and_status_2(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path))
    assert main(["report", "nosuchrun"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuchrun: no run of that name" in err
    assert main(["report", "--run-dir", str(tmp_path)]) == 2
    assert "no run in it" in capsys.readouterr().err
    (tmp_path / "logs").mkdir()
    assert main(["report", "--run-dir", str(tmp_path)]) == 2
    assert "nothing to report yet" in capsys.readouterr().err


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from jobgen.reporting import png
    made = report.make(None, make_run(tmp_path), use_sacct=False)
    png.write(made, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_from_run_takes_the_measured_failure_rate_and_restart_cost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.reporting import inputs
    from jobgen.runs import ledger as runs
    monkeypatch.setenv("JOBGEN_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("jobgen.reporting.sacct.spans", lambda job: None)
    run = make_run(tmp_path)
    assert runs.record(runs.Run("demo", "slurm", "7", "llama2-7b", 2, "", str(run),
                                runs.now())) is None
    cluster = report.make("demo", None, use_sacct=False).account.cluster
    options: dict[str, Any] = {"node_mtbf_hours": None, "restart_s": None}
    taken = inputs.fill(options, ["demo"])
    assert options["node_mtbf_hours"] == pytest.approx(cluster.risk_h)
    assert options["restart_s"] == pytest.approx(cluster.restart_s - 5.0)
    assert len(taken) == 2
    given = {"node_mtbf_hours": 5000.0, "restart_s": None}
    inputs.fill(given, ["demo"])
    assert given["node_mtbf_hours"] == 5000.0    # the command line wins


def test_nemo_steps_come_from_its_tensorboard_files(tmp_path: Path) -> None:
    """NeMo writes no JSON events: its steps (and curves) are read from TensorBoard, placed in
    the allocation whose node files frame them."""
    pytest.importorskip("torch.utils.tensorboard")
    from torch.utils.tensorboard import SummaryWriter
    run = tmp_path / "nemo-run"
    alloc = run / "logs" / "5" / "restart-0"
    _node(alloc, 0, "n1", (T0, T0 + 2), (0, T0 + 100))
    _node(alloc, 1, "n2", (T0, T0 + 2), (0, T0 + 100))
    (alloc / "node-0" / "train.log").write_text("[NeMo I] training\n")
    writer = SummaryWriter(str(run / "nemo"))
    for n in range(1, 9):
        for tag, value in (("reduced_train_loss", 5.0 - n / 10), ("gradient_norm", 1.0),
                           ("lr", 1e-4)):
            writer.add_scalar(tag, value, n, walltime=T0 + 20 + 10 * n)
    writer.close()
    made = report.make(None, run, use_sacct=False)
    assert len(made.curves.series) == 8 and made.curves.series[0]["loss"] == pytest.approx(4.9)
    trained = [s for s in made.timeline.segments if s.kind == "train"]
    assert [s.step for s in trained] == list(range(1, 9))
    assert made.account.utilisation == pytest.approx(80 / 100, abs=0.01)


def test_a_hostile_host_name_does_not_reach_the_terminal(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path)
    (run / "logs" / "7" / "restart-1" / "node-1" / "host").write_text("n3\x1b[2J\n")
    assert main(["report", "--run-dir", str(run), "--no-sacct"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "n3\\x1b[2J, after step 10" in out


def test_a_time_limit_stop_before_the_first_step_is_counted_once(tmp_path: Path) -> None:
    """The warning came while the trainers started (they stopped at step 0, nothing trained):
    everything before the first training step is a fixed cost already, so plan's figure for a
    run without failures must equal the measurement (it was counted twice: 13.6 % vs 27.1 %)."""
    run = tmp_path / "jobgen-runs" / "early-stop"
    job = run / "logs" / "9"
    a0 = job / "restart-0"
    _log(a0 / "node-0" / "train.log", [{"event": "start", "phase": "train", "t": T0 + 20},
                                       {"event": "stopped", "phase": "train", "step": 0,
                                        "signal": "USR1", "t": T0 + 30}])
    (a0 / "stopped.json").write_text('{"step": 0, "signal": "USR1"}\n')
    (a0 / "time-limit").write_text(f"{int(T0 + 15)} 60\n")
    for node, host in ((0, "n1"), (1, "n2")):
        _node(a0, node, host, (T0 + 1, T0 + 3), (0, T0 + 32))
    a1, s1 = job / "restart-1", T0 + 50
    steps, end = _steps(1, 12, s1 + 10)
    _log(a1 / "node-0" / "train.log", [{"event": "start", "phase": "train", "t": s1 + 5},
                                       *steps, {"event": "done", "phase": "train", "step": 12,
                                                "t": end + 1}])
    for node, host in ((0, "n1"), (1, "n2")):
        _node(a1, node, host, (s1 + 1, s1 + 3), (0, end + 2))
    made = report.make(None, run, use_sacct=False)
    assert [x.ending for x in made.timeline.allocations] == ["stopped", "done"]
    a = made.account
    assert a.cluster.failures == 0 and a.cluster.stops == 1
    assert a.predicted == pytest.approx(a.utilisation, abs=0.005)


def test_a_background_save_shows_its_stall_apart_from_its_write(tmp_path: Path) -> None:
    """Steps of 10 s; step 4 is saved in the background: the loop copies the state for 1.5 s
    right after step 4 (no event marks it: inside step 5's interval), the write goes on beside
    steps 5 and 6, and the seal after step 6 takes 0.5 s (the event: stall 2.0, write 12.0).
    Step 8 is saved in place (2 s, stall = write). The copy and the seal are the save's
    (checkpoint), the write is training; nothing is lost."""
    run = tmp_path / "jobgen-runs" / "async"
    a0, t = run / "logs" / "3" / "restart-0", T0 + 10
    events: list[dict[str, Any]] = [{"event": "start", "phase": "train", "t": t}]
    for step in range(1, 9):
        t += 10.0 + (1.5 if step == 5 else 0.0)
        events.append({"event": "step", "phase": "train", "step": step, "t": t})
        if step == 6:
            t += 0.5
            events.append({"event": "checkpoint", "step": 4, "async": True, "stall_s": 2.0,
                           "write_s": 12.0, "t": t})
        if step == 8:
            t += 2.0
            events.append({"event": "checkpoint", "step": 8, "async": False, "stall_s": 2.0,
                           "write_s": 2.0, "t": t})
    events.append({"event": "done", "phase": "train", "step": 8, "t": t + 0.1})
    _log(a0 / "node-0" / "train.log", events)
    for node, host in ((0, "n1"), (1, "n2")):
        _node(a0, node, host, (T0 + 1, T0 + 3), (0, t + 1))
    made = report.make(None, run, use_sacct=False)
    segs = [s for s in made.timeline.segments if s.kind in ("train", "checkpoint", "repeat")]
    saves = [(s.step, round(s.end - s.start, 3)) for s in segs if s.kind == "checkpoint"]
    assert saves == [(4, 1.5), (4, 0.5), (8, 2.0), (None, 0.1)]
    # The copy is cut from the start of step 5's interval, right after step 4.
    copy = next(s for s in segs if s.kind == "checkpoint" and s.step == 4)
    four = next(s for s in segs if s.kind == "train" and s.step == 4)
    five = next(s for s in segs if s.kind == "train" and s.step == 5)
    assert copy.start == pytest.approx(four.end) and five.start == pytest.approx(copy.end)
    trained = [round(s.end - s.start, 3) for s in segs if s.kind == "train"]
    assert trained == [10.0] * 8          # the write beside steps 5 and 6 is training time
    parts = dict(made.account.parts)
    assert parts["repeat"] == 0.0 and parts["checkpoint"] == pytest.approx(2 * 4.1 / 3600)
    c = made.account.cluster
    assert c.checkpoint_stall_s == pytest.approx(2.0) and c.checkpoint_write_s == pytest.approx(7.0)
    # Exposed from the copy's end to the seal (after step 6): a failure then resumes from the
    # save before; the save in place has no such lag.
    assert c.seal_lag_s == pytest.approx(20.5)
    from jobgen.reporting.text import text
    shown = text(made.timeline, made.account, made.curves, "async")
    assert "stall 2.0 s (write 7.0 s, sealed 20.5 s after its copy)" in shown


def test_a_restart_cut_short_still_counts_its_wait_for_nodes(tmp_path: Path) -> None:
    """Allocation 1 fails; the requeue waits 61 s for nodes and a second failure strikes
    allocation 2's start-up; after 11 s more, allocation 3 starts up in 7 s and trains. The
    restart is its parts' means (failure to allocation end (1 + 0) / 2, wait (61 + 11) / 2,
    start-up 7), not only the restarts no failure cut: that would drop the 61-s wait."""
    run = tmp_path / "jobgen-runs" / "cut"
    job = run / "logs" / "5"
    a1, s1 = job / "restart-0", T0
    steps, end = _steps(1, 4, s1 + 10)
    _log(a1 / "node-0" / "train.log", [{"event": "start", "phase": "train", "t": s1 + 5},
                                       *steps])
    _node(a1, 0, "n1", (s1 + 1, s1 + 3), (1, end + 6))
    _node(a1, 1, "n2", (s1 + 1, s1 + 3), (1, end + 5))
    a2, s2 = job / "restart-1", end + 6 + 60
    _node(a2, 0, "n1", (s2 + 1, s2 + 3), (1, s2 + 4))
    _node(a2, 1, "n2", (s2 + 1, s2 + 3), (1, s2 + 4))
    a3, s3 = job / "restart-2", s2 + 4 + 10
    steps, end = _steps(5, 8, s3 + 8)
    _log(a3 / "node-0" / "train.log", [{"event": "start", "phase": "train", "t": s3 + 5},
                                       {"event": "resume", "phase": "train", "step": 4,
                                        "t": s3 + 8}, *steps,
                                       {"event": "done", "phase": "train", "step": 8,
                                        "t": end + 1}])
    _node(a3, 0, "n1", (s3 + 1, s3 + 3), (0, end + 2))
    _node(a3, 1, "n2", (s3 + 1, s3 + 3), (0, end + 2))
    made = report.make(None, run, use_sacct=False)
    assert [x.ending for x in made.timeline.allocations] == ["failed", "failed", "done"]
    c = made.account.cluster
    assert c.failures == 2 and c.seal_lag_s is None
    assert c.restart_s == pytest.approx(0.5 + (61 + 11) / 2 + 7)
    assert c.restart_s > made.timeline.allocations[2].training_at - (  # type: ignore[operator]
        made.timeline.allocations[1].failure_at or 0)      # the one restart nothing cut


def test_saves_in_the_background_after_every_step(tmp_path: Path) -> None:
    """A save after every step (the chaos rehearsal's): after step k's event the loop seals
    save k-1 (0.2 s, its checkpoint event), then copies save k (0.5 s, no event) and trains
    step k+1 (10 s). Each copy is cut from the step after that seal; each save is exposed from
    its copy's end to its seal, a step and a seal later (10.2 s)."""
    run = tmp_path / "jobgen-runs" / "every"
    a0, t = run / "logs" / "4" / "restart-0", T0 + 10
    events: list[dict[str, Any]] = [{"event": "start", "phase": "train", "t": t}]
    for step in range(1, 5):
        t += 10.0 + (0.5 if step > 1 else 0.0)
        events.append({"event": "step", "phase": "train", "step": step, "t": t})
        if step > 1:
            t += 0.2
            events.append({"event": "checkpoint", "step": step - 1, "async": True,
                           "stall_s": 0.7, "write_s": 0.01, "t": t})
    events.append({"event": "done", "phase": "train", "step": 4, "t": t + 0.1})
    _log(a0 / "node-0" / "train.log", events)
    for node, host in ((0, "n1"), (1, "n2")):
        _node(a0, node, host, (T0 + 1, T0 + 3), (0, t + 1))
    made = report.make(None, run, use_sacct=False)
    segs = [(s.kind, s.step, round(s.end - s.start, 3)) for s in made.timeline.segments
            if s.kind in ("train", "checkpoint")]
    assert segs == [("train", 1, 10.0), ("checkpoint", 1, 0.5), ("train", 2, 10.0),
                    ("checkpoint", 1, 0.2), ("checkpoint", 2, 0.5), ("train", 3, 10.0),
                    ("checkpoint", 2, 0.2), ("checkpoint", 3, 0.5), ("train", 4, 10.0),
                    ("checkpoint", 3, 0.2), ("checkpoint", None, 0.1)]
    assert made.account.cluster.seal_lag_s == pytest.approx(10.2)
