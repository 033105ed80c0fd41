"""The command line: thin click commands over jobgen.api. Errors become one line and an exit
status in `main`, the only place that catches them."""
from __future__ import annotations

import errno
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import click

from .backends import BACKENDS, SUBMITTED, spec_backend
from .errors import ConfigError, JobgenError, printable

F = Callable[..., Any]


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
        return super().convert(value, param, ctx)


class _Amount(click.ParamType):
    """A finite number more than 0 (1.8e12 tokens, a price, hours), at most `upper` if given."""

    name = "number"

    def __init__(self, upper: Optional[float] = None, unit: str = "") -> None:
        self.upper, self.unit = upper, unit

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Any:
        unit = f" {self.unit}" if self.unit else ""
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number{' of' + unit if unit else ''}", param, ctx)
        if self.upper is not None:
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


def _spec_options(func: F) -> F:
    """The options every command that resolves a recipe takes (defined once)."""
    for option in reversed((
        click.option("--nodes", "-n", type=int, help="Node count (default: the recipe's)."),
        click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                     help="Override a recipe value, e.g. --set optim.lr=1e-4 (repeatable)."),
        click.option("--site", type=TEXT, help="Site profile: a name in env/sites/ or a path "
                                               "(default: local)."),
        click.option("--compile", "compile_mode", type=click.Choice(["auto", "always", "never"]),
                     default="auto", show_default=True,
                     help="Compile pass: skip it when the cache has this spec's graphs (auto)."),
        click.option("--run-name", type=TEXT,
                     help="Run directory name (default: RECIPE-<N>n); a rerun with the same "
                          "name resumes from its checkpoints."),
        click.option("--smoke", is_flag=True,
                     help="Rehearse on CPU: the same job, a tiny model of the recipe's family."),
        *_SLURM_OPTIONS,
        click.option("--sbatch-opt", "slurm_sbatch_opt", multiple=True, metavar="NAME=VALUE",
                     help="Slurm: one more #SBATCH --NAME=VALUE (or --NAME) that jobgen does not "
                          "own: constraint, gres, mem, mail-type, comment, dependency, ... "
                          "(repeatable; after the site's slurm.extra_options)."),
    )):
        func = option(func)
    return func


# Per-job overrides of the site's Slurm values (spec.SLURM_OPTIONS): they land in click's
# keyword arguments under the `slurm_` prefix and reach the spec as one mapping.
_SLURM_OPTIONS = tuple(
    click.option(f"--{name}", f"slurm_{name}", type=TEXT, metavar=metavar, help=text)
    for name, metavar, text in (
        ("partition", "NAME", "Slurm: the partition (default: the site's slurm.partition)."),
        ("account", "NAME", "Slurm: the account to charge (default: the site's)."),
        ("qos", "NAME", "Slurm: the quality of service (default: the site's slurm.qos)."),
        ("reservation", "NAME", "Slurm: run in this reservation (default: the site's)."),
        ("time", "LIMIT", "Slurm: the time limit, e.g. 2-00:00:00 (default: the recipe's "
                          "job.time_limit, else the partition's)."),
        ("exclude", "HOSTS", "Slurm: nodes not to use, e.g. n[3-4],n9."),
        ("nodelist", "HOSTS", "Slurm: nodes the job must include.")))


def _slurm_overrides(kwargs: dict[str, Any]) -> dict[str, Optional[str]]:
    """Take the --partition ... options out of a command's keyword arguments."""
    return {key[len("slurm_"):]: kwargs.pop(key) for key in list(kwargs)
            if key.startswith("slurm_")}


def _spec(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
          compile_mode: str, run_name: Optional[str], smoke: bool, backend: str = "slurm",
          slurm: Optional[dict[str, Optional[str]]] = None) -> Any:
    from . import api
    return api.job_spec(recipe, nodes, overrides=overrides, site=site,
                        backend=spec_backend(backend),  # type: ignore[arg-type]
                        compile_mode=compile_mode,  # type: ignore[arg-type]
                        run_name=run_name, smoke=smoke, slurm=slurm)


_target_options = (
    click.option("--tokens", type=_Amount(), help="Train to this many tokens (like 1.8e12): the "
                                                  "schedule's steps as `jobgen plan` counts them."),
    click.option("--samples", type=_Amount(), help="Train to this many samples (sequences)."))


def _targeted(func: F) -> F:
    for option in reversed(_target_options):
        func = option(func)
    return func


def _with_target(recipe: str, nodes: Optional[int], overrides: tuple[str, ...],
                 site: Optional[str], backend: str, smoke: bool, tokens: Optional[float],
                 samples: Optional[float]) -> tuple[str, ...]:
    """The overrides, plus schedule.max_steps for a --tokens/--samples target (what plan
    assumes is then what the job trains; the run's record keeps the override)."""
    if tokens is None and samples is None:
        return overrides
    from . import api
    spec = _spec(recipe, nodes, overrides, site, "auto", None, smoke, backend)
    return overrides + (f"schedule.max_steps={api.steps_for_target(spec, tokens, samples)}",)


