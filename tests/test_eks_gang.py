"""EKS gang restarts and pod resources.

The manifests against the platform files (what a pod asks for, declared once in
env/platforms/*.yaml) and the restart rules. The JobSet form (eks.gang: jobset, recommended):
its manifest against the CRD of a pinned JobSet release (tests/k8s/), and the engine's decisions
read off that manifest (jobgen/backends/eks/engine.py emulates JobSet and the Job controller);
then a drain of ONE pod, as Kubernetes does it, under the emulated engine with the real
entrypoint and CPU trainer: every pod restarts and resumes from one step, the drain not counted.
The Indexed Job form without an engine (eks.gang: indexed-job): the real
env/containers/eks-entrypoint.sh run as its pods (jobgen/backends/eks/rehearsal.py gives each
pod's command and environment): one pod fails or freezes, the others stop within seconds with the
status the pod failure policy ignores, and the replaced gang resumes from the newest
checkpoint."""
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
from jobgen.backends.eks import engine
from jobgen.backends.eks import jobset as jobsets
from jobgen.backends.eks import manifests as eks
from jobgen.backends.local import runner as local_runner
from jobgen.images import snapshot
from jobgen.inputs.platforms import PLATFORMS
from jobgen.payloads import node
from jobgen.plumbing.errors import ConfigError

# --- the manifest against the platform files ----------------------------------------------------


ROOT = Path(__file__).resolve().parents[1]


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template of a JobSet (its child Job's) or of an Indexed Job."""
    if doc["kind"] == "JobSet":
        doc = jobsets.child_job(doc)
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", ["neox20b", "bert1.5b", "llama2-7b"])
def test_pod_resources_and_restart_rules_follow_the_platform_file(name: str,
                                                                  write_site: Any) -> None:
    pytest.importorskip("kubernetes_validate")
    site = str(write_site("sagemaker", {"eks.gang": "indexed-job"}))
    s = api.job_spec(name, 4, site=site, backend="eks")
    docs = eks.manifests(s)
    eks.validate(docs, "test")
    job = docs[-1]
    pod = _pod(job)
    # The JobSet's pods are the same pods.
    jobset = eks.manifests(api.job_spec(name, 4, site="sagemaker", backend="eks"))
    assert [d["kind"] for d in jobset] == ["JobSet"]
    eks.validate(jobset, "test")
    js_pod = _pod(jobset[0])
    assert js_pod["containers"][0]["resources"] == pod["containers"][0]["resources"]
    (container,) = pod["containers"]
    declared = PLATFORMS[s.platform.name].pod
    resources = container["resources"]
    assert resources["requests"].get("cpu") == declared.cpu
    assert resources["requests"].get("memory") == declared.memory
    # Huge pages: requests and limits equal (Kubernetes refuses anything else).
    assert resources["limits"].get("hugepages-2Mi") == declared.hugepages_2mi
    assert resources["requests"].get("hugepages-2Mi") == declared.hugepages_2mi
    assert pod.get("hostIPC", False) is declared.host_ipc
    env = {e["name"]: e["value"] for e in container["env"]}
    for key, value in declared.env:
        assert env[key] == value
    if s.platform.accelerator == "hpu":
        assert (declared.memory, declared.hugepages_2mi, declared.host_ipc) == (
            "690Gi", "42000Mi", True)
    if s.platform.accelerator == "neuron":
        assert env["CCOM_SOCKET_IFNAME"] == "eth0" and declared.cpu and declared.memory
    # Gang restarts: the stopped peers are not counted, the first failure is; 75 and 78 end it.
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob" and rules[0]["onExitCodes"]["values"] == [75, 78]
    assert rules[1] == {"action": "Ignore", "onExitCodes": {
        "containerName": "trainer", "operator": "In", "values": [eks.GANG_EXIT]}}
    assert job["spec"]["backoffLimit"] == s.recipe.job.max_restarts
    assert env["JOBGEN_GANG_EXIT"] == str(eks.GANG_EXIT)
    assert int(env["JOBGEN_GANG_STALE_S"]) > int(env["JOBGEN_GANG_BEAT_S"]) > 0


def test_without_a_shared_claim_there_is_no_gang_and_render_says_so(
        write_site: Any, capsys: pytest.CaptureFixture[str]) -> None:
    site = write_site("sagemaker", {"eks.gang": "indexed-job"}, delete=["eks.shared_pvc"])
    s = api.job_spec("neox20b", 4, site=str(site), backend="eks")
    node._SAID.clear()   # notes are said once per process
    job = eks.manifests(s)[-1]
    assert "eks.shared_pvc is not set" in capsys.readouterr().err
    env = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "JOBGEN_GANG_EXIT" not in env
    assert all(r.get("onExitCodes", {}).get("values") != [eks.GANG_EXIT]
               for r in job["spec"]["podFailurePolicy"]["rules"])
    # Each restart can cost every pod's failure when the peers find out by their own timeouts.
    assert job["spec"]["backoffLimit"] == 4 * s.recipe.job.max_restarts


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


def test_jobset_restarts_the_gang_and_the_heartbeats_go_away(
        capsys: pytest.CaptureFixture[str]) -> None:
    s = api.job_spec("llama2-7b", 4, site="sagemaker", backend="eks")
    node._SAID.clear()
    (doc,) = eks.manifests(s)
    err = capsys.readouterr().err
    assert "eks.gang is" not in err, err   # nothing to say: the engine does it all
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
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    # Pod 0's host name under JobSet's headless Service (named after the JobSet).
    assert env["JOBGEN_MAIN_HOST"] == f"{name}-node-0-0.{name}"
    assert not [k for k in env if k.startswith("JOBGEN_GANG_")]


@pytest.mark.parametrize(("form", "says"), [
    ("indexed-job", "a drain signals only the evicted pod"),
    ("pytorchjob", "recreates only the evicted pod")])
def test_without_jobset_render_says_in_one_line_what_the_setup_cannot_do(
        jobgen_proc: Any, write_site: Any, tmp_path: Path, form: str, says: str) -> None:
    site = write_site("sagemaker", {"eks.gang": form})
    proc = jobgen_proc("render", "llama2-7b", "--backend", "eks", "--site", str(site),
                       "--nodes", "4", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "eks.gang is" in line]
    assert len(lines) == 1 and says in lines[0] and "eks.gang: jobset" in lines[0], proc.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(proc.stdout)]
    assert kinds == (["PyTorchJob"] if form == "pytorchjob" else ["Service", "Job"])


