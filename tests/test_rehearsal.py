"""`jobgen run` on a busy machine (issue 41): a taken rendezvous port, Ctrl-C and its resume, and
a job that needs accelerators this machine does not have. Real processes: the console script,
its nodes, torchrun and DeepSpeed on CPU (jobgen/backends/local/rehearsal.py,
jobgen/backends/local/runner.py)."""
from __future__ import annotations

import errno
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

JOBGEN = Path(sys.executable).parent / "jobgen"
# A cheap rehearsal: one node, no compile pass, llama2-7b's smoke stand-in (payload/smoke), whose
# JOBGEN_SMOKE_STEP_DELAY keeps it training until the Ctrl-C comes (on an idle machine the tiny
# model's 10-ms steps finished the run before the signal; the BERT program has no such knob).
RUN = ["run", "llama2-7b", "--smoke", "--nodes", "1", "--compile", "never"]
NAME, PORT = "llama2-7b-1n-smoke", 44000     # llama2-7b's job.master_port


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBGEN_")}
    env.update(JOBGEN_STATE_DIR=str(tmp_path / "state"), **extra)
    return env


def _left(marker: str) -> list[str]:
    """Processes whose command line names `marker` (the rehearsal's folder)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in cmdline and state not in (b"Z", b"X"):
            found.append(f"{pid}: {cmdline}")
    return found


def _watch(tmp_path: Path, name: str, status: int = 1) -> dict[str, Any]:
    """`jobgen watch --run-dir` on the rehearsal's folder: its summary, after its exit status."""
    proc = subprocess.run([str(JOBGEN), "watch", "--run-dir", f"jobgen-runs/{name}", "--json"],
                          cwd=tmp_path, text=True, capture_output=True, env=_env(tmp_path),
                          timeout=120, check=False)
    assert proc.returncode == status, proc.stdout[-3000:] + proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return summary


