"""NeMo visible everywhere: the NeMo payload's training pass prints jobgen's step, beat and start
events (payload/neuron_nemo/events.py relays what NeMo logs to TensorBoard), so that `jobgen
watch`, SageMaker's metric definitions and `jobgen plan --from-run` read neox20b and pythia6.9b
as they read the other payloads.

There is no NeMo here: a stand-in program takes the Hydra overrides jobgen renders and writes
what neuronx-nemo-megatron's MegatronGPTModel.training_step logs through Lightning's
TensorBoard logger (its scalar names, every `trainer.log_every_n_steps` steps, into
`exp_manager.explicit_log_dir`); the real payload/neuron_nemo/launch.sh runs it under torchrun."""
from __future__ import annotations

import json
import os
import posixpath
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobgen import api, payloads
from jobgen.backends.sagemaker.request import METRICS
from jobgen.payloads import node
from jobgen.planning.measurements import read_events, run_throughput
from jobgen.plumbing import resources
from jobgen.watching.readers import RunReader, parse_lines

pytest.importorskip("tensorboard")

# neuronx-nemo-megatron's scalars (megatron_gpt_model.py, training_step's _log_metrics): the
# loss, lr and norms on full-log steps, the step count, samples and throughput on every one.
STAND_IN = '''
import os, sys, time
from torch.utils.tensorboard import SummaryWriter
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("--"))
if os.environ.get("RANK", "0") != "0":
    sys.exit(0)   # Lightning logs on global rank 0 only
steps = int(args["trainer.max_steps"])
every = int(args["trainer.log_every_n_steps"])
batch = int(args["model.global_batch_size"])
writer = SummaryWriter(args["exp_manager.explicit_log_dir"])
for step in range(steps):
    time.sleep(0.05)
    if step % every:
        continue     # Lightning hands the logger the metrics every log_every_n_steps
    writer.add_scalar("reduced_train_loss", 10.0 - step / 100, step)
    writer.add_scalar("lr", 1e-4, step)
    writer.add_scalar("gradient_norm", 1.5, step)
    writer.add_scalar("global_step", float(step), step)
    writer.add_scalar("consumed_samples", float((step + 1) * batch), step)
    writer.add_scalar("throughput", 42.0, step)
    writer.add_scalar("throughput_peak", 43.0, step)
    writer.flush()   # Lightning's logger.save() after each log
print("Epoch 0: 100%|##########| done")
'''


def _run(recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str]:
    monkeypatch.chdir(tmp_path)
    s = api.job_spec(recipe, 1, site="local", backend="slurm",
                     overrides=("schedule.max_steps=30", "schedule.warmup_steps=2",
                                "checkpoint.every_steps=10", "job.log_every_steps=2"))
    lau = payloads.for_spec(s, "slurm")
    train = lau.train_args
    workdir = tmp_path / "nemo-checkout"
    program = workdir / "megatron_gpt_pretraining.py"
    program.parent.mkdir(parents=True)
    program.write_text(STAND_IN)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "JOBGEN_WORKERS_PER_NODE": "2", "JOBGEN_NODE_RANK": "0", "JOBGEN_NNODES": "1",
           # A Slurm job's log folder (the flow's JOBGEN_LOG_DIR): what `jobgen watch` reads.
           "JOBGEN_LOG_DIR": str(Path(s.run_dir, "logs", "777", "restart-0")),
           "JOBGEN_RUN_DIR": s.run_dir,
           "JOBGEN_WORKDIR": str(workdir), "JOBGEN_PROGRAM": program.name,
           "JOBGEN_PYTHON": sys.executable,
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    launch = resources.folder("payload") / lau.launcher
    proc = subprocess.run(["bash", str(launch), "train", *train], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return s, proc.stdout


def _write(folder: Path, steps: range, batch: int) -> None:
    """Scalar events as torch's SummaryWriter.add_scalar writes them (Lightning's logger), with
    TensorBoard's own writer: importing torch would take most of this test's time."""
    import time

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    writer = EventFileWriter(str(folder))
    for step in steps:
        for tag, value in (("reduced_train_loss", 9.0), ("global_step", float(step)),
                           ("consumed_samples", float((step + 1) * batch))):
            writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(
                value=[Summary.Value(tag=tag, simple_value=value)])))
    writer.close()


