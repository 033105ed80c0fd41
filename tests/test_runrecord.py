"""A run is what it trains, and a job runs the payload it was rendered with.

- the payload's digest covers every file and the executable bits, skips caches; a snapshot is
  written once, atomically, read-only, verified when reused, and refused when changed;
- `--set` of a training value gives the default run name a digest suffix; operational values
  (ports, restarts, checkpoint interval) do not;
- `jobgen submit` keeps the run's record (run folder and state folder); a submission into the
  run with other training values is refused, naming them, unless --amend;
- `jobgen runs RUN` prints the record; `jobgen resubmit RUN` submits byte for byte the same
  script again, and refuses where the recorded payload snapshot is gone.

sbatch is a stand-in here that keeps each script it is given (the real thing is in
test_slurm_e2e.py): what is tested is what jobgen hands to it and records.
"""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jobgen import api
from jobgen.images import catalog as images
from jobgen.images import snapshot
from jobgen.plumbing.errors import ConfigError
from jobgen.runs import runrecord

ROOT = Path(__file__).resolve().parents[1]
JOBGEN = Path(sys.executable).parent / "jobgen"

SBATCH = r"""#!/bin/sh
# sbatch stand-in: keeps the script from stdin, prints the next job id (--parsable).
dir=$(dirname "$0")
n=$(($(cat "$dir/count" 2>/dev/null || echo 4241) + 1))
echo "$n" >"$dir/count"
cat >"$dir/job-$n.sbatch"
echo "$n"
"""


# --- the payload snapshot -----------------------------------------------------------------------

