"""BERT phase-1 pretraining samples from wikicorpus-style hdf5 shards.

Each shard holds ``input_ids, input_mask, segment_ids`` [N, seq], ``masked_lm_positions,
masked_lm_ids`` [N, max_pred] (positions padded with 0, which is always [CLS] and so never a real
prediction) and ``next_sentence_labels`` [N].

The sample stream is an endless run of epochs. Epoch ``e`` visits the shards in an order drawn
from ``(seed, e)`` and the rows of each shard in an order drawn from ``(seed, e, shard)``; stream
position ``p`` therefore names one row without any state, which is what makes resuming exact and
free. Only the shards a batch touches are held in memory (a phase-1 shard is a few hundred MB).
"""
from __future__ import annotations

import bisect
from collections import OrderedDict
from pathlib import Path

import h5py
import numpy as np
from common.runtime import PayloadError

SEQUENCE_KEYS = ("input_ids", "input_mask", "segment_ids")
PREDICTION_KEYS = ("masked_lm_positions", "masked_lm_ids")
REQUIRED_KEYS = SEQUENCE_KEYS + PREDICTION_KEYS + ("next_sentence_labels",)
IGNORE_INDEX = -100  # what torch's cross-entropy skips


def find_training_files(input_dir: Path) -> list[Path]:
    """The shards to train on: every file in ``input_dir`` whose name contains ``training``."""
    if not input_dir.is_dir():
        raise PayloadError(f"--input-dir {input_dir} is not a directory")
    files = sorted(p for p in input_dir.iterdir()
                   if p.is_file() and "training" in p.name and not p.name.startswith("."))
    if not files:
        raise PayloadError(f"no training shards in {input_dir} "
                           "(expected hdf5 files whose name contains 'training')")
    return files


def mlm_labels(seq_length: int, positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Dense MLM labels [B, seq]: the original token at each masked position, -100 elsewhere."""
    labels = np.full((positions.shape[0], seq_length), IGNORE_INDEX, dtype=np.int64)
    rows = np.broadcast_to(np.arange(positions.shape[0])[:, None], positions.shape)
    real = positions != 0
    labels[rows[real], positions[real]] = ids[real]
    return labels


def check_shard(path: Path, seq_length: int, max_predictions: int) -> int:
    """Validate one shard's layout and return its sample count."""
    try:
        with h5py.File(path, "r") as shard:
            missing = [key for key in REQUIRED_KEYS if key not in shard]
            if missing:
                raise PayloadError(f"{path}: missing datasets {', '.join(missing)}")
            count = int(shard["next_sentence_labels"].shape[0])
            widths = dict.fromkeys(SEQUENCE_KEYS, seq_length)
            widths.update(dict.fromkeys(PREDICTION_KEYS, max_predictions))
            for key, width in widths.items():
                shape = tuple(shard[key].shape)
                if shape != (count, width):
                    raise PayloadError(f"{path}: dataset {key} has shape {shape}, expected "
                                       f"({count}, {width}) for the given "
                                       "--seq-length/--max-predictions")
    except OSError as exc:
        raise PayloadError(f"{path}: not a readable hdf5 file ({exc})") from exc
    return count


class ShardedSamples:
    """Deterministic, resumable view of the samples in a set of shards."""

    def __init__(self, files: list[Path], seq_length: int, max_predictions: int,
                 seed: int) -> None:
        self.files = files
        self.seq_length = seq_length
        self.seed = seed
        self.counts = [check_shard(p, seq_length, max_predictions) for p in files]
        self.total = sum(self.counts)
        if self.total == 0:
            raise PayloadError("the training shards hold no samples")
        self._shards: OrderedDict[int, dict[str, np.ndarray]] = OrderedDict()
        self._orders: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def _epoch_layout(self, epoch: int) -> tuple[np.ndarray, list[int]]:
        """Shard visiting order for an epoch and the cumulative sample counts along it."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        return order, np.cumsum([self.counts[i] for i in order]).tolist()

    def _row_order(self, epoch: int, shard: int) -> np.ndarray:
        key = (epoch, shard)
        if key not in self._orders:
            rng = np.random.default_rng([self.seed, epoch, shard])
            self._orders[key] = rng.permutation(self.counts[shard])
            while len(self._orders) > 4:
                self._orders.popitem(last=False)
        return self._orders[key]

    def locate(self, position: int) -> tuple[int, int]:
        """(shard index, row) of a stream position."""
        epoch, offset = divmod(position, self.total)
        order, ends = self._epoch_layout(epoch)
        slot = bisect.bisect_right(ends, offset)
        shard = int(order[slot])
        within = offset - (ends[slot - 1] if slot else 0)
        return shard, int(self._row_order(epoch, shard)[within])

    def _shard(self, index: int) -> dict[str, np.ndarray]:
        if index not in self._shards:
            with h5py.File(self.files[index], "r") as shard:
                self._shards[index] = {key: shard[key][()] for key in REQUIRED_KEYS}
            # Two shards cover a batch that straddles a shard boundary.
            while len(self._shards) > 2:
                self._shards.popitem(last=False)
        return self._shards[index]

    def batch(self, positions: list[int]) -> dict[str, np.ndarray]:
        """Model inputs (int64 numpy arrays) for the samples at the given stream positions."""
        picked: dict[str, list[np.ndarray]] = {key: [] for key in REQUIRED_KEYS}
        for position in positions:
            shard, row = self.locate(position)
            arrays = self._shard(shard)
            for key in REQUIRED_KEYS:
                picked[key].append(arrays[key][row])
        stacked = {key: np.stack(values).astype(np.int64) for key, values in picked.items()}
        return {
            "input_ids": stacked["input_ids"],
            "attention_mask": stacked["input_mask"],
            "token_type_ids": stacked["segment_ids"],
            "labels": mlm_labels(self.seq_length, stacked["masked_lm_positions"],
                                 stacked["masked_lm_ids"]),
            "next_sentence_label": stacked["next_sentence_labels"].reshape(-1),
        }
