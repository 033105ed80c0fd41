"""The prepare stage for the Hugging Face tokenized datasets, with the recipe's own tokenizer:

- hf_blocks (Llama 2 on NxD and SMP): tokenized, concatenated and cut into --seq-length blocks
  per 1,000-document batch, then save_to_disk, as NxD's get_dataset.py does; without --from, the
  tutorial's wikicorpus raw_en, read from its archive (datasets >= 4 no longer runs its script);
- bert_hdf5 (Habana DeepSpeed BERT): documents spread over training shards by sentence count,
  each shard's masked-LM/next-sentence samples made as Model-References' create_pretraining_data.py
  makes them (payload/smoke/bert_samples.py), one process per shard; without --from, bertPrep.py's
  Wikipedia dump through WikiExtractor, an article a line, split by NLTK's punkt.
Facts, commits: jobgen/payloads/upstream/prepare_tokenized.json. Gated tokenizers read HF_TOKEN.
Written under a temporary name, renamed when whole; bad input: 78.
"""
from __future__ import annotations

import argparse
import bz2
import contextlib
import importlib.util
import io
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_PAYLOAD = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(_PAYLOAD), str(_PAYLOAD / "smoke")]

from neuron_nemo.prepare import Refused, fetch, text_kind  # noqa: E402

from common.runtime import PayloadError  # noqa: E402

CONFIG_ERROR = 78
GROUP_BATCH = 1000          # datasets' default map batch: get_dataset.py cuts blocks per batch
WIKICORPUS = "https://www.cs.upc.edu/~nlp/wikicorpus/raw.en.tgz"   # the raw_en config's archive
TRAINING_SHARDS = 256       # bertPrep.py's --n_training_shards
# bertPrep.py's wikicorpus_en download (WikiDownloader.py), and what its sharding splits with.
WIKIPEDIA = "https://dumps.wikimedia.org/enwiki/latest/enwiki-latest-pages-articles.xml.bz2"
PUNKT = "tokenizers/punkt_tab/english/"     # NLTK's punkt model (nltk >= 3.8.2's tab format)
BERT_SEED, DUPE_FACTOR = 12345, 5   # bertPrep.py's defaults, named in the recipes' data.path


def say(line: str) -> None:
    print(f"prepare: {line}", flush=True)


# --- the text -------------------------------------------------------------------------------

def _local(source: str, work: Path, n: int) -> tuple[Path, str]:
    """(a local file holding `source`, its kind): s3:// and https:// objects are copied first."""
    if source.startswith(("s3://", "https://")):
        target = work / f"input-{n}"
        say(f"copying {source}")
        fetch(source, target)
        return target, text_kind(target, source)
    path = Path(source)
    if not path.is_file():
        raise Refused(f"--from {source}: missing or not a regular file")
    return path, text_kind(path, source)


def _documents(path: Path, kind: str, shown: str) -> Iterator[str]:
    """JSONL: each line's "text"; text: a document per paragraph (per line where the file has no
    blank line), whitespace folded, as the rehearsal's corpus.py reads it."""
    with path.open(encoding="utf-8", errors="strict") as fh:
        try:
            if kind == "jsonl":
                for number, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        item = json.loads(line)
                    except ValueError:
                        item = None
                    if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                        raise Refused(f"--from {shown}: line {number} is not a JSON object with "
                                      'a "text" string')
                    if item["text"].strip():
                        yield item["text"].strip()
                return
            paragraphs = any(not line.strip() for line in fh)
            fh.seek(0)
            if not paragraphs:
                yield from (line.strip() for line in fh if line.strip())
                return
            lines: list[str] = []
            for line in (*fh, ""):
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield " ".join(" ".join(lines).split())
                    lines = []
        except UnicodeDecodeError:
            raise Refused(f"--from {shown}: not text or JSONL (not UTF-8)") from None


def wikicorpus(archive: Path) -> Iterator[str]:
    """The raw_en articles of Wikicorpus's archive, as its datasets loading script gave them:
    latin-1 lines between a <doc ...> line and ENDOFARTICLE, kept with their line ends and
    joined by newlines, stripped."""
    with tarfile.open(archive, mode="r|gz") as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is None:
                continue
            rows: list[str] = []
            for raw in handle:
                row = raw.decode("latin-1")
                if row.startswith("<doc id") or row.startswith("</doc>"):
                    continue
                if row.startswith("ENDOFARTICLE"):
                    yield "\n".join(rows).strip()
                    rows = []
                else:
                    rows.append(row)


