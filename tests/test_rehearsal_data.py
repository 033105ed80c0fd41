"""The data journey rehearsed on this machine (issue 50, item 4): `jobgen run R --smoke --stage
prepare` makes the rehearsal's dataset at the recipe's paths (payload/smoke/prepare_data.py from
the run's payload snapshot, the nodes' interpreter, a job of the run), then `jobgen run R --smoke`
trains on it through the trainer's data path, after the node flow's data check. The console
script, a fresh working folder and the local site, as a user runs it
(jobgen/backends/local/stage.py)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_rehearsal import JOBGEN, _env

ROOT = Path(__file__).resolve().parent.parent


def jobgen(tmp: Path, *args: str, timeout: float = 300,
           **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(JOBGEN), *args], cwd=tmp, text=True, capture_output=True,
                          env=_env(tmp, **env), timeout=timeout, check=False)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _port() -> str:
    with socket.socket() as sock:      # rehearsals may run side by side: not the recipe's port
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _status(tmp: Path, job: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(ok(jobgen(tmp, "status", job, "--json")))
    return found


# --- fast: what the stage runs, and what it needs --------------------------------------------

def test_the_stage_runs_the_rehearsals_sizes_from_the_snapshot(tmp_path: Path) -> None:
    """--dry-run prints the one task: the snapshot's prepare_data.py at the recipe's names and
    the smoke spec's sizes, the ones the data check and the trainer then expect."""
    from jobgen.job.smoke_spec import SMOKE
    out = ok(jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "2", "--stage",
                    "prepare", "--dry-run"))
    (line,) = out.splitlines()
    words = line.split()
    assert re.fullmatch(r"jobgen-runs/\.jobgen/payload/[0-9a-f]{16}/smoke/prepare_data\.py",
                        words[1]), words[1]
    args = dict(zip(words[2::2], words[3::2]))
    assert args == {"--format": "megatron", "--data-dir": "jobgen-data",
                    "--path": "gpt2/my-gpt2_text_document",
                    "--vocab-file": "gpt2/gpt2-vocab.json", "--merge-file": "gpt2/gpt2-merges.txt",
                    "--seq-length": str(SMOKE["seq_length"]),
                    "--vocab-size": str(SMOKE["vocab_size"]), "--seed": "1234"}
    bert = ok(jobgen(tmp_path, "run", "bert1.5b", "--smoke", "--stage", "prepare", "--from",
                     "my.jsonl", "--dry-run"))
    assert f"--max-predictions {SMOKE['max_predictions']} --from my.jsonl" in bert
    assert not (tmp_path / "jobgen-runs").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize("args,said", [
    (["run", "neox20b", "--stage", "prepare"],
     "error: --stage prepare: on this machine it makes the rehearsal's dataset (add --smoke); "
     "the recipe's own is made on the cluster: jobgen submit neox20b --stages prepare,train"),
    (["run", "neox20b", "--smoke", "--from", "a.txt"],
     "--from is the prepare stage's input (--stage prepare)"),
    (["run", "neox20b", "--smoke", "--stage", "prepare", "--set", "data.shards=2"],
     "data.shards=2: a rehearsal's prepare stage makes one shard (--set data.shards=1)"),
    (["run", "neox20b", "--smoke", "--stage", "eval"],
     "error: jobgen-runs/neox20b-4n-smoke/export: no complete export to evaluate (export "
     "first: jobgen run neox20b --smoke --stage export)"),
    (["run", "neox20b", "--smoke", "--stage", "score"],
     "unknown stage 'score' (one of prepare, train, export, eval)"),
])
def test_a_stage_that_cannot_run_here_is_one_line(tmp_path: Path, args: list[str],
                                                  said: str) -> None:
    done = jobgen(tmp_path, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "jobgen-runs").exists() and not (tmp_path / "jobgen-data").exists()


def test_the_stages_libraries_are_named_with_the_extra_that_installs_them(
        tmp_path: Path) -> None:
    """A bare interpreter (the README's set-up without extras): one line, before anything
    starts, naming what prepare_data.py imports, where it needs it too (its `_need` calls; torch
    through payload/common's runtime), and one install of the extras that hold them (setup.cfg's
    data and payload)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    work = tmp_path / "work"
    work.mkdir()
    python = bare / "bin" / "python3"
    done = jobgen(work, "run", "neox20b", "--smoke", "--stage", "prepare",
                  JOBGEN_PYTHON=str(python), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert (f"the rehearsal's nodes run Python {python}, which lacks torch, datasets, h5py, "
            "megatron, numpy, tokenizers, transformers (what their programs import): install "
            f"with: {python} -m pip install torch --index-url "
            f"https://download.pytorch.org/whl/cpu && {python} -m pip install -e "
            f"'{ROOT}[data,payload]'") in line, line
    assert not list(work.iterdir()) and done.stdout == ""


def test_only_a_rehearsal_on_a_prepared_dataset_needs_the_data_libraries() -> None:
    """The smoke trainer's dataset readers are imported where a dataset was prepared: they
    count then (`lazily`), not for the README's rehearsal on made-up batches."""
    from jobgen.backends.local import needs
    payload = ROOT / "payload"
    train = payload / "smoke" / "train.py"
    roots = [payload, train.parent]
    assert not needs.imported([train], roots) & {"megatron", "datasets", "tokenizers"}
    lazily: dict[str, str] = {}
    assert {"megatron", "datasets"} <= needs.imported([train], roots, lazily)
    assert lazily == {"megatron": "megatron_core", "datasets": "datasets"}
    extras = needs.installers()
    assert {p: extras.get(p) for p in ("megatron_core", "datasets", "tokenizers")} == \
        dict.fromkeys(("megatron_core", "datasets", "tokenizers"), "data")


