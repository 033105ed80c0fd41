"""A prepared check for a lent GPU (not part of CI): payload/smp_fsdp/train_fsdp.py's path
without SMP (FSDP2, bf16, NCCL) on one CUDA device — compile pass, training, a kill mid-run, the
resume — and the proof that the loss after the resume continues the loss before it. Its figures
(steps/s, tokens/s, peak memory) are printed last. It takes under 5 minutes, start-up included.

    python tests/gpu/fsdp_resume.py            # one CUDA device
    python tests/gpu/fsdp_resume.py --cpu      # the same logic on CPU: gloo, tiny sizes

What it checks, from the runs' metrics.jsonl:
1. the compile pass runs its steps and saves nothing;
2. a run killed (SIGKILL) after its first checkpoint had not finished, and its resume starts
   from that checkpoint's step and consumed-sample count;
3. the resumed run trains exactly the steps after it, each on the samples that follow the last
   one (consumed_samples = step x global batch: nothing repeated, nothing skipped);
4. the loss of every step after the resume equals the uninterrupted reference run's loss at that
   step, and the steps the killed run trained past its checkpoint are retrained with the same
   losses (same data order), within a tolerance (exact on CPU; bf16 kernels on a GPU are not
   bitwise reproducible).
Exit status 0 when every check holds, 1 otherwise (the failed check on stderr).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

PROGRAM = Path(__file__).resolve().parents[2] / "payload" / "smp_fsdp" / "train_fsdp.py"
# The model on a GPU (~165M parameters: big enough for steady figures, small enough to start
# fast) and on CPU (the logic only).
SIZES = {"cuda": ["--num-layers", "8", "--hidden-size", "1024", "--num-heads", "16",
                  "--intermediate-size", "2816", "--seq-length", "1024", "--vocab-size", "32000",
                  "--micro-batch-size", "8"],
         "cpu": ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "4",
                 "--intermediate-size", "128", "--seq-length", "32", "--vocab-size", "256",
                 "--micro-batch-size", "2"]}


class CheckFailed(Exception):
    pass


def check(ok: bool, what: str) -> None:
    if not ok:
        raise CheckFailed(what)


def events(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def launch(opts: argparse.Namespace, phase: str, out: Path, log: Path) -> subprocess.Popen:
    device = "cpu" if opts.cpu else "cuda"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "1", str(PROGRAM), "--family", "llama", *SIZES[device],
               "--gradient-accumulation", "2", "--lr", "3e-4", "--warmup-steps", "5",
               "--max-steps", str(opts.max_steps), "--checkpoint-every",
               str(opts.checkpoint_every), "--compile-steps", "3", "--device", device,
               "--precision", opts.precision, "--synthetic", "--phase", phase,
               "--output-dir", str(out)]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (torchrun starts its workers in sessions of their own, so a
    kill of its process group would not reach them)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def finish(proc: subprocess.Popen, what: str, log: Path) -> None:
    check(proc.wait() == 0, f"{what} exited with status {proc.returncode}; its log: {log}")


def kill_after_first_checkpoint(opts: argparse.Namespace, run: Path, log: Path) -> int:
    """Train, SIGKILL the whole run once it has sealed its first checkpoint; the step at kill."""
    proc = launch(opts, "train", run, log)
    while proc.poll() is None:
        if any(e["event"] == "checkpoint" for e in events(run)):
            for pid in [proc.pid, *descendants(proc.pid)]:   # as a dying node would
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        time.sleep(0.02)
    proc.wait()
    seen = events(run)
    check(not any(e["event"] == "done" for e in seen),
          "the run finished before the kill: raise --max-steps")
    return max(e["step"] for e in seen if e["event"] == "step")


def losses(seen: list[dict[str, Any]]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in seen if e["event"] == "step"}


def close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance * max(abs(b), 1e-12)


def verify(opts: argparse.Namespace, ref: Path, run: Path, killed_at: int) -> None:
    reference, seen = losses(events(ref)), events(run)
    tolerance = 1e-5 if opts.cpu else 2e-2
    first_start = next(i for i, e in enumerate(seen) if e["event"] == "start")
    second = next(i for i, e in enumerate(seen) if e["event"] == "start" and i > first_start)
    before, after = seen[:second], seen[second:]
    saved = max(e["step"] for e in before if e["event"] == "checkpoint")
    resume = [e for e in after if e["event"] == "resume"]
    check(len(resume) == 1 and resume[0]["step"] == saved,
          f"the resume did not start from the checkpoint of step {saved}: {resume}")
    batch = next(e for e in before if e["event"] == "start")["global_batch_size"]
    check(resume[0]["consumed_samples"] == saved * batch,
          f"resume consumed_samples {resume[0]['consumed_samples']} != {saved} x {batch}")
    steps = [e for e in after if e["event"] == "step"]
    check([e["step"] for e in steps] == list(range(saved + 1, opts.max_steps + 1)),
          f"the resumed run's steps are not {saved + 1}..{opts.max_steps}")
    check(all(e["consumed_samples"] == e["step"] * batch for e in steps),
          "a resumed step's consumed_samples is not step x global batch (samples repeated or "
          "skipped)")
    for e in steps:
        check(close(e["loss"], reference[e["step"]], tolerance),
              f"step {e['step']}: loss {e['loss']} after the resume, {reference[e['step']]} "
              f"without interruption")
    retrained = {s: v for s, v in losses(before).items() if s > saved}
    for s, v in retrained.items():
        check(close(losses(after)[s], v, tolerance),
              f"step {s} retrained after the resume with loss {losses(after)[s]}, {v} before")
    print(f"resume: killed at step {killed_at}, resumed from step {saved}, "
          f"{len(retrained)} steps retrained with the same losses, {len(steps)} steps after the "
          f"resume within {tolerance:g} of the uninterrupted run")


def figures(opts: argparse.Namespace, ref: Path) -> str:
    seen = [e for e in events(ref) if e["event"] == "step" and e["step"] > 3]   # after warm-up
    stamps = [datetime.fromisoformat(e["time"]).timestamp() for e in seen]
    steps_per_s = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    seq = int(SIZES["cpu" if opts.cpu else "cuda"][SIZES["cuda"].index("--seq-length") + 1])
    tokens_per_s = sum(e["samples_per_s"] for e in seen) / len(seen) * seq
    if opts.cpu:
        peak = f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20:.2f} GiB " \
               "(largest resident set of a process)"
    else:
        peak = f"{seen[-1]['peak_memory_gib']:.2f} GiB (torch.cuda.max_memory_allocated)"
    return (f"figures ({'cpu' if opts.cpu else 'one CUDA device'}, {opts.precision}): "
            f"{steps_per_s:.2f} steps/s, {tokens_per_s:,.0f} tokens/s, peak memory {peak}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU, tiny sizes")
    p.add_argument("--precision", choices=("bf16", "fp32"), default=None)
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--work", type=Path, default=None, help="where the runs go (default: temp)")
    opts = p.parse_args()
    opts.precision = opts.precision or ("fp32" if opts.cpu else "bf16")
    work = opts.work or Path(tempfile.mkdtemp(prefix="fsdp-resume-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        log = work / "compile.log"
        finish(launch(opts, "compile", work / "compile", log), "the compile pass", log)
        check(not (work / "compile" / "checkpoints").exists(), "the compile pass saved")
        log = work / "reference.log"
        finish(launch(opts, "train", work / "reference", log), "the reference run", log)
        killed_at = kill_after_first_checkpoint(opts, work / "run", work / "killed.log")
        log = work / "resumed.log"
        finish(launch(opts, "train", work / "run", log), "the resumed run", log)
        verify(opts, work / "reference", work / "run", killed_at)
        print(f"all checks hold ({time.monotonic() - started:.0f} s, runs in {work})")
        print(figures(opts, work / "reference"))
    except CheckFailed as failed:
        print(f"fsdp_resume: FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
