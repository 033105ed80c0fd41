"""The SageMaker backend: a CreateTrainingJob request for SageMaker's model-parallel library v2
(backend.py), its instances emulated on this machine (rehearsal.py), and what `jobgen watch`
does to a training job (watch.py: its CloudWatch logs)."""
from __future__ import annotations

from .. import Declaration, State

DECLARATION = Declaration(
    name="sagemaker",
    summary="a SageMaker training job (CreateTrainingJob request)",
    site_section="sagemaker", site_section_holds="role, images, S3 locations",
    site_example="sagemaker",
    container=True,
    local_cache_step=False,
    shared_fs=False,
    spares="a training job's instance count is fixed, every instance trains, and they do not "
           "share the run folder, so a lost instance fails the job and the retry starts a new "
           "one",
    rehearses=True,
    any_node_failure_ends=True,
    # At MaxRuntimeInSeconds (and on StopTrainingJob) SageMaker sends SIGTERM, then SIGKILL
    # 120 s later: the entrypoint's flow asks the trainers to save and stop.
    forwards_stop_signal=True, stop_grace_s=120,
    # Each instance's own disk outside the checkpoint folder SageMaker syncs to S3: what is
    # written here is never uploaded, nor restored on a retry.
    node_scratch="/tmp/jobgen",
    watch=True,
    logs_per_node=True,
    # "stage": a submission may be one stage's job (--stages export: stage.py), never a chain.
    options=frozenset({"endpoint_url", "region", "profile", "stage"}),
    extra="sagemaker", sdk_modules=("botocore",), renders_with_sdk=True,
    default_poll_s=30.0,
    health_on_failure=(
        "the training job fails with the node and the check as its failure reason; not "
        "retried"),
    # DescribeTrainingJob's TrainingJobStatus.
    states={"INPROGRESS": State.RUNNING, "COMPLETED": State.COMPLETED,
            "FAILED": State.FAILED, "STOPPING": State.RUNNING, "STOPPED": State.CANCELLED},
)
