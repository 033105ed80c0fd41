"""The short version of benchmarks/recovery_arms.py (issue 40 item 4) on the local Slurm cluster:
one failure of each kind (a worker killed, a node lost, a hang that the other node's collective
timeout catches) against arm A-cut (requeue only, synchronous saves, the requeue delay cut) and
arm D (restarts in place, a spare node where jobgen has them, background saves), both jobs at
once. Behaviour only: D restarts the killed worker and the hung one in place (no requeue for
them), its spare takes the lost node (no requeue for it either), A requeues for every failure,
watch (the fallback for hangs) never acts, no save is sealed before its last byte and every
resume is from a sealed step. The figures (never asserted) are printed last."""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_slurm_e2e import cluster, show_figures  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import recovery_arms as arms  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SAVE_DELAY = 0.6
# Longer than any healthy wait between the two nodes here (a restart's start-up skew under the
# load of two jobs on two cores), so that only the injected hang trips it.
COLLECTIVE_TIMEOUT = 20.0


def _events(run_dir: Path) -> list[dict[str, Any]]:
    """Node 0's training events over every allocation, in order."""
    out: list[dict[str, Any]] = []
    logs = sorted(run_dir.glob("logs/*/restart-*/node-0/train.log"),
                  key=lambda p: int(p.parent.parent.name.split("-")[1]))
    for log in logs:
        out += [json.loads(line) for line in log.read_text().splitlines()
                if line.startswith('{"event"')]
    return out


def test_a_against_d_one_failure_of_each_kind(cluster: int, tmp_path: Path,  # noqa: F811
                                               request: pytest.FixtureRequest) -> None:
    # D with its spare where jobgen has them (then its node loss sets the host DOWN, and the
    # spare takes its place), else without.
    spare = arms.spares_supported(tmp_path) and cluster >= 3
    # A-cut on the 2-node partition where there is one, D on the default one: both at once.
    side = "side" if "side" in arms.partitions() else ""
    options = {arm: argparse.Namespace(step_delay=0.3, save_delay=SAVE_DELAY, a_delay=0.0,
                                       cred_expire=10.0, timeout=300.0, hang_min=15.0,
                                       collective_timeout=COLLECTIVE_TIMEOUT,
                                       partition=part, spare_partition="")
               for arm, part in (("A-cut", side), ("D", ""))}
    for arm in ("A-cut", "D"):
        (tmp_path / arm).mkdir()
    with ThreadPoolExecutor(2) as pool:
        jobs = {arm: pool.submit(arms.run_arm, arm, 1, tmp_path / arm, options[arm], spare)
                for arm in ("A-cut", "D")}
        runs = {arm: job.result() for arm, job in jobs.items()}
    a, d = runs["A-cut"], runs["D"]
    figures = {arm: f"{r['state']}, utilisation {100 * r['utilisation']:.2f} %, requeues "
                    f"{r['requeues']}, in place {r['in_place']}, " + ", ".join(
                        f"{c} restart {arms._f(v['restart_s'])} s, {arms._f(v['again'], '{:.0f}')}"
                        " step(s) again" for c, v in r["causes"].items())
               + f", stall {r['stall_s']:.2f} s, allocations ended "
               + "/".join(map(str, r["endings"])) for arm, r in runs.items()}
    show_figures(request, "recovery arms (short: A-cut against D)", figures)
    for r in runs.values():
        assert r["state"] == "COMPLETED", r
        assert sorted(f["cause"] for f in r["failures"]) == sorted(arms.CAUSES), r["failures"]
    # A: every failure went back to the scheduler (the hang too: node 0's collective timed out
    # and its flow requeued); nothing restarted in place. More than three requeues can come
    # from A-cut's own method (the StartTime it moves forward can meet the old allocation's
    # revoked credential under load): each ending is shown.
    assert a["in_place"] == 0, a
    assert a["requeues"] >= 3, (a["endings"], a)
    # watch is the fallback for a hang no collective sees: it never acts here (an action would
    # be an alarm on a healthy restart, or the collective timeout not working).
    for arm in runs:
        actions = [line for w in (tmp_path / arm).glob("*.watch")
                   for line in w.read_text().splitlines() if " ACTION " in line]
        assert not actions, (arm, actions, runs[arm]["endings"])
    # D: the killed worker and the hung one restarted in place; the lost node is the spare's
    # where spares exist, else a requeue (the fallback).
    assert d["in_place"] >= (3 if spare else 2), d
    assert d["requeues"] == (0 if spare else 1), d
    if spare:
        out = "".join(f.read_text() for f in (tmp_path / "D").glob("*.out"))
        assert "a spare takes its place" in out, out[-3000:]
    for r in runs.values():
        events = _events(Path(r["run_dir"]))
        sealed: set[int] = set()
        for e in events:
            if e["event"] == "checkpoint":
                sealed.add(e["step"])
                # Sealed only after its last byte: the write takes the slow disk's delay.
                assert e["write_s"] >= SAVE_DELAY * 0.9, e
            if e["event"] == "resume":
                assert e["step"] in sealed, (e, sorted(sealed))
    assert any(e.get("async") for e in _events(Path(d["run_dir"])) if e["event"] == "checkpoint")
    assert not any(e.get("async") for e in _events(Path(a["run_dir"]))
                   if e["event"] == "checkpoint")
