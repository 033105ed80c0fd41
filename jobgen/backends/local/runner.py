"""`jobgen run`: the job on this machine, no scheduler. Each emulated node is its own process
group running the one two-pass flow (payload/common/job_flow.sh) with the node contract and the
facts a scheduler would give it, so the rehearsal exercises the same two passes, rendezvous, node
ranks, checkpoints and exit-status rules as a real multi-node job; the main node's status is the
job's."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from ... import payloads
from ...job.spec import JobSpec
from ...payloads import node

# How long the emulated nodes wait for each other (Batch's default).
RDZV_TIMEOUT_S = 900


def node_commands(spec: JobSpec, job_id: str) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, environment) for each emulated node; node 0 is the main node."""
    lau = payloads.for_spec(spec, "local")
    contract = node.contract(spec, lau, "local", rdzv_timeout_s=RDZV_TIMEOUT_S)
    base = node.environment(spec, lau, contract)
    # The nodes share this machine's folders: the main node writes the files, once.
    base["JOBGEN_SETUP_ON"] = "main"
    flow = Path.cwd() / contract.JOBGEN_PAYLOAD_DIR / "common" / "job_flow.sh"
    argv = ["bash", str(flow), "node", *node.flow_args(lau)]
    log_dir = Path.cwd() / contract.JOBGEN_RUN_DIR / "logs" / job_id
    out = []
    for index in range(spec.nodes):
        env = dict(base)
        env.update({"MASTER_ADDR": "127.0.0.1", "JOBGEN_NODE_RANK": str(index),
                    "JOBGEN_NNODES": str(spec.nodes), "JOBGEN_IS_MAIN": str(int(index == 0)),
                    "JOBGEN_LOG_DIR": str(log_dir), "FLOW_WHO": f"jobgen[local node {index}]"})
        out.append((argv, env))
    return out


def relocate(value: str, moves: list[tuple[str, str]]) -> str:
    """`value` with each image path in `moves` replaced by this machine's."""
    for old, new in moves:
        value = value.replace(old, new)
    return value


def image_moves(spec: JobSpec, write: bool = True) -> list[tuple[str, str]]:
    """Where a container rehearsal finds what the image of `spec` holds: a file tree laid out
    as env/containers/images.yaml declares it (jobgen's payload and entrypoints under its
    jobgen_dir, the trainer's files in its checkout), built once under the rehearsal folder
    (with `write`) and kept, so what a node finds is what the declaration says, and a tree
    that differs (a moved trainer) fails the job as a wrongly built image would."""
    from ...images import catalog as images
    from ...images import snapshot
    decl, image = images.declared(), images.for_spec(spec)
    tree = image_tree(spec)
    if write and not tree.is_dir():
        tmp = tree.with_name(f".{tree.name}.tmp-{os.getpid()}")
        snapshot.export(tmp / decl.jobgen_dir.lstrip("/") / "payload", spec.payload_digest)
        for file in image.trainer_files():
            # The real trainer cannot run here: the CPU stand-in trains, and these stubs stand
            # where the image holds the trainer, so its paths are what the nodes check.
            stub = tmp / file.lstrip("/")
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text(f"# {image.name}: stand-in for the trainer's {file}\n",
                            encoding="utf-8")
        try:
            os.rename(tmp, tree)
        except OSError:            # another rehearsal laid the same image out first
            shutil.rmtree(tmp, ignore_errors=True)
    if write:
        # The entrypoints are copied on every run (the payload id does not cover them), each
        # renamed over the old: a pod's bash still reading the old one must not see it cut short.
        from ...plumbing import fsio, resources
        for script in decl.entrypoints.values():
            fsio.write_file(tree / decl.jobgen_dir.lstrip("/") / script,
                            (resources.folder("containers") / script).read_bytes())
    moves = [(decl.jobgen_dir + "/", f"{tree}{decl.jobgen_dir}/")]
    if image.checkout is not None:
        moves.append((image.checkout.path + "/", f"{tree}{image.checkout.path}/"))
    return moves


def image_tree(spec: JobSpec) -> Path:
    """The emulated image of `spec` (its name and payload id, as its tag)."""
    from ...images import catalog as images
    return rehearsal_folder(False) / "image" / images.tag(images.for_spec(spec),
                                                          spec.payload_digest)


REHEARSAL_FOLDER = ".jobgen-rehearsal"


def rehearsal_folder(write: bool = True) -> Path:
    """Where container rehearsals keep their emulated instances and images, in the current
    folder; with `write`, made and ignored by git (its own .gitignore says `*`, as a venv's
    does), so that a rehearsal leaves nothing unignored in a checkout."""
    folder = Path.cwd() / REHEARSAL_FOLDER
    if write and not (folder / ".gitignore").is_file():
        from ...plumbing import fsio
        folder.mkdir(exist_ok=True)
        fsio.write_file(folder / ".gitignore",
                        "# made by jobgen run: its emulated instances and images\n*\n")
    return folder


def _pump(stream: TextIO, prefix: str, emit: Callable[[str], None],
          quiet: threading.Event) -> None:
    """The node's lines, prefixed, until `quiet` is set (a cancelled run: the nodes' words on
    being stopped are in their logs, not on the terminal); the rest is read and dropped."""
    for line in stream:
        if not quiet.is_set():
            emit(prefix + line.rstrip("\n"))


