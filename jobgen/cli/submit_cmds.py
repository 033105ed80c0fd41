"""Submitting: submit, resubmit, and the local rehearsal `run`."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Optional

import click

from .. import backends
from ..plumbing.errors import ConfigError
from .options import (
    _backend_option,
    _endpoint_option,
    _run_spec_options,
    _slurm_overrides,
    _spec,
    _spec_options,
    _submit_options,
    _targeted,
    _who_takes,
    _with_target,
)
from .param_types import _Backends, _Seconds


@click.command()
@click.argument("recipe")
@_spec_options
@_backend_option(lambda d: d.submits, "Where the job goes: sbatch, an AWS Batch multi-node job, or "
                            "Slurm through submitit.")
@click.option("--via", type=click.Choice(sorted(backends.VIA)), hidden=True,
              help="Old spelling of --backend slurm|submitit.")
@click.option("--chain", is_flag=True,
              help="Slurm: compile and train as two jobs; training depends on the compile job "
                   "(afterok).")
@click.option("--stages", "stage_list", default="train", show_default=True, metavar="A,B",
              help="Slurm, Batch: the stages to submit, each job after the one before "
                   "(afterok; dependsOn): prepare (the dataset), train (the two passes), "
                   "export (a sealed step as a Hugging Face folder; --smoke rehearsals), "
                   "eval (an exported step scored by lm-eval). SageMaker: one at a time "
                   "(train, or export once training has completed).")
@click.option("--from", "sources", multiple=True, metavar="PATH",
              help="The prepare stage's input (text or JSONL, local or s3://); repeatable: one "
                   "array task and one shard (data.shards) per input. BERT: or one MediaWiki "
                   "dump (.xml, .xml.bz2), made into text as bertPrep.py does.")
@click.option("--step", type=click.IntRange(min=0), metavar="N",
              help="The step the export stage exports and the eval stage scores (default: "
                   "when each job starts, the newest sealed step the trainer logged a step "
                   "after; the newest export).")
@click.option("--every", type=int, metavar="K",
              help="Slurm: with --stages train,export[,eval], one follower job beside "
                   "training exports (and scores) each sealed step that is a multiple of K as "
                   "training goes, instead of one export after it (docs/model-out.md).")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="One job per combination of the values (repeatable; a Slurm job array "
                   "where the jobs' #SBATCH lines agree), each with its own run name.")
@click.option("--no-check", is_flag=True,
              help="Slurm: submit without first checking, from this host, that the site's "
                   "paths (venv, checkout, data, run folders), the launcher and the trainer are "
                   "where the site says and that the partition has the nodes.")
@_submit_options
@_targeted
def submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
           compile_mode: str, run_name: Optional[str], smoke: bool, backend: str,
           via: Optional[str], chain: bool, sweeps: tuple[str, ...], no_check: bool,
           amend: bool, wait: bool, poll: Optional[float], queue: Optional[str],
           endpoint_url: Optional[str], dry_run: bool, tokens: Optional[float],
           samples: Optional[float], stage_list: str, sources: tuple[str, ...],
           step: Optional[int], every: Optional[int], **slurm: Optional[str]) -> None:
    """Submit RECIPE (exactly what `jobgen render` prints for the backend); prints the job id
    (two for --chain, one per job of a --sweep) and records each run for `jobgen runs`."""
    if via is not None:
        backend = backends.VIA[via]
    overrides = _with_target(recipe, nodes, overrides, site, backend, smoke, tokens, samples)
    _submit(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend, chain,
            not no_check, wait, poll, queue, endpoint_url, dry_run, _slurm_overrides(slurm),
            sweeps, amend, stages=_stages(stage_list, backend, sources, step, every),
            sources=sources, step=step, every=every)


def _stages(text: str, backend: str, sources: tuple[str, ...],
            step: Optional[int] = None, every: Optional[int] = None) -> tuple[str, ...]:
    """--stages checked: known, in order; a backend that cannot chain them says so."""
    from ..payloads.stages import chain
    names = chain(text)
    declared = backends.declaration(backend)
    if names != ("train",) and not declared.takes("stages") and declared.takes("stage"):
        if len(names) > 1:   # its jobs cannot depend on one another: one at a time
            raise click.UsageError(f"--stages {text}: --backend {backend} cannot run stages "
                                   "one after another (its jobs cannot wait for each other): "
                                   "submit each on its own, --stages export once training "
                                   "has completed")
    elif names != ("train",) and not declared.takes("stages"):
        raise click.UsageError(f"--stages {text}: --backend {backend} cannot run stages "
                               f"other than train yet ({_who_takes('stages')} can)")
    if sources and "prepare" not in names:
        raise click.UsageError("--from is the prepare stage's input: add it to --stages")
    if step is not None and not {"export", "eval"} & set(names):
        raise click.UsageError("--step is the export and eval stages': add one to --stages")
    if every is not None:
        from ..payloads import follow
        follow.check(names, every, step)
        if not backends.declaration(backend).takes("every"):
            raise click.UsageError(f"--every {every}: --backend {backend} cannot run a job "
                                   "beside training that follows it (its jobs run one after "
                                   f"another; {_who_takes('every')} can)")
    return names


def _submit(recipe: str, nodes: Optional[int], overrides: tuple[str, ...],
            site: Optional[str], compile_mode: str, run_name: Optional[str], smoke: bool,
            backend: str, chain: bool, check: bool, wait: bool, poll: Optional[float],
            queue: Optional[str], endpoint_url: Optional[str], dry_run: bool,
            slurm: Optional[dict[str, Optional[str]]] = None,
            sweeps: tuple[str, ...] = (), amend: bool = False,
            pinned: Optional[tuple[Any, Path, Path]] = None,
            stages: tuple[str, ...] = ("train",), sources: tuple[str, ...] = (),
            step: Optional[int] = None, every: Optional[int] = None) -> None:
    """`pinned`: (spec, recipe file, site file) of `jobgen resubmit`, resolved already."""
    import os

    from ..backends.protocol import JobRef
    from ..runs import ledger as runs
    declared = backends.declaration(backend)
    for option, given in (("queue", queue is not None), ("endpoint_url", endpoint_url is not None),
                          ("chain", chain)):
        if given and not declared.takes(option):
            why = "runs both passes in one job" if option == "chain" else "does not take it"
            raise click.UsageError(f"--{option.replace('_', '-')} is for --backend "
                                   f"{_who_takes(option).replace(' and ', ' or ')} ({backend} "
                                   f"{why})")
    if stages != ("train",) and sweeps:
        raise click.UsageError("--stages and --sweep together are not supported: prepare the "
                               "data once, then submit the sweep")
    if chain and sweeps:
        raise click.UsageError("--chain and --sweep together are not supported: submit the "
                               "sweep as one job per combination (both passes in each)")
    if not dry_run or declared.renders_with_sdk:
        backends.require_extra(backend, f"--backend {backend}")
    spec = pinned[0] if pinned is not None else \
        _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, backend, slurm)
    specs = [spec]
    point_overrides: list[tuple[str, ...]] = [()]
    if sweeps:
        from ..inputs import sweep
        points = sweep.points(sweeps, spec.run_name)
        point_overrides = [point.overrides + sweep.port_override(
            point, i, spec.recipe.job.master_port, sweeps) for i, point in enumerate(points)]
        specs = [_spec(recipe, nodes, overrides + extra, site, compile_mode, point.run_name,
                       smoke, backend, slurm) for point, extra in zip(points, point_overrides)]
    impl: Any = backends.get(backend)   # and, where it takes sweep_array, its sweep functions
    options = backends.SubmitOptions(chain=chain, check=check, queue=queue,
                                     endpoint_url=endpoint_url,
                                     say=lambda note: click.echo(note, err=True),
                                     stages=stages, sources=sources, step=step,
                                     every=every)
    # A sweep whose jobs can be one job array (a backend that takes sweep_array says which).
    array = len(specs) > 1 and declared.takes("sweep_array") and impl.sweepable(specs)
    if dry_run:
        if array:
            click.echo(impl.dry_run_sweep(specs, options), nl=False)
        else:
            for one in specs:
                click.echo(impl.dry_run(one, options), nl=False)
        return
    if check and declared.run_dir_here:
        # The site's paths on this host (it mounts the nodes' file systems), looked for before
        # the payload snapshot is placed or anything is queued: one line per missing path.
        from ..inputs.site import locate as locate_site_file
        from ..job.site_paths import preflight
        preflight(spec, locate_site_file(site)[1])
    if site is None:   # the user's default (JOBGEN_SITE, the config file, local), recorded
        from ..inputs import userconfig
        site = userconfig.site(None)[0]
    site_ref = site if not ("/" in site or site.endswith((".yaml", ".yml"))) \
        else os.path.abspath(site)
    from ..runs import runrecord
    here = declared.run_dir_here
    from ..inputs.recipe import locate as locate_recipe
    from ..inputs.site import locate as locate_site
    recipe_file, site_file = (pinned[1], pinned[2]) if pinned is not None else \
        (locate_recipe(recipe)[0], locate_site(site)[0])
    entries = []
    for one, point in zip(specs, point_overrides):
        new = runrecord.submission(one, backend=backend, overrides=overrides + point,
                                   site_ref=site_ref or "", recipe_file=recipe_file,
                                   site_file=site_file, amend=amend, resubmit=pinned is not None)
        entries.append((new, runrecord.admit(one, new, here, amend)))
    if array:
        submitted = impl.submit_sweep(specs, options)
    else:
        submitted = [impl.submit(one, options) for one in specs]
    refs: list[Any] = []
    for one, done in zip(specs, submitted):
        for note in done.notes:
            click.echo(note, err=True)
        click.echo(" ".join(done.job_ids) + (f"  {one.run_name}" if len(specs) > 1 else ""))
        run_dir = os.path.abspath(one.run_dir) if here else one.run_dir
        record = runs.Run(name=one.run_name, backend=backend, job_id=done.job_id,
                          recipe=one.recipe.name, nodes=one.nodes, site=site_ref or "",
                          run_dir=run_dir, submitted=runs.now(), jobs=done.job_ids,
                          smoke=one.smoke, endpoint_url=endpoint_url, queue=done.queue,
                          max_steps=(one.rehearsal.max_steps if one.rehearsal
                                     else one.recipe.schedule.max_steps),
                          seq_length=(one.rehearsal.seq_length if one.rehearsal
                                      else one.recipe.model.seq_length),
                          stages=done.stages)
        new, old = entries[len(refs)]
        for warning in (runs.record(record),
                        runrecord.commit(one, new, old, done.job_ids, here, done.stages)):
            if warning:
                click.echo(f"warning: {warning}", err=True)
        refs.append(JobRef(done.job_id, record, site, endpoint_url))
    if wait:
        from ..runs.progress import Ticker
        default_poll = declared.default_poll_s
        def steps() -> str:   # the newest step, where the run folders are on this machine
            from ..runs.progress import newest_step
            if not here:
                return ""
            found = [(newest_step(r.run.run_dir, r.job_id), r.run.max_steps) for r in refs]
            return ", ".join(f"step {n}/{m}" for n, m in found if n is not None)

        with Ticker(steps=steps) as ticker:
            statuses = [impl.wait(ref, ticker.say, poll if poll is not None else default_poll)
                        for ref in refs]
        raise SystemExit(max(statuses))


@click.command()
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

    from ..runs import runrecord
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
        if last.get("rehearsal"):   # a `jobgen run`: it runs here again, in the foreground
            _rehearse_again(run, spec, recipe_file, site_file, last, dry_run)
        _submit(last["recipe"], spec.nodes, tuple(last["overrides"]), last["site"] or None,
                spec.compile_mode, spec.run_name, spec.smoke, last["backend"], False,
                not no_check, wait, poll, None, endpoint_url, dry_run,
                pinned=(spec, recipe_file, site_file))


def _rehearse_again(run: str, spec: Any, recipe_file: Path, site_file: Path,
                    last: dict[str, Any], dry_run: bool) -> None:
    """`jobgen resubmit` of a rehearsal: `jobgen run` again with what it recorded."""
    from ..backends.local import rehearsal
    stage = (last.get("job_stages") or ["train"])[0]
    if stage != "train":       # a stage's job (`jobgen run --stage`): that stage again
        from ..backends.local import stage as local_stage
        sources = tuple(last.get("sources") or ())
        if dry_run:
            raise SystemExit(0)
        raise SystemExit(local_stage.run(
            spec, stage, sources, site_ref=last["site"], overrides=last["overrides"],
            recipe_file=recipe_file, site_file=site_file, emit=click.echo,
            say=lambda line: click.echo(line, err=True),
            step=(last.get(stage) or {}).get("step")))
    if dry_run:
        click.echo(backends.get("local").dry_run(spec, backends.SubmitOptions()), nl=False)
        raise SystemExit(0)
    from ..plumbing.render import shell_quote
    raise SystemExit(rehearsal.start(
        spec, site_ref=last["site"], overrides=last["overrides"], recipe_file=recipe_file,
        site_file=site_file, resume=shell_quote(["jobgen", "resubmit", run]), emit=click.echo,
        say=lambda line: click.echo(line, err=True), resubmit=True))


@click.command()
@click.argument("recipe")
@_run_spec_options
@click.option("--dry-run", is_flag=True,
              help="Print each emulated node's command and environment; run nothing.")
@click.option("--backend", "run_backend", type=_Backends(lambda d: d.rehearses),
              default="local", show_default=True,
              help="Whose nodes to emulate: jobgen's own, the SageMaker training job's "
                   "instances or the EKS job's pods (their rendered commands and environment).")
@click.option("--amend", is_flag=True,
              help="Run into an existing run although its training values or payload differ; "
                   "the run's record keeps every run.")
@click.option("--stage", default="train", show_default=True, metavar="NAME",
              help="The stage's job: train (the two passes) or, with --smoke, prepare (the "
                   "rehearsal-sized dataset at the recipe's paths, which train then reads) or "
                   "export (a sealed step of the rehearsal as a Hugging Face model folder in "
                   "RUN/export/step-N, proven against the trainer's logged loss) or eval (an "
                   "exported step scored by lm-eval on a task made here, RUN/eval/step-N.json)."
                   " --backend sagemaker: export, as its one-instance job on the run's S3 "
                   "checkpoints.")
@click.option("--from", "sources", multiple=True, metavar="FILE",
              help="--stage prepare: the text or JSONL to make the dataset of (repeatable); "
                   "default: a corpus generated from the recipe's seed.")
@click.option("--step", type=click.IntRange(min=0), metavar="N",
              help="--stage export: the sealed step to export (default: the newest one the "
                   "trainer logged a step after); --stage eval: the exported step to score "
                   "(default: the newest).")
@click.option("--every", type=int, metavar="K",
              help="Training with --smoke: a follower beside it exports and scores each sealed "
                   "step that is a multiple of K as training goes (RUN/export/step-N, "
                   "RUN/eval/step-N.json), as `jobgen submit --every K` does on a cluster.")
@click.option("--stages", "stage_list", default=None, metavar="A,B",
              help="With --every: train,export (no scores) or train,export,eval (the default).")
def run(recipe: str, nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
        compile_mode: str, run_name: Optional[str], smoke: bool, dry_run: bool,
        run_backend: str, amend: bool, stage: str, sources: tuple[str, ...],
        step: Optional[int], every: Optional[int], stage_list: Optional[str],
        **slurm: Optional[str]) -> None:
    """Run the job on this machine, no scheduler: one process group per emulated node (use
    --smoke where there are no accelerators). Exits with the main node's status."""
    from ..backends.local import runner as local_runner
    given = [k.replace("_", "-") for k, v in _slurm_overrides(slurm).items()
             if v not in (None, ())]
    if given:
        raise click.UsageError(f"--{given[0]} is a Slurm setting; `jobgen run` uses no "
                               "scheduler")
    if sources and stage != "prepare":
        raise click.UsageError("--from is the prepare stage's input (--stage prepare)")
    if stage != "train" and run_backend != "local" and stage not in getattr(
            backends.module(run_backend, "rehearsal"), "STAGES", ()):
        raise click.UsageError(f"--stage {stage}: `jobgen run` runs it with --backend local")
    from ..payloads.stages import stage as declared_stage
    if step is not None and not declared_stage(stage).takes_step:
        raise click.UsageError("--step is the export and eval stages' (--stage export|eval)")
    followed = _followed(every, stage_list, stage, run_backend, smoke, step)
    spec = _spec(recipe, nodes, overrides, site, compile_mode, run_name, smoke, run_backend)
    if stage != "train":
        _run_stage(spec, stage, sources, recipe, nodes, overrides, site, run_name, dry_run,
                   amend, step)
    if dry_run and backends.declaration(run_backend).container:
        import json
        for index, (argv, env) in enumerate(local_runner.commands(spec, "dry-run",
                                                                  write=False)):
            click.echo(json.dumps({"node": index, "argv": argv, "env": env}, indent=2))
        return
    if dry_run:
        click.echo(backends.get("local").dry_run(spec, backends.SubmitOptions()), nl=False)
        if followed:   # and the follower beside it
            from ..payloads import follow
            from ..plumbing.render import shell_quote as quoted
            made = follow.work(spec, followed, every or 0, ("--until", "FILE"))
            click.echo("# beside it: " + quoted(["python3", f"{spec.payload_dir}/{made.program}",
                                                 *made.tasks[0]]))
        return
    again = ["jobgen", "run", recipe, "--nodes", str(spec.nodes),
             *[word for item in overrides for word in ("--set", item)],
             *(["--site", site] if site else []), *(["--run-name", run_name] if run_name else []),
             *(["--smoke"] if smoke else []),
             *(["--backend", run_backend] if run_backend != "local" else []),
             *(["--compile", compile_mode] if compile_mode != "auto" else []),
             *(["--every", str(every), "--stages", ",".join(followed)] if followed else [])]
    from ..backends.local import rehearsal
    from ..inputs.recipe import locate as locate_recipe
    from ..inputs.site import locate as locate_site
    from ..inputs.userconfig import site as default_site
    from ..plumbing.render import shell_quote
    site_ref = site if site is not None else default_site(None)[0]
    if "/" in site_ref or site_ref.endswith((".yaml", ".yml")):
        site_ref = os.path.abspath(site_ref)
    # Recorded as a submission is (`jobgen runs`, and jobgen-run.json in the run folder), so
    # that `runs NAME`, `status`, `report` and `resubmit` know it
    # (jobgen/backends/local/rehearsal.py).
    from ..runs.ledger import local_job_id
    job_id = local_job_id()
    with contextlib.ExitStack() as beside:
        if followed:
            from ..backends.local import follow as local_follow
            follower = beside.enter_context(local_follow.beside(
                spec, job_id, followed, every or 0, click.echo,
                lambda line: click.echo(line, err=True)))
        status = rehearsal.start(spec, site_ref=site_ref, overrides=overrides,
                                 recipe_file=locate_recipe(recipe)[0],
                                 site_file=locate_site(site_ref)[0], resume=shell_quote(again),
                                 emit=click.echo, say=lambda line: click.echo(line, err=True),
                                 amend=amend, job_id=job_id)
        if followed:
            follower.cancelled = status == rehearsal.STATUS_CANCELLED
    if followed and not follower.cancelled:
        click.echo(f"jobgen: the follower ended with status {follower.status}", err=True)
        status = status or follower.status or 0
    # The folder as it lies here (an emulated SageMaker instance's disk, not /opt/ml).
    click.echo(closing_line(rehearsal.run_folder(spec, job_id), status, again))
    raise SystemExit(status)


