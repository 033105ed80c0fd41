"""The Slurm backend: one sbatch script per job (compile pass, then training pass)."""
from __future__ import annotations

from typing import Literal

from .. import launch
from ..launch import compile_key
from ..plan import Plan, PlannedFile
from ..render import render
from ..spec import JobSpec

TEMPLATE = "slurm/job.sbatch.j2"


Passes = Literal["both", "compile", "train"]


def plan(spec: JobSpec, passes: Passes = "both") -> Plan:
    """The sbatch script; `passes` splits the job in two for chained submission."""
    lau = launch.for_spec(spec, "slurm")
    site, recipe = spec.site, spec.recipe
    # The cache variable, e.g. NEURON_COMPILE_CACHE_URL=DIR or PT_HPU_RECIPE_CACHE_CONFIG=DIR,...
    ((cache_var, cache_value),) = launch.compile_cache_env(spec, "DIR").items()
    text = render(
        TEMPLATE,
        job_name=recipe.name + ("" if passes == "both" else f"-{passes}"),
        passes=passes,
        nodes=spec.nodes,
        cpus_per_task=site.slurm.cpus_per_task,
        exclusive=site.slurm.exclusive,
        partition=site.slurm.partition,
        account=site.slurm.account,
        time_limit=recipe.job.time_limit,
        title=f"{recipe.name}: {recipe.description}",
        source=spec.source,
        site=site.name,
        compile_steps=recipe.compile.steps,
        run_dir=spec.run_dir,
        payload_dir=spec.payload_dir,
        launcher=lau.launcher,
        activate=site.setup.activate or "",
        max_restarts=recipe.job.max_restarts,
        compile_mode=spec.compile_mode,
        compile_cache=site.paths.compile_cache,
        local_compile_cache=site.paths.local_compile_cache or "",
        compile_key=compile_key(spec, lau),
        master_resolver=site.slurm.master_resolver,
        master_port=recipe.job.master_port,
        workers_per_node=spec.workers_per_node,
        workdir=lau.workdir,
        program=lau.program,
        compile_wrapper=lau.compile_wrapper,
        compile_args=lau.compile_args,
        train_args=lau.train_args,
        env=launch.env_block(spec),
        files=lau.files,
        prepare=lau.prepare,
        cache_var=cache_var,
        cache_suffix=cache_value[len("DIR"):],
    )
    name = f"{spec.run_name}{'' if passes == 'both' else '-' + passes}.sbatch"
    return Plan(backend="slurm", files=(PlannedFile(name, text, executable=True),),
                primary=name, submit_argv=("sbatch", "--parsable", "{primary}"))
