"""The prepare stage of the Hugging Face tokenized datasets (payload/common/prepare_tokenized.py,
jobgen/payloads/stages.py): the rendered job, then the program run as the job runs it on a tiny
tokenizer trained here and a small generated corpus, judged by the data check and by the
tokenizer's own encoding of the same text."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import JOBGEN_EXE

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "payload" / "common" / "prepare_tokenized.py"
CHECK = ROOT / "payload" / "common" / "data_check.py"
UPSTREAM = json.loads((ROOT / "jobgen/payloads/upstream/prepare_tokenized.json").read_text())


def jobgen(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN_EXE), *words], capture_output=True, text=True,
                          timeout=120, check=False)


def args_of(sbatch: str) -> list[str]:
    block = sbatch.split("ARGS=(\n", 1)[1].split("\n)\n", 1)[0]
    return [line.strip().strip("'") for line in block.splitlines()]


def test_the_llama_prepare_job_names_the_recipes_tokenizer_and_never_a_token() -> None:
    proc = jobgen("render", "llama2-7b", "--site", "trn1-pcluster", "--stage", "prepare")
    assert proc.returncode == 0, proc.stderr
    assert "PROGRAM=common/prepare_tokenized.py\n" in proc.stdout
    args = args_of(proc.stdout)
    assert args[args.index("--tokenizer") + 1] == "meta-llama/Llama-2-7b-hf"
    assert args[args.index("--seq-length") + 1] == "4096"
    assert args[args.index("--path") + 1] == "wikicorpus_llama2_tokenized_4k"
    assert "--from" not in args and "HF_TOKEN" not in proc.stdout
    assert "the job fetches the tutorial's corpus (wikicorpus raw_en)" in proc.stderr
    assert "reads HF_TOKEN from the job's environment on the node" in proc.stderr


def test_the_bert_prepare_job_takes_from() -> None:
    proc = jobgen("render", "bert1.5b", "--stage", "prepare", "--from", "s3://b/wiki.txt")
    assert proc.returncode == 0, proc.stderr
    args = args_of(proc.stdout)
    assert args[:2] == ["--format", "bert_hdf5"]
    assert args[args.index("--max-predictions") + 1] == "20"
    assert args[args.index("--tokenizer") + 1] == "google-bert/bert-large-uncased"
    assert args[-2:] == ["--from", "s3://b/wiki.txt"]
    assert "no --from" not in proc.stderr      # without it: tests/test_prepare_wikipedia.py


# --- the program, on a tokenizer trained here ---------------------------------------------------

def _smoke() -> Any:
    sys.path[:0] = [str(ROOT / "payload"), str(ROOT / "payload" / "smoke")]
    import corpus
    import prepare_data
    return corpus, prepare_data


def run(tmp: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROGRAM), "--data-dir", str(tmp / "data"),
                           *words], capture_output=True, text=True, timeout=300, check=False,
                          cwd=tmp, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def data_check(want: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), "node"], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "JOBGEN_DATA": json.dumps([want])})


@pytest.mark.slow
def test_blocks_are_the_tokenizers_own_tokens_cut_as_get_dataset_cuts_them(
        tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    corpus, prepare_data = _smoke()
    # Over 1,000 documents: two map batches, each cut on its own.
    docs = corpus.generated(5, 250_000)
    docs = docs + corpus.generated(6, 250_000)
    prepare_data.llama_tokenizer(docs, 300).save_pretrained(str(tmp_path / "tok"))
    with (tmp_path / "in.jsonl").open("w") as fh:
        fh.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    done = run(tmp_path, "--format", "hf_blocks", "--path", "wiki_4k", "--tokenizer",
               str(tmp_path / "tok"), "--seq-length", "128", "--workers", "2",
               "--from", str(tmp_path / "in.jsonl"))
    assert done.returncode == 0, done.stderr
    final = tmp_path / "data" / "wiki_4k"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["wiki_4k"]  # no leftovers
    checked = data_check({"format": "hf_blocks", "path": str(final), "seq_length": 128,
                          "vocab_size": 300, "columns": ["input_ids", "attention_mask",
                                                         "labels"], "global_batch": 4})
    assert checked.returncode == 0, checked.stderr
    # The tokenizer's own ids, document by document, concatenated per 1,000 and cut.
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    want: list[list[int]] = []
    for start in range(0, len(docs), 1000):
        ids = [t for d in docs[start:start + 1000] for t in tok(d)["input_ids"]]
        want += [ids[i:i + 128] for i in range(0, len(ids) // 128 * 128, 128)]
    blocks = datasets.load_from_disk(str(final))
    assert len(docs) > 1000 and blocks["input_ids"] == want and blocks["labels"] == want
    assert set(map(tuple, blocks["attention_mask"])) == {(1,) * 128}
    assert done.stdout.splitlines()[-1].startswith(f"prepare: wrote {final}: {len(want):,} "
                                                   "blocks of 128 tokens")


@pytest.mark.slow
def test_a_bad_from_or_a_missing_tokenizer_is_one_line_78_and_nothing_written(
        tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n[1, 2]\n')
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01binary")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nfine\n")
    for source, said in (("bad.jsonl", 'line 2 is not a JSON object with a "text" string'),
                         ("bin.txt", "not text or JSONL (binary data)"),
                         ("absent.txt", "missing or not a regular file")):
        done = run(tmp_path, "--format", "bert_hdf5", "--path", "hdf5/wikicorpus_en",
                   "--tokenizer", str(tmp_path / "tok"), "--seq-length", "128",
                   "--from", str(tmp_path / source))
        assert done.returncode == 78, done.stderr
        assert done.stderr.strip().splitlines()[-1].endswith(said), done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    gated = run(tmp_path, "--format", "hf_blocks", "--path", "x", "--tokenizer",
                "no-such-owner/no-such-tokenizer", "--seq-length", "8",
                "--from", str(tmp_path / "bad.jsonl"))
    assert gated.returncode == 78
    assert gated.stderr.startswith("error: prepare: --tokenizer no-such-owner/no-such-tokenizer: "
                                   "cannot be loaded (")
    assert len(gated.stderr.strip().splitlines()) == 1
    assert [p.name for p in (tmp_path / "data" / "hdf5").iterdir()] == []


@pytest.mark.slow
def test_bert_shards_pass_the_trainers_shard_check_with_the_tokenizers_ids(
        tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    corpus, _ = _smoke()
    docs = corpus.generated(8, 150_000)
    wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(docs, vocab_size=400, min_frequency=2, show_progress=False,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    (tmp_path / "tok").mkdir()
    wordpiece.save_model(str(tmp_path / "tok"))
    (tmp_path / "in.txt").write_text("".join(f"{d}\n\n" for d in docs))
    path = "hdf5_lower_case_1_seq_len_128_max_pred_20/wikicorpus_en"
    done = run(tmp_path, "--format", "bert_hdf5", "--path", path, "--tokenizer",
               str(tmp_path / "tok"), "--seq-length", "128", "--max-predictions", "20",
               "--shards", "3", "--workers", "2", "--from", str(tmp_path / "in.txt"))
    assert done.returncode == 0, done.stderr
    final = tmp_path / "data" / path
    assert sorted(p.name for p in final.iterdir()) == [
        "vocab.txt", *(f"wikicorpus_en_training_{n}.hdf5" for n in range(3))]
    checked = data_check({"format": "bert_hdf5", "path": str(final), "seq_length": 128,
                          "max_predictions": 20, "global_batch": 8})
    assert checked.returncode == 0, checked.stderr
    # Unmasked positions hold the tokenizer's own ids: every sample's first segment is a run
    # of some document's tokens, and [UNK] never appears (the vocabulary covers the corpus).
    tok = transformers.BertTokenizerFast.from_pretrained(str(tmp_path / "tok"))
    assert len(tok) == wordpiece.get_vocab_size()
    every = {t for d in docs for t in tok(d, add_special_tokens=False)["input_ids"]}
    unk, cls, sep = (tok.convert_tokens_to_ids(t) for t in ("[UNK]", "[CLS]", "[SEP]"))
    with h5py.File(final / "wikicorpus_en_training_0.hdf5") as shard:
        ids, positions = shard["input_ids"][:], shard["masked_lm_positions"][:]
    for row, masked in zip(ids[:50], positions[:50]):
        hidden = set(masked.tolist()) - {0}          # 0 pads the list ([CLS] is never masked)
        kept = [int(t) for k, t in enumerate(row) if k not in hidden and t]
        assert kept[0] == cls and unk not in kept
        assert set(kept) - {cls, sep} <= every


def test_wikicorpus_articles_are_read_as_its_loading_script_gave_them(tmp_path: Path) -> None:
    import io
    import tarfile
    raw = ('<doc id="12" title="Anarchism" nonfiltered="1" processed="1" dbindex="0">\n'
           "Anarchism\n\nAnarchism is a political philosophy caf\xe9.\n"
           "ENDOFARTICLE.\n</doc>\n"
           '<doc id="25" title="Autism" nonfiltered="2" processed="2" dbindex="1">\n'
           "Autism is a disorder.\nENDOFARTICLE.\n</doc>\n").encode("latin-1")
    with tarfile.open(tmp_path / "raw.en.tgz", "w:gz") as tar:
        info = tarfile.TarInfo("raw.en/englishText_0_10000")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    sys.path.insert(0, str(ROOT / "payload" / "common"))
    import prepare_tokenized
    assert list(prepare_tokenized.wikicorpus(tmp_path / "raw.en.tgz")) == [
        "Anarchism\n\n\n\nAnarchism is a political philosophy caf\xe9.",
        "Autism is a disorder."]
    assert "wikicorpus_llama2_tokenized_4k" in UPSTREAM["hf_blocks"]["facts"][-1]


def test_the_rust_encoder_makes_the_transformers_tokenizers_ids_cut_as_group_texts_cuts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """encoded_blocks (encode_batch_fast on the tokenizer's backend, chunks of ENCODE_BATCH
    documents, cut per 1,000) == tokenizer(text) per 1,000-document map batch through
    group_texts, BOS and all; chunks here of 2,000 over 2,500 documents: 1,000 + 1,000 | 500."""
    transformers = pytest.importorskip("transformers")
    corpus, prepare_data = _smoke()
    sys.path.insert(0, str(PROGRAM.parent))
    import prepare_tokenized as pt
    docs = corpus.generated(3, 1_100_000)[:2500]
    assert len(docs) == 2500
    prepare_data.llama_tokenizer(docs[:300], 300).save_pretrained(str(tmp_path / "tok"))
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    monkeypatch.setattr(pt, "ENCODE_BATCH", 2000)
    got = [row.tolist() for rows in pt.encoded_blocks(pt.encoder(tok), iter(docs), 64)
           for row in rows]
    want: list[list[int]] = []
    for first in range(0, len(docs), pt.GROUP_BATCH):
        batch = dict(tok(docs[first:first + pt.GROUP_BATCH]))
        want += prepare_data.group_texts(batch, 64)["input_ids"]
    assert want[0][0] == tok.bos_token_id and len(want) > 20
    assert got == want
