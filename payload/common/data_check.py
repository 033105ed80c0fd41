"""The data check: a recipe's dataset judged by its headers, before any node compiles or trains.

``data_check.py node|cli`` reads what to expect from JOBGEN_DATA (JSON; jobgen/job/data.py
decides it from the job spec) and prints one line per problem, naming the recipe key and the
file, then one summary line. Exit 0 when the data can be trained on, 78 on a node (no retry can
cure it) or 2 at the command line when it cannot. It reads headers, sizes, metadata and the
tokenizer's small files, and of the tokens a bounded sample (the first and last MiB of a few
shards), so a thousand shards take seconds.
"""
from __future__ import annotations

import array
import json
import math
import os
import stat
import struct
import sys
from pathlib import Path
from typing import Any

# Megatron's mmap indexed dataset (.idx): magic, version u64, dtype code u8, sequence count u64,
# document index length u64; then sizes int32[count], pointers int64[count], doc_idx int64[len].
IDX_MAGIC = b"MMIDIDX\x00\x00"
IDX_HEADER = struct.Struct("<9sQBQQ")
IDX_DTYPES = {1: ("uint8", 1, 2**8), 2: ("int8", 1, 2**7), 3: ("int16", 2, 2**15),
              4: ("int32", 4, 2**31), 5: ("int64", 8, 2**63), 6: ("float64", 8, 0),
              7: ("double", 8, 0), 8: ("uint16", 2, 2**16)}
MAX_VOCAB_FILE = 64 << 20   # a tokenizer's vocabulary file read whole, at most this many bytes
SAMPLE_BYTES = 1 << 20      # the token ids read from each end of a sampled .bin
SAMPLED_SHARDS = 16         # at most this many .bin files sampled, spread over the list
TYPECODES = {"uint8": "B", "int8": "b", "int16": "h", "uint16": "H", "int32": "i", "int64": "q"}


class Problem(Exception):
    """One thing wrong with the data: already phrased as the line the user reads; `key` names
    the recipe keys it is about where they are not the dataset's own (data.path)."""

    def __init__(self, line: str, key: str = "") -> None:
        super().__init__(line)
        self.key = key


class Unchecked(Problem):
    """The data could not be judged on this host (a library the format needs is missing)."""


