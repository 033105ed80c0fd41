#!/usr/bin/env python3
"""False alarms and detections of `jobgen watch`, measured on real CPU rehearsals.

    python benchmarks/watch_alarms.py [--seeds 3] [--nodes 2] [--recipes bert-large,...]
    python benchmarks/watch_alarms.py --record DIR     # also keep each run's event stream
    python benchmarks/watch_alarms.py --replay DIR     # judge kept streams again (seconds)

Healthy runs: `jobgen run RECIPE --smoke --nodes 2 --compile never --set seed=S` for every
recipe and seed, nothing injected; each is judged as `jobgen watch --run-dir` judges a folder
(default rules), and every alert on it is a false alarm.

Injected runs, one per fault and GPT recipe (the smoke trainer injects them for real,
payload/smoke/train.py): a gradient spike (step 8, loss x100), a loss spike (step 12), a
throughput drop (from step 14, each step 1 s longer: the trainer's default), divergence
(learning rate x1000 from step 10), a NaN at step 10, all through `jobgen run`; and a hang
(the trainer alone, stopped before step 10 and killed once seen to hang). A fault counts as
detected when its alert comes at or after the step it was injected at (the hang: when the watch
looks again after its allowance: no step came, the run did not end). Alerts before the
injected step are false alarms too.

Prints one line per run, then the two counts; exit status 0 when there was no false alarm and
every fault was detected. --record writes each run's node-0 events (the stream `watch` reads)
as DIR/CASE.jsonl; tests/test_watching.py replays such recordings.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent
JOBGEN = [str(BIN / "jobgen")] if (BIN / "jobgen").exists() else [sys.executable, "-m",
                                                                   "jobgen.cli"]
RECIPES = ("bert-large", "bert1.5b", "llama2-7b", "neox20b", "pythia6.9b")
GPT_RECIPES = ("llama2-7b", "neox20b", "pythia6.9b")
# fault -> (the trainer's environment, the step it acts on, the alert kinds that catch it)
FAULTS: dict[str, tuple[dict[str, str], int, tuple[str, ...]]] = {
    "spike": ({"JOBGEN_SMOKE_SPIKE_AT_STEP": "8"}, 8, ("grad_spike",)),
    "loss_spike": ({"JOBGEN_SMOKE_LOSS_SPIKE_AT_STEP": "12"}, 12, ("loss_spike",)),
    "slow": ({"JOBGEN_SMOKE_SLOW_AT_STEP": "14", "JOBGEN_SMOKE_SLOW_SECONDS": "1"}, 14,
             ("throughput_drop",)),
    "diverge": ({"JOBGEN_SMOKE_DIVERGE_AT_STEP": "10"}, 10, ("divergence", "nonfinite")),
    "nan": ({"JOBGEN_SMOKE_NAN_AT_STEP": "10"}, 10, ("nonfinite",)),
    "hang": ({"JOBGEN_SMOKE_HANG_AT_STEP": "10", "JOBGEN_SMOKE_HANG_NODE": "0"}, 10,
             ("hang",)),
}
NODES = 2
KEEP = ("event", "phase", "step", "consumed_samples", "loss", "grad_norm", "node", "time")


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOBGEN_SMOKE_", "SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                "MASTER_"))}
    env.update(extra)
    return env


# --- making runs ----------------------------------------------------------------------------------

def free_port() -> int:
    """A port free now (the recipes' fixed master port may be taken on a shared machine)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rehearse(workdir: Path, recipe: str, seed: int, fault: Optional[str],
             nodes: int = NODES) -> tuple[str, Path]:
    """One `jobgen run` rehearsal; returns (its case name, the file watch reads)."""
    case = f"{recipe}-s{seed}" + (f"-{nodes}n" if nodes != NODES else "") + \
        (f"-{fault}" if fault else "")
    env = clean_env(FAULTS[fault][0] if fault else {})
    result = subprocess.run([*JOBGEN, "run", recipe, "--smoke", "--compile", "never",
                             "--nodes", str(nodes), "--run-name", case, "--set", f"seed={seed}",
                             "--set", f"job.master_port={free_port()}"],
                            cwd=workdir, env=env, capture_output=True, text=True, timeout=900,
                            check=False)
    metrics = workdir / "jobgen-runs" / case / "train" / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"{case}: jobgen run exited {result.returncode} without a metrics "
                         f"file:\n{result.stderr[-2000:]}")
    return case, metrics


def hang_run(workdir: Path, seed: int) -> tuple[str, Path]:
    """The trainer alone, hanging before step 10: killed once it has hung for 3 s."""
    case = f"smoke-s{seed}-hang"
    out = workdir / case
    env = clean_env({**FAULTS["hang"][0], "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    log = workdir / f"{case}.log"
    with log.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "payload" / "smoke" / "train.py"), "--family", "llama",
             "--max-steps", "24", "--checkpoint-every", "4", "--seed", str(seed), "--phase",
             "train", "--output-dir", str(out)], cwd=workdir, env=env, stdout=stdout,
            stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (out / ".jobgen-smoke-hang").exists() and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{case}: the trainer ended ({proc.returncode}) before hanging")
            time.sleep(0.2)
        time.sleep(3.0)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return case, log


