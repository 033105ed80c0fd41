"""A run's evaluations: RUN/eval/step-N.json, lm-eval's results JSON with the `jobgen` entry
payload/common/eval_lm.py adds (the step, samples and tokens trained). Per evaluated step, each
top-level task's headline metric (accuracy first: acc, acc_norm, exact_match, ... as lm-eval
names them) with its stderr, for the report's section, its JSON and its charts. A file there
that is not lm-eval's results (unparsable, too large, not a regular file) is one line naming it.
Also the exports they scored: RUN/export/step-N/jobgen-export.json, each one's proof.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..plumbing import fsio
from ..plumbing.errors import ConfigError

FILE = re.compile(r"step-(0|[1-9][0-9]{0,11})\.json")   # eval_step.py's name; not its temporary
MAX_BYTES = 32 << 20   # HLAT's table with every subtask's config is a few MB
# The headline: the first of these a task has (lm-eval's own names), else its first number.
HEADLINE = ("acc", "acc_norm", "exact_match", "pass@1", "em", "f1", "mcc")


@dataclass(frozen=True, slots=True)
class Score:
    task: str
    metric: str                  # lm-eval's name: acc, acc_norm, exact_match, ...
    filter: str                  # its filter ("none" where the task has none)
    value: float
    stderr: Optional[float]      # None where lm-eval gave none ("N/A": a single sample)
    shots: Optional[int]
    higher_is_better: Optional[bool]

    @property
    def column(self) -> tuple[str, str, str, Optional[int]]:
        return self.task, self.metric, self.filter, self.shots

    @property
    def label(self) -> str:
        return self.metric + ("" if self.filter == "none" else f" ({self.filter})")


@dataclass(frozen=True, slots=True)
class Evaluated:
    step: int
    tokens: Optional[int]        # None where the file has no jobgen entry (lm-eval's own file)
    consumed_samples: Optional[int]
    file: str                    # relative to the run's folder
    scores: tuple[Score, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """One task's headline from the first step it was evaluated at to the last."""
    task: str
    metric: str
    filter: str
    shots: Optional[int]
    first_step: int
    last_step: int
    first_tokens: Optional[int]
    last_tokens: Optional[int]
    first: float
    last: float
    change: float


@dataclass(frozen=True, slots=True)
class Exported:
    """An export's folder and its proof (payload/common/export_hf.py writes the record)."""
    step: int
    outcome: str                 # proven, unproven (no logged step after it)
    measured_loss: Optional[float]
    logged_loss: Optional[float]
    precision: Optional[str]
    folder: str                  # relative to the run's folder


EXPORT_FILE = re.compile(r"step-(0|[1-9][0-9]{0,11})")   # export_hf.py's; not its temporary
EXPORT_RECORD = "jobgen-export.json"
MAX_EXPORT_RECORD = 1 << 20


def exports(run_dir: Path) -> tuple[Exported, ...]:
    """Every complete RUN/export/step-N/ (its record there), by step; () where there is none.
    A record that is not an export's is one line naming it."""
    from ..payloads.stages import EXPORT_ROOT
    folder = run_dir / EXPORT_ROOT
    try:
        steps = sorted((int(m.group(1)), p) for p in folder.iterdir()
                       if (m := EXPORT_FILE.fullmatch(p.name)))
    except OSError:
        return ()
    out = []
    for step, path in steps:
        record = path / EXPORT_RECORD
        try:
            body = json.loads(fsio.read_bytes(record, MAX_EXPORT_RECORD).decode("utf-8"))
        except FileNotFoundError:   # not complete (a failed export leaves no folder)
            continue
        except OSError as exc:
            raise ConfigError(f"{record}: cannot read: {exc.strerror or exc}") from None
        except (ValueError, RecursionError):
            raise ConfigError(f"{record}: not an export's record (not JSON)") from None
        proof = body.get("proof") if isinstance(body, dict) else None
        if not isinstance(proof, dict) or body.get("step") != step:
            raise ConfigError(f"{record}: not an export's record of step {step} (its step and "
                              "proof)")
        outcome = {True: "proven", None: "unproven"}.get(proof.get("ok"), "failed")
        precision = proof.get("precision")
        out.append(Exported(step, outcome, _number(proof.get("measured_loss")),
                            _number(proof.get("logged_loss")),
                            precision if isinstance(precision, str) else None,
                            str(path.relative_to(run_dir))))
    return tuple(out)


