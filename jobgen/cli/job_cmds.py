"""A submitted job and its run: status, logs, cancel, runs."""
from __future__ import annotations

from typing import Any, Optional

import click

from ..plumbing.errors import ConfigError, JobgenError, printable
from .options import _echo_json, _echo_text, _job, _job_backend, _job_options, _json_option


@click.command()
@click.argument("job")
@_job_backend
@_job_options
@_json_option
def status(job: str, backend: Optional[str], site: Optional[str],
           endpoint_url: Optional[str], as_json: bool) -> None:
    """The state of JOB (a run name or a job id): Slurm's from the controller, or from
    accounting once it ended; Batch's for the job and each node."""
    impl, ref = _job(job, backend, site, endpoint_url)
    staged = _each_stage(job, ref)
    if as_json:
        data = impl.status(ref).as_dict()
        data["run"] = ref.run.as_dict() if ref.run else None
        if len(staged) > 1:
            data["stages"] = [{"stage": name, **impl.status(one).as_dict()}
                              for name, one in staged]
        _echo_json(data)
        return
    for name, one in staged:
        for line in impl.status_lines(one):
            click.echo(f"{name}: {line}" if name else line)


@click.command()
@click.argument("job")
@click.option("--node", type=click.IntRange(min=0),
              help="One node's logs: Slurm, its compile and training logs of every restart "
                   "(from the run folder); Batch, its CloudWatch stream. Default: the job's "
                   "output (Slurm), the main node (Batch).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@_job_backend
@_job_options
def logs(job: str, node: Optional[int], follow: bool, backend: Optional[str],
         site: Optional[str], endpoint_url: Optional[str]) -> None:
    """The logs of JOB (a run name or a job id); of a run submitted with --stages, every
    stage's job in order (with --node, the training job's nodes)."""
    impl, ref = _job(job, backend, site, endpoint_url)
    staged = _each_stage(job, ref)
    if node is not None:
        staged = [(name, one) for name, one in staged if name in ("", "train")]
    for index, (name, one) in enumerate(staged):
        if name:
            click.echo(f"jobgen: the {name} stage's job {one.job_id}")
        # Only the last one is followed (the ones before it have ended when it starts).
        impl.logs(one, node, follow and index == len(staged) - 1,
                  lambda text: click.echo(text, nl=False))


@click.command()
@click.argument("job")
@_job_backend
@_job_options
def cancel(job: str, backend: Optional[str], site: Optional[str],
           endpoint_url: Optional[str]) -> None:
    """Cancel JOB (a run name or a job id); a job that already ended is left alone. A run
    submitted with --stages: every stage's job, the last stage first."""
    impl, ref = _job(job, backend, site, endpoint_url)
    for name, one in reversed(_each_stage(job, ref)):
        said = impl.cancel(one)
        click.echo(f"{name}: {said}" if name else said)


def _each_stage(job: str, ref: Any) -> list[tuple[str, Any]]:
    """(stage, job) for every job of the run JOB names when it was submitted with a stage
    before training (--stages prepare,train); else [("", the job)]."""
    import dataclasses
    run = ref.run
    if run is None or job != run.name or all(name == "train" for name, _ in run.staged()):
        return [("", ref)]
    return [(name, dataclasses.replace(ref, job_id=job_id)) for name, job_id in run.staged()]


@click.command("runs")
@click.argument("run_name", metavar="[RUN]", required=False)
@click.option("--last", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many of the newest submissions.")
@click.option("--no-state", is_flag=True, help="Do not ask the schedulers for the states.")
@_json_option
def runs_cmd(run_name: Optional[str], last: int, no_state: bool, as_json: bool) -> None:
    """The jobs jobgen submitted from this account (newest last): run name, backend, job id,
    recipe, nodes, state (asked of the scheduler now), run folder. With RUN: what that run was
    submitted with, every submission (its record)."""
    from .. import backends
    from ..backends.protocol import JobRef
    from ..runs import ledger as runs
    if run_name is not None:
        _show_record(run_name, as_json)
        return
    rows = []
    for run in runs.load()[-last:]:
        row = run.as_dict()
        if not no_state:
            try:
                impl = backends.get(backends.scheduler(run.backend))
                found = impl.status(JobRef(run.job_id, run))
                row["state"], row["native_state"] = found.state.value, found.native
            except JobgenError as exc:
                row["state"], row["state_error"] = "?", printable(str(exc))
        rows.append(row)
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        from ..runs.ledger import RECORD, state_dir
        click.echo(f"no runs recorded in {state_dir() / RECORD}", err=True)
        return
    columns = ["name", "backend", "job_id", "recipe", "nodes", "state", "submitted", "run_dir"]
    if no_state:
        columns.remove("state")
    # cells escaped before they are measured (a control character is shown as \x1b, 4 wide)
    table = [columns] + [[printable(str(r.get(c, ""))) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        _echo_text("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())
    # Why a state is `?`: each reason once, under the table.
    for reason in dict.fromkeys(r["state_error"] for r in rows if r.get("state_error")):
        _echo_text(f"?: {reason}")


def _show_record(run: str, as_json: bool) -> None:
    from ..runs import runrecord
    found = runrecord.find(run)
    if found is None:
        raise ConfigError(f"{run}: no record of this run here (`jobgen runs` lists the runs)")
    path, data = found
    events = runrecord.health_events(run)
    from ..runs.restart_counts import counts
    # Restarts in place apart from requeues, where the record is the run folder's own.
    restarts = counts(path.parent) if path.name == runrecord.FILE else None
    if as_json:
        _echo_json({**data, "health": events, **({"restarts": restarts} if restarts else {})})
        return
    import yaml
    _echo_text(f"# {path}")
    for index, entry in enumerate(data["submissions"]):
        shown = {k: v for k, v in entry.items() if k not in ("recipe_text", "site_text", "spec")}
        _echo_text(f"# submission {index + 1} of {len(data['submissions'])}")
        if entry.get("job_stages"):   # a --stages submission: each stage's job, in order
            _echo_text("# jobs: " + ", ".join(f"{name} {job_id}" for name, job_id in
                                              zip(entry["job_stages"], entry["job_ids"])))
        _echo_text(yaml.safe_dump(shown, sort_keys=False, width=100), nl=False)
    if events:
        _echo_text(f"# the health gate: {len(events)} failed check(s)")
        for e in events:
            _echo_text(f"- {e.get('time', '?')} job {e.get('job', '?')} allocation "
                       f"{e.get('allocation', '?')}: node {e.get('node', '?')} "
                       f"({e.get('host', '?')}) failed {e.get('check', '?')}: {e.get('seen', '?')}"
                       f"; needs {e.get('needs', '?')} -> {e.get('action', '?')}")
    if restarts is not None:
        _echo_text(f"# restarts: {restarts['restarts_in_place']} in place (torchrun's, inside an "
                   f"allocation), {restarts['requeues']} requeue(s) (allocations after the first)")
    _echo_text("# the newest submission's resolved spec")
    click.echo(yaml.safe_dump(data["submissions"][-1]["spec"], sort_keys=False, width=100),
               nl=False)
