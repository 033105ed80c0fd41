"""Which dataset rows a data-parallel rank reads, as a function of the consumed-sample count.

``common.runtime.batch_positions`` places every optimizer step at fixed positions of one global
sample stream; over a finite dataset the stream repeats it epoch after epoch. A resumed run
starts the stream at the consumed-sample count its checkpoint recorded, so it reads exactly the
rows an uninterrupted run would have read, and skipping what was consumed costs nothing (no
batches are drawn and thrown away).
"""
from __future__ import annotations

from collections.abc import Iterator

from common.runtime import PayloadError, batch_positions


def dataset_rows(positions: list[int], rows: int) -> list[int]:
    """Dataset rows at these stream positions (position modulo the dataset's length)."""
    return [p % rows for p in positions]


class RankStream:
    """The dataset rows one data-parallel rank reads, in order, from ``consumed`` samples of the
    global stream onward: a sampler for torch's DataLoader, micro-batch after micro-batch. It
    never ends; the run's step count does."""

    def __init__(self, consumed: int, micro: int, accumulation: int, dp_size: int, dp_rank: int,
                 rows: int) -> None:
        if rows < 1:
            raise PayloadError("the dataset has no rows")
        self.consumed, self.micro, self.accumulation = consumed, micro, accumulation
        self.dp_size, self.dp_rank, self.rows = dp_size, dp_rank, rows

    def __iter__(self) -> Iterator[int]:
        consumed = self.consumed
        while True:
            for positions in batch_positions(consumed, self.micro, self.accumulation,
                                             self.dp_size, self.dp_rank):
                yield from dataset_rows(positions, self.rows)
            consumed += self.micro * self.accumulation * self.dp_size
