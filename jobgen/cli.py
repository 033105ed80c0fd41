"""The command line: thin click commands over jobgen.api. Errors become one line and an exit
status in `main`, the only place that catches them."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import click

from .errors import JobgenError

F = Callable[..., Any]


def _spec_options(func: F) -> F:
    """The options every command that resolves a recipe takes (defined once)."""
    for option in reversed((
        click.option("--nodes", "-n", type=int, help="Node count (default: the recipe's)."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="Override a recipe value, e.g. --set optim.lr=1e-4 (repeatable)."),
        click.option("--site", help="Site profile: a name in env/sites/ or a path "
                                    "(default: local)."),
        click.option("--compile", "compile_mode", type=click.Choice(["auto", "always", "never"]),
                     default="auto", show_default=True,
                     help="Compile pass: skip it when the cache has this spec's graphs (auto)."),
        click.option("--run-name", help="Run directory name (default: RECIPE-<N>n); a rerun "
                                        "with the same name resumes from its checkpoints."),
        click.option("--smoke", is_flag=True,
                     help="Rehearse on CPU: the same job with a tiny model of the recipe's family."),
    )):
        func = option(func)
    return func


def _spec(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
          compile_mode: str, run_name: Optional[str], smoke: bool, backend: str = "slurm") -> Any:
    from . import api
    return api.job_spec(recipe, nodes, overrides=overrides, site=site,
                        backend=backend, compile_mode=compile_mode,  # type: ignore[arg-type]
                        run_name=run_name, smoke=smoke)


class _Group(click.Group):
    """Turns jobgen's errors into one line on stderr and their exit status (2 for bad input,
    1 for a refusing scheduler or cloud API): the one place where errors are caught."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JobgenError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobgen")
def cli() -> None:
    """Render training recipes into Slurm (Trainium) and AWS Batch multi-node jobs."""


@cli.command("list")
def list_cmd() -> None:
    """The built-in recipes, one line each."""
    from . import recipe as recipes
    rows = []
    for name in recipes.recipe_names():
        rec, _ = recipes.load(name)
        rows.append((rec.name, rec.payload, rec.platform, f"{rec.nodes}n", rec.description))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])


@cli.command()
@click.argument("recipe")
@_spec_options
@click.option("--backend", type=click.Choice(["slurm", "batch"]), default="slurm",
              show_default=True)
def show(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
         compile_mode: str, run_name: Optional[str], smoke: bool, backend: str) -> None:
    """The resolved job spec: every value, plus derived sizes (DP, accumulation, tokens/step)."""
    import yaml
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend)
    click.echo(yaml.safe_dump(spec.as_dict(), sort_keys=False, default_flow_style=False,
                              width=100), nl=False)


@cli.command()
@click.argument("recipe")
@_spec_options
@click.option("--backend", type=click.Choice(["slurm", "batch"]), default="slurm",
              show_default=True)
@click.option("--output-dir", "-o", type=click.Path(file_okay=False, path_type=Path),
              help="Write the job's files into this folder (atomically) instead of stdout.")
def render(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
           output_dir: Optional[Path]) -> None:
    """Render RECIPE (a built-in name or a YAML file) into a job: stdout, or files in a folder."""
    from . import api
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend)
    plan = api.plan(spec)
    if output_dir is None:
        click.echo(plan.text, nl=False)
        return
    for path in plan.write(output_dir):
        click.echo(str(path))


@cli.command()
@click.option("--site", help="Site profile to render for (default: local).")
@click.option("--recipe", "recipes", multiple=True, help="Only these recipes (repeatable).")
@click.option("--test-only", is_flag=True,
              help="Also ask the Slurm controller with `sbatch --test-only` (node counts the "
                   "cluster can hold).")
@click.option("--no-shellcheck", is_flag=True, help="Skip shellcheck even where it is installed.")
def check(site: Optional[str], recipes: tuple[str, ...], test_only: bool,
          no_shellcheck: bool) -> None:
    """Dry-run every recipe at 1, 2, 4, ... 128 nodes: render, shellcheck, optionally
    `sbatch --test-only`. Exits 1 if anything failed."""
    from . import check as checking
    report = checking.run(site=site, recipes=list(recipes) or None, test_only=test_only,
                          shellcheck=not no_shellcheck)
    click.echo(report.table())
    if report.failed:
        raise SystemExit(1)


@cli.command()
@click.argument("recipe")
@_spec_options
@click.option("--chain", is_flag=True,
              help="Compile and train as two jobs; training depends on the compile job (afterok).")
@click.option("--via", type=click.Choice(["sbatch", "submitit"]), default="sbatch",
              show_default=True, help="Submit the rendered script, or the same job via submitit.")
@click.option("--wait", is_flag=True, help="Follow the job until it ends; exit with its status.")
def submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, chain: bool, via: str,
           wait: bool) -> None:
    """Submit RECIPE to Slurm (exactly the script `jobgen render` prints); prints the job id."""
    from . import api, slurm_client
    from .backends import slurm
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke)
    if via == "submitit":
        from . import submitit_runner
        job = submitit_runner.submit(spec)
        click.echo(job.job_id)
        if wait:
            results = job.results()
            click.echo(f"job {job.job_id}: {len(results)} nodes finished: {results}")
        return
    if chain:
        first, second = slurm_client.submit_chain(slurm.plan(spec, "compile"),
                                                  slurm.plan(spec, "train"))
        click.echo(f"{first} {second}")
        job_id = second
    else:
        job_id = slurm_client.submit(api.plan(spec))
        click.echo(job_id)
    if wait:
        final = slurm_client.wait(job_id, on_change=lambda m: click.echo(m, err=True))
        raise SystemExit(0 if final.state == "COMPLETED" else 1)


@cli.command()
@click.argument("job_id")
def status(job_id: str) -> None:
    """The state of a Slurm job (from the controller, or from accounting once it ended)."""
    from . import slurm_client
    for line in slurm_client.status_lines(job_id):
        click.echo(line)


@cli.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
def logs(job_id: str, follow: bool) -> None:
    """The job's output file (all nodes' launchers write through it; per-node logs are under
    RUN_DIR/logs/JOB_ID/)."""
    from . import slurm_client
    path = slurm_client.log_path(job_id)
    if follow:
        slurm_client.follow(path, job_id, lambda text: click.echo(text, nl=False))
        return
    if not path.exists():
        raise click.ClickException(f"{path}: not written yet")
    click.echo(path.read_text(encoding="utf-8", errors="replace"), nl=False)


@cli.command()
@click.argument("job_id")
def cancel(job_id: str) -> None:
    """Cancel a Slurm job (scancel); a job that already ended is left alone."""
    from . import slurm_client
    click.echo(slurm_client.cancel(job_id))


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point."""
    try:
        cli.main(args=argv, prog_name="jobgen")
    except BrokenPipeError:
        # `jobgen render ... | head`: the reader went away; not worth a traceback.
        sys.stderr.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