def test_relay_turns_new_tensorboard_steps_into_events(tmp_path: Path) -> None:
    """The relay alone: an earlier attempt's event file is left alone (also once NeMo moved
    it), the new one's logged steps become step events (on stdout and in the metrics file), and
    SIGTERM ends it after a last read."""
    import signal
    import time
    nemo = tmp_path / "run" / "nemo"
    _write(nemo / "old", range(0, 50), 8)
    metrics = tmp_path / "run" / "train" / "metrics.jsonl"
    relay = subprocess.Popen(
        [sys.executable, str(resources.folder("payload") / "neuron_nemo" / "events.py"),
         str(nemo), str(metrics), str(tmp_path / "node-0" / "train.log"),
         "model.global_batch_size=8", "trainer.max_steps=60"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "JOBGEN_NODE_RANK": "0"})
    try:
        assert relay.stdout is not None
        first = json.loads(relay.stdout.readline())   # written once it has looked
        assert first["event"] == "start" and first["global_batch_size"] == 8
        time.sleep(0.5)
        # NeMo, resuming, moves the files of the log folder into run_<n> (check_resume).
        (nemo / "run_0").mkdir()
        for path in (nemo / "old").iterdir():
            path.rename(nemo / "run_0" / path.name)
        _write(nemo / "new", range(50, 60, 5), 8)
        relay.send_signal(signal.SIGTERM)
        out, _ = relay.communicate(timeout=60)
    finally:
        if relay.poll() is None:
            relay.kill()
    assert relay.returncode == 0
    steps = [e for e in read_events(out) if e["event"] == "step"]
    assert [(e["step"], e["consumed_samples"], e["loss"]) for e in steps] == [
        (51, 408, 9.0), (56, 448, 9.0)]
    assert [e["event"] for e in read_events(metrics.read_text())] == ["start", "step", "step"]
    assert [e["event"] for e in read_events((tmp_path / "node-0" / "train.log").read_text())] \
        == ["start", "step", "beat", "step", "beat"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["neox20b", "pythia6.9b"])
def test_nemo_training_pass_prints_the_events_every_reader_uses(
        recipe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s, out = _run(recipe, tmp_path, monkeypatch)
    events = read_events(out)
    steps = [e for e in events if e["event"] == "step"]
    # NeMo logged steps 0, 2, ..., 28 (the steps done before each): events count them 1, 3, ...
    assert [e["step"] for e in steps] == list(range(1, 30, 2))
    assert all(e["phase"] == "train" and e["samples_per_s"] == 42.0 and e["grad_norm"] == 1.5
               for e in steps)
    assert steps[0]["loss"] == pytest.approx(10.0) and steps[-1]["loss"] == pytest.approx(9.72)
    assert steps[-1]["consumed_samples"] == 29 * s.global_batch_size
    start = next(e for e in events if e["event"] == "start")
    assert start["global_batch_size"] == s.global_batch_size and start["max_steps"] == 30
    beats = [e for e in events if e["event"] == "beat"]
    assert [b["step"] for b in beats] == [e["step"] + 1 for e in steps]
    assert {b["node"] for b in beats} == {0}
    # `jobgen plan --from-run` reads the run's metrics.jsonl: the same events.
    logged = read_events(Path(s.run_dir, "train", "metrics.jsonl").read_text())
    assert [e for e in logged if e["event"] == "step"] == steps
    rate, used = run_throughput(logged)
    assert used >= 3 and rate > 0
    # `jobgen watch`: a pod's or an instance's log (stdout), and a Slurm run folder (the node's
    # pass log): steps with their loss, and node 0's beats.
    for seen in (parse_lines(out.splitlines(), "node-0", 0),
                 RunReader(Path(s.run_dir)).read()):
        assert [o.step for o in seen if o.kind == "step"] == [e["step"] for e in steps]
        assert [o.loss for o in seen if o.kind == "step"][0] == pytest.approx(10.0)
        assert {o.node for o in seen if o.kind == "beat"} == {0}
    # SageMaker's metric definitions, as CloudWatch applies them to the log lines.
    for metric in METRICS:
        found = [float(m.group(1)) for line in out.splitlines()
                 if (m := re.search(metric["Regex"], line))]
        assert len(found) == len(steps), metric["Name"]


@pytest.mark.parametrize("backend", ["slurm", "batch", "sagemaker", "eks"])
def test_every_backend_runs_the_launcher_that_relays_nemo(backend: str) -> None:
    """The relay lives in the NeMo launcher, which every executor runs on every node."""
    site = "local" if backend in ("slurm", "batch") else "sagemaker"
    s = api.job_spec("neox20b", 2, site=site, backend=backend)
    lau = payloads.for_spec(s, backend)
    assert lau.launcher == "neuron_nemo/launch.sh"
    assert node.flow_args(lau)[1:] == [*lau.compile_args, *lau.train_args]
    text = (resources.folder("payload") / lau.launcher).read_text()
    assert '/events.py" "$JOBGEN_RUN_DIR/nemo"' in text
    # ... where NeMo writes its TensorBoard files in the training pass.
    assert f"exp_manager.explicit_log_dir={posixpath.join(s.run_dir, 'nemo')}" in lau.train_args
