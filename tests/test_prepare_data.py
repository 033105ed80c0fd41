"""The smoke-sized prepare step (payload/smoke/prepare_data.py) and the smoke trainer reading what
it writes: each format made with the real libraries, judged by the data check as the nodes run it,
its tokens compared with an independent call of the tokenizer it saved (transformers' loaders of
the saved files), and read back by the trainer's data path. Every program runs as the job runs
it: the job's interpreter, by path, from a working folder of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PREPARE = ROOT / "payload" / "smoke" / "prepare_data.py"
CHECK = ROOT / "payload" / "common" / "data_check.py"
TRAIN = ROOT / "payload" / "smoke" / "train.py"
GPT2 = ["--path", "gpt2/my-gpt2_text_document", "--vocab-file", "gpt2/gpt2-vocab.json",
        "--merge-file", "gpt2/gpt2-merges.txt"]

# The test's own text: plain words, numbers, punctuation, accents and a non-Latin script.
PARAGRAPHS = [
    "The ferry left Tromsø at {n} o'clock, and the café by the pier stayed open late.",
    "Über {n} volunteers counted birds; the report (page {n}) lists 37 species!",
    "Η βιβλιοθήκη άνοιξε ξανά. Readers returned {n} books in the first week?",
    "A quiet road ran north along the river. It was paved in {n}, then widened.",
]


def documents(count: int = 160) -> list[str]:
    return [PARAGRAPHS[i % len(PARAGRAPHS)].format(n=i * 7 + 3) for i in range(count)]


def prepare(tmp: Path, *args: str, docs: list[str] | None = None) -> subprocess.CompletedProcess:
    extra: list[str] = []
    if docs is not None:
        source = tmp / "input.jsonl"
        source.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), "utf-8")
        extra = ["--from", str(source)]
    return subprocess.run([sys.executable, str(PREPARE), "--data-dir", "data", "--seed", "3",
                           *args, *extra], cwd=tmp, text=True, capture_output=True,
                          timeout=300, check=False)


def check(tmp: Path, want: dict[str, Any]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), "node"], cwd=tmp, text=True,
                          capture_output=True, timeout=120, check=False,
                          env={**os.environ, "JOBGEN_DATA": json.dumps([want])})


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def test_megatron_tokens_are_gpt2_bpe_with_eod_and_pass_the_check(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    docs = documents()
    ok(prepare(tmp_path, "--format", "megatron", *GPT2, "--seq-length", "16",
               "--vocab-size", "400", docs=docs))
    data = tmp_path / "data" / "gpt2"
    assert sorted(p.name for p in data.iterdir()) == [
        "gpt2-merges.txt", "gpt2-vocab.json", "my-gpt2_text_document.bin",
        "my-gpt2_text_document.idx"]     # nothing temporary left
    said = ok(check(tmp_path, {"format": "megatron", "prefixes": [str(data /
                                                                      "my-gpt2_text_document")],
                               "vocab_file": str(data / "gpt2-vocab.json"), "seq_length": 16,
                               "global_batch": 4}))
    assert "1 shard(s) of uint16" in said
    # transformers' GPT-2 tokenizer loaded from the saved files, as a trainer loads them.
    tok = transformers.GPT2Tokenizer(vocab=str(data / "gpt2-vocab.json"),
                                     merges=str(data / "gpt2-merges.txt"))
    eod = tok.convert_tokens_to_ids("<|endoftext|>")
    stored = indexed.IndexedDataset(str(data / "my-gpt2_text_document"))
    assert len(stored) == len(docs)
    for n, doc in enumerate(docs):
        ids = [int(t) for t in stored[n]]
        assert ids == tok.encode(doc) + [eod]
        assert tok.decode(ids[:-1]) == doc


def test_hf_blocks_are_the_llama_style_tokenizers_ids_cut_into_blocks(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    docs = documents()
    ok(prepare(tmp_path, "--format", "hf_blocks", "--path", "wikicorpus_llama2_tokenized_4k",
               "--seq-length", "32", "--vocab-size", "400", docs=docs))
    folder = tmp_path / "data" / "wikicorpus_llama2_tokenized_4k"
    want = {"format": "hf_blocks", "path": str(folder), "seq_length": 32, "vocab_size": 400,
            "columns": ["input_ids", "attention_mask", "labels"], "global_batch": 4}
    assert "of int32" in ok(check(tmp_path, want))
    assert not [p for p in (tmp_path / "data").iterdir() if p.name.startswith(".")]
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    encoded = tok(docs)["input_ids"]
    assert all(ids[0] == tok.bos_token_id for ids in encoded)     # <s> starts each document
    assert [tok.decode(ids, skip_special_tokens=True) for ids in encoded] == docs
    stream = [t for ids in encoded for t in ids]
    rows = datasets.load_from_disk(str(folder))
    assert len(rows) == len(stream) // 32 > 0
    for n in range(len(rows)):
        row = rows[n]
        assert row["input_ids"] == stream[n * 32:(n + 1) * 32] == row["labels"]
        assert row["attention_mask"] == [1] * 32


def test_bert_shards_hold_the_wordpiece_ids_masked_as_the_trainer_reads(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    h5py = pytest.importorskip("h5py")
    numpy = pytest.importorskip("numpy")
    docs = [" ".join(documents(200)[i:i + 4]) for i in range(0, 200, 4)]
    ok(prepare(tmp_path, "--format", "bert_hdf5", "--path", "hdf5_seq_len_32/wikicorpus_en",
               "--seq-length", "32", "--max-predictions", "5", "--vocab-size", "400",
               docs=docs))
    folder = tmp_path / "data" / "hdf5_seq_len_32" / "wikicorpus_en"
    assert sorted(p.name for p in folder.iterdir()) == [
        "vocab.txt", "wikicorpus_en_training_0.hdf5", "wikicorpus_en_training_1.hdf5"]
    want = {"format": "bert_hdf5", "path": str(folder), "seq_length": 32, "max_predictions": 5,
            "global_batch": 8}
    assert "2 shard(s) of hdf5" in ok(check(tmp_path, want))
    # From the folder: transformers 5 ignores vocab_file= (a vocabulary of the specials only).
    tok = transformers.BertTokenizerFast.from_pretrained(str(folder), do_lower_case=True)
    assert len(tok) == len((folder / "vocab.txt").read_text().splitlines()) > 100
    streams = [" ".join(map(str, tok(d, add_special_tokens=False)["input_ids"])) for d in docs]
    cls, sep = tok.cls_token_id, tok.sep_token_id
    with h5py.File(folder / "wikicorpus_en_training_0.hdf5") as shard:
        assert {k: shard[k].dtype.str for k in shard} == {
            "input_ids": "<i4", "input_mask": "|i1", "segment_ids": "|i1",
            "masked_lm_positions": "<i4", "masked_lm_ids": "<i4", "next_sentence_labels": "|i1"}
        arrays = {k: shard[k][()] for k in shard}
    random_next = 0
    for n in range(min(60, len(arrays["input_ids"]))):
        ids = arrays["input_ids"][n].tolist()
        positions = arrays["masked_lm_positions"][n]
        real = positions[positions != 0]
        assert 1 <= len(real) <= 5 and list(real) == sorted(real)
        for k, label in zip(real, arrays["masked_lm_ids"][n]):
            ids[k] = int(label)             # the original tokens back
        used = int(arrays["input_mask"][n].sum())
        first = ids.index(sep)
        assert ids[0] == cls and ids[used - 1] == sep and ids[used:] == [0] * (32 - used)
        for part in (ids[1:first], ids[first + 1:used - 1]):
            assert part and any(" ".join(map(str, part)) in s for s in streams)
        assert arrays["segment_ids"][n].tolist() == [0] * (first + 1) + [1] * (
            used - first - 1) + [0] * (32 - used)
        random_next += int(arrays["next_sentence_labels"][n])
    assert 0 < random_next < 60
    assert numpy.isin(arrays["next_sentence_labels"], (0, 1)).all()


@pytest.mark.slow   # seconds of CPU each: the full tier runs it
def test_the_generated_corpus_is_seeded(tmp_path: Path) -> None:
    args = ("--format", "megatron", *GPT2, "--seq-length", "16", "--vocab-size", "300")
    first = tmp_path / "a"
    second = tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        said = ok(prepare(folder, *args))
    assert " tokens of uint16" in said
    files = ("my-gpt2_text_document.bin", "gpt2-vocab.json")
    assert [(first / "data/gpt2" / f).read_bytes() for f in files] == [
        (second / "data/gpt2" / f).read_bytes() for f in files]
    size = (first / "data/gpt2/my-gpt2_text_document.bin").stat().st_size
    assert 100_000 < size < 1_000_000      # smoke-sized: a few hundred KB of text


@pytest.mark.parametrize("content, said", [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "input.jsonl: not text or JSONL (it holds NUL bytes)"),
    (b"caf\xe9 au lait\n", "input.jsonl: not text or JSONL (not UTF-8 at byte 3)"),
    (b'{"text": "fine"}\n{"txt": "no"}\n', 'input.jsonl: line 2 is not a JSON object with a '
                                           '"text" string'),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path: Path, content: bytes,
                                                          said: str) -> None:
    (tmp_path / "input.jsonl").write_bytes(content)
    done = subprocess.run([sys.executable, str(PREPARE), "--format", "hf_blocks", "--data-dir",
                           "data", "--path", "blocks", "--seq-length", "8", "--vocab-size",
                           "300", "--seed", "1", "--from", "input.jsonl"], cwd=tmp_path,
                          text=True, capture_output=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip() == f"prepare-data: error: --from {said}"
    assert not (tmp_path / "data").exists()


def test_a_failure_late_in_the_write_leaves_nothing_that_looks_whole(tmp_path: Path) -> None:
    done = prepare(tmp_path, "--format", "hf_blocks", "--path", "blocks", "--seq-length",
                   "100000", "--vocab-size", "300", docs=documents(8))
    assert done.returncode == 2
    assert "makes no block of --seq-length 100000 tokens" in done.stderr
    assert list((tmp_path / "data").iterdir()) == []


def _trainer_step(tmp: Path, *data: str) -> dict[str, Any]:
    """One single-process step of the smoke trainer's compile pass: its start and step events."""
    done = subprocess.run([sys.executable, str(TRAIN), "--phase", "compile", "--compile-steps",
                           "1", "--micro-batch-size", "2", "--seq-length", "16",
                           "--vocab-size", "400", "--output-dir", "out", *data], cwd=tmp,
                          text=True, capture_output=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    events = [json.loads(line) for line in ok(done).splitlines() if line.startswith("{")]
    return {e["event"]: e for e in events}


@pytest.mark.slow   # seconds of CPU each: the full tier runs it
def test_the_trainer_reads_the_prepared_megatron_tokens(tmp_path: Path) -> None:
    numpy = pytest.importorskip("numpy")
    ok(prepare(tmp_path, "--format", "megatron", *GPT2, "--seq-length", "16",
               "--vocab-size", "400", docs=documents(40)))
    prefix = "data/gpt2/my-gpt2_text_document"
    events = _trainer_step(tmp_path, "--data-format", "megatron", "--data-prefix", prefix)
    assert events["start"]["data"] == "megatron"
    # Samples 0 and 1: the first 32 tokens of the documents end to end, read here from the .bin.
    tokens = numpy.fromfile(tmp_path / f"{prefix}.bin", dtype=numpy.uint16)[:32]
    assert events["step"]["data_crc32"] == [zlib.crc32(tokens.astype("<i8").tobytes())]


@pytest.mark.slow   # seconds of CPU each: the full tier runs it
def test_the_trainer_reads_the_prepared_blocks(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    numpy = pytest.importorskip("numpy")
    ok(prepare(tmp_path, "--format", "hf_blocks", "--path", "blocks", "--seq-length", "16",
               "--vocab-size", "400", docs=documents(40)))
    events = _trainer_step(tmp_path, "--data-format", "hf_blocks", "--data-dir", "data/blocks",
                           "--family", "llama")
    rows = datasets.load_from_disk(str(tmp_path / "data" / "blocks"))[:2]["input_ids"]
    want = zlib.crc32(numpy.array(rows, dtype="<i8").tobytes())
    assert events["start"]["data"] == "hf_blocks" and events["step"]["data_crc32"] == [want]


def _render(tmp: Path, recipe: str) -> str:
    jobgen = str(Path(sys.executable).with_name("jobgen"))
    done = subprocess.run([jobgen, "render", recipe, "--smoke", "--nodes", "2"], cwd=tmp,
                          text=True, capture_output=True, timeout=120, check=False)
    return ok(done)


@pytest.mark.slow   # seconds of CPU each: the full tier runs it
def test_a_rehearsal_reads_a_prepared_dataset_after_the_data_check(tmp_path: Path) -> None:
    """Without one it keeps its made-up batches; with one (or a broken one) the nodes' data
    check is given it, and a broken one is a configuration error before the compile pass."""
    assert "JOBGEN_DATA" not in _render(tmp_path, "neox20b")
    bert = _render(tmp_path, "bert1.5b")
    assert "make_tiny_shard.py" in bert and "JOBGEN_DATA" not in bert
    ok(prepare(tmp_path, "--format", "megatron", *GPT2, "--seq-length", "32",
               "--vocab-size", "400", "--data-dir", "jobgen-data", docs=documents(200)))
    script = _render(tmp_path, "neox20b")
    assert "--data-format\n  megatron\n  --data-prefix\n  jobgen-data/gpt2/my-gpt2_text_document" \
        in script.replace(" \\\n", "\n")
    line = next(x for x in script.splitlines() if x.startswith("export JOBGEN_DATA="))
    want = json.loads(line.split("=", 1)[1].strip("'"))
    assert (want["seq_length"], want["vocab_size"]) == (32, 512)   # the rehearsal's
    assert ok(check(tmp_path, want)).startswith("data: recipes/neox20b.yaml: data.path: ")
    bin_file = tmp_path / "jobgen-data/gpt2/my-gpt2_text_document.bin"
    bin_file.write_bytes(bin_file.read_bytes()[:-2])
    done = check(tmp_path, want)
    assert done.returncode == 78 and "(truncated, or not its pair)" in done.stderr


def _prepare_data() -> Any:
    sys.path[:0] = [str(ROOT / "payload"), str(ROOT / "payload" / "smoke")]
    import prepare_data
    return prepare_data


def test_the_rehearsals_bpe_is_trained_on_a_spread_sample_of_a_large_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past TRAIN_SAMPLE characters the BPE reads every k-th document (training cost stays
    bounded): its vocabulary is the one trained on that sample, not on the whole input."""
    tokenizers = pytest.importorskip("tokenizers")
    prepare_data = _prepare_data()
    # A word found only in the odd documents: frequent enough to become one token when read.
    docs = [f"the quiet road {'zyxwvq ' * 40 if n % 2 else ''}ran north" for n in range(200)]
    monkeypatch.setattr(prepare_data, "TRAIN_SAMPLE", sum(map(len, docs)) // 2)
    vocab = prepare_data.gpt2_bpe(docs, 300).get_vocab()
    sample = tokenizers.ByteLevelBPETokenizer()
    sample.train_from_iterator(docs[::2], vocab_size=300, min_frequency=2,
                               special_tokens=[prepare_data.EOD], show_progress=False)
    assert vocab == sample.get_vocab() and "Ġzyxwvq" not in vocab
    monkeypatch.setattr(prepare_data, "TRAIN_SAMPLE", sum(map(len, docs)))
    assert "Ġzyxwvq" in prepare_data.gpt2_bpe(docs, 300).get_vocab()


def test_chunked_encoding_is_each_documents_ids_then_eod(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Megatron writer's chunks (several here) join into encode_batch's ids, <|endoftext|>
    after each document, with each document's length."""
    numpy = pytest.importorskip("numpy")
    tokenizers = pytest.importorskip("tokenizers")
    prepare_data = _prepare_data()
    docs = documents(60)
    tok = prepare_data.gpt2_bpe(docs, 400)
    eod = tok.token_to_id(prepare_data.EOD)
    monkeypatch.setattr(prepare_data, "ENCODE_CHUNK", sum(map(len, docs)) // 7)
    plain = tokenizers.Tokenizer.from_str(tok.to_str())
    chunks = list(prepare_data.encoded_chunks(plain, docs, eod, numpy.uint16))
    assert len(chunks) >= 7
    want = [[*e.ids, eod] for e in tok.encode_batch(docs)]
    assert numpy.concatenate([flat for flat, _ in chunks]).tolist() == sum(want, [])
    assert numpy.concatenate([n for _, n in chunks]).tolist() == [len(w) for w in want]
    assert all(flat.dtype == numpy.uint16 for flat, _ in chunks)
