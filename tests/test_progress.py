"""Waiting shows progress on a terminal (the newest state and the time waited, redrawn) and only
the state lines elsewhere."""
from __future__ import annotations

import io
import time

from jobgen.progress import Ticker


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
