"""The AWS Batch backend: a multi-node-parallel job definition (backend.py), Batch's API to
register, submit and follow it (client.py), and what `jobgen watch` does to a Batch job
(watch.py)."""
from __future__ import annotations

from .. import Declaration, State

_P, _R, _C, _F = State.PENDING, State.RUNNING, State.COMPLETED, State.FAILED

DECLARATION = Declaration(
    name="batch",
    summary="an AWS Batch multi-node parallel job definition and its SubmitJob request",
    site_section="batch", site_section_holds="job queue, images, roles",
    site_example="dl1-batch",
    container=True,
    local_cache_step=False,
    shared_fs=False,     # unless the site's work_dir is on batch.shared_volume (run_folder_shared)
    shared_fs_by_site=True,
    spares="a multi-node job's numNodes all run the training group and the main node's exit "
           "ends it, so a lost node ends the attempt and the retry strategy starts a new one",
    # A terminate or a time-out stops each node's container with SIGTERM, then SIGKILL 30 s later
    # (Batch's "Job timeouts"; the ECS agent's ECS_CONTAINER_STOP_TIMEOUT, which the job
    # definition cannot set); the entrypoint's flow turns the SIGTERM into the trainers' stop
    # signal.
    forwards_stop_signal=True, stop_grace_s=30,
    watch=True,
    command=True,
    logs_per_node=True,
    options=frozenset({"queue", "endpoint_url", "region", "profile", "stages"}),
    extra="batch", sdk_modules=("botocore",), renders_with_sdk=True,
    job_id_pattern=r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}(#\d+)?",
    default_poll_s=15.0,
    health_on_failure=(
        "the job fails, naming the node and the check; not retried (Batch cannot leave a "
        "host out)"),
    # JobDetail.status; a cancelled or terminated job is FAILED with its reason.
    states={"SUBMITTED": _P, "PENDING": _P, "RUNNABLE": _P, "STARTING": _P, "RUNNING": _R,
            "SUCCEEDED": _C, "FAILED": _F},
)
