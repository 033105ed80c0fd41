"""End to end on the real local Slurm cluster (tests/ci/slurm-up.sh: emulated nodes n1..n4 in
partition debug, the default, and n5..n6 in partition side, where the time-limit rehearsal runs;
2 CPUs each) with the smoke rehearsal: the script `jobgen render` prints, piped
into `sbatch`, trains a tiny model of the recipe's family on CPU, one process per node.

- every recipe: compile pass (3 steps) then training pass (24 steps, checkpoints) on 2 nodes;
- a killed trainer: srun ends the step, the script requeues, the compile pass is skipped and
  training resumes from the newest complete checkpoint; a node set DOWN does the same via Slurm;
- a job that keeps failing gives up after job.max_restarts;
- a second submission of the same spec finds the compile-cache marker and skips compiling;
- the CLI: submit, status, logs, cancel, --chain (afterok; a failed compile job cancels the
  training job) and --wait; --via submitit and the submitit Python API (`jobgen run`, a job
  without Slurm, is rehearsed from the installed wheel in tests/test_tool_install.py).

Every job gets its own submission folder, run name and rendezvous port: the emulated nodes share
one network namespace (and two recipes share a default port). Two 2-node jobs run at once where
a test has two to run. Waits are bounded; a failure shows the job's state and the tail of its
output file. The measured figures (sbatch to first training step, recovery after a kill) are
printed at the end of the module.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import pytest
from conftest import Require, cluster_partitions, default_partition_nodes, recipe_names

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "payload") not in sys.path:
    sys.path.insert(0, str(ROOT / "payload"))

from common.events import read_events  # noqa: E402

from jobgen.job.smoke_spec import SMOKE  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BIN_DIR = Path(sys.executable).parent           # the venv: jobgen, torchrun, python
JOBGEN_EXE = BIN_DIR / "jobgen"
RECIPES = tuple(recipe_names())   # as found in recipes/
NODES = 2
MAX_STEPS = SMOKE["max_steps"]                    # 24
EVERY = SMOKE["checkpoint_every"]                 # 4
COMPILE_STEPS = 3                                 # compile.steps of every built-in recipe
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED")
JOB_TIMEOUT = 420          # seconds from submission; a 2-node smoke job takes 20-60 s here

FIGURES: dict[str, str] = {}
SUBMITTED: list[str] = []  # every job id this module submitted (cancelled at the end if alive)


# --- the cluster and the environment jobs inherit -----------------------------------------------

@pytest.fixture(scope="module")
def cluster() -> int:
    """The local cluster's node count; skips (by hand) or fails (JOBGEN_REQUIRE_ALL=1) when the
    cluster or the training stack is missing."""
    require = Require()
    require(os.environ.get("JOBGEN_TEST_SLURM") == "1",
            "set JOBGEN_TEST_SLURM=1 with the local cluster up (bash tests/ci/slurm-up.sh)")
    for exe in ("sinfo", "sbatch", "scontrol", "squeue", "scancel", "sacct"):
        require(shutil.which(exe), f"Slurm's {exe} is not installed")
    proc = subprocess.run(["sinfo", "-h", "-o", "%P %D"], capture_output=True, text=True,
                          timeout=30, check=False)
    require(proc.returncode == 0 and proc.stdout.strip(),
            f"no Slurm controller answers: {proc.stderr.strip()}")
    nodes = default_partition_nodes(proc.stdout)
    require(nodes >= NODES, f"the cluster has {nodes} node(s); these tests need {NODES}")
    for module in ("torch", "transformers", "deepspeed", "h5py", "submitit"):
        require(importlib.util.find_spec(module), f"{module} is not installed in this venv")
    require(JOBGEN_EXE.exists(), f"{JOBGEN_EXE} is missing (pip install -e .)")
    return nodes


@pytest.fixture(scope="module", autouse=True)
def _cleanup_and_figures(request: pytest.FixtureRequest) -> Iterator[None]:
    """At the end: cancel any job of this module still alive, then print the figures."""
    yield
    alive = [j for j in SUBMITTED if _squeue_state(j)]
    if alive:
        subprocess.run(["scancel", *alive], capture_output=True, timeout=30, check=False)
    show_figures(request, "Slurm e2e figures", FIGURES)


def show_figures(request: pytest.FixtureRequest, title: str, figures: dict[str, str]) -> None:
    """Print measured figures after the module's tests, shown even when they all passed."""
    if not figures:
        return
    lines = ["", f"---- {title} ----"] + [f"{k}: {v}" for k, v in figures.items()]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():
        for line in lines:
            reporter.write_line(line)


def job_env(**extra: str) -> dict[str, str]:
    """The submitter's environment, which sbatch passes on to the job: the venv first on PATH,
    no Slurm variables of an enclosing job or sbatch defaults, no stray fault knobs."""
    env = {k: v for k, v in os.environ.items()
           if k == "SLURM_CONF"
           or not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "JOBGEN_SMOKE_"))}
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env.update(extra)
    return env


_PORTS: set[int] = set()


def free_port() -> int:
    """A rendezvous port below the ephemeral range, free now and not given out before here."""
    for _ in range(500):
        port = random.randint(20000, 32000)
        if port in _PORTS:
            continue
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        _PORTS.add(port)
        return port
    raise RuntimeError("no free port found")


def unique(name: str) -> str:
    return f"e2e-{name}-{uuid.uuid4().hex[:6]}"


# --- jobs ---------------------------------------------------------------------------------------

@dataclass
class Job:
    job_id: str
    cwd: Path                 # the submission directory (relative site paths start here)
    run_name: str
    port: int
    submitted: float          # time.time() when the submission command started
    label: str = ""

    @property
    def run_dir(self) -> Path:
        return self.cwd / "jobgen-runs" / self.run_name

    def out_file(self) -> Optional[Path]:
        found = sorted(self.cwd.glob(f"*-{self.job_id}.out"))
        return found[0] if found else None

    def output(self) -> str:
        path = self.out_file()
        return path.read_text(encoding="utf-8", errors="replace") if path else ""

    def node_log(self, restart: int, node: int, which: str) -> Path:
        return self.run_dir / "logs" / self.job_id / f"restart-{restart}" / f"node-{node}" / \
            f"{which}.log"

    def events(self, restart: int, which: str, node: int = 0) -> list[dict[str, Any]]:
        """Rank 0's events of one pass of one run (the node's log holds its torchrun output)."""
        path = self.node_log(restart, node, which)
        return read_events(path.read_text(encoding="utf-8", errors="replace")) \
            if path.exists() else []


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _squeue_state(job_id: str) -> str:
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True, timeout=30, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict; from accounting (State, ExitCode) once the controller has
    forgotten the job."""
    proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, timeout=30, check=False)
    if proc.returncode == 0 and proc.stdout.strip():
        fields: dict[str, str] = {}
        for key, value in re.findall(r"(\w+)=(\S*)", proc.stdout):
            fields.setdefault(key, value)
        return fields
    proc = subprocess.run(["sacct", "-j", job_id, "-X", "-P", "-n", "-o",
                           "JobID,State,ExitCode,NodeList"], capture_output=True, text=True,
                          timeout=30, check=False)
    rows = [r.split("|") for r in proc.stdout.strip().splitlines() if r]
    if not rows:
        return {}
    _, st, code, nodes = rows[-1][:4]
    return {"JobState": st.split()[0], "ExitCode": code, "NodeList": nodes, "_from": "sacct"}


def explain(job: Job, why: str) -> str:
    """A failure message: what went wrong, the job's state, and the tails of its logs."""
    parts = [f"{why} (job {job.job_id}{' ' + job.label if job.label else ''}, "
             f"submitted from {job.cwd})",
             f"state: {job_fields(job.job_id)}",
             f"--- tail of {job.out_file() or 'the output file (not written)'} ---",
             _tail(job.output(), 80)]
    logs = sorted((job.run_dir / "logs").glob("*/restart-*/node-*/*.log"))
    for path in logs[-4:]:
        parts += [f"--- tail of {path} ---",
                  _tail(path.read_text(encoding="utf-8", errors="replace"), 15)]
    return "\n".join(parts)


