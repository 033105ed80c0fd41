"""One report: a run found by its recorded name (or its folder), read once into its timeline,
account and curves, for every output (text, JSON, HTML, PNG)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..plumbing.errors import ConfigError
from ..plumbing.render import shell_path
from . import evals as evaluations
from .account import Account, account
from .curves import Curves, read
from .timeline import Timeline, build


@dataclass(frozen=True, slots=True)
class Report:
    name: str
    timeline: Timeline
    account: Account
    curves: Curves
    evals: tuple[evaluations.Evaluated, ...] = ()   # RUN/eval/step-N.json, by step
    exports: tuple[evaluations.Exported, ...] = ()  # RUN/export/step-N/, by step


def locate(ref: Optional[str], run_dir: Optional[Path],
           say: Optional[Callable[[str], None]] = None) -> tuple[str, Path]:
    """The run's name and folder: --run-dir as given, else the newest recorded run named (or
    with job id) `ref` (one found only in another folder said to `say`)."""
    if run_dir is not None:
        if not run_dir.is_dir():
            raise ConfigError(f"--run-dir {run_dir}: no such folder")
        one_run(run_dir)
        return ref or run_dir.name, run_dir
    if not ref:
        raise ConfigError("jobgen report: name a recorded run (jobgen runs lists them) or "
                          "give --run-dir")
    from ..runs import ledger as runs
    found = runs.find(ref, say)
    if found is None:
        raise ConfigError(f"{ref}: no run of that name or job id in "
                          f"{runs.state_dir() / runs.RECORD}")
    return found.name, Path(found.run_dir)


def one_run(folder: Path) -> None:
    """Refuse a folder that is not one run: a folder of runs (the work dir) would mix their
    allocations and alerts, and a folder with no run in it has nothing to report."""
    from ..watching.runfolder import is_run
    if is_run(folder):
        return
    try:
        inside = sorted(p.name for p in folder.iterdir() if p.is_dir() and is_run(p))
    except OSError:
        inside = []
    shown = ", ".join(inside[:5]) + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")
    if len(inside) > 1:
        raise ConfigError(f"--run-dir {folder}: a folder of {len(inside)} runs ({shown}), not "
                          "one run: give one of them (or its name)")
    if inside:
        raise ConfigError(f"--run-dir {folder}: not a run folder; it holds one run, {shown}: "
                          f"--run-dir {shell_path(str(folder / inside[0]))}")
    raise ConfigError(f"--run-dir {folder}: no run in it (no logs, train or nemo folder, no "
                      "jobgen-run.json)")


def make(ref: Optional[str], run_dir: Optional[Path], use_sacct: bool = True,
         now: Optional[float] = None, say: Optional[Callable[[str], None]] = None,
         with_evals: bool = True) -> Report:
    """The run's report; `with_evals` False leaves its evaluations unread (plan --from-run
    takes only the cluster's figures, and a bad results file must not hide them)."""
    name, folder = locate(ref, run_dir, say)
    evals = evaluations.read(folder) if with_evals else ()
    exports = evaluations.exports(folder) if with_evals else ()
    curves = read(folder)
    tensorboard = [(p["time"], p["step"]) for p in curves.series if p.get("source") ==
                   "tensorboard"]
    timeline = build(folder, now=now, use_sacct=use_sacct, steps_elsewhere=tensorboard)
    if not timeline.allocations and not curves.series and not evals:
        raise ConfigError(f"{folder}: no allocation logs (logs/JOB/node-K, restart-N or "
                          "attempt-N) and no metrics: nothing to report yet")
    return Report(name, timeline, account(timeline), curves, evals, exports)
