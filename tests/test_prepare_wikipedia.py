"""BERT's prepare stage without --from (payload/common/prepare_tokenized.py): bertPrep.py's
Wikipedia text, made here from a hand-written MediaWiki export (bz2) given by a file:// URL,
through the real WikiExtractor and NLTK's punkt (a small model written here: the real one is a
download), then the shards, judged by the data check and the trainer's own shard check."""
from __future__ import annotations

import argparse
import bz2
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
PATH = ("hdf5_lower_case_1_seq_len_128_max_pred_20_masked_lm_prob_0.15_random_seed_12345_"
        "dupe_factor_5/wikicorpus_en")

SITEINFO = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" \
xml:lang="en">
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <base>https://en.wikipedia.org/wiki/Main_Page</base>
    <namespaces>
      <namespace key="0" case="first-letter" />
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="828" case="first-letter">Module</namespace>
    </namespaces>
  </siteinfo>
"""
# Wikitext with what WikiExtractor removes (bold, links, a template, a heading's markup) and
# sentences the regular-expression splitter would cut wrongly ("Dr.", "e.g.").
PAGES = {
    "Anarchism": ("'''Anarchism''' is a political philosophy. It is skeptical of authority, "
                  "e.g. the state.\n\nSee also [[Liberty|freedom]]. Dr. Smith wrote on it in "
                  "1890.\n\n== History ==\nEarly forms existed. Later forms grew!"),
    "Autism": ("'''Autism''' is a condition. {{cite web|url=https://example.org}} It affects "
               "people.\n\nIs more known? Yes, more is known."),
    "Empty": "{{stub}}",
}
SENTENCES = [
    ["Anarchism is a political philosophy.", "It is skeptical of authority, e.g. the state.",
     "See also freedom.", "Dr. Smith wrote on it in 1890.", "History.", "Early forms existed.",
     "Later forms grew!"],
    ["Autism is a condition.", "It affects people.", "Is more known?", "Yes, more is known."],
]


def escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def dump(path: Path, pages: dict[str, str]) -> Path:
    body = "".join(
        f"  <page>\n    <title>{title}</title>\n    <ns>0</ns>\n    <id>{n}</id>\n"
        f"    <revision>\n      <id>{100 + n}</id>\n      <text bytes=\"{len(text)}\" "
        f"xml:space=\"preserve\">{escaped(text)}</text>\n    </revision>\n  </page>\n"
        for n, (title, text) in enumerate(pages.items(), 1))
    path.write_bytes(bz2.compress(f"{SITEINFO}{body}</mediawiki>\n".encode()))
    return path


def punkt_model(root: Path) -> Path:
    """A punkt_tab model in NLTK's tab format: "dr" and "e.g" are abbreviations."""
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True)
    (english / "abbrev_types.txt").write_text("dr\ne.g\n")
    for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (english / name).write_text("")
    return root


def need(*names: str) -> None:
    for name in names or ("wikiextractor", "nltk", "h5py", "tokenizers", "transformers"):
        pytest.importorskip(name)


def run(tmp: Path, *words: str, nltk_data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROGRAM), "--format", "bert_hdf5", "--data-dir",
                           str(tmp / "data"), "--path", PATH, "--seq-length", "128",
                           "--max-predictions", "20", *words], capture_output=True, text=True,
                          timeout=300, check=False, cwd=tmp,
                          env={**os.environ, "HF_HUB_OFFLINE": "1",
                               "NLTK_DATA": str(nltk_data)})


