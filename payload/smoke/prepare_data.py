"""Make a recipe's dataset, smoke-sized, in the trainer's real format with the real libraries.

Usage: prepare_data.py --format megatron|hf_blocks|bert_hdf5 --data-dir DIR --path REL
       [--vocab-file REL --merge-file REL] --seq-length N --vocab-size N --seed S
       [--max-predictions N] [--from FILE...]

The text is the ``--from`` files' (corpus.py) or a corpus generated from the seed. A tokenizer is
trained here (Hugging Face ``tokenizers``), then:

- megatron: a byte-level BPE saved as GPT-2's vocab.json/merges.txt at the recipe's names, and
  Megatron's mmap ``REL.bin``/``REL.idx`` written by megatron-core's IndexedDatasetBuilder (the
  bytes NeMo's preprocessing script writes): one document per input document, the end-of-text
  token appended as NeMo's ``--append-eod`` does, uint16 tokens below 65,500 entries, else int32;
- hf_blocks: a Llama-style BPE tokenizer (``save_pretrained`` into the dataset folder), and the
  text tokenized, concatenated and cut into ``--seq-length`` blocks (``input_ids``,
  ``attention_mask``, ``labels``) as NeuronX Distributed's get_dataset.py does, then
  ``save_to_disk``;
- bert_hdf5: a WordPiece vocab.txt and MLM/NSP shards (bert_samples.py).

Everything is written under a temporary name and renamed when complete, so a killed run never
leaves a dataset that looks whole. Bad input: one line, exit 2.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE.parent), str(_HERE)]

import corpus
from common.runtime import PayloadError, run_main
from prepared_data import _need

PROG = "prepare-data"
EOD = "<|endoftext|>"                 # GPT-2's end-of-text token, the document separator
LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")   # [PAD] is 0, as padding is
UINT16_LIMIT = 65_500                 # NeMo's (and Megatron's) cut-off for uint16 tokens
GROUP_BATCH = 1000                    # datasets' map batch: get_dataset.py cuts blocks per batch
TRAIN_SAMPLE = 2_000_000              # characters the rehearsal's BPE trains on, at most
ENCODE_CHUNK = 4_000_000              # characters batch-encoded at once (bounds memory)



def _temporary(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp.{os.getpid()}")


def _install(tmp: Path, final: Path) -> None:
    """Rename a finished file or folder into place (a folder replaces an older one whole)."""
    if tmp.is_dir() and final.exists():
        old = final.with_name(f".{final.name}.old.{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def _discard(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# --- megatron -------------------------------------------------------------------------------

def gpt2_bpe(docs: list[str], vocab_size: int) -> Any:
    """A byte-level BPE trained on every k-th document, k chosen so that about TRAIN_SAMPLE
    characters spread over the input are read (all of it where it is smaller): training cost
    stays bounded however large the input; every document is then encoded by what was trained."""
    tokenizers = _need("tokenizers", "tokenizers")
    step = -(-sum(map(len, docs)) // TRAIN_SAMPLE) or 1
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(docs[::step], vocab_size=vocab_size, min_frequency=2,
                            special_tokens=[EOD], show_progress=False)
    return tok


def encoded_chunks(tok: Any, docs: list[str], eod: int,
                   dtype: Any) -> Iterator[tuple[Any, Any]]:
    """(tokens, lengths) per chunk of about ENCODE_CHUNK characters: the chunk's documents
    batch-encoded at once (the Rust side, on every core; no offsets kept), each followed by
    `eod`, as one numpy array, and each document's length with its `eod`."""
    import itertools

    import numpy
    per = max(1, len(docs) * ENCODE_CHUNK // max(1, sum(map(len, docs))))
    for first in range(0, len(docs), per):
        ids = [e.ids for e in tok.encode_batch_fast(docs[first:first + per])]
        lengths = numpy.fromiter(map(len, ids), dtype=numpy.int64, count=len(ids))
        body = numpy.fromiter(itertools.chain.from_iterable(ids), dtype=dtype,
                              count=int(lengths.sum()))
        yield numpy.insert(body, numpy.cumsum(lengths), eod), lengths + 1


def megatron(args: argparse.Namespace, docs: list[str]) -> str:
    numpy = _need("numpy", "numpy")
    indexed = _need("megatron.core.datasets.indexed_dataset", "megatron-core")
    if not args.vocab_file or not args.merge_file:
        raise PayloadError("--format megatron needs --vocab-file and --merge-file (the recipe's "
                           "data.vocab_file and data.merge_file)")
    prefix = args.data_dir / args.path
    vocab, merges = args.data_dir / args.vocab_file, args.data_dir / args.merge_file
    for path in (prefix, vocab, merges):
        path.parent.mkdir(parents=True, exist_ok=True)
    tok = gpt2_bpe(docs, args.vocab_size)
    size = tok.get_vocab_size()
    dtype = numpy.uint16 if size < UINT16_LIMIT else numpy.int32
    eod = tok.token_to_id(EOD)
    saved = _temporary(vocab.parent / ".tokenizer")
    tmp_bin, tmp_idx = _temporary(Path(f"{prefix}.bin")), _temporary(Path(f"{prefix}.idx"))
    tmp_vocab, tmp_merges = _temporary(vocab), _temporary(merges)
    try:
        saved.mkdir()
        written_vocab, written_merges = tok.save_model(str(saved))
        os.replace(written_vocab, tmp_vocab)
        os.replace(written_merges, tmp_merges)
        builder = indexed.IndexedDatasetBuilder(str(tmp_bin), dtype=dtype)
        tokens = 0
        # The same tokenizer as a plain Tokenizer, whose encode_batch_fast the wrapper lacks.
        plain = _need("tokenizers", "tokenizers").Tokenizer.from_str(tok.to_str())
        for flat, lengths in encoded_chunks(plain, docs, eod, dtype):
            # One document, one sequence, as NeMo's add_item + end_document write it.
            ends = numpy.cumsum(lengths).tolist()
            for start, end in zip([0, *ends[:-1]], ends):
                builder.add_document(flat[start:end], [end - start])
            tokens += len(flat)
        builder.finalize(str(tmp_idx))
        # The index last: until it is in place, the pair does not look whole.
        for tmp, final in ((tmp_vocab, vocab), (tmp_merges, merges),
                           (tmp_bin, Path(f"{prefix}.bin")), (tmp_idx, Path(f"{prefix}.idx"))):
            _install(tmp, final)
    finally:
        _discard(saved, tmp_bin, tmp_idx, tmp_vocab, tmp_merges)
    return (f"{prefix}.bin/.idx: {len(docs)} documents, {tokens} tokens of "
            f"{numpy.dtype(dtype).name}, a vocabulary of {size} ({vocab.name}, {merges.name})")


# --- hf_blocks ------------------------------------------------------------------------------

def llama_tokenizer(docs: list[str], vocab_size: int) -> Any:
    """A BPE over Llama's normalisation ("▁" for spaces, one before the text), <s> prepended;
    wrapped as a transformers fast tokenizer."""
    tokenizers = _need("tokenizers", "tokenizers")
    transformers = _need("transformers", "transformers")
    from tokenizers import decoders, models, normalizers, processors, trainers
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=list(LLAMA_SPECIALS), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                                bos_token="<s>", eos_token="</s>")


