"""The Slurm backend: one sbatch script per job (backend.py), Slurm's own commands to submit and
follow it (client.py), and what `jobgen watch` does to a Slurm job (watch.py)."""
from __future__ import annotations

from .. import Declaration, State

# A site with no Slurm cluster (slurm.max_nodes: 0): what the Slurm-section backends say.
SLURM_EMPTY = "has no Slurm cluster (slurm.max_nodes: 0): use it with --backend batch (AWS Batch)"

_P, _R, _C, _F, _X = State.PENDING, State.RUNNING, State.COMPLETED, State.FAILED, State.CANCELLED

DECLARATION = Declaration(
    name="slurm",
    summary="an sbatch script (render | sbatch, or jobgen submit)",
    site_section="slurm",
    site_empty=SLURM_EMPTY,
    run_dir_here=True,
    watch=True,
    time_limit_requeue=True,
    logs_per_node=True,
    shellcheck=True,
    resolves_master=True,
    forwards_stop_signal=True,
    options=frozenset({"chain", "check", "sweep_array", "stages", "every"}),
    job_options="slurm",    # options.py: the Slurm options jobgen owns
    spares="",              # job.spare_nodes: N+S nodes, sbatch --no-kill, torchrun's spares
    job_id_pattern=r"\d+(_\d+)?",
    default_poll_s=2.0,
    health_on_failure=(
        "the job is requeued without the failed nodes (ExcNodeList), at most "
        "health.max_requeues times, not counted against job.max_restarts"),
    # squeue's and sacct's job states (JOB STATE CODES in squeue(1)).
    states={"PENDING": _P, "CONFIGURING": _P, "REQUEUED": _P, "REQUEUE_HOLD": _P,
            "REQUEUE_FED": _P, "RESV_DEL_HOLD": _P, "SPECIAL_EXIT": _P, "SUSPENDED": _P,
            "STOPPED": _P, "RESIZING": _R, "RUNNING": _R, "COMPLETING": _R, "SIGNALING": _R,
            "STAGE_OUT": _R, "COMPLETED": _C, "FAILED": _F, "TIMEOUT": _F, "NODE_FAIL": _F,
            "OUT_OF_MEMORY": _F, "BOOT_FAIL": _F, "DEADLINE": _F, "PREEMPTED": _F,
            "REVOKED": _F, "CANCELLED": _X},
)
