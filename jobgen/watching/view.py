"""How `jobgen watch` shows what it sees: a live line on a terminal, plain lines when stdout is
a file or a pipe, JSON lines for machines. Alerts, actions and notes always get a line."""
from __future__ import annotations

import json
import math
import sys
import time
from typing import Any, Optional, TextIO

from ..plumbing.errors import printable_lines
from .observations import Action, Alert, Observation, iso


def _num(value: Optional[float], digits: int = 4) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "nan"
    return f"{value:.{digits}g}"


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def status_text(st: Any) -> str:
    step = "-" if st.step is None else f"{st.step}" + (f"/{st.max_steps}" if st.max_steps else "")
    rate = (f"{st.tokens_per_s:,.0f} tok/s" if st.tokens_per_s is not None else
            f"{st.samples_per_s:.3g} samples/s" if st.samples_per_s is not None else "- /s")
    return (f"job {st.job_id or '-'} {st.state or '-'}  step {step}  loss {_num(st.loss)}  "
            f"gnorm {_num(st.grad_norm)}  {rate}  eta {_duration(st.eta_s)}"
            + (f"  alloc {st.restart}" if st.restart else "")
            + f"  last alert {st.last_alert or '-'}")


def summary_lines(summary: Any) -> list[str]:
    lines = [f"summary: job {summary.job_id or '-'} {summary.state or '-'}, last step "
             f"{summary.last_step if summary.last_step is not None else '-'}, "
             f"{summary.allocations} allocation(s), "
             f"{getattr(summary, 'restarts_in_place', 0)} restart(s) in place, "
             f"{summary.steps_lost} step(s) trained again after restarts"]
    ended = getattr(summary, "ended", "")
    if ended:
        lines.append(f"  {ended}")
    if not summary.alerts:
        ended_badly = getattr(summary, "failed", False) or getattr(summary, "cancelled", False)
        lines.append(("  no alerts before it" if ended_badly else "  no alerts")
                     if summary.steps_read else
                     "  nothing to judge: not one training step was read")
    kinds: dict[str, list[Alert]] = {}
    for alert in summary.alerts:
        kinds.setdefault(alert.kind, []).append(alert)
    for kind, alerts in kinds.items():
        steps = ", ".join(str(a.step) for a in alerts if a.step is not None)
        lines.append(f"  {kind}: {len(alerts)}" + (f" (steps {steps})" if steps else ""))
    for action in summary.actions:
        lines.append(f"  action {action.what} on {action.alert}: "
                     f"{'done' if action.ok else 'FAILED'}: {action.result}")
    lines += [f"  note: {note}" for note in summary.notes]
    return lines


class PlainView:
    """One line per alert, action and state change, and a status line every `every` seconds."""

    def __init__(self, out: Optional[TextIO] = None, every: float = 30.0) -> None:
        # sys.stdout when the view is made, not when this module was imported (a caller may
        # have replaced it since: click's test runner, a redirect).
        self.out, self.every, self.shown = out or sys.stdout, every, 0.0

    def _line(self, text: str) -> None:
        self.out.write(printable_lines(text) + "\n")
        self.out.flush()

    def state(self, job_id: str, state: str) -> None:
        self._line(f"{iso(time.time())} " + (f"job {job_id}: {state}" if job_id
                                              else "a recorded run folder"))

    def observation(self, obs: Observation) -> None:
        pass

    def alert(self, alert: Alert) -> None:
        self._line(f"{iso(alert.time)} ALERT {alert.kind}: {alert.message}")

    def action(self, action: Action) -> None:
        self._line(f"{iso(action.time)} ACTION {action.what} ({action.alert}): "
                   f"{'done' if action.ok else 'FAILED'}: {action.result}")

    def note(self, text: str) -> None:
        self._line(f"{iso(time.time())} note: {text}")

    def status(self, st: Any) -> None:
        now = time.monotonic()
        if st.step is not None and now - self.shown >= self.every:
            self.shown = now
            self._line(f"{iso(time.time())} {status_text(st)}")

    def summary(self, summary: Any) -> None:
        for line in summary_lines(summary):
            self._line(line)


class TerminalView(PlainView):
    """The status line redrawn in place; alerts and actions scroll above it."""

    def __init__(self, out: Optional[TextIO] = None) -> None:
        super().__init__(out, every=0.0)
        self.current = ""

    def _line(self, text: str) -> None:
        self.out.write("\r\x1b[K" + printable_lines(text) + "\n" + self.current)
        self.out.flush()

    def status(self, st: Any) -> None:
        self.current = printable_lines(status_text(st))[:self._width()]
        self.out.write("\r\x1b[K" + self.current)
        self.out.flush()

    def summary(self, summary: Any) -> None:
        self.current = ""
        self.out.write("\r\x1b[K")
        super().summary(summary)

    @staticmethod
    def _width() -> int:
        import shutil
        return max(40, shutil.get_terminal_size((120, 24)).columns - 1)


class JsonView:
    """One JSON object per line: every training step, state change, alert, action and note, and
    the summary last."""

    def __init__(self, out: Optional[TextIO] = None) -> None:
        self.out = out or sys.stdout

    def _emit(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record, sort_keys=True, allow_nan=False,
                                  default=str) + "\n")
        self.out.flush()

    def state(self, job_id: str, state: str) -> None:
        self._emit({"type": "state", "job_id": job_id, "state": state, "time": iso(time.time())})

    def observation(self, obs: Observation) -> None:
        record: dict[str, Any] = {"type": "step", "time": iso(obs.time), "restart": obs.restart,
                                  "step": obs.step, "source": obs.source}
        for key in ("loss", "grad_norm", "param_norm", "lr", "consumed", "samples_per_s"):
            value = getattr(obs, key)
            if value is not None:
                record[key] = value if not isinstance(value, float) or math.isfinite(value) \
                    else None
        self._emit(record)

    def alert(self, alert: Alert) -> None:
        self._emit({"type": "alert", **_finite(alert.as_dict())})

    def action(self, action: Action) -> None:
        self._emit({"type": "action", **action.as_dict()})

    def note(self, text: str) -> None:
        self._emit({"type": "note", "message": text, "time": iso(time.time())})

    def status(self, st: Any) -> None:
        pass

    def summary(self, summary: Any) -> None:
        self._emit({"type": "summary", **_finite(summary.as_dict())})


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
