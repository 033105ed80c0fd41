"""What every export program shares: the sealed step it converts, a strict load of its weights,
the tokenizer, the held-out batch and the proof, and a folder published only when complete.

An export of step N writes ``EXPORT_ROOT/step-N/``: a Hugging Face model folder
(``save_pretrained``: config.json, model.safetensors; the tokenizer's own files), the held-out
micro-batches it was proven on, and ``jobgen-export.json`` (what was exported, from where, and
the proof: export_check.py). It is written under a temporary name beside it and renamed when
complete; a failed proof or any error removes it, so a reader sees the whole folder or none.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import checkpoints, export_check
from common.runtime import PayloadError, batch_positions

PERMANENT_ON_NODE = 78


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags an export adds to its trainer's own (the trainer's describe the model)."""
    group = p.add_argument_group("export")
    group.add_argument("--step", type=int, default=None,
                       help="the sealed step to export (default: the newest complete one "
                            "the trainer logged a step after, so that it can be proven)")
    which = group.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokenizer", type=Path,
                       help="the tokenizer's folder (what AutoTokenizer.from_pretrained reads)")
    which.add_argument("--tokenizer-files", type=Path, nargs="+", metavar="FILE",
                       help="instead, the files the trainer tokenized with: a GPT-2 BPE's "
                            "vocab.json and merges.txt, or a WordPiece vocab.txt")
    which.add_argument("--tokenizer-seed", type=int, metavar="SEED",
                       help="instead, for a rehearsal that trained on made-up token ids: a "
                            "tokenizer trained here on the text smoke/corpus.py makes of SEED")
    group.add_argument("--export-root", type=Path, required=True,
                       help="writes EXPORT_ROOT/step-N/")
    group.add_argument("--micro-batches", type=int, default=None,
                       help="prove on the first M micro-batches of the next step only "
                            "(default: all of them, as the trainer logged)")
    group.add_argument("--on-node", action="store_true",
                       help="a permanent failure exits 78 (a node's code: no retry cures it)")
    group.add_argument("--list-sealed", action="store_true",
                       help="instead of an export: print the steps it could export (complete, "
                            "as it judges them), one a line, oldest first, and exit 0")


CHOSEN: list[str] = []   # why the default step is not the newest, for run() to say
SEAL = f"{checkpoints.MARKER} and every node's part"   # jobgen's own seal (checkpoints.py)


def sealed_steps(root: Path) -> list[checkpoints.Checkpoint]:
    """The steps jobgen's seals mark complete under ``root``, oldest first: what an export of a
    trainer that seals with checkpoints.py chooses from (and --list-sealed prints)."""
    return checkpoints.list_checkpoints(root)[0]


