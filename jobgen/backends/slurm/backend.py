"""The Slurm backend: one sbatch script per job. The script exports the node contract
(jobgen/payloads/node.py) and the trainer's arguments, and hands Slurm's facts to the one two-pass
flow (payload/common/job_flow.sh): it carries values, not decisions."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ... import payloads
from ...job.plan import Plan, PlannedFile
from ...job.spec import JobSpec
from ...payloads import node
from ...payloads.base import say_once
from ...payloads.node import Passes
from ...plumbing.errors import ConfigError, RemoteError, printable
from ...plumbing.render import render
from .. import Echo, JobStatus, SubmitOptions, Submitted, job_status
from ..protocol import JobRef
from .options import EXTRA, sbatch_lines

TEMPLATE = "slurm/job.sbatch.j2"
STAGE_TEMPLATE = "slurm/stage.sbatch.j2"


def plan(spec: JobSpec, passes: Passes = "both") -> Plan:
    """The sbatch script; `passes` splits the job in two for chained submission."""
    name = f"{spec.run_name}{'' if passes == 'both' else '-' + passes}.sbatch"
    return _plan([spec], passes, name)


def plan_array(specs: Sequence[JobSpec]) -> Plan:
    """One sbatch script for a sweep: a job array whose task K trains specs[K] (which differ
    only in what reaches the trainer and the run folder: see `array_key`)."""
    return _plan(list(specs), "both", f"{specs[0].run_name}-array.sbatch")


def array_key(spec: JobSpec) -> tuple[object, ...]:
    """What the #SBATCH header is made of: specs with the same key can share a job array."""
    return (spec.job_name, spec.nodes, spare_nodes(spec), spec.site.slurm.cpus_per_task,
            spec.exclusive,
            tuple(request(spec)), _extra(spec), spec.site.slurm.time_limit_warning_s,
            spec.recipe.name,
            spec.recipe.description, spec.source, spec.site.name, spec.recipe.compile.steps)


def _task(spec: JobSpec, passes: Passes) -> dict[str, Any]:
    lau = payloads.for_spec(spec, "slurm")
    return {"run_name": spec.run_name,
            "contract": list(node.contract(spec, lau, "slurm", passes=passes)
                             .variables().items()),
            "env": payloads.env_block(spec),
            "compile_args": lau.compile_args, "train_args": lau.train_args}


def _plan(specs: list[JobSpec], passes: Passes, name: str) -> Plan:
    spec = specs[0]
    if len(specs) == 1 and dict(_extra(spec)).get("array"):
        raise ConfigError("--sbatch-opt array=%N throttles a sweep's job array, and this job "
                          "is not one (give it with --sweep)")
    if len({array_key(s) for s in specs}) != 1:
        raise ValueError("a job array's specs differ in their #SBATCH header")
    site, recipe = spec.site, spec.recipe
    text = render(
        TEMPLATE,
        job_name=spec.job_name + ("" if passes == "both" else f"-{passes}"),
        # Spare nodes (job.spare_nodes) are allocated with the ones that train; --no-kill keeps
        # the allocation when one of them is lost (a spare takes its place).
        nodes=spec.nodes + spare_nodes(spec),
        no_kill=spare_nodes(spec) > 0,
        cpus_per_task=site.slurm.cpus_per_task,
        exclusive=spec.exclusive,
        request=request(spec),
        # An array throttle (--sbatch-opt array=%N) goes on the sweep's own --array line.
        extra=[(k, v) for k, v in _extra(spec) if k != "array"],
        throttle=dict(_extra(spec)).get("array", ""),
        output="%x-%A_%a.out" if len(specs) > 1 else "%x-%j.out",
        warning_s=site.slurm.time_limit_warning_s,
        title=f"{recipe.name}: {recipe.description}",
        source=spec.source,
        site=site.name,
        compile_steps=recipe.compile.steps,
        tasks=[_task(s, passes) for s in specs],
    )
    return Plan(backend="slurm", files=(PlannedFile(name, text, executable=True),),
                primary=name, submit_argv=("sbatch", "--parsable", "{primary}"))


