#!/usr/bin/env python3
"""Prepare-stage throughput: prints tokens/s, medians and ratios; asserts tokens, never timings.

    python benchmarks/prepare_bench.py [--mb 4] [--scale 3] [--rounds 3] [--vocab-size 8192]

On a seeded corpus (JSONL) and one --scale times it (the marginal rate, large minus small, is what
a big dataset gets), each program in a fresh process with the nodes' interpreter
(JOBGEN_PYTHON, else this one), the programs taking turns round by round: the stage's Megatron
writer (payload/smoke/prepare_data.py), NeMo's preprocessing loop as its tutorial runs it (NeMo
is not installed here: its loop, rebuilt below, on megatron-core's writer), the cluster's
blocks writer (payload/common/prepare_tokenized.py), NxD's get_dataset.py as its tutorial
runs it (rebuilt below on the same JSONL), `tokenizers`' encode_batch and
encode_batch_fast (the faster is the limit), and two tasks on halves at once, each on its share
of the cores, against one on all (the job array's speed-up).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PREPARE_DATA = ROOT / "payload" / "smoke" / "prepare_data.py"
PREPARE_TOKENIZED = ROOT / "payload" / "common" / "prepare_tokenized.py"
PY = os.environ.get("JOBGEN_PYTHON") or sys.executable
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
       "TOKENIZERS_PARALLELISM": "true"}
PREFIX, VOCAB, MERGES = ("gpt2/my-gpt2_text_document", "gpt2/gpt2-vocab.json",
                         "gpt2/gpt2-merges.txt")
SEQ = 4096          # llama2-7b's blocks
CHUNK = 25          # preprocess_data_for_megatron.py's imap chunk
METHODS = ("encode_batch", "encode_batch_fast")   # tokenizers' batch encoders: the limit
_TOK: Any = None    # an upstream worker's tokenizer (_encoder_init)


# --- the corpus -----------------------------------------------------------------------------

def corpus(seed: int, size: int, parts: int = 1) -> list[str]:
    """About `size` characters of documents per part: words of a seeded 40,000-word lexicon
    drawn with Zipf frequencies (so that a tokenizer's word cache meets rare words, as on real
    text), numbers and punctuation; a pure function of `seed` and `parts`. Each part after the
    first draws from the same lexicon with a generator of its own, so `parts=3` is the one-part
    corpus followed by two more like it."""
    rng = random.Random(seed)
    syllables = [a + b for a in ("", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r",
                                 "s", "t", "v", "w", "st", "tr", "ch", "sh", "br")
                 for b in ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "an", "er", "on")]
    lexicon = sorted({"".join(rng.choices(syllables, k=rng.choice((1, 2, 2, 3, 3, 4))))
                      for _ in range(45_000)})[:40_000]
    rng.shuffle(lexicon)
    cum, total = [], 0.0
    for rank in range(len(lexicon)):
        total += 1.0 / (rank + 1)
        cum.append(total)
    docs = _documents(rng, lexicon, cum, size)
    for part in range(1, parts):
        docs += _documents(random.Random(f"{seed}/{part}"), lexicon, cum, size)
    return docs


def _documents(rng: random.Random, lexicon: list[str], cum: list[float],
               size: int) -> list[str]:
    words = rng.choices(lexicon, cum_weights=cum, k=size // 9)   # about 9 characters a word
    docs: list[str] = []
    doc: list[str] = []
    sentence: list[str] = []
    at = 0
    for word in words:
        if rng.random() < 0.02:
            word = str(rng.randint(1, 2030))
        sentence.append(word)
        if len(sentence) >= 6 and rng.random() < 0.08:
            text = " ".join(sentence)
            doc.append(text[0].upper() + text[1:] + rng.choice(".....!?;"))
            sentence = []
            if len(doc) >= 3 and rng.random() < 0.2:
                docs.append(" ".join(doc))
                doc = []
        at += 1
    return docs


def write_jsonl(path: Path, docs: list[str]) -> None:
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"text": d}) + "\n" for d in docs)


# --- children (each run as its own process) --------------------------------------------------

def _encoder_init(vocab: str, merges: str) -> None:
    import transformers
    # NeMo's get_nmt_tokenizer("megatron", "GPT2BPETokenizer") builds transformers' GPT-2
    # tokenizer with use_fast=False.
    global _TOK
    _TOK = transformers.GPT2Tokenizer(vocab=vocab, merges=merges)


def _encode(line: str) -> tuple[list[int], int]:
    ids = _TOK.convert_tokens_to_ids(_TOK.tokenize(json.loads(line)["text"]))
    return ids + [_TOK.eos_token_id], len(line)


def upstream(source: str, vocab: str, merges: str, prefix: str, workers: int) -> None:
    """preprocess_data_for_megatron.py's loop as the tutorial runs it (--json-keys text
    --append-eod --dataset-impl mmap --workers N): a pool of N tokenizer processes over the
    input's lines in chunks of 25, each document written as one item by megatron-core's
    IndexedDatasetBuilder (the bytes of NeMo's mmap builder)."""
    import multiprocessing

    import numpy
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.uint16)
    with multiprocessing.Pool(workers, initializer=_encoder_init,
                              initargs=(vocab, merges)) as pool, \
            open(source, encoding="utf-8") as fin:
        for ids, _ in pool.imap(_encode, fin, CHUNK):
            builder.add_item(torch.IntTensor(ids))
            builder.end_document()
    builder.finalize(f"{prefix}.idx")