def _open_regular(path: Path) -> int:
    """A descriptor on a regular file (a FIFO or a device is refused, never opened blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise Problem(f"{path}: missing") from None
    except OSError as exc:
        raise Problem(f"{path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Problem(f"{path}: not a regular file")
    return fd


def _read_at(fd: int, offset: int, size: int, path: Path) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise Problem(f"{path}: truncated (ends before byte {offset + size})")
    return data


def _small_file(path: Path) -> bytes:
    fd = _open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_VOCAB_FILE:
            raise Problem(f"{path}: {size} bytes, more than a vocabulary file holds")
        return _read_at(fd, 0, size, path)
    finally:
        os.close(fd)


def vocabulary_size(path: Path) -> int:
    """Entries in a GPT-2-style vocab.json."""
    text = _small_file(path)
    try:
        vocab = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise Problem(f"{path}: not a JSON vocabulary") from None
    if not isinstance(vocab, dict) or not vocab:
        raise Problem(f"{path}: not a JSON vocabulary (token -> id)")
    return len(vocab)


def tokenizer_json_size(path: Path) -> int:
    """The distinct ids of a Hugging Face tokenizer.json: its model's vocabulary (BPE and
    WordPiece: token -> id; Unigram: a list of [token, score]) and its added tokens."""
    try:
        found = json.loads(_small_file(path))
        vocab = found["model"]["vocab"]
        ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
        ids.update(int(t["id"]) for t in found.get("added_tokens") or ())
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        raise Problem(f"{path}: not a Hugging Face tokenizer.json") from None
    return len(ids)


def vocab_txt_size(path: Path) -> int:
    """Lines of a BERT vocab.txt (a token a line; its line number is the token's id)."""
    text = _small_file(path)
    return text.count(b"\n") + (0 if not text or text.endswith(b"\n") else 1)


def model_vocabulary(want: dict[str, Any]) -> tuple[int, str]:
    """(the rows of the model's embedding: model.vocab_size as the trainer pads it, its words)."""
    vocab = int(want.get("vocab_size") or 0)
    padded = max(vocab, int(want.get("vocab_padded") or 0))
    said = f"{want.get('vocab_key', 'model.vocab_size')} {vocab:,}"
    return padded, said + (f" (the trainer pads it to {padded:,})" if padded != vocab else "")


def check_tokenizer_size(tokens: int, path: Path, key: str, want: dict[str, Any]) -> None:
    """A tokenizer with more tokens than the model has rows: its ids past them cannot train."""
    rows, said = model_vocabulary(want)
    if rows and tokens > rows:
        model_key = want.get("vocab_key", "model.vocab_size")
        raise Problem(f"{path}: {tokens:,} tokens, more than {said} holds", f"{key}, {model_key}")


def check_ids(low: int, high: int, path: Path, where: str, want: dict[str, Any],
              tokenizer: int = 0) -> None:
    """Sampled token ids against the model's rows (else the tokenizer's size)."""
    rows, said = model_vocabulary(want)
    if not rows and tokenizer:
        rows, said = tokenizer, f"the tokenizer's {tokenizer:,} tokens"
    if low < 0:
        raise Problem(f"{path}: token id {low} in {where}: ids cannot be negative")
    if rows and high >= rows:
        raise Problem(f"{path}: token id {high:,} in {where}, not below {said}")


def sampled_ids(binary: Path, dtype: str, size: int) -> tuple[int, int]:
    """(lowest, highest) token id in the first and last SAMPLE_BYTES of a .bin."""
    width = array.array(TYPECODES[dtype]).itemsize
    head = min(size, SAMPLE_BYTES) // width * width
    tail_start = max(head, -(-(size - SAMPLE_BYTES) // width) * width)
    fd = _open_regular(binary)
    try:
        chunks = [_read_at(fd, 0, head, binary),
                  _read_at(fd, tail_start, size - tail_start, binary)]
    finally:
        os.close(fd)
    ids = array.array(TYPECODES[dtype])
    for chunk in chunks:
        ids.frombytes(chunk)
    if sys.byteorder != "little":
        ids.byteswap()
    return (min(ids), max(ids)) if ids else (0, 0)


def megatron_shard(prefix: str, vocab: int) -> dict[str, Any]:
    """One .idx/.bin pair checked for shape and consistency: its dtype, documents, tokens."""
    idx, binary = Path(prefix + ".idx"), Path(prefix + ".bin")
    fd = _open_regular(idx)
    try:
        idx_size = os.fstat(fd).st_size
        magic, version, code, count, docs = IDX_HEADER.unpack(
            _read_at(fd, 0, IDX_HEADER.size, idx))
        if magic.startswith(b"TNTIDX"):
            raise Problem(f"{idx}: Megatron's old cached index, not mmap (made without "
                          "--dataset-impl mmap)")
        if magic != IDX_MAGIC:
            raise Problem(f"{idx}: not a Megatron mmap index")
        if version != 1:
            raise Problem(f"{idx}: index version {version}, not 1")
        if code not in IDX_DTYPES or IDX_DTYPES[code][2] == 0:
            raise Problem(f"{idx}: token dtype code {code} is not an integer type")
        name, width, limit = IDX_DTYPES[code]
        want = IDX_HEADER.size + count * 12 + docs * 8
        if idx_size != want:
            raise Problem(f"{idx}: {idx_size} bytes where its header says {want} "
                          "(truncated or corrupt)")
        if count == 0 or docs < 2:
            raise Problem(f"{idx}: holds no sequences")
        last_size, = struct.unpack("<i", _read_at(fd, IDX_HEADER.size + (count - 1) * 4, 4, idx))
        last_pointer, = struct.unpack(
            "<q", _read_at(fd, IDX_HEADER.size + count * 4 + (count - 1) * 8, 8, idx))
        first_doc, = struct.unpack("<q", _read_at(fd, IDX_HEADER.size + count * 12, 8, idx))
        last_doc, = struct.unpack("<q", _read_at(fd, idx_size - 8, 8, idx))
    finally:
        os.close(fd)
    if first_doc != 0 or last_doc != count:
        raise Problem(f"{idx}: its document index does not span its {count} sequences")
    fd = _open_regular(binary)
    try:
        bin_size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if last_size < 0 or last_pointer + last_size * width != bin_size:
        raise Problem(f"{binary}: {bin_size} bytes where {idx.name} says "
                      f"{last_pointer + last_size * width} (truncated, or not its pair)")
    if vocab > limit:
        raise Problem(f"{idx}: tokens are {name}, which cannot hold a vocabulary of {vocab}")
    return {"dtype": name, "documents": docs - 1, "tokens": bin_size // width, "bytes": bin_size}


def check_megatron(want: dict[str, Any]) -> dict[str, Any]:
    vocab = int(want.get("vocab_size") or 0)
    tokenizer = 0
    if want.get("vocab_file"):
        tokenizer = vocab = vocabulary_size(Path(want["vocab_file"]))
        check_tokenizer_size(vocab, Path(want["vocab_file"]), "data.vocab_file", want)
    prefixes = [p for p in want.get("prefixes", []) if p]
    if not prefixes:
        raise Problem("names no dataset prefix")
    share = float(want.get("train_share", 1.0))
    seq = int(want["seq_length"])
    shards = [megatron_shard(p, vocab) for p in prefixes]
    step = max(1, -(-len(prefixes) // SAMPLED_SHARDS))
    for n in sorted({*range(0, len(prefixes), step), len(prefixes) - 1}):
        binary = Path(prefixes[n] + ".bin")
        low, high = sampled_ids(binary, shards[n]["dtype"], shards[n]["bytes"])
        check_ids(low, high, binary, "its first or last MiB", want, tokenizer)
    tokens = sum(s["tokens"] for s in shards)
    samples = sum(max(0, math.floor(s["tokens"] * share) - 1) // seq for s in shards)
    return {"shards": len(shards), "dtype": "/".join(sorted({s["dtype"] for s in shards})),
            "tokens": tokens, "samples": samples, "documents": sum(s["documents"] for s in shards)}


def check_hf_blocks(want: dict[str, Any]) -> dict[str, Any]:
    """A tokenized, packed Hugging Face dataset (save_to_disk), as the Llama trainers load it."""
    folder = Path(want["path"])
    if not folder.is_dir():
        raise Problem(f"{folder}: missing (a folder saved with datasets' save_to_disk)")
    if not (folder / "state.json").is_file() and not (folder / "dataset_dict.json").is_file():
        raise Problem(f"{folder}: no state.json (not a dataset saved with save_to_disk)")
    try:
        import datasets
    except ImportError:
        raise Unchecked(f"{folder}: cannot be checked here: the datasets package is not "
                      "installed (pip install datasets)") from None
    try:
        data = datasets.load_from_disk(str(folder))
    except Exception as exc:  # noqa: BLE001 - whatever datasets raises is the dataset's problem
        raise Problem(f"{folder}: datasets cannot load it ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise Problem(f"{folder}: a dataset dict without a train split")
        data = data["train"]
    missing = [c for c in want.get("columns", ["input_ids"]) if c not in data.column_names]
    if missing:
        raise Problem(f"{folder}: no {', '.join(missing)} column")
    if len(data) == 0:
        raise Problem(f"{folder}: holds no rows")
    feature = data.features["input_ids"]
    dtype = str(getattr(getattr(feature, "feature", None), "dtype", "?"))
    limits = {"int32": 2**31, "int64": 2**63, "uint16": 2**16, "int16": 2**15, "uint32": 2**32}
    vocab = int(want.get("vocab_size") or 0)
    if dtype not in limits:
        raise Problem(f"{folder}: input_ids hold {dtype}, not integer token ids")
    if vocab > limits[dtype]:
        raise Problem(f"{folder}: input_ids are {dtype}, which cannot hold a vocabulary of {vocab}")
    length = len(data[0]["input_ids"])
    if length != int(want["seq_length"]):
        raise Problem(f"{folder}: blocks of {length} tokens, not the recipe's "
                      f"model.seq_length {want['seq_length']}")
    tokenizer = 0
    if (folder / "tokenizer.json").is_file():   # the prepare stage saves its tokenizer here
        tokenizer = tokenizer_json_size(folder / "tokenizer.json")
        check_tokenizer_size(tokenizer, folder / "tokenizer.json", "data.tokenizer", want)
    ends = [*data[0]["input_ids"], *data[len(data) - 1]["input_ids"]]
    check_ids(min(ends), max(ends), folder, "its first or last block", want, tokenizer)
    return {"shards": len(data.cache_files) or 1, "dtype": dtype, "samples": len(data),
            "tokens": len(data) * length}


def check_bert_hdf5(want: dict[str, Any]) -> dict[str, Any]:
    """Model-References' wikicorpus hdf5 shards, read by the BERT trainer's own shard check."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from common.runtime import PayloadError
    try:
        from habana_deepspeed import bert_data
    except ImportError as exc:
        raise Unchecked(f"{want['path']}: cannot be checked here: {exc.name} is not installed "
                      f"(pip install {exc.name})") from None
    folder = Path(want["path"])
    if (folder / "vocab.txt").is_file():        # the prepare stage writes the shards' vocabulary
        check_tokenizer_size(vocab_txt_size(folder / "vocab.txt"), folder / "vocab.txt",
                             "data.tokenizer", want)
    try:
        files = bert_data.find_training_files(folder)
        counts = [bert_data.check_shard(f, int(want["seq_length"]), int(want["max_predictions"]))
                  for f in files]
        if files:                              # the ids of the first shard's ends
            import h5py
            with h5py.File(files[0], "r") as shard:
                rows = shard["input_ids"]
                ends = [rows[:64], rows[max(0, len(rows) - 64):]] if len(rows) else []
            if ends:
                check_ids(min(int(e.min()) for e in ends), max(int(e.max()) for e in ends),
                          files[0], "its first or last 64 samples", want)
    except PayloadError as exc:
        raise Problem(str(exc)) from None
    return {"shards": len(files), "dtype": "hdf5", "samples": sum(counts)}


CHECKS = {"megatron": check_megatron, "hf_blocks": check_hf_blocks, "bert_hdf5": check_bert_hdf5}


def run(want: dict[str, Any]) -> tuple[list[str], str, bool]:
    """(problem lines, summary line, whether it could be checked) for one recipe."""
    where = f"{want.get('recipe', 'the recipe')}: {want.get('key', 'data.path')}"
    try:
        found = CHECKS[want["format"]](want)
    except Problem as exc:
        if exc.key:
            where = f"{want.get('recipe', 'the recipe')}: {exc.key}"
        return [f"{where}: {exc}"], "", not isinstance(exc, Unchecked)
    problems = []
    batch = int(want.get("global_batch") or 0)
    if found["samples"] < batch:
        problems.append(f"{where}: {found['samples']} samples, fewer than one global batch of "
                        f"{batch}")
    planned = int(want.get("planned_samples") or 0)
    epochs = f", {planned / found['samples']:.3g} epochs planned" if planned and found[
        "samples"] else ""
    tokens = f", {found['tokens']:,} tokens" if "tokens" in found else ""
    summary = (f"{where}: {found['shards']} shard(s) of {found['dtype']}, "
               f"{found['samples']:,} samples{tokens}{epochs}")
    return problems, summary, True


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in ("node", "cli"):
        print("usage: data_check.py node|cli  (expectations in JOBGEN_DATA)", file=sys.stderr)
        return 2
    failed = 78 if mode == "node" else 2
    try:
        wants = json.loads(os.environ.get("JOBGEN_DATA") or "[]")
    except ValueError:
        print("jobgen: JOBGEN_DATA is not JSON", file=sys.stderr)
        return failed
    bad = unchecked = False
    for want in wants if isinstance(wants, list) else [wants]:
        problems, summary, checked = run(want)
        for line in problems:
            print(f"{'error: ' if checked else ''}data: {line}", file=sys.stderr)
        if summary and not problems:
            print(f"data: {summary}", flush=True)
        bad = bad or (bool(problems) and checked)
        unchecked = unchecked or not checked
    # A node that cannot judge its data lets the trainer find out; the command line says so.
    return failed if bad else (3 if unchecked and mode == "cli" else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