def test_a_site_that_says_two_things_is_one_line(write_site: Any) -> None:
    from jobgen.inputs import site as sites
    path = write_site("sagemaker", {"eks.gang": "jobset", "eks.training_operator": True})
    with pytest.raises(ConfigError, match="eks.training_operator: true contradicts eks.gang: "
                                          "jobset") as caught:
        sites.load(str(path))
    assert "\n" not in str(caught.value)


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


def _engine(plan: str, doc: dict[str, Any], grace_s: float = 5.0) -> engine.JobSet:
    attempts: dict[int, int] = {}

    def start(index: int) -> subprocess.Popen:
        attempts[index] = attempts.get(index, 0) + 1
        return subprocess.Popen(["bash", "-c", STAND_IN_POD], start_new_session=True, env={
            **os.environ, "POD": str(index), "ATTEMPT": str(attempts[index]),
            "POD_PLAN": plan})
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


# --- the entrypoint as the pods of an Indexed Job -------------------------------------------------

FAKE = """#!/usr/bin/env bash
# A stand-in launcher: each pod's behaviour from FAKE_TRAIN (compile passes succeed and say
# so, as payload/common/node_launch.sh does, for the nodes that wait for each other).
case $1:${FAKE_TRAIN:-ok} in
  compile:*) echo 0 >"$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/compile.status"; exit 0 ;;
  train:hang) exec sleep 300 ;;   # a trainer that waits in a collective for a dead peer
  # A trainer that saves and stops on the stop request, as jobgen's do (the flow ignores that
  # signal, and a bash started with it ignored cannot trap it: Python can).
  train:stoppable) exec python3 -c 'import signal, sys, time
signal.signal(getattr(signal, "SIG" + sys.argv[1]), lambda *_: sys.exit(0))
time.sleep(300)' "$JOBGEN_STOP_SIGNAL" ;;
  train:fail) sleep 1; exit 3 ;;
  *) exit 0 ;;
esac
"""


@pytest.fixture
def indexed(write_site: Any) -> str:
    """This machine's site with neither JobSet nor Kubeflow: jobgen's own gang restarts."""
    return str(write_site("local", {"eks.gang": "indexed-job"}))


def _pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, site: str | None = None,
          recipe: str = "neox20b", nodes: int = 2
          ) -> tuple[Any, list[tuple[list[str], dict[str, str]]]]:
    monkeypatch.chdir(tmp_path)
    s = api.job_spec(recipe, nodes, site=site, backend="eks", smoke=True, run_name="gang")
    snapshot.place(str(tmp_path / ".jobgen-rehearsal" / "payload"), s.payload_digest)
    return s, local_runner.commands(s, "gang-job")


