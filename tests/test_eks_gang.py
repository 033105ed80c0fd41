"""EKS gang restarts and pod resources, under JobSet (the one form).

The manifest against the platform files (what a pod asks for, declared once in
env/platforms/*.yaml) and against the CRD of a pinned JobSet release (tests/k8s/); the engine's
decisions read off that manifest (jobgen/backends/eks/engine.py emulates JobSet and the Job
controller); the real env/containers/eks-entrypoint.sh run as the pods, each with the restart
attempt JobSet labels it with: a pod deleted before it ever ran, and the next attempt meets on
one number; a drain of ONE pod, and every pod restarts and resumes from one step, uncounted."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen import api
from jobgen.backends.eks import engine, rehearsal
from jobgen.backends.eks import jobset as jobsets
from jobgen.backends.eks import manifests as eks
from jobgen.images import snapshot
from jobgen.inputs.platforms import PLATFORMS
from jobgen.plumbing.errors import ConfigError

# --- the manifest against the platform files ----------------------------------------------------


ROOT = Path(__file__).resolve().parents[1]


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a JobSet (its child Job's) or of an Indexed Job."""
    if doc["kind"] == "JobSet":
        doc = jobsets.child_job(doc)
    return doc["spec"]["template"]["spec"]


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod's container env: each value, or its downward-API field."""
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in pod["containers"][0]["env"]}


@pytest.mark.parametrize("name", ["neox20b", "bert1.5b", "llama2-7b"])
def test_pod_resources_follow_the_platform_file(name: str) -> None:
    pytest.importorskip("kubernetes_validate")
    s = api.job_spec(name, 4, site="sagemaker", backend="eks")
    docs = eks.manifests(s)
    eks.validate(docs, "test")
    pod = _pod(docs[0])
    (container,) = pod["containers"]
    declared = PLATFORMS[s.platform.name].pod
    resources = container["resources"]
    assert resources["requests"].get("cpu") == declared.cpu
    assert resources["requests"].get("memory") == declared.memory
    # Huge pages: requests and limits equal (Kubernetes refuses anything else).
    assert resources["limits"].get("hugepages-2Mi") == declared.hugepages_2mi
    assert resources["requests"].get("hugepages-2Mi") == declared.hugepages_2mi
    assert pod.get("hostIPC", False) is declared.host_ipc
    env = _env(pod)
    for key, value in declared.env:
        assert env[key] == value
    if s.platform.accelerator == "hpu":
        assert (declared.memory, declared.hugepages_2mi, declared.host_ipc) == (
            "690Gi", "42000Mi", True)
    if s.platform.accelerator == "neuron":
        assert env["CCOM_SOCKET_IFNAME"] == "eth0" and declared.cpu and declared.memory


# --- the JobSet form: the manifest, against the pinned CRD ---------------------------------------

CRD = ROOT / "tests" / "k8s" / f"jobset-crd-{jobsets.RELEASE}.yaml"


