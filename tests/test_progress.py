"""Waiting shows progress on a terminal (the newest state and the time waited, redrawn) and only
the state lines elsewhere."""
from __future__ import annotations

import io
import time

from jobgen.runs.progress import Ticker


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_state_and_the_time_redrawn(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TERM", "xterm")
    out = _Terminal()
    with Ticker(out, every=0.05) as ticker:
        ticker.say("job 7: PENDING")
        time.sleep(0.2)
        ticker.say("job 7: RUNNING\n")
        time.sleep(0.2)
    text = out.getvalue()
    assert "\r\x1b[Kjob 7: PENDING\n" in text and "\r\x1b[Kjob 7: RUNNING\n" in text
    assert "\r\x1b[Kjob 7: PENDING (waited 0:00:00)" in text
    assert "\r\x1b[Kjob 7: RUNNING (waited 0:00:00)" in text
    assert text.endswith("\r\x1b[K")          # the redrawn line is gone at the end


def test_not_a_terminal_gets_only_the_lines() -> None:
    out = io.StringIO()
    with Ticker(out, every=0.01) as ticker:
        ticker.say("job 7: PENDING")
        time.sleep(0.05)
        ticker.say("job 7: COMPLETED")
    assert out.getvalue() == "job 7: PENDING\njob 7: COMPLETED\n"


def test_the_newest_step_comes_from_node_0s_log(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from jobgen.runs.progress import newest_step
    assert newest_step(str(tmp_path), "42") is None
    log = tmp_path / "logs" / "42" / "restart-0" / "node-0" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text('x\n{"event": "step", "step": 3, "loss": 1.0}\n'
                   '{"event": "step", "step": 4, "loss": 0.9}\n{"event": "beat"}\n')
    assert newest_step(str(tmp_path), "42") == 4
    monkeypatch.setenv("TERM", "xterm")
    out = _Terminal()
    with Ticker(out, every=0.05, steps=lambda: "step 4/24") as ticker:
        ticker.say("job 42: RUNNING")
        time.sleep(0.2)
    assert "job 42: RUNNING (waited 0:00:00, step 4/24)" in out.getvalue()
