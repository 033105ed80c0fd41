"""`jobgen run --backend eks`: the pods of the rendered Indexed Job (a JobSet's child Job)
emulated on this machine; engine.py restarts them as JobSet would."""
from __future__ import annotations

from pathlib import Path

from ...job.spec import JobSpec
from ...plumbing.errors import ConfigError
from ..local.runner import image_moves, relocate
from . import jobset as jobsets
from .manifests import manifests


def commands(spec: JobSpec, job_id: str, root: Path,
             write: bool = True) -> list[tuple[list[str], dict[str, str]]]:
    """Each pod of the rendered Indexed Job (or JobSet's child Job), emulated: the container's
    command and arguments with its environment, JOB_COMPLETION_INDEX and HOSTNAME as Kubernetes
    sets them, the main pod's Service name resolved to this machine, and the node-local compile
    cache (a hostPath) under ROOT/node-K (nothing is written beforehand: `write` is for the same
    call as SageMaker's)."""
    docs = manifests(spec)
    job = docs[-1]
    if job["kind"] == "JobSet":   # its one child Job, as JobSet's controller creates it
        job = jobsets.child_job(job)
    if job["kind"] != "Job":
        raise ConfigError("jobgen run --backend eks rehearses the JobSet and Indexed Job forms; "
                          "this site renders a PyTorchJob (eks.gang)")
    site = spec.site.eks
    assert site is not None
    container = job["spec"]["template"]["spec"]["containers"][0]
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
        env = {e["name"]: relocate(e["value"], moves) for e in container["env"]}
        env.update({"JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{name}-{index}",
                    "JOBGEN_MAIN_HOST": "127.0.0.1", "JOBGEN_K8S_JOB": job_id})
        argv = [relocate(a, moves) for a in container["command"] + container["args"]]
        out.append((argv, env))
    return out
