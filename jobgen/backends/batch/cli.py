"""`jobgen batch ...`: aliases of the job commands for AWS Batch, and `validate`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from ...cli.job_cmds import cancel, logs, status
from ...cli.options import (
    _job_options,
    _json_option,
    _slurm_overrides,
    _spec_options,
    _submit_options,
)
from ...cli.submit_cmds import _submit
from ...plumbing.errors import ConfigError


@click.group("batch")
def group() -> None:
    """AWS Batch multi-node jobs (aliases of submit/status/logs/cancel with --backend batch);
    validate job definitions. (Each command checks for the [batch] extra: --help needs none.)"""


@group.command("submit")
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


@group.command("status")
@click.argument("job")
@_job_options
@_json_option
@click.pass_context
def batch_status(ctx: click.Context, job: str, site: Optional[str],
                 endpoint_url: Optional[str], as_json: bool) -> None:
    """`jobgen status --backend batch`: the job's state, then each node's."""
    ctx.invoke(status, job=job, backend="batch", site=site, endpoint_url=endpoint_url,
               as_json=as_json)


@group.command("logs")
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


@group.command("cancel")
@click.argument("job")
@_job_options
@click.pass_context
def batch_cancel(ctx: click.Context, job: str, site: Optional[str],
                 endpoint_url: Optional[str]) -> None:
    """`jobgen cancel --backend batch`: cancel a queued job, terminate a started one."""
    ctx.invoke(cancel, job=job, backend="batch", site=site, endpoint_url=endpoint_url)


@group.command("validate")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def batch_validate(file: Path) -> None:
    """Check a job-definition JSON file (e.g. a hand-edited one) offline: botocore's request
    shape, then the multi-node rules. Prints "ok", or the first problem (exit 2)."""
    import json

    from ...inputs.yaml12 import MAX_BYTES, MAX_DEPTH
    from ...plumbing.extras import require
    require("jobgen batch validate", ("botocore",), "batch")
    from .rules import validate
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