def texts(args: argparse.Namespace, work: Path) -> Iterator[str]:
    """Every input document, in order."""
    if not args.from_:
        target = work / "raw.en.tgz"
        say(f"no --from: fetching the tutorial's corpus, wikicorpus raw_en ({WIKICORPUS}), and "
            "reading its raw text (datasets >= 4 no longer runs the wikicorpus loading script)")
        fetch(WIKICORPUS, target)
        yield from wikicorpus(target)
        return
    for n, source in enumerate(args.from_):
        path, kind = _local(source, work, n)
        say(f"reading {source} ({kind})")
        yield from _documents(path, kind, source)


# --- BERT without --from: bertPrep.py's Wikipedia ---------------------------------------------

def punkt(data_dir: Path) -> Callable[[str], list[str]]:
    """NLTK's sentence splitter with its English punkt model, read from NLTK_DATA, NLTK's own
    folders or DATA_DIR/nltk_data; where none has it, fetched into DATA_DIR/nltk_data by NLTK's
    downloader first (before the dump, so a node that cannot reach it stops in seconds)."""
    try:
        import nltk
    except ImportError:
        raise Refused("nltk is not installed on this node (pip install nltk: jobgen's data "
                      "extra; the dl1-deepspeed image has it)") from None
    where = data_dir / "nltk_data"
    if str(where) not in nltk.data.path:
        nltk.data.path.append(str(where))
    try:
        nltk.data.find(PUNKT)
    except LookupError:
        say(f"NLTK's punkt_tab model is not on this node: fetching it into {where}")
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            try:
                nltk.download("punkt_tab", download_dir=str(where), quiet=True,
                              raise_on_error=True)
            except Exception as exc:  # noqa: BLE001  (the downloader raises what urllib raised)
                raise Refused(f"NLTK's punkt_tab model: not in NLTK_DATA or {where}, and NLTK's "
                              f"downloader failed ({' '.join(str(exc).split())}); put it there "
                              f"with `python -m nltk.downloader -d {where} punkt_tab`") from None
        try:
            nltk.data.find(PUNKT)
        except LookupError:
            raise Refused(f"NLTK's downloader put no {PUNKT} under {where}") from None
    from nltk.tokenize import sent_tokenize
    return sent_tokenize


def _dump(source: str, work: Path) -> tuple[Path, str]:
    """(the dump as a local file whose name ends as its compression does, how it was named):
    an https:// dump downloaded into `work`, a file:// URL or a path read where it is."""
    if source.startswith("https://"):
        target = work / (Path(urllib.parse.urlparse(source).path).name or "dump.xml.bz2")
        say(f"downloading {source}")
        fetch(source, target)
        path = target
    else:
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(source).path)
                    if source.startswith("file://") else source)
        if not path.is_file():
            raise Refused(f"--wiki-dump {source}: missing or not a regular file")
    try:
        with path.open("rb") as fh:
            packed = fh.read(3) == b"BZh"
        with (bz2.open(path, "rb") if packed else path.open("rb")) as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError) as exc:
        raise Refused(f"--wiki-dump {source}: cannot be read ({exc})") from None
    if b"<mediawiki" not in head:
        raise Refused(f"--wiki-dump {source}: not a MediaWiki XML export (no <mediawiki> "
                      "element at its start)")
    if packed != (path.suffix == ".bz2"):      # WikiExtractor decompresses by the name
        named = work / ("dump.xml.bz2" if packed else "dump.xml")
        named.symlink_to(path.resolve())
        path = named
    return path, source


def extract(dump: Path, shown: str, out: Path, workers: int) -> None:
    """WikiExtractor as bertPrep.py runs it (-b 100M --processes N -o OUT), its log lines passed
    on; it can exit 0 on an error, so the files it wrote are judged by the caller."""
    if importlib.util.find_spec("wikiextractor") is None:
        raise Refused("wikiextractor is not installed on this node (pip install wikiextractor: "
                      "jobgen's data extra; the dl1-deepspeed image has it)")
    argv = [sys.executable, "-m", "wikiextractor.WikiExtractor", str(dump), "-b", "100M",
            "--processes", str(workers), "-o", str(out)]
    last = ""
    with subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          errors="replace") as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.strip():
                last = line.strip()
                print(f"prepare: WikiExtractor: {last}", flush=True)
    if proc.returncode != 0:
        raise Refused(f"--wiki-dump {shown}: WikiExtractor failed (exit {proc.returncode}: "
                      f"{last or 'no message'})")