def stream_of(path: Path) -> list[str]:
    """The event lines `watch` reads from a run's file, with the fields it uses."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line.startswith('{"event"'):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kept = {k: event[k] for k in KEEP if k in event}
        for key in ("loss", "grad_norm"):     # 7 digits, as the trainers' float32 has them
            if isinstance(kept.get(key), float):
                kept[key] = float(f"{kept[key]:.7g}")
        lines.append(json.dumps(kept, separators=(", ", ": ")))
    return lines


# --- judging --------------------------------------------------------------------------------------

def judge(lines: list[str], rules: Any = None) -> tuple[list[Any], bool]:
    """The alerts `jobgen watch --run-dir` raises on a run folder holding these events (as
    train/metrics.jsonl), and whether the stream ended (done or stopped). A stream that did not
    end is looked at once more after the hang allowance, as a live watch would look at a job
    that is still there."""
    from jobgen.watching.detectors import Detectors, Rules
    from jobgen.watching.readers import RunReader
    from jobgen.watching.watcher import Policy, Watch
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "train"
        folder.mkdir()
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        detectors = Detectors(rules or Rules())
        watch = Watch(RunReader(Path(tmp)), detectors, Policy(), None, Quiet())
        summary = watch.run(0.0)
    alerts = list(summary.alerts)
    ended = detectors.ended
    if not ended and detectors.last_progress is not None:
        alerts += detectors.tick(detectors.last_progress + detectors.hang_allowance() + 1.0)
    return alerts, ended


class Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def verdict(case: str, alerts: list[Any]) -> tuple[int, Optional[bool]]:
    """(false alarms, detected: None for a healthy run)."""
    fault = next((f for f in FAULTS if case.endswith(f"-{f}")), None)
    if fault is None:
        return len(alerts), None
    _, at, kinds = FAULTS[fault]
    # A hang's alert names the last step trained (the one before the step it stopped at).
    first = at - 1 if fault == "hang" else at
    false = [a for a in alerts if a.step is not None and a.step < first]
    caught = any(a.kind in kinds and (a.step is None or a.step >= first) for a in alerts)
    return len(false), caught


def report(streams: dict[str, list[str]]) -> int:
    false_alarms = healthy = injected = detected = 0
    for case, lines in streams.items():
        alerts, _ = judge(lines)
        false, caught = verdict(case, alerts)
        false_alarms += false
        shown = ", ".join(f"{a.kind}@{a.step}" for a in alerts) or "no alerts"
        if caught is None:
            healthy += 1
            print(f"healthy   {case:28} {shown}")
        else:
            injected += 1
            detected += caught
            print(f"{'caught' if caught else 'MISSED':9} {case:28} {shown}")
    print(f"false alarms: {false_alarms} over {healthy} healthy run(s) (and the steps before "
          f"each injected fault)")
    print(f"detected: {detected} of {injected} injected fault(s)")
    return 0 if false_alarms == 0 and detected == injected else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="healthy runs per recipe")
    parser.add_argument("--nodes", type=int, default=NODES, help="emulated nodes per run")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help="the faults to inject (none: '')")
    parser.add_argument("--workdir", type=Path, help="keep the runs here (default: a temporary "
                                                     "folder, removed)")
    parser.add_argument("--record", type=Path, help="write each run's event stream here")
    parser.add_argument("--replay", type=Path, help="judge the streams recorded here instead")
    args = parser.parse_args()
    if args.replay:
        kept = {p.stem: p.read_text().splitlines() for p in sorted(args.replay.glob("*.jsonl"))}
        if not kept:
            raise SystemExit(f"{args.replay}: no recorded streams (*.jsonl)")
        return report(kept)
    recipes = [r for r in args.recipes.split(",") if r]
    faults = [f for f in args.faults.split(",") if f]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="watch-alarms-"))
    workdir.mkdir(parents=True, exist_ok=True)
    streams: dict[str, list[str]] = {}
    started = time.monotonic()
    try:
        for recipe in recipes:
            for seed in range(1, args.seeds + 1):
                case, path = rehearse(workdir, recipe, seed, None, args.nodes)
                streams[case] = stream_of(path)
                print(f"ran {case} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        for fault in faults:
            for recipe in ([r for r in recipes if r in GPT_RECIPES] if fault != "hang"
                           else ["smoke"]):
                case, path = hang_run(workdir, 1) if fault == "hang" else \
                    rehearse(workdir, recipe, 1, fault, args.nodes)
                streams[case] = stream_of(path)
                print(f"ran {case} ({time.monotonic() - started:.0f} s)", file=sys.stderr)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.record:
        args.record.mkdir(parents=True, exist_ok=True)
        for case, lines in streams.items():
            (args.record / f"{case}.jsonl").write_text("\n".join(lines) + "\n")
    return report(streams)


if __name__ == "__main__":
    sys.exit(main())
