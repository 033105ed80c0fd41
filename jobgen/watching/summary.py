"""What a watch shows and reports: the live view's status, the summary of a watch (alerts,
actions, allocations, steps lost) and `jobgen watch`'s exit status."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from .observations import Action, Alert

# Exit statuses: 0 healthy (offline) or completed (a job), 1 a divergence or hang found or the
# run failed or was cancelled (offline) or the job did not complete, 2 a usage or input error
# (errors.py), 3 nothing to judge: not one training step was read, so "no alerts" would mean
# nothing; 130 Ctrl-C.
NOTHING_TO_JUDGE = 3


@dataclass
class Status:
    """What the live view shows."""
    job_id: str = ""
    state: str = ""
    step: Optional[int] = None
    max_steps: Optional[int] = None
    loss: Optional[float] = None
    grad_norm: Optional[float] = None
    samples_per_s: Optional[float] = None
    tokens_per_s: Optional[float] = None
    eta_s: Optional[float] = None
    last_alert: str = ""
    restart: int = 0


@dataclass
class Summary:
    job_id: str
    state: str
    alerts: list[Alert] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    steps_lost: int = 0
    allocations: int = 0
    restarts_in_place: int = 0        # torchrun's restarts inside an allocation
    last_step: Optional[int] = None
    steps_read: int = 0               # training steps read: none, and there was nothing to judge
    notes: list[str] = field(default_factory=list)
    # Offline: how the run ended where it did not end well (ending.py): a failure (a node's
    # status other than 0) or a cancel (Ctrl-C); either way it did not complete.
    ended: str = ""
    failed: bool = False
    cancelled: bool = False

    def as_dict(self) -> dict[str, Any]:
        counts = dict(Counter(alert.kind for alert in self.alerts))   # first seen first
        return {"job_id": self.job_id, "state": self.state, "last_step": self.last_step,
                "allocations": self.allocations, "restarts_in_place": self.restarts_in_place,
                "steps_lost": self.steps_lost,
                "steps_read": self.steps_read,
                "alert_counts": counts, "alerts": [a.as_dict() for a in self.alerts],
                "actions": [a.as_dict() for a in self.actions], "notes": self.notes,
                "ended": self.ended or None, "failed": self.failed,
                "cancelled": self.cancelled}


def exit_status(summary: Summary, completed: Optional[bool] = None) -> int:
    """`jobgen watch`'s exit status. Offline (`completed` None): 1 when a divergence or hang was
    found, or the run failed or was cancelled; a job: 1 when it did not complete. Otherwise 3
    (NOTHING_TO_JUDGE) when not one training step was read, else 0."""
    if completed is None:
        if summary.failed or summary.cancelled or \
                any(a.category != "report" for a in summary.alerts):
            return 1
    elif not completed:
        return 1
    return NOTHING_TO_JUDGE if summary.steps_read == 0 else 0
