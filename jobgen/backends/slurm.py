"""The Slurm backend: one sbatch script per job. The script exports the node contract
(jobgen/node.py) and the trainer's arguments, and hands Slurm's facts to the one two-pass flow
(payload/common/job_flow.sh): it carries values, not decisions."""
from __future__ import annotations

from .. import launch, node
from ..node import Passes
from ..plan import Plan, PlannedFile
from ..render import render
from ..spec import JobSpec

TEMPLATE = "slurm/job.sbatch.j2"


def plan(spec: JobSpec, passes: Passes = "both") -> Plan:
    """The sbatch script; `passes` splits the job in two for chained submission."""
    lau = launch.for_spec(spec, "slurm")
    site, recipe = spec.site, spec.recipe
    contract = node.contract(spec, lau, "slurm", passes=passes)
    text = render(
        TEMPLATE,
        job_name=recipe.name + ("" if passes == "both" else f"-{passes}"),
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
        contract=list(contract.variables().items()),
        env=launch.env_block(spec),
        compile_args=lau.compile_args,
        train_args=lau.train_args,
    )
    name = f"{spec.run_name}{'' if passes == 'both' else '-' + passes}.sbatch"
    return Plan(backend="slurm", files=(PlannedFile(name, text, executable=True),),
                primary=name, submit_argv=("sbatch", "--parsable", "{primary}"))
