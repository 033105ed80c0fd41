"""The raw text a prepare step reads: the user's files (``--from``: plain text, one document per
paragraph, or per line where a file has no blank lines; or JSONL, one ``{"text": ...}`` object a
line), or, without them, a small corpus generated here from a seed (no downloads, ever)."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

from common.runtime import PayloadError

MAX_INPUT = 1 << 30   # bytes of one --from file read at most (a rehearsal reads a sample)

# The generated corpus: sentences drawn from a small grammar, documents of a few sentences.
SUBJECTS = ("the river", "a small village", "the old library", "the council", "our neighbour",
            "the museum", "a travelling merchant", "the northern railway", "the choir",
            "the first engineer", "a young painter", "the harbour master", "the orchestra",
            "the city archive", "a local farmer", "the university", "the lighthouse keeper")
VERBS = ("built", "described", "restored", "visited", "measured", "painted", "recorded",
         "opened", "crossed", "studied", "repaired", "celebrated", "mapped", "translated")
OBJECTS = ("a stone bridge", "the winter market", "several letters", "the eastern valley",
           "an unusual clock", "the harvest festival", "a wooden boat", "the town square",
           "two new schools", "the mountain road", "a collection of maps", "the old mill")
TAILS = ("in the spring of {year}", "after a long dispute", "with the help of {n} volunteers",
         "before the first snow", "for the third time", "despite the heavy rain",
         "during the reign of king {name}", "near the border with {place}",
         "at a cost of {n} pounds", "according to a letter from {name}")
NAMES = ("Edmund", "Mathilde", "Oskar", "Ingrid", "Tomas", "Helena", "Arnold", "Sigrid")
PLACES = ("Westmark", "Aldera", "the lowlands", "Korvia", "the southern hills", "Elmbridge")


def _sentence(rng: random.Random) -> str:
    tail = rng.choice(TAILS).format(year=rng.randint(1450, 1990), n=rng.randint(3, 900),
                                    name=rng.choice(NAMES), place=rng.choice(PLACES))
    text = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {tail}"
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!", "?"))


def generated(seed: int, size: int = 300_000) -> list[str]:
    """About ``size`` characters of documents of 3 to 9 sentences, a pure function of ``seed``."""
    rng = random.Random(seed)
    docs: list[str] = []
    total = 0
    while total < size:
        doc = " ".join(_sentence(rng) for _ in range(rng.randint(3, 9)))
        docs.append(doc)
        total += len(doc) + 1
    return docs


def _text(path: Path) -> str:
    if str(path).startswith("s3://"):
        raise PayloadError(f"--from {path}: an S3 object is not read by this program: copy it "
                           "here first (aws s3 cp)")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_INPUT + 1)
    except FileNotFoundError:
        raise PayloadError(f"--from {path}: missing") from None
    except OSError as exc:
        raise PayloadError(f"--from {path}: cannot be read ({exc.strerror})") from None
    if len(data) > MAX_INPUT:
        raise PayloadError(f"--from {path}: larger than {MAX_INPUT >> 20} MiB")
    if b"\x00" in data:
        raise PayloadError(f"--from {path}: not text or JSONL (it holds NUL bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(f"--from {path}: not text or JSONL (not UTF-8 at byte "
                           f"{exc.start})") from None


def _jsonl(path: Path, text: str) -> list[str]:
    docs = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            item = None
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise PayloadError(f"--from {path}: line {number} is not a JSON object with a "
                               '"text" string')
        docs.append(item["text"])
    return docs


def read(paths: list[Path]) -> list[str]:
    """The documents of the ``--from`` files, in order; empty documents are left out."""
    docs: list[str] = []
    for path in paths:
        text = _text(path)
        if path.suffix in (".jsonl", ".json") or text.lstrip().startswith("{"):
            found = _jsonl(path, text)
        elif re.search(r"\n\s*\n", text):
            found = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
        else:
            found = text.splitlines()
        docs.extend(d.strip() for d in found if d.strip())
    if not docs:
        raise PayloadError(f"--from {' '.join(map(str, paths))}: holds no text")
    return docs


def sentences(doc: str) -> list[str]:
    """A document's sentences (for BERT's next-sentence pairs): split after . ! or ?."""
    return [s for s in re.split(r"(?<=[.!?])\s+", doc.strip()) if s]
