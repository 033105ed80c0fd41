"""`jobgen report`: where a run's node-hours went, its effective utilisation, its cluster's
figures in plan's form, and its picture."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ..plumbing.errors import printable
from .options import _json_option
from .param_types import _Folder


@click.command("report")
@click.argument("run", required=False)
@click.option("--run-dir", type=_Folder(), help="The run folder (for runs jobgen did not "
                                               "record, or copied from the cluster).")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write one self-contained HTML page: the timeline per allocation and "
                   "node, and the loss, gradient-norm and LR curves with watch's marks.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the same picture as a PNG (needs matplotlib: the plot extra).")
@click.option("--no-sacct", is_flag=True,
              help="Do not ask the scheduler's accounting; use the run's own times only.")
@_json_option
def report_cmd(run: Optional[str], run_dir: Optional[Path], html_path: Optional[Path],
               plot_path: Optional[Path], no_sacct: bool, as_json: bool) -> None:
    """A run's own account: node-hours allocated and where they went (health gate, compile,
    steps that count, steps trained again, checkpoint writes, restart gaps, idle), effective
    utilisation as the reference run defines it, each attempt's share, and the failure rate,
    restart cost and checkpoint write time it measured, as `jobgen plan` options. Works on a
    run still in progress."""
    import json

    from ..reporting import report, text
    made = report.make(run, run_dir, use_sacct=not no_sacct,
                       say=lambda note: click.echo(note, err=True))
    if plot_path is not None:
        from ..reporting import png
        png.write(made, plot_path)
    if html_path is not None:
        from ..reporting import html
        html.write(made, html_path)
    if as_json:
        data = text.as_json(made.timeline, made.account, made.curves, made.name, made.evals,
                            made.exports)
        click.echo(json.dumps(data, indent=2, allow_nan=False))
        return
    # Host names and messages come from the run's files: no control character reaches the
    # terminal (errors.printable, line by line).
    shown = text.text(made.timeline, made.account, made.curves, made.name, made.evals,
                      made.exports)
    click.echo("".join(printable(line) + "\n" for line in shown.splitlines()), nl=False)
    for what, path in (("html", html_path), ("plot", plot_path)):
        if path is not None:
            click.echo(printable(f"{what}: {path}"))
