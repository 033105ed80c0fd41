"""Follow a training job: export, then score, every K-th sealed step while it trains.

A step S with S % K == 0 is taken once it is sealed (checkpoints.py) and the trainer logged
step S+1 (so that its export can be proven), or once training has ended; oldest first, one at a
time: the program after ``+export`` (the export, its flags) with ``--step S``, then the one after
``+eval`` (eval_step.py, its flags) with ``--step S``. A step exported (scored) already is not
done again; a step pruned before its turn is skipped in one line. Training has ended once squeue
no longer lists its job (``--slurm-job-env VAR`` holds its id) or ``--until FILE`` exists; then
one last sweep, and the exit: 0, else the first failed export's or eval's status.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent)]

from common import checkpoints, export_check

PROG = "follow"
PERMANENT_ON_NODE = 78
UNPROVEN = 3                  # export_hf.run: exported, but no logged step to prove it with
EXPORT_RECORD = "jobgen-export.json"
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE"})   # squeue's states of a job that will not run again


class FollowError(Exception):
    """Bad input: one line, exit 2 (78 with --on-node)."""


def wanted(root: Path, every: int) -> list[int]:
    """The sealed steps under ``root`` that are multiples of ``every`` (oldest first)."""
    complete, _ = checkpoints.list_checkpoints(root)
    return [c.step for c in complete if c.step > 0 and c.step % every == 0]


def exported(export_root: Path, step: int) -> bool:
    return (export_root / f"step-{step}" / EXPORT_RECORD).is_file()


def scored(eval_root: Path, step: int) -> bool:
    return (eval_root / f"step-{step}.json").is_file()


def ready(step: int, logged: set[int], ended: bool) -> bool:
    """Whether a sealed step's turn has come: its proof's step is logged, or no more will be."""
    return ended or step + 1 in logged


def slurm_ended(job_id: str) -> bool:
    """Whether squeue no longer lists the job, or lists it ended (a requeued job is listed
    again as pending: still followed). A squeue that fails otherwise counts as running."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                              text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if proc.returncode != 0:
        return "invalid job id" in (proc.stderr or "").lower()
    # squeue -j lists a job that ended a moment ago (MinJobAge) in its final state.
    return all(state.strip() in FINAL for state in proc.stdout.split())


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """Its own flags, the export's words (program, then its flags) and eval_step.py's."""
    if "+export" not in argv:
        raise FollowError("+export PROGRAM ARGS... is required (the export program to run)")
    cut = argv.index("+export")
    own, rest = argv[:cut], argv[cut + 1:]
    export_words, eval_words = (rest[:rest.index("+eval")], rest[rest.index("+eval") + 1:]) \
        if "+eval" in rest else (rest, [])
    if not export_words:
        raise FollowError("+export: no program given")
    if "+eval" in rest and not eval_words:
        raise FollowError("+eval: no program given")
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                usage=f"{PROG} [options] +export PROGRAM ARGS... "
                                      "[+eval PROGRAM ARGS...]")
    p.add_argument("--checkpoints", type=Path, required=True, help="the trainer's checkpoints")
    p.add_argument("--metrics", type=Path, required=True, help="the trainer's metrics.jsonl")
    p.add_argument("--export-root", type=Path, required=True)
    p.add_argument("--eval-root", type=Path, required=True)
    p.add_argument("--every", type=int, required=True, metavar="K")
    ends = p.add_mutually_exclusive_group(required=True)
    ends.add_argument("--slurm-job-env", metavar="VAR",
                      help="the environment variable holding the training job's Slurm id")
    ends.add_argument("--until", type=Path, metavar="FILE",
                      help="training has ended once FILE exists")
    p.add_argument("--poll", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--on-node", action="store_true",
                   help="bad input exits 78 instead of 2 (a node's code: no retry cures it)")
    args = p.parse_args(own)
    if args.every < 1:
        raise FollowError(f"--every {args.every}: K must be at least 1")
    if not args.poll > 0:
        raise FollowError(f"--poll {args.poll}: must be more than 0 seconds")
    return args, export_words, eval_words


def end_test(args: argparse.Namespace) -> Callable[[], bool]:
    if args.until is not None:
        until: Path = args.until
        return until.exists
    job_id = os.environ.get(args.slurm_job_env, "").strip()
    if not job_id.isdigit():
        raise FollowError(f"--slurm-job-env {args.slurm_job_env}: holds no Slurm job id "
                          f"({job_id!r}; the follower is submitted with --export=ALL,"
                          f"{args.slurm_job_env}=ID)")
    return lambda: slurm_ended(job_id)


def say(line: str) -> None:
    print(f"{PROG}: {line}", flush=True)


def child(words: list[str]) -> int:
    """One program of the payload, with the interpreter this one runs in."""
    program = Path(words[0])
    if not program.is_absolute():
        program = _HERE.parent / program
    return subprocess.run([sys.executable, str(program), *words[1:]], check=False).returncode


def follow(args: argparse.Namespace, export_words: list[str], eval_words: list[str],
           ended: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> int:
    seen: set[int] = set()
    finished: set[int] = set()
    counts = {"exported": 0, "scored": 0, "skipped": 0, "failed": 0}
    first_failure = 0
    say(f"following {args.checkpoints}: every sealed step that is a multiple of {args.every}, "
        f"exported into {args.export_root}" + (f", scored into {args.eval_root}"
                                                if eval_words else ""))
    while True:
        over = ended()          # asked first: the sweep after it sees every step saved before
        sealed = wanted(args.checkpoints, args.every)
        logged = export_check.logged_steps(args.metrics)
        seen.update(sealed)
        pending = sorted(seen - finished)
        turn = next((s for s in pending if s not in sealed or ready(s, logged, over)), None)
        if turn is None:
            if over:
                break
            sleep(args.poll)
            continue
        finished.add(turn)
        if turn not in sealed:
            counts["skipped"] += 1
            say(f"step {turn}: skipped: checkpoint pruning removed it before its export")
            continue
        status = 0
        if not exported(args.export_root, turn):
            say(f"step {turn}: exporting")
            status = child([*export_words, "--step", str(turn)])
            if status not in (0, UNPROVEN) and turn not in wanted(args.checkpoints, args.every):
                counts["skipped"] += 1
                say(f"step {turn}: skipped: checkpoint pruning removed it during its export")
                continue
            if status in (0, UNPROVEN):
                counts["exported"] += 1
        if status in (0, UNPROVEN) and eval_words and not scored(args.eval_root, turn):
            say(f"step {turn}: scoring")
            status = child([eval_words[0], "--step", str(turn), *eval_words[1:]])
            counts["scored"] += status == 0
        if status not in (0, UNPROVEN):
            counts["failed"] += 1
            first_failure = first_failure or status
            say(f"step {turn}: failed with status {status} (the lines above say why); "
                "following on")
    say("training has ended; " + ", ".join(f"{n} {what}" for what, n in counts.items()))
    return first_failure


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    failed = PERMANENT_ON_NODE if "--on-node" in argv[:argv.index("+export")
                                                      if "+export" in argv else None] else 2
    try:
        args, export_words, eval_words = parse(argv)
        ended = end_test(args)
    except FollowError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return failed
    return follow(args, export_words, eval_words, ended)


if __name__ == "__main__":
    sys.exit(main())
