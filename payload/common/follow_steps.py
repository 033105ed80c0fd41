"""Follow a training job: export, then score, every K-th sealed step while it trains.

A step S with S % K == 0 is taken once the export lists it sealed (the program after
``+export``, its flags and ``--list-sealed``, each sweep; a failed listing is said and retried)
and the trainer logged step S+1 (so that its export can be proven), or once training has ended;
oldest first, one at a time: that program with ``--step S``, then the one after ``+eval``
(eval_step.py, its flags) with ``--step S``. A step exported (scored) already is not done again;
a step pruned before its turn is skipped in one line. Training has ended once squeue no longer
lists its job (``--slurm-job-env VAR`` holds its id) or ``--until FILE`` exists; then one last
sweep, and the exit: 0, else the first failed export's, eval's or listing's status.
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

from common import export_check

PROG = "follow"
PERMANENT_ON_NODE = 78
UNPROVEN = 3                  # export_hf.run: exported, but no logged step to prove it with
EXPORT_RECORD = "jobgen-export.json"
LAST_TRIES = 3               # listings that may fail after training has ended, before the exit
LISTING_TIMEOUT = 600.0      # seconds: a listing that hangs (a stuck shared disk) has failed
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE"})   # squeue's states of a job that will not run again


class FollowError(Exception):
    """Bad input: one line, exit 2 (78 with --on-node)."""


class Unlisted(Exception):
    """The export could not list its sealed steps this time (said in one line; asked again)."""

    def __init__(self, line: str, status: int) -> None:
        super().__init__(line)
        self.status = status


def sealed(export_words: list[str]) -> list[int]:
    """The steps the export would take (``--list-sealed``: its own choice of complete steps),
    oldest first; Unlisted where it fails or answers with anything but steps."""
    try:
        proc = subprocess.run([sys.executable, str(_program(export_words[0])), *export_words[1:],
                               "--list-sealed"], capture_output=True, text=True,
                              timeout=LISTING_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise Unlisted(f"no answer in {LISTING_TIMEOUT:g} s", 1) from None
    except OSError as exc:
        raise Unlisted(str(exc), 1) from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise Unlisted(f"status {proc.returncode}: {said[-1] if said else 'said nothing'}",
                       proc.returncode)
    lines = proc.stdout.split()
    if not all(line.isdigit() for line in lines):
        raise Unlisted(f"answered {proc.stdout.strip()[:200]!r}, not steps, one a line", 1)
    return sorted(int(line) for line in lines)


def wanted(export_words: list[str], every: int) -> list[int]:
    """The sealed steps the export lists that are multiples of ``every`` (oldest first)."""
    return [s for s in sealed(export_words) if s > 0 and s % every == 0]


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


def _program(word: str) -> Path:
    """A program of the payload (relative to its root) or one by absolute path."""
    program = Path(word)
    return program if program.is_absolute() else _HERE.parent / program


def child(words: list[str]) -> int:
    """One program of the payload, with the interpreter this one runs in."""
    return subprocess.run([sys.executable, str(_program(words[0])), *words[1:]],
                          check=False).returncode


def _listed(export_words: list[str], every: int, step: int) -> bool:
    """Whether ``step`` is still listed sealed (a failed listing: taken as still there)."""
    try:
        return step in wanted(export_words, every)
    except Unlisted:
        return True


def follow(args: argparse.Namespace, export_words: list[str], eval_words: list[str],
           ended: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> int:
    seen: set[int] = set()
    finished: set[int] = set()
    counts = {"exported": 0, "scored": 0, "skipped": 0, "failed": 0}
    first_failure = unlisted = 0
    say(f"following {export_words[0]}'s sealed steps: every one that is a multiple of "
        f"{args.every}, exported into {args.export_root}" + (f", scored into {args.eval_root}"
                                                             if eval_words else ""))
    while True:
        over = ended()          # asked first: the sweep after it sees every step saved before
        try:
            sealed = wanted(export_words, args.every)
        except Unlisted as exc:  # transient, as a shared disk's hiccup is: asked again
            unlisted = unlisted + 1 if over else 0   # counted once training has ended
            if unlisted >= LAST_TRIES:
                say(f"listing the sealed steps failed ({exc}) {unlisted} times since training "
                    "ended; giving up")
                first_failure = first_failure or exc.status or 1
                break
            say(f"listing the sealed steps failed ({exc}); asking again at the next sweep")
            sleep(args.poll)
            continue
        unlisted = 0
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
            if status not in (0, UNPROVEN) and not _listed(export_words, args.every, turn):
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