def wait_until(job: Job, check: Callable[[], Any], what: str, timeout: float,
               poll: float = 0.5) -> Any:
    """Poll `check` until it returns something true; fail with the job's logs after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(explain(job, f"timed out after {timeout:.0f} s waiting for {what}"),
                        pytrace=False)
        time.sleep(poll)


def wait_finished(job: Job, timeout: float = JOB_TIMEOUT) -> dict[str, str]:
    """Wait until the job ends (bounded from its submission); returns its fields. A requeued
    job is left to Slurm to start (see release_when_pending)."""
    left = max(30.0, job.submitted + timeout - time.time())

    def finished() -> Optional[dict[str, str]]:
        fields = job_fields(job.job_id)
        return fields if fields.get("JobState") in FINISHED else None

    return wait_until(job, finished, "the job to end", left, poll=1.0)


def assert_state(job: Job, fields: dict[str, str], state: str) -> None:
    if fields.get("JobState") != state:
        pytest.fail(explain(job, f"job ended {fields.get('JobState')}, expected {state}"),
                    pytrace=False)


def render_into_sbatch(cwd: Path, recipe: str, *, run_name: str, port: int,
                       env: Optional[dict[str, str]] = None, render_args: Sequence[str] = (),
                       sbatch_args: Sequence[str] = (), label: str = "") -> Job:
    """`jobgen render RECIPE --nodes 2 --smoke ... | sbatch --parsable`, really piped (no shell):
    render's stdout is sbatch's stdin."""
    env = env or job_env()
    argv = [str(JOBGEN_EXE), "render", recipe, "--nodes", str(NODES), "--smoke",
            "--run-name", run_name, "--set", f"job.master_port={port}", *render_args]
    started = time.time()
    render = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert render.stdout is not None and render.stderr is not None
    sbatch = subprocess.Popen(["sbatch", "--parsable", *sbatch_args], cwd=cwd, env=env,
                              stdin=render.stdout, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    render.stdout.close()  # sbatch holds the read end; render sees EPIPE if sbatch dies
    out, err = sbatch.communicate(timeout=60)
    render_err = render.stderr.read().decode(errors="replace")
    render.wait(timeout=60)
    assert render.returncode == 0, f"jobgen render {recipe} failed:\n{render_err}"
    assert sbatch.returncode == 0, f"sbatch refused the script of {recipe}: {err.strip()}"
    job_id = out.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch --parsable printed {out!r}"
    SUBMITTED.append(job_id)
    return Job(job_id, cwd, run_name, port, started, label or recipe)


def release_when_pending(job: Job, timeout: float = 120) -> float:
    """Waits until the requeued job is PENDING again; returns when. Slurm itself starts it once
    the old job credential has expired (AuthInfo=cred_expire=10 in tests/ci/slurm-up.sh, so
    about 12 s). Forcing `StartTime=now` earlier is a race: slurmctld then kills the job at once
    ("Killing non-startable batch job: Job credential revoked"), which is what a CI run saw."""
    def pending() -> bool:
        fields = job_fields(job.job_id)
        if fields.get("JobState") in FINISHED:
            pytest.fail(explain(job, "the job ended instead of being requeued"), pytrace=False)
        return fields.get("JobState") == "PENDING"

    wait_until(job, pending, "the requeued job to be PENDING", timeout, poll=0.2)
    return time.time()


def event_time(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["time"]).timestamp()


def steps_of(events: list[dict[str, Any]], phase: str) -> list[int]:
    return [e["step"] for e in events if e["event"] == "step" and e["phase"] == phase]


def only(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind]


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints of the training pass (those with their marker)."""
    root = run_dir / "train" / "checkpoints"
    steps = []
    for marker in root.glob("step_*/COMPLETE"):
        try:
            steps.append(int(json.loads(marker.read_text())["step"]))
        except (OSError, ValueError, KeyError):
            continue  # being written right now
    return sorted(steps)


def wait_mid_interval(job: Job, past: int = 8, more: int = 2) -> list[int]:
    """Wait for the first complete checkpoint past step `past` and then `more` training steps
    (so that a failure now loses work); returns the complete checkpoints' steps."""
    def ready() -> Optional[list[int]]:
        if _squeue_state(job.job_id) == "":
            pytest.fail(explain(job, f"the job ended before its first checkpoint past step {past}"),
                        pytrace=False)
        steps = complete_checkpoints(job.run_dir)
        if not steps or steps[-1] <= past:
            return None
        ran = steps_of(job.events(0, "train"), "train")
        return steps if ran and ran[-1] >= steps[-1] + more else None

    return wait_until(job, ready, f"a checkpoint past step {past} and {more} more steps",
                      JOB_TIMEOUT, poll=0.05)


def trainer_pids(job: Job, node: int, which: str = "train") -> list[int]:
    """The trainer processes (train.py workers, not torchrun) of one pass of this job on one
    node: found by the --output-dir in their command line, and checked against their working
    directory, Slurm job id and node, so that nothing of another run or job is touched."""
    out_dir = f"jobgen-runs/{job.run_name}/{which}"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not any(a.endswith("/train.py") for a in argv) or "--output-dir" not in argv:
                continue
            if any(a.endswith("/torchrun") for a in argv):
                continue  # the node's torchrun agent (its argv holds the trainer's too)
            if argv[argv.index("--output-dir") + 1] not in (out_dir, str(job.cwd / out_dir)):
                continue
            if Path(os.readlink(proc / "cwd")) != job.cwd:
                continue
            env = dict(item.split("=", 1) for item in
                       (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                       if "=" in item)
        except (OSError, IndexError):
            continue  # gone meanwhile
        if (env.get("SLURM_JOB_ID") == job.job_id and env.get("SLURM_NODEID") == str(node)
                and "RANK" in env):  # a worker torchrun started
            pids.append(int(proc.name))
    return pids


def sacct_steps(job_id: str) -> dict[str, tuple[str, str]]:
    """{step id: (state, node count)} of a job's srun steps, from accounting."""
    proc = subprocess.run(["sacct", "-j", job_id, "-P", "-n", "-o", "JobID,State,NNodes"],
                          capture_output=True, text=True, timeout=30, check=False)
    out = {}
    for row in proc.stdout.strip().splitlines():
        jid, st, nn = row.split("|")[:3]
        if re.fullmatch(rf"{job_id}\.\d+", jid):
            out[jid.split(".")[1]] = (st.split()[0], nn)
    return out


def run_cli(cwd: Path, *args: str, env: Optional[dict[str, str]] = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN_EXE), *args], cwd=cwd, env=env or job_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


# --- 1. every recipe: compile pass, then training pass, on 2 nodes ------------------------------