def _strict(schema: Any) -> Any:
    """The CRD's structural schema as the API server applies it, with unknown fields refused
    (the server prunes them silently: a misspelt field would be lost without a word)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_errors(doc: dict[str, Any]) -> list[str]:
    import jsonschema
    crd = yaml.safe_load(CRD.read_text())
    assert crd["spec"]["group"] == jobsets.GROUP
    (version,) = crd["spec"]["versions"]
    assert version["name"] == jobsets.VERSION
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


@pytest.mark.parametrize(("name", "nodes"), [("llama2-7b", 4), ("neox20b", 128),
                                             ("bert1.5b", 2)])
def test_the_jobset_validates_against_the_crd_of_a_pinned_release(name: str,
                                                                  nodes: int) -> None:
    s = api.job_spec(name, nodes, site="sagemaker", backend="eks")
    (doc,) = eks.manifests(s)
    assert doc["apiVersion"] == jobsets.API_VERSION
    assert _crd_errors(doc) == []
    # The check has teeth: a misspelt field, a wrong type, an action JobSet does not know.
    for path, value in ((("spec", "failurePolicy", "maxRestart"), 3),
                        (("spec", "failurePolicy", "maxRestarts"), "three"),
                        (("spec", "failurePolicy", "rules", 0, "action"), "RestartGang")):
        bad = json.loads(json.dumps(doc))
        where = bad
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        assert _crd_errors(bad), path
    # Names JobSet's webhook accepts: its pods' names (NAME-node-0-K-xxxxx) within 63
    # characters, and an RFC 1035 label (a letter first).
    js = doc["metadata"]["name"]
    assert len(f"{js}-{jobsets.REPLICATED_JOB}-0-{nodes - 1}-abcde") <= 63 and js[0].isalpha()
    assert jobsets.name("7b-" + "x" * 80)[0].isalpha()


def test_every_pod_takes_its_attempt_from_jobset_and_render_bounds_disruptions(
        jobgen_proc: Any, tmp_path: Path) -> None:
    s = api.job_spec("llama2-7b", 4, site="sagemaker", backend="eks")
    proc = jobgen_proc("render", "llama2-7b", "--backend", "eks", "--site", "sagemaker",
                       "--nodes", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (doc,) = yaml.safe_load_all(proc.stdout)
    # One line at render: disruptions are uncounted, and bounded by their own limit.
    (said,) = [line for line in proc.stderr.splitlines() if "eks.max_disruptions" in line]
    assert s.site.eks is not None
    limit = s.recipe.job.max_restarts + s.site.eks.max_disruptions
    assert "memory- or disk-pressure evictions" in said, said
    assert f"restart attempt {limit + 1} ends the job (78)" in said, said
    name = doc["metadata"]["name"]
    spec = doc["spec"]
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["failurePolicy"]["maxRestarts"] == s.recipe.job.max_restarts
    (rjob,) = spec["replicatedJobs"]
    assert rjob["replicas"] == 1
    job = rjob["template"]["spec"]
    assert (job["completionMode"], job["completions"], job["parallelism"],
            job["backoffLimit"]) == ("Indexed", 4, 4, 0)
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and "subdomain" not in pod   # JobSet sets it
    env = _env(pod)
    # Pod 0's host name under JobSet's headless Service (named after the JobSet).
    assert env["JOBGEN_MAIN_HOST"] == f"{name}-node-0-0.{name}"
    # The attempt from the engine's own label, through the downward API; the bound beside it.
    assert env["JOBGEN_RESTART_ATTEMPT"] == {"fieldRef": {
        "fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}
    assert env["JOBGEN_RESTART_LIMIT"] == str(limit)
    assert not [k for k in env if k.startswith("JOBGEN_GANG_")]


@pytest.mark.parametrize("setting", [{"eks.gang": "pytorchjob"}, {"eks.gang": "indexed-job"},
                                     {"eks.training_operator": True}])
def test_any_other_gang_form_is_refused_in_one_line_that_installs_jobset(
        jobgen_proc: Any, write_site: Any, tmp_path: Path, setting: dict[str, Any]) -> None:
    site = write_site("sagemaker", setting)
    proc = jobgen_proc("render", "llama2-7b", "--backend", "eks", "--site", str(site),
                       "--nodes", "4", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    (line,) = proc.stderr.splitlines()
    key = next(iter(setting))
    assert line.startswith(f"error: {site}: {key}: "), line
    assert "JobSets only" in line and "kubectl apply --server-side -f https://github.com/" \
        f"kubernetes-sigs/jobset/releases/download/{jobsets.RELEASE}/manifests.yaml" in line, line


# --- the engine's decisions, read off the rendered JobSet ----------------------------------------

def _decide(doc: dict[str, Any], exit_code: int, conditions: tuple[str, ...] = ()
            ) -> tuple[str, str]:
    """(what the Job controller makes of one failed pod, JobSet's action on it)."""
    job = doc["spec"]["replicatedJobs"][0]["template"]["spec"]
    action, message = engine.pod_failure(job["podFailurePolicy"],
                                         engine.Ended(1, exit_code, conditions),
                                         "trainer", "training/x-node-0-1-abcde")
    if action == "FailJob":
        reason = "PodFailurePolicy"
    else:
        assert action == "Count" and job["backoffLimit"] == 0
        reason, message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    return reason, engine.jobset_rule(doc["spec"]["failurePolicy"], reason, message)[0]


def test_the_engine_restarts_a_drain_uncounted_and_fails_at_once_on_78_and_75() -> None:
    (doc,) = eks.manifests(api.job_spec("neox20b", 4, site="sagemaker", backend="eks"))
    # A drained pod saves and stops with 143; its DisruptionTarget condition decides.
    assert _decide(doc, 143, ("DisruptionTarget",)) == (
        "PodFailurePolicy", "RestartJobSetAndIgnoreMaxRestarts")
    assert _decide(doc, 75, ("DisruptionTarget",))[1] == "RestartJobSetAndIgnoreMaxRestarts"
    assert _decide(doc, 78) == ("PodFailurePolicy", "FailJobSet")
    assert _decide(doc, 75) == ("PodFailurePolicy", "FailJobSet")
    assert _decide(doc, 1) == ("BackoffLimitExceeded", "RestartJobSet")     # counted
    assert _decide(doc, 143) == ("BackoffLimitExceeded", "RestartJobSet")   # a plain SIGTERM
    assert engine.jobset_rule(doc["spec"]["failurePolicy"], "DeadlineExceeded",
                              "Job was active longer than specified deadline")[0] == "FailJobSet"
    # Read off the manifest, not known beforehand: without the child's disruption rule a drain
    # is an ordinary, counted failure.
    changed = json.loads(json.dumps(doc))
    del changed["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0]
    assert _decide(changed, 143, ("DisruptionTarget",)) == (
        "BackoffLimitExceeded", "RestartJobSet")


# A stand-in pod: what attempt A of pod K does, from POD_PLAN ("A:K=BEHAVIOUR" items):
# "exit N" ends with N; "stubborn" ignores SIGTERM; anything else runs until SIGTERM (143).
STAND_IN_POD = r"""
trap 'echo "pod $POD got SIGTERM"; [ "$DO" = stubborn ] || exit 143' TERM
DO=run
for item in $POD_PLAN; do [ "${item%%=*}" = "$ATTEMPT:$POD" ] && DO=${item#*=}; done
case $DO in exit*) sleep 0.3; exit "${DO#exit}" ;; esac
while :; do sleep 0.1; done
"""


def _engine(plan: str, doc: dict[str, Any], grace_s: float = 5.0,
            pending: tuple[str, ...] = ()) -> engine.JobSet:
    """The engine on stand-in pods, attempt A from JobSet's label (A = label + 1); the pods
    named "A:K" in `pending` are left Pending (not scheduled)."""
    def start(index: int, labels: dict[str, str]) -> subprocess.Popen | None:
        attempt = int(labels[jobsets.RESTART_ATTEMPT]) + 1
        if f"{attempt}:{index}" in pending:
            return None
        return subprocess.Popen(["bash", "-c", STAND_IN_POD], start_new_session=True, env={
            **os.environ, "POD": str(index), "ATTEMPT": str(attempt), "POD_PLAN": plan})
    return engine.JobSet(doc, start, say=lambda line: None, grace_s=grace_s)


def test_the_engine_deletes_every_pod_on_a_drain_and_counts_what_the_rules_count() -> None:
    """The emulated engine on stand-in pods, its decisions read off the rendered JobSet (4 pods,
    max_restarts 1): a drain of pod 1 gets every other pod SIGTERM and its grace period (the
    child Job deleted), then every pod starts again, and the drain is not counted; a pod that
    ignores SIGTERM is killed after the grace period; ordinary failures count until
    maxRestarts; 78 fails the JobSet at once."""
    s = api.job_spec("neox20b", 4, site="sagemaker", backend="eks",
                     overrides=["job.max_restarts=1"])
    (doc,) = eks.manifests(s)
    assert doc["spec"]["failurePolicy"]["maxRestarts"] == 1
    # Attempt 1 runs until pod 1 is drained (pod 2 ignores SIGTERM); attempt 2 finishes.
    drain = _engine("1:2=stubborn 2:0=exit0 2:1=exit0 2:2=exit0 2:3=exit0", doc, grace_s=1.0)
    began = time.monotonic()
    outcome = drain.run(during=lambda e: e.restarts == 0 and time.monotonic() - began > 1 and
                        "DisruptionTarget" not in e.conditions[1] and e.disrupt(1),
                        timeout_s=60)
    assert outcome == "Completed", drain.history
    assert (drain.restarts, drain.counted) == (1, 0)
    assert drain.signals == ["pod 1: SIGTERM (evicted)"] + [
        f"pod {i}: SIGTERM (its child Job deleted)" for i in (0, 2, 3)]
    # Ordinary failures: counted, the second beyond maxRestarts 1.
    failing = _engine("1:0=exit1 2:2=exit1", doc)
    assert failing.run(timeout_s=60) == "Failed: ReachedMaxRestarts"
    assert (failing.restarts, failing.counted) == (1, 1)
    assert [h.split(" -> ")[1] for h in failing.history] == ["rule failure: RestartJobSet"] * 2
    # A configuration error: no restart at all.
    config = _engine("1:1=exit78", doc)
    assert config.run(timeout_s=60) == "Failed: FailJobSetAction (PodFailurePolicy)"
    assert config.restarts == 0 and "exit code 78 matching FailJob rule at index 1" in \
        config.history[0]


def test_a_pending_pod_deleted_fails_the_child_job_and_every_pod_comes_back_labelled_alike(
        ) -> None:
    """A plain deletion of a pod that never ran (Pending: its node not yet there) fails the
    child Job (counted: no disruption condition); the restart deletes the running peers, and
    every pod of the new child Job carries the same restart attempt."""
    (doc,) = eks.manifests(api.job_spec("neox20b", 2, site="sagemaker", backend="eks"))
    gang = _engine("2:0=exit0 2:1=exit0", doc, grace_s=1.0, pending=("1:1",))
    seen: list[dict[int, str]] = []
    stand_in = gang.start

    def start(index: int, labels: dict[str, str]) -> subprocess.Popen | None:
        seen.append({index: labels[jobsets.RESTART_ATTEMPT]})
        return stand_in(index, labels)

    def delete_the_pending_pod(e: engine.JobSet) -> None:
        if e.restarts == 0 and 1 in e.pending:
            e.delete(1)

    gang.start = start
    outcome = gang.run(during=delete_the_pending_pod, timeout_s=60)
    assert outcome == "Completed", gang.history
    assert (gang.restarts, gang.counted) == (1, 1)
    assert seen == [{0: "0"}, {1: "0"}, {0: "1"}, {1: "1"}]
    assert gang.signals == ["pod 0: SIGTERM (its child Job deleted)"]
    (why,) = gang.history
    assert why.startswith("BackoffLimitExceeded") and why.endswith("RestartJobSet")


def test_a_platform_pod_that_does_not_fit_is_one_line(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from jobgen.inputs import platforms
    from jobgen.plumbing import resources
    # The shipped file, changed one key at a time.
    text = (resources.folder("platforms") / "dl1.24xlarge.yaml").read_text()
    monkeypatch.setenv("JOBGEN_PLATFORMS", str(tmp_path))
    for bad, why in (("memory: 690Gi", "memory: 790Gi"), ("hugepages_2mi: 42000Mi",
                                                          "hugepages_2mi: 42000MB")):
        (tmp_path / "dl1.24xlarge.yaml").write_text(text.replace(bad, why))
        with pytest.raises(ConfigError) as caught:
            platforms._Platforms()["dl1.24xlarge"]
        message = str(caught.value)
        assert "\n" not in message and str(tmp_path / "dl1.24xlarge.yaml") in message
        assert "pod." in message


# --- the real entrypoint as JobSet's pods ------------------------------------------------------

FAKE = """#!/usr/bin/env bash
# A stand-in launcher: compile passes succeed and say so, as payload/common/node_launch.sh does,
# for the nodes that wait for each other; training passes succeed.
case $1 in
  compile) echo 0 >"$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/compile.status"; exit 0 ;;
  *) exit 0 ;;
esac
"""


def _pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: str = "neox20b",
          nodes: int = 2) -> Any:
    """The smoke spec on this machine's site (eks.gang: jobset), its payload snapshot placed
    where the rehearsal's image holds it."""
    monkeypatch.chdir(tmp_path)
    s = api.job_spec(recipe, nodes, site=None, backend="eks", smoke=True, run_name="gang")
    snapshot.place(str(tmp_path / ".jobgen-rehearsal" / "payload"), s.payload_digest)
    return s


def _pod_command(s: Any, index: int, labels: dict[str, str]
                 ) -> tuple[list[str], dict[str, str]]:
    """Pod `index` as the kubelet starts it: its command and env, the downward API read off
    the labels JobSet gave it (jobgen/backends/eks/rehearsal.py)."""
    root = Path.cwd() / ".jobgen-rehearsal" / "gang-job"
    return rehearsal.commands(s, "gang-job", root, labels=labels)[index]


def _start(argv: list[str], env: dict[str, str], extra: dict[str, str], out: Path
           ) -> subprocess.Popen:
    full = {**os.environ, **env, **extra}
    full["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), full.get("PATH", "")])
    with open(out, "ab") as handle:
        return subprocess.Popen(argv, env=full, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _pod_processes(pid: int) -> list[int]:
    """A pod's processes: its entrypoint and every descendant (each pass runs in a session of
    its own, which a signal to the entrypoint's process group would miss)."""
    table = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True,
                           check=True).stdout.split()
    children: dict[int, list[int]] = {}
    for child, parent in zip(table[::2], table[1::2]):
        children.setdefault(int(parent), []).append(int(child))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _signal_pod(proc: subprocess.Popen, signum: int) -> None:
    """What the container runtime does to a whole container (SIGKILL)."""
    for pid in _pod_processes(proc.pid):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _show(pod_logs: list[str], logs: Path) -> None:
    """What a failed gang test needs to be explained: each pod's whole log and every file of
    its attempts (pytest cuts a long assertion message short)."""
    for i, text in enumerate(pod_logs):
        print(f"----- pod {i} -----\n{text}")
    for path in sorted(logs.rglob("*")):
        if path.is_file() and path.stat().st_size < 4096:
            print(f"----- {path.relative_to(logs)} -----\n{path.read_text(errors='replace')}")


def test_a_pod_started_next_keeps_reading_the_entrypoint_it_started_with(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pod's command lays the emulated image out again (its entrypoints are copied every
    time). Bash reads a script as it runs it, so a copy written through the file a running pod
    reads cut it short: the pod saw an empty rest and exited 0, unseen (the flaky restarts of
    this file's rehearsals). The copy is renamed over the old file instead."""
    s = _pods(tmp_path, monkeypatch)
    root = Path.cwd() / ".jobgen-rehearsal" / "gang-job"
    argv, _ = rehearsal.commands(s, "gang-job", root)[0]
    entrypoint = Path(argv[1])
    before = entrypoint.read_bytes()
    with open(entrypoint, "rb") as running:   # what pod 0's bash holds
        rehearsal.commands(s, "gang-job", root)   # pod 1 started next
        assert running.read() == before
        assert os.fstat(running.fileno()).st_ino != entrypoint.stat().st_ino
    assert entrypoint.read_bytes() == before


def test_a_pod_deleted_before_it_ran_and_the_next_attempt_meets_on_one_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 1: pod 0 runs and reports to the health gate, pod 1 stays Pending and is deleted
    before it ever ran. JobSet restarts the child Job: pod 0 is deleted too, and both pods of
    the next attempt carry restart attempt 1. Each takes its attempt from that label, so both
    log to attempt-2 and the gate meets there on this attempt's reports only (a pod counting its
    own folders would have put pod 1 in attempt-1, on pod 0's stale report, and pod 0 in
    attempt-2, waiting out the gate for pod 1). The real entrypoint and health gate; a
    stand-in launcher."""
    s = _pods(tmp_path, monkeypatch)
    (doc,) = eks.manifests(s)
    fake = tmp_path / "fake-launch.sh"
    fake.write_text(FAKE)
    logs = Path(s.run_dir, "logs", "gang-job")
    # The gate's wait for the peers' reports: short, so that a gate that waits for a pod in
    # another attempt fails this test instead of stalling it.
    extra = {"JOBGEN_RDZV_TIMEOUT": "60"}

    def start(index: int, labels: dict[str, str]) -> subprocess.Popen | None:
        if labels[jobsets.RESTART_ATTEMPT] == "0" and index == 1:
            return None   # Pending: its node is not there yet
        argv, env = _pod_command(s, index, labels)
        argv = [argv[0], argv[1], str(fake), *argv[3:]]
        return _start(argv, env, extra, tmp_path / f"pod-{index}.log")

    def delete_the_pending_pod(e: engine.JobSet) -> None:
        if e.restarts == 0 and 1 in e.pending and \
                (logs / "attempt-1" / "node-0" / "health.json").is_file():
            e.delete(1)

    jobset = engine.JobSet(doc, start, say=print, grace_s=5.0)
    began = time.monotonic()
    try:
        outcome = jobset.run(during=delete_the_pending_pod, timeout_s=120)
    finally:
        for proc in jobset.pods.values():
            _signal_pod(proc, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - began
    print(f"ended {outcome!r} after {took:.1f} s")
    pod_logs = [(tmp_path / f"pod-{i}.log").read_text() for i in (0, 1)]
    if outcome != "Completed" or (jobset.restarts, jobset.counted) != (1, 1):
        _show(pod_logs, logs)
    assert outcome == "Completed", jobset.history
    assert (jobset.restarts, jobset.counted) == (1, 1), jobset.history
    # Pod 1 never ran in attempt 1: its only attempt is the second, where pod 0 met it.
    assert "attempt 1 (restart attempt 0)" in pod_logs[0]
    assert "attempt 2 (restart attempt 1)" in pod_logs[0] and \
        "attempt 2 (restart attempt 1)" in pod_logs[1], pod_logs
    assert not (logs / "attempt-1" / "node-1").exists()
    reports = [json.loads((logs / "attempt-2" / f"node-{i}" / "health.json").read_text())
               for i in (0, 1)]
    assert [(r["node"], r["ok"], r["attempt"]) for r in reports] == [(0, True, "2"),
                                                                      (1, True, "2")]
    assert "did not report" not in pod_logs[0] + pod_logs[1]
    assert took < 90, took   # no gate waited out its 60 s for a pod of another attempt


def test_a_pod_past_the_restart_bound_ends_the_job_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Restart attempt job.max_restarts + eks.max_disruptions + 1 (drains and the kubelet's
    pressure evictions restart uncounted): the pod exits 78 before its gate, which JobSet's
    rule fails the job on."""
    s = _pods(tmp_path, monkeypatch)
    (doc,) = eks.manifests(s)
    assert s.site.eks is not None
    limit = s.recipe.job.max_restarts + s.site.eks.max_disruptions
    labels = engine.JobSet(doc, lambda i, labels: None).labels()
    for attempt, status in ((limit, None), (limit + 1, 78)):
        labels[jobsets.RESTART_ATTEMPT] = str(attempt)
        argv, env = _pod_command(s, 0, labels)
        if status is None:   # within the bound: the flow starts (stopped here at its usage)
            argv = argv[:3]
        proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=60)
        if status is None:
            assert "past the job's" not in proc.stderr, proc.stderr
            continue
        assert proc.returncode == status, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert f"restart attempt {attempt} is past the job's {limit}" in line, line
    assert engine.jobset_rule(doc["spec"]["failurePolicy"], "PodFailurePolicy",
                              "Container trainer for pod x failed with exit code 78 matching "
                              "FailJob rule at index 1")[0] == "FailJobSet"


# --- a drain of one pod under JobSet's engine (emulated), with the real pods --------------------

@pytest.mark.slow
def test_a_drain_of_one_pod_restarts_every_pod_from_one_step_uncounted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain as Kubernetes does it: ONE pod gets the DisruptionTarget condition and SIGTERM
    (SIGKILL after its grace period); its peers get nothing from Kubernetes. The pods are the
    real entrypoint and CPU trainer under torchrun; what happens next is the emulated engine's
    reading of the rendered JobSet: the drained pod's failure fails the child Job through its pod
    failure policy, JobSet restarts every pod without counting it, and the new gang resumes from
    the newest step every node holds and finishes."""
    s = _pods(tmp_path, monkeypatch)   # this machine's site: eks.gang: jobset
    (doc,) = eks.manifests(s)
    import socket
    with socket.socket() as sock:   # the machine may run other rehearsals on the recipe's port
        sock.bind(("127.0.0.1", 0))
        extra = {"MASTER_PORT": str(sock.getsockname()[1]), "JOBGEN_COMPILE_MODE": "never",
                 "JOBGEN_SMOKE_STEP_DELAY": "0.3"}
    checkpoints = Path(s.run_dir, "train", "checkpoints")
    attempts = [0, 0]

    def start(index: int, labels: dict[str, str]) -> subprocess.Popen:
        attempts[index] += 1
        argv, env = _pod_command(s, index, labels)
        return _start(argv, env, extra, tmp_path / f"pod-{index}.log")

    drained: list[int] = []

    def drain(engine_: engine.JobSet) -> None:
        if not drained and list(checkpoints.glob("step_*/COMPLETE")):
            drained.append(max(int(p.parent.name.split("_")[1])
                               for p in checkpoints.glob("step_*/COMPLETE")))
            engine_.disrupt(1)

    # A short grace after the rehearsal's own deadline, so that a rehearsal that does not end
    # fails with its pods' logs below instead of at pytest's timeout (idle: about 45 s).
    jobset = engine.JobSet(doc, start, say=lambda line: print(line), grace_s=20.0)
    began = time.monotonic()
    try:
        outcome = jobset.run(during=drain, timeout_s=420)
    finally:
        for proc in jobset.pods.values():
            _signal_pod(proc, signal.SIGKILL)
            proc.wait()
    print(f"drained at step {drained}, ended {outcome!r} after {time.monotonic() - began:.0f} s")
    logs = [(tmp_path / f"pod-{i}.log").read_text() for i in (0, 1)]
    if outcome != "Completed":
        _show(logs, Path(s.run_dir, "logs", "gang-job"))
    assert outcome == "Completed", jobset.history
    # One restart of every pod, not counted against job.max_restarts.
    assert (jobset.restarts, jobset.counted, attempts) == (1, 0, [2, 2]), jobset.history
    (why,) = jobset.history
    assert why.startswith("PodFailurePolicy: Pod ") and "has condition DisruptionTarget" in why
    assert why.endswith("-> rule disruption: RestartJobSetAndIgnoreMaxRestarts")
    # Kubernetes signalled the drained pod alone; the peer got SIGTERM only from the restart.
    assert jobset.signals[0] == "pod 1: SIGTERM (evicted)", jobset.signals
    assert "pod 0: SIGTERM (evicted)" not in jobset.signals
    # Each pod's log holds its two attempts, one after the other.
    first, second = zip(*(log.split(" logs in ", 2)[1:] for log in logs))
    assert "training pass saved and stopped on SIGTERM" in first[1]
    assert "training pass finished" not in first[0] + first[1]   # nothing done early
    assert all("training pass finished" in text for text in second), second[0][-2000:]
    # Every node resumed from one step, the newest every node holds: the one the trainers
    # agreed to save when the drained pod asked them to stop.
    events = [json.loads(line[line.index("{"):]) for line in logs[0].splitlines()
              if '{"event"' in line]
    (stopped,) = [e["step"] for e in events if e["event"] == "stopped"]
    (resumed,) = [e["step"] for e in events if e["event"] == "resume"]
    assert drained and resumed == stopped >= drained[0], (drained, stopped, resumed)
    assert [e["step"] for e in events if e["event"] == "done"] == [24]
    # Each attempt in the folder its restart-attempt label names.
    assert sorted(p.name for p in Path(s.run_dir, "logs", "gang-job").iterdir()) == [
        "attempt-1", "attempt-2"]
