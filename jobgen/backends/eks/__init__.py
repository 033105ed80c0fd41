"""The Amazon EKS backend: a JobSet (backend.py), its pods emulated on this machine (rehearsal.py,
with JobSet's engine: engine.py), and what `jobgen watch` does to an EKS job (watch.py: its
pods' logs)."""
from __future__ import annotations

from .. import Declaration, State

DECLARATION = Declaration(
    name="eks",
    summary="Kubernetes manifests for Amazon EKS (a JobSet)",
    site_section="eks", site_section_holds="namespace, images, FSx claim",
    site_example="sagemaker",
    container=True,
    setup_on_main=True,   # where the pods share the claim (eks.shared_pvc)
    shared_fs_by_site=True,
    spares="the gang is exactly --nodes pods (a JobSet); a lost pod "
           "restarts the gang, whose pods are scheduled again onto free nodes",
    rehearses=True,
    # At the Job's activeDeadlineSeconds (or a drain) each pod gets SIGTERM, then SIGKILL after
    # the pod's terminationGracePeriodSeconds (rendered from this; Kubernetes' default, 30 s, is
    # short for one save of a large model's shards to FSx): the flow asks the trainers to save.
    forwards_stop_signal=True, stop_grace_s=300,
    watch=True,
    logs_per_node=True,
    extra="eks", sdk_modules=("kubernetes",),
    default_poll_s=15.0,
    health_on_failure=(
        "the job fails at once (its pod failure policy, and JobSet's, on exit 75), naming the "
        "node and the check"),
    # The state jobgen reads off the JobSet's conditions and its pods.
    states={"PENDING": State.PENDING, "RUNNING": State.RUNNING,
            "COMPLETE": State.COMPLETED, "FAILED": State.FAILED},
)