def list_sealed(complete: Callable[[], list[checkpoints.Checkpoint]], prog: str,
                on_node: bool) -> int:
    """--list-sealed: print the steps of ``complete`` (the export's own choice of steps), one a
    line, oldest first; exit 0, or say in one line why they cannot be listed (2, 78 on a node)."""
    try:
        steps = sorted(c.step for c in complete())
    except (PayloadError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return PERMANENT_ON_NODE if on_node else 2
    sys.stdout.write("".join(f"{s}\n" for s in steps))
    return 0


def sealed_step(root: Path, step: int | None, metrics: Path | None = None,
                prog: str = "export", complete: list[checkpoints.Checkpoint] | None = None,
                seal: str | None = None,
                tag: Callable[[int], str] = checkpoints.tag_for) -> checkpoints.Checkpoint:
    """The complete checkpoint to export: ``step``, or the newest that can be proven (the
    trainer's ``metrics`` log the step after it; said in one line where that is not the newest,
    which is taken where none can); refused in one line. A trainer whose engine seals its own
    saves gives its ``complete`` ones (oldest first), the ``seal`` and its folders' ``tag``."""
    if complete is None:
        complete, seal = sealed_steps(root), SEAL
    if not complete:
        raise PayloadError(f"{root}: no complete checkpoint (none sealed with {seal})")
    if step is None:
        logged = export_check.logged_steps(metrics) if metrics is not None else set()
        provable = [c for c in complete if c.step + 1 in logged]
        newest = complete[-1].step
        if not provable or provable[-1].step == newest:
            return complete[-1]
        # Said once the export is done (run()): a refusal stays one line.
        CHOSEN.append(f"{prog}: step {provable[-1].step}, the newest sealed step that can be "
                      f"proven: the trainer logged no step {newest + 1} after the newest, "
                      f"{newest} (--step {newest} exports it unproven)")
        return provable[-1]
    for ckpt in complete:
        if ckpt.step == step:
            return ckpt
    steps = ", ".join(str(c.step) for c in complete)
    raise PayloadError(f"{root / tag(step)}: step {step} is not complete "
                       f"(not sealed: being written, or its save failed); complete: {steps}")


def tokenizer(path: Path, vocab_size: int) -> Any:
    """The run's tokenizer, as transformers loads it; its ids must fit the model's vocabulary."""
    import transformers

    if not path.is_dir():
        raise PayloadError(f"--tokenizer {path}: no such folder")
    try:
        loaded = transformers.AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PayloadError(f"--tokenizer {path}: not a tokenizer transformers loads "
                           f"({first})") from None
    if len(loaded) > vocab_size:
        raise PayloadError(f"--tokenizer {path}: {len(loaded)} tokens, more than the model's "
                           f"vocabulary of {vocab_size}: another model's tokenizer")
    return loaded


def run_tokenizer(args: argparse.Namespace, wordpiece: bool) -> Any:
    """The tokenizer the flags name (--tokenizer, --tokenizer-files or --tokenizer-seed), as a
    transformers tokenizer whose ids fit the model's vocabulary; `wordpiece`: BERT's kind."""
    if args.tokenizer is not None:
        return tokenizer(args.tokenizer, args.vocab_size)
    import tokenizers
    import transformers

    specials = {"unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                "sep_token": "[SEP]", "mask_token": "[MASK]"} if wordpiece else \
        {"eos_token": "<|endoftext|>"}
    if args.tokenizer_files is not None:
        files = [str(f) for f in args.tokenizer_files]
        for f in args.tokenizer_files:
            if not f.is_file():
                raise PayloadError(f"--tokenizer-files {f}: no such file")
        try:
            if wordpiece and len(files) == 1:
                made: Any = tokenizers.BertWordPieceTokenizer(files[0], lowercase=True)
            elif not wordpiece and len(files) == 2:
                made = tokenizers.ByteLevelBPETokenizer(files[0], files[1])
            else:
                raise PayloadError("--tokenizer-files: " + (
                    "one WordPiece vocab.txt" if wordpiece else "a BPE vocab.json, then its "
                    "merges.txt") + f", not {len(files)} files")
        except PayloadError:
            raise
        except Exception as exc:   # the tokenizers library's own error types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PayloadError(f"--tokenizer-files {' '.join(files)}: not the tokenizer files "
                               f"a trainer reads ({first})") from None
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "smoke"))
        import corpus
        docs = corpus.generated(args.tokenizer_seed)
        made = tokenizers.BertWordPieceTokenizer(lowercase=True) if wordpiece else \
            tokenizers.ByteLevelBPETokenizer()
        made.train_from_iterator(docs, vocab_size=args.vocab_size, min_frequency=2,
                                 special_tokens=[specials[k] for k in sorted(specials)],
                                 show_progress=False)
    present = {k: v for k, v in specials.items() if made.token_to_id(v) is not None}
    loaded = transformers.PreTrainedTokenizerFast(tokenizer_object=made, **present)
    if len(loaded) > args.vocab_size:
        shown = "--tokenizer-files " + " ".join(files) if args.tokenizer_files else \
            f"--tokenizer-seed {args.tokenizer_seed}"
        raise PayloadError(f"{shown}: {len(loaded)} tokens, more than the model's vocabulary "
                           f"of {args.vocab_size}: another model's tokenizer")
    return loaded