class _Group(click.Group):
    """Turns jobgen's errors into one line on stderr and their exit status (2 for bad input,
    1 for a refusing scheduler or cloud API): the one place where errors are caught."""

    def invoke(self, ctx: click.Context) -> Any:
        loaded = sys.modules.get(f"{__package__}.batch_client")
        if loaded is not None:   # --region/--profile are one command's (in-process callers)
            loaded.FLAGS.clear()
        try:
            return super().invoke(ctx)
        except JobgenError as exc:
            # Always one line, even when a bad key or file name holds a line break or an ESC.
            click.echo(f"error: {printable(str(exc))}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            # Ctrl-C (SIGINT): 130 as a shell reports it, not click's "Aborted!" and 1.
            click.echo("error: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="jobgen")
def cli() -> None:
    """Render training recipes into jobs for four backends: Slurm (sbatch scripts, Trainium),
    AWS Batch multi-node parallel jobs (Gaudi, Trainium), SageMaker training jobs (model-parallel
    library v2) and Amazon EKS (Indexed Jobs or PyTorchJobs); submit them, rehearse them on
    CPU, plan them and watch them. A run is what was submitted: its payload snapshot and its
    record (`jobgen runs RUN`) are kept with it."""


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for programs) instead of text.")
def list_cmd(as_json: bool) -> None:
    """The built-in recipes, one line each."""
    from . import recipe as recipes
    rows = []
    for name in recipes.recipe_names():
        rec, _ = recipes.load(name)
        rows.append((rec.name, rec.payload, rec.platform, f"{rec.nodes}n", rec.description))
    if not rows:
        from .resources import folder
        raise ConfigError(f"no recipes in {folder('recipes')} (this installation has lost its "
                          "built-in recipes: reinstall jobgen)")
    if as_json:
        _echo_json([{"name": r[0], "payload": r[1], "platform": r[2], "nodes": int(r[3][:-1]),
                     "description": r[4]} for r in rows])
        return
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4])


def _backend_option(choices: tuple[str, ...], help: str) -> Callable[[F], F]:
    return click.option("--backend", type=click.Choice(choices), default="slurm",
                        show_default=True, help=help)


_json_option = click.option("--json", "as_json", is_flag=True,
                            help="Print JSON (for programs) instead of text.")


def _echo_json(data: Any) -> None:
    import json
    click.echo(json.dumps(data, indent=2, sort_keys=False))


@cli.command()
@click.argument("recipe")
@_spec_options
@_backend_option(BACKENDS, "Resolve for this backend (paths differ on Batch).")
@_targeted
@_json_option
def show(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
         compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
         tokens: Optional[float], samples: Optional[float], as_json: bool,
         **slurm: Optional[str]) -> None:
    """The resolved job spec: every value, plus derived sizes (DP, accumulation, tokens/step);
    with --smoke, what the rehearsal trains instead."""
    overrides = _with_target(recipe, nodes, overrides, site, backend, smoke, tokens, samples)
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend,
                 _slurm_overrides(slurm))
    from . import userconfig
    from .payloads import key_report
    shown = spec.as_dict()
    ref, origin = userconfig.site(site)
    # Where the site came from: --site, JOBGEN_SITE, the config file, or the built-in default.
    said = origin if ref == spec.site.name or origin == "--site" else f"{origin} ({ref})"
    shown = {k: v for key, value in shown.items()
             for k, v in ([(key, value), ("site_from", said)] if key == "site"
                          else [(key, value)])}
    # Which values reach the trainer: the rest must stay at their defaults (or are refused).
    shown["payload_keys"] = key_report(spec.recipe)
    from . import health
    shown["health_gate"] = health.describe(spec)
    if as_json:
        _echo_json(shown)
        return
    import yaml
    click.echo(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False,
                              width=100), nl=False)


@cli.command()
@click.argument("recipe")
@_spec_options
@_backend_option(BACKENDS, "An sbatch script, a Batch job definition, what submitit is "
                           "handed, or the local run's node commands.")
@click.option("--output-dir", "-o", type=_Folder(),
              help="Write the job's files into this folder (atomically) instead of stdout.")
@_targeted
def render(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
           output_dir: Optional[Path], tokens: Optional[float], samples: Optional[float],
           **slurm: Optional[str]) -> None:
    """Render RECIPE (a built-in name or a YAML file) into a job: stdout, or files in a folder."""
    from . import api
    _need_aws_sdk(backend)
    overrides = _with_target(recipe, nodes, overrides, site, backend, smoke, tokens, samples)
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend,
                 _slurm_overrides(slurm))
    plan = api.plan(spec, backend)
    from .backends import get as backend_impl
    if output_dir is None:
        click.echo(plan.text, nl=False)
        # Out first, then the payload snapshot the script points at (or the image check of a
        # container backend): output that cannot be written leaves nothing behind, and
        # `render | sbatch` reads to the end of the output, which comes when jobgen exits.
        sys.stdout.flush()
    written = plan.write(output_dir) if output_dir is not None else []
    backend_impl(backend).prepare(spec, strict=False, say=lambda m: click.echo(m, err=True))
    for path in written:
        click.echo(str(path))


@cli.command()
@click.option("--site", type=TEXT, help="Site profile to render for (default: local).")
@click.option("--recipe", "recipes", multiple=True, help="Only these recipes (repeatable).")
@click.option("--test-only", is_flag=True,
              help="Also ask the Slurm controller with `sbatch --test-only` (node counts the "
                   "cluster can hold).")
@click.option("--no-shellcheck", is_flag=True,
              help="Do not lint with shellcheck (without this, a missing shellcheck fails).")
@click.option("--max-nodes", type=click.IntRange(min=1), default=128, show_default=True,
              help="Try every node count from 1 to this (or the site's limit, if lower).")
@click.option("--backend", type=click.Choice(["slurm", "batch", "sagemaker", "eks"]),
              default="slurm", show_default=True,
              help="Check sbatch scripts, Batch job definitions, SageMaker training job "
                   "requests or EKS manifests.")