# --- slow: each payload family, prepared then trained on --------------------------------------

FAMILIES = [
    pytest.param("neox20b", "megatron", id="megatron"),
    pytest.param("llama2-7b", "hf_blocks", id="hf_blocks"),
    pytest.param("bert1.5b", "bert_hdf5", id="bert_hdf5",
                 marks=pytest.mark.deepspeed),
]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,fmt", FAMILIES)
def test_the_rehearsal_trains_on_the_dataset_its_prepare_stage_made(
        tmp_path: Path, recipe: str, fmt: str) -> None:
    started = time.monotonic()
    made = jobgen(tmp_path, "run", recipe, "--smoke", "--nodes", "2", "--stage", "prepare")
    out = ok(made)
    assert re.search(r"^jobgen: prepare stage, task 0 of 1 \(run "
                     rf"{re.escape(recipe)}-2n-smoke, job local-[0-9]+-[0-9]+\): "
                     r"smoke/prepare_data\.py$", made.stderr, re.M), made.stderr
    assert out.splitlines()[-1].endswith(f"next, train on it: jobgen run {recipe} --nodes 2 "
                                         "--smoke")
    (stage_job,) = re.findall(r"job (local-[0-9]+-[0-9]+)\)", made.stderr)
    # A job of the run: in the ledger as its prepare stage, and its status asked of its logs.
    found = _status(tmp_path, stage_job)
    assert (found["state"], found["run"]["stages"], found["run"]["nodes"]) == \
        ("COMPLETED", ["prepare"], 1)
    assert "prepare-data: " in ok(jobgen(tmp_path, "logs", stage_job))
    trained = jobgen(tmp_path, "run", recipe, "--smoke", "--nodes", "2", "--compile", "never",
                     "--set", f"job.master_port={_port()}")
    log = ok(trained)
    # The node flow's data check judged it at the rehearsal's sizes, then the trainer read it.
    assert re.search(rf"^\[node 0\] data: recipes/{re.escape(recipe)}\.yaml: data\.path: ",
                     log, re.M), log[-3000:]
    run_dir = tmp_path / "jobgen-runs" / f"{recipe}-2n-smoke"
    if fmt == "bert_hdf5":     # the BERT program read the prepared shards, made none itself
        assert not (run_dir / "smoke-data").exists()
        assert "2 shard(s)" in log
    else:
        starts = [json.loads(line.split("] ", 1)[1]) for line in log.splitlines()
                  if '"event": "start"' in line and line.startswith("[node 0] {")]
        assert starts and {s["data"] for s in starts} == {fmt}, starts
    assert _status(tmp_path, f"{recipe}-2n-smoke")["state"] == "COMPLETED"
    took = time.monotonic() - started
    print(f"{recipe}: prepared and trained in {took:.1f} s")


@pytest.mark.slow
def test_a_truncated_bin_stops_the_rehearsal_before_its_compile_pass(tmp_path: Path) -> None:
    ok(jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "2", "--stage", "prepare"))
    data = tmp_path / "jobgen-data" / "gpt2" / "my-gpt2_text_document.bin"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    started = time.monotonic()
    done = jobgen(tmp_path, "run", "neox20b", "--smoke", "--nodes", "2",
                  "--set", f"job.master_port={_port()}")
    assert done.returncode == 78, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^\[node 0\] .*recipes/neox20b\.yaml: data\.path: .*"
                     r"my-gpt2_text_document\.bin", done.stdout, re.M), done.stdout[-3000:]
    # The main node judged the shared data folder and ended with it (78: not retried); node 1
    # waited for its verdict (data.verdict) and ended alike, neither starting a pass.
    logs = tmp_path / "jobgen-runs" / "neox20b-2n-smoke" / "logs"
    ended = sorted(p.read_text() for p in logs.glob("*/node-0/job.status"))
    assert ended == ["0 prepare\n", "78 data\n"], ended     # the stage's job, then this one
    assert [p.read_text() for p in logs.glob("*/node-1/job.status")] == ["78 data\n"]
    assert not list(logs.glob("*/node-*/compile.log"))
    assert '"event": "step"' not in done.stdout
    assert (time.monotonic() - started) < 60