@pytest.fixture(scope="module")
def recipe_jobs(cluster: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    """Every recipe submitted at once (the cluster runs two 2-node jobs at a time), plus a
    second submission of pythia6.9b's spec (another run name) that starts after the first one
    completed (afterok), for the compile-cache test."""
    jobs = {}
    for recipe in RECIPES:
        cwd = tmp_path_factory.mktemp(f"submit-{recipe}")
        jobs[recipe] = render_into_sbatch(cwd, recipe, run_name=unique(recipe), port=free_port())
    first = jobs["pythia6.9b"]
    jobs["pythia6.9b again"] = render_into_sbatch(
        first.cwd, "pythia6.9b", run_name=unique("pythia6.9b-again"), port=first.port,
        sbatch_args=[f"--dependency=afterok:{first.job_id}"], label="pythia6.9b again")
    return jobs


def check_passes(job: Job, restart: int = 0) -> tuple[list[dict[str, Any]],
                                                      list[dict[str, Any]]]:
    """Both passes of one run on both nodes; returns rank 0's (compile, train) events."""
    out = job.output()
    for which in ("compile", "train"):
        for node in range(NODES):
            if not job.node_log(restart, node, which).is_file():
                pytest.fail(explain(job, f"no {which} log of node {node}: "
                                         f"{job.node_log(restart, node, which)}"), pytrace=False)
            started = f"jobgen[node {node}]: {which} pass: node {node} of {NODES}, master"
            ended = f"jobgen[node {node}]: {which} pass ended with status 0"
            assert started in out and ended in out, explain(job, f"node {node}: {which} pass")
    compile_events, train_events = job.events(restart, "compile"), job.events(restart, "train")
    for events in (compile_events, train_events):
        assert [e["world_size"] for e in only(events, "start")] == [NODES], \
            explain(job, "rank 0 did not see a 2-node world")
    return compile_events, train_events


@pytest.mark.parametrize("recipe", RECIPES)
def test_smoke_rehearsal_of_every_recipe(recipe: str, recipe_jobs: dict[str, Job]) -> None:
    job = recipe_jobs[recipe]
    fields = wait_finished(job)
    assert_state(job, fields, "COMPLETED")
    assert fields.get("ExitCode") == "0:0", explain(job, f"exit code {fields.get('ExitCode')}")
    out = job.output()
    assert f"jobgen: compile pass ({COMPILE_STEPS} steps) on {NODES} nodes" in out, \
        explain(job, "no compile pass")
    assert out.index("compile pass (") < out.index("jobgen[node 0]: training pass on"), \
        explain(job, "the training pass did not follow the compile pass")

    compile_events, train_events = check_passes(job)
    # The compile pass: exactly 3 steps (collective, so on both nodes), no checkpoint.
    assert steps_of(compile_events, "compile") == list(range(1, COMPILE_STEPS + 1)), \
        explain(job, "compile pass steps")
    assert [e["step"] for e in only(compile_events, "done")] == [COMPILE_STEPS]
    assert only(compile_events, "checkpoint") == [] and not (job.run_dir / "compile").exists()
    # The training pass: from scratch to step 24, a checkpoint every 4 steps.
    assert only(train_events, "resume") == []
    assert steps_of(train_events, "train") == list(range(1, MAX_STEPS + 1)), \
        explain(job, "training pass steps")
    assert [e["step"] for e in only(train_events, "checkpoint")] == \
        list(range(EVERY, MAX_STEPS + 1, EVERY))
    assert [e["step"] for e in only(train_events, "done")] == [MAX_STEPS]
    assert complete_checkpoints(job.run_dir)[-1] == MAX_STEPS
    # Accounting: the health gate's srun step, then one srun step on both nodes that runs the
    # two-pass flow (payload/common/job_flow.sh). (Accounting may still show a step RUNNING for
    # a moment after the job ended.)
    steps = wait_until(job, lambda: (lambda s: s if "RUNNING" not in str(s) else None)(
        sacct_steps(job.job_id)), "accounting to record the step's end", 60)
    assert steps == {"0": ("COMPLETED", "2"), "1": ("COMPLETED", "2")}
    # The job's own output file has the same events, compile first.
    phases = [e["phase"] for e in read_events(out) if e["event"] == "step"]
    assert phases == ["compile"] * COMPILE_STEPS + ["train"] * MAX_STEPS

    first_compile = [e for e in compile_events if e["event"] == "step"][0]
    first_train = [e for e in train_events if e["event"] == "step"][0]
    done = only(train_events, "done")[0]
    # Slurm's StartTime (whole seconds, local time): how long the job queued behind the others.
    started = datetime.fromisoformat(fields["StartTime"]).timestamp() \
        if fields.get("StartTime", "").startswith("20") else float("nan")
    queued = max(0.0, started - job.submitted)
    FIGURES[f"{recipe}: sbatch -> first training step (queued; first compile step; done)"] = (
        f"{event_time(first_train) - job.submitted:.1f} s (queued {queued:.0f} "
        f"s; first compile step {event_time(first_compile) - job.submitted:.1f} s; done "
        f"{event_time(done) - job.submitted:.1f} s)")


# --- 4. the compile cache: the same spec again skips the compile pass ---------------------------

def test_same_spec_again_skips_the_compile_pass(recipe_jobs: dict[str, Job]) -> None:
    """The second submission of pythia6.9b's smoke spec (same submission folder, so the same
    compile cache; a new run name) started after the first completed. Its compile key is the
    first's, so it finds the marker, skips compiling and trains from scratch in its own run."""
    first, again = recipe_jobs["pythia6.9b"], recipe_jobs["pythia6.9b again"]
    assert_state(first, wait_finished(first), "COMPLETED")
    markers = sorted((first.cwd / "jobgen-runs/neuron-compile-cache/.jobgen").glob("*.done"))
    assert len(markers) == 1, f"compile-cache markers: {markers}"
    fields = wait_finished(again)
    assert_state(again, fields, "COMPLETED")
    out = again.output()
    assert (f"jobgen: compile pass skipped (compile mode auto; cache marker "
            f"{markers[0].name})") in out, explain(again, "the compile pass was not skipped")
    assert "compile pass (" not in out
    assert all(e.get("phase") != "compile" for e in read_events(out)), \
        explain(again, "compile-phase events in the second job")
    assert not again.node_log(0, 0, "compile").exists()
    assert len(sacct_steps(again.job_id)) == 2     # the health gate, then training only
    train_events = again.events(0, "train")
    assert only(train_events, "resume") == []      # its own run: from scratch
    assert steps_of(train_events, "train") == list(range(1, MAX_STEPS + 1))


# --- 2. kill -> requeue -> resume ---------------------------------------------------------------

@pytest.fixture(scope="module")
def failing_job(cluster: int, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """A job whose trainer fails before step 6 in every run, allowed 1 restart. Submitted by
    the kill test too, so that both run at once (two 2-node jobs fit the cluster)."""
    cwd = tmp_path_factory.mktemp("submit-failing")
    return render_into_sbatch(cwd, "neox20b", run_name=unique("failing"), port=free_port(),
                              env=job_env(JOBGEN_SMOKE_FAIL_AT_STEP="6"),
                              render_args=["--set", "job.max_restarts=1"], label="failing")


def test_killed_trainer_requeues_and_resumes(failing_job: Job, tmp_path: Path) -> None:
    """A trainer killed mid-interval: Slurm requeues the job, which skips the compile pass and
    resumes from the newest complete checkpoint. The job's script points at the payload snapshot
    placed when it was rendered: the payload jobgen was installed with (here a copy of the
    project, through JOBGEN_HOME) is edited while the job trains, and the requeue still runs the
    snapshot. A job rendered after the edit gets a snapshot of its own."""
    from jobgen.images import snapshot
    project = tmp_path / "project"
    for part in ("recipes", "templates", "payload", "env"):
        shutil.copytree(ROOT / part, project / part,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # 0.3 s per step: the training pass takes about 7 s, time enough to kill it between the
    # checkpoints at 12 and 16.
    env = job_env(JOBGEN_HOME=str(project), JOBGEN_SMOKE_STEP_DELAY="0.3")
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    job = render_into_sbatch(submit_dir, "pythia6.9b", run_name=unique("kill"), port=free_port(),
                             env=env, label="kill")
    digest = snapshot.digest(project / "payload")
    placed = submit_dir / "jobgen-runs" / ".jobgen" / "payload" / digest[:16]
    assert (placed / snapshot.MARKER).read_text().strip() == digest

    before = wait_mid_interval(job)
    launcher = project / "payload" / "smoke" / "launch.sh"
    launcher.write_text(launcher.read_text().replace(
        "\n", '\necho "EDITED PAYLOAD RAN" >&2; exit 3\n', 1))
    pids = trainer_pids(job, node=1)
    assert len(pids) == 1, explain(job, f"node 1's trainer processes: {pids}")
    killed_at = time.time()
    os.kill(pids[0], signal.SIGKILL)

    released_at = release_when_pending(job)
    # Nothing can be sealed without the killed rank (barriers), but the kill may have landed
    # while rank 0 wrote a marker: the newest complete checkpoint now is the one to resume from.
    newest = complete_checkpoints(job.run_dir)[-1]
    assert before[-1] <= newest <= before[-1] + EVERY
    fields = wait_finished(job)
    assert_state(job, fields, "COMPLETED")
    assert fields.get("Restarts") == "1", explain(job, f"Restarts={fields.get('Restarts')}")
    out = job.output()
    assert "jobgen: training pass failed with status" in out
    assert "requeueing (restart 1 of 10)" in out
    assert f"jobgen: job {job.job_id} on" in out
    assert "allocation 1, restarts after failures 1 of at most 10" in out

    # First run: compile pass and part of the training pass.
    first_compile, first_train = job.events(0, "compile"), job.events(0, "train")
    assert steps_of(first_compile, "compile") == [1, 2, 3]
    ran = steps_of(first_train, "train")
    assert ran[:newest] == list(range(1, newest + 1)), explain(job, f"first run steps {ran}")
    lost = ran[-1] - newest
    assert 0 <= lost <= EVERY, explain(job, f"{lost} steps lost (checkpoint every {EVERY})")

    # Second run: the marker skips the compile pass; training resumes from `newest`.
    restarted = out[out.index("allocation 1, restarts after failures 1 of at most 10"):]
    assert "jobgen: compile pass skipped (compile mode auto; cache marker" in restarted
    assert "compile pass (" not in restarted
    assert not job.node_log(1, 0, "compile").exists()
    assert not job.node_log(1, 1, "compile").exists()
    compile_again, train_again = check_passes_train_only(job, restart=1)
    assert compile_again == []
    resume = only(train_again, "resume")
    assert [e["step"] for e in resume] == [newest], explain(job, "resume step")
    again = steps_of(train_again, "train")
    assert again == list(range(newest + 1, MAX_STEPS + 1)), explain(job, f"resumed: {again}")
    assert [e["step"] for e in only(train_again, "done")] == [MAX_STEPS]
    assert complete_checkpoints(job.run_dir)[-1] == MAX_STEPS
    wait_until(job, lambda: not trainer_pids(job, 0) and not trainer_pids(job, 1),
               "the trainers to exit", 30)

    # The requeue ran the snapshot, never the edited payload, and left the snapshot as it was.
    logs = out + "".join(p.read_text(errors="replace")
                         for p in job.run_dir.glob("logs/*/*/*/*.log"))
    assert "EDITED PAYLOAD RAN" not in logs
    assert snapshot.digest(placed) == digest
    # Rendered now, the same recipe runs the edited payload, from a snapshot of its own.
    render = subprocess.run([str(JOBGEN_EXE), "render", "pythia6.9b", "--nodes", "2", "--smoke"],
                            cwd=submit_dir, env=env, capture_output=True, text=True,
                            timeout=60, check=True)
    edited = snapshot.digest(project / "payload")
    assert edited != digest
    assert f"JOBGEN_PAYLOAD_DIR=jobgen-runs/.jobgen/payload/{edited[:16]}\n" in render.stdout
    assert (placed.parent / edited[:16] / "smoke" / "launch.sh").read_text() == \
        launcher.read_text()

    first_step = [e for e in train_again if e["event"] == "step"][0]
    FIGURES["kill -> requeue -> resume (process kill)"] = (
        f"killed node 1's trainer after checkpoint {before[-1]} (at step {ran[-1]}), "
        f"resumed from {newest}, lost {lost} step(s); kill -> PENDING "
        f"{released_at - killed_at:.1f} s, kill -> resume event "
        f"{event_time(resume[0]) - killed_at:.1f} s, kill -> first training step "
        f"{event_time(first_step) - killed_at:.1f} s")


def check_passes_train_only(job: Job, restart: int) -> tuple[list[dict[str, Any]],
                                                             list[dict[str, Any]]]:
    """A run without a compile pass: the training pass on both nodes; (compile, train) events."""
    out = job.output()
    for node in range(NODES):
        assert job.node_log(restart, node, "train").is_file(), \
            explain(job, f"no train log of node {node} in restart {restart}")
        assert f"jobgen[node {node}]: train pass ended with status 0" in out
    train = job.events(restart, "train")
    assert [e["world_size"] for e in only(train, "start")] == [NODES]
    return job.events(restart, "compile"), train


# --- 3. a job that keeps failing gives up after its restarts ------------------------------------

def test_failing_job_gives_up_after_max_restarts(failing_job: Job) -> None:
    job = failing_job
    fields = wait_finished(job)      # it may have been requeued (and released) already
    assert_state(job, fields, "FAILED")
    out = job.output()
    injected = "JOBGEN_SMOKE_FAIL_AT_STEP=6: injected failure before step 6 of the train pass"
    assert injected in out, explain(job, "no injected failure")
    assert "training pass failed with status 1; requeueing (restart 1 of 1)" in out, \
        explain(job, "no requeue after the first failure")
    assert ("training pass failed with status 1 and the job has used all 1 restarts; "
            "giving up") in out, explain(job, "no giving up")
    # The trainer's exit status (1), through torchrun, srun and the script.
    assert fields.get("ExitCode") == "1:0", explain(job, f"ExitCode {fields.get('ExitCode')}")
    if "Restarts" in fields:
        assert fields["Restarts"] == "1"
    # The second run skipped compiling, resumed from step 4 and failed again before step 6.
    assert steps_of(job.events(0, "train"), "train") == [1, 2, 3, 4, 5]
    assert [e["step"] for e in only(job.events(1, "train"), "resume")] == [4]
    assert steps_of(job.events(1, "train"), "train") == [5]
    assert not (job.run_dir / "logs" / job.job_id / "restart-2").exists()
    time.sleep(3)  # not requeued again
    assert job_fields(job.job_id).get("JobState") == "FAILED"


# --- 2b. a node that fails: Slurm requeues, training resumes ------------------------------------

def node_state(node: str) -> str:
    proc = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"], capture_output=True,
                          text=True, timeout=30, check=False)
    return proc.stdout.strip()


def test_node_failure_requeues_and_resumes(cluster: int, tmp_path: Path) -> None:
    job = render_into_sbatch(tmp_path, "neox20b", run_name=unique("node-down"), port=free_port(),
                             env=job_env(JOBGEN_SMOKE_STEP_DELAY="0.3"), label="node down")

    before = wait_mid_interval(job)
    hosts = subprocess.run(["scontrol", "show", "hostnames", job_fields(job.job_id)["NodeList"]],
                           capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert len(hosts) == NODES, hosts
    node = hosts[1]          # the job's second node: exclusive, so no other job is on it
    downed_at = time.time()
    try:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                        "reason=jobgen-e2e-test"], capture_output=True, text=True, timeout=30,
                       check=True)
        released_at = release_when_pending(job)
    finally:
        # ReturnToService=2 brings a live slurmd's node straight back; resume it otherwise.
        if node_state(node).startswith(("down", "drain")):
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                           capture_output=True, text=True, timeout=30, check=False)
    newest = complete_checkpoints(job.run_dir)[-1]
    assert before[-1] <= newest <= before[-1] + EVERY
    fields = wait_finished(job)
    assert_state(job, fields, "COMPLETED")
    assert fields.get("Restarts") == "1", explain(job, f"Restarts={fields.get('Restarts')}")
    out = job.output()
    assert "DUE TO NODE FAILURE" in out, explain(job, "no node failure in the output")
    restarted = out[out.index("allocation 1, restarts after failures 1 of at most 10"):]
    assert "jobgen: compile pass skipped (compile mode auto; cache marker" in restarted
    ran = steps_of(job.events(0, "train"), "train")
    assert 0 <= ran[-1] - newest <= EVERY
    _, train_again = check_passes_train_only(job, restart=1)
    resume = only(train_again, "resume")
    assert [e["step"] for e in resume] == [newest], explain(job, "resume step")
    assert steps_of(train_again, "train") == list(range(newest + 1, MAX_STEPS + 1))
    assert [e["step"] for e in only(train_again, "done")] == [MAX_STEPS]
    first_step = [e for e in train_again if e["event"] == "step"][0]
    FIGURES["kill -> requeue -> resume (node set DOWN)"] = (
        f"{node} down after checkpoint {before[-1]} (at step {ran[-1]}), resumed from "
        f"{newest}, lost {ran[-1] - newest} step(s); down -> PENDING "
        f"{released_at - downed_at:.1f} s, down -> first training step "
        f"{event_time(first_step) - downed_at:.1f} s")