@_json_option
def check(site: Optional[str], recipes: tuple[str, ...], test_only: bool,
          no_shellcheck: bool, max_nodes: int, backend: str, as_json: bool) -> None:
    """Dry-run every recipe at every node count the site allows (up to --max-nodes): render,
    shellcheck, optionally `sbatch --test-only`. Exits 1 if anything failed or a check could
    not run."""
    from . import check as checking
    _need_aws_sdk(backend)
    report = checking.run(site=site, recipes=list(recipes) or None, test_only=test_only,
                          shellcheck=not no_shellcheck, backend=backend,  # type: ignore[arg-type]
                          max_nodes=max_nodes)
    if as_json:
        _echo_json(report.as_dict())
    else:
        click.echo(report.table())
    if not report.ok:
        raise SystemExit(1)


def _aws_flag(name: str) -> Callable[[F], F]:
    """--region / --profile: the AWS CLI's flags, ahead of AWS_REGION / AWS_PROFILE, the site
    and the AWS config file (jobgen/batch_client.py: region)."""
    def remember(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> None:
        if value is not None:
            from .batch_client import FLAGS
            from .site import REGION_RE
            if name == "region" and not REGION_RE.fullmatch(value):
                raise click.BadParameter(f"{value!r} is not an AWS region name (like us-east-1)")
            FLAGS[name] = value
    what = ("the AWS region (default: AWS_REGION, AWS_DEFAULT_REGION, the site's, the AWS "
            "config's)" if name == "region" else "the AWS profile of the config and "
            "credentials files (default: AWS_PROFILE, else default)")
    return click.option(f"--{name}", type=TEXT, metavar=name.upper(), expose_value=False,
                        callback=remember, help=f"Batch, SageMaker: {what}.")


_endpoint_option = click.option(
    "--endpoint-url", metavar="URL", type=TEXT,
    help="Batch, SageMaker: an AWS endpoint (e.g. a moto server); default: AWS_ENDPOINT_URL or "
         "AWS's own.")


def _submit_options(func: F) -> F:
    """The options of a submission (defined once: `submit` and its alias `batch submit`)."""
    for option in reversed((
        click.option("--amend", is_flag=True,
                     help="Submit into an existing run although its training values or "
                          "payload differ (a longer schedule, say); the run's record keeps "
                          "every submission."),
        click.option("--wait", is_flag=True,
                     help="Follow the job until it ends; exit with its status."),
        click.option("--poll", type=_Seconds(), metavar="SECONDS",
                     help="How often --wait asks the scheduler (default: 2 s Slurm, 15 s "
                          "Batch)."),
        click.option("--queue", type=TEXT,
                     help="Batch: the job queue (default: the site's batch.job_queue)."),
        _endpoint_option, _aws_flag("region"), _aws_flag("profile"),
        click.option("--dry-run", is_flag=True,
                     help="Print what would run instead of running it: Slurm, a bash script of "
                          "the sbatch commands with their scripts (`| bash` submits it); Batch, "
                          "the RegisterJobDefinition and SubmitJob requests; submitit, its "
                          "parameters and each node's command. Checks and submits nothing."),
    )):
        func = option(func)
    return func


@cli.command()
@click.argument("recipe")
@_spec_options
@_backend_option(SUBMITTED, "Where the job goes: sbatch, an AWS Batch multi-node job, or "
                            "Slurm through submitit.")
@click.option("--via", type=click.Choice(["sbatch", "submitit"]), hidden=True,
              help="Old spelling of --backend slurm|submitit.")
@click.option("--chain", is_flag=True,
              help="Slurm: compile and train as two jobs; training depends on the compile job "
                   "(afterok).")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="One job per combination of the values (repeatable; a Slurm job array "
                   "where the jobs' #SBATCH lines agree), each with its own run name.")
@click.option("--no-check", is_flag=True,
              help="Slurm: submit without first checking, from this host, that the launcher "
                   "and the trainer are where the site says and that the partition has the "
                   "nodes.")
@_submit_options
@_targeted
def submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
           via: Optional[str], chain: bool, sweeps: tuple[str, ...], no_check: bool,
           amend: bool, wait: bool, poll: Optional[float], queue: Optional[str],
           endpoint_url: Optional[str], dry_run: bool, tokens: Optional[float],
           samples: Optional[float], **slurm: Optional[str]) -> None:
    """Submit RECIPE (exactly what `jobgen render` prints for the backend); prints the job id
    (two for --chain, one per job of a --sweep) and records each run for `jobgen runs`."""
    if via is not None:
        backend = "submitit" if via == "submitit" else "slurm"
    overrides = _with_target(recipe, nodes, overrides, site, backend, smoke, tokens, samples)
    _submit(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend, chain,
            not no_check, wait, poll, queue, endpoint_url, dry_run, _slurm_overrides(slurm),
            sweeps, amend)


