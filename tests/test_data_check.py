"""The data check (payload/common/data_check.py, jobgen/payloads/data.py): datasets made in a temp
folder by independent writers (megatron-core's IndexedDatasetBuilder for Megatron's .bin/.idx,
datasets' save_to_disk, h5py), then judged by headers as the nodes and `jobgen check --data` do,
the program run as the node flow runs it (the job's interpreter, JOBGEN_DATA in its env)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "payload" / "common" / "data_check.py"


def check(wants: Any, mode: str = "node", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROGRAM), mode], text=True, capture_output=True,
                          env={**os.environ, "JOBGEN_DATA": json.dumps(wants), **env},
                          cwd="/", timeout=120, check=False)


def megatron(prefix: Path, documents: list[int], dtype: str = "uint16") -> None:
    numpy = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    builder = indexed.IndexedDatasetBuilder(f"{prefix}.bin", dtype=getattr(numpy, dtype))
    for n in documents:
        builder.add_document(torch.arange(n) % 50000, [n])
    builder.finalize(f"{prefix}.idx")


def vocab(path: Path, size: int) -> str:
    path.write_text(json.dumps({f"t{i}": i for i in range(size)}), encoding="utf-8")
    return str(path)


def megatron_want(tmp: Path, **changes: Any) -> dict[str, Any]:
    want = {"format": "megatron", "recipe": "recipes/neox20b.yaml", "key": "data.path",
            "prefixes": [str(tmp / "corpus_text_document")], "seq_length": 16,
            "vocab_file": vocab(tmp / "vocab.json", 500), "global_batch": 4,
            "planned_samples": 40, "train_share": 1.0}
    return {**want, **changes}


def test_megatron_dataset_written_by_megatron_core_passes(tmp_path: Path) -> None:
    megatron(tmp_path / "corpus_text_document", [100, 200, 300])
    done = check(megatron_want(tmp_path))
    assert done.returncode == 0, done.stderr
    # 600 tokens of uint16, (600 - 1) // 16 = 37 samples, 40 planned: 1.08 epochs.
    assert done.stdout.strip() == ("data: recipes/neox20b.yaml: data.path: 1 shard(s) of uint16, "
                                   "37 samples, 600 tokens, 1.08 epochs planned")


@pytest.mark.parametrize("damage, said", [
    (lambda p: p.with_suffix(".idx").write_bytes(p.with_suffix(".idx").read_bytes()[:-8]),
     r"corpus_text_document.idx: \d+ bytes where its header says \d+ \(truncated or corrupt\)"),
    (lambda p: p.with_suffix(".bin").write_bytes(p.with_suffix(".bin").read_bytes()[:-2]),
     r"corpus_text_document.bin: 1198 bytes where corpus_text_document.idx says 1200 "
     r"\(truncated, or not its pair\)"),
    (lambda p: p.with_suffix(".idx").write_bytes(b"TNTIDX\x00\x00" + b"\x00" * 40),
     r"corpus_text_document.idx: Megatron's old cached index, not mmap \(made without "
     r"--dataset-impl mmap\)"),
    (lambda p: p.with_suffix(".idx").write_bytes(b"\x00" * 64),
     r"corpus_text_document.idx: not a Megatron mmap index"),
    (lambda p: p.with_suffix(".bin").unlink(), r"corpus_text_document.bin: missing"),
    (lambda p: p.with_suffix(".idx").unlink(), r"corpus_text_document.idx: missing"),
])
def test_broken_megatron_files_are_one_line_each_and_78_on_a_node(tmp_path: Path, damage: Any,
                                                                 said: str) -> None:
    import re
    prefix = tmp_path / "corpus_text_document"
    megatron(prefix, [100, 200, 300])
    damage(Path(f"{prefix}.x"))
    done = check(megatron_want(tmp_path))
    assert done.returncode == 78
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert re.fullmatch(r"error: data: recipes/neox20b.yaml: data.path: \S*" + said, lines[0])
    assert check(megatron_want(tmp_path), mode="cli").returncode == 2


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    prefix = tmp_path / "corpus_text_document"
    megatron(prefix, [10, 20])
    Path(f"{prefix}.idx").unlink()
    os.mkfifo(f"{prefix}.idx")
    done = check(megatron_want(tmp_path))
    assert done.returncode == 78
    assert done.stderr.strip().endswith("corpus_text_document.idx: not a regular file")


def test_a_vocabulary_larger_than_the_token_dtype_is_found(tmp_path: Path) -> None:
    megatron(tmp_path / "corpus_text_document", [100, 200])
    done = check(megatron_want(tmp_path, vocab_file=vocab(tmp_path / "big.json", 70000)))
    assert done.returncode == 78
    assert "tokens are uint16, which cannot hold a vocabulary of 70000" in done.stderr


def test_a_tokenizer_or_token_ids_past_the_models_vocabulary_are_refused(tmp_path: Path) -> None:
    """GPT-2's vocab.json against model.vocab_size as NeMo pads it, and the ids of the first and
    last MiB of each .bin (an id only in the last MiB is found too)."""
    torch = pytest.importorskip("torch")
    numpy = pytest.importorskip("numpy")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    megatron(tmp_path / "corpus_text_document", [100, 200, 300])       # ids 0..299
    done = check(megatron_want(tmp_path, vocab_size=480, vocab_padded=496))
    assert done.returncode == 78
    assert done.stderr.strip() == (
        f"error: data: recipes/neox20b.yaml: data.vocab_file, model.vocab_size: "
        f"{tmp_path}/vocab.json: 500 tokens, more than model.vocab_size 480 (the trainer pads "
        "it to 496) holds")
    assert check(megatron_want(tmp_path, vocab_size=480, vocab_padded=512)).returncode == 0
    done = check(megatron_want(tmp_path, vocab_file="", vocab_size=256))
    assert done.returncode == 78
    assert done.stderr.strip().endswith(
        "data.path: " f"{tmp_path}/corpus_text_document.bin: token id 299 in its first or last "
        "MiB, not below model.vocab_size 256")
    assert check(megatron_want(tmp_path, vocab_file="", vocab_size=256,
                               vocab_padded=320)).returncode == 0
    builder = indexed.IndexedDatasetBuilder(f"{tmp_path}/long.bin", dtype=numpy.uint16)
    builder.add_document(torch.zeros(1_500_000, dtype=torch.int64), [1_500_000])   # 3 MB
    builder.add_document(torch.tensor([4000]), [1])
    builder.finalize(f"{tmp_path}/long.idx")
    done = check(megatron_want(tmp_path, prefixes=[f"{tmp_path}/long"], vocab_size=1000))
    assert done.returncode == 78 and "long.bin: token id 4,000 in its first or last MiB" in \
        done.stderr


def test_a_dataset_smaller_than_one_global_batch_is_refused(tmp_path: Path) -> None:
    megatron(tmp_path / "corpus_text_document", [40])
    done = check(megatron_want(tmp_path, global_batch=8))
    assert done.returncode == 78
    assert "2 samples, fewer than one global batch of 8" in done.stderr


def test_an_empty_shard_list_is_refused(tmp_path: Path) -> None:
    done = check(megatron_want(tmp_path, prefixes=[]))
    assert done.returncode == 78
    assert done.stderr.strip() == ("error: data: recipes/neox20b.yaml: data.path: names no "
                                   "dataset prefix")


def test_a_thousand_shards_are_judged_in_seconds(tmp_path: Path) -> None:
    """Headers only: 1,000 shards written once, each with its own .bin/.idx."""
    numpy = pytest.importorskip("numpy")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    torch = pytest.importorskip("torch")
    first = tmp_path / "s0000"
    builder = indexed.IndexedDatasetBuilder(f"{first}.bin", dtype=numpy.uint16)
    builder.add_document(torch.arange(4096), [4096])
    builder.finalize(f"{first}.idx")
    prefixes = [str(first)]
    for i in range(1, 1000):
        shard = tmp_path / f"s{i:04d}"
        os.link(f"{first}.bin", f"{shard}.bin")
        os.link(f"{first}.idx", f"{shard}.idx")
        prefixes.append(str(shard))
    started = time.monotonic()
    # Its ids run to 4,095: a tokenizer of 4,096 tokens (the check samples the ids too).
    done = check(megatron_want(tmp_path, prefixes=prefixes, planned_samples=0,
                               vocab_file=vocab(tmp_path / "vocab4k.json", 4096)))
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "1000 shard(s) of uint16, 255,000 samples, 4,096,000 tokens" in done.stdout
    print(f"1,000 shards checked in {took:.2f} s")


def test_hugging_face_blocks(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"input_ids": [[1] * 32] * 10, "attention_mask": [[1] * 32] * 10,
            "labels": [[1] * 32] * 10}
    ids = datasets.Sequence(datasets.Value("int32"))   # as get_dataset.py's blocks
    features = datasets.Features({"input_ids": ids, "attention_mask": ids, "labels": ids})
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "blocks"))
    want = {"format": "hf_blocks", "recipe": "recipes/llama2-7b.yaml", "key": "data.path",
            "path": str(tmp_path / "blocks"), "seq_length": 32, "vocab_size": 32000,
            "global_batch": 4, "planned_samples": 20,
            "columns": ["input_ids", "attention_mask", "labels"]}
    done = check(want)
    assert done.returncode == 0, done.stderr
    assert "1 shard(s) of int32, 10 samples, 320 tokens, 2 epochs planned" in done.stdout
    done = check({**want, "seq_length": 4096})
    assert done.returncode == 78
    assert "blocks of 32 tokens, not the recipe's model.seq_length 4096" in done.stderr
    datasets.Dataset.from_dict({"input_ids": rows["input_ids"]}).save_to_disk(
        str(tmp_path / "bare"))
    done = check({**want, "path": str(tmp_path / "bare")})
    assert done.returncode == 78
    assert "no attention_mask, labels column" in done.stderr


def test_blocks_whose_tokenizer_or_ids_pass_the_models_vocabulary_are_refused(
        tmp_path: Path) -> None:
    """The tokenizer the prepare stage saves with the blocks (tokenizer.json), and the ids of
    the first and last block, against model.vocab_size."""
    datasets = pytest.importorskip("datasets")
    tokenizers = pytest.importorskip("tokenizers")
    rows = {"input_ids": [list(range(32))] * 9 + [[150] + [1] * 31]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "blocks"))
    want = {"format": "hf_blocks", "recipe": "recipes/llama2-7b.yaml", "key": "data.path",
            "path": str(tmp_path / "blocks"), "seq_length": 32, "vocab_size": 200,
            "global_batch": 4, "columns": ["input_ids"]}
    assert check(want).returncode == 0
    done = check({**want, "vocab_size": 100})
    assert done.returncode == 78
    assert done.stderr.strip().endswith(f"{tmp_path}/blocks: token id 150 in its first or last "
                                        "block, not below model.vocab_size 100")
    words = tokenizers.models.WordLevel({f"w{i}": i for i in range(240)}, unk_token="w0")
    tokenizers.Tokenizer(words).save(str(tmp_path / "blocks" / "tokenizer.json"))
    done = check(want)
    assert done.returncode == 78
    assert done.stderr.strip() == (
        "error: data: recipes/llama2-7b.yaml: data.tokenizer, model.vocab_size: "
        f"{tmp_path}/blocks/tokenizer.json: 240 tokens, more than model.vocab_size 200 holds")


def test_bert_shards_checked_by_the_trainers_own_reader(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    numpy = pytest.importorskip("numpy")
    folder = tmp_path / "wikicorpus_en"
    folder.mkdir()
    shapes = {"input_ids": (6, 128), "input_mask": (6, 128), "segment_ids": (6, 128),
              "masked_lm_positions": (6, 20), "masked_lm_ids": (6, 20),
              "next_sentence_labels": (6,)}
    for name, keys in (("wikicorpus_en_training_0.hdf5", shapes),
                       ("wikicorpus_en_training_1.hdf5", shapes)):
        with h5py.File(folder / name, "w") as shard:
            for key, shape in keys.items():
                shard[key] = numpy.zeros(shape, dtype=numpy.int32)
    want = {"format": "bert_hdf5", "recipe": "recipes/bert1.5b.yaml", "key": "data.path",
            "path": str(folder), "seq_length": 128, "max_predictions": 20, "vocab_size": 30528,
            "global_batch": 8, "planned_samples": 24}
    done = check(want)
    assert done.returncode == 0, done.stderr
    assert "2 shard(s) of hdf5, 12 samples, 2 epochs planned" in done.stdout
    (folder / "vocab.txt").write_text("".join(f"w{i}\n" for i in range(30600)))
    done = check(want)
    assert done.returncode == 78
    assert done.stderr.strip().endswith(
        "bert1.5b.yaml: data.tokenizer, model.vocab_size: " f"{folder}/vocab.txt: 30,600 tokens, "
        "more than model.vocab_size 30,528 holds")
    (folder / "vocab.txt").write_text("".join(f"w{i}\n" for i in range(30522)))
    assert check(want).returncode == 0
    with h5py.File(folder / "wikicorpus_en_training_0.hdf5", "a") as shard:
        shard["input_ids"][5, 3] = 40000
    done = check(want)
    assert done.returncode == 78
    assert done.stderr.strip().endswith("wikicorpus_en_training_0.hdf5: token id 40,000 in its "
                                        "first or last 64 samples, not below model.vocab_size "
                                        "30,528")
    with h5py.File(folder / "wikicorpus_en_training_0.hdf5", "a") as shard:
        shard["input_ids"][5, 3] = 0
    with h5py.File(folder / "wikicorpus_en_training_1.hdf5", "a") as shard:
        del shard["masked_lm_ids"]
    done = check(want)
    assert done.returncode == 78
    assert done.stderr.strip().endswith("wikicorpus_en_training_1.hdf5: missing datasets "
                                        "masked_lm_ids")


def test_jobgen_check_data_names_the_recipe_and_exits_2(tmp_path: Path) -> None:
    """The default site's data folder is relative: jobgen-data under the working folder."""
    jobgen = [str(Path(sys.executable).with_name("jobgen")), "check", "--data", "neox20b"]
    done = subprocess.run(jobgen, text=True, capture_output=True, cwd=tmp_path, timeout=120,
                          check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: data: recipes/neox20b.yaml: data.path: jobgen-data/gpt2/gpt2-vocab.json: "
        "missing"]
    data = tmp_path / "jobgen-data" / "gpt2"
    data.mkdir(parents=True)
    vocab(data / "gpt2-vocab.json", 50257)
    megatron(data / "my-gpt2_text_document", [5000] * 4)
    done = subprocess.run(jobgen, text=True, capture_output=True, cwd=tmp_path, timeout=120,
                          check=False)
    assert done.returncode == 2     # 20,000 tokens are fewer samples than one global batch
    assert done.stderr.strip() == ("error: data: recipes/neox20b.yaml: data.path: 9 samples, "
                                   "fewer than one global batch of 256")
