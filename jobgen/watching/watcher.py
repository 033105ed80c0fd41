"""The watch loop: read what is new, judge it, act once per incident, show it, sum it up
(summary.py: the live status, the summary and the exit status)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..plumbing.errors import JobgenError
from . import actions
from .detectors import Detectors
from .observations import Action, Alert, Observation
from .readers import RunReader
from .summary import Status, Summary

WATCH_LOG = "watch.jsonl"     # in the run folder: every alert and action, one JSON object each


@dataclass(frozen=True)
class Policy:
    on_hang: Optional[str] = None
    on_diverge: Optional[str] = None
    notify: Optional[str] = None       # a shell command: run for every action taken, and as
                                       # the action of a category set to "notify"
    max_actions: int = 3

    def action_for(self, alert: Alert) -> Optional[str]:
        return {"hang": self.on_hang, "diverge": self.on_diverge}.get(alert.category)


class Watch:
    """One run under watch. `controller` is None for a recorded run folder (nothing to act on:
    the observations' own times stand in for the clock, so gaps in the stream count as hangs)."""

    def __init__(self, reader: RunReader, detectors: Detectors, policy: Policy,
                 controller: Optional[actions.Controller], view: Any, *,
                 run_name: str = "", max_steps: Optional[int] = None,
                 seq_length: Optional[int] = None, clock: Callable[[], float] = time.time,
                 log_path: Optional[Path] = None,
                 running: Callable[[str], bool] = lambda state: state == "RUNNING") -> None:
        self.reader, self.detectors, self.policy = reader, detectors, policy
        self.controller, self.view, self.clock = controller, view, clock
        self.run_name, self.seq_length = run_name, seq_length
        self.log_path = log_path     # created with the first alert (the run folder exists then)
        self.running = running       # whether the scheduler's state means the job runs
        self.status = Status(job_id=controller.job_id if controller else "",
                             max_steps=max_steps)
        self.summary = Summary(self.status.job_id, "")
        self.acted_on: Optional[int] = None     # allocation an action was taken on
        self.requeued_on: Optional[int] = None  # allocation the job left for the queue
        self.stopped = False
        self.blamed: dict[int, int] = {}
        self.notified: set[tuple[str, int]] = set()   # (category, allocation) already notified
        self.finished = False

    # --- one round ------------------------------------------------------------------------------

    def poll(self) -> bool:
        """Read, judge and act once; returns whether the job has ended."""
        now = self.clock()
        finished, state = False, "RECORDED"
        if self.controller is not None:
            state, finished = self.controller.state()
        if state != self.status.state:
            if (self.controller is not None and self.running(state)
                    and not self.running(self.status.state)
                    and self.detectors.last_progress is not None):
                # Started again after waiting in the queue (a requeue): neither that wait nor
                # the new allocation's start-up before its trainers log is a hang.
                self.requeued_on = self.detectors.restart
            self.status.state = state
            self.view.state(self.status.job_id, state)
        alerts: list[Alert] = []
        observed = self.reader.read()
        now = self.clock()            # after reading: nothing read is newer than the alert
        for obs in observed:
            if self.controller is None:   # a recording: its own times are the clock
                alerts += self.detectors.tick(obs.time)
            alerts += self.detectors.observe(obs, now if self.controller else obs.time)
            self._show(obs)
        if self.controller is not None and self.running(state) and not self._waiting():
            alerts += self.detectors.tick(now, self.reader.silence(now),
                                          self.reader.hosts(self.detectors.restart))
        done = len(self.reader.allocations) if finished or self.controller is None \
            else len(self.reader.allocations) - 1
        alerts += self.detectors.restarts([a.ends() for a in self.reader.allocations[:done]],
                                          self.blamed)
        for alert in alerts:      # every alert is shown and logged before anything is done
            self._record(alert)
        for alert in alerts:
            self._decide(alert)
        self.view.status(self.status)
        self.finished = finished
        return finished

    def run(self, poll_s: float) -> Summary:
        try:
            while not self.poll():
                if self.controller is None:
                    break
                time.sleep(poll_s)
            if self.controller is not None:
                self.poll()   # what the job wrote as it ended
        except KeyboardInterrupt:
            self.finish()     # Ctrl-C: the summary so far, then the usual exit status 130
            raise
        return self.finish()

    def finish(self) -> Summary:
        s = self.summary
        s.job_id = self.status.job_id
        s.state = self.status.state
        s.steps_lost = self.detectors.steps_lost
        s.allocations = len(self.reader.allocations) or (self.detectors.restart + 1)
        s.restarts_in_place = self.detectors.restarts_in_place
        s.last_step = self.status.step
        s.notes = list(self.reader.notes) + self.reader.skipped_notes()
        if self.controller is None:   # a recording: how it ended is in its nodes' files
            from .ending import ended
            line, how = ended(self.reader, s.last_step)
            s.ended, s.failed, s.cancelled = line or "", how == "failed", how == "cancelled"
        self.view.summary(s)
        return s

    # --- what was seen --------------------------------------------------------------------------

    def _waiting(self) -> bool:
        """After a requeue or rollback (ours or anyone's): nothing to judge until the new
        allocation trains."""
        return any(on is not None and self.detectors.restart <= on
                   for on in (self.acted_on, self.requeued_on))

    def _show(self, obs: Observation) -> None:
        if not obs.training_step:
            return
        self.summary.steps_read += 1
        st = self.status
        st.step, st.restart = obs.step, obs.restart
        if obs.loss is not None:
            st.loss = obs.loss
        if obs.grad_norm is not None:
            st.grad_norm = obs.grad_norm
        rates = self.detectors.rates
        if rates and obs.consumed is not None:
            st.samples_per_s = sorted(rates[-5:])[len(rates[-5:]) // 2]
            st.tokens_per_s = st.samples_per_s * self.seq_length if self.seq_length else None
        median = self.detectors.median_step_s()
        if median is not None and st.max_steps and obs.step is not None:
            st.eta_s = max(0, st.max_steps - obs.step) * median
        self.view.observation(obs)

    def _record(self, alert: Alert) -> None:
        self.summary.alerts.append(alert)
        self.status.last_alert = f"{alert.kind}@{alert.step}" if alert.step is not None \
            else alert.kind
        self.view.alert(alert)
        self._log({"type": "alert", **alert.as_dict()})

    def _decide(self, alert: Alert) -> None:
        what = self.policy.action_for(alert)
        if what is None or self.controller is None or self.finished:
            return
        if alert.kind == "node_silent" or self.stopped or self._waiting() or \
                (what == "notify" and (alert.category, self.detectors.restart) in self.notified):
            return   # one action per incident: the hang's, not each silent node's
        if alert.kind == "hang" and alert.node is not None:
            self.blamed[self.detectors.restart] = alert.node
        taken = [a for a in self.summary.actions if a.what != "notify"]
        if what != "notify" and len(taken) >= self.policy.max_actions:
            self.view.note(f"not acting on {alert.kind} at step {alert.step}: "
                           f"--max-actions {self.policy.max_actions} already taken")
            return
        self._act(what, alert)

    def _act(self, what: str, alert: Alert) -> None:
        assert self.controller is not None
        action = Action(what, alert.message, alert.kind, self.clock(),
                        job_id=self.controller.job_id)
        try:
            if what == "notify":
                if not self.policy.notify:
                    raise JobgenError("--notify gives no command")
                action.ok, action.result = self._notify("alert", alert.as_dict(), alert)
                self.notified.add((alert.category, self.detectors.restart))
            elif what == "stop":
                action.result = self.controller.stop()
                self.stopped = True
            elif what == "requeue":
                exclude = alert.host if alert.host and alert.host in self.detectors.bad_hosts \
                    else None
                action.result = self.controller.requeue(exclude=exclude)
                self.acted_on = self.detectors.restart
            elif what == "rollback":
                action.result = self._rollback(alert)
        except (JobgenError, OSError) as exc:
            action.ok, action.result = False, str(exc)
        self.status.job_id = self.controller.job_id
        self.summary.actions.append(action)
        self.view.action(action)
        self._log({"type": "action", **action.as_dict()})
        if self.policy.notify and what != "notify":
            self._notify("action", action.as_dict(), alert)

    def _rollback(self, alert: Alert) -> str:
        assert self.controller is not None
        first = alert.since_step if alert.since_step is not None else (alert.step or 0)
        # Step N's numbers come from the weights after step N - 1: the checkpoint must be older.
        before = first - 1
        target, layout = actions.rollback_target(self.reader.run_dir, before)
        if target is None:
            self.stopped = True
            return f"cannot roll back ({layout}); stopped instead: {self.controller.stop()}"
        result = self.controller.requeue(
            prepare=lambda: actions.roll_back(self.reader.run_dir, target, layout))
        self.acted_on = self.detectors.restart
        return result

    # --- records --------------------------------------------------------------------------------

    def _log(self, record: dict[str, Any]) -> None:
        if self.log_path is None:
            return
        from .view import _finite
        line = json.dumps(_finite(record), sort_keys=True) + "\n"
        from ..plumbing import fsio
        from ..plumbing.errors import JobgenError
        try:
            fsio.append(self.log_path, line)
        except OSError as exc:
            self.view.note(f"cannot record in {self.log_path}: {exc.strerror}")
            self.log_path = None
        except JobgenError as exc:    # a FIFO, a device or a symlink where the log goes
            self.view.note(f"cannot record: {exc}")
            self.log_path = None

    def _notify(self, kind: str, payload: dict[str, Any], alert: Alert) -> tuple[bool, str]:
        assert self.policy.notify
        env = {"JOBGEN_WATCH_EVENT": kind, "JOBGEN_ALERT_KIND": alert.kind,
               "JOBGEN_ALERT_CATEGORY": alert.category, "JOBGEN_ALERT_MESSAGE": alert.message,
               "JOBGEN_ALERT_STEP": "" if alert.step is None else str(alert.step),
               "JOBGEN_JOB_ID": self.status.job_id, "JOBGEN_RUN_NAME": self.run_name,
               "JOBGEN_RUN_DIR": str(self.reader.run_dir)}
        ok, text = actions.notify(self.policy.notify, {"type": kind, **payload}, env)
        if not ok:
            self.view.note(text)
        return ok, text