def _submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...],
            site: Optional[str], compile_mode: str, run_name: Optional[str], smoke: bool,
            backend: str, chain: bool, check: bool, wait: bool, poll: Optional[float],
            queue: Optional[str], endpoint_url: Optional[str], dry_run: bool,
            slurm: Optional[dict[str, Optional[str]]] = None,
            sweeps: tuple[str, ...] = (), amend: bool = False,
            pinned: Optional[tuple[Any, Path, Path]] = None) -> None:
    """`pinned`: (spec, recipe file, site file) of `jobgen resubmit`, resolved already."""
    import os

    from . import backends, runs
    if queue is not None and backend != "batch":
        raise click.UsageError("--queue is for --backend batch")
    if endpoint_url is not None and backend not in ("batch", "sagemaker"):
        raise click.UsageError("--endpoint-url is for --backend batch or sagemaker")
    if chain and backend != "slurm":
        raise click.UsageError(f"--chain is for --backend slurm ({backend} runs both passes in "
                               "one job)")
    if chain and sweeps:
        raise click.UsageError("--chain and --sweep together are not supported: submit the "
                               "sweep as one job per combination (both passes in each)")
    if backend in ("batch", "sagemaker"):
        _need_aws_sdk(backend)
    spec = pinned[0] if pinned is not None else \
        _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend, slurm)
    specs = [spec]
    point_overrides: list[tuple[str, ...]] = [()]
    if sweeps:
        from . import sweep
        points = sweep.points(sweeps, spec.run_name)
        point_overrides = [point.overrides + sweep.port_override(
            point, i, spec.recipe.job.master_port, sweeps) for i, point in enumerate(points)]
        specs = [_spec(recipe, nodes, overrides + extra, site, compile_mode, point.run_name,
                       smoke, backend, slurm) for point, extra in zip(points, point_overrides)]
    impl = backends.get(backend)
    options = backends.SubmitOptions(chain=chain, check=check, queue=queue,
                                     endpoint_url=endpoint_url,
                                     say=lambda note: click.echo(note, err=True))
    from .backends import slurm as slurm_backend
    array = backend == "slurm" and len(specs) > 1 and slurm_backend.sweepable(specs)
    if dry_run:
        if array:
            click.echo(slurm_backend.dry_run_sweep(specs, options), nl=False)
        else:
            for one in specs:
                click.echo(impl.dry_run(one, options), nl=False)
        return
    if site is None:   # the user's default (JOBGEN_SITE, the config file, local), recorded
        from . import userconfig
        site = userconfig.site(None)[0]
    site_ref = site if not ("/" in site or site.endswith((".yaml", ".yml"))) \
        else os.path.abspath(site)
    from . import runrecord
    here = getattr(impl, "RUN_DIR_HERE", False)
    from .recipe import locate as locate_recipe
    from .site import locate as locate_site
    recipe_file, site_file = (pinned[1], pinned[2]) if pinned is not None else \
        (locate_recipe(recipe)[0], locate_site(site)[0])
    entries = []
    for one, point in zip(specs, point_overrides):
        new = runrecord.submission(one, backend=backend, overrides=overrides + point,
                                   site_ref=site_ref or "", recipe_file=recipe_file,
                                   site_file=site_file, amend=amend, resubmit=pinned is not None)
        entries.append((new, runrecord.admit(one, new, here, amend)))
    if array:
        submitted = slurm_backend.submit_sweep(specs, options)
    else:
        submitted = [impl.submit(one, options) for one in specs]
    refs: list[Any] = []
    for one, done in zip(specs, submitted):
        for note in done.notes:
            click.echo(note, err=True)
        click.echo(" ".join(done.job_ids) + (f"  {one.run_name}" if len(specs) > 1 else ""))
        run_dir = one.run_dir if backend in ("batch", "sagemaker", "eks") \
            else os.path.abspath(one.run_dir)
        record = runs.Run(name=one.run_name, backend=backend, job_id=done.job_id,
                          recipe=one.recipe.name, nodes=one.nodes, site=site_ref or "",
                          run_dir=run_dir, submitted=runs.now(), jobs=done.job_ids,
                          smoke=one.smoke, endpoint_url=endpoint_url, queue=done.queue,
                          max_steps=(one.rehearsal.max_steps if one.rehearsal
                                     else one.recipe.schedule.max_steps),
                          seq_length=(one.rehearsal.seq_length if one.rehearsal
                                      else one.recipe.model.seq_length))
        new, old = entries[len(refs)]
        for warning in (runs.record(record),
                        runrecord.commit(one, new, old, done.job_ids, here)):
            if warning:
                click.echo(f"warning: {warning}", err=True)
        refs.append(backends.JobRef(done.job_id, record, site, endpoint_url))
    if wait:
        from .progress import Ticker
        default_poll = 15.0 if backend in ("batch", "sagemaker", "eks") else 2.0
        def steps() -> str:   # the newest step, where the run folders are on this machine
            from .progress import newest_step
            if not getattr(impl, "RUN_DIR_HERE", False):
                return ""
            found = [(newest_step(r.run.run_dir, r.job_id), r.run.max_steps) for r in refs]
            return ", ".join(f"step {n}/{m}" for n, m in found if n is not None)

        with Ticker(steps=steps) as ticker:
            statuses = [impl.wait(ref, ticker.say, poll if poll is not None else default_poll)
                        for ref in refs]
        raise SystemExit(max(statuses))


@cli.command()
@click.argument("run")
@click.option("--no-check", is_flag=True,
              help="Slurm: submit without first checking from this host (as for submit).")
@click.option("--wait", is_flag=True, help="Follow the job until it ends; exit with its status.")
@click.option("--poll", type=_Seconds(), metavar="SECONDS", help="How often --wait asks.")
@_endpoint_option
@click.option("--dry-run", is_flag=True, help="Print what would run; submit nothing.")
def resubmit(run: str, no_check: bool, wait: bool, poll: Optional[float],
             endpoint_url: Optional[str], dry_run: bool) -> None:
    """Submit RUN again exactly as it was last submitted: its recorded recipe and site files,
    overrides, node count, Slurm request and payload snapshot (refused where this jobgen would
    train anything else)."""
    import tempfile

    from . import runrecord
    found = runrecord.find(run)
    if found is None:
        raise ConfigError(f"{run}: no record of this run here (`jobgen runs` lists the runs "
                          "submitted from this account)")
    with tempfile.TemporaryDirectory(prefix="jobgen-resubmit-") as tmp:
        spec, recipe_file, site_file, last = runrecord.recorded_spec(found[1], Path(tmp))
        try:   # where it was submitted from: the site's relative paths start there
            os.chdir(last["cwd"])
        except OSError as exc:
            raise ConfigError(f"{run}: cannot go to {last['cwd']}, where it was submitted "
                              f"from: {exc.strerror}") from None
        _submit(last["recipe"], spec.nodes, tuple(last["overrides"]), last["site"] or None,
                spec.compile_mode, spec.run_name, spec.smoke, last["backend"], False,
                not no_check, wait, poll, None, endpoint_url, dry_run,
                pinned=(spec, recipe_file, site_file))