def read(run_dir: Path) -> tuple[Evaluated, ...]:
    """Every RUN/eval/step-N.json, by step; () where there is none."""
    from ..payloads.stages import EVAL_ROOT
    folder = run_dir / EVAL_ROOT
    try:
        names = sorted(((int(m.group(1)), p) for p in folder.iterdir()
                        if (m := FILE.fullmatch(p.name))), key=lambda x: x[0])
    except OSError:   # no eval folder (or not a folder): no evaluations
        return ()
    out = []
    for step, path in names:
        found = _one(path, step, run_dir)
        if found is not None:
            out.append(found)
    return tuple(out)


def _not_results(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{path}: not lm-eval's results JSON ({why})")


def _load(path: Path) -> Optional[dict[str, Any]]:
    try:
        raw = fsio.read_bytes(path, MAX_BYTES)
    except FileNotFoundError:   # removed since the listing
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:   # lm-eval writes NaN as JSON's NaN: read it as not a number, not as a bad file
        body = json.loads(raw.decode("utf-8"), parse_constant=lambda _: math.nan)
    except RecursionError:
        raise _not_results(path, "nested too deeply") from None
    except ValueError as exc:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _not_results(path, str(exc).split("\n")[0]) from None
    if not isinstance(body, dict):
        raise _not_results(path, "not an object")
    return body


def _whole(path: Path, value: Any, key: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{path}: {key}: {value!r} is not a whole number of at least 0")
    return value


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _one(path: Path, named_step: int, run_dir: Path) -> Optional[Evaluated]:
    body = _load(path)
    if body is None:
        return None
    results = body.get("results")
    if not isinstance(results, dict) or not all(isinstance(v, dict) for v in results.values()):
        raise _not_results(path, "no results object of tasks")
    made = body.get("jobgen", {})
    if not isinstance(made, dict):
        raise ConfigError(f"{path}: jobgen: not an object")
    step = _whole(path, made.get("step", named_step), "jobgen.step")
    if step != named_step:
        raise ConfigError(f"{path}: jobgen.step: {step}, but the file is named for step "
                          f"{named_step}")
    inner = [t for subtasks in (body.get("group_subtasks") or {}).values()
             if isinstance(subtasks, list) for t in subtasks]
    scores = [s for task, metrics in results.items() if task not in inner
              for s in [headline(body, task, metrics)] if s is not None]
    if not scores:
        raise _not_results(path, "no task in results has a metric")
    try:
        shown = str(path.relative_to(run_dir))
    except ValueError:
        shown = str(path)
    return Evaluated(int(named_step), _whole(path, made.get("tokens"), "jobgen.tokens"),
                     _whole(path, made.get("consumed_samples"), "jobgen.consumed_samples"),
                     shown, tuple(scores))


def headline(body: dict[str, Any], task: str, metrics: dict[str, Any]) -> Optional[Score]:
    """The task's headline: `NAME,FILTER` keys (not a stderr), the first of HEADLINE's names
    it has, else its first number."""
    found = [(name, filt, value) for key, raw in metrics.items() if "," in key
             for name, _, filt in [key.partition(",")]
             if not name.endswith("_stderr") for value in [_number(raw)] if value is not None]
    if not found:
        return None
    ranked = sorted(range(len(found)), key=lambda i: (
        HEADLINE.index(found[i][0]) if found[i][0] in HEADLINE else len(HEADLINE), i))
    name, filt, value = found[ranked[0]]
    shots = (body.get("n-shot") or {}).get(task)
    better = (body.get("higher_is_better") or {}).get(task)
    better = better.get(name) if isinstance(better, dict) else None
    return Score(str(task), name, filt, value, _number(metrics.get(f"{name}_stderr,{filt}")),
                 shots if isinstance(shots, int) and not isinstance(shots, bool) else None,
                 better if isinstance(better, bool) else None)


def columns(evals: Sequence[Evaluated]) -> list[tuple[str, str, str, Optional[int]]]:
    """Each (task, metric, filter, shots) evaluated, in the order first seen."""
    out: dict[tuple[str, str, str, Optional[int]], None] = {}
    for e in evals:
        for s in e.scores:
            out.setdefault(s.column)
    return list(out)


def series(evals: Sequence[Evaluated], column: tuple[str, str, str, Optional[int]]
           ) -> list[tuple[Evaluated, Score]]:
    """The steps that evaluated `column`, with its score at each."""
    return [(e, s) for e in evals for s in e.scores if s.column == column]


def changes(evals: Sequence[Evaluated]) -> list[Change]:
    """Per column evaluated at two steps or more: its first step's score to its last's."""
    out = []
    for column in columns(evals):
        points = series(evals, column)
        if len(points) < 2:
            continue
        (e0, s0), (e1, s1) = points[0], points[-1]
        out.append(Change(s0.task, s0.metric, s0.filter, s0.shots, e0.step, e1.step,
                          e0.tokens, e1.tokens, s0.value, s1.value, s1.value - s0.value))
    return out
