"""JobSet's engine, emulated for the EKS rehearsal: what Kubernetes' Job controller and JobSet's
controller decide when a pod of a rendered JobSet ends, read off the manifest itself (the child
Job's backoffLimit and podFailurePolicy, the JobSet's failurePolicy), with the pods run as
processes here (rehearsal.py gives each pod's command and environment). Its rules follow the
upstream controllers, as docs/eks.md cites them; change them only against those sources.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import time
from typing import Any, Callable, Optional

from ..local.runner import _tree
from . import jobset as jobsets


@dataclasses.dataclass
class Ended:
    """A pod that ended: its index, its container's exit code (None: it never ran) and its
    conditions."""
    index: int
    exit_code: Optional[int]
    conditions: tuple[str, ...] = ()


def pod_failure(policy: Optional[dict[str, Any]], pod: Ended, container: str,
                pod_name: str) -> tuple[str, str]:
    """(action, message) of a failed pod under a podFailurePolicy: FailJob, Ignore or Count."""
    for index, rule in enumerate((policy or {}).get("rules") or []):
        what = ""
        codes = rule.get("onExitCodes")
        if codes is not None:
            named = codes.get("containerName")
            if pod.exit_code not in (0, None) and (named is None or named == container) and \
                    (pod.exit_code in codes["values"]) == (codes["operator"] == "In"):
                what = (f"Container {container} for pod {pod_name} failed with exit code "
                        f"{pod.exit_code}")
        else:
            for pattern in rule.get("onPodConditions") or []:
                if pattern.get("status", "True") == "True" and pattern["type"] in pod.conditions:
                    what = f"Pod {pod_name} has condition {pattern['type']}"
                    break
        if what:
            action = rule["action"]
            return action, f"{what} matching {action} rule at index {index}"
    return "Count", ""


def jobset_rule(policy: dict[str, Any], reason: str, message: str) -> tuple[str, str]:
    """(action, rule name) of JobSet's failure policy for a child Job's failure."""
    for rule in policy.get("rules") or []:
        reasons = rule.get("onJobFailureReasons") or []
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if (not reasons or reason in reasons) and \
                (not patterns or any(re.search(p, message) for p in patterns)):
            return rule["action"], rule.get("name", "")
    return "RestartJobSet", "(default)"


Start = Callable[[int, dict[str, str]], Optional[subprocess.Popen]]


class JobSet:
    """One rendered JobSet run by the emulated engine: `start(index, labels)` starts pod `index`
    of a new attempt with the labels JobSet gives it (a process in a session of its own) and
    returns it, or None for a pod left Pending (not scheduled)."""

    def __init__(self, doc: dict[str, Any], start: Start,
                 say: Callable[[str], None] = print, grace_s: Optional[float] = None) -> None:
        assert doc["kind"] == "JobSet" and len(doc["spec"]["replicatedJobs"]) == 1
        self.doc, self.start, self.say = doc, start, say
        rjob = doc["spec"]["replicatedJobs"][0]
        self.job = rjob["template"]["spec"]
        pod = self.job["template"]["spec"]
        self.container = pod["containers"][0]["name"]
        self.grace_s = pod.get("terminationGracePeriodSeconds", 30) if grace_s is None \
            else grace_s
        self.job_name = f"{doc['metadata']['name']}-{rjob['name']}-0"
        self.namespace = doc["metadata"].get("namespace", "default")
        self.policy = doc["spec"].get("failurePolicy") or {}
        self.restarts = 0            # status.restarts
        self.counted = 0             # status.restartsCountTowardsMax
        self.history: list[str] = []  # one line per child Job failure: reason, rule, action
        self.pods: dict[int, subprocess.Popen] = {}
        self.pending: set[int] = set()            # pods not scheduled: no process
        self.deleted: set[int] = set()            # Pending pods deleted: failed, never ran
        self.conditions: dict[int, tuple[str, ...]] = {}
        self.trees: dict[int, list[int]] = {}     # each pod's processes, last seen
        self.kill_at: dict[int, float] = {}       # deleted pods: when SIGKILL comes
        self.signals: list[str] = []              # "pod K: SIGTERM (why)", in order

    def _pod_name(self, index: int) -> str:
        return f"{self.namespace}/{self.job_name}-{index}-r{self.restarts}"

    def labels(self) -> dict[str, str]:
        """A pod's labels as JobSet's controller writes them: the template's and its attempt."""
        labels = dict((self.job["template"].get("metadata") or {}).get("labels") or {})
        labels[jobsets.RESTART_ATTEMPT] = str(self.restarts)
        return labels

    def _start(self, index: int) -> None:
        proc = self.start(index, self.labels())
        self.pods.pop(index, None)
        self.pending.discard(index)
        self.deleted.discard(index)
        if proc is None:
            self.pending.add(index)
        else:
            self.pods[index] = proc
        self.conditions[index] = ()
        self.trees[index] = []
        self.kill_at.pop(index, None)

    def _start_all(self) -> None:
        for index in range(self.job["completions"]):
            self._start(index)

    def _signal(self, index: int, why: str) -> None:
        """What deleting a pod does: SIGTERM to its PID 1, SIGKILL after the grace period."""
        if index not in self.pods:   # Pending: nothing runs
            return
        self.trees[index] = _tree(self.pods[index].pid)
        if self.pods[index].poll() is None:
            self.signals.append(f"pod {index}: SIGTERM ({why})")
            self.pods[index].send_signal(signal.SIGTERM)
            self.kill_at[index] = time.monotonic() + self.grace_s

    def _reap(self, index: int) -> None:
        """The container is gone with its PID 1: nothing of it outlives it."""
        proc = self.pods[index]
        pids = self.trees.get(index, [])
        if proc.poll() is None:
            pids = [proc.pid, *_tree(proc.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        proc.wait()

    def disrupt(self, index: int) -> None:
        """A drain of pod `index`'s node: the Eviction API marks the pod with the
        DisruptionTarget condition, then deletes it (that pod alone)."""
        self.conditions[index] = (*self.conditions[index], "DisruptionTarget")
        self.say(f"engine: evicting pod {index} (condition DisruptionTarget)")
        self._signal(index, "evicted")

    def delete(self, index: int) -> None:
        """`kubectl delete pod` of pod `index`: a running pod is terminated (no condition); a
        Pending one fails at once without having run."""
        self.say(f"engine: deleting pod {index}")
        if index in self.pending:
            self.pending.discard(index)
            self.deleted.add(index)
        else:
            self._signal(index, "deleted")

    def run(self, during: Optional[Callable[[JobSet], None]] = None,
            timeout_s: float = 600.0) -> str:
        """Run to the end: "Completed", or "Failed: REASON". `during(self)` is called every
        poll (a test's drain)."""
        deadline = time.monotonic() + timeout_s
        self._start_all()
        while True:
            outcome = self._attempt(during, deadline)
            if outcome != "restart":
                return outcome
            self._start_all()

    def _attempt(self, during: Optional[Callable[[JobSet], None]], deadline: float) -> str:
        """One child Job, until it completes or fails; its pods' ends taken in the order seen."""
        succeeded: set[int] = set()
        failed = polls = 0
        while True:
            if time.monotonic() > deadline:
                return self._job_failed("DeadlineExceeded", "the rehearsal's timeout")
            if during is not None:
                during(self)
            polls += 1
            ended: list[tuple[int, Optional[int]]] = [(i, None) for i in sorted(self.deleted)]
            self.deleted.clear()
            for i, proc in list(self.pods.items()):
                if i in succeeded:
                    continue
                if proc.poll() is None:
                    if i in self.kill_at and time.monotonic() > self.kill_at[i]:
                        self._reap(i)
                    elif polls % 5 == 0:
                        self.trees[i] = _tree(proc.pid)
                    continue
                self._reap(i)
                code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
                if code == 0:
                    succeeded.add(i)
                    continue
                ended.append((i, code))
            for i, code in ended:
                action, message = pod_failure(self.job.get("podFailurePolicy"),
                                              Ended(i, code, self.conditions[i]),
                                              self.container, self._pod_name(i))
                how = "without having run" if code is None else f"with {code}"
                self.say(f"engine: pod {i} failed {how}: {message or action}")
                if action == "FailJob":
                    return self._job_failed("PodFailurePolicy", message)
                if action == "Count":
                    failed += 1
                    if failed > self.job.get("backoffLimit", 6):
                        return self._job_failed("BackoffLimitExceeded",
                                                "Job has reached the specified backoff limit")
                self._start(i)   # Ignore, or counted within backoffLimit: a new pod
            if len(succeeded) == self.job["completions"]:
                return "Completed"
            time.sleep(0.2)

    def _job_failed(self, reason: str, message: str) -> str:
        """The child Job failed: JobSet's policy acts; a restart (or a failed JobSet) deletes the
        child Job, whose pods end as deleted pods do."""
        for i in self.pods:
            self._signal(i, "its child Job deleted")
        self.pending.clear()    # deleted with the child Job, never having run
        for i, proc in self.pods.items():
            try:
                proc.wait(timeout=max(0.1, self.kill_at.get(i, 0) - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            self._reap(i)
        action, rule = jobset_rule(self.policy, reason, message)
        self.history.append(f"{reason}: {message} -> rule {rule}: {action}")
        self.say(f"engine: child Job failed ({reason}: {message}); rule {rule}: {action}")
        if action == "FailJobSet":
            return f"Failed: FailJobSetAction ({reason})"
        if action == "RestartJobSet":
            if self.counted >= self.policy.get("maxRestarts", 0):
                return "Failed: ReachedMaxRestarts"
            self.counted += 1
        elif action != "RestartJobSetAndIgnoreMaxRestarts":
            raise ValueError(f"the emulated engine does not know action {action}")
        self.restarts += 1
        return "restart"