def wiki_articles(extracted: Path) -> Iterator[str]:
    """Each extracted article as one line, as bertPrep.py's text_formatting writes it: the lines
    after its title, empty ones left out, each right-stripped and followed by a space (the
    sharding strips the line's end); articles with no text are left out, as sharding skips
    blank lines. Files in name order (upstream takes glob's order)."""
    for name in sorted(extracted.glob("*/wiki_*")):
        lines: list[str] = []
        inside = False
        with name.open(encoding="utf-8", newline="\n") as fh:
            for line in fh:
                if line.startswith("<doc id="):
                    inside, lines = True, []
                elif line.startswith("</doc>"):
                    inside = False
                    article = "".join(f"{x.rstrip()} " for x in lines[1:] if x != "\n").rstrip()
                    if article.strip():
                        yield article
                elif inside:
                    lines.append(line)


def wikipedia(args: argparse.Namespace, work: Path) -> list[list[str]]:
    """bertPrep.py's wikicorpus_en text, each article's sentences as NLTK's punkt splits them."""
    say(f"no --from: Model-References' bertPrep.py text: the English Wikipedia dump "
        f"({args.wiki_dump}) through WikiExtractor, an article a line, NLTK punkt sentences")
    split = punkt(args.data_dir)
    dump, shown = _dump(args.wiki_dump, work)
    extract(dump, shown, work / "extracted", args.workers)
    docs = []
    for article in wiki_articles(work / "extracted"):
        sentences = [s for s in split(article) if s.strip()]
        if sentences:
            docs.append(sentences)
    if not docs:
        raise Refused(f"--wiki-dump {shown}: WikiExtractor found no article with text in it")
    say(f"{len(docs):,} articles, {sum(map(len, docs)):,} sentences")
    return docs


# --- the tokenizer --------------------------------------------------------------------------

def tokenizer_source(args: argparse.Namespace) -> str:
    """A folder (absolute, or under --data-dir) where there is one, else a hub name."""
    for candidate in (Path(args.tokenizer), args.data_dir / args.tokenizer):
        if candidate.is_dir():
            return str(candidate)
    return str(args.tokenizer)


def load_tokenizer(source: str, kind: str = "auto") -> Any:
    import transformers
    loader = (transformers.BertTokenizerFast if kind == "bert" else transformers.AutoTokenizer)
    try:
        return loader.from_pretrained(source)
    except Exception as exc:  # noqa: BLE001  (hub, network and file errors all say the same)
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ("" if os.environ.get("HF_TOKEN") else "; a gated repository needs HF_TOKEN in "
                "the job's environment (export it before submitting)")
        raise Refused(f"--tokenizer {source}: cannot be loaded ({said}){hint}") from None


# --- writing --------------------------------------------------------------------------------

def _install(tmp: Path, final: Path) -> None:
    """The finished folder renamed into place (an older one replaced whole)."""
    if final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


ENCODE_BATCH = 8 * GROUP_BATCH   # documents per encode_batch_fast call (rayon splits it)


def encoder(tokenizer: Any) -> Any:
    """The Rust tokenizer that the transformers one wraps, set as its __call__ sets it for a
    plain tokenizer(text): no truncation, no padding; its post-processor adds the special
    tokens (Llama's BOS) as add_special_tokens=True does."""
    rust = tokenizer.backend_tokenizer
    rust.no_truncation()
    rust.no_padding()
    return rust


def cut(ids: Any, lengths: Any, block: int) -> Any:
    """The rows of (n, block) ids that group_texts makes of these documents' ids: each
    1,000-document batch concatenated, cut into blocks, its remainder dropped."""
    import numpy
    ends = numpy.concatenate([[0], numpy.cumsum(lengths)])
    parts = []
    for first in range(0, len(lengths), GROUP_BATCH):
        lo, hi = ends[first], ends[min(first + GROUP_BATCH, len(lengths))]
        usable = (hi - lo) // block * block
        parts.append(ids[lo:lo + usable].reshape(-1, block))
    return numpy.concatenate(parts) if parts else numpy.zeros((0, block), ids.dtype)