def _start(argv: list[str], env: dict[str, str], extra: dict[str, str], out: Path
           ) -> subprocess.Popen:
    full = {**os.environ, **env, **extra}
    full["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), full.get("PATH", "")])
    with open(out, "ab") as handle:
        return subprocess.Popen(argv, env=full, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _gang(pods: list[tuple[list[str], dict[str, str]]], extra: list[dict[str, str]],
          tmp_path: Path, launcher: str | None = None) -> list[subprocess.Popen]:
    procs = []
    for index, (argv, env) in enumerate(pods):
        if launcher:
            argv = [argv[0], argv[1], launcher, *argv[3:]]
        procs.append(_start(argv, env, extra[index], tmp_path / f"pod-{index}.log"))
    return procs


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
    """What the container runtime does to a whole container (SIGKILL), or a frozen node."""
    for pid in _pod_processes(proc.pid):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _end(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        _signal_pod(proc, signal.SIGKILL)
        proc.wait()


def test_one_failed_pod_stops_the_gang_and_is_the_one_counted_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indexed: str) -> None:
    s, pods = _pods(tmp_path, monkeypatch, indexed, nodes=4)
    fake = tmp_path / "fake-launch.sh"
    fake.write_text(FAKE)
    procs = _gang(pods, [{"FAKE_TRAIN": "fail" if i == 1 else "hang"} for i in range(4)],
                  tmp_path, str(fake))
    try:
        failed = procs[1].wait(timeout=60)
        ended = time.monotonic()
        # Without the gang the others would wait out their trainers (300 s here, the Neuron
        # runtime's 4,000 s on trn1); the test's bound is generous, the pods' own is 2 s.
        stopped = [p.wait(timeout=60) for p in (procs[0], procs[2], procs[3])]
        print(f"the gang stopped {time.monotonic() - ended:.1f} s after pod 1 failed")
    finally:
        _end(procs)
    assert failed == 3                       # the job's one counted failure keeps its status
    assert stopped == [eks.GANG_EXIT] * 3    # ignored by the pod failure policy
    for index in (0, 2, 3):
        log = (tmp_path / f"pod-{index}.log").read_text()
        assert "stopping this pod so that the whole gang restarts: node 1 failed (status 3" \
            in log, log[-2000:]
    gang = Path(s.run_dir, "logs", "gang-job", "attempt-1", "gang")
    assert (gang / "first-failure").is_dir() and (gang / "node-1.failed").is_file()
    # The replaced gang: every pod in the next attempt, and a clean run ends the job.
    again = _gang(pods, [{}] * 4, tmp_path, str(fake))
    try:
        assert [p.wait(timeout=120) for p in again] == [0] * 4
    finally:
        _end(again)
    done = Path(s.run_dir, "logs", "gang-job", "attempt-2", "gang")
    assert sorted(p.name for p in done.glob("*.done")) == [f"node-{i}.done" for i in range(4)]


def test_pods_failing_together_count_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          indexed: str) -> None:
    """A failure that hits every pod (a bad batch on every rank): one status is the counted
    failure, the others exit with the ignored one, so a restart costs one of the backoffLimit."""
    _, pods = _pods(tmp_path, monkeypatch, indexed)
    fake = tmp_path / "fake-launch.sh"
    fake.write_text(FAKE)
    procs = _gang(pods, [{"FAKE_TRAIN": "fail"}] * 2, tmp_path, str(fake))
    try:
        statuses = sorted(p.wait(timeout=120) for p in procs)
    finally:
        _end(procs)
    assert statuses == [3, eks.GANG_EXIT]


def test_pods_stopping_on_sigterm_are_not_killed_by_the_gang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indexed: str) -> None:
    """A time limit (activeDeadlineSeconds) sends every pod SIGTERM (a drain only the pod it
    evicts): the pods stop their passes themselves (a trainer saves on it), and the first to end
    does not get the others killed mid-save."""
    _, pods = _pods(tmp_path, monkeypatch, indexed)
    fake = tmp_path / "fake-launch.sh"
    fake.write_text(FAKE)
    procs = _gang(pods, [{"FAKE_TRAIN": "stoppable"}] * 2, tmp_path, str(fake))
    try:
        deadline = time.monotonic() + 120
        while not all("training pass on 2 nodes" in (tmp_path / f"pod-{i}.log").read_text()
                      for i in (0, 1)):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1)   # the flows are waiting for their passes
        for proc in procs:
            proc.send_signal(signal.SIGTERM)   # what the kubelet sends the container's PID 1
        statuses = [p.wait(timeout=60) for p in procs]
    finally:
        _end(procs)
    assert eks.GANG_EXIT not in statuses, statuses
    logs = "".join((tmp_path / f"pod-{i}.log").read_text() for i in (0, 1))
    assert "stopping this pod so that the whole gang restarts" not in logs


