"""The smoke trainer's rows from a prepared dataset (prepare_data.py's, or the real one), read
through the library the recipe's trainer reads it with, in place of made-up batches:

- megatron: megatron-core's IndexedDataset over each ``PREFIX.bin``/``.idx``; sample ``i`` is
  the ``seq_length`` tokens from ``i * seq_length`` of the documents (of every prefix, in order)
  laid end to end, read in pieces
  with ``get(document, offset, length)`` where it spans documents, as Megatron's GPT dataset
  reads a sample;
- hf_blocks: ``datasets.load_from_disk`` of the packed blocks; sample ``i`` is row ``i``'s
  ``input_ids``, which must be ``seq_length`` long.

Positions past the last sample wrap around (another epoch).
"""
from __future__ import annotations

import bisect
import importlib
import warnings
from pathlib import Path
from typing import Any

from common.runtime import PayloadError

FORMATS = ("megatron", "hf_blocks")


def _need(module: str, package: str) -> Any:
    try:
        with warnings.catch_warnings():     # megatron-core warns of optional GPU libraries
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError:
        raise PayloadError(f"this dataset format needs the {package} package: pip install "
                           f"{package}") from None


class MegatronRows:
    def __init__(self, prefixes: list[str], seq_length: int) -> None:
        indexed = _need("megatron.core.datasets.indexed_dataset", "megatron-core")
        self.parts: list[tuple[Any, int]] = []      # (dataset, document), in reading order
        self.starts = [0]
        for prefix in prefixes:
            for suffix in (".bin", ".idx"):
                if not Path(prefix + suffix).is_file():
                    raise PayloadError(f"--data-prefix {prefix}: no {prefix}{suffix}")
            data = indexed.IndexedDataset(prefix)
            for doc, n in enumerate(data.sequence_lengths):
                self.parts.append((data, doc))
                self.starts.append(self.starts[-1] + int(n))
        self.seq_length = seq_length
        self.samples = max(0, self.starts[-1] - 1) // seq_length
        if self.samples == 0:
            raise PayloadError(f"--data-prefix {' '.join(prefixes)}: fewer than "
                               f"{seq_length + 1} tokens")

    def row(self, sample: int) -> list[int]:
        at, want = (sample % self.samples) * self.seq_length, self.seq_length
        part = bisect.bisect_right(self.starts, at) - 1
        out: list[int] = []
        while want:
            take = min(want, self.starts[part + 1] - at)
            if take:
                data, doc = self.parts[part]
                out.extend(int(t) for t in data.get(doc, offset=at - self.starts[part],
                                                    length=take))
            at, want, part = at + take, want - take, part + 1
        return out


class BlockRows:
    def __init__(self, folder: str, seq_length: int) -> None:
        datasets = _need("datasets", "datasets")
        if not Path(folder, "state.json").is_file():
            raise PayloadError(f"--data-dir {folder}: not a dataset saved with save_to_disk")
        self.data = datasets.load_from_disk(folder).with_format("numpy", columns=["input_ids"])
        self.samples = len(self.data)
        if self.samples == 0:
            raise PayloadError(f"--data-dir {folder}: holds no rows")
        width = len(self.data[0]["input_ids"])
        if width != seq_length:
            raise PayloadError(f"--data-dir {folder}: blocks of {width} tokens, not "
                               f"--seq-length {seq_length}")

    def row(self, sample: int) -> list[int]:
        return [int(t) for t in self.data[sample % self.samples]["input_ids"]]


def open_rows(fmt: str, where: list[str], seq_length: int) -> MegatronRows | BlockRows:
    """The rows of the prefixes (megatron, read one after another) or the folder (hf_blocks)."""
    return (MegatronRows(where, seq_length) if fmt == "megatron"
            else BlockRows(where[0], seq_length))
