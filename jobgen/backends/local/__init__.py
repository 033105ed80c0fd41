"""The local backend (`jobgen run`): every node of the job as a process group on this machine,
no scheduler (backend.py); the runner is jobgen/backends/local/runner.py."""
from __future__ import annotations

from .. import Declaration, State
from ..slurm import SLURM_EMPTY

DECLARATION = Declaration(
    name="local",
    summary="every node as a process group on this machine (jobgen run)",
    site_section="slurm",
    site_empty=SLURM_EMPTY,
    job_options="slurm",   # what a Slurm job would ask (jobgen run's own options refuse them)
    spares="jobgen run's nodes are processes on this machine, none of which is lost apart "
           "from the machine",
    submits=False,
    checks=False,
    rehearses=True,
    run_dir_here=True,
    watch_note="it runs in the foreground; its nodes write the run folder as they go",
    default_poll_s=1.0,
    health_on_failure="the rehearsal stops, naming the node and the check",
    states={"RUNNING": State.RUNNING, "COMPLETED": State.COMPLETED, "FAILED": State.FAILED,
            "CANCELLED": State.CANCELLED},
)
