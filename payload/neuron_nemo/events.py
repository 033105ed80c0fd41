"""NeMo's training progress as jobgen's events (payload/common/events.py), on the main node.

neuronx-nemo-megatron prints no JSON events: global rank 0 logs its numbers to TensorBoard
through Lightning (MegatronGPTModel.training_step: ``reduced_train_loss``, ``lr``,
``gradient_norm`` and ``parameter_norm`` on full-log steps; ``global_step``,
``consumed_samples``, ``throughput`` and ``throughput_peak`` on every logged step). This relay
runs beside the training pass on node 0 (where rank 0 writes the event files), reads the event
files NeMo writes under its log folder, and turns each logged step into the same ``start``,
``step`` and ``beat`` events the other payloads print: on stdout (the node's log, a pod's log,
SageMaker's CloudWatch stream: what SageMaker's metric definitions and the watch of a SageMaker or
EKS job read), in the node's pass log beside NeMo's own output (what the watch of a Slurm or Batch
job reads) and in ``RUN_DIR/train/metrics.jsonl`` (what `jobgen plan --from-run` reads).

Event files that exist when the relay starts belong to an earlier attempt and are left alone,
also once NeMo, resuming, moves them into a ``run_N`` folder (exp_manager's check_resume): they
are known by their names, which TensorBoard makes unique (time, host, process).
usage: events.py NEMO_LOG_DIR METRICS_PATH NODE_LOG [HYDRA_OVERRIDE...]   (stops on SIGTERM,
after a last read)
"""
from __future__ import annotations

import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.events import format_event, node_index, now_iso  # noqa: E402

# NeMo's TensorBoard tags -> the step event's fields (the names payload/common/loop.py uses).
FIELDS = {"reduced_train_loss": "loss", "lr": "lr", "gradient_norm": "grad_norm",
          "parameter_norm": "param_norm", "throughput": "samples_per_s"}
LAST = "throughput_peak"   # the last scalar training_step logs on every logged step
POLL_S = 1.0


def _scalars(event: Any) -> Iterator[tuple[str, float]]:
    for value in event.summary.value:
        if value.HasField("simple_value"):      # what Lightning's SummaryWriter writes
            yield value.tag, float(value.simple_value)
        elif value.HasField("tensor") and value.tensor.float_val:   # TensorBoard's newer form
            yield value.tag, float(value.tensor.float_val[0])


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


class Relay:
    def __init__(self, log_dir: Path, metrics: Path, node_log: Path, node: int) -> None:
        self.log_dir, self.metrics, self.node_log, self.node = log_dir, metrics, node_log, node
        self.old = {path.name for path in self._files()}   # an earlier attempt's files
        self.loaders: dict[Path, Any] = {}
        self.pending: dict[int, dict[str, Any]] = {}   # TB step -> its scalars so far

    def _files(self) -> list[Path]:
        return sorted(self.log_dir.rglob("events.out.tfevents.*")) if self.log_dir.is_dir() \
            else []

    def write(self, line: str, metrics: bool = True) -> None:
        print(line, flush=True)
        # Appended a line at a time (one write each), as tee appends NeMo's output to the log.
        for path in (self.node_log, self.metrics) if metrics else (self.node_log,):
            with open(path, "a", encoding="utf-8") as handle:
                handle.write(line + "\n")

    def read(self) -> None:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        for path in self._files():
            if path.name in self.old:
                continue
            loader = self.loaders.setdefault(path, EventFileLoader(str(path)))
            for event in loader.Load():   # from where the last read stopped
                scalars = dict(_scalars(event))
                if scalars:
                    entry = self.pending.setdefault(int(event.step), {"time": event.wall_time})
                    entry.update(scalars)
        # A step is complete with its last scalar (throughput_peak), or once a later step is
        # logged (the scalars of one step are records of their own).
        steps = sorted(self.pending)
        for step in steps:
            if step != steps[-1] or LAST in self.pending[step]:
                self.emit(self.pending.pop(step))

    def flush(self) -> None:
        for step in sorted(self.pending):
            self.emit(self.pending.pop(step))

    def emit(self, scalars: dict[str, Any]) -> None:
        if "global_step" not in scalars:
            return
        # NeMo logs the steps done before this one; the event counts this one too.
        step = int(scalars["global_step"]) + 1
        fields: dict[str, Any] = {"phase": "train", "step": step}
        if "consumed_samples" in scalars:
            fields["consumed_samples"] = int(scalars["consumed_samples"])
        fields.update({name: scalars[tag] for tag, name in FIELDS.items() if tag in scalars})
        self.write(format_event("step", **fields, time=_iso(scalars["time"])))
        # The node goes on with the next step (only rank 0 logs: node 0's beat).
        self.write(format_event("beat", phase="train", node=self.node, step=step + 1,
                                time=_iso(scalars["time"])), metrics=False)


def _override(args: list[str], key: str) -> Optional[int]:
    for arg in args:
        name, _, value = arg.partition("=")
        if name.lstrip("+") == key and value.isdigit():
            return int(value)
    return None


def main(argv: list[str]) -> int:
    import os
    stopping: list[int] = []   # first: a stop before the imports below still gets a last read
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    if len(argv) < 3:
        print("usage: events.py NEMO_LOG_DIR METRICS_PATH NODE_LOG [HYDRA_OVERRIDE...]",
              file=sys.stderr)
        return 2
    metrics, node_log = Path(argv[1]), Path(argv[2])
    for path in (metrics, node_log):
        path.parent.mkdir(parents=True, exist_ok=True)
    relay = Relay(Path(argv[0]), metrics, node_log, node_index(os.environ))
    try:
        import tensorboard  # noqa: F401  (NeMo's images carry it: Lightning's logger needs it)
    except ImportError:
        print(format_event("notice", message="tensorboard is not installed: NeMo's steps are "
                           "not relayed as events", time=now_iso()), flush=True)
        return 0
    relay.write(format_event("start", phase="train", node=relay.node, source="nemo",
                             global_batch_size=_override(argv[3:], "model.global_batch_size"),
                             max_steps=_override(argv[3:], "trainer.max_steps"),
                             time=now_iso()))
    while not stopping:
        relay.read()
        time.sleep(POLL_S)
    relay.read()
    relay.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