def get_dataset(source: str, tokenizer: str, out: str) -> None:
    """NxD's examples/training/llama/get_dataset.py as its tutorial runs it (4f95471), on this
    JSONL instead of wikicorpus: AutoTokenizer from the folder, a batched `datasets.map` of
    tokenizer(text), then group_texts (concatenate, cut into SEQ-token blocks per batch of
    1,000, labels a copy), save_to_disk. Its datasets cache is a fresh folder (a first run)."""
    from itertools import chain

    import datasets
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer)
    cache = tempfile.mkdtemp(prefix="get-dataset-cache-", dir=str(Path(out).parent))
    raw = datasets.load_dataset("json", data_files=source, cache_dir=cache)
    columns = raw["train"].column_names

    def group_texts(examples: dict[str, Any]) -> dict[str, Any]:
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined[next(iter(examples))]) // SEQ * SEQ
        result = {k: [t[i:i + SEQ] for i in range(0, total, SEQ)] for k, t in joined.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    tokenized = raw.map(lambda ex: tok(ex["text"]), batched=True, remove_columns=columns)
    tokenized.map(group_texts, batched=True)["train"].save_to_disk(out)


def limit(source: str, tokenizer: str, out: str, eod: bool, method: str) -> None:
    """`tokenizers`' `method` (encode_batch, or encode_batch_fast: no offsets) on the documents
    already in memory (timed alone), then the ids written as one uint16 stream (an end-of-text
    token after each document where `eod`)."""
    import numpy
    import tokenizers
    with open(source, encoding="utf-8") as fh:
        docs = [json.loads(line)["text"] for line in fh]
    if tokenizer.endswith(".json"):
        tok = tokenizers.Tokenizer.from_file(tokenizer)
    else:
        vocab, merges = tokenizer.split(",")
        tok = tokenizers.Tokenizer.from_str(
            tokenizers.ByteLevelBPETokenizer(vocab, merges).to_str())
    start, cpu = time.perf_counter(), time.process_time()
    encoded = getattr(tok, method)(docs)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    tail = [tok.token_to_id("<|endoftext|>")] if eod else []
    stream = numpy.array([t for e in encoded for t in (*e.ids, *tail)], dtype=numpy.uint16)
    stream.tofile(out)
    numpy.array([len(e.ids) + len(tail) for e in encoded], dtype=numpy.int64).tofile(
        f"{out}.len")
    print(json.dumps({"seconds": took, "cpu": cpu, "tokens": int(stream.size)}))


# --- the parent -----------------------------------------------------------------------------

def started(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wall(*argvs: list[str], cwd: Path) -> tuple[float, float, list[str]]:
    """Seconds until every command, started together, has ended; the CPU seconds they used
    (every thread, every child); their outputs."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    begin = time.perf_counter()
    procs = [started(argv, cwd) for argv in argvs]
    outs = []
    for argv, proc in zip(argvs, procs):
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"prepare_bench: {' '.join(argv[:3])} failed ({proc.returncode}):\n"
                     f"{err[-3000:]}")
        outs.append(out)
    took, now = time.perf_counter() - begin, resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, now.ru_utime + now.ru_stime - cpu.ru_utime - cpu.ru_stime, outs


def megatron_stage(work: Path, data: str, source: str, args: argparse.Namespace) -> list[str]:
    return [PY, str(PREPARE_DATA), "--format", "megatron", "--data-dir", str(work / data),
            "--path", PREFIX, "--vocab-file", VOCAB, "--merge-file", MERGES,
            "--seq-length", "2048", "--vocab-size", str(args.vocab_size),
            "--seed", str(args.seed), "--from", str(work / source)]


def threads(count: int) -> list[str]:
    """A command prefix giving each process `count` encoding threads (rayon's pool)."""
    return ["env", f"RAYON_NUM_THREADS={count}"]


def blocks_stage(work: Path, data: str, source: str, workers: int, tok: Path) -> list[str]:
    return [PY, str(PREPARE_TOKENIZED), "--format", "hf_blocks", "--data-dir",
            str(work / data), "--path", "wiki_4k", "--tokenizer", str(tok),
            "--seq-length", str(SEQ), "--workers", str(workers), "--from", str(work / source)]


def check_tokens(work: Path) -> list[str]:
    """The stage's tokens against the limit's and upstream's; one line each; raises on a
    difference."""
    import numpy
    said = []
    stage_bin = (work / "m1" / f"{PREFIX}.bin").read_bytes()
    for method in METHODS:
        assert stage_bin == (work / f"limit-megatron-{method}.u16").read_bytes(), \
            f"the stage's .bin differs from {method}'s ids + <|endoftext|>"
        assert (work / f"limit-blocks-{method}.u16").read_bytes() == \
            (work / "limit-blocks-encode_batch.u16").read_bytes()
    said.append("megatron: the stage's .bin == encode_batch's ids + <|endoftext|>, "
                "document by document (and encode_batch_fast's)")
    for ext in ("bin", "idx"):
        assert (work / "m1" / f"{PREFIX}.{ext}").read_bytes() == \
            (work / f"upstream.{ext}").read_bytes(), f"the stage's .{ext} differs from upstream's"
    said.append("megatron: the stage's .bin and .idx == the upstream loop's, byte for byte")
    import datasets
    stream = numpy.fromfile(work / "limit-blocks-encode_batch.u16", dtype=numpy.uint16)
    ends = numpy.concatenate([[0], numpy.cumsum(numpy.fromfile(
        work / "limit-blocks-encode_batch.u16.len", dtype=numpy.int64))])
    # The limit's stream, cut into blocks per 1,000 documents as get_dataset.py cuts them.
    want = []
    count = len(ends) - 1
    for first in range(0, count, 1000):
        part = stream[ends[first]:ends[min(first + 1000, count)]]
        usable = len(part) // SEQ * SEQ
        want.append(part[:usable].reshape(-1, SEQ))
    expected = numpy.concatenate(want)
    got = datasets.load_from_disk(str(work / "h1" / "wiki_4k")).with_format("numpy")
    assert numpy.array_equal(got["input_ids"], expected), \
        "the blocks differ from encode_batch's ids cut per 1,000 documents"
    assert numpy.array_equal(got["labels"], expected)
    said.append(f"hf_blocks: the stage's {len(expected):,} blocks == encode_batch's ids, "
                "concatenated and cut per 1,000 documents")
    one = datasets.load_from_disk(str(work / "h1p1" / "wiki_4k")).with_format("numpy")
    assert numpy.array_equal(one["input_ids"], expected), "--workers 1 cut other blocks"
    assert one.features == got.features
    said.append("hf_blocks: the --workers 1 run's blocks and features == the default's")
    theirs = datasets.load_from_disk(str(work / "get_dataset")).with_format("numpy")
    assert numpy.array_equal(theirs["input_ids"], expected), "get_dataset.py cut other blocks"
    assert numpy.array_equal(theirs["labels"], expected)
    said.append("hf_blocks: the stage's blocks == get_dataset.py's")
    return said


def programs(work: Path, tok: Path, args: argparse.Namespace,
             cores: int) -> dict[str, list[list[str]]]:
    """The programs on one input (work/all.jsonl and its halves), each as its commands."""
    me = [PY, str(Path(__file__).resolve()), "--child"]
    vocab, merges = (str(work / "m1" / p) for p in (VOCAB, MERGES))
    half = max(1, cores // 2)       # each array task's share of the cores, as Slurm gives it
    limits = {f"{family}: {method} (limit)": [
        [*me, "limit", str(work / "all.jsonl"), tokenizer,
         str(work / f"limit-{family.split('_')[-1]}-{method}.u16"), eod, method]]
        for family, tokenizer, eod in (("megatron", f"{vocab},{merges}", "eod"),
                                       ("hf_blocks", str(tok / "tokenizer.json"), "-"))
        for method in METHODS}
    return {
        "megatron: stage (prepare_data.py), 1 task": [
            megatron_stage(work, "m1", "all.jsonl", args)],
        "megatron: NeMo's loop, tutorial flags": [
            [*me, "upstream", str(work / "all.jsonl"), vocab, merges,
             str(work / "upstream"), str(cores)]],
        **{k: v for k, v in limits.items() if k.startswith("megatron")},
        f"megatron: stage, 2 tasks on halves, {half} thread(s) each": [
            [*threads(half), *megatron_stage(work, "m2a", "a.jsonl", args)],
            [*threads(half), *megatron_stage(work, "m2b", "b.jsonl", args)]],
        f"hf_blocks: stage (prepare_tokenized.py), 1 task, --workers {cores} (default)": [
            blocks_stage(work, "h1", "all.jsonl", cores, tok)],
        "hf_blocks: stage, 1 task, --workers 1 (one encoding thread)": [
            blocks_stage(work, "h1p1", "all.jsonl", 1, tok)],
        "hf_blocks: NxD's get_dataset.py, as its tutorial runs it": [
            [*me, "get_dataset", str(work / "all.jsonl"), str(tok), str(work / "get_dataset")]],
        **{k: v for k, v in limits.items() if k.startswith("hf_blocks")},
        f"hf_blocks: stage, 2 tasks on halves, --workers {half} each": [
            blocks_stage(work, "h2a", "a.jsonl", half, tok),
            blocks_stage(work, "h2b", "b.jsonl", half, tok)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=4, help="the small corpus, MB of text")
    parser.add_argument("--scale", type=int, default=3,
                        help="the large corpus: this many times the small one (at least 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "upstream":
            upstream(rest[0], rest[1], rest[2], rest[3], int(rest[4]))
        elif kind == "get_dataset":
            get_dataset(rest[0], rest[1], rest[2])
        else:
            limit(rest[0], rest[1], rest[2], rest[3] == "eod", rest[4])
        return
    if args.scale < 2 or args.rounds < 1 or args.mb <= 0:
        parser.error("--scale must be at least 2, --rounds at least 1, --mb above 0")

    sys.path[:0] = [str(ROOT / "payload"), str(ROOT / "payload" / "smoke")]
    import datasets
    import prepare_data
    cores = len(os.sched_getaffinity(0))
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="prepare-bench-") as tmp:
        work = Path(tmp)
        if args.keep:
            work = args.keep.resolve()
            work.mkdir(parents=True, exist_ok=True)
        chars = int(args.mb * 1e6)
        # The large corpus is the small one followed by more parts from the same lexicon.
        sizes = {"small": corpus(args.seed, chars), "large": corpus(args.seed, chars, args.scale)}
        # The cluster writer's tokenizer: a Llama-style BPE trained here on a sample.
        tok = work / "llama-tok"
        prepare_data.llama_tokenizer(sizes["small"][:5000], args.vocab_size).save_pretrained(
            str(tok))
        commands, mb = {}, {}
        for size, docs in sizes.items():
            (work / size).mkdir(exist_ok=True)
            write_jsonl(work / size / "all.jsonl", docs)
            write_jsonl(work / size / "a.jsonl", docs[:len(docs) // 2])
            write_jsonl(work / size / "b.jsonl", docs[len(docs) // 2:])
            mb[size] = (work / size / "all.jsonl").stat().st_size / 1e6
            commands[size] = programs(work / size, tok, args, cores)
        names = list(commands["small"])
        samples: dict[tuple[str, str], list[float]] = {
            (size, name): [] for size in sizes for name in names}
        cpus: dict[tuple[str, str], list[float]] = {key: [] for key in samples}
        tokens: dict[tuple[str, str], int] = {}
        loads = [os.getloadavg()[0]]
        for turn in range(args.rounds):
            for name in names:
                # Both sizes of a program side by side, the order swapped each round.
                for size in (("small", "large") if turn % 2 == 0 else ("large", "small")):
                    if (size, name) not in samples:
                        continue
                    took, cpu, outs = wall(*commands[size][name], cwd=work / size)
                    if "limit" in name:
                        said = json.loads(outs[0])
                        took, cpu = said["seconds"], said["cpu"]
                        tokens[size, name.split(":")[0]] = said["tokens"]
                    samples[size, name].append(took)
                    cpus[size, name].append(cpu)
                    loads.append(os.getloadavg()[0])
                    print(f"  {size} {name}: {took:.2f} s, {cpu:.2f} CPU s (load "
                          f"{loads[-1]:.2f})",
                          file=sys.stderr, flush=True)
        checks = {size: check_tokens(work / size) for size in sizes}
        blocks = {size: len(datasets.load_from_disk(str(work / size / "h1" / "wiki_4k")))
                  for size in sizes}
    took_all = time.perf_counter() - begin

    print(f"corpus: small {len(sizes['small']):,} documents, {mb['small']:.1f} MB of JSONL; "
          f"large {len(sizes['large']):,} documents, {mb['large']:.1f} MB (the small one and "
          f"{args.scale - 1} more parts from the same lexicon; seed {args.seed}); {cores} cores; "
          f"interpreter {PY}")
    print(f"medians of {args.rounds} interleaved rounds, both sizes in each; "
          f"{took_all:.0f} s in all; 1-minute load average {min(loads):.2f} to {max(loads):.2f} "
          f"(median {statistics.median(loads):.2f})")
    for size in sizes:
        print(f"tokens, {size}: megatron {tokens[size, 'megatron']:,} (vocabulary "
              f"{args.vocab_size}, <|endoftext|> included), hf_blocks "
              f"{tokens[size, 'hf_blocks']:,} ({blocks[size]:,} blocks of {SEQ})")
    med = {key: statistics.median(s) for key, s in samples.items()}
    gain = {name: med["large", name] - med["small", name] for name in names}
    families = ("megatron", "hf_blocks")
    # The limit, on each measure: the faster of tokenizers' two batch encoders.
    tops = {family: [n for n in names if n.startswith(family) and "limit" in n]
            for family in families}
    for size in sizes:
        print(f"{size} input, {mb[size]:.1f} MB: median, tokens/s, share of the limit's tokens/s")
        for family in families:
            top = min(med[size, n] for n in tops[family])
            for name in (n for n in names if n.startswith(family)):
                rate = tokens[size, family] / med[size, name]
                print(f"  {name:<64} {med[size, name]:7.2f} s  {rate / 1e3:8.0f} k tok/s  "
                      f"{top / med[size, name]:5.2f} of the limit")
    print("marginal, small to large: (tokens_large - tokens_small) / (median_large - "
          "median_small), and its share of the limit's marginal rate")
    for family in families:
        more = tokens["large", family] - tokens["small", family]
        top = min(gain[n] for n in tops[family])
        for name in (n for n in names if n.startswith(family)):
            if gain[name] <= 0 or top <= 0:
                print(f"  {name:<64} {gain[name]:+7.2f} s for {more:+,} tokens: no rate "
                      "(the large input was not slower; rerun on a quieter machine)")
                continue
            print(f"  {name:<64} {gain[name]:+7.2f} s for {more:+,} tokens  "
                  f"{more / gain[name] / 1e3:8.0f} k tok/s  {top / gain[name]:5.2f} "
                  "of the limit's")
    # CPU seconds move less than wall seconds when other work shares the cores.
    cpu_med = {key: statistics.median(c) for key, c in cpus.items()}
    cpu_gain = {name: cpu_med["large", name] - cpu_med["small", name] for name in names}
    print("CPU seconds (every thread and process), medians small / large; marginal tokens per "
          "CPU second, and its share of the limit's")
    for family in families:
        more = tokens["large", family] - tokens["small", family]
        top = min(cpu_gain[n] for n in tops[family])
        for name in (n for n in names if n.startswith(family)):
            rate = (f"{more / cpu_gain[name] / 1e3:8.0f} k tok/CPU s  "
                    f"{top / cpu_gain[name]:5.2f} of the limit's" if cpu_gain[name] > 0 < top
                    else "no rate")
            print(f"  {name:<64} {cpu_med['small', name]:6.2f} / {cpu_med['large', name]:6.2f}"
                  f" CPU s  {rate}")
    for family in families:
        one = next(n for n in names if n.startswith(family))
        two = next(n for n in names if n.startswith(family) and "halves" in n)
        print(f"{family}: 2-task array speed-up over 1 task: "
              + ", ".join(f"{size} {med[size, one] / med[size, two]:.2f}x" for size in sizes)
              + (f", marginal {gain[one] / gain[two]:.2f}x" if min(gain[one], gain[two]) > 0
                 else ""))
    blocks = next(n for n in names if n.startswith("hf_blocks: stage"))
    nxd = next(n for n in names if "get_dataset" in n)
    print("hf_blocks: the stage is as fast as get_dataset.py's loop times "
          + ", ".join(f"{size} {med[size, nxd] / med[size, blocks]:.2f}" for size in sizes)
          + (f", marginal {gain[nxd] / gain[blocks]:.2f}" if gain[blocks] > 0 else ""))
    stage, nemo = names[0], names[1]
    print("megatron: the stage is as fast as NeMo's loop times "
          + ", ".join(f"{size} {med[size, nemo] / med[size, stage]:.2f}" for size in sizes)
          + (f", marginal {gain[nemo] / gain[stage]:.2f}" if gain[stage] > 0 else ""))
    for size in sizes:
        for line in checks[size]:
            print(f"check, {size}: {line}")


if __name__ == "__main__":
    main()
