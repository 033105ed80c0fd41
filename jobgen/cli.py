"""The command line: thin click commands over jobgen.api. Errors become one line and an exit
status in `main`, the only place that catches them."""
from __future__ import annotations

import errno
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import click

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


class _Seconds(click.ParamType):
    """A finite number of seconds, more than 0 and at most a day."""

    name = "seconds"

    def convert(self, value: Any, param: Optional[click.Parameter],
                ctx: Optional[click.Context]) -> Any:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not (math.isfinite(seconds) and 0 < seconds <= 86400):
            self.fail(f"{value} must be more than 0 and at most 86400 seconds", param, ctx)
        return seconds


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
    from .payloads import key_report
    shown = spec.as_dict()
    # Which values reach the trainer: the rest must stay at their defaults (or are refused).
    shown["payload_keys"] = key_report(spec.recipe)
    click.echo(yaml.safe_dump(shown, sort_keys=False, default_flow_style=False,
                              width=100), nl=False)


@cli.command()
@click.argument("recipe")
@_spec_options
@click.option("--backend", type=click.Choice(["slurm", "batch"]), default="slurm",
              show_default=True)
@click.option("--output-dir", "-o", type=_Folder(),
              help="Write the job's files into this folder (atomically) instead of stdout.")
def render(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
           output_dir: Optional[Path]) -> None:
    """Render RECIPE (a built-in name or a YAML file) into a job: stdout, or files in a folder."""
    from . import api
    _need_aws_sdk(backend)
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend)
    plan = api.plan(spec)
    if output_dir is None:
        click.echo(plan.text, nl=False)
        return
    for path in plan.write(output_dir):
        click.echo(str(path))


@cli.command()
@click.option("--site", type=TEXT, help="Site profile to render for (default: local).")
@click.option("--recipe", "recipes", multiple=True, help="Only these recipes (repeatable).")
@click.option("--test-only", is_flag=True,
              help="Also ask the Slurm controller with `sbatch --test-only` (node counts the "
                   "cluster can hold).")
@click.option("--no-shellcheck", is_flag=True, help="Skip shellcheck even where it is installed.")
@click.option("--backend", type=click.Choice(["slurm", "batch"]), default="slurm",
              show_default=True, help="Check sbatch scripts, or Batch job definitions.")
def check(site: Optional[str], recipes: tuple[str, ...], test_only: bool,
          no_shellcheck: bool, backend: str) -> None:
    """Dry-run every recipe at 1, 2, 4, ... 128 nodes: render, shellcheck, optionally
    `sbatch --test-only`. Exits 1 if anything failed."""
    from . import check as checking
    _need_aws_sdk(backend)
    report = checking.run(site=site, recipes=list(recipes) or None, test_only=test_only,
                          shellcheck=not no_shellcheck, backend=backend)  # type: ignore[arg-type]
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
@click.option("--no-check", is_flag=True,
              help="Submit without first checking, from this host, that the launcher and the "
                   "trainer are where the site says and that the partition has the nodes.")
@click.option("--dry-run", is_flag=True,
              help="Print what would run instead of running it: the sbatch commands with their "
                   "scripts, as a bash script that submits them (submitit: its parameters and "
                   "each node's command). Checks nothing, submits nothing.")
def submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, chain: bool, via: str,
           wait: bool, no_check: bool, dry_run: bool) -> None:
    """Submit RECIPE to Slurm (exactly the script `jobgen render` prints); prints the job id."""
    from . import api, slurm_client
    from .backends import slurm
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke)
    if chain and via == "submitit":
        raise click.UsageError("--chain is for --via sbatch (submitit runs both passes in "
                               "one job)")
    if dry_run:
        if via == "submitit":
            import json

            from . import submitit_runner
            click.echo(json.dumps(submitit_runner.dry_run(spec), indent=2))
        elif chain:
            click.echo(slurm_client.dry_run([slurm.plan(spec, "compile"),
                                             slurm.plan(spec, "train")]), nl=False)
        else:
            click.echo(slurm_client.dry_run([api.plan(spec)]), nl=False)
        return
    if not no_check:
        from . import launch
        unchecked = slurm_client.preflight(spec, launch.for_spec(spec, "slurm"))
        if unchecked:
            click.echo(f"not checked from this host: {'; '.join(unchecked)}", err=True)
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
@click.argument("recipe")
@_spec_options
def run(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
        compile_mode: str, run_name: Optional[str], smoke: bool) -> None:
    """Run the job on this machine, no scheduler: one process group per emulated node (use
    --smoke where there are no accelerators). Exits with the main node's status."""
    from . import local_runner
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, "local")
    raise SystemExit(local_runner.run(spec, emit=click.echo))


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


# --- AWS Batch ----------------------------------------------------------------------------------

_endpoint_option = click.option(
    "--endpoint-url", metavar="URL", type=TEXT,
    help="AWS endpoint (e.g. a moto server); default: AWS_ENDPOINT_URL or AWS's own.")