def group_texts(examples: dict[str, list[list[int]]], block: int) -> dict[str, list[Any]]:
    """One map batch concatenated and cut into blocks; the remainder of the batch is dropped,
    and labels are the input ids (the model shifts them), as in get_dataset.py."""
    joined = {key: [t for row in rows for t in row] for key, rows in examples.items()}
    usable = len(joined["input_ids"]) // block * block
    out = {key: [ids[i:i + block] for i in range(0, usable, block)]
           for key, ids in joined.items()}
    out["labels"] = [list(row) for row in out["input_ids"]]
    return out


def hf_blocks(args: argparse.Namespace, docs: list[str]) -> str:
    datasets = _need("datasets", "datasets")
    datasets.disable_progress_bars()
    transformers = _need("transformers", "transformers")
    final = args.data_dir / args.path
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(final)
    try:
        llama_tokenizer(docs, args.vocab_size).save_pretrained(str(tmp))
        # As the trainer's side loads it: AutoTokenizer from the folder.
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp))
        raw = datasets.Dataset.from_dict({"text": docs})
        tokenized = raw.map(lambda batch: tokenizer(batch["text"]), batched=True,
                            remove_columns=["text"], batch_size=GROUP_BATCH)
        blocks = tokenized.map(group_texts, batched=True, batch_size=GROUP_BATCH,
                               fn_kwargs={"block": args.seq_length})
        if len(blocks) == 0:
            raise PayloadError(f"the text makes no block of --seq-length {args.seq_length} "
                               "tokens: give more text")
        blocks.save_to_disk(str(tmp))
        _install(tmp, final)
    finally:
        _discard(tmp)
    return (f"{final}: {len(blocks)} blocks of {args.seq_length} tokens, a vocabulary of "
            f"{len(tokenizer)}")


