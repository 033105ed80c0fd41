"""A multiple-choice task for lm-evaluation-harness, made here from a seed (no downloads).

Each question is the start of a sentence of the rehearsal corpus's grammar (corpus.py) and four
endings: the grammatical one and three of its words shuffled. A model trained on that corpus
prefers the first; lm-eval scores it with its own code (``acc``, ``acc_norm``). Writes
``OUT/jobgen_smoke_choice/`` (the task YAML and its two JSONL splits, read with ``dataset_path:
json``), complete or not at all, for ``eval_lm.py --tasks-dir OUT``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

from corpus import OBJECTS, SUBJECTS, VERBS

TASK = "jobgen_smoke_choice"
PROG = "smoke-eval-task"


def question(rng: random.Random) -> dict[str, Any]:
    """One document: a sentence's start, four endings, the index of the grammatical one."""
    words = f"{rng.choice(VERBS)} {rng.choice(OBJECTS)}".split()   # 3 words or more
    right = " ".join(words)
    wrong: list[str] = []
    while len(wrong) < 3:   # at least 5 other orders of 3 or more distinct words
        shuffled = words[:]
        rng.shuffle(shuffled)
        text = " ".join(shuffled)
        if text != right and text not in wrong:
            wrong.append(text)
    choices = [right, *wrong]
    rng.shuffle(choices)
    subject = rng.choice(SUBJECTS)
    return {"query": subject[0].upper() + subject[1:], "choices": choices,
            "gold": choices.index(right)}


def config(name: str, train: Path, test: Path) -> dict[str, Any]:
    """The task as lm-eval reads it: local JSON files, few-shot examples from the train split."""
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"train": str(train), "test": str(test)}},
        "output_type": "multiple_choice",
        "training_split": "train",
        "fewshot_split": "train",
        "test_split": "test",
        "doc_to_text": "{{query}}",
        "doc_to_choice": "choices",
        "doc_to_target": "gold",
        "target_delimiter": " ",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0, "seed": None},
    }


def write(out: Path, seed: int, docs: int = 40, shots_pool: int = 16) -> Path:
    """Write ``out/TASK/`` (renamed into place when complete); returns the task's YAML."""
    import yaml

    rng = random.Random(seed)
    final = out / TASK
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{TASK}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        for split, count in (("train", shots_pool), ("test", docs)):
            lines = [json.dumps(question(rng), sort_keys=True) for _ in range(count)]
            (tmp / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        body = config(TASK, final.resolve() / "train.jsonl", final.resolve() / "test.jsonl")
        body["metadata"]["seed"] = seed
        (tmp / f"{TASK}.yaml").write_text(yaml.safe_dump(body, sort_keys=False),
                                          encoding="utf-8")
        if final.exists():   # made again (another seed): the old one goes first
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final / f"{TASK}.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="the folder of task YAMLs to write into")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--docs", type=int, default=40, help="questions in the test split")
    args = p.parse_args(argv)
    if args.docs < 1:
        print(f"{PROG}: error: --docs must be at least 1", file=sys.stderr)
        return 2
    try:
        path = write(args.out, args.seed, args.docs)
    except OSError as exc:
        print(f"{PROG}: error: {args.out}: cannot write the task ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    print(f"{PROG}: {path}: task {TASK}, {args.docs} questions, seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
