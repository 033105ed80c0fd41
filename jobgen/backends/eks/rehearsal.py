"""`jobgen run --backend eks`: the pods of the rendered JobSet's child Job emulated on this
machine; engine.py restarts them as JobSet would."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from ...job.spec import JobSpec
from ..local.runner import image_moves, relocate
from . import jobset as jobsets
from .manifests import manifests

LABEL_FIELD = re.compile(r"metadata\.labels\['([^']+)'\]")


def pod_labels(job: dict[str, Any], restart_attempt: int) -> dict[str, str]:
    """The labels of a pod of the child Job: its template's, and the restart attempt JobSet's
    controller adds."""
    labels = dict((job["spec"]["template"].get("metadata") or {}).get("labels") or {})
    labels[jobsets.RESTART_ATTEMPT] = str(restart_attempt)
    return labels


def _env_value(entry: dict[str, Any], labels: dict[str, str]) -> Optional[str]:
    """An env entry's value as the kubelet gives it: its value, or a label (the downward API);
    a label the pod lacks leaves the variable unset."""
    if "value" in entry:
        return str(entry["value"])
    found = LABEL_FIELD.fullmatch(entry["valueFrom"]["fieldRef"]["fieldPath"])
    assert found, entry   # the only downward-API field jobgen renders
    return labels.get(found.group(1))


def commands(spec: JobSpec, job_id: str, root: Path, write: bool = True,
             labels: Optional[dict[str, str]] = None) -> list[tuple[list[str], dict[str, str]]]:
    """Each pod of the rendered JobSet's child Job, emulated: the container's command and
    arguments with its environment (the downward API read off the pod's `labels`, as the
    engine gives them: by default those of JobSet's first attempt), JOB_COMPLETION_INDEX and
    HOSTNAME as Kubernetes sets them, the main pod's name resolved to this machine, and the
    node-local compile cache (a hostPath) under ROOT/node-K (nothing is written beforehand:
    `write` is for the same call as SageMaker's)."""
    job = jobsets.child_job(manifests(spec)[0])
    site = spec.site.eks
    assert site is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
    if labels is None:
        labels = pod_labels(job, 0)
    name = job["metadata"]["name"]   # pod K's host name: NAME-K
    out = []
    for index in range(spec.nodes):
        moves = image_moves(spec, write) + [
            (site.local_cache_host_path, str(root / f"node-{index}" /
                                             site.local_cache_host_path.lstrip("/")))]
        if site.shared_mount.startswith("/") and site.shared_mount != "/":
            # The claim (FSx) every pod mounts: one folder here, shared by the emulated pods.
            moves.append((site.shared_mount.rstrip("/") + "/",
                          f"{root.parent / 'shared'}{site.shared_mount.rstrip('/')}/"))
        env = {e["name"]: relocate(value, moves) for e in container["env"]
               if (value := _env_value(e, labels)) is not None}
        env.update({"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{name}-{index}",
                    "JOBGEN_MAIN_HOST": "127.0.0.1", "JOBGEN_K8S_JOB": job_id})
        argv = [relocate(a, moves) for a in container["command"] + container["args"]]
        out.append((argv, env))
    return out
