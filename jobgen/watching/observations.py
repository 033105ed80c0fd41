"""The one event type every reader produces, and the alerts and actions built on it."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Optional

# Alert kinds, and the policy each one falls under (--on-diverge, --on-hang, or report only).
CATEGORY = {
    "grad_spike": "report", "sustained_spike": "report", "loss_spike": "report",
    "throughput_drop": "report", "bad_node": "report",
    "divergence": "diverge", "nonfinite": "diverge", "hang": "hang", "node_silent": "hang",
}


@dataclass(frozen=True)
class Observation:
    """One thing a run said: a training step (with whatever numbers its source has), a node
    starting a step (``beat``), or a lifecycle event (start, resume, checkpoint, done, stopped).

    ``loss`` and ``grad_norm`` are NaN when the source reported a non-finite value (our JSON
    writes null for those), None when it did not report the value at all."""
    kind: str
    time: float                       # when it happened (epoch seconds, the source's clock)
    source: str                       # "events", "tensorboard", "log"
    restart: int = 0                  # the allocation (restart-N folder) it came from
    phase: str = "train"
    step: Optional[int] = None
    node: Optional[int] = None
    loss: Optional[float] = None
    grad_norm: Optional[float] = None
    param_norm: Optional[float] = None
    lr: Optional[float] = None
    consumed: Optional[int] = None    # samples consumed after this step
    samples_per_s: Optional[float] = None   # as the trainer measured it
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def training_step(self) -> bool:
        return self.kind == "step" and self.phase == "train" and self.step is not None


@dataclass
class Alert:
    kind: str                         # a key of CATEGORY
    step: Optional[int]               # the step it was seen at (None: not tied to a step)
    message: str
    time: float                       # when it was detected (the watcher's clock)
    since_step: Optional[int] = None  # where the trouble began (divergence: for a rollback)
    node: Optional[int] = None
    host: Optional[str] = None
    fault_time: Optional[float] = None   # when the data says it began (for detection latency)
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def category(self) -> str:
        return CATEGORY[self.kind]

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["category"] = self.category
        data["time"] = iso(self.time)
        data["fault_time"] = iso(self.fault_time) if self.fault_time is not None else None
        return data


@dataclass
class Action:
    what: str                         # requeue | stop | rollback | notify
    reason: str                       # the alert's message
    alert: str                        # the alert's kind
    time: float
    ok: bool = True
    result: str = ""
    job_id: str = ""

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["time"] = iso(self.time)
        return data


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="milliseconds")


# The domain of a time read from a run (epoch seconds): 1970 to 2200. Outside it a value is not
# a time this run can have, and arithmetic or printing on it would overflow.
TIME_MIN, TIME_MAX = 0.0, 7258118400.0


def plausible_time(value: float) -> bool:
    """Whether `value` (epoch seconds) lies in the domain of a run's times."""
    return TIME_MIN <= value <= TIME_MAX


def parse_time(text: Any) -> Optional[float]:
    """An event's ISO 8601 time as epoch seconds; None when it is not one, or out of domain."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return value if plausible_time(value) else None


HUGE = 1e300


def number(value: Any, present: bool) -> Optional[float]:
    """A reported number: NaN for a reported non-finite value (null in our JSON), None when the
    source did not report it."""
    if not present:
        return None
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        found = float(value)
    except OverflowError:      # an integer past float's range: reported, and not finite
        return math.inf
    # Past 1e300 a number is an overflow that happened to print (1e308): counted as not
    # finite, so that no sum or mean of a few of them overflows in turn (fsum).
    return found if abs(found) <= HUGE else math.copysign(math.inf, found)


def finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


def fmt(value: float) -> str:
    """A detector's number in an alert: four significant digits."""
    return f"{value:.4g}"
