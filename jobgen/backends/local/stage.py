"""`jobgen run RECIPE --smoke --stage prepare|export|eval`: a stage's job (payloads/stages.py)
on this machine, as a cluster runs its sbatch script (templates/slurm/stage.sbatch.j2): one
process per task, one after the other, the nodes' interpreter (JOBGEN_PYTHON, else python3),
the program from the run's payload snapshot, the working folder the command was given in. It is
a job of the run: recorded as `jobgen run` records one (its stage named), its output in
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
        job_id: Optional[str] = None, step: Optional[int] = None) -> int:
    """Run stage `name` of `spec` here; returns its status (the first task's that fails). The
    export stage works on `step`, else on the newest sealed checkpoint that can be proven; the
    eval stage on the export of `step`, else the newest: each found before it starts. A
    container backend's stage job runs as its emulated instance (its rehearsal's
    `stage_instance`: its own disk, the run's checkpoints as the service gives them)."""
    from ... import backends
    from ...payloads import stages
    from ...runs import ledger as runs
    from . import needs, rehearsal
    from . import runner as local_runner
    if not spec.smoke and name == "export":
        raise ConfigError(f"--stage {name}: on this machine it exports a rehearsal's "
                          "checkpoints (add --smoke)")
    if not spec.smoke and name == "eval":
        raise ConfigError(f"--stage {name}: on this machine it scores a rehearsal's exports "
                          "(add --smoke)")
    if not spec.smoke:
        raise ConfigError(f"--stage {name}: on this machine it makes the rehearsal's dataset "
                          f"(add --smoke); the recipe's own is made on the cluster: jobgen "
                          f"submit {spec.recipe.name} --stages {name},train")
    declared = stages.stage(name)
    if declared.work is None:
        raise ConfigError(f"--stage {name}: `jobgen run` without --stage runs it")
    exported: Optional[dict[str, object]] = None
    job_id = job_id or runs.local_job_id()
    instance = None
    if backends.declaration(spec.backend).container:
        # The job as the service is handed it: what it refuses is refused before anything.
        backends.get(spec.backend).plan_stage(spec, name, tuple(sources), step)
        instance = backends.module(spec.backend, "rehearsal").stage_instance(spec, name, job_id)
    run_dir = instance.run_dir if instance is not None else spec.run_dir
    try:
        if name == "export":
            step = sealed_step(spec, step, say, *(
                (instance.trained, instance.shown) if instance is not None else ()))
            exported = {"step": step, "folder": str(export_folder(spec, step, run_dir))}
        work = stages.work(name, spec, tuple(sources), step)   # refuses what it cannot run
        if name == "eval":
            step = exported_step(spec, step)
            work = stages.work(name, spec, tuple(sources), step)
            exported = {"step": step, "results": str(results_file(spec, step))}
        env = local_runner.node_env({})
        if instance is not None:     # the container's command, its environment
            argv, container_env = instance.command(step)
            env = local_runner.node_env(container_env)
            commands = [argv]
        needs.check(spec, env, programs=[work.program])
        python = needs.node_python(env) or "python3"
        if instance is None:
            program = Path.cwd() / spec.payload_dir / work.program
            commands = [[python, str(program), *args] for args in work.tasks]
        local_runner.place_payload(spec)
        warnings = rehearsal.record(spec, job_id, site_ref=site_ref, overrides=overrides,
                                    recipe_file=recipe_file, site_file=site_file, amend=amend,
                                    stage=name, sources=sources, exported=exported)
    except BaseException:
        if instance is not None:     # a refusal leaves no emulated instance behind
            instance.discard()
        raise
    for warning in warnings:
        say(f"warning: {warning}")
    for note in work.notes:
        say(note)
    folder = Path(run_dir, "logs", job_id, "node-0")
    folder.mkdir(parents=True, exist_ok=True)
    status = 0
    log = folder / f"{name}.log"
    for index, argv in enumerate(commands):
        # The progress line, as the stage's sbatch script prints it.
        say(f"jobgen: {name} stage, task {index} of {len(commands)} (run "
            f"{spec.run_name}, job {job_id}): {work.program}")
        status = _task(argv, env, log, lambda line: emit(f"[{name}] {line}"))
        if status != 0:
            break
    _end(folder, status, name)
    if exported is not None:
        from ...runs import runrecord
        outcome = _outcome(exported, status) if name == "export" else \
            _scores(exported, status)
        noted = runrecord.note(spec, job_id, name, outcome)
        if noted:
            say(f"warning: {noted}")
    return status


def export_folder(spec: JobSpec, step: int, run_dir: Optional[str] = None) -> Path:
    from ...payloads.stages import EXPORT_ROOT
    return Path(run_dir or spec.run_dir, EXPORT_ROOT, f"step-{step}").absolute()


def sealed_step(spec: JobSpec, step: Optional[int],
                say: Optional[Callable[[str], None]] = None,
                trained: Optional[Path] = None, shown: str = "") -> int:
    """The rehearsal's step to export: `step`, or the newest that can be proven (the trainer
    logged the step after it; said where that is not the newest, which is taken where none
    can); one line where `step` is not sealed (a step folder without its COMPLETE marker is
    being written, or its save failed). `trained`: the training pass's folder where it is not
    RUN/train (an emulated instance's channel), `shown` its name in the refusals."""
    trained = trained or Path(spec.run_dir, "train")
    root: object = shown or trained / "checkpoints"
    sealed = sorted(int(m.parent.name[len("step_"):])
                    for m in (trained / "checkpoints").glob("step_*/COMPLETE")
                    if m.parent.name[len("step_"):].isdigit())
    if not sealed:
        backend = f" --backend {spec.backend}" if spec.backend != "local" else ""
        raise ConfigError(f"{root}: no complete checkpoint to export (train first: jobgen run "
                          f"{spec.recipe.name} --smoke{backend})")
    if step is None:
        logged = logged_steps(trained / "metrics.jsonl")
        provable = [n for n in sealed if n + 1 in logged]
        if not provable or provable[-1] == sealed[-1]:
            return sealed[-1]
        if say is not None:
            say(f"export: step {provable[-1]}, the newest sealed step that can be proven: the "
                f"trainer logged no step {sealed[-1] + 1} after the newest, {sealed[-1]} "
                f"(--step {sealed[-1]} exports it unproven)")
        return provable[-1]
    if step not in sealed:
        raise ConfigError(f"--step {step}: {root} has no complete checkpoint of step {step} "
                          f"(complete: {', '.join(map(str, sealed))})")
    return step


def logged_steps(metrics: Path) -> set[int]:
    """The training pass's steps with a loss in the trainer's events (what an export's proof
    compares with: payload/common/export_check.py); none where the file cannot be read."""
    import json
    import math
    found: set[int] = set()
    try:
        with open(metrics, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.startswith('{"event": "step"'):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                loss, step = event.get("loss"), event.get("step")
                if (event.get("phase") == "train" and isinstance(step, int)
                        and isinstance(loss, (int, float)) and math.isfinite(loss)):
                    found.add(step)
    except OSError:
        pass
    return found


def results_file(spec: JobSpec, step: int) -> Path:
    from ...payloads.stages import EVAL_ROOT
    return Path(spec.run_dir, EVAL_ROOT, f"step-{step}.json").absolute()


def exported_step(spec: JobSpec, step: Optional[int]) -> int:
    """The rehearsal's exported step to score: `step`, or the newest complete export (a
    step-N folder with its jobgen-export.json: payload/common/eval_step.py's rule)."""
    from ...payloads.stages import EXPORT_ROOT
    root = Path(spec.run_dir, EXPORT_ROOT)
    names = (r.parent.name[len("step-"):] for r in root.glob("step-*/jobgen-export.json"))
    done = sorted(int(n) for n in names if n.isdigit())
    if not done:
        raise ConfigError(f"{root}: no complete export to evaluate (export first: jobgen run "
                          f"{spec.recipe.name} --smoke --stage export)")
    if step is None:
        return done[-1]
    if step not in done:
        raise ConfigError(f"--step {step}: {root} has no complete export of step {step} "
                          f"(complete: {', '.join(map(str, done))})")
    return step


def _scores(evaluated: dict[str, object], status: int) -> dict[str, object]:
    """What the eval stage left, for the run's record: its results file and each task's
    headline metric (as `jobgen report` picks it), or that it failed."""
    import json

    from ...reporting import evals
    out = dict(evaluated, status=status)
    try:
        body = json.loads(Path(str(evaluated["results"])).read_text()) if status == 0 else {}
        results, made = body["results"], body.get("jobgen") or {}
        if not isinstance(results, dict) or not isinstance(made, dict):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return dict(out, outcome="failed", results=None)
    metrics: dict[str, dict[str, float]] = {}
    for task, values in sorted(results.items()):
        score = evals.headline(body, task, values) if isinstance(values, dict) else None
        if score is not None:
            metrics[task] = {score.metric: score.value}
    return dict(out, outcome="scored", metrics=metrics, tokens=made.get("tokens"))


def _outcome(exported: dict[str, object], status: int) -> dict[str, object]:
    """What the export stage left, for the run's record: its folder's proof (export_hf.py's
    jobgen-export.json), or that it failed."""
    import json
    out = dict(exported, status=status)
    if status not in (0, 3):        # 3: exported, unproven (export_hf.run)
        return dict(out, outcome="failed", folder=None)
    try:
        made = json.loads(Path(str(exported["folder"]), "jobgen-export.json").read_text())
        proof = made.get("proof") or {}
    except (OSError, ValueError, AttributeError):
        return dict(out, outcome="failed", folder=None)
    out["outcome"] = {True: "proven", None: "unproven"}.get(proof.get("ok"), "failed")
    for key in ("logged_loss", "measured_loss", "precision"):
        if key in proof:
            out[key] = proof[key]
    return out


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
                 train: list[str], run_dir: Optional[str] = None) -> str:
    """The stage's last line: where the dataset (the export, the scores) is and what to run
    next (`train`); `run_dir`: the run folder as it lies here (an emulated instance's)."""
    if name == "export":
        return _export_line(run_dir or spec.run_dir, status, again)
    if name == "eval":
        return _eval_line(spec, status, again)
    where = spec.data_path(spec.recipe.data.path)
    if status != 0:
        return printable(f"jobgen: the {name} stage ended with status {status} (nothing "
                         f"half-written is left at {where}); rerun it with: "
                         f"{shell_quote(again)}")
    return printable(f"jobgen: the {name} stage ended with status 0; the dataset is at "
                     f"{where}; next, train on it: {shell_quote(train)}")


def _export_line(run_dir: str, status: int, again: list[str]) -> str:
    root = Path(run_dir, "export")
    if status not in (0, 3):
        return printable(f"jobgen: the export stage ended with status {status} (nothing "
                         f"half-written is left in {root}); rerun it with: {shell_quote(again)}")
    how = "proven" if status == 0 else "unproven (no logged step after it to compare with)"
    return printable(f"jobgen: the export stage ended with status {status}: {how}; the model "
                     f"folders are in {root} (transformers loads each with from_pretrained)")


def _eval_line(spec: JobSpec, status: int, again: list[str]) -> str:
    from ...payloads.stages import EVAL_ROOT
    root = Path(spec.run_dir, EVAL_ROOT)
    if status != 0:
        return printable(f"jobgen: the eval stage ended with status {status} (nothing "
                         f"half-written is left in {root}); rerun it with: {shell_quote(again)}")
    return printable(f"jobgen: the eval stage ended with status 0; the scores are in {root} "
                     "(lm-eval's results JSON, one step-N.json per step)")
