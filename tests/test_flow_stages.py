"""Each stage of the node flow (payload/common/flow/*.sh) on its own: base.sh and one stage file
sourced in a bare bash, its functions called with the inputs that decide them. The whole flow
runs in test_job_flow.py, test_entrypoint.py, test_hostile.py and test_slurm_e2e.py."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMON = ROOT / "payload" / "common"
STAGES = COMMON / "flow"


def stage(name: str, *words: str, env: dict[str, str] | None = None,
          script: str = '"$@"') -> subprocess.CompletedProcess[str]:
    """`source base.sh; source NAME.sh`, then SCRIPT (default: the words as a command)."""
    text = f'source "{STAGES}/base.sh" && source "{STAGES}/{name}.sh" && {{ {script}\n}}'
    return subprocess.run(["bash", "-c", text, "stage", *words],
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True,
                          text=True, timeout=30, check=False)


def test_every_stage_file_loads_alone_and_is_short() -> None:
    names = sorted(p.stem for p in STAGES.glob("*.sh"))
    assert names == ["base", "compile", "contract", "gate", "node", "pass", "requeue",
                     "signals", "slurm", "status"]
    for name in names:
        proc = stage(name, script="true")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), name
        assert len((STAGES / f"{name}.sh").read_text().splitlines()) < 300, name
    assert len((COMMON / "job_flow.sh").read_text().splitlines()) < 300


def test_an_entrypoints_refusal_names_the_node_and_exits_with_its_status() -> None:
    proc = stage("base", "flow_fail", "no luck", "78", env={"FLOW_WHO": "jobgen[eks pod 2]"})
    assert (proc.returncode, proc.stderr) == (78, "jobgen[eks pod 2]: no luck\n")
    assert stage("base", "flow_fail", "no luck").returncode == 1


# --- the compile decision (compile.sh) ---------------------------------------------------------

@pytest.mark.parametrize("mode,marker,passes,controller,expected", [
    ("auto", False, "both", "", "1"),
    ("auto", True, "both", "", "0"),          # this spec's graphs are in the cache
    ("always", True, "both", "", "1"),
    ("never", False, "both", "", "0"),
    ("auto", False, "train", "", "0"),        # the compile pass ran in a job of its own
    ("auto", True, "both", "1", "1"),         # the controller decided for every node
    ("auto", False, "both", "0", "0"),
])
def test_the_compile_decision(tmp_path: Path, mode: str, marker: bool, passes: str,
                              controller: str, expected: str) -> None:
    cache = tmp_path / "cache"
    if marker:
        (cache / ".jobgen").mkdir(parents=True)
        (cache / ".jobgen" / "key1.done").write_text("2026-01-01T00:00:00Z\n")
    env = {"JOBGEN_COMPILE_CACHE": str(cache), "JOBGEN_COMPILE_KEY": "key1",
           "JOBGEN_COMPILE_MODE": mode, "JOBGEN_PASSES": passes}
    if controller:
        env["JOBGEN_RUN_COMPILE"] = controller
    proc = stage("compile", env=env,
                 script='flow_decide_compile && echo "$FLOW_RUN_COMPILE $FLOW_MARKER"')
    assert proc.stdout == f"{expected} {cache}/.jobgen/key1.done\n", proc.stderr


def test_the_marker_is_written_whole_and_names_the_key(tmp_path: Path) -> None:
    env = {"JOBGEN_COMPILE_CACHE": str(tmp_path / "cache"), "JOBGEN_COMPILE_KEY": "key1",
           "JOBGEN_COMPILE_MODE": "auto", "JOBGEN_PASSES": "both"}
    proc = stage("compile", env=env, script="flow_decide_compile && flow_mark_compiled && "
                 "flow_decide_compile && echo $FLOW_RUN_COMPILE")
    assert proc.stdout == "0\n" and "compile cache marker written" in proc.stderr
    assert [p.name for p in (tmp_path / "cache" / ".jobgen").iterdir()] == ["key1.done"]


def test_the_cache_variable_takes_the_folder_and_its_suffix() -> None:
    env = {"JOBGEN_CACHE_VAR": "PT_HPU_RECIPE_CACHE_CONFIG", "JOBGEN_CACHE_SUFFIX": ",false,1024"}
    proc = stage("compile", "/c", env=env,
                 script='flow_use_cache "$1" && printenv PT_HPU_RECIPE_CACHE_CONFIG')
    assert proc.stdout == "/c,false,1024\n"


# --- requeue accounting (requeue.sh) ------------------------------------------------------------

@pytest.mark.parametrize("allocation,limits,health,expected", [
    ("0", None, None, "0"),
    ("5", None, None, "5"),
    ("5", "2", "1", "2"),       # requeues at the time limit and for a bad node are not failures
    ("1", "3", None, "0"),      # never below 0
    ("4", "junk", "", "4"),     # a count file that holds no count counts nothing
])
def test_restarts_after_failures(tmp_path: Path, allocation: str, limits: str | None,
                                 health: str | None, expected: str) -> None:
    for name, value in (("time-limit-requeues", limits), ("health-requeues", health)):
        if value is not None:
            (tmp_path / name).write_text(value + "\n")
    proc = stage("requeue", "flow_failure_restarts", str(tmp_path), allocation)
    assert proc.stdout == expected + "\n", proc.stderr


def test_a_bad_node_stops_the_requeues_like_a_configuration_error(tmp_path: Path) -> None:
    env = {"JOBGEN_MAX_RESTARTS": "5"}
    assert stage("requeue", "flow_restart_decision", "75", "0", env=env).stdout == "stop\n"
    marker = tmp_path / "requeued"
    proc = stage("requeue", "flow_finish", "75", "health gate", "0", "touch", str(marker),
                 env=env)
    assert proc.returncode == 75 and not marker.exists()
    assert "a node is unhealthy (status 75" in proc.stderr
    proc = stage("requeue", "flow_finish", "0", "training pass", "0", "touch", str(marker))
    assert (proc.returncode, proc.stderr) == (0, "") and not marker.exists()


# --- the status rules (status.sh) ---------------------------------------------------------------

@pytest.mark.parametrize("nodes,srun,expected", [
    ({0: "75 health", 1: "143 health"}, 143, "75 health gate"),
    ({0: "0 compile"}, 0, "0 compile pass"),      # a compile-only job
    ({0: "137 train", 1: "0 train"}, 137, "137 training pass"),
    ({0: "0 gang", 1: "0"}, 0, "0 gang"),
])
def test_the_status_rules(tmp_path: Path, nodes: dict[int, str], srun: int,
                          expected: str) -> None:
    for rank, line in nodes.items():
        (tmp_path / f"node-{rank}").mkdir()
        (tmp_path / f"node-{rank}" / "job.status").write_text(line + "\n")
    proc = stage("status", "flow_job_status", str(srun), env={"JOBGEN_LOG_DIR": str(tmp_path)})
    assert proc.stdout == expected + "\n", proc.stderr


def test_a_node_records_how_it_ended_and_returns_that_status(tmp_path: Path) -> None:
    (tmp_path / "node-3").mkdir()
    env = {"JOBGEN_LOG_DIR": str(tmp_path), "JOBGEN_NODE_RANK": "3"}
    proc = stage("status", "flow_node_end", "78", "compile", env=env)
    assert proc.returncode == 78
    assert (tmp_path / "node-3" / "job.status").read_text() == "78 compile\n"


# --- signals and stop records (signals.sh, with pass.sh's state) --------------------------------

@pytest.mark.parametrize("text,seconds", [
    ("1-02:03:04", "93784"), ("02:03:04", "7384"), ("05:00", "300"), ("45", "45"),
    ("08:09", "489"), ("UNLIMITED", ""), ("NOT_SET", ""), ("", ""), ("1:2:3:4", "")])
def test_squeue_time_left_in_seconds(text: str, seconds: str) -> None:
    proc = stage("signals", "flow_seconds", text)
    assert proc.stdout.strip() == seconds and proc.returncode == 0


TRAINER = """trap 'echo "$1" > "$2"; exit 0' USR1
echo ready > "$2.ready"
while :; do sleep 0.1; done
"""


def signal_a_pass(tmp_path: Path, pass_name: str, start: str) -> subprocess.CompletedProcess[str]:
    """A trainer started as the pass PASS_NAME (by START), then flow_on_signal TERM."""
    (tmp_path / "logs" / "node-0").mkdir(parents=True)
    (tmp_path / "trainer.sh").write_text(TRAINER)
    script = (f'FLOW_PASS={pass_name}; {start} bash "$1/trainer.sh" child "$1/got" & '
              'FLOW_PASS_PID=$!; while [ ! -e "$1/got.ready" ]; do sleep 0.05; done; '
              'flow_on_signal TERM; wait "$FLOW_PASS_PID"; echo "status $? $FLOW_STOPPING"')
    env = {"JOBGEN_LOG_DIR": str(tmp_path / "logs"), "JOBGEN_NODE_RANK": "0",
           "JOBGEN_STOP_SIGNAL": "USR1"}
    return subprocess.run(["bash", "-c", f'source "{STAGES}/base.sh" && source '
                           f'"{STAGES}/pass.sh" && source "{STAGES}/signals.sh" && {script}',
                           "stage", str(tmp_path)], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=30, check=False)


def test_sigterm_during_training_writes_the_stop_request_then_signals_every_trainer(
        tmp_path: Path) -> None:
    """The trainers' stop request: the file first (a trainer still starting reads it), then
    JOBGEN_STOP_SIGNAL to every process below the pass, not SIGTERM."""
    proc = signal_a_pass(tmp_path, "train", "")
    assert proc.stdout == "status 0 TERM\n", proc.stderr
    assert (tmp_path / "got").read_text() == "child\n"
    assert (tmp_path / "logs" / "node-0" / "stop-requested").exists()
    assert "asking the trainers to save a checkpoint and stop (SIGUSR1)" in proc.stderr


def test_sigterm_outside_training_stops_the_pass(tmp_path: Path) -> None:
    proc = signal_a_pass(tmp_path, "compile", "setsid")    # the pass's own session, as run
    assert proc.stdout == f"status {128 + signal.SIGTERM} TERM\n", proc.stderr
    assert not (tmp_path / "got").exists()
    assert not (tmp_path / "logs" / "node-0" / "stop-requested").exists()
    assert "received SIGTERM; stopping the running pass" in proc.stderr


def test_the_process_tree_holds_the_pass_and_everything_below_it() -> None:
    script = ('bash -c "sleep 30 & sleep 30 & wait" & top=$!; sleep 0.5; '
              'tree=$(flow_tree "$top"); echo "$top" $tree; kill $tree')
    proc = stage("signals", script=script)
    top, *tree = proc.stdout.split()
    assert len(tree) == 3 and tree[0] == top, proc.stdout + proc.stderr


# --- one pass (pass.sh) -------------------------------------------------------------------------

LAUNCHER = """echo "$@" >> "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/$1.log"
[ -z "${SAY:-}" ] || echo "$SAY" >> "$JOBGEN_LOG_DIR/node-$JOBGEN_NODE_RANK/$1.log"
exit "${STATUS:-0}"
"""


@pytest.mark.parametrize("status,say,hint", [
    ("0", "", False), ("3", "", False),
    ("1", "[c10d] waiting for clients to join", True)])
def test_a_pass_runs_the_launcher_and_records_its_times(tmp_path: Path, status: str, say: str,
                                                        hint: bool) -> None:
    (tmp_path / "node-0").mkdir()
    (tmp_path / "launch.sh").write_text(LAUNCHER)
    env = {"JOBGEN_LOG_DIR": str(tmp_path), "JOBGEN_NODE_RANK": "0", "STATUS": status,
           "SAY": say, "JOBGEN_NNODES": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    proc = stage("pass", "flow_node_pass", "train", "--a", "b c", env=env,
                 script=f'FLOW_LAUNCHER="{tmp_path}/launch.sh" && "$@"')
    assert proc.returncode == int(status)
    assert (tmp_path / "node-0" / "train.log").read_text().splitlines()[0] == "train --a b c"
    times = (tmp_path / "node-0" / "train.times").read_text().split("\n")
    assert times[0].startswith("launch ") and times[1].startswith("exit ")
    assert times[1].endswith(f" {status}")
    assert ("could not bring the 2 nodes together" in proc.stderr) == hint


# --- the health gate (gate.sh) ------------------------------------------------------------------

FAKE_PYTHON = """echo "${1##*/} $2" >> "$CALLS"
case $2 in node) exit "${NODE_STATUS:-0}" ;; wait) exit "${WAIT_STATUS:-0}" ;; esac
"""


@pytest.mark.parametrize("health,is_main,shared,node,wait,calls,status", [
    ("", "1", "1", "0", "0", [], 0),                     # nothing to check
    ("devices", "0", "0", "0", "0", ["node"], 0),
    ("devices", "1", "0", "0", "0", ["node", "collective"], 0),
    ("devices", "0", "1", "0", "0", ["node", "wait"], 0),
    ("devices", "1", "1", "0", "75", ["node", "wait"], 75),   # another node is bad
    ("devices", "1", "0", "78", "0", ["node"], 78),
])
def test_the_health_gate_on_a_node(tmp_path: Path, health: str, is_main: str, shared: str,
                                   node: str, wait: str, calls: list[str], status: int) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/bash\n" + FAKE_PYTHON)
    fake.chmod(0o755)
    env = {"JOBGEN_HEALTH": health, "JOBGEN_PAYLOAD_DIR": str(tmp_path), "CALLS":
           str(tmp_path / "calls"), "NODE_STATUS": node, "WAIT_STATUS": wait}
    proc = stage("gate", "flow_health_gate", is_main, shared, env=env,
                 script=f'FLOW_PYTHON="{fake}" && "$@"')
    assert proc.returncode == status, proc.stderr
    done = (tmp_path / "calls").read_text().split("\n") if calls else []
    assert [line.split()[1] for line in done if line] == calls
    assert all(line.startswith("health.py ") for line in done if line)


def test_a_controller_that_ran_the_gate_is_not_asked_again(tmp_path: Path) -> None:
    env = {"JOBGEN_HEALTH": "devices", "JOBGEN_HEALTH_DONE": "1"}
    proc = stage("gate", "flow_health_gate", "1", "1", env=env,
                 script='FLOW_PYTHON=/bin/false && "$@"')
    assert proc.returncode == 0


# --- the data check before the compile pass (contract.sh) --------------------------------------

@pytest.mark.parametrize("is_main, shared, want, status", [
    ("1", "1", "missing", 78),   # the main node of a shared disk checks (the others wait: below)
    ("0", "0", "missing", 78),   # every node checks its own disk
    ("1", "1", "", 0),           # a job that reads no dataset (a rehearsal's made-up batches)
])
def test_the_data_check_before_the_compile_pass(tmp_path: Path, is_main: str, shared: str,
                                                want: str, status: int) -> None:
    import json
    import sys
    data = json.dumps({"format": "megatron", "recipe": "recipes/neox20b.yaml",
                       "key": "data.path", "seq_length": 8, "vocab_size": 100,
                       "global_batch": 1, "planned_samples": 1,
                       "prefixes": [str(tmp_path / "gpt2" / "my-gpt2_text_document")]})
    env = {"JOBGEN_DATA": data if want else "", "JOBGEN_PAYLOAD_DIR": str(ROOT / "payload"),
           "JOBGEN_LOG_DIR": str(tmp_path)}
    proc = stage("contract", "flow_data_check", is_main, shared, env=env,
                 script=f'FLOW_PYTHON="{sys.executable}" && "$@"')
    assert proc.returncode == status, proc.stderr
    if status:
        assert f"{tmp_path}/gpt2/my-gpt2_text_document.idx: missing" in proc.stderr
        assert proc.stderr.rstrip().endswith("the data check failed; no pass started")
    else:
        assert proc.stderr == ""
    # The main node of a shared disk publishes its verdict for the others; no other node does.
    verdict = tmp_path / "data.verdict"
    assert (verdict.read_text() == "78 /\n") if (want and shared == "1") else not verdict.exists()


def test_the_other_nodes_of_a_shared_disk_wait_for_the_main_nodes_data_verdict(
        tmp_path: Path) -> None:
    """A node that is not the main one starts nothing until the main node's verdict is in the
    attempt's log folder, then stops as it did; a verdict of another attempt is not this one's,
    and the wait is bounded by the rendezvous timeout."""
    import sys
    data = '{"format": "megatron", "seq_length": 8, "prefixes": ["%s"]}' % (tmp_path / "none")
    env = {"JOBGEN_DATA": data, "JOBGEN_PAYLOAD_DIR": str(ROOT / "payload"),
           "JOBGEN_LOG_DIR": str(tmp_path), "JOBGEN_RDZV_TIMEOUT": "20", "JOBGEN_ATTEMPT": "3"}
    text = f'source "{STAGES}/base.sh" && source "{STAGES}/contract.sh" && ' \
        f'FLOW_PYTHON="{sys.executable}" && flow_data_check "$@"'
    other = subprocess.Popen(["bash", "-c", text, "stage", "0", "1"], text=True,
                             env={"PATH": "/usr/bin:/bin", **env}, stderr=subprocess.PIPE)
    main = stage("contract", "flow_data_check", "1", "1", env=env,
                 script=f'FLOW_PYTHON="{sys.executable}" && "$@"')
    assert main.returncode == 78 and "none.idx: missing" in main.stderr
    _, said = other.communicate(timeout=30)
    assert other.returncode == 78, said
    assert said == "jobgen: the main node's data check failed (its log says why); no pass " \
                   "started\n"
    for verdict, status, line in (
            ("0 3/\n", 0, ""),
            ("0 2/\n", 1, f"no verdict of the main node's data check in {tmp_path}/data.verdict "
                          "within 1 s; no pass started"),
            ("1 3/\n", 1, "the main node's data check could not run (status 1)")):
        (tmp_path / "data.verdict").write_text(verdict)
        proc = stage("contract", "flow_data_check", "0", "1",
                     env={**env, "JOBGEN_RDZV_TIMEOUT": "1"}, script='FLOW_PYTHON=false && "$@"')
        assert proc.returncode == status and line in proc.stderr, proc.stderr


# --- the contract (contract.sh) -----------------------------------------------------------------

def test_the_contract_names_what_is_missing() -> None:
    proc = stage("contract", "flow_init", env={"FLOW_CONTRACT_FROM": "the pod's environment"})
    assert proc.returncode == 1
    assert proc.stderr.startswith("jobgen: not set by the pod's environment: MASTER_PORT ")


# --- where the stages are found (job_flow.sh) ---------------------------------------------------

def test_the_stages_come_from_the_flow_scripts_own_folder(tmp_path: Path) -> None:
    """A snapshot's job_flow.sh loads the snapshot's stage files, from any working directory
    and by a relative path too; without them it says so and ends with 78, not half a flow."""
    copy = tmp_path / "snap" / "common"
    copy.mkdir(parents=True)
    shutil.copy(COMMON / "job_flow.sh", copy)
    shutil.copytree(STAGES, copy / "flow")
    with (copy / "flow" / "status.sh").open("a") as f:
        f.write('flow_which() { echo snapshot; }\n')
    for cwd, path in ((tmp_path, "snap/common/job_flow.sh"), (copy, "job_flow.sh"),
                      (ROOT, str(copy / "job_flow.sh"))):
        proc = subprocess.run(["bash", "-c", 'source "$0" && cd / && flow_which', path],
                              cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
        assert proc.stdout == "snapshot\n", (cwd, path, proc.stderr)
    os.remove(copy / "flow" / "gate.sh")
    proc = subprocess.run(["bash", "-c", 'source "$0"; echo "sourced $?"',
                           str(copy / "job_flow.sh")], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.stdout == "sourced 78\n"
    assert "a stage file is missing" in proc.stderr
    proc = subprocess.run(["bash", str(copy / "job_flow.sh"), "node", "0"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 78 and "a stage file is missing" in proc.stderr