# --- bert_hdf5 ------------------------------------------------------------------------------

def bert_hdf5(args: argparse.Namespace, docs: list[str]) -> str:
    tokenizers = _need("tokenizers", "tokenizers")
    import bert_samples
    final = args.data_dir / args.path
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(final)
    try:
        tmp.mkdir()
        tok = tokenizers.BertWordPieceTokenizer(lowercase=True)
        tok.train_from_iterator(docs, vocab_size=args.vocab_size, min_frequency=2,
                                special_tokens=list(BERT_SPECIALS), show_progress=False)
        tok.save_model(str(tmp))                       # vocab.txt
        said = bert_samples.write(tmp, final.name, docs, tmp / "vocab.txt", args)
        _install(tmp, final)
    finally:
        _discard(tmp)
    return f"{final}: {said}, a vocabulary of {tok.get_vocab_size()} (vocab.txt)"


FORMATS = {"megatron": megatron, "hf_blocks": hf_blocks, "bert_hdf5": bert_hdf5}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--format", required=True, choices=sorted(FORMATS))
    p.add_argument("--data-dir", type=Path, required=True, help="the site's data folder")
    p.add_argument("--path", required=True, help="the recipe's data.path, under --data-dir")
    p.add_argument("--vocab-file", help="megatron: the recipe's data.vocab_file")
    p.add_argument("--merge-file", help="megatron: the recipe's data.merge_file")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--max-predictions", type=int, default=20, help="bert_hdf5: masked "
                   "positions per sample (the recipe's model.max_predictions)")
    p.add_argument("--dupe-factor", type=int, default=5, help="bert_hdf5: passes over the "
                   "text, each masked anew (bertPrep.py's default)")
    p.add_argument("--shards", type=int, default=2, help="bert_hdf5: training shards")
    p.add_argument("--from", dest="inputs", type=Path, nargs="+", default=None,
                   help="text (a document per paragraph or line) or JSONL files; without it, "
                        "a corpus generated from --seed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name in ("seq_length", "vocab_size", "max_predictions", "dupe_factor", "shards"):
        if getattr(args, name) < 1:
            raise PayloadError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("path", "vocab_file", "merge_file"):
        rel = getattr(args, name)
        if rel and (rel.startswith("/") or ".." in Path(rel).parts):
            raise PayloadError(f"--{name.replace('_', '-')} {rel}: must be a path under "
                               "--data-dir")
    started = time.monotonic()
    docs = corpus.read(args.inputs) if args.inputs else corpus.generated(args.seed)
    said = FORMATS[args.format](args, docs)
    print(f"{PROG}: {said} ({time.monotonic() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main, PROG)
