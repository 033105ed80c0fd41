"""The stand-in trainer's (train.py's) fault-injection knobs for rehearsing failures.

They are environment variables, read by every rank; sbatch passes the submitter's environment on
to the job, so ``VAR=... jobgen submit ...`` reaches it:

- ``JOBGEN_SMOKE_STEP_DELAY=SECONDS``: sleep this long in every optimizer step (both passes), so
  that a job runs long enough to be killed mid-training.
- ``JOBGEN_SMOKE_FAIL_AT_STEP=N``: fail with an error (exit status 1) when about to run optimizer
  step N, in every invocation and either pass (N <= --compile-steps fails the compile pass too);
  with ``JOBGEN_SMOKE_FAIL_NODE=K`` only on node K (the job's node index, from 0).

What ``jobgen watch`` catches, in the training pass only (the compile pass trains as usual):

- ``JOBGEN_SMOKE_SPIKE_AT_STEP=N``: a gradient-norm spike at step N: that step's loss is
  back-propagated x100, so the norm before clipping is 100 times the usual (clipping keeps the
  update sane, and the next step is normal again, as most real spikes are).
- ``JOBGEN_SMOKE_LOSS_SPIKE_AT_STEP=N``: before step N the output layer's weights are multiplied
  by 30, as a bad update would do: the loss jumps (the tiny model is still near ln(vocab), so
  a bad batch alone would not show), and training pulls it back down over the next steps.
- ``JOBGEN_SMOKE_SLOW_AT_STEP=N``: from step N on, every step takes
  ``JOBGEN_SMOKE_SLOW_SECONDS`` (default 1) longer: a throughput drop.
- ``JOBGEN_SMOKE_DIVERGE_AT_STEP=N``: from step N on, the learning rate is 1000 times the
  schedule's and gradients are not clipped: the run really diverges.
- ``JOBGEN_SMOKE_NAN_AT_STEP=N``: step N's loss is NaN, and so are the weights after it.
- ``JOBGEN_SMOKE_SAVE_FAIL_AT_STEP=N``: the save of step N fails after writing part of its
  files (in the background unless --sync-save): the step is never sealed.
- ``JOBGEN_SMOKE_SAVE_DELAY=SECONDS``: every save's write takes this much longer (a slow disk).
- ``JOBGEN_SMOKE_HANG_AT_STEP=N``: node ``JOBGEN_SMOKE_HANG_NODE`` (default: the last) stops before
  step N and never goes on; the others wait for it in the next collective.

The last three happen once per run (a file in --output-dir remembers it), so that the job a
watcher requeued or rolled back trains on normally.
The save knobs act in smoke_checkpoint.py.
"""
from __future__ import annotations

import os
from typing import Any

from common.runtime import PayloadError

STEP_DELAY_ENV = "JOBGEN_SMOKE_STEP_DELAY"
FAIL_AT_ENV = "JOBGEN_SMOKE_FAIL_AT_STEP"
FAIL_NODE_ENV = "JOBGEN_SMOKE_FAIL_NODE"
SAVE_FAIL_ENV = "JOBGEN_SMOKE_SAVE_FAIL_AT_STEP"
SAVE_DELAY_ENV = "JOBGEN_SMOKE_SAVE_DELAY"
FAULT_STEPS = {fault: f"JOBGEN_SMOKE_{fault.upper()}_AT_STEP"
               for fault in ("spike", "loss_spike", "slow", "diverge", "nan", "hang")}
SLOW_SECONDS_ENV = "JOBGEN_SMOKE_SLOW_SECONDS"
HANG_NODE_ENV = "JOBGEN_SMOKE_HANG_NODE"
ONCE_PER_RUN = ("diverge", "nan", "hang")
SPIKE_FACTOR = 100.0
DIVERGE_LR_FACTOR = 1000.0
LOSS_SPIKE_FACTOR = 30.0


class InjectedFailure(RuntimeError):
    """The failure asked for with JOBGEN_SMOKE_FAIL_AT_STEP."""


def fault_knobs(env: Any = os.environ) -> tuple[float, int | None]:
    """(seconds to sleep per step, step to fail at or None) from the environment."""
    delay_text = env.get(STEP_DELAY_ENV, "").strip()
    fail_text = env.get(FAIL_AT_ENV, "").strip()
    try:
        delay = float(delay_text) if delay_text else 0.0
    except ValueError:
        raise PayloadError(f"{STEP_DELAY_ENV}={delay_text!r} is not a number of seconds") from None
    if not delay >= 0 or delay == float("inf"):
        raise PayloadError(f"{STEP_DELAY_ENV}={delay_text!r} must be a finite number >= 0")
    if not fail_text:
        return delay, None
    if not fail_text.isdigit() or int(fail_text) < 1:
        raise PayloadError(f"{FAIL_AT_ENV}={fail_text!r} must be a step number >= 1")
    return delay, int(fail_text)


def _step_number(name: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PayloadError(f"{name}={text!r} must be a step number >= 1")
    return int(text)


def watch_faults(env: Any = os.environ) -> dict[str, Any]:
    """The faults asked for that `jobgen watch` catches: {"spike": step, ...} for those set, with
    "slow_seconds", "hang_node" (None: the last node) and "fail_node" (None: every node)."""
    faults: dict[str, Any] = {}
    for fault, name in FAULT_STEPS.items():
        text = env.get(name, "").strip()
        if text:
            faults[fault] = _step_number(name, text)
    slow = env.get(SLOW_SECONDS_ENV, "").strip() or "1"
    try:
        faults["slow_seconds"] = float(slow)
    except ValueError:
        raise PayloadError(f"{SLOW_SECONDS_ENV}={slow!r} is not a number of seconds") from None
    if not 0 <= faults["slow_seconds"] < float("inf"):
        raise PayloadError(f"{SLOW_SECONDS_ENV}={slow!r} must be a finite number >= 0")
    for key, name in (("hang_node", HANG_NODE_ENV), ("fail_node", FAIL_NODE_ENV)):
        text = env.get(name, "").strip()
        if text and not text.isdigit():
            raise PayloadError(f"{name}={text!r} must be a node index (0, 1, ...)")
        faults[key] = int(text) if text else None
    return faults
