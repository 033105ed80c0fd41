"""Write small, valid wikicorpus-style hdf5 shards for tests and smoke runs.

Usage: python make_tiny_shard.py --out DIR [--samples 64] [--seq-length 32] [--max-predictions 5]
       [--vocab-size 1000] [--seed 0] [--shards 1]

Each sample is ``[CLS] A [SEP] B [SEP]`` followed by padding, with about 15 % of the real tokens
replaced by [MASK] and recorded in ``masked_lm_positions/ids``. The content is a pure function of
the flags, so tests can rely on it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

PAD, CLS, SEP, MASK = 0, 1, 2, 3
FIRST_WORD = 5  # ids below this are reserved for the special tokens above


def make_sample(rng: np.random.Generator, seq_length: int, max_predictions: int,
                vocab_size: int) -> dict[str, np.ndarray]:
    """One sample as a dict of 1-D arrays (the row layout of the shard)."""
    used = int(rng.integers(max(8, seq_length // 2), seq_length + 1))
    words = rng.integers(FIRST_WORD, vocab_size, size=used - 3)
    split = int(rng.integers(1, len(words)))
    ids = np.concatenate([[CLS], words[:split], [SEP], words[split:], [SEP]])
    segments = np.concatenate([np.zeros(split + 2), np.ones(len(words) - split + 1)])
    # Only word positions may be masked; position 0 ([CLS]) doubles as the padding value.
    candidates = np.array([i for i in range(1, used) if ids[i] >= FIRST_WORD])
    count = min(max_predictions, max(1, round(0.15 * len(candidates))))
    chosen = np.sort(rng.choice(candidates, size=count, replace=False))
    positions = np.zeros(max_predictions, dtype=np.int32)
    targets = np.zeros(max_predictions, dtype=np.int32)
    positions[:count], targets[:count] = chosen, ids[chosen]
    ids[chosen] = MASK

    def padded(values: np.ndarray) -> np.ndarray:
        out = np.zeros(seq_length, dtype=np.int32)
        out[:used] = values
        return out

    return {
        "input_ids": padded(ids),
        "input_mask": padded(np.ones(used)),
        "segment_ids": padded(segments),
        "masked_lm_positions": positions,
        "masked_lm_ids": targets,
        "next_sentence_labels": np.array(rng.integers(0, 2), dtype=np.int8),
    }


def write_shard(path: Path, samples: int, seq_length: int, max_predictions: int,
                vocab_size: int, seed: int) -> None:
    """Write the shard under a private temporary name (a dot file, which the trainer's shard
    listing skips) and rename it into place: several nodes sharing a filesystem may write the
    same shard at once, and a reader must never see a half-written one."""
    rng = np.random.default_rng(seed)
    rows = [make_sample(rng, seq_length, max_predictions, vocab_size) for _ in range(samples)]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as shard:
            for key in rows[0]:
                shard.create_dataset(key, data=np.stack([row[key] for row in rows]))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument("--samples", type=int, default=64, help="samples per shard")
    parser.add_argument("--seq-length", type=int, default=32)
    parser.add_argument("--max-predictions", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=1, help="number of shards to write")
    args = parser.parse_args(argv)
    if args.seq_length < 8 or args.vocab_size <= FIRST_WORD + 1:
        parser.error("need --seq-length >= 8 and --vocab-size > 6")
    if args.samples < 1 or args.max_predictions < 1 or args.shards < 1:
        parser.error("--samples, --max-predictions and --shards must be positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for index in range(args.shards):
        path = args.out / f"tiny_training_{index}.hdf5"
        write_shard(path, args.samples, args.seq_length, args.max_predictions,
                    args.vocab_size, args.seed * 1000 + index)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
