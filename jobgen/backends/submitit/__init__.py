"""The submitit backend: the sbatch job's nodes handed to Slurm by submitit (backend.py,
runner.py); once submitted it is a Slurm job, so status, logs, cancel and watch are Slurm's."""
from __future__ import annotations

from .. import Declaration
from ..slurm import SLURM_EMPTY

DECLARATION = Declaration(
    name="submitit",
    summary="Slurm through submitit (same nodes, same flow as the sbatch script)",
    site_section="slurm",
    site_empty=SLURM_EMPTY,
    spec_backend="slurm",
    scheduler="slurm",
    checks=False,
    run_dir_here=True,
    time_limit_requeue=True,
    setup_on_main=True,
    resolves_master=True,
    options=frozenset({"check"}),
    job_options="slurm",
    spares="submitit starts the job's tasks as one step with no spare; use the slurm backend",
    extra="submitit", sdk_modules=("submitit",),
    default_poll_s=2.0,
    health_on_failure=(
        "the job stops, naming the node and the check (resubmit with --exclude HOST)"),
)
