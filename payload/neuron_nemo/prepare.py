"""The prepare stage for the NeMo recipes: one Megatron indexed dataset (.bin/.idx, mmap, GPT-2
BPE) at the recipe's exact data.path, made by NeMo's own preprocessing script from the site's
checkout (jobgen/payloads/upstream/neuron_nemo_prepare.json has its path and flags at the pinned
commit), or, without --from, the public sample the recipe's source tutorial downloads.

Everything is written under a temporary folder beside the output and renamed into place when
complete (.bin first, .idx last): a killed job leaves nothing that looks whole. Exit 78 for what
no retry can cure (an input that is not text or JSONL, a missing script), else the failing
tool's status.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

CONFIG_ERROR = 78
# Where the tutorial gets its files (aws-neuron-parallelcluster-samples, neuronx-nemo-megatron-
# gpt-job.md, "Download GPT dataset").
TOKENIZER_URL = "https://s3.amazonaws.com/models.huggingface.co/bert/"
SAMPLE_S3 = "s3://neuron-s3/training_datasets/gpt/wikipedia/my-gpt2_text_document"


class Refused(Exception):
    """A permanent problem, phrased as the line the user reads."""


def say(line: str) -> None:
    print(f"prepare: {line}", flush=True)


def fetch(source: str, target: Path) -> None:
    """A local file, an s3:// object (the AWS CLI on the node) or an https URL, copied whole."""
    if source.startswith("s3://"):
        argv = ["aws", "s3", "cp", "--only-show-errors", source, str(target)]
        if source.startswith(SAMPLE_S3):
            argv.append("--no-sign-request")
        if shutil.which("aws") is None:
            raise Refused(f"{source}: no aws command on this node to read it")
        if subprocess.run(argv, check=False).returncode != 0:
            raise Refused(f"{source}: cannot be read (aws s3 cp failed)")
    elif source.startswith("https://"):
        try:
            with urllib.request.urlopen(source, timeout=120) as answer, target.open("wb") as out:
                shutil.copyfileobj(answer, out)
        except OSError as exc:
            raise Refused(f"{source}: cannot be read ({exc})") from None
    else:
        try:
            shutil.copyfile(source, target)
        except OSError as exc:
            raise Refused(f"{source}: cannot be read ({exc.strerror})") from None


def text_kind(path: Path, shown: str) -> str:
    """"jsonl" (objects with a "text" string) or "text" (a document per line), else refused."""
    with path.open("rb") as fh:
        head = fh.read(1 << 16)
    if b"\x00" in head:
        raise Refused(f"{shown}: not text or JSONL (binary data)")
    try:
        first = head.decode("utf-8", errors="strict" if len(head) < 1 << 16 else "ignore")
    except UnicodeDecodeError:
        raise Refused(f"{shown}: not text or JSONL (not UTF-8)") from None
    line = next((x for x in first.splitlines() if x.strip()), "")
    if not line:
        raise Refused(f"{shown}: empty")
    if not line.lstrip().startswith("{"):
        return "text"
    try:
        record = json.loads(line)
    except ValueError:
        raise Refused(f"{shown}: its first line is not a JSON object") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise Refused(f"{shown}: JSONL without a \"text\" string on its first line")
    return "jsonl"


def publish(files: list[tuple[Path, Path]]) -> None:
    """Each (temporary, final) renamed in order: the index last, so it appears only once whole."""
    for temporary, final in files:
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temporary, final)
        say(f"wrote {final}")


def prepare(args: argparse.Namespace) -> int:
    data = Path(args.data_dir)
    output = data / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".jobgen-prepare-{output.name}-",
                                     dir=output.parent) as tmp_name:
        tmp = Path(tmp_name)
        for name in (args.vocab_file, args.merge_file):
            if not (data / name).is_file():
                say(f"{data / name}: absent; fetching GPT-2's from {TOKENIZER_URL}")
                fetch(TOKENIZER_URL + Path(name).name, tmp / "tokenizer")   # gpt2-vocab.json
                publish([(tmp / "tokenizer", data / name)])
        if not args.from_:
            say(f"no --from: fetching the public sample the recipe's source used "
                f"({SAMPLE_S3}.bin/.idx) into {output}")
            for ext in (".bin", ".idx"):
                fetch(SAMPLE_S3 + ext, tmp / f"sample{ext}")
            publish([(tmp / "sample.bin", Path(f"{output}.bin")),
                     (tmp / "sample.idx", Path(f"{output}.idx"))])
            return 0
        script = Path(args.nemo_script)
        if not script.is_file():
            raise Refused(f"{script}: NeMo's preprocessing script is not there (site "
                          "paths.nemo_dir names the checkout)")
        source = tmp / "input"
        say(f"reading {args.from_}")
        fetch(args.from_, source)
        kind = text_kind(source, args.from_)
        argv = [sys.executable, str(script), "--input", str(source), "--json-keys", "text",
                "--tokenizer-library", "megatron", "--tokenizer-type", "GPT2BPETokenizer",
                "--vocab-file", str(data / args.vocab_file),
                "--merge-file", str(data / args.merge_file), "--dataset-impl", "mmap",
                "--append-eod", "--workers", str(args.workers),
                "--output-prefix", str(tmp / "out"), *(["--text_file"] if kind == "text" else [])]
        say(f"tokenizing {args.from_} ({kind}) with {script.name}, {args.workers} workers")
        status = subprocess.run(argv, check=False).returncode
        if status != 0:
            say(f"{script.name} failed with status {status}; nothing was written")
            return status
        publish([(tmp / "out_text_document.bin", Path(f"{output}.bin")),
                 (tmp / "out_text_document.idx", Path(f"{output}.idx"))])
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="prepare.py")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--output", required=True, help="the prefix, under --data-dir")
    parser.add_argument("--vocab-file", required=True)
    parser.add_argument("--merge-file", required=True)
    parser.add_argument("--nemo-script", required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--from", dest="from_", default="")
    args = parser.parse_args(argv)
    try:
        return prepare(args)
    except Refused as exc:
        print(f"error: prepare: {exc}", file=sys.stderr)
        return CONFIG_ERROR


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
