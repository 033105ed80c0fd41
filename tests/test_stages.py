"""The stages around training (jobgen/payloads/stages.py): the prepare stage's Slurm job, its
chain before training, and its node program (payload/neuron_nemo/prepare.py) run as the job
runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import BIN_DIR, JOBGEN_EXE

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = json.loads((ROOT / "jobgen/payloads/upstream/neuron_nemo_prepare.json").read_text())


def jobgen(*words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN_EXE), *words], capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_prepare_job_runs_nemos_script_on_one_node_and_passes_shellcheck(
        tmp_path: Path) -> None:
    proc = jobgen("render", "neox20b", "--site", "trn1-pcluster", "--stage", "prepare",
                  "--from", "s3://bucket/a b.jsonl", "--from", "/data/c.txt",
                  "--set", "data.shards=2")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "#SBATCH --nodes=1\n" in text and "#SBATCH --array=0-1\n" in text
    script = "/home/ubuntu/neuronx-nemo-megatron/" + UPSTREAM["script"]
    assert f"  {script}\n" in text
    assert "  gpt2/my-gpt2_text_document_part0\n" in text
    assert "  gpt2/my-gpt2_text_document_part1\n" in text
    assert "  's3://bucket/a b.jsonl'\n" in text   # through the one quoting point
    (tmp_path / "prepare.sbatch").write_text(text)
    lint = subprocess.run([str(BIN_DIR / "shellcheck"), str(tmp_path / "prepare.sbatch")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert lint.returncode == 0, lint.stdout
    # Training blends the same shards by NeMo's weighted list.
    train = jobgen("render", "neox20b", "--site", "trn1-pcluster", "--set", "data.shards=2")
    assert train.returncode == 0, train.stderr
    assert "model.data.data_prefix=[1.0,/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_" \
           "document_part0,1.0,/home/ubuntu/examples_datasets/gpt2/my-gpt2_text_document_" \
           "part1]" in train.stdout.replace("'", "")


def test_without_from_the_job_fetches_the_public_sample_and_says_so() -> None:
    proc = jobgen("render", "neox20b", "--site", "trn1-pcluster", "--stage", "prepare")
    assert proc.returncode == 0, proc.stderr
    assert "--from" not in proc.stdout and "#SBATCH --array" not in proc.stdout
    assert ("prepare: no --from: the job fetches the public sample neox20b's source used"
            in proc.stderr)


def test_stages_chain_with_afterok_and_other_backends_say_they_cannot() -> None:
    proc = jobgen("submit", "neox20b", "--stages", "prepare,train", "--chain", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("sbatch --parsable") == 3
    assert proc.stdout.count('"--dependency=afterok:${job_') == 2
    assert proc.stdout.index("neox20b-prepare") < proc.stdout.index("neox20b-compile")
    refused = jobgen("submit", "neox20b", "--backend", "sagemaker", "--stages",
                     "prepare,train", "--dry-run")
    assert refused.returncode == 2
    assert refused.stderr == (
        "error: jobgen submit: --stages prepare,train: --backend sagemaker cannot run stages "
        "one after another (its jobs cannot wait for each other): submit each on its own, "
        "--stages export once training has completed (see 'jobgen submit --help')\n")
    wrong = jobgen("submit", "neox20b", "--stages", "train,prepare", "--dry-run")
    assert wrong.returncode == 2
    assert "stages in pipeline order, each once (prepare,train,export" in wrong.stderr


def test_a_from_that_is_not_text_is_refused_with_78_and_nothing_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "gpt2").mkdir(parents=True)
    for name in ("gpt2-vocab.json", "gpt2-merges.txt"):
        (data / "gpt2" / name).write_text("{}")
    (tmp_path / "raw.bin").write_bytes(b"\x00\x01\x02binary")
    script = tmp_path / "preprocess_data_for_megatron.py"
    script.write_text("raise SystemExit('not reached')\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "payload/neuron_nemo/prepare.py"), "--data-dir", str(data),
         "--output", "gpt2/my-gpt2_text_document", "--vocab-file", "gpt2/gpt2-vocab.json",
         "--merge-file", "gpt2/gpt2-merges.txt", "--nemo-script", str(script),
         "--from", str(tmp_path / "raw.bin")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 78
    assert proc.stderr == f"error: prepare: {tmp_path / 'raw.bin'}: not text or JSONL " \
                          "(binary data)\n"
    assert sorted(p.name for p in (data / "gpt2").iterdir()) == ["gpt2-merges.txt",
                                                                  "gpt2-vocab.json"]


def test_the_prepare_job_matches_its_golden(golden: Any) -> None:
    from jobgen import api
    from jobgen.backends.slurm import backend
    spec = api.job_spec("neox20b", site="trn1-pcluster", backend="slurm")
    golden(Path("stages/neox20b-prepare.sbatch"), backend.plan_stage(spec, "prepare").text)


def test_a_rehearsals_jobs_after_its_prepare_job_read_the_dataset_it_makes(
        tmp_path: Path) -> None:
    """`submit --smoke --stages prepare,train,export` from a folder with no dataset yet (as
    always: the prepare job makes it): the training job checks and trains on that dataset and
    the export saves its GPT-2 BPE files, on Slurm and Batch alike. They were rendered as if
    nothing would be prepared (made-up batches, a tokenizer from the seed), which the
    real-Slurm chain (tests/test_slurm_stages.py) showed. Without prepare, made-up data."""
    def dry_run(*words: str) -> str:
        proc = subprocess.run([str(JOBGEN_EXE), "submit", "neox20b", "--smoke", "--nodes", "1",
                               *words, "--dry-run"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    chained = dry_run("--stages", "prepare,train,export").split("\njob_")
    assert [part.split("=", 1)[0] for part in chained[1:]] == ["1", "2", "3"]
    _, prepare, train, export = chained
    assert "smoke/prepare_data.py" in prepare
    assert "export JOBGEN_DATA='{\"format\":\"megatron\"" in train
    assert train.count("  --data-format\n  megatron\n") == 2          # both passes
    assert "  --data-format\n  megatron\n" in export
    assert "  --tokenizer-files\n  jobgen-data/gpt2/gpt2-vocab.json\n" in export
    alone = dry_run("--stages", "train,export")
    assert "JOBGEN_DATA" not in alone and "--data-format" not in alone
    assert "  --tokenizer-seed\n" in alone
    assert not (tmp_path / "jobgen-data").exists()                   # a dry run makes nothing
    calls = json.loads(dry_run("--backend", "batch", "--stages", "prepare,train"))["calls"]
    (train_def,) = [c["request"] for c in calls if c["operation"] == "RegisterJobDefinition"
                    and "nodeProperties" in c["request"]]
    node = train_def["nodeProperties"]["nodeRangeProperties"][0]["container"]
    assert "--data-format" in json.dumps(node)
