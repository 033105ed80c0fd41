"""The value types of jobgen's options: text and folders that may not be empty, bounded amounts
(limits.PLAN_DOMAINS), seconds, and --backend's choices asked of the registry only when needed."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

import click


class _Text(click.ParamType):
    """A string option that may not be empty (`--site ''` must not mean the default site)."""

    name = "text"

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("must not be empty", param, ctx)
        return value


class _Folder(click.Path):
    """A folder path that may not be empty (click would read '' as the current folder)."""

    def __init__(self) -> None:
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("must not be empty", param, ctx)
        if isinstance(value, str):
            from ..inputs.rules import path_problem
            from ..inputs.schema import describe
            said = path_problem(value)   # before anything looks at it (os.stat would raise)
            if said is not None:
                self.fail(f"{describe(value)} {said}", param, ctx)
        return super().convert(value, param, ctx)


class _Amount(click.ParamType):
    """A finite number more than 0 (1.8e12 tokens, a price, hours), at most `upper` if given;
    `_Amount.of(key)` takes its bounds from the domain declared for it (limits.PLAN_DOMAINS)."""

    name = "number"

    def __init__(self, upper: Optional[float] = None, unit: str = "",
                 lower: Optional[float] = None) -> None:
        self.upper, self.unit, self.lower = upper, unit, lower

    @classmethod
    def of(cls, key: str) -> "_Amount":
        from ..inputs.limits import PLAN_DOMAINS
        lower, upper, unit = PLAN_DOMAINS[key]
        return cls(upper, unit, lower)

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Any:
        unit = f" {self.unit}" if self.unit else ""
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{value!r} is not a number{' of' + unit if unit else ''}", param, ctx)
        if self.lower is not None and self.upper is not None:
            if not (math.isfinite(number) and self.lower <= number <= self.upper):
                self.fail(f"{value} must be from {self.lower:g} to {self.upper:g}{unit}",
                          param, ctx)
        elif self.upper is not None:
            if not (math.isfinite(number) and 0 < number <= self.upper):
                self.fail(f"{value} must be more than 0 and at most {self.upper:g}{unit}",
                          param, ctx)
        elif not (math.isfinite(number) and number > 0):
            self.fail(f"{value} must be a number more than 0", param, ctx)
        return number


def _Seconds() -> _Amount:
    """A number of seconds, more than 0 and at most a day."""
    amount = _Amount(86400, "seconds")
    amount.name = "seconds"
    return amount


TEXT = _Text()


class _Backends(click.Choice):
    """--backend's choices, asked of the registry when first needed (help, a value to check):
    declaring the option costs nothing, so `jobgen render` stays fast."""

    def __init__(self, test: Callable[[Any], bool]) -> None:   # noqa: D107
        self.test = test
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from .. import backends
        return backends.having(self.test)