def wordpiece(tmp: Path, docs: list[str]) -> Path:
    import tokenizers
    trained = tokenizers.BertWordPieceTokenizer(lowercase=True)
    trained.train_from_iterator(docs, vocab_size=200, min_frequency=1, show_progress=False,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    (tmp / "tok").mkdir()
    trained.save_model(str(tmp / "tok"))
    return tmp / "tok"


def program() -> Any:
    sys.path.insert(0, str(ROOT / "payload" / "common"))
    import prepare_tokenized
    return prepare_tokenized


def test_the_bert_job_without_from_fetches_bertpreps_wikipedia_and_says_so() -> None:
    proc = subprocess.run([str(JOBGEN_EXE), "render", "bert-large", "--stage", "prepare"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--from" not in proc.stdout and "--wiki-dump" not in proc.stdout
    url = UPSTREAM["bert_hdf5"]["wikipedia"]["url"]
    assert url == program().WIKIPEDIA
    note = [line for line in proc.stderr.splitlines() if "no --from" in line]
    assert len(note) == 1 and url in note[0] and "22 GB" in note[0]
    assert "WikiExtractor" in note[0] and "punkt_tab" in note[0]


def test_from_a_mediawiki_dump_renders_wiki_dump_quoted_once() -> None:
    """`--from DUMP.xml.bz2` on a BERT recipe: prepare_tokenized.py's --wiki-dump, the path one
    shell word however it is spelt; with another input, or on another recipe, one line."""
    dump = "/fsx/my dumps/it's $(touch x) enwiki.xml.bz2"
    proc = subprocess.run([str(JOBGEN_EXE), "render", "bert-large", "--stage", "prepare",
                           "--from", dump], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    block = proc.stdout.split("ARGS=(\n", 1)[1].split("\n)\n", 1)[0]
    words = subprocess.run(["bash", "-c", f'ARGS=(\n{block}\n)\nprintf "%s\\0" "${{ARGS[@]}}"'],
                           capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    assert words[-2:] == ["--wiki-dump", dump] and "--from" not in words
    assert "is a MediaWiki dump" in proc.stderr and "no --from" not in proc.stderr
    for recipe, extra in (("bert-large", ["--from", "s3://b/more.txt"]), ("llama2-7b", [])):
        proc = subprocess.run([str(JOBGEN_EXE), "render", recipe, "--stage", "prepare",
                               "--from", "/fsx/enwiki.xml", *extra], capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 2
        assert proc.stderr.strip().endswith("a MediaWiki dump (.xml, .xml.bz2) is read only by "
                                            "the BERT recipes' prepare stage, as its one --from")


def test_wikipedia_articles_are_an_article_a_line_split_by_punkt(tmp_path: Path) -> None:
    need("wikiextractor", "nltk")
    prepare_tokenized = program()
    import nltk
    nltk.data.path.insert(0, str(punkt_model(tmp_path / "nltk")))
    source = dump(tmp_path / "enwiki.xml.bz2", PAGES)
    args = argparse.Namespace(data_dir=tmp_path / "data", wiki_dump=source.as_uri(), workers=1)
    (tmp_path / "work").mkdir()
    try:
        assert prepare_tokenized.wikipedia(args, tmp_path / "work") == SENTENCES
    finally:
        nltk.data.path.remove(str(tmp_path / "nltk"))


@pytest.mark.slow
def test_bert_shards_from_a_wikipedia_dump_pass_the_data_and_shard_checks(
        tmp_path: Path) -> None:
    need()
    import h5py
    source = dump(tmp_path / "enwiki-latest-pages-articles.xml.bz2", PAGES)
    tok = wordpiece(tmp_path, [" ".join(s) for s in SENTENCES])
    done = run(tmp_path, "--tokenizer", str(tok), "--shards", "2", "--workers", "2",
               "--wiki-dump", source.as_uri(), nltk_data=punkt_model(tmp_path / "nltk"))
    assert done.returncode == 0, done.stderr
    assert "prepare: no --from: Model-References' bertPrep.py text" in done.stdout
    assert "prepare: WikiExtractor: " in done.stdout
    assert "prepare: 2 articles, 11 sentences" in done.stdout
    final = tmp_path / "data" / PATH
    assert sorted(p.name for p in final.parent.iterdir()) == ["wikicorpus_en"]  # no leftovers
    assert sorted(p.name for p in final.iterdir()) == [
        "vocab.txt", "wikicorpus_en_training_0.hdf5", "wikicorpus_en_training_1.hdf5"]
    checked = subprocess.run(
        [sys.executable, str(CHECK), "node"], capture_output=True, text=True, timeout=120,
        check=False, env={**os.environ, "JOBGEN_DATA": json.dumps([{
            "format": "bert_hdf5", "path": str(final), "seq_length": 128,
            "max_predictions": 20, "global_batch": 2}])})
    assert checked.returncode == 0, checked.stderr
    sys.path.insert(0, str(ROOT / "payload"))
    from habana_deepspeed import bert_data
    counts = [bert_data.check_shard(f, 128, 20) for f in bert_data.find_training_files(final)]
    assert all(counts) and done.stdout.splitlines()[-1].startswith(
        f"prepare: wrote {final}: 2 training shards (wikicorpus_en_training_*.hdf5), "
        f"{sum(counts):,} samples of 128 tokens")
    with h5py.File(final / "wikicorpus_en_training_0.hdf5") as shard:
        assert shard["input_ids"].shape[1] == 128


@pytest.mark.slow
def test_a_bad_dump_is_one_line_78_and_nothing_written(tmp_path: Path) -> None:
    need()
    tok = wordpiece(tmp_path, [" ".join(s) for s in SENTENCES])
    nltk_data = punkt_model(tmp_path / "nltk")
    (tmp_path / "notes.xml").write_text("<notes>not a dump</notes>\n")
    big = dump(tmp_path / "big.xml.bz2", {f"Page {n}": os.urandom(3000).hex() for n in range(400)})
    (tmp_path / "cut.xml.bz2").write_bytes(big.read_bytes()[:big.stat().st_size * 3 // 4])
    for source, said in (("notes.xml", "not a MediaWiki XML export"),
                         ("absent.xml.bz2", "missing or not a regular file"),
                         ("cut.xml.bz2", "WikiExtractor failed (exit 1: EOFError")):
        done = run(tmp_path, "--tokenizer", str(tok), "--wiki-dump", str(tmp_path / source),
                   nltk_data=nltk_data)
        assert done.returncode == 78, (source, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: prepare: --wiki-dump "), lines
        assert said in lines[0], lines
        assert [p.name for p in (tmp_path / "data" / PATH).parent.iterdir()] == []


def test_no_punkt_model_and_no_downloader_is_one_line(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nltk")
    import nltk
    prepare_tokenized = program()

    def offline(*args: object, **kwargs: object) -> bool:
        print("[nltk_data] Error loading punkt_tab")
        raise ValueError("Error loading punkt_tab: <urlopen error no network>")
    monkeypatch.setattr(nltk.data, "path", [])
    monkeypatch.setattr(nltk, "download", offline)
    with pytest.raises(prepare_tokenized.Refused) as refused:
        prepare_tokenized.punkt(tmp_path / "data")
    said = str(refused.value)
    assert said.startswith("NLTK's punkt_tab model: not in NLTK_DATA or ")
    assert "python -m nltk.downloader -d" in said and "\n" not in said