def _tree(pid: int) -> list[int]:
    """`pid`'s descendants, from /proc (empty where there is none): torchrun starts its workers
    in sessions of their own, so the node's process group does not hold them."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo += children.get(child, [])
    return out


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """One node stopped as `_stop_all` stops them."""
    _stop_all([proc], grace_s)


def _stop_all(procs: list[subprocess.Popen], grace_s: float = 10.0) -> None:
    """SIGTERM every node's process group at once (each flow stops its pass, and starts no
    other), then SIGKILL what is still there after `grace_s`: the group and every descendant,
    in whatever session. (One node after the other, a node still waiting for its SIGTERM
    went on to its next pass while the first one was given its grace.)"""
    live = [proc for proc in procs if proc.poll() is None]
    # Before the groups go: their workers outlive them in their own sessions.
    trees = {proc.pid: _tree(proc.pid) for proc in live}
    for proc in live:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for proc in live:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            trees[proc.pid] += _tree(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    for pid in (pid for tree in trees.values() for pid in tree):   # what is left, anywhere
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def commands(spec: JobSpec, job_id: str,
             write: bool = True) -> list[tuple[list[str], dict[str, str]]]:
    """The emulated nodes of `spec`'s backend: jobgen's own nodes, or a service's containers
    (with `write`, the files a service puts on each instance; a dry run writes nothing)."""
    from ... import backends
    if backends.declaration(spec.backend).container:
        return backends.module(spec.backend, "rehearsal").commands(
            spec, job_id, rehearsal_folder(write) / job_id, write)
    return node_commands(spec, job_id)


def place_payload(spec: JobSpec) -> None:
    """The payload the nodes run: the job's snapshot on the site's shared folder. A container
    backend's nodes run the payload their emulated image holds, laid out by the rehearsal's
    commands (`image_moves`), as a real image holds it."""
    from ... import backends
    from ...images import snapshot
    if not backends.declaration(spec.backend).container:
        snapshot.place(spec.site.snapshot_root, spec.payload_digest)


def node_env(env: dict[str, str], master_port: Optional[int] = None) -> dict[str, str]:
    """A node's whole environment: this one's, the node's own, the moved rendezvous port; the
    nodes use the interpreter (and torchrun) of the environment jobgen runs in."""
    full_env = dict(os.environ)
    full_env.update(env)
    if master_port is not None and "MASTER_PORT" in full_env:
        full_env["MASTER_PORT"] = str(master_port)
    full_env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable),
                                        full_env.get("PATH", "")])
    return full_env


def _first_end(procs: list[subprocess.Popen], any_failure: bool) -> int:
    """The job's status: the main node's, or (`any_failure`: the service ends the job when any
    node fails, as SageMaker does) the first node's that fails."""
    while True:
        status = procs[0].poll()
        if status is not None:
            return status
        if any_failure:
            for proc in procs[1:]:
                if proc.poll() not in (None, 0):
                    return int(proc.returncode)
        time.sleep(0.2)


def run(spec: JobSpec, emit: Callable[[str], None] = print, job_id: Optional[str] = None,
        grace_s: float = 30.0, master_port: Optional[int] = None) -> int:
    """Start every node, stream their output with a node prefix, return the main node's status
    (130 where Ctrl-C stopped them: every process the nodes started is stopped).
    When the main node ends, the others get `grace_s` to finish (Batch stops them too).
    `master_port`: the rendezvous port instead of the recipe's
    (jobgen/backends/local/rehearsal.py)."""
    from ... import backends
    from ...runs import ledger as runs
    job_id = job_id or runs.local_job_id()
    declared = backends.declaration(spec.backend)
    procs, pumps = [], []
    quiet = threading.Event()
    held = None
    try:
        place_payload(spec)
        held = _hold(spec, job_id)
        for index, (argv, env) in enumerate(commands(spec, job_id)):
            proc = subprocess.Popen(argv, env=node_env(env, master_port), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            procs.append(proc)
            assert proc.stdout is not None
            pump = threading.Thread(target=_pump, args=(proc.stdout, f"[node {index}] ", emit,
                                                        quiet), daemon=True)
            pump.start()
            pumps.append(pump)
        status = _first_end(procs, declared.any_node_failure_ends)
        deadline = time.monotonic() + grace_s
        for proc in procs[1:]:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(proc)
    except KeyboardInterrupt:
        quiet.set()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C waits too
        try:
            _stop_all(procs)
        finally:
            signal.signal(signal.SIGINT, previous)
        status = 130
    for pump in pumps:
        pump.join(timeout=5)
    if held is not None:
        import dataclasses

        from ...reporting import held as spans
        spans.write(held[0], dataclasses.replace(held[1], end=time.time()))
    return status


def _hold(spec: JobSpec, job_id: str) -> Optional[tuple[Path, Any]]:
    """Record that the rehearsal holds this machine's `spec.nodes` emulated nodes from the
    command's start (`jobgen report` measures the run's allocation by it), in the job's log
    folder; run() records the end."""
    import socket

    from ...reporting import held as spans
    env = commands(spec, job_id, write=False)[0][1]
    folder = Path(env["JOBGEN_LOG_DIR"]) if env.get("JOBGEN_LOG_DIR") else \
        Path(env.get("JOBGEN_RUN_DIR") or spec.run_dir) / "logs" / job_id
    record = spans.Held(spans.process_start(), None, spec.nodes, "jobgen run", os.getpid(),
                        socket.gethostname())
    spans.write(Path.cwd() / folder, record)
    return Path.cwd() / folder, record