@cli.command("schema")
@click.argument("what", type=click.Choice(["recipe", "site"]))
def schema_cmd(what: str) -> None:
    """The JSON Schema (draft 2020-12) of a recipe or a site profile, generated from the records
    and value rules the loader uses: point an editor at it with a
    `# yaml-language-server: $schema=FILE` line."""
    from . import json_schema
    _echo_json(json_schema.recipe_schema() if what == "recipe" else json_schema.site_schema())


@cli.command("image-context")
@click.argument("folder", type=_Folder())
def image_context(folder: Path) -> None:
    """Write the build context of jobgen's container images to FOLDER (a new folder): the
    payload with its digest file, and env/containers/; print the docker build commands, whose
    tags carry the payload id that jobs rendered by this jobgen name."""
    import shutil

    from . import resources, snapshot
    full = snapshot.digest()
    if folder.exists():
        raise ConfigError(f"{folder}: exists; give a new folder")
    snapshot.export(folder / "payload", full)
    shutil.copytree(resources.folder("containers"), folder / "env" / "containers")
    tag = snapshot.short(full)
    for name, dockerfile in (("jobgen-neuron", "neuron"), ("jobgen-habana", "habana"),
                             ("jobgen-smp", "sagemaker-pytorch")):
        click.echo(f"docker build -f {folder}/env/containers/{dockerfile}.Dockerfile "
                   f"--label io.jobgen.payload={full} -t {name}:{tag} {folder}")


@cli.command()
@click.argument("recipe")
@_spec_options
@click.option("--dry-run", is_flag=True,
              help="Print each emulated node's command and environment; run nothing.")
@click.option("--backend", "run_backend", type=click.Choice(["local", "sagemaker", "eks"]),
              default="local", show_default=True,
              help="Whose nodes to emulate: jobgen's own, the SageMaker training job's "
                   "instances or the EKS job's pods (their rendered commands and environment).")
def run(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
        compile_mode: str, run_name: Optional[str], smoke: bool, dry_run: bool,
        run_backend: str, **slurm: Optional[str]) -> None:
    """Run the job on this machine, no scheduler: one process group per emulated node (use
    --smoke where there are no accelerators). Exits with the main node's status."""
    from . import local_runner
    given = [k.replace("_", "-") for k, v in _slurm_overrides(slurm).items()
             if v not in (None, ())]
    if given:
        raise click.UsageError(f"--{given[0]} is a Slurm setting; `jobgen run` uses no "
                               "scheduler")
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, run_backend)
    if dry_run and run_backend != "local":
        import json
        for index, (argv, env) in enumerate(local_runner.commands(spec, "dry-run",
                                                                  write=False)):
            click.echo(json.dumps({"node": index, "argv": argv, "env": env}, indent=2))
        return
    if dry_run:
        from . import backends
        click.echo(backends.get("local").dry_run(spec, backends.SubmitOptions()), nl=False)
        return
    import time

    from . import runs
    # Recorded like a submission, so `jobgen runs` and `status` know it (its state is the
    # status its nodes wrote: jobgen/backends/local.py).
    job_id = f"local-{int(time.time())}"
    warning = runs.record(runs.Run(
        name=spec.run_name, backend="local", job_id=job_id, recipe=spec.recipe.name,
        nodes=spec.nodes, site=site or "", run_dir=os.path.abspath(spec.run_dir),
        submitted=runs.now(), jobs=(job_id,), smoke=spec.smoke))
    if warning:
        click.echo(f"warning: {warning}", err=True)
    status = local_runner.run(spec, emit=click.echo, job_id=job_id)
    if status == 75:
        click.echo("jobgen: the health gate found a bad node (the lines above name it and the "
                   "check); nothing was compiled or trained", err=True)
    raise SystemExit(status)


def _job_options(func: F) -> F:
    """How a submitted job is named and where to ask about it (status, logs, cancel, and their
    `jobgen batch` aliases)."""
    func = _aws_flag("profile")(_aws_flag("region")(_endpoint_option(func)))
    return click.option("--site", type=TEXT,
                        help="Batch: site profile (region, log group; default: the run's, "
                             "else local).")(func)