def plan_stage(spec: JobSpec, name: str, sources: Sequence[str] = (),
               step: Optional[int] = None) -> Plan:
    """The sbatch script of a stage other than training (jobgen/payloads/stages.py): its
    program on one node, a job array of one task per input where it has several."""
    from ...payloads import stages
    declared = stages.stage(name)
    if declared.work is None:
        return plan(spec)
    work = stages.work(name, spec, tuple(sources), step)
    return _stage_plan(spec, name, declared.summary, declared.one_node, work)


def plan_follow(spec: JobSpec, names: Sequence[str], every: int) -> Plan:
    """The --every K follower (jobgen/payloads/follow.py) on one node of
    slurm.prepare_partition: submitted to start once training has started (client.follows),
    it learns the training job's id from its environment and follows it until squeue no
    longer lists it."""
    from ...payloads import follow
    work = follow.work(spec, names, every, ("--slurm-job-env", follow.SLURM_ENV))
    return _stage_plan(spec, follow.STAGE, f"export{' and score' if 'eval' in names else ''} "
                       f"each sealed step that is a multiple of {every} while training goes",
                       True, work)


def _stage_plan(spec: JobSpec, name: str, summary: str, one_node: bool, work: Any) -> Plan:
    site = spec.site
    for note in work.notes:
        say_once(note)
    file = f"{spec.run_name}-{name}.sbatch"
    text = render(
        STAGE_TEMPLATE, job_name=f"{spec.job_name}-{name}", stage=name,
        summary=summary, cpus_per_task=site.slurm.cpus_per_task,
        partition=(site.slurm.prepare_partition or spec.options.get("partition") or "")
        if one_node and not work.training_node else spec.options.get("partition") or "",
        output="%x-%A_%a.out" if len(work.tasks) > 1 else "%x-%j.out",
        title=f"{spec.recipe.name}: {spec.recipe.description}", source=spec.source,
        site=site.name, payload_dir=spec.payload_dir, payload_digest=spec.payload_digest,
        activate=site.setup.activate or "", program=work.program, tasks=list(work.tasks))
    return Plan(backend="slurm", files=(PlannedFile(file, text, executable=True),),
                primary=file, submit_argv=("sbatch", "--parsable", "{primary}"))


def spare_nodes(spec: JobSpec) -> int:
    """Nodes allocated beyond the ones that train (recipe job.spare_nodes)."""
    return spec.recipe.job.spare_nodes


def request(spec: JobSpec) -> list[tuple[str, str]]:
    """The #SBATCH lines of the Slurm options jobgen owns (options.py), in sbatch's spelling."""
    return sbatch_lines(spec.options)


def _extra(spec: JobSpec) -> tuple[tuple[str, str], ...]:
    """The #SBATCH options jobgen does not own (options.py): (name, value or "")."""
    return tuple(spec.options.get(EXTRA, ()))


def prepare(spec: JobSpec, strict: bool = True, say: Optional[Echo] = None) -> None:
    """Place the job's payload snapshot on the site's shared storage (jobgen/images/snapshot.py):
    the script points there. `strict` (submit) refuses where that storage is not mounted here;
    otherwise (render) that is said, and the job checks when it starts."""
    from ...images import snapshot
    snapshot.place(spec.site.snapshot_root, spec.payload_digest, strict=strict, say=say)


# --- the job once it is submitted -----------------------------------------------------------

def dry_run(spec: JobSpec, options: SubmitOptions) -> str:
    """A bash script of the sbatch commands `submit` runs (the scripts as here-documents)."""
    from . import client as slurm_client
    return _guarded(slurm_client.dry_run(_plans(spec, options),
                                         last_follows=options.every is not None), spec)


