"""Saves that do not stop training (payload/common/background.py, loop.sealed_save): a background
save is sealed only after every rank's last byte, one is in flight at a time, and one that fails
on any rank leaves its step unsealed, so a resume picks the step before."""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload"))

from common import background, checkpoints, loop  # noqa: E402
from common.events import EventLog, read_events  # noqa: E402


def _log() -> tuple[EventLog, io.StringIO]:
    out = io.StringIO()
    return EventLog(0, stream=out, env={}), out


def _pending(future: Future, sealed: list[int], log: EventLog, step: int = 4) -> Any:
    def seal() -> tuple[str, Path]:
        sealed.append(step)
        return "checkpoint", Path(f"step_{step}")
    return background.Pending(Path("ckpt"), step, future, seal, log, 0.0, 0.5)


@pytest.fixture(autouse=True)
def nothing_in_flight() -> Any:
    background._pending = None
    yield
    background._pending = None


def test_seal_waits_for_the_last_byte_and_reports_stall_apart_from_write() -> None:
    log, out = _log()
    future: Future = Future()
    sealed: list[int] = []
    background.start(_pending(future, sealed, log))
    background.finish(wait=False)            # still writing: training goes on, nothing sealed
    assert sealed == [] and background.pending() is not None
    future.set_result(None)
    background.finish(wait=False)
    assert sealed == [4] and background.pending() is None
    (event,) = read_events(out.getvalue())
    assert event["event"] == "checkpoint" and event["async"] is True
    assert {"stall_s", "write_s"} <= set(event)


def test_the_wait_for_a_write_is_reported_apart_from_the_staging() -> None:
    """A save whose write is still going when the next save comes: the loop waits for its last
    byte, and that wait is its event's wait_s (part of stall_s). One done by its seal's poll
    waited for nothing; the end of a pass waits for its last save in stall_s only."""
    log, out = _log()
    future: Future = Future()
    background.start(_pending(future, [], log))
    threading.Timer(0.2, future.set_result, (None,)).start()
    background.finish(wait=True, next_save=True)   # the next save, before the last byte
    done: Future = Future()
    done.set_result(None)
    background.start(_pending(done, [], log, step=8))
    background.finish(wait=False)            # the poll at a step boundary finds it written
    last: Future = Future()
    background.start(_pending(last, [], log, step=12))
    threading.Timer(0.2, last.set_result, (None,)).start()
    background.finish(wait=True)             # the end of the pass waits for its last save
    waited, polled, ended = read_events(out.getvalue())
    assert 0 < waited["wait_s"] <= waited["stall_s"] and waited["step"] == 4
    assert polled["wait_s"] == 0 and polled["step"] == 8
    assert ended["wait_s"] == 0 and ended["stall_s"] > 0.5 and ended["step"] == 12


def test_at_most_one_save_in_flight() -> None:
    log, _ = _log()
    background.start(_pending(Future(), [], log))
    with pytest.raises(RuntimeError, match="still in flight"):
        background.start(_pending(Future(), [], log, step=8))


def test_a_failed_background_write_is_never_sealed() -> None:
    log, out = _log()
    future: Future = Future()
    sealed: list[int] = []
    background.start(_pending(future, sealed, log))
    future.set_exception(OSError("disk full"))
    with pytest.raises(background.SaveFailed, match="previous checkpoint"):
        background.finish(wait=True)
    assert sealed == [] and background.pending() is None
    (event,) = read_events(out.getvalue())
    assert event["event"] == "checkpoint_failed" and "disk full" in event["error"]