def _job(ref: str, backend: Optional[str], site: Optional[str],
         endpoint_url: Optional[str]) -> tuple[Any, Any]:
    """(the backend, the job) for REF: a run name or a job id jobgen recorded (its backend comes
    from the record), else a job id of `backend` (default slurm)."""
    from . import backends, runs
    if not ref.strip():
        raise click.UsageError("the job must not be empty (a run name or a job id)")
    found = runs.find(ref)
    if found is not None:
        if backend is not None and backend != found.scheduler:
            raise ConfigError(f"{ref}: recorded as a {found.backend} job, not {backend}")
        name = found.scheduler
        job_id = found.job_id if ref == found.name else ref
    else:   # Batch job ids are UUIDs; Slurm's are numbers
        uuid = re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}(#\d+)?", ref)
        name, job_id = backend or ("batch" if uuid else "slurm"), ref
    if name in ("batch", "sagemaker"):
        _need_aws_sdk(name)
    elif endpoint_url is not None:
        raise click.UsageError("--endpoint-url is for Batch and SageMaker jobs")
    return backends.get(name), backends.JobRef(job_id, found, site, endpoint_url)


_job_backend = click.option("--backend", type=click.Choice(["slurm", "batch", "sagemaker",
                                                          "eks"]),
                            help="Whose job id this is, for ids jobgen did not record "
                                 "(default: slurm).")


@cli.command()
@click.argument("job")
@_job_backend
@_job_options
@_json_option
def status(job: str, backend: Optional[str], site: Optional[str],
           endpoint_url: Optional[str], as_json: bool) -> None:
    """The state of JOB (a run name or a job id): Slurm's from the controller, or from
    accounting once it ended; Batch's for the job and each node."""
    impl, ref = _job(job, backend, site, endpoint_url)
    if as_json:
        data = impl.status(ref)
        data["run"] = ref.run.as_dict() if ref.run else None
        _echo_json(data)
        return
    for line in impl.status_lines(ref):
        click.echo(line)


@cli.command()
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
    """The logs of JOB (a run name or a job id)."""
    impl, ref = _job(job, backend, site, endpoint_url)
    impl.logs(ref, node, follow, lambda text: click.echo(text, nl=False))


@cli.command()
@click.argument("job")
@_job_backend
@_job_options
def cancel(job: str, backend: Optional[str], site: Optional[str],
           endpoint_url: Optional[str]) -> None:
    """Cancel JOB (a run name or a job id); a job that already ended is left alone."""
    impl, ref = _job(job, backend, site, endpoint_url)
    click.echo(impl.cancel(ref))


@cli.command("plan")
@click.argument("recipe")
@click.option("--nodes", "-n", "node_text", metavar="LIST",
              help="Node counts: 16,32,64, or 4..64 (doubling from 4 to 64) (default: the "
                   "recipe's).")
@click.option("--tokens", type=_Amount(), help="Train to this many tokens (like 1.8e12).")
@click.option("--samples", type=_Amount(), help="Train to this many samples (sequences).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a recipe value, as for render (repeatable).")
@click.option("--site", type=TEXT, help="Site profile: prices, node MTBF, storage (default: "
                                        "local).")
@click.option("--price", type=_Amount(), help="US dollars per node-hour (default: the site's).")
@click.option("--rate", type=TEXT, help="Which of the site's prices: on_demand, reserved_3y, ...")
@click.option("--node-mtbf-hours", type=_Amount(),
              help="Mean hours between failures of one node (default: the site's).")
@click.option("--restart-s", type=click.FloatRange(min=0),
              help="Seconds from a failure to training again, before the checkpoint load "
                   "(default: the site's plan.restart).")
@click.option("--storage-mb-s", type=_Amount(),
              help="Checkpoint storage bandwidth, MB/s, read and write (default: the site's).")
@click.option("--checkpoint-gb", type=_Amount(),
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
    from .planning import planner, report
    if node_text is not None:
        counts = planner.parse_nodes(node_text)
    else:
        from . import recipe as recipes
        counts = [recipes.load(recipe, list(overrides))[0].nodes]
    options["measurement_files"] = tuple(options["measurement_files"])
    options["from_runs"] = tuple(options["from_runs"])
    options["simulate"] = options["simulate"] or 0
    result = planner.plan(recipe, counts, overrides, site, planner.Options(**options))
    if plot_path is not None:
        report.plot(result, plot_path)
    if as_json:
        _echo_json(report.as_json(result))
    else:
        click.echo(report.text(result), nl=False)
    if plot_path is not None and not as_json:
        click.echo(f"plot: {plot_path}")


@cli.command("watch")
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
@click.option("--max-actions", type=click.IntRange(min=0), default=3, show_default=True,
              help="Requeues, stops and rollbacks at most.")
@click.option("--poll", "poll_s", type=_Amount(3600, "seconds"), default=5.0,
              show_default=True, help="Seconds between looks at the job and its files.")
@click.option("--every", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds between status lines when stdout is not a terminal.")
@click.option("--max-steps", type=click.IntRange(min=1),
              help="The run's last step, for the time to finish (default: recorded).")
@click.option("--spike-window", type=click.IntRange(min=2), default=20, show_default=True,
              help="Steps in the running mean of the gradient norm (and of the loss).")
@click.option("--spike-margin", type=click.FloatRange(min=0), default=0.1, show_default=True,
              help="A spike: gradient norm above the running mean plus this.")
@click.option("--spike-patience", type=click.IntRange(min=1), default=5, show_default=True,
              help="A spike lasting this many steps is divergence.")
@click.option("--growth-factor", type=_Amount(), default=3.0, show_default=True,
              help="Divergence: gradient norm above this x its lowest running mean ...")
@click.option("--growth-steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="... for this many steps in a row.")
@click.option("--loss-spike", type=_Amount(), default=0.5, show_default=True,
              help="A loss spike: loss above (1 + this) x its running mean.")
@click.option("--hang-factor", type=_Amount(), default=10.0, show_default=True,
              help="A hang: no step for this x the median step time ...")
@click.option("--hang-min", "hang_min_s", type=click.FloatRange(min=0), default=300.0,
              show_default=True, help="... and at least this many seconds (saves take long).")
@click.option("--drop", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
              default=0.3, show_default=True,
              help="A throughput drop: the recent median this fraction below the earlier one.")
@click.option("--drop-steps", type=click.IntRange(min=1), default=5, show_default=True,
              help="Steps in the recent median (the earlier one needs twice as many).")
@click.option("--restarts-per-node", type=click.IntRange(min=1), default=2, show_default=True,
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
    causing restarts; act on hangs and divergence when asked. Exits when the job ends (0 if it
    completed), with a summary."""
    from .watching import command
    from .watching.detectors import Rules
    from .watching.watcher import Policy
    rules = Rules(**rule_values)
    if job is None:
        if run_dir is None:
            raise click.UsageError("give JOB (a run name or a job id) or --run-dir FOLDER")
        if on_hang or on_diverge or notify_spec:
            raise click.UsageError("--on-hang, --on-diverge and --notify act on a job: give JOB")
        summary = command.watch_recorded(run_dir, rules, as_json)
        raise SystemExit(1 if any(a.category != "report" for a in summary.alerts) else 0)
    notify = command.parse_notify(notify_spec)
    if "notify" in (on_hang, on_diverge) and notify is None:
        raise click.UsageError("the notify action needs --notify cmd:COMMAND")
    impl, ref = _job(job, backend, site, endpoint_url)
    name = impl.__name__.rsplit(".", 1)[-1]
    if name not in ("slurm", "batch"):
        # SageMaker's and EKS's jobs have no reader here yet (CloudWatch, pod logs).
        raise ConfigError(f"{job}: a {name} job cannot be watched while it runs (jobgen watch "
                          "follows Slurm and AWS Batch jobs); judge its run folder afterwards "
                          "with jobgen watch --run-dir FOLDER")
    summary = command.watch_job(name, ref, run_dir=run_dir, rules=rules,
                                policy=Policy(on_hang, on_diverge, notify, max_actions),
                                as_json=as_json, poll_s=poll_s, every=every,
                                max_steps=max_steps)
    raise SystemExit(0 if summary.state in ("COMPLETED", "SUCCEEDED") else 1)


@cli.command("runs")
@click.argument("run_name", metavar="[RUN]", required=False)
@click.option("--last", type=click.IntRange(min=1), default=20, show_default=True,
              help="How many of the newest submissions.")
@click.option("--no-state", is_flag=True, help="Do not ask the schedulers for the states.")
@_json_option
def runs_cmd(run_name: Optional[str], last: int, no_state: bool, as_json: bool) -> None:
    """The jobs jobgen submitted from this account (newest last): run name, backend, job id,
    recipe, nodes, state (asked of the scheduler now), run folder. With RUN: what that run was
    submitted with, every submission (its record)."""
    from . import backends, runs
    if run_name is not None:
        _show_record(run_name, as_json)
        return
    rows = []
    for run in runs.load()[-last:]:
        row = run.as_dict()
        if not no_state:
            try:
                impl = backends.get(run.scheduler)
                row["state"] = impl.status(backends.JobRef(run.job_id, run))["state"]
            except JobgenError as exc:
                row["state"], row["state_error"] = "?", printable(str(exc))
        rows.append(row)
    if as_json:
        _echo_json(rows)
        return
    if not rows:
        from .runs import RECORD, state_dir
        click.echo(f"no runs recorded in {state_dir() / RECORD}", err=True)
        return
    columns = ["name", "backend", "job_id", "recipe", "nodes", "state", "submitted", "run_dir"]
    if no_state:
        columns.remove("state")
    table = [columns] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        click.echo("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())
    # Why a state is `?`: each reason once, under the table.
    for reason in dict.fromkeys(r["state_error"] for r in rows if r.get("state_error")):
        click.echo(f"?: {reason}")


def _show_record(run: str, as_json: bool) -> None:
    from . import runrecord
    found = runrecord.find(run)
    if found is None:
        raise ConfigError(f"{run}: no record of this run here (`jobgen runs` lists the runs)")
    path, data = found
    events = runrecord.health_events(run)
    if as_json:
        _echo_json({**data, "health": events})
        return
    import yaml
    click.echo(f"# {path}")
    for index, entry in enumerate(data["submissions"]):
        shown = {k: v for k, v in entry.items() if k not in ("recipe_text", "site_text", "spec")}
        click.echo(f"# submission {index + 1} of {len(data['submissions'])}")
        click.echo(yaml.safe_dump(shown, sort_keys=False, width=100), nl=False)
    if events:
        click.echo(f"# the health gate: {len(events)} failed check(s)")
        for e in events:
            click.echo(f"- {e.get('time', '?')} job {e.get('job', '?')} allocation "
                       f"{e.get('allocation', '?')}: node {e.get('node', '?')} "
                       f"({e.get('host', '?')}) failed {e.get('check', '?')}: {e.get('seen', '?')}"
                       f"; needs {e.get('needs', '?')} -> {e.get('action', '?')}")
    click.echo("# the newest submission's resolved spec")
    click.echo(yaml.safe_dump(data["submissions"][-1]["spec"], sort_keys=False, width=100),
               nl=False)


# --- AWS Batch: `jobgen batch ...` are aliases of the commands above with --backend batch ----

def _need_aws_sdk(backend: str = "batch") -> None:
    """Without the [batch] extra, one line naming it (exit 2) before anything is written."""
    if backend in ("batch", "sagemaker"):
        from .batch_client import require_sdk
        require_sdk(f"--backend {backend}", ("botocore",), extra=backend)


@cli.group("batch")
def batch_group() -> None:
    """AWS Batch multi-node jobs (aliases of submit/status/logs/cancel with --backend batch);
    validate job definitions. (Each command checks for the [batch] extra: --help needs none.)"""


@batch_group.command("submit")
@click.argument("recipe")
@_spec_options
@_submit_options
def batch_submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...],
                 site: Optional[str], compile_mode: str, run_name: Optional[str], smoke: bool,
                 amend: bool, wait: bool, poll: Optional[float], queue: Optional[str],
                 endpoint_url: Optional[str], dry_run: bool, **slurm: Optional[str]) -> None:
    """`jobgen submit --backend batch`: register RECIPE's job definition (only if it changed)
    and submit it; prints the job id."""
    _submit(recipe, nodes, overrides, site, compile_mode, run_name, smoke, "batch", False,
            True, wait, poll, queue, endpoint_url, dry_run, _slurm_overrides(slurm), (),
            amend)


@batch_group.command("status")
@click.argument("job")
@_job_options
@_json_option
@click.pass_context
def batch_status(ctx: click.Context, job: str, site: Optional[str],
                 endpoint_url: Optional[str], as_json: bool) -> None:
    """`jobgen status --backend batch`: the job's state, then each node's."""
    ctx.invoke(status, job=job, backend="batch", site=site, endpoint_url=endpoint_url,
               as_json=as_json)


@batch_group.command("logs")
@click.argument("job")
@click.option("--node", type=click.IntRange(min=0), default=0, show_default=True,
              help="Node index (0 is the main node).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@_job_options
@click.pass_context
def batch_logs(ctx: click.Context, job: str, node: int, follow: bool, site: Optional[str],
               endpoint_url: Optional[str]) -> None:
    """`jobgen logs --backend batch`: a node's CloudWatch log events."""
    ctx.invoke(logs, job=job, node=node, follow=follow, backend="batch", site=site,
               endpoint_url=endpoint_url)


@batch_group.command("cancel")
@click.argument("job")
@_job_options
@click.pass_context
def batch_cancel(ctx: click.Context, job: str, site: Optional[str],
                 endpoint_url: Optional[str]) -> None:
    """`jobgen cancel --backend batch`: cancel a queued job, terminate a started one."""
    ctx.invoke(cancel, job=job, backend="batch", site=site, endpoint_url=endpoint_url)


@batch_group.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def batch_validate(file: Path) -> None:
    """Check a job-definition JSON file (e.g. a hand-edited one) offline: botocore's request
    shape, then the multi-node rules. Prints "ok", or the first problem (exit 2)."""
    import json

    from .batch_client import require_sdk
    from .batch_rules import validate
    from .yaml12 import MAX_BYTES, MAX_DEPTH
    require_sdk("jobgen batch validate", ("botocore",))
    try:
        with file.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:   # RegisterJobDefinition requests are a few kB
            raise ConfigError(f"{file}: larger than {MAX_BYTES >> 10} kB")
        if _nesting(data) > MAX_DEPTH:   # before json walks it (its recursion has a limit)
            raise ConfigError(f"{file}: nested more than {MAX_DEPTH} levels deep")
        jd = json.loads(data.decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror}") from None
    except ValueError as exc:   # JSON, or UTF-8, that does not decode
        raise ConfigError(f"{file}: not JSON: {exc}") from None
    if not isinstance(jd, dict):
        raise ConfigError(f"{file}: must be a JSON object (a RegisterJobDefinition request)")
    validate(jd, str(file))
    click.echo("ok")


def _nesting(data: bytes) -> int:
    """The deepest nesting of [ and { in a JSON text (outside strings), without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:   # backslash
                escaped = True
            elif byte == 0x22:   # closing quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _fail(message: str, status: int) -> int:
    """Print one `error:` line (control characters escaped) and return the exit status."""
    try:
        sys.stderr.write(f"error: {printable(message)}\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):   # no stderr either: the status must do
        pass
    return status


def _usage(exc: click.UsageError) -> str:
    """A click usage error as one line: the command, the problem, where help is."""
    command = exc.ctx.command_path if exc.ctx else "jobgen"
    return f"{command}: {exc.format_message().rstrip('.')} (see '{command} --help')"


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's own flush at exit cannot fail again
    (and print an 'Exception ignored' traceback) after the error was reported."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (AttributeError, OSError, ValueError):
        pass


# A write to stdout that fails for these reasons is the output's fault, not jobgen's.
_OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF)


_NO_ARGS: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())


def main(argv: Optional[list[str]] = None) -> int:
    """Console entry point: every outcome is an exit status and at most one `error:` line
    (2: bad input or usage; 1: a refusing scheduler or cloud, or output that cannot be
    written; 130: interrupted)."""
    if sys.stdout is None:   # started with stdout closed (`>&-`): nothing could be delivered
        return _fail("stdout is closed: nothing can be written (redirect it, or use -o)", 1)
    try:
        status = cli.main(args=argv, prog_name="jobgen", standalone_mode=False)
        sys.stdout.flush()
    except SystemExit as exc:   # a command's own exit status (check, submit --wait, run)
        status = exc.code
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        except OSError as err:
            _silence_stdout()
            return _fail(f"stdout: cannot write: {err.strerror}", 1)
    except BrokenPipeError:
        # `jobgen render ... | head`: the reader went away; not worth a traceback.
        _silence_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRORS:
            raise
        _silence_stdout()
        return _fail(f"stdout: cannot write: {exc.strerror}", 1)
    except _NO_ARGS as exc:   # `jobgen` alone: the help, as click (8.2 and later) does
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        return 2
    except click.UsageError as exc:
        return _fail(_usage(exc), 2)
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except click.Abort:
        return _fail("interrupted", 130)
    if status is None or isinstance(status, int):
        return status or 0
    return _fail(str(status), 1)   # SystemExit("message"), as Python would print it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