def _plans(spec: JobSpec, options: SubmitOptions) -> list[Plan]:
    """The jobs of a submission in pipeline order (--stages), each after the one before: the
    training job (two with --chain) where train is named, each other stage's job (a
    rehearsal's after its prepare job read the dataset it makes: stages.chained)."""
    from ...payloads import stages
    plans: list[Plan] = []
    for name, one in stages.chained(spec, options.stages):
        if options.every is not None and name in ("export", "eval"):
            continue
        if name != "train":
            plans.append(plan_stage(one, name, options.sources, options.step))
        elif options.chain:
            plans += [plan(one, "compile"), plan(one, "train")]
        else:
            plans.append(plan(one))
    if options.every is not None:   # the export and eval jobs' work, done as training goes
        plans.append(plan_follow(one, options.stages, options.every))
    return plans


def _guarded(script: str, spec: JobSpec) -> str:
    """The dry run's script, refusing to submit (`| bash`) while the payload snapshot its jobs
    point at is not there: a dry run places nothing, `jobgen render` or `submit` does."""
    import shlex

    from ...images import snapshot
    folder = snapshot.folder(spec.site.snapshot_root, spec.payload_digest)
    marker = shlex.quote(f"{folder}/{snapshot.MARKER}")
    said = shlex.quote(f"jobgen: the payload snapshot these jobs run, {folder}, is not "
                       "there: place it with jobgen render (same options, output discarded), "
                       "or submit without --dry-run")
    guard = f"[ -f {marker} ] || {{ echo {said} >&2; exit 2; }}"
    head, sep, rest = script.partition("set -euo pipefail\n")
    return head + sep + guard + "\n" + rest


def sweepable(specs: Sequence[JobSpec]) -> bool:
    """Whether a sweep's jobs can be one job array: the same #SBATCH header (a sweep over the
    time limit, say, cannot)."""
    return len({array_key(s) for s in specs}) == 1


def dry_run_sweep(specs: Sequence[JobSpec], options: SubmitOptions) -> str:
    """What `submit --sweep` runs: the sbatch of one job array."""
    from . import client as slurm_client
    return _guarded(slurm_client.dry_run([plan_array(specs)]), specs[0])


def submit_sweep(specs: Sequence[JobSpec], options: SubmitOptions) -> list[Submitted]:
    """One job array; task K's id (ARRAYID_K) for specs[K]."""
    from . import client as slurm_client
    prepare(specs[0], strict=True, say=options.say)   # one payload snapshot for every task
    check(specs[0], options)   # one payload, one partition, one node count for every task
    array_id = slurm_client.submit(plan_array(specs))
    return [Submitted((f"{array_id}_{i}",)) for i in range(len(specs))]


def preflight(spec: JobSpec) -> tuple[str, ...]:
    """What could not be checked from this host (raises at the first failed check)."""
    from . import client as slurm_client
    unchecked = slurm_client.preflight(spec, payloads.for_spec(spec, "slurm"))
    return (f"not checked from this host: {'; '.join(unchecked)}",) if unchecked else ()


def submit(spec: JobSpec, options: SubmitOptions) -> Submitted:
    """sbatch of exactly the script `jobgen render` prints (two dependent jobs with chain)."""
    from . import client as slurm_client
    prepare(spec, strict=True, say=options.say)   # the payload snapshot the script points at
    check(spec, options)
    plans = _plans(spec, options)
    ids = slurm_client.submit_chain(*plans, last_follows=options.every is not None)
    stages = [name for name in _job_stages(options)
              for _ in range(2 if name == "train" and options.chain else 1)]
    return Submitted(ids, stages=tuple(stages))


def _job_stages(options: SubmitOptions) -> list[str]:
    """Each job's stage, in order: with --every, the follower does export's and eval's work."""
    if options.every is None:
        return list(options.stages)
    from ...payloads import follow
    return [n for n in options.stages if n not in ("export", "eval")] + [follow.STAGE]


def check(spec: JobSpec, options: SubmitOptions) -> None:
    """The preflight unless --no-check; what it could not check is said before submitting."""
    if options.check:
        for note in preflight(spec):
            (options.say or print)(note)
        if "train" in options.stages and "prepare" not in options.stages:
            _check_data(spec, options.say or print)


