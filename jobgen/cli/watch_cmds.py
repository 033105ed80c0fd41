"""`jobgen watch`: a running job's health, and what to do about it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from ..plumbing.errors import ConfigError
from .options import _job, _job_backend, _job_options, _json_option
from .param_types import _Amount, _Folder

# Counts of steps the detectors hold or wait for (a window, a patience, a run's last step), and
# of actions and allocations: each bounded, so that a huge value is refused in one line, not
# turned into a buffer that cannot be made (a window of 10**30 steps overflowed).
STEPS = 1_000_000
MAX_STEP = 10 ** 12
COUNT = 1_000


@click.command("watch")
@click.argument("job", required=False)
@click.option("--run-dir", type=_Folder(),
              help="The run folder: without JOB, judge it as recorded (nothing is acted on); "
                   "with JOB, where that job writes (for jobs jobgen did not record).")
@click.option("--on-hang", type=click.Choice(["requeue", "stop", "notify"]),
              help="What to do when the job hangs (default: report only).")
@click.option("--on-diverge", type=click.Choice(["requeue", "stop", "rollback", "notify"]),
              help="What to do when training diverges: rollback resumes from the checkpoint "
                   "before it began (default: report only).")
@click.option("--notify", "notify_spec", metavar="cmd:COMMAND",
              help="A command run (sh -c) for every action taken and as the notify action; "
                   "the alert reaches it as JOBGEN_ALERT_* variables and JSON on stdin.")
@click.option("--max-actions", type=click.IntRange(0, COUNT), default=3, show_default=True,
              help="Requeues, stops and rollbacks at most.")
@click.option("--poll", "poll_s", type=_Amount(3600, "seconds"), default=5.0,
              show_default=True, help="Seconds between looks at the job and its files.")
@click.option("--every", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds between status lines when stdout is not a terminal.")
@click.option("--max-steps", type=click.IntRange(1, MAX_STEP),
              help="The run's last step, for the time to finish (default: recorded).")
@click.option("--spike-window", type=click.IntRange(2, STEPS), default=20, show_default=True,
              help="Recent steps whose median the gradient norm (and the loss) is judged by.")
@click.option("--spike-factor", type=click.FloatRange(min=1, min_open=True), default=4.0,
              show_default=True,
              help="A spike: gradient norm above this x the median of the recent norms ...")
@click.option("--spike-mads", type=click.FloatRange(min=0), default=6.0, show_default=True,
              help="... and by more than this many robust spreads (MAD) of their logs.")
@click.option("--spike-patience", type=click.IntRange(1, STEPS), default=5, show_default=True,
              help="A spike lasting this many steps is reported as sustained.")
@click.option("--growth-factor", type=_Amount(), default=3.0, show_default=True,
              help="Divergence: gradient norm above this x its lowest running median ...")
@click.option("--growth-steps", type=click.IntRange(1, STEPS), default=5, show_default=True,
              help="... for this many steps in a row.")
@click.option("--loss-spike", type=_Amount(), default=0.5, show_default=True,
              help="A loss spike: loss above (1 + this) x the median of the recent losses.")
@click.option("--hang-factor", type=_Amount(), default=10.0, show_default=True,
              help="A hang: no step for this x the median step time ...")
@click.option("--hang-min", "hang_min_s", type=click.FloatRange(min=0), default=300.0,
              show_default=True, help="... and at least this many seconds (saves take long).")
@click.option("--drop", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=0.3, show_default=True,
              help="A throughput drop: the recent median this fraction below the steady one ...")
@click.option("--drop-mads", type=click.FloatRange(min=0), default=4.0, show_default=True,
              help="... and below it by this many robust spreads of the steady steps' rates.")
@click.option("--drop-steps", type=click.IntRange(1, STEPS), default=5, show_default=True,
              help="Steps in the recent median (the steady one needs twice as many).")
@click.option("--restarts-per-node", type=click.IntRange(1, COUNT), default=2, show_default=True,
              help="A bad node: the first to fail in this many allocations.")
@_job_backend
@_job_options
@_json_option
def watch_cmd(job: Optional[str], run_dir: Optional[Path], on_hang: Optional[str],
              on_diverge: Optional[str], notify_spec: Optional[str], max_actions: int,
              poll_s: float, every: float, max_steps: Optional[int], backend: Optional[str],
              site: Optional[str], endpoint_url: Optional[str], as_json: bool,
              **rule_values: Any) -> None:
    """Follow JOB (a run name or a job id) while it runs: gradient-norm and loss spikes,
    divergence, non-finite values, hangs, a silent node, throughput drops and a node that keeps
    causing restarts; act on hangs and divergence when asked. Exits when the job ends, with a
    summary. Without JOB, judges the --run-dir folder as recorded.

    \b
    Exit status:
      0  the job completed; offline: no divergence or hang found, the run did not fail
      1  the job did not complete; offline: a divergence or hang found, or the run failed
         or was cancelled
      2  a usage error or an input refused
      3  nothing to judge: not one training step was read
    130  interrupted (Ctrl-C)"""
    from ..watching import command
    from ..watching.detectors import Rules
    from ..watching.summary import exit_status
    from ..watching.watcher import Policy
    rules = Rules(**rule_values)
    if job is None:
        if run_dir is None:
            raise click.UsageError("give JOB (a run name or a job id) or --run-dir FOLDER")
        if on_hang or on_diverge or notify_spec:
            raise click.UsageError("--on-hang, --on-diverge and --notify act on a job: give JOB")
        summary = command.watch_recorded(run_dir, rules, as_json)
        raise SystemExit(exit_status(summary))
    notify = command.parse_notify(notify_spec)
    if "notify" in (on_hang, on_diverge) and notify is None:
        raise click.UsageError("the notify action needs --notify cmd:COMMAND")
    from .. import backends
    impl, ref = _job(job, backend, site, endpoint_url, elsewhere=True)
    name = impl.__name__.split(".")[-2]   # jobgen.backends.NAME.backend: who answers for it
    declared = backends.declaration(name)
    if not declared.watch:
        raise ConfigError(f"{job}: a {name} job cannot be watched while it runs"
                          + (f" ({declared.watch_note})" if declared.watch_note else "")
                          + "; judge its run folder afterwards with jobgen watch --run-dir "
                          "FOLDER")
    summary = command.watch_job(name, ref, run_dir=run_dir, rules=rules,
                                policy=Policy(on_hang, on_diverge, notify, max_actions),
                                as_json=as_json, poll_s=poll_s, every=every,
                                max_steps=max_steps)
    ended = declared.states.get(summary.state.upper(), backends.State.UNKNOWN)
    raise SystemExit(exit_status(summary, ended == backends.State.COMPLETED))
