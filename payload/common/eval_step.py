"""The eval stage's job: which exported step it scores, then lm-eval on it (eval_lm.py).

``--step N`` names the step (``EXPORT_ROOT/step-N`` must be a complete export: renamed into
place with its ``jobgen-export.json``), else the newest complete one when the job starts. A
rehearsal first writes its task from the recipe's seed (``--smoke-task-seed``: smoke/eval_task.py
into ``EVAL_ROOT/tasks``). What follows ``--`` is eval_lm.py's own (the tasks, the site's folders),
given ``--model EXPORT_ROOT/step-N --output EVAL_ROOT/step-N.json``. Bad input is one line,
exit 2 (78 with ``--on-node``), nothing written.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent)]

from common import eval_lm

PROG = "eval-step"
STEP_FOLDER = re.compile(r"step-([0-9]+)")
GIVEN_HERE = ("--model", "--output", "--on-node")


def complete_steps(root: Path) -> list[int]:
    """The steps exported in full under ``root`` (a folder in the making has another name)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    found = (STEP_FOLDER.fullmatch(p.name) for p in entries if (p / eval_lm.RECORD).is_file())
    return sorted(int(m.group(1)) for m in found if m)


def chosen(root: Path, step: int | None) -> int:
    """``step``, or the newest complete export; one line where there is none."""
    steps = complete_steps(root)
    if not steps:
        raise eval_lm.EvalError(f"{root}: no complete export to evaluate (the export stage "
                                "writes step-N folders there)")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise eval_lm.EvalError(f"--step {step}: {root} has no complete export of step {step} "
                                f"(complete: {', '.join(map(str, steps))})")
    return step


def parse_args(own: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                                usage=f"{PROG} [options] -- EVAL_LM_OPTIONS")
    p.add_argument("--export-root", type=Path, required=True, help="the run's export folder")
    p.add_argument("--eval-root", type=Path, required=True,
                   help="writes EVAL_ROOT/step-N.json")
    p.add_argument("--step", type=int, default=None,
                   help="the exported step (default: the newest complete one)")
    p.add_argument("--smoke-task-seed", type=int, default=None, metavar="SEED",
                   help="a rehearsal: write smoke/eval_task.py's task into EVAL_ROOT/tasks first")
    p.add_argument("--on-node", action="store_true",
                   help="a permanent failure exits 78 (a node's code: no retry cures it)")
    return p.parse_args(own)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = parse_args(argv[:cut]), argv[cut + 1:]
    failed = eval_lm.PERMANENT_ON_NODE if args.on_node else 2
    try:
        clash = [flag for flag in GIVEN_HERE if flag in rest]
        if clash:
            raise eval_lm.EvalError(f"{', '.join(clash)}: given by {PROG} (the step's folder, "
                                    "its results file), not after --")
        step = chosen(args.export_root, args.step)
        if args.smoke_task_seed is not None:
            from smoke import eval_task
            made = eval_task.write(args.eval_root / "tasks", args.smoke_task_seed)
            print(f"{PROG}: {made}: the rehearsal's task, seed {args.smoke_task_seed}",
                  flush=True)
    except eval_lm.EvalError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return failed
    except OSError as exc:
        print(f"{PROG}: error: {exc.filename or args.eval_root}: {exc.strerror or exc}",
              file=sys.stderr)
        return failed
    how = "" if args.step is not None else " (the newest complete export)"
    print(f"{PROG}: step {step}{how}: {args.export_root / f'step-{step}'}", flush=True)
    return eval_lm.main(["--model", str(args.export_root / f"step-{step}"),
                         "--output", str(args.eval_root / f"step-{step}.json"), *rest,
                         *(["--on-node"] if args.on_node else [])])


if __name__ == "__main__":
    sys.exit(main())