# --- 5. the CLI: submit, status, logs, cancel, --chain, --wait ----------------------------------

def test_cli_submit_status_logs_cancel(cluster: int, tmp_path: Path, jobgen: Callable) -> None:
    run_name, port = unique("cli"), free_port()
    env = job_env(JOBGEN_SMOKE_STEP_DELAY="1")        # a job that stays up long enough
    started = time.time()
    proc = run_cli(tmp_path, "submit", "neox20b", "--nodes", "2", "--smoke", "--run-name",
                   run_name, "--set", f"job.master_port={port}", env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\d+\n", proc.stdout), f"submit printed {proc.stdout!r}"
    job = Job(proc.stdout.strip(), tmp_path, run_name, port, started, "cli")
    SUBMITTED.append(job.job_id)
    out_file = tmp_path / f"neox20b-smoke-{job.job_id}.out"   # smoke jobs are named so

    def running() -> Optional[list[str]]:
        result = jobgen("status", job.job_id)
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        return lines if lines[0].startswith(f"job {job.job_id}: RUNNING") else None

    lines = wait_until(job, running, "status RUNNING", JOB_TIMEOUT)
    assert re.fullmatch(rf"job {job.job_id}: RUNNING, nodes n\[\d-\d\]", lines[0]), lines
    assert lines[1:] == [f"output {out_file}"]

    def compiling() -> Optional[str]:
        result = jobgen("logs", job.job_id)
        return result.stdout if result.exit_code == 0 and "compile pass (" in result.stdout \
            else None

    logged = wait_until(job, compiling, "`jobgen logs` to show the compile pass", 120)
    assert out_file.read_text().startswith(logged)
    assert f"jobgen: job {job.job_id} on n" in logged

    wait_until(job, lambda: trainer_pids(job, 0, "compile") and trainer_pids(job, 1, "compile"),
               "the compile pass's trainers", 120, poll=0.2)
    # The run can be found again: by its name in `jobgen runs`, status and logs.
    listed = [r for r in json.loads(run_cli(tmp_path, "runs", "--json", env=env).stdout)
              if r["name"] == run_name]
    assert len(listed) == 1, listed
    assert (listed[0]["backend"], listed[0]["job_id"], listed[0]["state"], listed[0]["nodes"],
            listed[0]["run_dir"]) == ("slurm", job.job_id, "RUNNING", 2, str(job.run_dir))
    by_name = json.loads(run_cli(tmp_path, "status", run_name, "--json", env=env).stdout)
    assert (by_name["job_id"], by_name["state"], by_name["run"]["name"]) == (
        job.job_id, "RUNNING", run_name)
    # Node 0's log holds rank 0's events once its compile pass has started (node 1's stays
    # empty: the smoke trainer writes from rank 0 only).
    wait_until(job, lambda: job.node_log(0, 0, "compile").exists() and
               job.node_log(0, 0, "compile").stat().st_size > 0,
               "node 0's compile log to have lines", 120, poll=0.2)
    node_log = run_cli(tmp_path, "logs", run_name, "--node", "0", env=env)
    assert node_log.returncode == 0, node_log.stderr
    assert '"event": "start", "phase": "compile"' in node_log.stdout
    assert job.node_log(0, 0, "compile").read_text().startswith(node_log.stdout)
    other = run_cli(tmp_path, "logs", run_name, "--node", "1", env=env)
    assert other.returncode == 0, other.stderr
    proc = run_cli(tmp_path, "cancel", job.job_id)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"job {job.job_id} cancelled (was RUNNING)\n"
    assert_state(job, wait_finished(job), "CANCELLED")
    assert jobgen("status", job.job_id).stdout.splitlines()[0].startswith(
        f"job {job.job_id}: CANCELLED, exit 0:15")
    proc = run_cli(tmp_path, "cancel", job.job_id)
    assert (proc.returncode, proc.stdout) == (
        0, f"job {job.job_id} already ended (CANCELLED); nothing to cancel\n")
    # The trainers went with the job.
    wait_until(job, lambda: not any(trainer_pids(job, n, w) for n in range(NODES)
                                    for w in ("compile", "train")),
               "the cancelled job's trainers to exit", 60)
    unknown = jobgen("status", "987654321")
    assert unknown.exit_code == 1
    assert "job 987654321 is unknown to the controller and to accounting" in unknown.stderr


def submit_cli(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([str(JOBGEN_EXE), "submit", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_chain_and_wait(cluster: int, tmp_path: Path) -> None:
    """Two chains at once: one that works (compile job, then the training job after it, afterok)
    and one whose compile job fails (its training job is cancelled, not left pending)."""
    good_dir, bad_dir = tmp_path / "good", tmp_path / "bad"
    good_dir.mkdir()
    bad_dir.mkdir()
    good_run, bad_run = unique("chain"), unique("chain-bad")
    good_port, bad_port = free_port(), free_port()
    started = time.time()
    good = submit_cli(good_dir, "pythia6.9b", "--nodes", "2", "--smoke", "--chain", "--wait",
                      "--run-name", good_run, "--set", f"job.master_port={good_port}",
                      env=job_env())
    bad = submit_cli(bad_dir, "llama2-7b", "--nodes", "2", "--smoke", "--chain", "--wait",
                     "--run-name", bad_run, "--set", f"job.master_port={bad_port}",
                     "--set", "job.max_restarts=0", env=job_env(JOBGEN_SMOKE_FAIL_AT_STEP="2"))
    outputs = {}
    for name, proc in (("good", good), ("bad", bad)):
        try:
            outputs[name] = proc.communicate(timeout=JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs[name] = proc.communicate()
            pytest.fail(f"jobgen submit --chain --wait ({name}) did not return within "
                        f"{JOB_TIMEOUT} s:\n{outputs[name][1]}")
    ids = {}
    for name, (out, _) in outputs.items():
        first_line = out.splitlines()[0] if out else ""
        assert re.fullmatch(r"\d+ \d+", first_line), f"{name}: submit printed {out!r}"
        ids[name] = first_line.split()
        SUBMITTED.extend(ids[name])

    compile_job = Job(ids["good"][0], good_dir, good_run, good_port, started, "chain compile")
    train_job = Job(ids["good"][1], good_dir, good_run, good_port, started, "chain train")
    assert good.returncode == 0, explain(train_job, f"--wait exited {good.returncode}: "
                                                    f"{outputs['good'][1]}")
    assert f"job {train_job.job_id}: COMPLETED" in outputs["good"][1]
    assert_state(compile_job, wait_finished(compile_job), "COMPLETED")
    assert_state(train_job, wait_finished(train_job), "COMPLETED")
    # The compile job ran only the compile pass, the training job only the training pass.
    compile_out, train_out = compile_job.output(), train_job.output()
    assert "jobgen[node 0]: compile-only job done" in compile_out
    assert "jobgen: training pass" not in compile_out
    assert {e.get("phase") for e in read_events(compile_out) if "phase" in e} == {"compile"}
    assert steps_of(compile_job.events(0, "compile"), "compile") == [1, 2, 3]
    assert not compile_job.node_log(0, 0, "train").exists()
    assert "jobgen: training pass only: the compile pass ran in its own job" in train_out
    assert "compile pass (" not in train_out
    assert {e.get("phase") for e in read_events(train_out) if "phase" in e} == {"train"}
    assert not train_job.node_log(0, 0, "compile").exists()
    assert steps_of(train_job.events(0, "train"), "train") == list(range(1, MAX_STEPS + 1))
    assert complete_checkpoints(train_job.run_dir)[-1] == MAX_STEPS
    status = run_cli(good_dir, "status", train_job.job_id).stdout.splitlines()
    nodes = job_fields(train_job.job_id)["NodeList"]
    assert status[0] == f"job {train_job.job_id}: COMPLETED, exit 0:0, nodes {nodes}", status
    assert run_cli(good_dir, "logs", compile_job.job_id).stdout == compile_out
    # afterok: training started once compiling had ended.
    times = subprocess.run(["sacct", "-X", "-P", "-n", "-o", "JobID,Start,End", "-j",
                            ",".join(ids["good"])], capture_output=True, text=True, timeout=30,
                           check=True).stdout.split()
    spans = {row.split("|")[0]: row.split("|")[1:] for row in times}
    assert spans[train_job.job_id][0] >= spans[compile_job.job_id][1], spans

    bad_compile = Job(ids["bad"][0], bad_dir, bad_run, bad_port, started, "failing chain compile")
    bad_train = Job(ids["bad"][1], bad_dir, bad_run, bad_port, started, "failing chain train")
    assert bad.returncode == 1, f"--wait exited {bad.returncode}: {outputs['bad'][1]}"
    assert f"job {bad_train.job_id}: CANCELLED" in outputs["bad"][1]
    fields = wait_finished(bad_compile)
    assert_state(bad_compile, fields, "FAILED")
    assert fields.get("ExitCode") == "1:0", explain(bad_compile, "exit code")
    assert ("compile pass failed with status 1 and the job has used all 0 restarts; giving up"
            in bad_compile.output())
    assert_state(bad_train, wait_finished(bad_train), "CANCELLED")
    assert not bad_train.out_file(), "the dependent job must never have started"


# --- 6. submitit --------------------------------------------------------------------------------

def test_submitit_cli_and_api(cluster: int, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`jobgen submit --via submitit` and `submitit_runner.submit(spec)`, both jobs at once. The
    CLI's job also rehearses kill -> requeue -> resume as the sbatch script's does: a trainer
    killed mid-interval, the main node's flow requeues (restart 1 of 10), the second run skips
    the compile pass and resumes from the newest complete checkpoint."""
    from jobgen import api
    from jobgen.backends.submitit import runner as submitit_runner

    cli_dir, api_dir = tmp_path / "cli", tmp_path / "api"
    cli_dir.mkdir()
    api_dir.mkdir()
    cli_run, api_run = unique("submitit-cli"), unique("submitit-api")
    cli_port, api_port = free_port(), free_port()
    started = time.time()
    proc = run_cli(cli_dir, "submit", "pythia6.9b", "--nodes", "2", "--smoke", "--via",
                   "submitit", "--run-name", cli_run, "--set", f"job.master_port={cli_port}",
                   env=job_env(JOBGEN_SMOKE_STEP_DELAY="0.3"))
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\d+\n", proc.stdout), f"submit printed {proc.stdout!r}"
    cli_job = Job(proc.stdout.strip(), cli_dir, cli_run, cli_port, started, "submitit cli")
    SUBMITTED.append(cli_job.job_id)

    # The Python API, in process: submitit's sbatch inherits this environment.
    for key, value in job_env().items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k not in job_env()]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(api_dir)
    spec = api.job_spec("llama2-7b", NODES, overrides=[f"job.master_port={api_port}"],
                        smoke=True, run_name=api_run)
    submitted = submitit_runner.submit(spec)
    api_job = Job(str(submitted.job_id), api_dir, api_run, api_port, time.time(), "submitit api")
    SUBMITTED.append(api_job.job_id)

    # The CLI's job: a trainer killed once a checkpoint is behind it and more steps are trained.
    before = wait_mid_interval(cli_job)
    pids = trainer_pids(cli_job, node=1)
    assert len(pids) == 1, explain(cli_job, f"node 1's trainer processes: {pids}")
    os.kill(pids[0], signal.SIGKILL)
    release_when_pending(cli_job)
    newest = complete_checkpoints(cli_job.run_dir)[-1]
    assert before[-1] <= newest <= before[-1] + EVERY

    wait_until(api_job, submitted.done, "the submitit job to be done", JOB_TIMEOUT, poll=1.0)
    results = submitted.results()
    assert [(r["node"], r["nodes"], r["status"]) for r in results] == [(0, 2, 0), (1, 2, 0)], \
        explain(api_job, f"results {results}")
    assert all(r["compiled"] for r in results)
    assert_state(api_job, wait_finished(api_job), "COMPLETED")
    fields = wait_finished(cli_job)
    assert_state(cli_job, fields, "COMPLETED")
    assert fields.get("Restarts") == "1", explain(cli_job, f"Restarts={fields.get('Restarts')}")

    for job in (cli_job, api_job):
        folder = job.run_dir / "submitit"
        assert list(folder.glob(f"{job.job_id}_*")), \
            explain(job, f"no submitit files of the job in {folder}")
        logs = job.run_dir / "logs" / job.job_id / "restart-0"
        events = read_events((logs / "node-0" / "compile.log").read_text())
        assert steps_of(events, "compile") == [1, 2, 3], explain(job, "compile steps")
        events = read_events((logs / "node-0" / "train.log").read_text())
        assert [e["world_size"] for e in only(events, "start")] == [NODES]
        assert (logs / "node-1" / "train.log").is_file()
        assert complete_checkpoints(job.run_dir)[-1] == MAX_STEPS
        if job is api_job:
            assert steps_of(events, "train") == list(range(1, MAX_STEPS + 1)), \
                explain(job, "steps")
    # The CLI job's second run: no compile pass (the marker), training resumes from `newest`.
    assert not cli_job.node_log(1, 0, "compile").exists()
    train_again = cli_job.events(1, "train")
    assert [e["step"] for e in only(train_again, "resume")] == [newest], \
        explain(cli_job, "resume")
    assert steps_of(train_again, "train") == list(range(newest + 1, MAX_STEPS + 1))
    FIGURES["kill -> requeue -> resume through submitit"] = (
        f"resumed from {newest}; {time.time() - started:.1f} s from submission to the end")


# --- 5. the time limit: warned, saved, requeued (not a failure), resumed ------------------------

TIME_LIMIT_MIN = 2          # each allocation: 120 s
WARNING_S = 50              # Slurm warns 50 s (or, by its 30 s check interval, up to ~80 s) before


def limited_site(cwd: Path) -> Path:
    """The local site with a time-limit warning short enough for a 2-minute allocation."""
    text = (ROOT / "env" / "sites" / "local.yaml").read_text(encoding="utf-8")
    assert "\n  max_nodes: 136\n" in text
    site = cwd / "limited.yaml"
    # `max_nodes: 136` is the slurm section's.
    site.write_text(text.replace("name: local\n", "name: limited\n").replace(
        "\n  max_nodes: 136\n", f"\n  max_nodes: 136\n  time_limit_warning_s: {WARNING_S}\n",
        1), encoding="utf-8")
    return site


def side_partition() -> list[str]:
    """`--partition side` where the cluster has tests/ci/slurm-up.sh's partition of that name (a
    job in a partition that is not the default one: its size is that partition's), else
    nothing."""
    return ["--partition", "side"] if "side" in cluster_partitions().split(", ") else []


def test_time_limit_requeues_and_the_run_finishes_across_allocations(cluster: int,
                                                                      tmp_path: Path) -> None:
    """A 2-minute time limit and 2.5 s per step: 24 steps need several allocations. At each
    warning the trainers save the step they just trained and stop, the job requeues itself
    without counting a failure, and the next allocation resumes from exactly that step."""
    job = render_into_sbatch(
        tmp_path, "pythia6.9b", run_name=unique("limit"), port=free_port(),
        env=job_env(JOBGEN_SMOKE_STEP_DELAY="2.5"), label="time limit",
        render_args=["--time", str(TIME_LIMIT_MIN), "--site", str(limited_site(tmp_path)),
                     "--set", "job.max_restarts=0", *side_partition()])
    fields = wait_finished(job, timeout=900)
    assert_state(job, fields, "COMPLETED")
    out = job.output()
    assert "requeueing (restart" not in out and "giving up" not in out, explain(job, "a failure")
    allocations = sorted(int(p.name.split("-")[1])
                         for p in (job.run_dir / "logs" / job.job_id).glob("restart-*"))
    assert len(allocations) >= 2 and allocations == list(range(len(allocations))), \
        explain(job, f"allocations {allocations}")
    assert fields.get("Restarts", str(len(allocations) - 1)) == str(len(allocations) - 1)
    # max_restarts is 0: had a time-limit requeue counted as a failure, the job would have
    # given up at the first one. Every allocation starts with no failure restarts used.
    for k in allocations:
        assert f"allocation {k}, restarts after failures 0 of at most 0" in out, explain(
            job, f"allocation {k}'s header")

    timeline, trained = [], []
    for k in allocations:
        folder = job.run_dir / "logs" / job.job_id / f"restart-{k}"
        train = job.events(k, "train")
        ran = steps_of(train, "train")
        resumed = [e["step"] for e in only(train, "resume")]
        start = resumed[0] if resumed else 0
        assert ran == list(range(start + 1, start + 1 + len(ran))), explain(job, f"{k}: {ran}")
        if trained:   # resumes exactly where the previous allocation stopped: no step lost
            assert start == trained[-1], explain(job, f"allocation {k} resumed at {start}")
        trained += ran
        last = k == allocations[-1]
        stopped = folder / "stopped.json"
        if last:
            assert not stopped.exists() and [e["step"] for e in only(train, "done")] == [24]
            timeline.append(f"allocation {k}: resumed at {start}, trained to 24, done")
            continue
        assert stopped.exists() and (folder / "time-limit").exists(), explain(
            job, f"allocation {k} was not stopped by the time-limit warning")
        saved = json.loads(stopped.read_text())
        # A warning that came while the trainers started (a loaded machine) stops them before
        # their first step: nothing trained, the resumed step is the saved one.
        last_step = ran[-1] if ran else start
        assert saved == {"step": last_step, "signal": "USR1"}, explain(job, f"{saved} vs {ran}")
        warned, left = (int(x) for x in (folder / "time-limit").read_text().split())
        stop_event = only(train, "stopped")[0]
        timeline.append(
            f"allocation {k}: resumed at {start}, trained to {last_step}, warned with {left} s "
            f"left, saved step {saved['step']} and stopped "
            f"{event_time(stop_event) - warned:.1f} s after the warning, 0 steps lost")
    assert trained == list(range(1, 25)), explain(job, f"steps across allocations: {trained}")
    assert out.count("requeueing for the time limit") == len(allocations) - 1
    assert complete_checkpoints(job.run_dir)[-1] == 24
    FIGURES["time-limit requeue (--time 2, warning 50 s, 2.5 s/step)"] = "; ".join(timeline)


# --- 6. a sweep: one job array, a run per combination -------------------------------------------

def test_sweep_is_a_job_array_of_runs(cluster: int, tmp_path: Path) -> None:
    """`submit --sweep seed=7,8`: one sbatch, two array tasks (each its own run folder and port),
    both listed by `jobgen runs`, found by name by status and logs, and trained to the end."""
    base, port = unique("sweep"), free_port()
    _PORTS.add(port + 1)
    env = job_env()
    proc = run_cli(tmp_path, "submit", "pythia6.9b", "--nodes", "2", "--smoke", "--run-name",
                   base, "--set", f"job.master_port={port}", "--sweep", "seed=7,8", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    ids = [line.split()[0] for line in lines]
    names = [line.split()[1] for line in lines]
    array_id = ids[0].split("_")[0]
    assert ids == [f"{array_id}_0", f"{array_id}_1"] and names == [f"{base}-seed7",
                                                                  f"{base}-seed8"]
    SUBMITTED.append(array_id)
    jobs = [Job(i, tmp_path, n, port + k, time.time(), f"sweep task {k}")
            for k, (i, n) in enumerate(zip(ids, names))]
    for job in jobs:
        assert_state(job, wait_finished(job), "COMPLETED")
    listed = {r["name"]: r for r in json.loads(run_cli(tmp_path, "runs", "--json",
                                                       env=env).stdout)}
    losses = []
    for job in jobs:
        row = listed[job.run_name]
        assert (row["job_id"], row["state"], row["run_dir"]) == (job.job_id, "COMPLETED",
                                                                  str(job.run_dir))
        status = json.loads(run_cli(tmp_path, "status", job.run_name, "--json", env=env).stdout)
        assert status["state"] == "COMPLETED"
        # Per-node logs live under the task's name (ARRAYID_K), where `logs --node` finds them.
        train = job.events(0, "train")
        assert [e["step"] for e in only(train, "done")] == [MAX_STEPS], explain(job, "not done")
        logged = run_cli(tmp_path, "logs", job.run_name, "--node", "0", env=env)
        assert logged.returncode == 0, logged.stderr
        assert only(read_events(logged.stdout), "done")[-1]["step"] == MAX_STEPS
        losses.append(only(train, "step")[0]["loss"])
    assert losses[0] != losses[1]     # the seeds reached the trainers


def test_more_nodes_than_the_partition_holds_is_refused(cluster: int, tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "submit", "llama2-7b", "--nodes", str(cluster * 2), "--smoke")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: {cluster * 2} nodes: partition debug has {cluster} (sinfo); "
                           "ask for fewer, or pass --no-check to queue it anyway\n")
    proc = run_cli(tmp_path, "submit", "llama2-7b", "--nodes", "2", "--smoke",
                   "--partition", "nosuch")
    assert proc.returncode == 2
    assert f"sinfo shows no partition 'nosuch' (partitions: {cluster_partitions()})" \
        in proc.stderr


def test_per_job_overrides_reach_slurm(cluster: int, tmp_path: Path) -> None:
    """--partition --account --qos --time --exclude --nodelist, as the controller records them."""
    proc = run_cli(tmp_path, "submit", "pythia6.9b", "--nodes", "2", "--smoke", "--run-name",
                   unique("overrides"), "--set", f"job.master_port={free_port()}",
                   "--partition", "debug", "--account", "root", "--qos", "normal",
                   "--time", "0:07:00", "--exclude", "n4", "--nodelist", "n1")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    SUBMITTED.append(job_id)
    try:
        fields = job_fields(job_id)
        assert (fields.get("Partition"), fields.get("Account"), fields.get("QOS"),
                fields.get("TimeLimit"), fields.get("ExcNodeList"), fields.get("ReqNodeList")) \
            == ("debug", "root", "normal", "00:07:00", "n4", "n1"), fields
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)


# --- the health gate: a bad node is found and left out before the compile pass ---------------

def _hosts(text: str) -> list[str]:
    proc = subprocess.run(["scontrol", "show", "hostnames", text], capture_output=True,
                          text=True, timeout=30, check=True)
    return proc.stdout.split()


def test_health_gate_leaves_out_a_bad_node_and_the_job_trains(cluster: int,
                                                              tmp_path: Path) -> None:
    """Node 1 of the first allocation fails the gate (JOBGEN_SMOKE_UNHEALTHY_NODE=1): the job
    stops before compiling, is requeued without that host (not counted as a restart), and the
    next allocation passes the gate and trains to the end."""
    run_name, port = unique("health"), free_port()
    env = job_env(JOBGEN_SMOKE_UNHEALTHY_NODE="1")
    started = time.time()
    proc = run_cli(tmp_path, "submit", "llama2-7b", "--nodes", "2", "--smoke", "--run-name",
                   run_name, "--set", f"job.master_port={port}", "--wait", env=env,
                   timeout=JOB_TIMEOUT)
    job = Job(proc.stdout.split()[0] if proc.stdout.split() else "?", tmp_path, run_name, port,
              started, "health gate")
    SUBMITTED.append(job.job_id)
    assert proc.returncode == 0, explain(job, f"submit --wait exited {proc.returncode}: "
                                              f"{proc.stderr[-2000:]}")
    out = job.output()
    first = re.search(r"jobgen: job \d+ on (\S+), allocation 0,", out)
    second = re.search(r"jobgen: job \d+ on (\S+), allocation 1, restarts after failures 0 ", out)
    bad = re.search(r"jobgen\[node 1\]: health: node 1 \((n\d)\) failed devices: 15 of 16 "
                    r"present \(faked: JOBGEN_SMOKE_UNHEALTHY_NODE=1\); needs 16", out)
    assert first and second and bad, explain(job, "the gate's lines are missing")
    host = bad.group(1)
    assert host == _hosts(first.group(1))[1]
    assert host not in _hosts(second.group(1))
    assert f"requeueing without {host} (requeue for health 1; not counted" in out
    assert f"the next allocation leaves out {host}" in out
    # Nothing was compiled on the bad allocation: the gate came first.
    assert not list((job.run_dir / "logs" / job.job_id / "restart-0").glob("node-*/compile.log"))
    assert out.count("jobgen: health gate passed") == 1
    assert out.index("jobgen: health gate passed") < out.index("compile pass (3 steps)")
    assert "jobgen[node 0]: training pass finished" in out
    fields = job_fields(job.job_id)
    assert fields.get("JobState") == "COMPLETED"
    if fields.get("_from") != "sacct":
        assert host in _hosts(fields["ExcNodeList"])
    (line,) = (job.run_dir / "jobgen-health.jsonl").read_text().splitlines()
    event = json.loads(line)
    assert (event["job"], event["allocation"], event["node"], event["host"], event["check"],
            event["action"]) == (job.job_id, "0", 1, host, "devices", f"left out {host}; requeued")
    shown = run_cli(tmp_path, "runs", run_name, "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert [e["host"] for e in json.loads(shown.stdout)["health"]] == [host]
    gate_s = max(json.loads(p.read_text())["seconds"]
                 for p in (job.run_dir / "logs" / job.job_id).glob("restart-1/node-*/health.json"))
    FIGURES["health gate: bad node -> requeued without it -> trained (total; gate on a node)"] = (
        f"{time.time() - started:.1f} s; {gate_s:.2f} s")


def test_health_gate_gives_up_after_its_requeues(cluster: int, tmp_path: Path) -> None:
    """A site that allows no requeue for health: the job stops at the gate, exit 75, naming the
    node, and is not requeued (a restart on the same nodes would find it again)."""
    site = tmp_path / "strict.yaml"
    site.write_text((ROOT / "env" / "sites" / "local.yaml").read_text()
                    .replace("name: local", "name: strict") + "\nhealth:\n  max_requeues: 0\n")
    run_name, port = unique("health-strict"), free_port()
    env = job_env(JOBGEN_SMOKE_UNHEALTHY_NODE="0")
    started = time.time()
    proc = run_cli(tmp_path, "submit", "llama2-7b", "--nodes", "2", "--smoke", "--run-name",
                   run_name, "--site", str(site), "--set", f"job.master_port={port}", env=env)
    assert proc.returncode == 0, proc.stderr
    job = Job(proc.stdout.strip(), tmp_path, run_name, port, started, "health gate, strict")
    SUBMITTED.append(job.job_id)
    fields = wait_finished(job)
    assert_state(job, fields, "FAILED")
    assert fields.get("ExitCode", "").startswith("75"), fields
    out = job.output()
    assert "failed devices" in out and "giving up" in out
    assert "a node is unhealthy (status 75, see the node lines above); not requeueing" in out
    assert "allocation 1" not in out
