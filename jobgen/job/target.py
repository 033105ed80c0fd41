"""A --tokens/--samples target on a recipe's schedule: the steps `jobgen plan` counts become
schedule.max_steps, and a decay that ended short of the recipe's max_steps ends as far along the
new schedule (what a --smoke rehearsal does to its own short schedule). Warmup and hold stay
the recipe's; where they no longer fit, the target is refused with the --set that fixes it."""
from __future__ import annotations

from typing import Optional, Sequence

from ..inputs.recipe import Schedule
from ..plumbing.errors import ConfigError


def _given(overrides: Sequence[str], key: str) -> bool:
    return any(o.split("=", 1)[0].strip() == key for o in overrides)


def schedule_for(schedule: Schedule, steps: int, overrides: Sequence[str],
                 flag: str) -> tuple[tuple[str, ...], Optional[str]]:
    """The overrides that train `steps` steps (`flag` names the target, like `--tokens 1.8e12`)
    and the one line that says what changed beside max_steps (None: nothing did)."""
    s = schedule
    warmup = (round(s.warmup_fraction * steps) if s.warmup_fraction is not None
              else s.warmup_steps or 0)
    hold = (round(s.constant_fraction * steps) if s.constant_fraction is not None
            else s.constant_steps or 0)
    if warmup + hold > steps:
        key = ("schedule.warmup_steps" if s.warmup_fraction is None and warmup
               else "schedule.constant_steps")
        raise ConfigError(f"{flag}: {steps:,} steps leave no room for the schedule's warmup "
                          f"{warmup:,} + constant {hold:,} steps; add --set {key}=N with the "
                          f"two at most {steps} steps, or train to a larger target")
    added = (f"schedule.max_steps={steps}",)
    if s.decay_steps is None or s.decay_steps == s.max_steps:
        return added, None
    if _given(overrides, "schedule.decay_steps"):
        if not warmup + hold <= s.decay_steps <= steps:
            raise ConfigError(f"{flag}: schedule.decay_steps {s.decay_steps:,} (given with "
                              f"--set) must lie between {warmup + hold:,} and the target's "
                              f"{steps:,} steps; change it, or drop it to scale the recipe's")
        return added, None
    decay = min(steps, max(warmup + hold, round(s.decay_steps * steps / s.max_steps)))
    share = 100 * s.decay_steps / s.max_steps
    note = (f"note: {flag}: schedule.max_steps {s.max_steps:,} -> {steps:,} steps (as `jobgen "
            f"plan` counts them); schedule.decay_steps scaled with it, {s.decay_steps:,} -> "
            f"{decay:,} (the decay still ends {share:.0f} % of the way); --set "
            "schedule.decay_steps=N to choose another")
    return added + (f"schedule.decay_steps={decay}",), note