def encoded_blocks(rust: Any, docs: Iterator[str], block: int) -> Iterator[Any]:
    """(n, block) int32 arrays of blocks, ENCODE_BATCH documents at a time: a chunk is encoded
    (rayon's threads, without the GIL) while the next is read and the last joined and cut."""
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    import numpy

    def blocks(encodings: list[Any]) -> Any:
        rows = [e.ids for e in encodings]
        lengths = numpy.fromiter(map(len, rows), numpy.int64, len(rows))
        ids = numpy.fromiter(itertools.chain.from_iterable(rows), numpy.int32,
                             int(lengths.sum()))
        return cut(ids, lengths, block)

    with ThreadPoolExecutor(1) as pool:
        pending = None
        while chunk := list(itertools.islice(docs, ENCODE_BATCH)):
            ahead = pool.submit(rust.encode_batch_fast, chunk)
            if pending is not None:
                yield blocks(pending.result())
            pending = ahead
        if pending is not None:
            yield blocks(pending.result())


def hf_blocks(args: argparse.Namespace, final: Path, tmp: Path, work: Path) -> str:
    import datasets
    import numpy
    import pyarrow
    datasets.disable_progress_bars()
    source = tokenizer_source(args)
    tokenizer = load_tokenizer(source)
    if args.seq_length > tokenizer.model_max_length:
        raise Refused(f"--tokenizer {source}: model_max_length {tokenizer.model_max_length} is "
                      f"below the recipe's model.seq_length {args.seq_length}")
    # get_dataset.py's columns as its map writes them (datasets' types for a tokenizer's).
    features = datasets.Features({
        "input_ids": datasets.List(datasets.Value("int32")),
        "attention_mask": datasets.List(datasets.Value("int8")),
        "labels": datasets.List(datasets.Value("int64"))})
    # One process: encode_batch_fast's threads take the --workers cores (a RAYON_NUM_THREADS
    # given is kept); 2 processes of 1 thread were slower here (docs/benchmarks.md).
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))
    say(f"tokenizing with {source} ({os.environ['RAYON_NUM_THREADS']} encoding threads, "
        f"--workers {args.workers})")
    stream, count, docs = work / "blocks.arrow", 0, 0

    def counted() -> Iterator[str]:
        nonlocal docs
        for text in texts(args, work):
            docs += 1
            yield text

    block = args.seq_length
    with pyarrow.OSFile(str(stream), "wb") as sink, \
            pyarrow.ipc.new_stream(sink, features.arrow_schema) as writer:
        for rows in encoded_blocks(encoder(tokenizer), counted(), block):
            if not len(rows):
                continue
            offsets = pyarrow.array(numpy.arange(0, rows.size + 1, block, dtype=numpy.int32))
            flat = rows.reshape(-1)
            columns = [pyarrow.ListArray.from_arrays(offsets, pyarrow.array(flat)),
                       pyarrow.ListArray.from_arrays(offsets, pyarrow.array(
                           numpy.ones(flat.size, numpy.int8))),
                       pyarrow.ListArray.from_arrays(offsets, pyarrow.array(
                           flat.astype(numpy.int64)))]
            writer.write_batch(pyarrow.record_batch(columns, schema=features.arrow_schema))
            count += len(rows)
    if count == 0:
        raise Refused(f"the text makes no block of {block} tokens: give more text")
    say(f"{docs:,} documents")
    tokenizer.save_pretrained(str(tmp))           # the export stage saves it with the model
    datasets.Dataset.from_file(str(stream)).save_to_disk(str(tmp))
    _install(tmp, final)
    return f"{count:,} blocks of {block} tokens"


def _balanced(docs: list[Any], shards: int) -> list[list[Any]]:
    """Documents (text, or a list of its sentences) over shards, longest (in sentences) first
    to the shard with fewest sentences; each shard keeps its documents in input order."""
    import corpus
    counts = [len(d) if isinstance(d, list) else len(corpus.sentences(d)) for d in docs]
    loads, picked = [0] * shards, [[] for _ in range(shards)]  # type: ignore[var-annotated]
    for k in sorted(range(len(docs)), key=lambda k: -counts[k]):
        lightest = min(range(shards), key=loads.__getitem__)
        picked[lightest].append(k)
        loads[lightest] += counts[k]
    return [[docs[k] for k in sorted(ks)] for ks in picked]


def _one_shard(job: tuple[int, list[Any], Path, Path, str, dict[str, int]]) -> tuple[int, str]:
    """Shard `n`: create_pretraining_data.py's work on one text shard, seeded as each of
    bertPrep.py's runs is (the same seed for every shard)."""
    import bert_samples
    n, docs, tmp, vocab, stem, numbers = job
    folder = tmp / f".shard-{n}"
    folder.mkdir()
    said = bert_samples.write(folder, stem, docs, vocab, argparse.Namespace(shards=1, **numbers))
    os.replace(folder / f"{stem}_training_0.hdf5", tmp / f"{stem}_training_{n}.hdf5")
    folder.rmdir()
    return n, said