def test_digest_covers_content_names_and_the_executable_bit(tmp_path: Path) -> None:
    payload = tmp_path / "p"
    (payload / "common").mkdir(parents=True)
    (payload / "common" / "a.sh").write_text("echo a\n")
    (payload / "b.py").write_text("print(1)\n")
    first = snapshot.digest(payload)
    assert len(first) == 64
    (payload / "common" / "__pycache__").mkdir()
    (payload / "common" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (payload / "c.pyc").write_bytes(b"\0")
    assert snapshot.digest(payload) == first           # caches are not the payload
    os.chmod(payload / "common" / "a.sh", 0o755)
    chmodded = snapshot.digest(payload)
    assert chmodded != first
    (payload / "b.py").write_text("print(2)\n")
    assert snapshot.digest(payload) not in (first, chmodded)
    (payload / "b.py").rename(payload / "d.py")
    renamed = snapshot.digest(payload)
    (payload / "d.py").rename(payload / "b.py")
    assert renamed != snapshot.digest(payload)


def test_place_writes_once_read_only_and_verifies(tmp_path: Path) -> None:
    full = snapshot.digest()
    root = tmp_path / "store"
    placed = snapshot.place(str(root), full)
    assert placed == root / full[:16]
    assert (placed / snapshot.MARKER).read_text() == full + "\n"
    assert snapshot.digest(placed) == full
    source = ROOT / "payload"
    for path in source.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            executable = path.stat().st_mode & stat.S_IXUSR
            copy = placed / path.relative_to(source)
            assert copy.stat().st_mode & 0o777 == (0o555 if executable else 0o444), copy
    assert [p.name for p in root.iterdir()] == [full[:16]]   # no temporary folder left
    mtime = (placed / snapshot.MARKER).stat().st_mtime_ns
    assert snapshot.place(str(root), full) == placed          # reused, not rewritten
    assert (placed / snapshot.MARKER).stat().st_mtime_ns == mtime
    # Changed after it was written: refused, with how to mend it.
    loop = placed / "common" / "loop.py"
    os.chmod(loop, 0o644)
    loop.write_text(loop.read_text() + "# edited\n")
    with pytest.raises(ConfigError, match=r"does not hold payload [0-9a-f]{16} \(it was changed "
                                          r"after it was written\): move it aside"):
        snapshot.place(str(root), full)


def test_place_refuses_what_it_cannot_write_and_leaves_nothing(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root writes anywhere: a file where the folder must go fails for everyone.
        (tmp_path / "store").write_text("not a folder")
        root = tmp_path / "store" / "payload"
    else:
        (tmp_path / "store").mkdir(mode=0o555)
        root = tmp_path / "store" / "payload"
    with pytest.raises(ConfigError, match=r"^cannot write the payload snapshot to .*; make it "
                                          r"writable, or point the site's paths.payload_dir"):
        snapshot.place(str(root), snapshot.digest())
    assert not root.exists()


def test_place_on_storage_that_is_not_mounted_here() -> None:
    top = "/jobgen-not-mounted-" + os.urandom(4).hex()
    with pytest.raises(ConfigError, match=f"^payload snapshot not placed: {top} does not exist"):
        snapshot.place(f"{top}/payload", snapshot.digest())
    said: list[str] = []
    assert snapshot.place(f"{top}/payload", snapshot.digest(), strict=False,
                          say=said.append) is None
    assert len(said) == 1 and said[0].startswith("warning: payload snapshot not placed")


def test_a_payload_that_is_not_this_jobgens_and_is_not_placed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"payload abababababababab is not this jobgen's "
                                          r"payload \([0-9a-f]{16}\)"):
        snapshot.place(str(tmp_path), "ab" * 32)


def test_container_jobs_name_the_image_of_their_platform_and_trainer() -> None:
    """One image per platform and trainer, tagged with both and the payload id, in the site's
    repository: the NeMo and NxD recipes on trn1 get different images."""
    full = snapshot.digest()
    nemo = api.job_spec("neox20b", 4, backend="batch")
    nxd = api.job_spec("llama2-7b", 4, backend="batch")
    assert images.uri(nemo, "batch") == f"jobgen:trn1-nemo-{full[:16]}"
    assert images.uri(nxd, "batch") == f"jobgen:trn1-nxd-{full[:16]}"


def test_image_context_writes_the_build_context(tmp_path: Path) -> None:
    proc = subprocess.run([str(JOBGEN), "image-context", str(tmp_path / "ctx")],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    full = snapshot.digest()
    assert (tmp_path / "ctx" / "payload" / snapshot.MARKER).read_text().strip() == full
    assert snapshot.digest(tmp_path / "ctx" / "payload") == full
    assert (tmp_path / "ctx" / "env" / "containers" / "entrypoint.sh").is_file()
    assert (f"--label io.jobgen.payload={full} --label io.jobgen.image=trn1-nemo "
            f"-t jobgen:trn1-nemo-{full[:16]} ") in proc.stdout
    again = subprocess.run([str(JOBGEN), "image-context", str(tmp_path / "ctx")],
                           capture_output=True, text=True, check=False)
    assert (again.returncode, again.stderr) == (2, f"error: {tmp_path / 'ctx'}: exists; give "
                                                   "a new folder\n")


# --- run names ----------------------------------------------------------------------------------

def test_training_overrides_change_the_default_run_name() -> None:
    plain = api.job_spec("pythia6.9b", 2)
    assert plain.run_name == "pythia6.9b-2n"
    lr = api.job_spec("pythia6.9b", 2, overrides=["optim.lr=5e-4"])
    assert re.fullmatch(r"pythia6\.9b-2n-[0-9a-f]{6}", lr.run_name)
    assert api.job_spec("pythia6.9b", 2, overrides=["optim.lr=5e-4"]).run_name == lr.run_name
    other = api.job_spec("pythia6.9b", 2, overrides=["optim.lr=6e-4"])
    assert other.run_name not in (lr.run_name, plain.run_name)
    smoke = api.job_spec("pythia6.9b", 2, overrides=["optim.lr=5e-4"], smoke=True)
    assert smoke.run_name == lr.run_name + "-smoke"
    # Values that do not change what is trained keep the name (and the run resumes).
    for same in ("job.master_port=42000", "job.max_restarts=3", "checkpoint.every_steps=250",
                 "optim.lr=1.2e-4", "compile.steps=3"):
        assert api.job_spec("pythia6.9b", 2, overrides=[same]).run_name == "pythia6.9b-2n", same
    assert api.job_spec("pythia6.9b", 2, overrides=["optim.lr=5e-4"],
                        run_name="mine").run_name == "mine"


def test_training_values_name_what_differs() -> None:
    a = runrecord.training(api.job_spec("pythia6.9b", 2))
    b = runrecord.training(api.job_spec("pythia6.9b", 2, overrides=["schedule.max_steps=20000"]))
    assert runrecord.differences(a, b) == ["schedule.max_steps: 10000 -> 20000"]
    assert a["payload"] == snapshot.digest() and a["nodes"] == 2


# --- submissions and their record ---------------------------------------------------------------

@pytest.fixture
def fake_slurm(tmp_path: Path) -> Path:
    """A PATH folder with the sbatch stand-in (and nothing else of Slurm's)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "sbatch").write_text(SBATCH)
    (folder / "sbatch").chmod(0o755 | stat.S_IXUSR)
    return folder


def jobgen(cwd: Path, fake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([str(JOBGEN), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def submit(cwd: Path, fake: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return jobgen(cwd, fake, "submit", "pythia6.9b", "--nodes", "2", "--smoke", "--no-check",
                  *args)


def test_submit_records_the_run_and_refuses_other_training_values(tmp_path: Path,
                                                                   fake_slurm: Path) -> None:
    first = submit(tmp_path, fake_slurm)
    assert (first.returncode, first.stdout) == (0, "4242\n"), first.stderr
    run_dir = tmp_path / "jobgen-runs" / "pythia6.9b-2n-smoke"
    record = json.loads((run_dir / runrecord.FILE).read_text())
    assert record["run"] == "pythia6.9b-2n-smoke" and len(record["submissions"]) == 1
    entry = record["submissions"][0]
    assert entry["job_ids"] == ["4242"] and entry["payload_digest"] == snapshot.digest()
    assert entry["recipe"] == "recipes/pythia6.9b.yaml"
    assert entry["recipe_text"] == (ROOT / "recipes" / "pythia6.9b.yaml").read_text()
    assert entry["spec"]["run_name"] == "pythia6.9b-2n-smoke"
    assert entry["training"]["optim.lr"] == 1.2e-4
    state = list((Path(os.environ["JOBGEN_STATE_DIR"]) / "records").glob("*/*/*.json"))
    assert [json.loads(p.read_text()) for p in state] == [record]    # and its copy

    # The same run name with another learning rate: refused, naming the value; nothing sent.
    clash = submit(tmp_path, fake_slurm, "--run-name", "pythia6.9b-2n-smoke",
                   "--set", "optim.lr=5e-4")
    assert (clash.returncode, clash.stdout) == (2, "")
    assert clash.stderr == ("error: run pythia6.9b-2n-smoke was submitted with other training "
                            "values: optim.lr: 0.00012 -> 0.0005; give a new --run-name, or pass "
                            "--amend to change this run deliberately\n")
    assert not (fake_slurm / "job-4243.sbatch").exists()
    # Without --run-name the changed value is a run of its own.
    own = submit(tmp_path, fake_slurm, "--set", "optim.lr=5e-4")
    assert own.returncode == 0, own.stderr
    assert len(list((tmp_path / "jobgen-runs").glob("pythia6.9b-2n-*-smoke"))) == 1
    # Deliberately, with --amend: a longer schedule for the same run.
    longer = submit(tmp_path, fake_slurm, "--set", "schedule.max_steps=20000",
                    "--run-name", "pythia6.9b-2n-smoke", "--amend")
    assert longer.returncode == 0, longer.stderr
    record = json.loads((run_dir / runrecord.FILE).read_text())
    assert [s["amend"] for s in record["submissions"]] == [False, True]
    assert record["submissions"][0] == entry                 # the first is never rewritten
    assert record["submissions"][1]["overrides"] == ["schedule.max_steps=20000"]
    # The newest submission is what the next one is compared with.
    again = submit(tmp_path, fake_slurm, "--run-name", "pythia6.9b-2n-smoke")
    assert again.returncode == 2 and "schedule.max_steps: 20000 -> 10000" in again.stderr


def test_runs_shows_the_record_and_resubmit_sends_the_same_script(tmp_path: Path,
                                                                   fake_slurm: Path) -> None:
    first = submit(tmp_path, fake_slurm, "--set", "optim.lr=5e-4", "--set",
                   "job.master_port=43000")
    assert first.returncode == 0, first.stderr
    name = json.loads(next((tmp_path / "jobgen-runs").glob("*/" + runrecord.FILE)).read_text()
                      )["run"]
    shown = jobgen(tmp_path, fake_slurm, "runs", name, "--json")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["submissions"][0]["overrides"] == ["optim.lr=5e-4", "job.master_port=43000"]
    text = jobgen(tmp_path, fake_slurm, "runs", name)
    assert "submission 1 of 1" in text.stdout and "optim.lr=5e-4" in text.stdout

    # From another folder: submitted from the folder it was first submitted from (the local
    # site's paths are relative to it), byte for byte the same script.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = jobgen(elsewhere, fake_slurm, "resubmit", name, "--no-check")
    assert (again.returncode, again.stdout) == (0, "4243\n"), again.stderr
    assert (fake_slurm / "job-4243.sbatch").read_text() == \
        (fake_slurm / "job-4242.sbatch").read_text()
    assert list(elsewhere.iterdir()) == []
    record = json.loads((tmp_path / "jobgen-runs" / name / runrecord.FILE).read_text())
    assert [s["resubmit"] for s in record["submissions"]] == [False, True]
    assert record["submissions"][-1]["job_ids"] == ["4243"]
    assert record["submissions"][-1]["training"] == record["submissions"][0]["training"]


def test_resubmit_refuses_when_the_recorded_payload_is_gone(tmp_path: Path,
                                                            fake_slurm: Path) -> None:
    first = submit(tmp_path, fake_slurm)
    assert first.returncode == 0, first.stderr
    path = tmp_path / "jobgen-runs" / "pythia6.9b-2n-smoke" / runrecord.FILE
    record = json.loads(path.read_text())
    record["submissions"][0]["payload_digest"] = "cd" * 32
    record["submissions"][0]["training"]["payload"] = "cd" * 32
    path.write_text(json.dumps(record))
    proc = jobgen(tmp_path, fake_slurm, "resubmit", "pythia6.9b-2n-smoke", "--no-check")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("error: payload cdcdcdcdcdcdcdcd is not this jobgen's payload")
    assert "submit the run again with --amend" in proc.stderr
    unknown = jobgen(tmp_path, fake_slurm, "resubmit", "no-such-run")
    assert (unknown.returncode, unknown.stderr) == (
        2, "error: no-such-run: no record of this run here (`jobgen runs` lists the runs "
           "submitted from this account)\n")


# --- a broken installation ----------------------------------------------------------------------

def test_missing_package_data_is_one_line(tmp_path: Path) -> None:
    """JOBGEN_HOME naming a folder without jobgen's files, or a project that lost its recipes:
    one line naming what is missing, exit 2, no traceback."""
    env = dict(os.environ, JOBGEN_HOME=str(tmp_path / "nothing"))
    proc = subprocess.run([str(JOBGEN), "render", "neox20b"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, check=False)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (f"error: JOBGEN_HOME={tmp_path / 'nothing'}: no recipes/ there (it "
                           "must be a jobgen project folder; unset JOBGEN_HOME to use this "
                           "installation's own files)\n")
    (tmp_path / "project" / "recipes").mkdir(parents=True)
    env["JOBGEN_HOME"] = str(tmp_path / "project")
    listed = subprocess.run([str(JOBGEN), "list"], capture_output=True, text=True, env=env,
                            check=False)
    assert (listed.returncode, listed.stdout) == (2, "")
    assert listed.stderr.startswith("error: no recipes in ") and listed.stderr.count("\n") == 1


def test_watch_says_which_jobs_it_cannot_follow(tmp_path: Path) -> None:
    """A backend that declares it cannot be watched (a local run: it ran in the foreground)
    says so in one line, exit 2, and where to look instead."""
    env = {**os.environ, "JOBGEN_STATE_DIR": str(tmp_path / "state")}
    from jobgen.runs import ledger as runs
    record = runs.Run(name="r1", backend="local", job_id="local-1", recipe="llama2-7b", nodes=2,
                      site="", run_dir=str(tmp_path / "r1"), submitted="2026-01-01T00:00:00Z")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / runs.RECORD).write_text(json.dumps(record.as_dict()) + "\n")
    proc = subprocess.run([str(JOBGEN), "watch", "r1"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, check=False)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == ("error: r1: a local job cannot be watched while it runs (it runs in "
                           "the foreground; its nodes write the run folder as they go); judge "
                           "its run folder afterwards with jobgen watch --run-dir FOLDER\n")


# --- extras -------------------------------------------------------------------------------------

def test_every_missing_extra_is_one_line_and_help_needs_none(tmp_path: Path) -> None:
    """A jobgen whose extras are missing (boto3, botocore, kubernetes, kubernetes-validate
    hidden from it): every command that needs one names it in one line, exit 2; --help works;
    EKS rendering says once that the manifests were not validated."""
    hide = tmp_path / "hide"
    hide.mkdir()
    for name in ("boto3", "botocore", "kubernetes", "kubernetes_validate"):
        # A package that fails to import as if absent: found first on sys.path.
        (hide / name).mkdir()
        (hide / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name='{name}')\n")
    env = dict(os.environ, PYTHONPATH=str(hide))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(JOBGEN), *args], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=120, check=False)

    for args, extra in ((("batch", "submit", "bert-large"), "batch"),
                        (("batch", "validate", "x.json"), "batch"),
                        (("render", "bert-large", "--backend", "batch"), "batch"),
                        (("render", "llama2-7b", "-n", "16", "--backend", "sagemaker"),
                         "sagemaker"),
                        (("status", "x", "--backend", "eks"), "eks"),
                        (("cancel", "x", "--backend", "eks"), "eks"),
                        (("logs", "x", "--backend", "eks"), "eks"),
                        (("submit", "llama2-7b", "-n", "2", "--backend", "eks"), "eks")):
        proc = run(*args)
        assert (proc.returncode, proc.stdout) == (2, ""), (args, proc.stderr)
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, args
        assert proc.stderr.endswith(f"pip install 'jobgen[{extra}]'\n"), (args, proc.stderr)
    for args in (("batch", "submit", "--help"), ("batch", "--help"), ("status", "--help")):
        proc = run(*args)
        assert proc.returncode == 0 and proc.stdout.startswith("Usage: "), (args, proc.stderr)
    proc = run("render", "llama2-7b", "-n", "2", "--backend", "eks")
    assert proc.returncode == 0 and "kind: Job" in proc.stdout, proc.stderr
    assert proc.stderr.count("kubernetes-validate is not installed") == 1


def test_a_dry_run_script_submits_only_once_the_snapshot_is_there(tmp_path: Path,
                                                                    fake_slurm: Path) -> None:
    """`submit --dry-run | bash`: the dry run places nothing, so its script refuses to submit
    jobs that would stop at once; after `jobgen render` (which places the snapshot) it submits."""
    script = jobgen(tmp_path, fake_slurm, "submit", "pythia6.9b", "-n", "2", "--smoke",
                    "--dry-run").stdout
    env = dict(os.environ, PATH=f"{fake_slurm}{os.pathsep}{os.environ['PATH']}")
    refused = subprocess.run(["bash"], input=script, cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60, check=False)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr.startswith("jobgen: the payload snapshot these jobs run, "
                                     "jobgen-runs/.jobgen/payload/")
    assert not list(fake_slurm.glob("job-*.sbatch"))
    placed = jobgen(tmp_path, fake_slurm, "render", "pythia6.9b", "-n", "2", "--smoke")
    assert placed.returncode == 0, placed.stderr
    sent = subprocess.run(["bash"], input=script, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (sent.returncode, sent.stdout) == (0, "4242\n"), sent.stderr