def load_weights(model: Any, state: dict[str, Any], source: Path) -> None:
    """Load ``state`` into ``model``: every parameter present at its shape, nothing left over
    (tied weights the model shares may be absent); else the checkpoint is another model's."""
    own = model.state_dict()
    tied = set(getattr(model, "all_tied_weights_keys", None) or ())
    missing = sorted(set(own) - set(state) - tied)
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state)
                    if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or shapes:
        parts = [f"{label} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                 for label, names in (("missing", missing), ("unexpected", unexpected),
                                      ("of another shape", shapes)) if names]
        raise PayloadError(f"{source}: holds another model than the flags describe "
                           f"({'; '.join(parts)})")
    model.load_state_dict(state, strict=False)


def next_step_batches(info: dict[str, Any], micro: int, accumulation: int,
                      rows: Callable[[list[int]], dict[str, Any]],
                      limit: int | None) -> tuple[list[dict[str, Any]], int]:
    """The micro-batches of the step after the checkpoint's, every rank's (rank order), as the
    trainer read them; the first ``limit`` only where given. Returns them and the step's count."""
    world = int(info["world_size"])
    consumed = int(info["consumed_samples"])
    if micro * accumulation * world != info.get("global_batch_size"):
        raise PayloadError(f"--micro-batch-size {micro} x --gradient-accumulation {accumulation} "
                           f"x {world} ranks is not the checkpoint's global batch of "
                           f"{info.get('global_batch_size')}: the flags are not the run's")
    micro_batches = [m for rank in range(world)
                     for m in batch_positions(consumed, micro, accumulation, world, rank)]
    total = len(micro_batches)
    if limit is not None and not 2 <= limit <= total:
        raise PayloadError(f"--micro-batches must lie in [2, {total}] (the step's micro-batches)")
    return [rows(m) for m in micro_batches[:limit or total]], total


def publish(model: Any, tok: Any, export_root: Path, ckpt: checkpoints.Checkpoint,
            batches: list[dict[str, Any]], total: int, logged: float | None, precision: str,
            record: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Write, prove and rename into place; returns the folder and its record. A failed proof
    (export_check.Mismatch) leaves nothing behind; an unprovable step is published as such."""
    final = export_root / f"step-{ckpt.step}"
    if final.exists():
        raise PayloadError(f"{final}: already exists (an earlier export of step {ckpt.step})")
    export_root.mkdir(parents=True, exist_ok=True)
    tmp = export_root / f".step-{ckpt.step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        export_check.write_batches(tmp / export_check.BATCH_FILE, batches)
        if logged is None:
            proof: dict[str, Any] = {"ok": None, "precision": precision,
                                     "micro_batches_in_step": total,
                                     "reason": f"the trainer logged no step {ckpt.step + 1}, "
                                               "the step trained from these weights"}
        else:
            proof = export_check.prove(tmp, logged, precision, total, shown=final)
        record = dict(record, step=ckpt.step, checkpoint=str(ckpt.path.resolve()),
                      consumed_samples=ckpt.info.get("consumed_samples"), proof=proof)
        (tmp / export_check.RECORD).write_text(json.dumps(record, indent=1, sort_keys=True)
                                               + "\n", encoding="utf-8")
        _readable_as_umask_says(tmp)
        try:
            os.replace(tmp, final)
        except OSError:   # another export of this step finished first
            raise PayloadError(f"{final}: already exists (an earlier export of step "
                               f"{ckpt.step})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, record


def _readable_as_umask_says(folder: Path) -> None:
    """safetensors writes its files 0600; the folder is for others to load (an evaluation
    team's), so its files get the modes the user's umask gives any new file."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)


def run(main: Callable[[], tuple[Path, dict[str, Any]]], prog: str, on_node: bool) -> int:
    """Run an export and say in one line what came of it: 0 proven, 3 published but unproven
    (no logged step to compare with), 2 (78 on a node) refused or failed its proof."""
    failed = PERMANENT_ON_NODE if on_node else 2
    try:
        folder, record = main()
    except (PayloadError, export_check.Mismatch) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return failed
    for line in CHOSEN:
        print(line, file=sys.stderr)
    proof = record["proof"]
    if proof["ok"] is None:
        print(f"{prog}: {folder}: exported, unproven: {proof['reason']}")
        return 3
    print(f"{prog}: {folder}: exported and proven: loss {proof['measured_loss']:.6g} against "
          f"the trainer's {proof['logged_loss']:.6g} ({proof['precision']})")
    return 0