def bert_hdf5(args: argparse.Namespace, final: Path, tmp: Path, work: Path) -> str:
    tokenizer = load_tokenizer(tokenizer_source(args), "bert")
    docs: list[Any] = list(texts(args, work)) if args.from_ else wikipedia(args, work)
    if not docs:
        raise Refused(f"--from {' '.join(args.from_)}: holds no text")
    shards = min(args.shards, len(docs))
    if shards < args.shards:
        say(f"{len(docs):,} documents: {shards} training shards, not {args.shards}")
    tmp.mkdir()
    vocab = tmp / "vocab.txt"                # the trainer's vocabulary, a token a line by id
    ids = sorted((i, t) for t, i in tokenizer.get_vocab().items())
    if [i for i, _ in ids] != list(range(len(ids))):
        raise Refused(f"--tokenizer {args.tokenizer}: its vocabulary's ids are not "
                      f"0..{len(ids) - 1}")
    vocab.write_text("".join(f"{t}\n" for _, t in ids), encoding="utf-8")
    numbers = {"seq_length": args.seq_length, "max_predictions": args.max_predictions,
               "seed": args.seed, "dupe_factor": args.dupe_factor}
    jobs = [(n, part, tmp, vocab, final.name, numbers)
            for n, part in enumerate(_balanced(docs, shards))]
    procs = max(1, min(args.workers, shards))
    say(f"{len(docs):,} documents over {shards} shards, {procs} processes")
    if procs == 1:
        results = [_one_shard(job) for job in jobs]
    else:
        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            results = pool.map(_one_shard, jobs)
    _install(tmp, final)
    samples = sum(int(said.split()[0]) for _, said in results)
    return (f"{shards} training shards ({final.name}_training_*.hdf5), {samples:,} samples of "
            f"{args.seq_length} tokens, a vocabulary of {len(ids):,} (vocab.txt)")


FORMATS = {"hf_blocks": hf_blocks, "bert_hdf5": bert_hdf5}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="prepare_tokenized.py")
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--data-dir", type=Path, required=True, help="the site's data folder")
    p.add_argument("--path", required=True, help="the recipe's data.path, under --data-dir")
    p.add_argument("--tokenizer", required=True, help="a hub name or a folder (data.tokenizer)")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--workers", type=int, default=1,
                   help="cores to use (the site's cpus_per_task): hf_blocks encodes on that "
                        "many threads, bert_hdf5 runs a process per shard")
    p.add_argument("--max-predictions", type=int, default=20)
    p.add_argument("--seed", type=int, default=BERT_SEED)
    p.add_argument("--dupe-factor", type=int, default=DUPE_FACTOR)
    p.add_argument("--shards", type=int, default=TRAINING_SHARDS)
    p.add_argument("--from", dest="from_", nargs="+", default=[],
                   help="text or JSONL: local paths, s3:// or https:// objects")
    p.add_argument("--wiki-dump", default=WIKIPEDIA,
                   help="bert_hdf5 without --from: the Wikipedia dump (default: bertPrep.py's); "
                        "a path or file:// URL reads a copy already there")
    return p.parse_args(argv)


def _refusal(exc: BaseException | None) -> BaseException | None:
    """The Refused or PayloadError behind `exc`, if one is."""
    while exc is not None and not isinstance(exc, (Refused, PayloadError)):
        exc = exc.__cause__ or exc.__context__
    return exc


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        for name in ("seq_length", "workers", "max_predictions", "dupe_factor", "shards"):
            if getattr(args, name) < 1:
                raise Refused(f"--{name.replace('_', '-')} must be at least 1")
        if args.path.startswith("/") or ".." in Path(args.path).parts:
            raise Refused(f"--path {args.path}: must be a path under --data-dir")
        final = args.data_dir / args.path
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.tmp.{os.getpid()}")
        with tempfile.TemporaryDirectory(prefix=f".{final.name}.work.",
                                         dir=final.parent) as work:
            try:
                said = FORMATS[args.format](args, final, tmp, Path(work))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except Exception as exc:  # noqa: BLE001  (datasets wraps what its generator raised)
        refused = _refusal(exc)
        if refused is None:
            raise
        print(f"error: prepare: {refused}", file=sys.stderr, flush=True)
        return CONFIG_ERROR
    say(f"wrote {final}: {said} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
