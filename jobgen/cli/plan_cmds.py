"""`jobgen plan`: time, cost and goodput before a reservation is booked."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from .options import _echo_json, _echo_text, _json_option
from .param_types import TEXT, _Amount


@click.command("plan")
@click.argument("recipe")
@click.option("--nodes", "-n", "node_text", metavar="LIST",
              help="Node counts: 16,32,64, or 4..64 (doubling from 4 to 64) (default: the "
                   "recipe's).")
@click.option("--tokens", type=_Amount.of("tokens"),
              help="Train to this many tokens (like 1.8e12).")
@click.option("--samples", type=_Amount.of("samples"),
              help="Train to this many samples (sequences).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe value, as for render (repeatable).")
@click.option("--site", type=TEXT, help="Site profile: prices, node MTBF, storage (default: "
                                        "local).")
@click.option("--price", type=_Amount.of("price"),
              help="US dollars per node-hour (default: the site's).")
@click.option("--rate", type=TEXT, help="Which of the site's prices: on_demand, reserved_3y, ...")
@click.option("--node-mtbf-hours", type=_Amount.of("node_mtbf_hours"),
              help="Mean hours between failures of one node (default: the site's).")
@click.option("--restart-s", type=_Amount.of("restart_s"),
              help="Seconds from a failure to training again, before the checkpoint load "
                   "(default: the site's plan.restart).")
@click.option("--process-failure-share", type=_Amount.of("process_failure_share"),
              help="Of all failures, the share that are a process's on healthy nodes (a crash, "
                   "a hang), 0 to 1; with job.restarts_in_place they restart inside the "
                   "allocation (default: the site's plan.process_failure_share, else 0).")
@click.option("--storage-mb-s", type=_Amount.of("storage_mb_s"),
              help="Checkpoint storage bandwidth, MB/s, read and write (default: the site's).")
@click.option("--checkpoint-gb", type=_Amount.of("checkpoint_gb"),
              help="Checkpoint size in GB (default: from the model's parameters).")
@click.option("--measurements", "measurement_files", multiple=True, metavar="FILE",
              help="Throughput rows of your own, in the form of "
                   "recipes/measurements/published.yaml (repeatable).")
@click.option("--from-run", "from_runs", multiple=True, metavar="RUN",
              help="Use the throughput a finished run logged (a run name or job id; "
                   "repeatable).")
@click.option("--simulate", type=click.IntRange(min=2, max=1_000_000), metavar="N",
              help="Check the expected goodput with N simulated runs (Monte Carlo).")
@click.option("--seed", type=int, default=0, show_default=True, help="The simulation's seed.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a PNG: time to target and goodput against nodes (needs "
                   "matplotlib).")
@_json_option
def plan_cmd(recipe: str, node_text: Optional[str], overrides: tuple[str, ...],
             site: Optional[str], plot_path: Optional[Path], as_json: bool,
             **options: Any) -> None:
    """How long, how much, and how much failures take: throughput from published
    measurements (marked measured or modelled), time and cost to a target, and the expected
    goodput at the recipe's checkpoint interval and at the recommended one."""
    from ..planning import planner, report
    if node_text is not None:
        counts = planner.parse_nodes(node_text)
    else:
        from ..inputs import recipe as recipes
        counts = [recipes.load(recipe, list(overrides))[0].nodes]
    options["measurement_files"] = tuple(options["measurement_files"])
    options["from_runs"] = tuple(options["from_runs"])
    options["simulate"] = options["simulate"] or 0
    taken: list[str] = []
    if options["from_runs"]:   # the runs' measured failure rate and restart cost, too
        from ..reporting import inputs as run_inputs
        taken = run_inputs.fill(options, options["from_runs"])
    result = planner.plan(recipe, counts, overrides, site, planner.Options(**options))
    if plot_path is not None:
        report.plot(result, plot_path)
    if as_json:
        _echo_json(report.as_json(result))
    else:
        click.echo(report.text(result), nl=False)
        for line in taken:
            _echo_text(f"from the run: {line}")
    if plot_path is not None and not as_json:
        _echo_text(f"plot: {plot_path}")