def test_a_synchronous_save_reports_its_whole_time_as_stall(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    import torch.distributed as dist
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    log, out = _log()
    loop.sealed_save(tmp_path, 3, {"consumed_samples": 12}, 0, 2, log,
                     lambda d: (d / "w.pt").write_bytes(b"x") and None)
    (event,) = read_events(out.getvalue())
    assert event["async"] is False and event["stall_s"] == event["write_s"]
    assert checkpoints.newest_complete(tmp_path).step == 3   # type: ignore[union-attr]


# ------------------------------------------------------------ two ranks over gloo, in-process

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _two_ranks(rank: int, port: int, root: str, result: str) -> None:
    """Rank ``rank`` of two: step 2 saved in the background (sealed only once both writes are
    released), then step 4 whose write fails on rank 1 only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ckpt = Path(root)
    log = EventLog(rank, stream=io.StringIO(), env={})
    seen: dict[str, Any] = {}
    release = threading.Event()
    pool_future: Future = Future()

    def slow_write(directory: Path) -> Future:
        def work() -> None:
            release.wait(30)
            (directory / f"part-{rank}.bin").write_bytes(b"x" * 1000)
            pool_future.set_result(None)
        threading.Thread(target=work, daemon=True).start()
        return pool_future

    loop.sealed_save(ckpt, 2, {"consumed_samples": 8}, rank, 3, log, slow_write)
    dist.barrier()
    seen["marker_while_writing"] = (ckpt / "step_00000002" / "COMPLETE").exists()
    background.finish(wait=False)   # not done anywhere: nothing sealed, still in flight
    seen["in_flight"] = background.pending() is not None
    release.set()
    background.finish(wait=True)
    seen["sealed_after"] = (ckpt / "step_00000002" / "COMPLETE").exists()

    def failing_write(directory: Path) -> Future:
        future: Future = Future()
        (directory / f"part-{rank}.bin").write_bytes(b"y" * 10)
        if rank == 1:
            future.set_exception(OSError("cut off mid-write"))
        else:
            future.set_result(None)
        return future

    loop.sealed_save(ckpt, 4, {"consumed_samples": 16}, rank, 3, log, failing_write)
    try:
        background.finish(wait=True)
        seen["failed"] = False
    except background.SaveFailed:
        seen["failed"] = True
    seen["resume_tag"] = loop.agreed_newest(ckpt, rank)
    Path(result, f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def test_two_ranks_seal_after_completion_and_a_failure_leaves_the_previous_step(
        tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch.multiprocessing as mp
    mp.spawn(_two_ranks, args=(_free_port(), str(tmp_path / "ckpt"), str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"marker_while_writing": False, "in_flight": True, "sealed_after": True,
                        "failed": True, "resume_tag": "step_00000002"}, (rank, seen)
    assert not (tmp_path / "ckpt" / "step_00000004" / "COMPLETE").exists()


# ------------------------------------------------------------- the smoke trainer, end to end

@pytest.mark.deepspeed
@pytest.mark.slow
def test_smoke_trainer_background_save_failure_resumes_from_the_step_before(
        tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", JOBGEN_SMOKE_SAVE_FAIL_AT_STEP="6")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           str(ROOT / "payload" / "smoke" / "train.py"), "--max-steps", "9",
           "--micro-batch-size", "2", "--checkpoint-every", "3", "--keep-checkpoints", "2",
           "--output-dir", str(out), "--phase", "train"]
    failed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    events = read_events(failed.stdout)
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [3]
    assert [e["step"] for e in events if e["event"] == "checkpoint_failed"] == [6]
    assert checkpoints.newest_complete(out / "checkpoints").step == 3  # type: ignore[union-attr]
    env.pop("JOBGEN_SMOKE_SAVE_FAIL_AT_STEP")
    cmd[cmd.index("--master_port") + 1] = str(_free_port())
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    events = read_events(again.stdout)
    assert [e["step"] for e in events if e["event"] == "resume"] == [3]
    assert [e["step"] for e in events if e["event"] == "checkpoint"] == [6, 9]


# ------------------------------------------------------------------------ the report's figures

def _run_with_saves(tmp_path: Path, third: dict[str, Any], sixth: dict[str, Any]) -> Any:
    """A finished one-allocation run (steps of 2 s) with background saves of steps 3 and 6
    whose checkpoint events carry `third` and `sixth`, as `jobgen report` makes it."""
    from jobgen.reporting import report
    from tests.test_report_accounts import T0, _events, _flat_run
    run = _flat_run(tmp_path)
    log = run / "logs" / "local-1700000000-7" / "node-0" / "train.log"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    events = [(e.pop("event"), T0 + 40 + 2 * int(e.get("step", 0)), e)
              for e in lines if e.pop("time", None)]
    events.insert(6, ("checkpoint", T0 + 46.5, {"step": 3, "async": True, **third}))
    events.insert(10, ("checkpoint", T0 + 52.5, {"step": 6, "async": True, **sixth}))
    _events(log, events)
    return report.make(None, run, use_sacct=False, now=T0 + 500)


def test_report_shows_each_saves_stall_apart_from_its_write(tmp_path: Path) -> None:
    """The checkpoint events' stall_s and write_s reach the report: each save listed, the
    cluster's stall and write apart, and the account's model costs a save by its stall."""
    from jobgen.reporting import text
    made = _run_with_saves(tmp_path, {"stall_s": 0.25, "write_s": 4.0},
                           {"stall_s": 0.75, "write_s": 6.0})
    (alloc,) = made.timeline.allocations
    assert alloc.saves == ((3, 0.25, 4.0), (6, 0.75, 6.0))
    cluster = made.account.cluster
    assert cluster.checkpoint_stall_s == pytest.approx(0.5)
    assert cluster.checkpoint_write_s == pytest.approx(5.0)
    shown = text.text(made.timeline, made.account, made.curves, made.name)
    assert "saves, step: stall/write in s: 3: 0.25/4.00, 6: 0.75/6.00" in shown
    assert "checkpoint stall 0.5 s (write 5.0 s)" in shown
    assert "saves closer together than a write" not in shown


def test_report_says_when_saves_came_closer_than_a_write(tmp_path: Path) -> None:
    """A save whose stall was mostly the wait for its own write (the next save came before its
    last byte, as on a GPU saving every few steps): the report says how many and how long."""
    from jobgen.reporting import text
    made = _run_with_saves(tmp_path, {"stall_s": 3.8, "write_s": 4.0, "wait_s": 3.55},
                           {"stall_s": 0.75, "write_s": 6.0, "wait_s": 0.002})
    (alloc,) = made.timeline.allocations
    assert alloc.save_waits == ((3, 3.55), (6, 0.002))
    shown = text.text(made.timeline, made.account, made.curves, made.name)
    assert ("saves closer together than a write: 1 of 2 waited 3.55 s in all for their own "
            "write") in shown
    # a wait the loop cannot have had (longer than the save's whole stall) is left out
    odd = _run_with_saves(tmp_path / "odd", {"stall_s": 0.5, "write_s": 4.0, "wait_s": 1e308},
                          {"stall_s": 0.75, "write_s": 6.0, "wait_s": float("nan")})
    assert odd.timeline.allocations[0].save_waits == ()
