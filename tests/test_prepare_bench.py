"""benchmarks/prepare_bench.py's corpora: the large input extends the small one (no timings)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import prepare_bench  # noqa: E402


def test_the_large_corpus_is_the_small_one_and_more_like_it() -> None:
    small = prepare_bench.corpus(7, 100_000)
    large = prepare_bench.corpus(7, 100_000, 3)
    assert small == prepare_bench.corpus(7, 100_000)
    assert large[:len(small)] == small
    rest = large[len(small):]
    assert 2.5 < sum(map(len, large)) / sum(map(len, small)) < 3.5
    assert rest[:len(small)] != small
    # The added parts draw from the same lexicon: most of their words are the small part's
    # (the rest, rare words of the Zipf tail); another seed's corpus shares almost none.
    seen = {w.strip(".!?;").lower() for d in small for w in d.split()}

    def shared(docs: list[str]) -> float:
        words = [w.strip(".!?;").lower() for d in docs for w in d.split()]
        return sum(w in seen for w in words) / len(words)

    assert shared(rest) > 0.5 > 0.1 > shared(prepare_bench.corpus(8, 200_000))