@pytest.mark.slow
def test_a_frozen_pod_restarts_the_gang_which_resumes_from_its_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indexed: str) -> None:
    """The real CPU trainer under torchrun: pod 1 freezes (SIGSTOP: its node is gone, its
    sockets stay open, so pod 0 waits in a collective as a Neuron trainer would), pod 0 sees
    its beat go stale and stops; Kubernetes' replacements (run again here) resume."""
    s, pods = _pods(tmp_path, monkeypatch, indexed)
    import socket
    with socket.socket() as sock:   # the machine may run other rehearsals on the recipe's port
        sock.bind(("127.0.0.1", 0))
        port = {"MASTER_PORT": str(sock.getsockname()[1])}
    # No compile pass (not what this test is about: it would double the trainers started).
    port["JOBGEN_COMPILE_MODE"] = "never"
    slow = {"JOBGEN_SMOKE_STEP_DELAY": "0.5", "JOBGEN_GANG_STALE_S": "6", **port}
    procs = _gang(pods, [slow, slow], tmp_path)
    checkpoints = Path(s.run_dir, "train", "checkpoints")
    try:
        deadline = time.monotonic() + 300
        while not list(checkpoints.glob("step_*/COMPLETE")):
            assert procs[0].poll() is None and time.monotonic() < deadline, \
                (tmp_path / "pod-0.log").read_text()[-3000:]
            time.sleep(0.5)
        _signal_pod(procs[1], signal.SIGSTOP)
        frozen = time.monotonic()
        assert procs[0].wait(timeout=120) == eks.GANG_EXIT
        took = time.monotonic() - frozen
    finally:
        _end(procs)
    log = (tmp_path / "pod-0.log").read_text()
    assert "node 1 has not beaten for" in log, log[-3000:]
    print(f"pod 0 stopped {took:.1f} s after pod 1 froze (stale after 6 s)")
    saved = max(int(p.parent.name.split("_")[1])
                for p in checkpoints.glob("step_*/COMPLETE"))
    again = _gang(pods, [port, port], tmp_path)
    try:
        assert [p.wait(timeout=600) for p in again] == [0, 0], \
            (tmp_path / "pod-0.log").read_text()[-3000:]
    finally:
        _end(again)
    events = [json.loads(line[line.index("{"):]) for line in
              (tmp_path / "pod-0.log").read_text().splitlines() if '{"event"' in line]
    resumed = [e for e in events if e["event"] == "resume"]
    assert resumed and resumed[-1]["step"] >= saved
    assert "training pass finished" in (tmp_path / "pod-0.log").read_text()


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
    s, pods = _pods(tmp_path, monkeypatch)   # this machine's site: eks.gang: jobset
    (doc,) = eks.manifests(s)
    import socket
    with socket.socket() as sock:   # the machine may run other rehearsals on the recipe's port
        sock.bind(("127.0.0.1", 0))
        extra = {"MASTER_PORT": str(sock.getsockname()[1]), "JOBGEN_COMPILE_MODE": "never",
                 "JOBGEN_SMOKE_STEP_DELAY": "0.3"}
    checkpoints = Path(s.run_dir, "train", "checkpoints")
    attempts = [0, 0]

    def start(index: int) -> subprocess.Popen:
        attempts[index] += 1
        argv, env = pods[index]
        return _start(argv, env, extra, tmp_path / f"pod-{index}.log")

    drained: list[int] = []

    def drain(engine_: engine.JobSet) -> None:
        if not drained and list(checkpoints.glob("step_*/COMPLETE")):
            drained.append(max(int(p.parent.name.split("_")[1])
                               for p in checkpoints.glob("step_*/COMPLETE")))
            engine_.disrupt(1)

    jobset = engine.JobSet(doc, start, say=lambda line: print(line))
    began = time.monotonic()
    try:
        outcome = jobset.run(during=drain, timeout_s=600)
    finally:
        for proc in jobset.pods.values():
            _signal_pod(proc, signal.SIGKILL)
            proc.wait()
    print(f"drained at step {drained}, ended {outcome!r} after {time.monotonic() - began:.0f} s")
    logs = [(tmp_path / f"pod-{i}.log").read_text() for i in (0, 1)]
    assert outcome == "Completed", (jobset.history, logs[0][-3000:], logs[1][-3000:])
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
    # No done marks before their time: no heartbeats, no gang folder.
    assert not list(Path(s.run_dir, "logs", "gang-job").glob("attempt-*/gang"))
