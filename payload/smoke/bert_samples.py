"""BERT pretraining samples (masked LM and next sentence) written as the wikicorpus hdf5 shards the
BERT trainer reads (payload/habana_deepspeed/bert_data.py), made the way Model-References'
create_pretraining_data.py makes them (facts: jobgen/payloads/upstream/prepare_data.json):

- documents are lists of sentences; each pass over them (``--dupe-factor``) cuts every document
  into chunks up to the sequence's room (now and then, with ``SHORT_SEQ_PROB``, a shorter
  random target), splits a chunk into A and B at a sentence, and half the time (or when the chunk
  is one sentence) takes B from another document instead, labelled 1;
- ``[CLS] A [SEP] B [SEP]``, trimmed from the longer side (front or back at random);
- ``MASKED_LM_PROB`` of the tokens, at most ``--max-predictions``, are predicted: 80 % become
  [MASK], 10 % stay, 10 % become a random word; positions sorted, padded with 0;
- keys and dtypes: input_ids i4, input_mask i1, segment_ids i1 [N, seq]; masked_lm_positions,
  masked_lm_ids i4 [N, max predictions]; next_sentence_labels i1 [N]; gzip; files named
  ``<dataset>_training_<n>.hdf5``.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import corpus
from common.runtime import PayloadError

SHORT_SEQ_PROB = 0.1
MASKED_LM_PROB = 0.15
DTYPES = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1",
          "masked_lm_positions": "i4", "masked_lm_ids": "i4", "next_sentence_labels": "i1"}


class Pairs:
    """Token-id documents and the ids that frame and mask them."""

    def __init__(self, documents: list[list[list[int]]], ids: dict[str, int], vocab: int,
                 rng: random.Random) -> None:
        self.documents, self.ids, self.vocab, self.rng = documents, ids, vocab, rng

    def _trim(self, a: list[int], b: list[int], room: int) -> None:
        while len(a) + len(b) > room:
            longer = a if len(a) > len(b) else b
            del longer[0 if self.rng.random() < 0.5 else -1]

    def _second(self, index: int, want: int) -> tuple[list[int], bool]:
        """B from another document (the same one if it is the only one): (tokens, is random)."""
        other = index
        for _ in range(10):
            other = self.rng.randrange(len(self.documents))
            if other != index:
                break
        doc = self.documents[other]
        tokens: list[int] = []
        for sentence in doc[self.rng.randrange(len(doc)):]:
            tokens.extend(sentence)
            if len(tokens) >= want:
                break
        return tokens, other != index

    def from_document(self, index: int, seq_length: int,
                      max_predictions: int) -> list[dict[str, Any]]:
        doc, rng, room = self.documents[index], self.rng, seq_length - 3
        target = rng.randint(2, room) if rng.random() < SHORT_SEQ_PROB else room
        out, chunk, length, i = [], [], 0, 0
        while i < len(doc):
            chunk.append(doc[i])
            length += len(doc[i])
            if i == len(doc) - 1 or length >= target:
                cut = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                a = [t for sentence in chunk[:cut] for t in sentence]
                if len(chunk) == 1 or rng.random() < 0.5:
                    b, is_random = self._second(index, target - len(a))
                    i -= len(chunk) - cut          # the unused sentences are read again
                else:
                    b, is_random = [t for sentence in chunk[cut:] for t in sentence], False
                self._trim(a, b, room)
                if a and b:
                    out.append(self._sample(a, b, is_random, seq_length, max_predictions))
                chunk, length = [], 0
            i += 1
        return out

    def _sample(self, a: list[int], b: list[int], is_random: bool, seq_length: int,
                max_predictions: int) -> dict[str, Any]:
        cls, sep, mask = self.ids["[CLS]"], self.ids["[SEP]"], self.ids["[MASK]"]
        tokens = [cls, *a, sep, *b, sep]
        segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        candidates = [k for k, t in enumerate(tokens) if t not in (cls, sep)]
        self.rng.shuffle(candidates)
        count = min(max_predictions, max(1, round(len(tokens) * MASKED_LM_PROB)))
        chosen = sorted(candidates[:count])
        labels = [tokens[k] for k in chosen]
        for k in chosen:
            if self.rng.random() < 0.8:
                tokens[k] = mask
            elif self.rng.random() >= 0.5:
                tokens[k] = self.rng.randrange(self.vocab)
        pad = seq_length - len(tokens)
        extra = max_predictions - len(chosen)
        return {"input_ids": tokens + [0] * pad, "input_mask": [1] * len(tokens) + [0] * pad,
                "segment_ids": segments + [0] * pad,
                "masked_lm_positions": chosen + [0] * extra,
                "masked_lm_ids": labels + [0] * extra,
                "next_sentence_labels": int(is_random)}


def tokenized(docs: list[Any], vocab_file: Path) -> tuple[Any, list[list[list[int]]]]:
    """The trainer's tokenizer on the vocabulary, and each document's sentences as ids (a
    document is its text, or already a list of its sentences)."""
    import transformers
    # From its folder: transformers 5 ignores a vocab_file argument (a vocabulary of specials).
    tok = transformers.BertTokenizerFast.from_pretrained(str(vocab_file.parent),
                                                         do_lower_case=True)
    lines = len(vocab_file.read_text(encoding="utf-8").splitlines())
    if len(tok) != lines:
        raise PayloadError(f"{vocab_file}: {lines} entries, but the tokenizer loaded {len(tok)}")
    documents = []
    for doc in docs:
        said = doc if isinstance(doc, list) else corpus.sentences(doc)
        ids = tok(said, add_special_tokens=False)["input_ids"] if said else []
        sentences = [s for s in ids if s]
        if sentences:
            documents.append(sentences)
    return tok, documents


def write(folder: Path, stem: str, docs: list[Any], vocab_file: Path,
          args: argparse.Namespace) -> str:
    """The shards, into ``folder``; returns what was written, in words."""
    import h5py
    import numpy as np
    if args.seq_length < 8:
        raise PayloadError("--seq-length must be at least 8 for BERT samples")
    tok, documents = tokenized(docs, vocab_file)
    rng = random.Random(args.seed)
    rng.shuffle(documents)
    pairs = Pairs(documents, {k: tok.convert_tokens_to_ids(k) for k in ("[CLS]", "[SEP]",
                                                                         "[MASK]")},
                  len(tok), rng)
    samples = [s for _ in range(args.dupe_factor) for index in range(len(documents))
               for s in pairs.from_document(index, args.seq_length, args.max_predictions)]
    rng.shuffle(samples)
    if len(samples) < args.shards:
        raise PayloadError(f"the text makes {len(samples)} samples, fewer than --shards "
                           f"{args.shards}: give more text")
    for n, part in enumerate(np.array_split(np.arange(len(samples)), args.shards)):
        with h5py.File(folder / f"{stem}_training_{n}.hdf5", "w") as shard:
            for key, dtype in DTYPES.items():
                shard.create_dataset(key, data=np.array([samples[k][key] for k in part]),
                                     dtype=dtype, compression="gzip")
    return (f"{len(samples)} samples of {args.seq_length} tokens in {args.shards} shards "
            f"({stem}_training_*.hdf5)")