def _followed(every: Optional[int], stage_list: Optional[str], stage: str, backend: str,
              smoke: bool, step: Optional[int]) -> tuple[str, ...]:
    """`jobgen run --every K [--stages ...]`: the stages its follower does, or () without it."""
    if every is None:
        if stage_list is not None:
            raise click.UsageError("--stages is for --every K (`jobgen run` runs one stage: "
                                   "--stage NAME)")
        return ()
    from ..payloads import follow
    from ..payloads.stages import chain
    names = chain(stage_list or "train,export,eval")
    follow.check(names, every, step)
    if stage != "train" or backend != "local" or not smoke:
        raise click.UsageError(f"--every {every}: a rehearsal's training (--smoke, --stage "
                               "train, --backend local) is what the follower follows here")
    if "prepare" in names:
        raise click.UsageError("--every: --stages train,export[,eval] (prepare first, with "
                               "--stage prepare)")
    return names


def _run_stage(spec: Any, stage: str, sources: tuple[str, ...], recipe: str,
               nodes: Optional[int], overrides: tuple[str, ...], site: Optional[str],
               run_name: Optional[str], dry_run: bool, amend: bool,
               step: Optional[int] = None) -> None:
    """`jobgen run --stage NAME`: the stage's job on this machine (jobgen/backends/local/
    stage.py); exits with its status."""
    from ..backends.local import rehearsal as local_rehearsal
    from ..backends.local import stage as local_stage
    from ..inputs.recipe import locate as locate_recipe
    from ..inputs.site import locate as locate_site
    from ..inputs.userconfig import site as default_site
    from ..payloads import stages
    from ..plumbing.render import shell_quote
    from ..runs.ledger import local_job_id
    container = backends.declaration(spec.backend).container
    if dry_run and container:    # the emulated instance's command: nothing laid out
        import json
        instance = backends.module(spec.backend, "rehearsal").stage_instance(
            spec, stage, "dry-run", write=False)
        argv, env = instance.command(step, write=False)
        click.echo(json.dumps({"node": 0, "argv": argv, "env": env}, indent=2))
        raise SystemExit(0)
    if dry_run and stages.stage(stage).work is not None:   # what it would run, one per task
        made = stages.work(stage, spec, sources, step)
        for task in made.tasks:
            click.echo(shell_quote(["python3", f"{spec.payload_dir}/{made.program}", *task]))
        raise SystemExit(0)
    train = ["jobgen", "run", recipe, "--nodes", str(spec.nodes),
             *[word for item in overrides for word in ("--set", item)],
             *(["--site", site] if site else []), *(["--run-name", run_name] if run_name else []),
             *(["--backend", spec.backend] if spec.backend != "local" else []), "--smoke"]
    again = train[:3] + ["--stage", stage, *[w for s in sources for w in ("--from", s)],
                         *(["--step", str(step)] if step is not None else []), *train[3:]]
    site_ref = site if site is not None else default_site(None)[0]
    if "/" in site_ref or site_ref.endswith((".yaml", ".yml")):
        site_ref = os.path.abspath(site_ref)
    job_id = local_job_id()
    status = local_stage.run(spec, stage, sources, site_ref=site_ref, overrides=overrides,
                             recipe_file=locate_recipe(recipe)[0],
                             site_file=locate_site(site_ref)[0], emit=click.echo,
                             say=lambda line: click.echo(line, err=True), amend=amend,
                             step=step, job_id=job_id)
    click.echo(local_stage.closing_line(spec, stage, status, again, train,
                                        local_rehearsal.run_folder(spec, job_id)))
    raise SystemExit(status)


def closing_line(run_dir: str, status: int, again: list[str]) -> str:
    """The rehearsal's last line: where its folder is and what to run next (every word quoted
    so that it pastes into a shell as it stands)."""
    from ..plumbing.errors import printable
    from ..plumbing.render import shell_quote
    folder = shell_quote(str(run_dir))
    return printable(f"jobgen: run ended with status {status}; its folder: {folder}; next: "
                     f"jobgen report --run-dir {folder}, jobgen watch --run-dir {folder}; "
                     f"resume (or rerun) with: {shell_quote(again)}")
