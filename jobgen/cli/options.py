"""What the commands share: the option groups (spec, Slurm, targets, AWS, jobs), printing, and
resolving a recipe into a spec or a job reference (the option value types are in param_types)."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

import click

from .. import backends
from ..backends import option_tables, spec_backend
from ..plumbing.errors import ConfigError
from .param_types import TEXT, _Amount, _Backends, _Seconds

F = Callable[..., Any]


def _spec_options(func: F) -> F:
    """The options every command that resolves a recipe takes (defined once)."""
    return _spec_option_group(func, slurm_shown=True)


def _run_spec_options(func: F) -> F:
    """The same options for `jobgen run`: the Slurm ones are still parsed (so that `--time` is
    refused in one line saying why) but not listed by `--help`, since run takes none of them."""
    return _spec_option_group(func, slurm_shown=False)


def _spec_option_group(func: F, slurm_shown: bool) -> F:
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
        *(_SLURM_OPTIONS if slurm_shown else _HIDDEN_SLURM_OPTIONS),
        click.option("--sbatch-opt", "slurm_sbatch_opt", multiple=True, metavar="NAME=VALUE",
                     hidden=not slurm_shown,
                     help="Slurm: one more #SBATCH --NAME=VALUE (or --NAME) that jobgen does not "
                          "own: constraint, gres, mem, mail-type, comment, dependency, ... "
                          "(repeatable; after the site's slurm.extra_options)."),
    )):
        func = option(func)
    return func


# The per-job scheduler options the backends declare (their tables: slurm/options.py): they
# land in click's keyword arguments under the `slurm_` prefix and reach the spec as one mapping.
def _table_options(hidden: bool) -> tuple[Any, ...]:
    return tuple(click.option(f"--{o.flag}", f"slurm_{o.flag}", type=TEXT, metavar=o.metavar,
                              help=o.help, hidden=hidden)
                 for table in option_tables() for o in table.OPTIONS)


_SLURM_OPTIONS, _HIDDEN_SLURM_OPTIONS = _table_options(False), _table_options(True)


def _slurm_overrides(kwargs: dict[str, Any]) -> dict[str, Optional[str]]:
    """Take the scheduler's per-job options (--partition ...) out of a command's keyword
    arguments."""
    return {key[len("slurm_"):]: kwargs.pop(key) for key in list(kwargs)
            if key.startswith("slurm_")}


def _spec(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
          compile_mode: str, run_name: Optional[str], smoke: bool, backend: str = backends.DEFAULT,
          slurm: Optional[dict[str, Optional[str]]] = None) -> Any:
    from .. import api
    return api.job_spec(recipe, nodes, overrides=overrides, site=site,
                        backend=spec_backend(backend),  # type: ignore[arg-type]
                        compile_mode=compile_mode,  # type: ignore[arg-type]
                        run_name=run_name, smoke=smoke, options=slurm)


_target_options = (
    click.option("--tokens", type=_Amount.of("tokens"),
                 help="Train to this many tokens (like 1.8e12): the schedule's steps as "
                      "`jobgen plan` counts them."),
    click.option("--samples", type=_Amount.of("samples"),
                 help="Train to this many samples (sequences)."))


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
    from .. import api
    from ..job.target import schedule_for
    spec = _spec(recipe, nodes, overrides, site, "auto", None, smoke, backend)
    flag = (f"--tokens {tokens:g}" if tokens is not None
            else f"--samples {samples:g}").replace("e+0", "e").replace("e+", "e")
    added, note = schedule_for(spec.recipe.schedule, api.steps_for_target(spec, tokens, samples),
                               overrides, flag)
    if note:
        click.echo(note, err=True)
    return overrides + added


def _backend_option(test: Callable[[Any], bool], help: str) -> Callable[[F], F]:
    """--backend, its choices the backends whose declaration passes `test`."""
    return click.option("--backend", type=_Backends(test), default=backends.DEFAULT,
                        show_default=True, help=help)


_json_option = click.option("--json", "as_json", is_flag=True,
                            help="Print JSON (for programs) instead of text.")


def _echo_text(text: str, nl: bool = True) -> None:
    """The one place text read off disk or from a scheduler is printed (tables, records): every
    control character but the line break escaped, so a value cannot drive the terminal."""
    from ..plumbing.errors import printable_lines
    click.echo(printable_lines(text), nl=nl)


def _echo_json(data: Any) -> None:
    """The one place JSON is printed: strict JSON (NaN or Infinity is refused, never printed)."""
    import json

    from ..plumbing.errors import RenderError
    try:
        text = json.dumps(data, indent=2, sort_keys=False, allow_nan=False)
    except ValueError:
        raise RenderError("the output holds a number that is not finite (nan or inf); "
                          "not printed: report this as a bug of jobgen") from None
    click.echo(text)


def _aws_flag(name: str) -> Callable[[F], F]:
    """--region / --profile: the AWS CLI's flags, ahead of AWS_REGION / AWS_PROFILE, the site
    and the AWS config file (jobgen/backends/aws.py: region)."""
    def remember(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> None:
        if value is not None:
            from ..backends.aws import FLAGS
            from ..inputs.site import region_problem
            said = region_problem(value) if name == "region" else None
            if said is not None:
                raise click.BadParameter(f"{value!r} {said}")
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


def _job_options(func: F) -> F:
    """How a submitted job is named and where to ask about it (status, logs, cancel, and their
    `jobgen batch` aliases)."""
    func = _aws_flag("profile")(_aws_flag("region")(_endpoint_option(func)))
    return click.option("--site", type=TEXT,
                        help="Batch: site profile (region, log group; default: the run's, "
                             "else local).")(func)


def _job(ref: str, backend: Optional[str], site: Optional[str],
         endpoint_url: Optional[str], elsewhere: bool = False) -> tuple[Any, Any]:
    """(the backend, the job) for REF: a run name or a job id jobgen recorded (its backend comes
    from the record), else a job id of `backend` (default slurm). `elsewhere`: say, in one line,
    when the run found is only in another folder (watch reads its files)."""
    from .. import backends
    from ..backends.protocol import JobRef
    from ..runs import ledger as runs
    if not ref.strip():
        raise click.UsageError("the job must not be empty (a run name or a job id)")
    found = runs.find(ref, say=(lambda note: click.echo(note, err=True)) if elsewhere else None)
    if found is not None:
        name = backends.scheduler(found.backend)   # submitit's jobs are Slurm's
        if backend is not None and backend != name:
            raise ConfigError(f"{ref}: recorded as a {found.backend} job, not {backend}")
        job_id = found.job_id if ref == found.name else ref
    else:   # a job id jobgen did not record: whose ids look like it (Batch's are UUIDs)
        name, job_id = backend or _guess_backend(ref), ref
    if endpoint_url is not None and not backends.declaration(name).takes("endpoint_url"):
        raise click.UsageError(f"--endpoint-url is for {_who_takes('endpoint_url')} jobs")
    backends.require_extra(name, f"--backend {name}")
    return backends.get(name), JobRef(job_id, found, site, endpoint_url)


def _guess_backend(job_id: str) -> str:
    """The backend whose job ids look like `job_id` (its declared pattern), else the first one
    the registry lists (Slurm: its ids are numbers)."""
    from .. import backends
    for declared in backends.declarations():
        if declared.job_id_pattern and re.fullmatch(declared.job_id_pattern, job_id):
            return declared.name
    return backends.names()[0]


def _who_takes(option: str) -> str:
    """'batch and sagemaker': the backends that take a submit option."""
    from .. import backends
    found = backends.having(lambda d: d.takes(option))
    return " and ".join((", ".join(found[:-1]), found[-1])) if len(found) > 1 else found[0]


_job_backend = click.option("--backend", type=_Backends(lambda d: d.submits),
                            help="Whose job id this is, for ids jobgen did not record "
                                 "(default: the backend whose ids look like it, else slurm).")
