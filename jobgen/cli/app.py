"""The `jobgen` group and `main`: subcommands are imported when they are asked for (`jobgen render`
loads rendering only), and errors become one line and an exit status here, the only place that
catches them."""
from __future__ import annotations

import errno
import importlib
import os
import sys
from typing import Any, Optional

import click

from ..plumbing.errors import JobgenError, printable

# Each command and where it is defined: a module is imported when its command is asked for.
COMMANDS = {
    "list": ("render_cmds", "list_cmd"), "show": ("render_cmds", "show"),
    "render": ("render_cmds", "render"), "check": ("render_cmds", "check"),
    "schema": ("render_cmds", "schema_cmd"), "image-context": ("render_cmds", "image_context"),
    "submit": ("submit_cmds", "submit"), "resubmit": ("submit_cmds", "resubmit"),
    "run": ("submit_cmds", "run"),
    "status": ("job_cmds", "status"), "logs": ("job_cmds", "logs"),
    "cancel": ("job_cmds", "cancel"), "runs": ("job_cmds", "runs_cmd"),
    "plan": ("plan_cmds", "plan_cmd"), "watch": ("watch_cmds", "watch_cmd"),
    "report": ("report_cmds", "report_cmd"),
}
_JOBGEN = __package__.rpartition(".")[0]


def _backend_commands() -> list[str]:
    """The backends that bring a command group of their own (declared: `command`)."""
    from .. import backends
    return list(backends.having(lambda d: d.command))


class _Group(click.Group):
    """Loads each command when it is asked for, and turns jobgen's errors into one line on stderr
    and their exit status (2 for bad input, 1 for a refusing scheduler or cloud API): the one
    place where errors are caught."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*COMMANDS, *_backend_commands()])

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        where = COMMANDS.get(cmd_name)
        if where is not None:
            module = f"{__package__}.{where[0]}"
        else:   # a command group a backend brings (its package's cli.py): `jobgen batch ...`
            if cmd_name not in _backend_commands():
                return None
            module, where = f"{_JOBGEN}.backends.{cmd_name}.cli", ("", "group")
        command: click.Command = getattr(importlib.import_module(module), where[1])
        return command

    def resolve_command(
            self, ctx: click.Context, args: list[str],
    ) -> tuple[Optional[str], Optional[click.Command], list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            # click suggests close names from the commands it holds: none are loaded yet.
            unknown = getattr(click.exceptions, "NoSuchCommand", None)
            if unknown is not None and isinstance(exc, unknown) and args:
                raise unknown(args[0], possibilities=[*COMMANDS, *_backend_commands()],
                              ctx=ctx) from None
            raise

    def invoke(self, ctx: click.Context) -> Any:
        loaded = sys.modules.get(f"{_JOBGEN}.aws")
        if loaded is not None:   # --region/--profile are one command's (in-process callers)
            loaded.FLAGS.clear()
        try:
            return super().invoke(ctx)
        except JobgenError as exc:
            # Always one line, even when a bad key or file name holds a line break or an ESC
            # (an error of several findings, like the site-path preflight's: one line each).
            for line in getattr(exc, "lines", None) or [str(exc)]:
                click.echo(f"error: {printable(line)}", err=True)
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
    library v2) and Amazon EKS (JobSets); submit them, rehearse them on
    CPU, plan them and watch them. A run is what was submitted: its payload snapshot and its
    record (`jobgen runs RUN`) are kept with it."""


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
