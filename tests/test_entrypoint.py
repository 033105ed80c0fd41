"""The AWS Batch container entrypoint (env/containers/entrypoint.sh), run on this machine.

Batch starts the job definition's command on every node with the AWS_BATCH_* variables set; here
each "node" is one entrypoint process with the variables Batch would give it: node 0 is the main
node (its own address from interface `lo`: 127.0.0.1), node 1 a child that finds the main node in
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS. The command and the environment are taken from the
job definition jobgen renders, except that payload/ and the entrypoint are this checkout's (the
image has them under /opt/jobgen).

Two groups of tests:
- plumbing, with a stand-in launcher that records what it was given (fast, no torch needed);
- the real thing: the smoke BERT job definition trained with DeepSpeed on CPU by two entrypoints
  (marked deepspeed and slow), and a node whose peer never comes (torchrun, slow).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobgen.images import snapshot

ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = ROOT / "env" / "containers" / "entrypoint.sh"
PAYLOAD = ROOT / "payload"
BIN_DIR = Path(sys.executable).parent
PREFIX0 = "jobgen[batch node 0]:"
PREFIX1 = "jobgen[batch node 1]:"

if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from common import checkpoints
from common.events import read_events

_NO_PRIVILEGE = r"""#!/bin/sh
echo "$(basename "$0") stand-in: permission denied (a container without privileges)" >&2
exit 1
"""


def no_privilege_bin() -> Path:
    """A folder with `sudo` and `sysctl` that fail, put first on the nodes' PATH: node_launch.sh
    tries to reserve MASTER_PORT with sysctl, which as root here would change this machine's
    net.ipv4.ip_local_reserved_ports; in a non-privileged container it fails, and must not stop
    the job."""
    folder = Path(tempfile.gettempdir()) / f"jobgen-test-no-privilege-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    for name in ("sudo", "sysctl"):
        path = folder / name
        if not path.exists():
            tmp = folder / f".{name}.{os.getpid()}"
            tmp.write_text(_NO_PRIVILEGE)
            tmp.chmod(0o755)
            os.replace(tmp, path)
    return folder


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the rendered job definition -----------------------------------------------------------------

@dataclass(frozen=True)
class Definition:
    command: list[str]          # the container command: entrypoint, launcher, argc, args...
    env: dict[str, str]         # the container environment

    @property
    def compile_argc(self) -> int:
        return int(self.command[2])

    @property
    def compile_args(self) -> list[str]:
        return self.command[3:3 + self.compile_argc]

    @property
    def train_args(self) -> list[str]:
        return self.command[3 + self.compile_argc:]


_DEFINITION: Definition | None = None


def smoke_definition() -> Definition:
    """`jobgen render bert1.5b --backend batch --nodes 2 --smoke --site local`, via the API."""
    global _DEFINITION
    if _DEFINITION is None:
        from jobgen import api
        from jobgen.backends.batch import backend as batch

        spec = api.job_spec("bert1.5b", 2, site="local", backend="batch", smoke=True)
        jd = batch.job_definition(spec)
        container = jd["nodeProperties"]["nodeRangeProperties"][0]["container"]
        _DEFINITION = Definition(list(container["command"]),
                                 {e["name"]: e["value"] for e in container["environment"]})
    return _DEFINITION


_IMAGE_COPY: list[Path] = []


def image_copy() -> Path:
    """This checkout's payload as an image holds it (`jobgen image-context`): a copy with its
    digest file, made once per test session."""
    if not _IMAGE_COPY:
        import tempfile
        root = Path(tempfile.mkdtemp(prefix="jobgen-image-"))
        _IMAGE_COPY.append(snapshot.export(root / "payload"))
    return _IMAGE_COPY[0]


def node_env(defn: Definition, index: int, *, port: int, job_id: str = "job-1", attempt: int = 1,
             payload: Path | None = None, nodes: int = 2,
             extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment Batch gives node `index`: this process's own environment without any
    AWS_BATCH_*/JOBGEN_*/SLURM_* leftovers, then the job definition's, then the MNP variables.
    `extra` is applied last; a value of None removes the variable."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_BATCH_", "JOBGEN_", "SLURM_", "MASTER_", "STUB_"))}
    env.update(defn.env)
    payload = payload or image_copy()
    # The image's payload/ (/opt/jobgen/payload) is this checkout's payload/ here: the override
    # wins over every value of the definition that points into it (JOBGEN_WORKDIR too).
    image_payload = defn.env["JOBGEN_PAYLOAD_DIR"].rstrip("/")
    for key, value in list(env.items()):
        if value == image_payload or value.startswith(image_payload + "/"):
            env[key] = str(payload) + value[len(image_payload):]
    env.update({
        "JOBGEN_PAYLOAD_DIR": str(payload),
        # The payload the job was rendered with is the one this stand-in image holds.
        "JOBGEN_PAYLOAD_DIGEST": (payload / snapshot.MARKER).read_text().strip(),
        "MASTER_PORT": str(port),
        "PATH": os.pathsep.join([str(no_privilege_bin()), str(BIN_DIR),
                                 os.environ.get("PATH", "/usr/bin:/bin")]),
        "AWS_BATCH_JOB_ID": f"{job_id}#{index}",
        "AWS_BATCH_JOB_ATTEMPT": str(attempt),
        "AWS_BATCH_JOB_NODE_INDEX": str(index),
        "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0",
        "AWS_BATCH_JOB_NUM_NODES": str(nodes),
        "JOBGEN_RDZV_TIMEOUT": "60",   # a failed test must not wait 15 minutes for a peer
    })
    if index == 0:
        env["JOBGEN_NET_IFACE"] = "lo"
    else:
        env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.1"
    for name, setting in (extra or {}).items():
        if setting is None:
            env.pop(name, None)
        else:
            env[name] = setting
    return env


# --- running entrypoints -------------------------------------------------------------------------

@dataclass
class NodeRun:
    index: int                  # position in the list of environments
    returncode: int
    output: str
    seconds: float

    def lines(self, prefix: str) -> list[str]:
        return [line[len(prefix):].strip() for line in self.output.splitlines()
                if line.startswith(prefix)]

    def events(self) -> list[dict[str, Any]]:
        return read_events(self.output)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop an entrypoint that overran: TERM (it forwards it to its pass), then KILL whatever of
    its process tree is left."""
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=20)
    with contextlib.suppress(Exception):   # psutil missing, or the processes already gone
        import psutil

        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def start_node(cwd: Path, argv: Sequence[str], env: Mapping[str, str],
               out: Path) -> subprocess.Popen[bytes]:
    """One entrypoint, its output (stdout and stderr) to a file: a full pipe would stall a node
    while its peer waits for it."""
    with open(out, "wb") as handle:
        return subprocess.Popen([str(ENTRYPOINT), *argv], cwd=cwd, env=dict(env), stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def run_nodes(cwd: Path, argv: Sequence[str], envs: Sequence[Mapping[str, str]],
              timeout: float = 240, tag: str = "run") -> list[NodeRun]:
    """Start one entrypoint per environment at the same time and wait for all of them."""
    cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    outs = [cwd / f"{tag}-node{i}.out" for i in range(len(envs))]
    procs = [start_node(cwd, argv, env, out) for env, out in zip(envs, outs)]
    deadline = started + timeout
    results = []
    overran = []
    for i, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            overran.append(i)
            _stop(proc)
        elapsed = time.monotonic() - started
        text = outs[i].read_bytes().decode("utf-8", "replace")
        results.append(NodeRun(i, proc.returncode, text, elapsed))
    if overran:
        detail = "\n".join(f"--- node {r.index} ---\n{r.output[-6000:]}" for r in results)
        pytest.fail(f"entrypoint(s) {overran} still running after {timeout} s\n{detail}")
    return results


def show(runs: Sequence[NodeRun]) -> str:
    return "\n".join(f"--- node {r.index} (status {r.returncode}) ---\n{r.output[-8000:]}"
                     for r in runs)


# --- plumbing, with a stand-in launcher -----------------------------------------------------------

FAKE_LAUNCHER = r"""#!/usr/bin/env bash
# Stand-in for payload/<payload>/launch.sh: records its pass, arguments and environment as one
# JSON line in $FAKE_RECORD, then exits with $FAKE_EXIT_<PASS> (default 0). With FAKE_SLEEP it
# first sleeps that long, recording a TERM it receives. With FAKE_SAVE_ON=SIG its training pass
# waits (60 s at most) for that signal, records whether it came, and exits 0 (saved, stopped).
# With FAKE_BARRIER it first waits (20 s at most) until all JOBGEN_NNODES nodes have reached the
# same pass, as torchrun's rendezvous does.
pass=$1
shift
if [ -n "${FAKE_BARRIER:-}" ]; then
  mkdir -p "$FAKE_BARRIER/$pass" && touch "$FAKE_BARRIER/$pass/$JOBGEN_NODE_RANK"
  for _ in $(seq 200); do
    [ "$(ls "$FAKE_BARRIER/$pass" | wc -l)" -ge "$JOBGEN_NNODES" ] && break
    sleep 0.1
  done
fi
if [ -n "${FAKE_SAVE_ON:-}" ] && [ "$pass" = train ]; then
  # A trainer that saves on its stop signal: Python, since the flow's shells leave that signal
  # ignored (bash cannot trap a signal ignored on entry; Python can).
  exec python3 - "$pass" <<'EOF'
import json, os, signal, sys, time
got = []
signal.signal(getattr(signal, "SIG" + os.environ["FAKE_SAVE_ON"]), lambda s, f: got.append(s))
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    f.write(json.dumps({"pass": sys.argv[1], "waiting": True}) + "\n")
deadline = time.time() + 60
while not got and time.time() < deadline:
    time.sleep(0.1)
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    saved = os.environ["FAKE_SAVE_ON"] if got else None
    f.write(json.dumps({"pass": sys.argv[1], "saved_on": saved}) + "\n")
EOF
fi
if [ -n "${FAKE_SLEEP:-}" ]; then
  trap 'echo "{\"pass\": \"'"$pass"'\", \"signal\": \"TERM\"}" >> "$FAKE_RECORD"; exit 143' TERM
  sleep "$FAKE_SLEEP" &
  wait
fi
python3 - "$pass" "$@" <<'EOF'
import json, os, sys
keep = ("MASTER_ADDR", "MASTER_PORT", "JOBGEN_NODE_RANK", "JOBGEN_NNODES", "JOBGEN_LOG_DIR",
        "JOBGEN_RUN_DIR", "JOBGEN_RDZV_TIMEOUT", "JOBGEN_PAYLOAD_DIR")
record = {"pass": sys.argv[1], "args": sys.argv[2:], "cwd": os.getcwd(),
          "env": {k: os.environ.get(k) for k in keep}}
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")
EOF
status_var="FAKE_EXIT_${pass^^}"
exit "${!status_var:-0}"
"""

FAKE_PREPARE = r"""
import json, os, sys
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
out.mkdir(parents=True, exist_ok=True)
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    f.write(json.dumps({"pass": "prepare", "args": sys.argv[1:]}) + "\n")
sys.exit(int(os.environ.get("FAKE_EXIT_PREPARE", "0")))
"""


@dataclass
class Fake:
    root: Path          # the job's working directory (relative run dirs land here)
    payload: Path       # a payload/ with the real common/ and a stand-in launcher
    record: Path
    defn: Definition

    @property
    def argv(self) -> list[str]:
        return ["fake/launch.sh", *self.defn.command[2:]]

    def env(self, index: int, port: int | None = None, **extra: str | None) -> dict[str, str]:
        env = node_env(self.defn, index, port=port or free_port(), payload=self.payload,
                       extra=extra)
        env["FAKE_RECORD"] = str(self.record)
        return env

    def calls(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines()]

    def marker(self) -> Path:
        return (self.root / self.defn.env["JOBGEN_COMPILE_CACHE"] / ".jobgen"
                / f"{self.defn.env['JOBGEN_COMPILE_KEY']}.done")

    def run(self, *envs: Mapping[str, str], timeout: float = 60) -> list[NodeRun]:
        return run_nodes(self.root, self.argv, envs, timeout=timeout)


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    payload = tmp_path / "payload"
    shutil.copytree(PAYLOAD / "common", payload / "common")
    (payload / "fake").mkdir()
    launcher = payload / "fake" / "launch.sh"
    launcher.write_text(FAKE_LAUNCHER)
    launcher.chmod(0o755)
    defn = smoke_definition()
    # The definition's prepare command, pointed at a stand-in script with the same arguments.
    prepare = json.loads(defn.env["JOBGEN_PREPARE_JSON"])
    (payload / prepare[0]).parent.mkdir(parents=True, exist_ok=True)
    (payload / prepare[0]).write_text(FAKE_PREPARE)
    (payload / snapshot.MARKER).write_text(snapshot.digest(payload) + "\n")   # as built
    files = {"model/config.json": '{"hidden_size": 64}\n', "notes/a b.txt": "x\ny"}
    env = dict(defn.env, JOBGEN_FILES_JSON=json.dumps(files))
    root = tmp_path / "work"
    root.mkdir()
    return Fake(root, payload, tmp_path / "calls.jsonl", Definition(defn.command, env))


def test_definition_carries_what_the_entrypoint_reads() -> None:
    defn = smoke_definition()
    assert defn.command[0] == "/opt/jobgen/entrypoint.sh"
    assert defn.command[1] == "habana_deepspeed/launch.sh"
    assert defn.compile_args[defn.compile_args.index("--phase") + 1] == "compile"
    assert defn.train_args[defn.train_args.index("--phase") + 1] == "train"
    prepare = json.loads(defn.env["JOBGEN_PREPARE_JSON"])
    assert prepare[0] == "habana_deepspeed/make_tiny_shard.py"
    assert prepare[prepare.index("--out") + 1] == defn.env["JOBGEN_RUN_DIR"] + "/smoke-data"
    assert defn.env["JOBGEN_NODES"] == "2"
    for name in ("MASTER_PORT", "JOBGEN_RUN_DIR", "JOBGEN_PAYLOAD_DIR", "JOBGEN_WORKERS_PER_NODE",
                 "JOBGEN_WORKDIR", "JOBGEN_PROGRAM", "JOBGEN_COMPILE_MODE",
                 "JOBGEN_COMPILE_CACHE", "JOBGEN_COMPILE_KEY", "JOBGEN_RDZV_TIMEOUT"):
        assert defn.env.get(name), name


def test_every_payload_gets_the_declared_collective_timeout() -> None:
    """The job declares one collective timeout (jobgen/payloads/node.py); every trainer's process
    group is made with it, so that a collective whose peer is gone fails instead of waiting for the
    job's time limit."""
    import datetime
    import re

    from common.init import process_group_timeout
    from common.runtime import PayloadError

    from jobgen.inputs.recipe import Job

    declared = Job().collective_timeout_s    # the recipe's default; payload/common/init.py's too
    assert smoke_definition().env["JOBGEN_COLLECTIVE_TIMEOUT"] == str(declared)
    assert process_group_timeout({"JOBGEN_COLLECTIVE_TIMEOUT": "90"}) == \
        datetime.timedelta(seconds=90)
    assert process_group_timeout({}) == datetime.timedelta(seconds=declared)
    with pytest.raises(PayloadError, match="JOBGEN_COLLECTIVE_TIMEOUT='0' is not a positive"):
        process_group_timeout({"JOBGEN_COLLECTIVE_TIMEOUT": "0"})
    calls = {}
    for path in sorted(PAYLOAD.glob("*/*.py")):
        if path.parent.name == "common":     # shared code; its docstrings name the calls
            continue
        for call in re.findall(r"(?:init_process_group|init_distributed)\((.*?)\)\n",
                               path.read_text(), re.S):
            calls.setdefault(path.parent.name, []).append(call)
    assert sorted(calls) == ["habana_deepspeed", "neuronx_distributed", "smoke", "smp_fsdp"]
    for payload, found in calls.items():
        assert all("timeout=process_group_timeout()" in call for call in found), (payload, found)


def test_two_nodes_split_arguments_and_run_both_passes(fake: Fake) -> None:
    barrier = str(fake.root.parent / "barrier")
    runs = fake.run(fake.env(0, FAKE_BARRIER=barrier), fake.env(1, FAKE_BARRIER=barrier))
    assert [r.returncode for r in runs] == [0, 0], show(runs)
    calls = fake.calls()
    by_node: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        if call["pass"] == "prepare":
            continue
        by_node.setdefault(call["env"]["JOBGEN_NODE_RANK"], []).append(call)
    assert sorted(by_node) == ["0", "1"]
    run_dir = fake.root / fake.defn.env["JOBGEN_RUN_DIR"]
    for node_calls in by_node.values():
        assert [c["pass"] for c in node_calls] == ["compile", "train"]
        compile_call, train_call = node_calls
        assert compile_call["args"] == fake.defn.compile_args
        assert train_call["args"] == fake.defn.train_args
        env = train_call["env"]
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["JOBGEN_NNODES"] == "2"
        assert env["JOBGEN_RDZV_TIMEOUT"] == "60"
        assert env["JOBGEN_RUN_DIR"] == str(run_dir)           # made absolute
        assert env["JOBGEN_LOG_DIR"] == str(run_dir / "logs" / "job-1" / "attempt-1")
        assert compile_call["cwd"] == str(fake.root)
    # Every node ran the prepare command, with the definition's arguments.
    prepared = [c for c in calls if c["pass"] == "prepare"]
    assert len(prepared) == 2
    assert prepared[0]["args"] == json.loads(fake.defn.env["JOBGEN_PREPARE_JSON"])[1:]
    # ...and wrote the files, whole, with no temporary leftovers.
    assert (run_dir / "model" / "config.json").read_text() == '{"hidden_size": 64}\n'
    assert (run_dir / "notes" / "a b.txt").read_text() == "x\ny"
    assert not [p for p in run_dir.rglob(".*") if p.is_file()]
    assert fake.marker().is_file()
    # What `jobgen report` reads: when the main node's attempt began, each pass's launch and exit.
    from jobgen.reporting import held
    attempt = run_dir / "logs" / "job-1" / "attempt-1"
    assert held.times(attempt / "allocation.times")[0] is not None
    for node in (0, 1):
        for name in ("compile", "train"):
            launch, exited = held.times(attempt / f"node-{node}" / f"{name}.times")
            assert launch is not None and exited is not None and exited >= launch
    main, child = runs
    said = main.lines(PREFIX0)
    assert any("main node, address 127.0.0.1 (interface lo)" in line for line in said)
    assert any(line.startswith("compile pass") for line in said)
    assert any(line.startswith("compile cache marker written") for line in said)
    assert said[-1] == "training pass finished"
    assert any("child node, main node at 127.0.0.1" in line for line in child.lines(PREFIX1))
    assert not any("marker written" in line for line in child.lines(PREFIX1))
    # Every line the entrypoint itself prints carries the node prefix.
    for run, prefix in ((main, PREFIX0), (child, PREFIX1)):
        own = [line for line in run.output.splitlines() if line.startswith("jobgen")]
        assert own and all(line.startswith(prefix) for line in own), own


@pytest.mark.parametrize("mode, marker, compiles", [
    ("auto", False, True), ("auto", True, False), ("always", True, True), ("never", False, False),
])
def test_compile_mode_and_marker(fake: Fake, mode: str, marker: bool, compiles: bool) -> None:
    if marker:
        fake.marker().parent.mkdir(parents=True)
        fake.marker().write_text("earlier\n")
    runs = fake.run(fake.env(0, JOBGEN_COMPILE_MODE=mode))
    assert runs[0].returncode == 0, show(runs)
    passes = [c["pass"] for c in fake.calls() if c["pass"] != "prepare"]
    assert passes == (["compile", "train"] if compiles else ["train"])
    if not compiles:
        assert f"compile pass skipped (compile mode {mode}; cache marker " \
               f"{fake.marker().name})" in runs[0].lines(PREFIX0)
    assert fake.marker().exists() == (marker or compiles)


def test_failed_compile_pass_skips_training_and_keeps_its_status(fake: Fake) -> None:
    runs = fake.run(fake.env(0, FAKE_EXIT_COMPILE="7"))
    assert runs[0].returncode == 7, show(runs)
    assert [c["pass"] for c in fake.calls() if c["pass"] != "prepare"] == ["compile"]
    assert "compile pass failed with status 7; the training pass is skipped" in \
        runs[0].lines(PREFIX0)
    assert not fake.marker().exists()


def test_failed_training_pass_is_the_exit_status(fake: Fake) -> None:
    barrier = str(fake.root.parent / "barrier")
    runs = fake.run(fake.env(0, FAKE_EXIT_TRAIN="5", FAKE_BARRIER=barrier),
                    fake.env(1, FAKE_BARRIER=barrier))
    assert [r.returncode for r in runs] == [5, 0], show(runs)
    assert runs[0].lines(PREFIX0)[-1] == "training pass failed with status 5"


def test_failed_prepare_stops_before_any_pass(fake: Fake) -> None:
    runs = fake.run(fake.env(0, FAKE_EXIT_PREPARE="3"))
    assert runs[0].returncode == 3, show(runs)
    assert [c["pass"] for c in fake.calls()] == ["prepare"]
    assert "the prepare step failed with status 3; no pass started" in runs[0].lines(PREFIX0)


def test_main_node_other_than_zero_still_hosts_rank_zero(fake: Fake) -> None:
    env = fake.env(1, AWS_BATCH_JOB_MAIN_NODE_INDEX="1", JOBGEN_NET_IFACE="lo",
                   AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=None)
    runs = fake.run(env)
    assert runs[0].returncode == 0, show(runs)
    ranks = {c["env"]["JOBGEN_NODE_RANK"] for c in fake.calls() if c["pass"] != "prepare"}
    assert ranks == {"0"}


def test_terminate_stops_the_running_pass(fake: Fake) -> None:
    out = fake.root / "term.out"
    proc = start_node(fake.root, fake.argv, fake.env(0, FAKE_SLEEP="60"), out)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b"compile pass (" not in out.read_bytes():
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            _stop(proc)
    text = out.read_text()
    assert proc.returncode != 0, text
    assert {"pass": "compile", "signal": "TERM"} in fake.calls(), text
    assert "training pass on" not in text
    assert f"{PREFIX0} compile pass failed with status 143; the training pass is skipped" in text
    assert f"{PREFIX0} received SIGTERM; stopping the running pass" in text


def test_terminate_during_training_asks_the_trainers_to_save(fake: Fake) -> None:
    """Batch's terminate or time-out: SIGTERM to the container's entrypoint (then SIGKILL 30 s
    later). During training the entrypoint passes the trainers the signal they save on (the
    definition's JOBGEN_STOP_SIGNAL), writes the request down first, and exits 143 once they
    saved and stopped."""
    assert fake.defn.env["JOBGEN_STOP_SIGNAL"] == "USR1"
    out = fake.root / "save.out"
    env = fake.env(0, FAKE_SAVE_ON="USR1", JOBGEN_COMPILE_MODE="never")
    proc = start_node(fake.root, fake.argv, env, out)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and {"pass": "train", "waiting": True} not in \
                fake.calls():
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            _stop(proc)
    text = out.read_text()
    assert proc.returncode == 143, text
    assert {"pass": "train", "saved_on": "USR1"} in fake.calls(), text
    assert (f"{PREFIX0} received SIGTERM; asking the trainers to save a checkpoint and stop "
            "(SIGUSR1)") in text
    logs = fake.root / fake.defn.env["JOBGEN_RUN_DIR"] / "logs" / "job-1" / "attempt-1"
    assert (logs / "node-0" / "stop-requested").is_file()


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it, in whatever session (torchrun's workers have their
    own), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def signal_tree(pid: int, signum: int) -> None:
    for each in process_tree(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signum)


def wait_for(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.1)
    pytest.fail(f"no {text!r} in {path} after {timeout} s")


@pytest.mark.parametrize("how", ["killed", "silent"])
def test_a_lost_child_ends_the_main_nodes_attempt(fake: Fake, how: str) -> None:
    """A child node lost during training: its process tree killed (its container stopped: the
    connection to the main node's watcher closes) or frozen (a host gone from the network: no
    word, no reset). The main node stops its pass and exits 69, which the definition's retry
    strategy retries, within JOBGEN_NODE_SILENCE seconds of the child's last word."""
    from jobgen.backends.batch.backend import NODE_LOST_STATUS
    silence = "3"
    port = free_port()
    envs = [fake.env(i, port, FAKE_SLEEP="120", JOBGEN_COMPILE_MODE="never",
                     JOBGEN_NODE_SILENCE=silence) for i in (0, 1)]
    outs = [fake.root / f"lost-{how}-{i}.out" for i in (0, 1)]
    procs = [start_node(fake.root, fake.argv, env, out) for env, out in zip(envs, outs)]
    try:
        for out in outs:
            wait_for(out, "training pass on 2 nodes")
        wait_for(outs[0], "watching the other 1 node(s)")
        time.sleep(float(silence))   # the child's first beats reach the watcher
        signal_tree(procs[1].pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        procs[0].wait(timeout=60)
    finally:
        signal_tree(procs[1].pid, signal.SIGKILL)
        for proc in procs:
            if proc.poll() is None:
                _stop(proc)
    text = outs[0].read_text()
    assert procs[0].returncode == NODE_LOST_STATUS == 69, text
    why = ("its connection to the main node closed without a goodbye" if how == "killed"
           else f"(more than {silence} s): its host is unreachable")
    assert why in text and f"{PREFIX0} node 1 is lost: " in text, text
    assert f"{PREFIX0} stopping the train pass: its ranks cannot go on without node 1" in text
    assert (f"{PREFIX0} node 1 was lost; this attempt ends with status 69, which the job's "
            "retry strategy retries") in text
    logs = fake.root / fake.defn.env["JOBGEN_RUN_DIR"] / "logs" / "job-1" / "attempt-1"
    assert (logs / "node-lost").read_text().startswith("1 lost ")


def test_the_watch_judges_each_way_a_child_ends() -> None:
    """The main node's judgement of its children (payload/common/node_watch.py), without
    sockets: a goodbye with 0 or 143 ends nothing (finished; stopped and saved with the others),
    one with another status is the child's failure; a connection closed without a goodbye, or a
    silence past the limit, is a lost node; a node never heard of is the rendezvous's to judge."""
    from common.node_watch import Watch, beat_interval

    watch = Watch(3, silence_s=60)
    assert watch.line("hello 1", 0.0) is None and watch.line("hello 2", 0.0) is None
    assert watch.line("bye 1 0", 10.0) == "ok\n"
    watch.closed(1)                       # its beats' connection, after the goodbye
    watch.tick(50.0)
    assert watch.verdict is None
    assert watch.line("bye 2 143", 20.0) == "ok\n"
    watch.closed(2)
    watch.tick(500.0)
    assert watch.verdict is None
    assert watch.line("beat 7", 1.0) is None and watch.line("noise", 1.0) is None  # no such node

    failed = Watch(2, silence_s=60)
    failed.line("hello 1", 0.0)
    failed.line("bye 1 78", 5.0)
    assert failed.verdict == "1 failed 78 its flow ended with status 78"

    gone = Watch(2, silence_s=60)
    gone.line("hello 1", 0.0)
    gone.closed(1)
    assert gone.verdict is not None and gone.verdict.startswith("1 lost 0 its connection")

    silent = Watch(2, silence_s=60)
    silent.line("beat 1", 0.0)
    silent.tick(59.0)
    assert silent.verdict is None
    silent.tick(61.0)
    assert silent.verdict is not None and silent.verdict.startswith("1 lost 0 silent for 61 s")

    assert beat_interval({}) == 5.0 and beat_interval({"JOBGEN_NODE_SILENCE": "8"}) == 2.0


def test_a_child_whose_flow_fails_ends_the_main_nodes_attempt_with_its_status(
        fake: Fake) -> None:
    """A child's training pass fails (status 5) while the main node's ranks would wait for it
    (HCCL waits for its collective timeout): after half the silence limit the main node stops
    its pass and ends the attempt with the child's status, which the retry strategy judges as
    the training's own failure (not retried)."""
    port = free_port()
    envs = [fake.env(0, port, FAKE_SLEEP="120", JOBGEN_COMPILE_MODE="never",
                     JOBGEN_NODE_SILENCE="4"),
            fake.env(1, port, FAKE_EXIT_TRAIN="5", JOBGEN_COMPILE_MODE="never",
                     JOBGEN_NODE_SILENCE="4")]
    main, child = fake.run(*envs, timeout=60)
    assert child.returncode == 5, child.output
    assert main.returncode == 5, main.output
    assert (f"{PREFIX0} node 1 failed: its flow ended with status 5; ending this attempt"
            in main.output)
    assert f"{PREFIX0} node 1's flow failed with status 5; this attempt ends with it" \
        in main.output


def test_children_that_finish_end_nothing(fake: Fake) -> None:
    """A child that finishes says goodbye before its connection closes: the main node's own
    status stands, and no node is called lost."""
    barrier = str(fake.root.parent / "barrier")
    port = free_port()
    runs = fake.run(fake.env(0, port, FAKE_BARRIER=barrier, FAKE_SLEEP="3"),
                    fake.env(1, port, FAKE_BARRIER=barrier))
    assert [r.returncode for r in runs] == [0, 0], show(runs)
    assert "watching the other 1 node(s)" in runs[0].output
    assert "lost" not in runs[0].output, runs[0].output


@pytest.mark.parametrize("change, message", [
    ({"AWS_BATCH_JOB_NODE_INDEX": None},
     ("AWS_BATCH_JOB_NODE_INDEX is not set: this entrypoint runs as a node of an AWS Batch "
      "multi-node parallel job")),
    ({"AWS_BATCH_JOB_NUM_NODES": None}, "AWS_BATCH_JOB_NUM_NODES is not set"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "x"},
     "AWS_BATCH_JOB_NODE_INDEX='x' is not a non-negative integer"),
    ({"AWS_BATCH_JOB_NODE_INDEX": "2"},
     "inconsistent AWS Batch variables: node 2, main node 0, 2 nodes"),
    ({"AWS_BATCH_JOB_NUM_NODES": "3", "AWS_BATCH_JOB_NODE_INDEX": "2"},
     "this job definition was rendered for 2 nodes but the job has 3"),
    ({"JOBGEN_COMPILE_KEY": None}, "not set by the job definition: JOBGEN_COMPILE_KEY"),
    ({"JOBGEN_COMPILE_MODE": "sometimes"},
     "JOBGEN_COMPILE_MODE='sometimes' must be auto, always or never"),
    ({"JOBGEN_RDZV_TIMEOUT": "0"}, "JOBGEN_RDZV_TIMEOUT='0' must be a positive number"),
    ({"JOBGEN_FILES_JSON": '{"../escape": "x"}'}, "could not write the job's files"),
    ({"JOBGEN_PREPARE_JSON": '"make_tiny_shard.py"'}, "JOBGEN_PREPARE_JSON is not a JSON list"),
])
def test_bad_environment_fails_loudly(fake: Fake, change: dict[str, str | None],
                                      message: str) -> None:
    runs = fake.run(fake.env(1, **change))
    assert runs[0].returncode != 0
    assert message in runs[0].output, runs[0].output
    assert not [c for c in fake.calls() if c["pass"] != "prepare"]
    assert not (fake.root / fake.defn.env["JOBGEN_RUN_DIR"] / "../escape").exists()


def test_child_without_main_address_fails_before_anything(fake: Fake) -> None:
    runs = fake.run(fake.env(1, AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=None))
    assert runs[0].returncode != 0
    assert (f"{PREFIX1} AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set or empty: a "
            "child node (index 1, main 0) cannot find the main node") in runs[0].output
    assert fake.calls() == []
    assert not (fake.root / fake.defn.env["JOBGEN_RUN_DIR"]).exists()
    runs = fake.run(fake.env(1, AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS=""))
    assert runs[0].returncode != 0
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set or empty" in runs[0].output


def test_missing_arguments_fail_loudly(fake: Fake) -> None:
    env = fake.env(0)
    for argv, message in (([], "usage: entrypoint.sh LAUNCHER COMPILE_ARGC"),
                          (["fake/launch.sh", "99", "a"], "COMPILE_ARGC '99' is not a count"),
                          (["nope/launch.sh", "0"], "no launcher")):
        proc = subprocess.run([str(ENTRYPOINT), *argv], cwd=fake.root, env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode != 0
        assert message in proc.stderr, proc.stderr


def test_an_image_with_another_payload_stops_every_node(fake: Fake) -> None:
    """An image built from another payload than the job was rendered with: every node stops
    before any pass with the configuration status (78: Batch does not retry it), naming both."""
    runs = fake.run(*(fake.env(i, JOBGEN_PAYLOAD_DIGEST="ab" * 32) for i in range(2)))
    for run in runs:
        assert run.returncode == 78, run.output
        held = (fake.payload / snapshot.MARKER).read_text().strip()[:16]
        assert f"holds payload '{held}', not {'ab' * 8} that this job was rendered with" \
            in run.output
    assert not fake.record.exists()      # no pass started


def test_entrypoint_passes_shellcheck(require: Any) -> None:
    shellcheck = require.executable("shellcheck")
    # -x: with the flow it sources (payload/common/job_flow.sh and its stage files).
    proc = subprocess.run([shellcheck, "-x", "-S", "style", str(ENTRYPOINT)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the real thing: DeepSpeed BERT on CPU, two entrypoints ------------------------------------

def _importable(*names: str) -> bool:
    return all(importlib.util.find_spec(name) is not None for name in names)


# The two nodes of these jobs run in one folder of this machine: they share the run folder, as
# the nodes of a site whose work_dir is on its batch.shared_volume do (there the job definition
# says so: backend.run_folder_shared). Left at the local site's value (each node on a disk of its
# own), each node's leader would clear and prune the other's checkpoints as if they were its own.
SHARED: dict[str, str | None] = {"JOBGEN_SHARED_FS": "1"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both nodes run the smoke job definition once (compile pass, then training to the end)."""
    if not _importable("deepspeed", "transformers", "h5py", "torch"):
        reason = "DeepSpeed, transformers, h5py or torch is not installed"
        if os.environ.get("JOBGEN_REQUIRE_ALL") == "1":   # as conftest's `require` does
            pytest.fail(f"required component missing (JOBGEN_REQUIRE_ALL=1): {reason}",
                        pytrace=False)
        pytest.skip(reason)
    defn = smoke_definition()
    root = tmp_path_factory.mktemp("batch-job")
    port = free_port()
    runs = run_nodes(root, defn.command[1:],
                     [node_env(defn, i, port=port, extra=SHARED) for i in (0, 1)],
                     timeout=300, tag="first")
    return {"root": root, "defn": defn, "runs": runs, "port": port}


def _steps(events: list[dict[str, Any]], phase: str) -> list[int]:
    return [e["step"] for e in events if e["event"] == "step" and e["phase"] == phase]


@pytest.mark.deepspeed
@pytest.mark.slow
def test_two_node_smoke_job_compiles_then_trains(trained: dict[str, Any]) -> None:
    root, defn, runs = trained["root"], trained["defn"], trained["runs"]
    assert [r.returncode for r in runs] == [0, 0], show(runs)
    main, child = runs
    events = main.events()               # global rank 0 lives on the main node
    max_steps = int(defn.train_args[defn.train_args.index("--max-steps") + 1])
    compile_steps = int(defn.compile_args[defn.compile_args.index("--compile-steps") + 1])
    assert compile_steps == 3
    starts = [e for e in events if e["event"] == "start"]
    assert [(s["phase"], s["world_size"]) for s in starts] == [("compile", 2), ("train", 2)]
    assert _steps(events, "compile") == [1, 2, 3]
    assert _steps(events, "train") == list(range(1, max_steps + 1))
    run_dir = root / defn.env["JOBGEN_RUN_DIR"]
    # The compile pass leaves no trace; the training pass keeps its newest checkpoints.
    assert not (run_dir / "compile").exists()
    newest = checkpoints.newest_complete(run_dir / "train" / "checkpoints")
    assert newest is not None and newest.step == max_steps
    saved = [e["step"] for e in events if e["event"] == "checkpoint"]
    every = int(defn.train_args[defn.train_args.index("--checkpoint-every") + 1])
    assert saved == list(range(every, max_steps + 1, every))
    marker = root / defn.env["JOBGEN_COMPILE_CACHE"] / ".jobgen" / \
        f"{defn.env['JOBGEN_COMPILE_KEY']}.done"
    assert marker.is_file()
    # The prepared shard is whole and alone (no temporary file of either node left over).
    data = run_dir / "smoke-data"
    assert sorted(p.name for p in data.iterdir()) == ["tiny_training_0.hdf5"]
    logs = run_dir / "logs" / "job-1" / "attempt-1"
    for node in ("node-0", "node-1"):
        assert (logs / node / "compile.log").is_file() and (logs / node / "train.log").is_file()
    assert main.lines(PREFIX0)[-1] == "training pass finished"
    assert child.lines(PREFIX1)[-1] == "training pass finished"
    # No privilege to reserve the port (as in a non-privileged container): said, not fatal.
    assert f"could not reserve port {trained['port']} (no privilege); continuing" in main.output


@pytest.mark.deepspeed
@pytest.mark.slow
def test_second_job_skips_the_compile_pass_and_resumes(trained: dict[str, Any]) -> None:
    root, defn = trained["root"], trained["defn"]
    assert [r.returncode for r in trained["runs"]] == [0, 0], show(trained["runs"])
    port = free_port()
    runs = run_nodes(root, defn.command[1:],
                     [node_env(defn, i, port=port, job_id="job-2", extra=SHARED)
                      for i in (0, 1)],
                     timeout=240, tag="second")
    assert [r.returncode for r in runs] == [0, 0], show(runs)
    max_steps = int(defn.train_args[defn.train_args.index("--max-steps") + 1])
    for run, prefix in ((runs[0], PREFIX0), (runs[1], PREFIX1)):
        assert any(line.startswith("compile pass skipped (compile mode auto")
                   for line in run.lines(prefix)), run.output
    events = runs[0].events()
    assert [e["phase"] for e in events if e["event"] == "start"] == ["train"]
    resume = [e for e in events if e["event"] == "resume"]
    assert len(resume) == 1 and resume[0]["step"] == max_steps
    assert _steps(events, "train") == []     # nothing more to do
    assert [e["step"] for e in events if e["event"] == "done"] == [max_steps]


@pytest.mark.deepspeed
@pytest.mark.slow
def test_failing_passes_end_the_job_with_a_failure(trained: dict[str, Any]) -> None:
    """The training data is gone (and no prepare step brings it back): with the marker in place
    the compile pass is skipped and the training pass fails; with compile mode `always` the
    compile pass fails and training never starts. The main node's status is the job's."""
    root, defn = trained["root"], trained["defn"]
    assert [r.returncode for r in trained["runs"]] == [0, 0], show(trained["runs"])
    shutil.rmtree(root / defn.env["JOBGEN_RUN_DIR"] / "smoke-data")
    no_prepare: dict[str, str | None] = dict(SHARED, JOBGEN_PREPARE_JSON=None)

    port = free_port()
    runs = run_nodes(root, defn.command[1:],
                     [node_env(defn, i, port=port, job_id="job-3", extra=no_prepare)
                      for i in (0, 1)], timeout=180, tag="train-fails")
    main, child = runs
    assert main.returncode != 0 and child.returncode != 0, show(runs)
    assert "no training shards in" in main.output or "is not a directory" in main.output
    said = main.lines(PREFIX0)
    assert any(line.startswith("compile pass skipped") for line in said)
    assert said[-1] == f"training pass failed with status {main.returncode}"

    port = free_port()
    always = dict(no_prepare, JOBGEN_COMPILE_MODE="always")
    runs = run_nodes(root, defn.command[1:],
                     [node_env(defn, i, port=port, job_id="job-4", extra=always)
                      for i in (0, 1)], timeout=180, tag="compile-fails")
    main = runs[0]
    assert main.returncode != 0, show(runs)
    assert main.lines(PREFIX0)[-1] == (f"compile pass failed with status {main.returncode}; "
                                       "the training pass is skipped")
    assert not any(line.startswith("training pass") for line in main.lines(PREFIX0))


@pytest.mark.slow
def test_a_node_whose_peer_never_comes_fails_within_the_timeout(tmp_path: Path,
                                                                 require: Any) -> None:
    """Bounded rendezvous: the main node alone (waiting for its child) and a child alone
    (waiting for a main node that is not there) both give up after JOBGEN_RDZV_TIMEOUT seconds
    with a message that says so, instead of hanging (the DL1 workshop's main node waited
    forever)."""
    require(_importable("torch"), "torch is not installed")
    require.executable("torchrun")
    defn = smoke_definition()
    timeout_s = 5
    extra = {"JOBGEN_RDZV_TIMEOUT": str(timeout_s), "JOBGEN_COMPILE_MODE": "always",
             "JOBGEN_PREPARE_JSON": None}
    # Two jobs at once, each with one node present (different ports): a main node whose child
    # never comes, and a child whose main node is not there.
    envs = [node_env(defn, 0, port=free_port(), extra=extra),
            node_env(defn, 1, port=free_port(), extra=extra)]
    started = time.monotonic()
    main, child = run_nodes(tmp_path, defn.command[1:], envs, timeout=120, tag="alone")
    elapsed = time.monotonic() - started
    for run, prefix in ((main, PREFIX0), (child, PREFIX1)):
        assert run.returncode != 0, run.output
        said = run.lines(prefix)
        assert (f"the compile pass could not bring the 2 nodes together within {timeout_s} s "
                f"at 127.0.0.1:") in " ".join(said), run.output
        assert said[-1].startswith("compile pass failed with status"), run.output
        # torchrun gives up after the timeout, not the default 600 s or the test's 120 s.
        assert run.seconds < 60, run.output
    assert "waiting for clients" in main.output
    assert "timed out" in child.output
    assert elapsed < 120


@pytest.mark.slow
def test_nodes_in_different_passes_do_not_train_together(tmp_path: Path, require: Any) -> None:
    """Each pass has its own rendezvous id: a node in the training pass and a node in the
    compile pass (their compile decisions differ, e.g. a marker on one node's disk only) both
    fail after the timeout instead of running one job made of two different commands."""
    require(_importable("torch"), "torch is not installed")
    require.executable("torchrun")
    defn = smoke_definition()
    port = free_port()
    base: dict[str, str | None] = {"JOBGEN_RDZV_TIMEOUT": "5", "JOBGEN_PREPARE_JSON": None}
    envs = [node_env(defn, 0, port=port, extra=dict(base, JOBGEN_COMPILE_MODE="never")),
            node_env(defn, 1, port=port, extra=dict(base, JOBGEN_COMPILE_MODE="always"))]
    main, child = run_nodes(tmp_path, defn.command[1:], envs, timeout=120, tag="split")
    assert main.returncode != 0 and child.returncode != 0, show([main, child])
    assert any(line.startswith("the train pass could not bring the 2 nodes together within 5 s")
               for line in main.lines(PREFIX0)), main.output
    assert any(line.startswith("the compile pass could not bring the 2 nodes together")
               for line in child.lines(PREFIX1)), child.output
    # Neither trainer started.
    assert not main.events() and not child.events()


def _running(root: Path, argv: Sequence[str], envs: Sequence[Mapping[str, str]],
             tag: str) -> tuple[list[subprocess.Popen[bytes]], list[Path]]:
    outs = [root / f"{tag}-node{i}.out" for i in range(len(envs))]
    return [start_node(root, argv, env, out) for env, out in zip(envs, outs)], outs


def _wait_for_step(out: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = out.read_bytes().decode("utf-8", "replace")
        if any(s >= step for s in _steps(read_events(text), "train")):
            return
        time.sleep(0.2)
    pytest.fail(f"no training step {step} within {timeout} s:\n{out.read_text()[-6000:]}")


@pytest.mark.deepspeed
@pytest.mark.slow
def test_terminate_saves_and_a_lost_child_ends_the_next_attempt(
        trained: dict[str, Any], tmp_path: Path) -> None:
    """Both halves of a Batch job's end that the main node's exit alone does not give.

    A terminate (or a time-out): Batch sends SIGTERM to every node's container; the trainers
    save the step they agreed on and stop within the grace Batch gives (30 s), each node exits
    143. The next attempt resumes there; then the child's whole process tree is killed mid-step,
    as a lost host: the main node ends its attempt with status 69 (its retry strategy retries it)
    instead of waiting in its collectives until the attempt's time-out (72 h on dl1)."""
    from jobgen.backends.batch import DECLARATION
    from jobgen.backends.batch.backend import NODE_LOST_STATUS, NODE_SILENCE_S

    defn = trained["defn"]
    train = list(defn.train_args)
    train[train.index("--max-steps") + 1] = "2000"   # trains until it is stopped
    argv = [defn.command[1], str(defn.compile_argc), *defn.compile_args, *train]
    never: dict[str, str | None] = dict(SHARED, JOBGEN_COMPILE_MODE="never")
    port = free_port()
    procs, outs = _running(tmp_path, argv, [node_env(defn, i, port=port, job_id="job-5",
                                                     extra=never) for i in (0, 1)], "terminate")
    try:
        _wait_for_step(outs[0], 3)
        for proc in procs:                 # Batch stops every node's container
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=DECLARATION.stop_grace_s)
    finally:
        for proc in procs:
            if proc.poll() is None:
                _stop(proc)
    texts = [out.read_text() for out in outs]
    assert [p.returncode for p in procs] == [143, 143], "\n".join(t[-4000:] for t in texts)
    (stopped,) = [e for e in read_events(texts[0]) if e["event"] == "stopped"]
    assert stopped["signal"] == "USR1"
    run_dir = tmp_path / defn.env["JOBGEN_RUN_DIR"]
    newest = checkpoints.newest_complete(run_dir / "train" / "checkpoints")
    assert newest is not None and newest.step == stopped["step"]
    for text, prefix in zip(texts, (PREFIX0, PREFIX1)):
        assert (f"{prefix} received SIGTERM; asking the trainers to save a checkpoint and stop "
                "(SIGUSR1)") in text

    port = free_port()
    procs, outs = _running(tmp_path, argv, [node_env(defn, i, port=port, job_id="job-5",
                                                     attempt=2, extra=never) for i in (0, 1)],
                           "lost")
    try:
        _wait_for_step(outs[0], stopped["step"] + 2)
        signal_tree(procs[1].pid, signal.SIGKILL)   # the child's host is gone
        procs[0].wait(timeout=NODE_SILENCE_S + 30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                signal_tree(proc.pid, signal.SIGKILL)
            proc.wait()
    text = outs[0].read_text()
    assert procs[0].returncode == NODE_LOST_STATUS, text[-6000:]
    assert [e["step"] for e in read_events(text) if e["event"] == "resume"] == [stopped["step"]]
    assert f"{PREFIX0} node 1 is lost: " in text
    assert f"{PREFIX0} node 1 was lost; this attempt ends with status 69" in text