@pytest.mark.slow
@pytest.mark.deepspeed
def test_ctrl_c_cancels_and_the_printed_command_resumes_on_a_busy_port(tmp_path: Path) -> None:
    """The recipe's port held by a listener here; SIGINT after the first checkpoint: every process
    is stopped, the run is CANCELLED (not FAILED) with its step and checkpoint, and the command
    it prints resumes from that checkpoint (the same run folder and record)."""
    held = socket.socket()
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        held.bind(("127.0.0.1", PORT))
        held.listen()
    except OSError as exc:       # something else holds it already: busy all the same
        assert exc.errno == errno.EADDRINUSE
    try:
        # Ctrl-C at a terminal: SIGINT with its default disposition. A background job of a
        # non-interactive shell (CI's run.sh starts pytest so) has SIGINT ignored, children
        # inherit that, and Python then installs no KeyboardInterrupt handler at all.
        proc = subprocess.Popen([str(JOBGEN), *RUN], cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=_env(tmp_path, JOBGEN_SMOKE_STEP_DELAY="0.5"),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        assert proc.stdout is not None
        out = []
        for line in proc.stdout:
            out.append(line)
            if '"event": "checkpoint"' in line:
                proc.send_signal(signal.SIGINT)
                break
        out.append(proc.stdout.read())
        status = proc.wait(timeout=120)
        text = "".join(out)
        assert status == 130, text
        assert (f"jobgen: port {PORT} (job.master_port) is in use on this machine; this "
                "rehearsal's nodes meet on port ") in text
        assert "Traceback" not in text and "EADDRINUSE" not in text
        assert "failed with status 143" not in text and "received SIGTERM" not in text
        cancelled = [line for line in text.splitlines() if "cancelled (Ctrl-C)" in line]
        assert len(cancelled) == 1, text
        found = re.search(r"at step (\d+); every process it started is stopped; its last "
                          r"checkpoint is step (\d+) \(", cancelled[0])
        assert found, cancelled[0]
        step, saved = int(found[1]), int(found[2])
        assert 1 <= saved <= step
        (resume,) = [line.split("resume it with: ", 1)[1] for line in text.splitlines()
                     if "resume it with: " in line]
        assert not _left(str(tmp_path)), "processes outlived Ctrl-C"
    finally:
        held.close()

    status_out = subprocess.run([str(JOBGEN), "status", NAME], cwd=tmp_path, text=True,
                                capture_output=True, env=_env(tmp_path), check=False)
    assert status_out.returncode == 0, status_out.stderr
    assert f": CANCELLED (Ctrl-C at step {step}; last checkpoint: step {saved}; resume with: " \
        f"{resume})" in status_out.stdout

    # watch on the folder (RUN/logs/JOB/node-K, one allocation per command) reads its steps
    # from the nodes' logs and says the cancel: the run did not complete (1), it did not fail.
    watched = _watch(tmp_path, NAME)
    assert (watched["cancelled"], watched["failed"], watched["last_step"]) == (True, False, step)
    assert watched["ended"].startswith("the run was cancelled (Ctrl-C) in allocation 0 (job ")

    argv = shlex.split(resume)
    assert argv[0] == "jobgen"
    again = subprocess.run([str(JOBGEN), *argv[1:]], cwd=tmp_path, text=True,
                           capture_output=True, env=_env(tmp_path), check=False, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr
    events = [json.loads(line.split("] ", 1)[1]) for line in again.stdout.splitlines()
              if line.startswith("[node 0] {")]
    (resumed,) = [e for e in events if e["event"] == "resume"]
    assert resumed["step"] == saved
    assert [e["step"] for e in events if e["event"] == "step"][0] == saved + 1

    # Both rehearsals are one run: two job ids, one record of two submissions.
    listed = json.loads(subprocess.run([str(JOBGEN), "runs", "--json"], cwd=tmp_path, text=True,
                                       capture_output=True, env=_env(tmp_path),
                                       check=True).stdout)
    assert [r["name"] for r in listed] == [NAME, NAME]
    assert [r["state"] for r in listed] == ["CANCELLED", "COMPLETED"]
    assert len({r["job_id"] for r in listed}) == 2
    # The resume ended well: quiet, 0, its two commands two allocations.
    watched = _watch(tmp_path, NAME, status=0)
    assert (watched["ended"], watched["alerts"], watched["allocations"]) == (None, [], 2)
    record = json.loads((tmp_path / "jobgen-runs" / NAME / "jobgen-run.json").read_text())
    assert [s["job_ids"] for s in record["submissions"]] == [[r["job_id"]] for r in listed]
    assert all(s["rehearsal"] and s["backend"] == "local" for s in record["submissions"])


@pytest.mark.slow
def test_watch_says_where_a_failed_rehearsal_failed(tmp_path: Path) -> None:
    """Node 1 of a 2-node rehearsal fails at step 5 (the smoke trainer's own fault): watch on
    its folder reads the steps from the nodes' logs, names the pass, the step and the status,
    and exits 1."""
    with socket.socket() as sock:   # rehearsals may run side by side: not the recipe's port
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.run([str(JOBGEN), "run", "llama2-7b", "--nodes", "2", "--smoke",
                           "--compile", "never", "--set", f"job.master_port={port}"],
                          cwd=tmp_path, text=True, capture_output=True, timeout=300, check=False,
                          env=_env(tmp_path, JOBGEN_SMOKE_FAIL_AT_STEP="5",
                                   JOBGEN_SMOKE_FAIL_NODE="1"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    watched = _watch(tmp_path, "llama2-7b-2n-smoke")
    assert (watched["failed"], watched["last_step"], watched["steps_read"]) == (True, 4, 4)
    assert re.fullmatch(r"the run failed: allocation 0 \(job local-[0-9]+-[0-9]+\), node [01] "
                        r"\([^)]+\) ended its train pass with status 1, after step 4"
                        r"( \(2 of 2 nodes failed\))?", watched["ended"]), watched["ended"]


@pytest.mark.parametrize("nodes,status", [(1, 75), (2, 78)])
def test_a_job_that_needs_accelerators_says_add_smoke(tmp_path: Path, nodes: int,
                                                      status: int) -> None:
    """Without --smoke on a machine without Gaudi devices, the health gate stops it at once and
    the advice is --smoke (not the site's health section, nor turning the gate off), one node
    failing or every node failing alike (78: a setting, not a node)."""
    if list(Path("/dev").glob("hl[0-9]*")):
        pytest.skip("this machine has Gaudi devices")
    started = time.monotonic()
    proc = subprocess.run([str(JOBGEN), "run", "bert1.5b", "--nodes", str(nodes)], cwd=tmp_path,
                          text=True, capture_output=True, env=_env(tmp_path), timeout=120,
                          check=False)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "job.health_gate: false" not in proc.stdout + proc.stderr
    assert ("jobgen: this machine has none of the job's accelerators (the health gate found no "
            "devices; nothing was compiled or trained): add --smoke to rehearse it on CPU\n"
            ) in proc.stderr
    assert "the health gate found a bad node" not in proc.stderr
    print(f"refused after {time.monotonic() - started:.1f} s")


def test_a_rehearsal_whose_python_lacks_its_modules_names_the_install_command(
        tmp_path: Path) -> None:
    """The README's bare set-up (no torch, no [payload] extra): `jobgen run ... --smoke` says in
    one line, before anything starts, which modules the nodes' interpreter lacks and the one
    command that installs them (torch's CPU wheel, then the extra that setup.cfg lists them in);
    no traceback, no wait, no run recorded."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    started = time.monotonic()
    proc = subprocess.run([str(JOBGEN), "run", "bert1.5b", "--nodes", "2", "--smoke"], cwd=work,
                          text=True, capture_output=True, timeout=120, check=False,
                          env=_env(tmp_path, JOBGEN_PYTHON=str(bare / "bin" / "python3")))
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert (f"the rehearsal's nodes run Python {bare}/bin/python3, which lacks torch, "
            "deepspeed, h5py, numpy, transformers (what their programs import): install "
            f"with: {bare}/bin/python3 -m pip install torch --index-url "
            f"https://download.pytorch.org/whl/cpu && {bare}/bin/python3 -m pip install -e "
            f"'{Path(__file__).resolve().parent.parent}[payload]'") in line
    assert not (work / "jobgen-runs").exists() and not list(work.iterdir())
    assert not (tmp_path / "state").exists()          # no line in `jobgen runs`
    assert took < 20, took
    print(f"refused after {took:.1f} s")


def test_what_the_programs_import_and_who_installs_it() -> None:
    """The modules are read from the programs themselves (their own modules followed), the
    extras from jobgen's own requirements (setup.cfg), and torch's command is docs/setup.md's."""
    from jobgen.backends.local import needs
    root = Path(__file__).resolve().parent.parent
    payload = root / "payload"
    bert = payload / "habana_deepspeed" / "pretrain_bert.py"
    found = needs.imported([bert], [payload, bert.parent])
    assert {"torch", "deepspeed", "transformers", "h5py", "numpy"} <= found
    assert not found & {"common", "bert_data", "accelerators", "lamb", "__future__"}
    smoke = payload / "smoke" / "train.py"
    assert "deepspeed" not in needs.imported([smoke], [payload, smoke.parent])
    extras = needs.installers()
    assert {m: extras.get(m) for m in ("deepspeed", "transformers", "h5py", "numpy")} == \
        dict.fromkeys(("deepspeed", "transformers", "h5py", "numpy"), "payload")
    assert "torch" not in extras and "pytest" not in extras
    setup = (root / "docs" / "setup.md").read_text()
    assert f"pip {needs.CPU_TORCH}" in setup and "pip install -e '.[payload]'" in setup