def _aws_options(func: F) -> F:
    """--site (region, log group) and --endpoint-url, for the commands on a Batch job."""
    func = _endpoint_option(func)
    return click.option("--site", type=TEXT,
                        help="Site profile (region, log group; default: local).")(func)


def _batch_client(site: Optional[str], endpoint_url: Optional[str]) -> Any:
    from . import batch_client
    from . import site as sites
    return batch_client.client(sites.load(site), endpoint_url)


def _need_aws_sdk(backend: str = "batch") -> None:
    """Without the [batch] extra, one line naming it (exit 2) before anything is written."""
    if backend == "batch":
        from .batch_client import require_sdk
        require_sdk("--backend batch", ("botocore",))


@cli.group("batch")
def batch_group() -> None:
    """AWS Batch multi-node jobs: submit, follow, inspect, cancel; validate job definitions."""
    from .batch_client import require_sdk
    require_sdk("jobgen batch")


@batch_group.command("submit")
@click.argument("recipe")
@_spec_options
@click.option("--queue", type=TEXT, help="Job queue (default: the site's batch.job_queue).")
@click.option("--wait", is_flag=True, help="Follow the nodes' states; exit with the job's status.")
@click.option("--poll", type=_Seconds(), default=15.0, show_default=True, metavar="SECONDS",
              help="How often --wait asks Batch.")
@_endpoint_option
@click.option("--dry-run", is_flag=True,
              help="Print the AWS Batch requests that would be made (RegisterJobDefinition "
                   "unless an ACTIVE revision has the same content, then SubmitJob) as JSON; "
                   "calls nothing.")
def batch_submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...],
                 site: Optional[str], compile_mode: str, run_name: Optional[str], smoke: bool,
                 queue: Optional[str], wait: bool, poll: float,
                 endpoint_url: Optional[str], dry_run: bool) -> None:
    """Register RECIPE's job definition (only if it changed) and submit it; prints the job id."""
    import json

    from . import api, batch_client
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, "batch")
    jd = json.loads(api.plan(spec).text)   # exactly what `jobgen render --backend batch` prints
    queue = queue or (spec.site.batch.job_queue if spec.site.batch else None)
    if not queue:
        raise ConfigError(f"site {spec.site.name}: no batch.job_queue; pass --queue")
    if dry_run:
        click.echo(json.dumps(batch_client.dry_run(jd, queue=queue, nodes=spec.nodes,
                                                   run_name=spec.run_name), indent=2))
        return
    batch = batch_client.client(spec.site, endpoint_url)
    job = batch_client.submit(batch, jd, queue=queue, nodes=spec.nodes, run_name=spec.run_name)
    how = "registered" if job.definition.registered else "reusing unchanged"
    click.echo(f"{how} {job.definition.arn}; submitted {job.job_name} to {queue}", err=True)
    click.echo(job.job_id)
    if wait:
        raise SystemExit(batch_client.wait(batch, job.job_id, poll_s=poll,
                                           echo=lambda m: click.echo(m, err=True)))


@batch_group.command("status")
@click.argument("job_id")
@_aws_options
def batch_status(job_id: str, site: Optional[str], endpoint_url: Optional[str]) -> None:
    """The job's state, then each node's: state, exit code, log stream, reason."""
    from . import batch_client
    for line in batch_client.status(_batch_client(site, endpoint_url), job_id):
        click.echo(line)


@batch_group.command("logs")
@click.argument("job_id")
@click.option("--node", type=click.IntRange(min=0), default=0, show_default=True,
              help="Node index (0 is the main node).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@_aws_options
def batch_logs(job_id: str, node: int, follow: bool, site: Optional[str],
               endpoint_url: Optional[str]) -> None:
    """A node's CloudWatch log events."""
    from . import batch_client
    from . import site as sites
    profile = sites.load(site)
    batch_client.logs(batch_client.client(profile, endpoint_url),
                      batch_client.client(profile, endpoint_url, "logs"), job_id, node=node,
                      follow=follow, echo=click.echo,
                      default_group=profile.batch.log_group if profile.batch else "/aws/batch/job")


@batch_group.command("cancel")
@click.argument("job_id")
@_aws_options
def batch_cancel(job_id: str, site: Optional[str], endpoint_url: Optional[str]) -> None:
    """Cancel a queued job, terminate a started one; a finished job is left alone."""
    from . import batch_client
    click.echo(batch_client.cancel(_batch_client(site, endpoint_url), job_id))


@batch_group.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def batch_validate(file: Path) -> None:
    """Check a job-definition JSON file (e.g. a hand-edited one) offline: botocore's request
    shape, then the multi-node rules. Prints "ok", or the first problem (exit 2)."""
    import json

    from .batch_rules import validate
    from .yaml12 import MAX_BYTES, MAX_DEPTH
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
