"""`jobgen watch` against real jobs on the local Slurm cluster (tests/ci/slurm-up.sh), each with
a fault the smoke trainer injects for real (payload/smoke/train.py):

- one node hangs before step 10            --on-hang requeue: the job resumes from step 8
- a diverging learning rate from step 10   --on-diverge rollback: resumed from step 8
- a NaN loss at step 10                    --on-diverge stop, --notify: the job is cancelled
- a one-step gradient spike, a throughput drop and a loss spike, with no action flag (and
  --on-diverge stop on a spike alone, which must not act)
- one node failing at step 6 in every allocation: the watch names its host

Every job is submitted with `jobgen submit` and watched with `jobgen watch RUN-NAME` as a user
would, all at once (the cluster runs two 2-node jobs at a time); each test then reads its
watcher's JSON lines and the job's own logs. Detection latencies are printed at the end.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
from test_slurm_e2e import (  # noqa: F401
    JOBGEN_EXE,
    NODES,
    cluster,
    event_time,
    free_port,
    job_env,
    job_fields,
    read_events,
    show_figures,
    unique,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

WATCH_TIMEOUT = 600     # seconds for every job to end and every watcher with it
FIGURES: dict[str, str] = {}
# Quick looks on the smoke scale (steps take about 0.3-1 s here). Only the hang job judges hangs
# on that scale; the others keep a floor that a loaded CI machine cannot reach by accident.
FAST = ["--poll", "0.5", "--hang-min", "60"]
QUICK_HANG = ["--hang-min", "0", "--hang-factor", "8"]


@dataclass
class Watched:
    name: str
    cwd: Path
    job_id: str
    watcher: subprocess.Popen[str]
    out: Path
    err: Path
    records: Optional[list[dict[str, Any]]] = None

    @property
    def run_dir(self) -> Path:
        return self.cwd / "jobgen-runs" / self.name

    def finish(self) -> list[dict[str, Any]]:
        if self.records is None:
            self.watcher.wait(timeout=WATCH_TIMEOUT)
            self.records = [json.loads(line) for line in self.out.read_text().splitlines()
                            if line.startswith("{")]
        return self.records

    def alerts(self) -> list[dict[str, Any]]:
        return [r for r in self.finish() if r["type"] == "alert"]

    def actions(self) -> list[dict[str, Any]]:
        return [r for r in self.finish() if r["type"] == "action"]

    def summary(self) -> dict[str, Any]:
        last = self.finish()[-1]
        assert last["type"] == "summary", self.explain("no summary")
        return last

    def events(self, restart: int, node: int = 0) -> list[dict[str, Any]]:
        path = self.run_dir / "logs" / self.job_id / f"restart-{restart}" / f"node-{node}" / \
            "train.log"
        return read_events(path.read_text(errors="replace")) if path.exists() else []

    def explain(self, why: str) -> str:
        logs = sorted(self.run_dir.glob("logs/*/restart-*/node-*/train.log"))
        return "\n".join([f"{why} (job {self.job_id}, run {self.name})",
                          f"state: {job_fields(self.job_id)}",
                          "--- watch stdout ---", self.out.read_text()[-4000:],
                          "--- watch stderr ---", self.err.read_text()[-2000:]]
                         + [f"--- {p} ---\n" + p.read_text(errors="replace")[-1500:]
                            for p in logs[-3:]])


def start(tmp: Path, state: Path, recipe: str, label: str, faults: dict[str, str],
          watch_args: list[str], submit_args: tuple[str, ...] = ()) -> Watched:
    cwd = tmp / label
    cwd.mkdir()
    name = unique(label)
    env = job_env(JOBGEN_STATE_DIR=str(state), JOBGEN_SMOKE_STEP_DELAY="0.3", **faults)
    # No compile pass: watch judges the training pass, and the six jobs' compile passes were
    # a minute of CI's CPU (the compile pass is rehearsed in tests/test_slurm_e2e.py).
    submitted = subprocess.run(
        [str(JOBGEN_EXE), "submit", recipe, "--nodes", str(NODES), "--smoke", "--run-name", name,
         "--compile", "never", "--set", f"job.master_port={free_port()}", *submit_args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[0]
    out, err = cwd / "watch.out", cwd / "watch.err"
    watch_env = job_env(JOBGEN_STATE_DIR=str(state))
    with out.open("w") as stdout, err.open("w") as stderr:
        watcher = subprocess.Popen([str(JOBGEN_EXE), "watch", name, "--json", *FAST,
                                    *watch_args], cwd=cwd, env=watch_env, stdout=stdout,
                                   stderr=stderr, text=True)
    return Watched(name, cwd, job_id, watcher, out, err)


@pytest.fixture(scope="module")
def watched(cluster: int, tmp_path_factory: pytest.TempPathFactory,  # noqa: F811
            request: pytest.FixtureRequest) -> Iterator[dict[str, Watched]]:
    tmp = tmp_path_factory.mktemp("watch")
    state = tmp / "state"
    started = time.monotonic()
    jobs = {
        "hang": start(tmp, state, "pythia6.9b", "hang",
                      {"JOBGEN_SMOKE_HANG_AT_STEP": "10", "JOBGEN_SMOKE_HANG_NODE": "1"},
                      ["--on-hang", "requeue", *QUICK_HANG]),
        "diverge": start(tmp, state, "llama2-7b", "diverge",
                         {"JOBGEN_SMOKE_DIVERGE_AT_STEP": "10"}, ["--on-diverge", "rollback"]),
        "nan": start(tmp, state, "neox20b", "nan", {"JOBGEN_SMOKE_NAN_AT_STEP": "10"},
                     ["--on-diverge", "stop", "--on-hang", "stop",
                      "--notify", "cmd:cat >> notified.jsonl"]),
        "spikes": start(tmp, state, "pythia6.9b", "spikes",
                        {"JOBGEN_SMOKE_SPIKE_AT_STEP": "6", "JOBGEN_SMOKE_SLOW_AT_STEP": "13",
                         "JOBGEN_SMOKE_SLOW_SECONDS": "1.5",
                         "JOBGEN_SMOKE_LOSS_SPIKE_AT_STEP": "20"},
                        ["--drop-steps", "3"]),
        "calm spike": start(tmp, state, "neox20b", "calm-spike",
                            {"JOBGEN_SMOKE_SPIKE_AT_STEP": "8"}, ["--on-diverge", "stop"]),
        "bad node": start(tmp, state, "llama2-7b", "bad-node",
                          {"JOBGEN_SMOKE_FAIL_AT_STEP": "6", "JOBGEN_SMOKE_FAIL_NODE": "1"},
                          [], ("--set", "job.max_restarts=1", "--nodelist", "n3,n4")),
    }
    try:
        for job in jobs.values():
            job.watcher.wait(timeout=max(10.0, WATCH_TIMEOUT - (time.monotonic() - started)))
        FIGURES["all watched jobs ended after"] = f"{time.monotonic() - started:.0f} s"
        yield jobs
    finally:
        for job in jobs.values():
            if job.watcher.poll() is None:
                job.watcher.kill()
            subprocess.run(["scancel", job.job_id], capture_output=True, timeout=30,
                           check=False)
        show_figures(request, "watch e2e figures", FIGURES)


def _of(alerts: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [a for a in alerts if a["kind"] == kind]


def _time(text: str) -> float:
    return event_time({"time": text})


def test_a_hung_node_is_named_and_the_job_requeued_resumes(watched: dict[str, Watched]) -> None:
    job = watched["hang"]
    alerts = job.alerts()
    hangs, silent = _of(alerts, "hang"), _of(alerts, "node_silent")
    assert len(hangs) == 1 and hangs[0]["step"] == 9, job.explain("no hang alert at step 9")
    assert [(a["node"], a["host"]) for a in silent] == [(1, hangs[0]["host"])]
    assert hangs[0]["host"] in {"n1", "n2", "n3", "n4"}
    actions = job.actions()
    assert [(a["what"], a["alert"], a["ok"]) for a in actions] == [("requeue", "hang", True)]
    assert actions[0]["result"] == f"scontrol requeue {job.job_id}"
    assert job.summary()["state"] == "COMPLETED" and job.watcher.returncode == 0
    # The requeued allocation resumed from the newest checkpoint before the hang (every 4 steps).
    resumed = [e["step"] for e in job.events(1) if e["event"] == "resume"]
    assert resumed == [8], job.explain("the requeued job did not resume from step 8")
    assert [e["step"] for e in job.events(1) if e["event"] == "done"] == [24]
    assert job.summary()["steps_lost"] == 1
    # Latency: from the moment node 0 started step 10 (and node 1 did not) to the alert.
    began = max(_time(e["time"]) for e in job.events(0) if e["event"] == "beat"
                and e["step"] == 10)
    FIGURES["hang detection latency"] = (f"{_time(hangs[0]['time']) - began:.1f} s "
                                         f"(allowance {hangs[0]['values']['allowance_s']:.1f} s "
                                         "= 8 x median step, poll 0.5 s)")


def test_divergence_is_rolled_back_to_the_checkpoint_before_it(
        watched: dict[str, Watched]) -> None:
    job = watched["diverge"]
    divergence = _of(job.alerts(), "divergence")
    assert divergence and divergence[0]["since_step"] == 11, job.explain("no divergence alert")
    actions = job.actions()
    assert [(a["what"], a["ok"]) for a in actions] == [("rollback", True)], job.explain("actions")
    assert "resuming from step 8" in actions[0]["result"]
    assert actions[0]["result"].startswith(f"scontrol requeuehold {job.job_id}")
    assert actions[0]["result"].endswith(f"scontrol release {job.job_id}")
    rolled = list(job.run_dir.glob("train/rolled-back-*/step_*"))
    assert rolled and all(int(p.name[5:]) > 8 for p in rolled)
    resumed = [e["step"] for e in job.events(1) if e["event"] == "resume"]
    assert resumed == [8], job.explain("the rolled-back job did not resume from step 8")
    steps = [e for e in job.events(1) if e["event"] == "step"]
    assert max(e["grad_norm"] for e in steps) < 10     # the fault happened once: healthy now
    assert job.summary()["state"] == "COMPLETED"


def test_a_nan_loss_stops_the_job_and_notifies(watched: dict[str, Watched]) -> None:
    job = watched["nan"]
    nonfinite = _of(job.alerts(), "nonfinite")
    assert nonfinite and nonfinite[0]["step"] == 10, job.explain("no non-finite alert")
    assert [(a["what"], a["ok"]) for a in job.actions()] == [("stop", True)]
    assert job.summary()["state"] == "CANCELLED" and job.watcher.returncode == 1
    steps = [e["step"] for e in job.events(0) if e["event"] == "step" and e["phase"] == "train"]
    assert max(steps) < 24
    notified = [json.loads(line) for line in (job.cwd / "notified.jsonl").read_text()
                .splitlines()]
    assert [(n["type"], n["what"]) for n in notified] == [("action", "stop")]


def test_spikes_and_a_throughput_drop_are_reported_without_acting(
        watched: dict[str, Watched]) -> None:
    job = watched["spikes"]
    alerts = job.alerts()
    assert [a["step"] for a in _of(alerts, "grad_spike")][:1] == [6], job.explain("spike")
    drops = _of(alerts, "throughput_drop")
    assert len(drops) == 1 and 14 <= drops[0]["step"] <= 19, job.explain("throughput drop")
    assert [a["step"] for a in _of(alerts, "loss_spike")] == [20], job.explain("loss spike")
    assert job.actions() == [] and job.summary()["state"] == "COMPLETED"
    spike = _of(alerts, "grad_spike")[0]
    began = min(_time(e["time"]) for e in job.events(0) if e["event"] == "beat"
                and e["step"] == 6 and e["phase"] == "train")
    FIGURES["gradient-spike detection latency"] = (
        f"{_time(spike['time']) - began:.2f} s from the start of step 6, "
        f"{_time(spike['time']) - _time(spike['fault_time']):.2f} s from its event (poll 0.5 s)")
    FIGURES["throughput-drop detection"] = f"at step {drops[0]['step']} (slowed from step 13)"
    calm = watched["calm spike"]
    spikes = _of(calm.alerts(), "grad_spike")
    assert 8 in [a["step"] for a in spikes], calm.explain("calm spike")
    assert max(a["values"]["grad_norm"] for a in spikes) > 20
    assert {a["category"] for a in calm.alerts()} == {"report"}
    assert calm.actions() == [] and calm.summary()["state"] == "COMPLETED"


def test_a_node_that_fails_every_allocation_is_named(watched: dict[str, Watched]) -> None:
    job = watched["bad node"]
    bad = _of(job.alerts(), "bad_node")
    assert len(bad) == 1, job.explain("no bad-node alert")
    assert bad[0]["host"] == "n4" and bad[0]["values"]["allocations"] == [0, 1]
    assert "scontrol update nodename=n4 state=drain" in bad[0]["message"]
    assert job.summary()["state"] == "FAILED" and job.summary()["allocations"] == 2
    assert os.path.exists(job.run_dir / "watch.jsonl")
