"""The health gate: what jobgen asks the nodes to check (jobgen/job/health.py), and the checks
themselves (payload/common/health.py) run as the nodes run them, as a program with the job's
environment. Devices and EFA are read under a stand-in root (JOBGEN_HEALTH_SYSROOT); the device
tools, chronyc and the collective benchmark are small stand-in programs on PATH. The gate in a
local rehearsal is run for real (`jobgen run --smoke`); on Slurm see test_slurm_e2e.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from jobgen import api
from jobgen.job import health

ROOT = Path(__file__).resolve().parents[1]
HEALTH = ROOT / "payload" / "common" / "health.py"
JOBGEN = Path(sys.executable).parent / "jobgen"


# --- what jobgen renders ------------------------------------------------------------------------

def test_a_trn1_job_checks_devices_efa_storage_and_clock() -> None:
    spec = api.job_spec("neox20b", nodes=4)
    found = health.settings(spec)
    assert found is not None
    assert found["devices"] == {"count": 16, "files": "/dev/neuron*", "command": ["neuron-ls"]}
    assert found["efa_interfaces"] == 8
    from jobgen.job.sizes import checkpoint_bytes
    # One checkpoint must fit (20B parameters x 12 bytes: about 230 GiB) beyond the floor.
    assert found["shared_free_gib"] == pytest.approx(checkpoint_bytes(spec) / 2**30, abs=0.1)
    assert found["clock_max_offset_ms"] == 100
    assert "collective" not in found


def test_gaudi_and_cuda_count_what_their_tool_lists() -> None:
    bert = health.settings(api.job_spec("bert1.5b", nodes=2, backend="batch",
                                        site="dl1-batch"))
    assert bert is not None
    assert bert["devices"]["command"][0] == "hl-smi" and bert["devices"]["count"] == 8
    # dl1-batch attaches one EFA interface per node (batch.efa_interfaces): the gate checks one.
    assert bert["devices"]["files"] == "/dev/hl[0-9]*" and bert["efa_interfaces"] == 1
    from jobgen.inputs.platforms import PLATFORMS
    assert PLATFORMS["p4d.24xlarge"].health.device_command == (
        "nvidia-smi", "--query-gpu=index", "--format=csv,noheader")


def test_a_rehearsal_checks_storage_only_and_says_so() -> None:
    found = health.settings(api.job_spec("llama2-7b", nodes=2, smoke=True))
    assert found is not None
    assert set(found) == {"timeout_s", "max_requeues", "shared_free_gib", "skipped"}
    assert found["skipped"] == ["devices", "EFA", "clock", "collective"]


def test_the_gate_is_turned_off_per_job_and_the_job_carries_no_checks() -> None:
    spec = api.job_spec("neox20b", nodes=2, overrides=["job.health_gate=false"])
    assert health.settings(spec) is None and health.cost_s(spec) == 0
    assert health.describe(spec) == {"enabled": False, "why": "job.health_gate: false"}
    script = api.plan(spec).file().content
    assert "JOBGEN_HEALTH" not in script
    assert "export JOBGEN_HEALTH=" in api.plan(api.job_spec("neox20b", nodes=2)).file().content


def _site(tmp_path: Path, health_yaml: str) -> Path:
    base = (ROOT / "env" / "sites" / "local.yaml").read_text()
    path = tmp_path / "mysite.yaml"
    path.write_text(base.replace("name: local", "name: mysite") + "\nhealth:\n" + health_yaml)
    return path


def test_a_site_overrides_any_value_and_show_lists_the_checks(tmp_path: Path) -> None:
    site = _site(tmp_path, "  efa_interfaces: 0\n  timeout_s: 12\n  max_requeues: 1\n"
                           "  collective_command: [bench, '{nodes}', '{hosts}']\n"
                           "  collective_pattern: 'busbw ([0-9.]+)'\n"
                           "  collective_floor_gbps: 50\n")
    proc = subprocess.run([str(JOBGEN), "show", "neox20b", "--nodes", "2", "--site", str(site),
                           "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    gate = json.loads(proc.stdout)["health_gate"]
    assert gate["enabled"] is True and gate["timeout_s"] == 12
    assert set(gate["checks"]) == {"devices", "shared_storage", "clock", "collective"}
    assert gate["checks"]["collective"] == "`bench {nodes} {hosts}` reaches 50 GB/s"
    assert "at most 1 (health.max_requeues) times" in gate["on_failure"]
    off = _site(tmp_path, "  enabled: false\n")
    spec = api.job_spec("neox20b", nodes=2, site=str(off))
    assert health.describe(spec)["why"] == "site mysite: health.enabled: false"


@pytest.mark.parametrize("bad, says", [
    ("  timeout_s: 0\n", "health.timeout_s: 0 is not between 1 and 600 seconds"),
    ("  max_requeues: 50\n", "health.max_requeues: 50 is not between 0 and 20"),
    ("  local_free_gib: -1\n", "health.local_free_gib: -1.0 must be a finite number, 0 or more"),
    ("  device_files: /etc/passwd\n", "health.device_files: '/etc/passwd' is not a glob of "
                                      "files under /dev"),
    ("  device_count_pattern: '('\n", "health.device_count_pattern: '(' is not a regular "
                                      "expression"),
    ("  collective_command: [bench, '{port}']\n  collective_pattern: '([0-9]+)'\n",
     "health.collective_command: {port} is not one of {nodes}, {workers}, {world}, {hosts}"),
    ("  collective_command: [bench]\n", "health.collective_pattern: a collective_command needs"),
    ("  collective_command: [bench]\n  collective_pattern: 'no group'\n",
     "health.collective_pattern: 'no group' needs a group"),
    ("  device_command: []\n  bogus: 1\n", "health.bogus: unknown key"),
])
def test_bad_site_health_values_are_one_line_errors(tmp_path: Path, bad: str, says: str) -> None:
    site = _site(tmp_path, bad)
    proc = subprocess.run([str(JOBGEN), "render", "neox20b", "--nodes", "2", "--site", str(site)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert str(site) in proc.stderr


# --- the checks on a node -----------------------------------------------------------------------

def _tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def _root(tmp_path: Path, neuron: int = 16, efa: tuple[str, ...] = ("ACTIVE",) * 8) -> Path:
    root = tmp_path / "sysroot"
    (root / "dev").mkdir(parents=True)
    for i in range(neuron):
        (root / "dev" / f"neuron{i}").touch()
    for i, state in enumerate(efa):
        port = root / "sys" / "class" / "infiniband" / f"rdmap{i}s0" / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(f"{4 if state == 'ACTIVE' else 1}: {state}\n")
    return root


def _node(tmp_path: Path, checks: dict[str, Any], *, rank: int = 0, nodes: int = 1,
          root: Optional[Path] = None, tools: Optional[dict[str, str]] = None,
          command: str = "node", extra: Optional[dict[str, str]] = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    for name, body in (tools or {}).items():
        _tool(bin_dir, name, body)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBGEN_", "SLURM"))}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        "JOBGEN_HEALTH": json.dumps(checks), "JOBGEN_NODE_RANK": str(rank),
        "JOBGEN_NNODES": str(nodes), "JOBGEN_IS_MAIN": str(int(rank == 0)),
        "JOBGEN_LOG_DIR": str(tmp_path / "run" / "logs" / "7"),
        "JOBGEN_RUN_DIR": str(tmp_path / "run"), "JOBGEN_COMPILE_CACHE": str(tmp_path / "cache"),
        "JOBGEN_WORKERS_PER_NODE": "32", "FLOW_WHO": f"jobgen[node {rank}]",
        **({"JOBGEN_HEALTH_SYSROOT": str(root)} if root else {}), **(extra or {})})
    return subprocess.run([sys.executable, str(HEALTH), *command.split()], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _report(tmp_path: Path, rank: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (tmp_path / "run" / "logs" / "7" / f"node-{rank}" / "health.json").read_text())
    return data


TRN1 = {"devices": {"count": 16, "files": "/dev/neuron*", "command": ["neuron-ls"]},
        "efa_interfaces": 8, "shared_free_gib": 0.001, "timeout_s": 5, "max_requeues": 3}
CHRONY_OK = ("echo 'Leap status     : Normal'; "
             "echo 'System time     : 0.000012 seconds fast of NTP time'")


def test_a_healthy_trn1_node_passes_every_check_in_well_under_a_minute(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = _node(tmp_path, {**TRN1, "clock_max_offset_ms": 100}, root=_root(tmp_path),
                 tools={"neuron-ls": "echo '| 0 | 2 |'", "chronyc": CHRONY_OK})
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "jobgen[node 0]: health: node 0 (" in proc.stderr and "passed 5 checks" in proc.stderr
    report = _report(tmp_path)
    assert report["ok"] and report["failures"] == []
    assert [p.split(" ")[0] for p in report["passed"]] == ["devices", "efa", "shared", "compile",
                                                           "clock"]
    print(f"healthy gate: {took:.2f} s (its own figure: {report['seconds']} s)")


@pytest.mark.parametrize("neuron, efa, tools, check, seen", [
    (15, ("ACTIVE",) * 8, {"neuron-ls": "true"}, "devices", "15 device files /dev/neuron*"),
    (16, ("ACTIVE",) * 8, {"neuron-ls": "echo 'nd3: device in error' >&2; exit 3"}, "devices",
     "`neuron-ls` exited 3 (nd3: device in error)"),
    (16, ("ACTIVE",) * 7 + ("DOWN",), {"neuron-ls": "true"}, "efa",
     "7 EFA interfaces up (rdmap7s0 down)"),
    (16, ("ACTIVE",) * 8, {"neuron-ls": "sleep 30"}, "devices", "`neuron-ls` took longer than 1 s"),
])
def test_a_bad_node_names_the_check_and_the_value_seen(tmp_path: Path, neuron: int,
                                                       efa: tuple[str, ...], tools: dict[str, str],
                                                       check: str, seen: str) -> None:
    started = time.monotonic()
    proc = _node(tmp_path, {**TRN1, "timeout_s": 1}, rank=1, nodes=2,
                 root=_root(tmp_path, neuron, efa), tools=tools)
    assert time.monotonic() - started < 20          # the tool's time limit, not its sleep
    assert proc.returncode == 75, proc.stderr
    line = [x for x in proc.stderr.splitlines() if "failed" in x]
    assert len(line) == 1 and line[0].startswith("jobgen[node 1]: health: node 1 (")
    assert f"failed {check}: {seen}" in line[0], line[0]
    assert _report(tmp_path, 1)["failures"][0]["check"] == check


def test_a_device_tool_that_lists_too_few_devices_fails_and_a_missing_tool_is_a_note(
        tmp_path: Path) -> None:
    gaudi = {"devices": {"count": 8, "command": ["hl-smi", "-Q", "index", "-f", "csv,noheader"],
                         "count_pattern": r"^\s*[0-9]+\s*$"}, "shared_free_gib": 0, "timeout_s": 5}
    proc = _node(tmp_path, gaudi, tools={"hl-smi": "seq 0 6"})
    assert proc.returncode == 75 and "failed devices: `hl-smi` lists 7; needs 8" in proc.stderr
    proc = _node(tmp_path, gaudi, tools={"hl-smi": "seq 0 7"})
    assert proc.returncode == 0, proc.stderr
    cuda = {"devices": {"count": 8, "command": ["no-such-smi"]}, "shared_free_gib": 0}
    proc = _node(tmp_path, cuda)
    assert proc.returncode == 0 and "devices: no-such-smi not found" in proc.stderr


def test_storage_must_be_writable_with_room(tmp_path: Path) -> None:
    proc = _node(tmp_path, {"shared_free_gib": 10**9})
    assert proc.returncode == 75
    assert "failed shared storage: " in proc.stderr and "needs 1e+09 GiB" in proc.stderr
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = _node(tmp_path, {"shared_free_gib": 0},
                 extra={"JOBGEN_COMPILE_CACHE": str(blocker / "cache")})
    assert proc.returncode == 75
    assert f"failed compile cache: {blocker}/cache is not writable" in proc.stderr
    assert not list((tmp_path / "run").glob(".jobgen-health-*"))   # the probe is removed


@pytest.mark.parametrize("chrony, ok, seen", [
    (CHRONY_OK, True, ""),
    ("echo 'Leap status     : Not synchronised'", False, "chrony: not synchronised"),
    ("echo 'Leap status     : Normal'; echo 'System time     : 0.250000 seconds slow of NTP "
     "time'", False, "250 ms slow (chrony)"),
])
def test_the_clock_is_read_from_chrony(tmp_path: Path, chrony: str, ok: bool, seen: str) -> None:
    proc = _node(tmp_path, {"shared_free_gib": 0, "clock_max_offset_ms": 100},
                 tools={"chronyc": chrony})
    assert (proc.returncode == 0) is ok, proc.stderr
    assert seen in proc.stderr


def _reports(tmp_path: Path, results: list[Optional[tuple[str, list[str]]]]) -> None:
    for rank, item in enumerate(results):
        if item is None:
            continue
        host, failed = item
        folder = tmp_path / "run" / "logs" / "7" / f"node-{rank}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "health.json").write_text(json.dumps({
            "node": rank, "host": host, "ok": not failed, "passed": [], "notes": [],
            "failures": [{"check": c, "seen": "x", "needs": "y"} for c in failed]}))


def test_the_verdict_names_the_hosts_to_leave_out_and_records_them(tmp_path: Path) -> None:
    _reports(tmp_path, [("n1", []), ("n2", ["devices"]), ("n3", []), ("n4", ["efa"])])
    proc = _node(tmp_path, TRN1, nodes=4, command="verdict --requeues 0",
                 extra={"SLURM_JOB_ID": "41", "SLURM_RESTART_COUNT": "0"})
    assert proc.returncode == 75 and proc.stdout == "n2,n4\n"
    assert "node 1 (n2) failed devices: x; node 3 (n4) failed efa: x" in proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "run" / "jobgen-health.jsonl").read_text()
             .splitlines()]
    assert [(x["job"], x["node"], x["host"], x["check"]) for x in lines] == [
        ("41", 1, "n2", "devices"), ("41", 3, "n4", "efa")]
    assert lines[0]["action"] == "left out n2,n4; requeued"


def test_the_verdict_gives_up_after_max_requeues_and_blames_a_setting_not_every_node(
        tmp_path: Path) -> None:
    _reports(tmp_path, [("n1", []), ("n2", ["devices"])])
    proc = _node(tmp_path, TRN1, nodes=2, command="verdict --requeues 3")
    assert proc.returncode == 76 and proc.stdout == ""
    assert "requeued for health 3 times (health.max_requeues 3): giving up" in proc.stderr
    _reports(tmp_path, [("n1", ["clock"]), ("n2", ["clock"])])
    proc = _node(tmp_path, TRN1, nodes=2, command="verdict --requeues 0")
    assert proc.returncode == 78 and "every node failed clock - a setting, not a node" in \
        proc.stderr
    _reports(tmp_path, [("n1", [])] + [None])
    (tmp_path / "run" / "logs" / "7" / "node-1" / "health.json").unlink()
    proc = _node(tmp_path, {**TRN1, "timeout_s": 1}, nodes=2, command="verdict --requeues 0")
    assert proc.returncode == 1 and "node(s) 1 did not report" in proc.stderr
    _reports(tmp_path, [("n1", []), ("n2", [])])
    proc = _node(tmp_path, TRN1, nodes=2, command="verdict --requeues 0")
    assert proc.returncode == 0 and proc.stdout == ""


@pytest.mark.parametrize("floor, status, says", [
    (10, 0, "reached 12.5 GB/s"),
    (20, 1, "reached 12.5 GB/s; needs 20 GB/s (a slow link"),
])
def test_the_collective_test_must_reach_its_floor(tmp_path: Path, floor: float, status: int,
                                                  says: str) -> None:
    _reports(tmp_path, [("n1", []), ("n2", [])])
    checks = {"collective": {"command": ["bench", "{nodes}", "{world}", "{hosts}"],
                             "pattern": r"busbw ([0-9.]+)", "floor_gbps": floor}}
    proc = _node(tmp_path, checks, nodes=2, command="collective",
                 tools={"bench": 'echo "args $*"; echo "busbw 40.0"; echo "busbw 12.5"'})
    assert proc.returncode == status, proc.stderr
    assert says in proc.stderr


def test_a_rehearsal_stops_before_the_compile_pass_naming_the_node_and_the_check(
        tmp_path: Path) -> None:
    """`jobgen run llama2-7b --nodes 2 --smoke` with node 1 unhealthy: stopped within seconds,
    before any pass, with the node, the check and the run's health record."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBGEN_")}
    env["JOBGEN_SMOKE_UNHEALTHY_NODE"] = "1"
    env["JOBGEN_STATE_DIR"] = str(tmp_path / "state")
    started = time.monotonic()
    proc = subprocess.run([str(JOBGEN), "run", "llama2-7b", "--nodes", "2", "--smoke"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    took = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 75, out
    assert "[node 1] jobgen[local node 1]: health: node 1 (" in out
    assert "failed devices: 15 of 16 present (faked: JOBGEN_SMOKE_UNHEALTHY_NODE=1)" in out
    assert "the job stops before the compile pass" in out
    assert "compile pass" not in out.replace("before the compile pass", "")
    run = tmp_path / "jobgen-runs" / "llama2-7b-2n-smoke"
    assert not list(run.glob("logs/*/node-*/compile.log"))
    (line,) = (run / "jobgen-health.jsonl").read_text().splitlines()
    assert json.loads(line)["node"] == 1 and json.loads(line)["action"] == "stopped"
    assert took < 60, f"the gate took {took:.1f} s"

    print(f"rehearsal stopped by the gate after {took:.1f} s")


def test_plan_counts_the_gate_in_every_restart() -> None:
    def plan(*extra: str) -> dict[str, Any]:
        proc = subprocess.run([str(JOBGEN), "plan", "neox20b", "--json", *extra],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout)
        return result

    on, off = plan(), plan("--set", "job.health_gate=false")
    cost = health.cost_s(api.job_spec("neox20b"))
    assert cost == 20
    assert on["restart_basis"].endswith(f"+ health gate {cost:g} s")
    assert "health gate" not in off["restart_basis"]
    for with_gate, without in zip(on["rows"], off["rows"]):
        assert with_gate["failures"]["restart_s"] == pytest.approx(
            without["failures"]["restart_s"] + cost)


def test_gaudi_device_files_are_the_cards_only(tmp_path: Path) -> None:
    from conftest import healthy_node
    root = healthy_node(tmp_path / "node")           # hl0..hl7 and hl_controlD0
    gaudi = {"devices": {"count": 8, "files": "/dev/hl[0-9]*"}, "shared_free_gib": 0}
    assert _node(tmp_path, gaudi, root=root).returncode == 0
    (root / "dev" / "hl7").unlink()
    proc = _node(tmp_path, gaudi, root=root)
    assert proc.returncode == 75 and "failed devices: 7 device files /dev/hl[0-9]*" in proc.stderr


def test_the_gate_checks_the_efa_interfaces_the_site_gives_a_node(tmp_path: Path) -> None:
    import yaml
    site = yaml.safe_load((ROOT / "env" / "sites" / "dl1-batch.yaml").read_text())
    site["name"] = "two-efa"
    site["batch"]["efa_interfaces"] = {"dl1.24xlarge": 2}
    path = tmp_path / "two-efa.yaml"
    path.write_text(yaml.safe_dump(site))
    spec = api.job_spec("bert1.5b", nodes=2, backend="batch", site=str(path))
    found = health.settings(spec)
    assert found is not None and found["efa_interfaces"] == 2
    site["health"] = {"efa_interfaces": 0}         # the site's health section wins
    path.write_text(yaml.safe_dump(site))
    found = health.settings(api.job_spec("bert1.5b", nodes=2, backend="batch", site=str(path)))
    assert found is not None and "efa_interfaces" not in found
