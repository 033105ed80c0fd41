"""`jobgen watch` on an EKS job: its pods' logs carry the same JSON events as a run folder's node
logs. A requeue deletes the job's pods: JobSet restarts every pod (a restart counted against
job.max_restarts: a deletion is not a disruption), and they resume from the newest checkpoint on
the shared claim."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from ...watching.target import StreamReader, Target, lines_after
from ..protocol import JobRef
from . import backend as eks
from . import cluster


def target(ref: JobRef, run_dir: Optional[Path], view: Any) -> Target:
    where = run_dir or Path(ref.run.run_dir if ref.run else ".")
    return Target(Controller(ref), StreamReader(PodLogs(ref).fetch, where), run_dir_here=False)


class PodLogs:
    """Each pod's log, re-read whole (the API has no offset) and cut after the lines seen."""

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref
        self.seen: dict[str, int] = {}

    def fetch(self) -> dict[int, list[str]]:
        kubernetes = cluster.kube()
        site, api = cluster.where(self.ref)
        ns = site.eks.namespace
        core = kubernetes.client.CoreV1Api(api)
        out: dict[int, list[str]] = {}
        for pod in cluster.pods(api, ns, cluster.name_of(self.ref.job_id)):
            name = pod.metadata.name
            if pod.status.phase == "Pending":
                continue
            text = cluster.call(core.read_namespaced_pod_log, name, ns)
            lines, self.seen[name] = lines_after(text or "", self.seen.get(name, 0))
            out.setdefault(cluster.index(pod), []).extend(lines)
        return out


class Controller:
    def __init__(self, ref: JobRef) -> None:
        self.ref = ref
        self.job_id = ref.job_id

    def state(self) -> tuple[str, bool]:
        found = eks.status(self.ref)
        return found.native, found.state.ended

    def stop(self) -> str:
        return eks.cancel(self.ref)

    def requeue(self, prepare: Optional[Callable[[], str]] = None,
                exclude: Optional[str] = None) -> str:
        kubernetes = cluster.kube()
        site, api = cluster.where(self.ref)
        ns = site.eks.namespace
        core = kubernetes.client.CoreV1Api(api)
        pods = cluster.pods(api, ns, cluster.name_of(self.job_id))
        for pod in pods:
            cluster.call(core.delete_namespaced_pod, pod.metadata.name, ns)
        done = [f"deleted {len(pods)} pods of {self.job_id}; they start again and resume"]
        if prepare is not None:
            done.append(prepare())
        if exclude:
            done.append(f"{exclude} not left out (the scheduler places the new pods)")
        return "; ".join(done)
