"""`jobgen run RECIPE --smoke --stage prepare`: a stage's job (jobgen/payloads/stages.py) on this
machine, as a cluster runs its sbatch script (templates/slurm/stage.sbatch.j2): one process per
task, one after the other, the nodes' interpreter (JOBGEN_PYTHON, else python3), the program
from the run's payload snapshot, the working folder the command was given in. It is a job of the
run: recorded as `jobgen run` records one (its stage named), its output in
RUN_DIR/logs/JOB/node-0/STAGE.log and its status in job.status beside it, so that `jobgen status`
and `jobgen runs` know it."""
from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Callable, Optional, Sequence

from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError, printable
from ...plumbing.render import shell_quote

STATUS_CANCELLED = 130


def run(spec: JobSpec, name: str, sources: Sequence[str], *, site_ref: str,
        overrides: Sequence[str], recipe_file: Path, site_file: Path,
        emit: Callable[[str], None], say: Callable[[str], None], amend: bool = False,
        job_id: Optional[str] = None) -> int:
    """Run stage `name` of `spec` here; returns its status (the first task's that fails)."""
    from ...payloads import stages
    from ...runs import ledger as runs
    from . import needs, rehearsal
    from . import runner as local_runner
    if not spec.smoke:
        raise ConfigError(f"--stage {name}: on this machine it makes the rehearsal's dataset "
                          f"(add --smoke); the recipe's own is made on the cluster: jobgen "
                          f"submit {spec.recipe.name} --stages {name},train")
    declared = stages.stage(name)
    if declared.work is None:
        raise ConfigError(f"--stage {name}: `jobgen run` without --stage runs it")
    work = declared.work(spec, tuple(sources))
    env = local_runner.node_env({})
    needs.check(spec, env, programs=[work.program])
    python = needs.node_python(env) or "python3"
    job_id = job_id or runs.local_job_id()
    local_runner.place_payload(spec)
    for warning in rehearsal.record(spec, job_id, site_ref=site_ref, overrides=overrides,
                                    recipe_file=recipe_file, site_file=site_file, amend=amend,
                                    stage=name, sources=sources):
        say(f"warning: {warning}")
    for note in work.notes:
        say(note)
    folder = Path(spec.run_dir, "logs", job_id, "node-0")
    folder.mkdir(parents=True, exist_ok=True)
    program = Path.cwd() / spec.payload_dir / work.program
    status = 0
    log = folder / f"{name}.log"
    for index, args in enumerate(work.tasks):
        # The progress line, as the stage's sbatch script prints it.
        say(f"jobgen: {name} stage, task {index} of {len(work.tasks)} (run "
            f"{spec.run_name}, job {job_id}): {work.program}")
        status = _task([python, str(program), *args], env, log,
                       lambda line: emit(f"[{name}] {line}"))
        if status != 0:
            break
    _end(folder, status, name)
    return status


def _task(argv: list[str], env: dict[str, str], log: Path,
          emit: Callable[[str], None]) -> int:
    """One task's process: its output appended to the log (the one writer's append) and,
    prefixed, to `emit`; Ctrl-C stops its process group and is the status 130."""
    from ...plumbing import fsio
    from .runner import _stop
    fsio.append(log, f"+ {shell_quote(argv)}\n")
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            fsio.append(log, line)
            emit(printable(line.rstrip("\n")))
        return proc.wait()
    except KeyboardInterrupt:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _stop(proc)
        finally:
            signal.signal(signal.SIGINT, previous)
        return STATUS_CANCELLED


def _end(folder: Path, status: int, name: str) -> None:
    """How the stage ended, as a node's flow records it (payload/common/flow/status.sh)."""
    from ...plumbing import fsio
    try:
        fsio.write_file(folder / "job.status", f"{status} {name}\n")
    except (OSError, ConfigError):
        pass        # the closing line still says it


def closing_line(spec: JobSpec, name: str, status: int, again: list[str],
                 train: list[str]) -> str:
    """The stage's last line: where the dataset is and what to run next (`train`)."""
    where = spec.data_path(spec.recipe.data.path)
    if status != 0:
        return printable(f"jobgen: the {name} stage ended with status {status} (nothing "
                         f"half-written is left at {where}); rerun it with: "
                         f"{shell_quote(again)}")
    return printable(f"jobgen: the {name} stage ended with status 0; the dataset is at "
                     f"{where}; next, train on it: {shell_quote(train)}")