def _check_data(spec: JobSpec, say: Echo) -> None:
    """The data check from this host where it sees the site's data folder (exit 2 on a
    problem); else one line: the nodes check it before the compile pass."""
    from ...payloads import data
    if not spec.recipe.job.data_check or data.expectations(spec) is None:
        return
    if not Path(spec.site.paths.data_dir).is_dir():
        say(f"data: not checked from this host (it does not see {spec.site.paths.data_dir}); "
            "the nodes check it before the compile pass")
        return
    status, out, err = data.check_here([spec], Path(spec.payload_dir))
    if status == 2:
        raise ConfigError("; ".join(line.removeprefix("error: ") for line in err.splitlines()
                                    if line.strip()) or "the data check failed")
    for line in (out + err).splitlines():
        say(line)


def wait(ref: JobRef, echo: Echo, poll_s: float = 2.0) -> int:
    from . import jobs as slurm_jobs
    final = slurm_jobs.wait(ref.job_id, poll=poll_s, on_change=echo)
    return 0 if final.state == "COMPLETED" else 1


def status(ref: JobRef) -> JobStatus:
    from . import jobs as slurm_jobs
    found = slurm_jobs.status(ref.job_id)
    code = found["exit_code"].partition(":")[0]   # STATUS:SIGNAL, once the job ended
    return job_status("slurm", found["job_id"], found["state"], found["reason"],
                      int(code) if code.isascii() and code.isdigit() else None,
                      exit=found["exit_code"],
                      nodes=found["nodes"], restarts=found["restarts"],
                      output=found["output"])


def status_lines(ref: JobRef) -> list[str]:
    from . import jobs as slurm_jobs
    return slurm_jobs.status_lines(ref.job_id)


def logs(ref: JobRef, node: Optional[int], follow: bool, echo: Echo) -> None:
    """The job's output file; with `node`, that node's compile and training logs (every
    restart's, oldest first) from the run folder, which needs the run's record."""
    from . import jobs as slurm_jobs
    if node is None:
        path = slurm_jobs.log_path(ref.job_id)
        files: Callable[[], list[Path]] = lambda: [path]   # noqa: E731
        if not follow and not path.exists():
            raise RemoteError(f"{path}: not written yet")
    else:
        if ref.run is None:
            raise ConfigError(f"--node: job {ref.job_id} has no run record (it was not "
                              "submitted by jobgen here); its nodes' logs are in "
                              f"RUN_DIR/logs/{ref.job_id}/restart-N/node-K/")
        folder = Path(ref.run.run_dir, "logs", ref.job_id)
        # Spare nodes (job.spare_nodes) log past the training nodes' ranks.
        if node >= ref.run.nodes and not any(folder.glob(f"restart-*/node-{node}")):
            raise ConfigError(f"--node: job {ref.job_id} has {ref.run.nodes} nodes "
                              f"(0 to {ref.run.nodes - 1})")
        files = lambda: slurm_jobs.node_logs(folder, node)   # noqa: E731
        if not follow and not files():
            raise RemoteError(f"job {ref.job_id} node {node}: no logs yet in {folder}")
    if follow:
        slurm_jobs.follow(files, ref.job_id, echo)
        return
    from ...plumbing import fsio
    for path in files():
        try:   # the one reader: a FIFO or a device among the logs is not waited on
            echo(fsio.read_bytes(path, fsio.MAX_BYTES, partial=True).decode("utf-8", "replace"))
        except (OSError, ConfigError) as exc:
            echo(printable(f"jobgen: {exc}; not shown"))


def cancel(ref: JobRef) -> str:
    from . import jobs as slurm_jobs
    return slurm_jobs.cancel(ref.job_id)


def checked() -> tuple[list[str], list[str]]:
    """What `jobgen check` says it checked beyond rendering (notes), or could not (problems)."""
    return [], []
