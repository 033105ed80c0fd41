"""NeMo's script starts under jobgen's wrapper (payload/neuron_nemo/per_node_indices.py) as it
starts without it: run as the job runs it (payload/neuron_nemo/launch.sh, node_launch's
torchrun, the interpreter on PATH, no PYTHONPATH) against upstream's example folder laid out
from jobgen/payloads/upstream/neuron_nemo_layout.json (tests/stand_ins/nemo_layout.py): the
script's folder first on sys.path, so its sibling lightning_neuron_patch imports; that patch
runs before anything of Lightning or NeMo, so NeMo's dataset module binds the patched Lightning
function; and the dataset module is patched (the per-node index build) once the script imports
it. The image build's start check and a 2-instance SageMaker rehearsal run the same way."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "stand_ins"))
import nemo_layout  # noqa: E402

from jobgen import api, payloads  # noqa: E402
from jobgen.images import catalog as images  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
FACTS = nemo_layout.FACTS


def run_instances(commands: list[tuple[list[str], dict[str, str]]], image_python: Path,
                  tmp_path: Path) -> list[str]:
    """Start each emulated instance's entrypoint (one worker each) as the container would, wait
    for all of them, and return their logs; every one must end with status 0."""
    procs, logs = [], []
    for index, (argv, env) in enumerate(commands):
        logs.append(tmp_path / f"instance-{index}.log")
        with open(logs[-1], "w", encoding="utf-8") as out:
            procs.append(subprocess.Popen(
                argv, env=_job_env(image_python, **{**env, "JOBGEN_WORKERS_PER_NODE": "1"}),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        statuses = [proc.wait(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    texts = [log.read_text(encoding="utf-8", errors="replace") for log in logs]
    assert statuses == [0] * len(procs), "\n".join(t[-3000:] for t in texts)
    return texts


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _job_env(bin_dir: Path, **extra: str) -> dict[str, str]:
    """This machine's environment as a node's: no jobgen, torchrun or Python path variables
    left over, the stand-in image's interpreter first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOBGEN_", "SLURM_", "MASTER_", "TORCHELASTIC_", "PYTHON"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nemo_layout.interpreter(tmp_path_factory.mktemp("image"))


def test_the_layout_is_the_one_the_payload_and_the_image_use() -> None:
    """The recorded facts are those the rest of jobgen starts NeMo with."""
    program = FACTS["files"][FACTS["program"]]["imports"]
    assert program[0] == {"line": 14, "module": "lightning_neuron_patch", "local": True}
    local = [i["module"] for i in program if i.get("local")]
    assert local[1:] == [f"checkpoint_conversion.convert_nemo_checkpoint_to_hf{s}"
                         for s in ("_llama", "", "_neox")]
    assert set(FACTS["files"]) == {FACTS["program"], "lightning_neuron_patch.py",
                                   "checkpoint_conversion/__init__.py",
                                   *(f"checkpoint_conversion/{m.split('.')[1]}.py"
                                     for m in local[1:])}
    # The dataset module is reached after the patch: the model module at line 27.
    reached = FACTS["dataset_module"]["reached_through"][0]
    assert reached["line"] > program[0]["line"]
    assert any(i["module"] == reached["module"] for i in program)
    lau = payloads.for_spec(api.job_spec("neox20b", 2, site="sagemaker", backend="sagemaker"))
    assert lau.program == FACTS["program"] and lau.launcher == "neuron_nemo/launch.sh"
    image = images.declared().images["trn1-nemo"]
    assert image.paths["nemo_dir"] == FACTS["directory"]
    assert image.starts[1] == f"{FACTS['directory']}/{FACTS['program']}"
    wrapper = (PAYLOAD / image.starts[0]).read_text()
    assert f'DATASET_MODULE = "{FACTS["dataset_module"]["module"]}"' in wrapper


def _launch(bin_dir: Path, folder: Path, run: Path, shared: str,
            workers: int = 2) -> subprocess.CompletedProcess[str]:
    """The compile pass of one node, by payload/neuron_nemo/launch.sh as a node runs it."""
    env = _job_env(bin_dir, JOBGEN_SHARED_FS=shared, JOBGEN_WORKDIR=str(folder),
                   JOBGEN_PROGRAM=FACTS["program"], JOBGEN_RUN_DIR=str(run),
                   JOBGEN_LOG_DIR=str(run / "logs"), JOBGEN_NODE_RANK="0", JOBGEN_NNODES="1",
                   JOBGEN_WORKERS_PER_NODE=str(workers), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_port()))
    return subprocess.run(
        ["bash", str(PAYLOAD / "neuron_nemo" / "launch.sh"), "compile",
         "--config-name=megatron_neox_config", "model.data.data_prefix=[1.0,/nowhere/corpus]",
         f"model.data.index_mapping_dir={run / 'index'}"],
        cwd=run, env=env, capture_output=True, text=True, timeout=180, check=False)


def test_launch_starts_nemo_under_the_wrapper_as_without_it(image_python: Path,
                                                           tmp_path: Path) -> None:
    folder = tmp_path / "language_modeling"
    program = nemo_layout.write_folder(folder)
    seen = {}
    for shared in ("1", "0"):          # without the wrapper (a shared disk), then with it
        run = tmp_path / f"run-{shared}"
        run.mkdir()
        done = _launch(image_python, folder, run, shared)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        reports = sorted(nemo_layout.reports(done.stdout), key=lambda r: r["rank"])
        assert [r["rank"] for r in reports] == ["0", "1"], done.stdout[-3000:]
        seen[shared] = reports
    for bare, wrapped in zip(seen["1"], seen["0"]):
        index = wrapped.pop("index"), bare.pop("index")
        assert wrapped == bare                     # sys.path whole, __file__, argv, order
        assert wrapped["sys_path"][0] == str(folder)
        assert wrapped["file"] == wrapped["argv0"] == str(program)
        assert wrapped["patch_ran_first"] and wrapped["dataset_bound_patched"]
        assert str(PAYLOAD) not in wrapped["sys_path"]
        assert str(PAYLOAD / "neuron_nemo") not in wrapped["sys_path"]
        # One node: its local rank 0 is rank 0, which builds; every rank reads.
        assert index[0] == index[1] == {"built": wrapped["rank"] == "0", "read": "built"}


def test_a_start_that_imports_the_dataset_first_is_seen(image_python: Path,
                                                        tmp_path: Path) -> None:
    """The checks have teeth: the script started after NeMo's dataset module was imported (and
    with its folder put on the path by hand, as the old tests did) runs, but the dataset module
    bound Lightning's original function and the patch did not run first."""
    program = nemo_layout.write_folder(tmp_path / "language_modeling")
    early = (f"import importlib, runpy, sys; importlib.import_module({nemo_layout.DATASET!r}); "
             f"sys.path.insert(0, {str(program.parent)!r}); "
             f"sys.argv = [{str(program)!r}]; runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run(["python3", "-c", early], env=_job_env(image_python, RANK="0"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    (report,) = nemo_layout.reports(done.stdout)
    assert not report["patch_ran_first"] and not report["dataset_bound_patched"]


def _start_check(bin_dir: Path, folder: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The image build's start check (build_check.py start) with the declared arguments, the
    image's payload and checkout at this machine's folders."""
    image = images.declared().images["trn1-nemo"]
    argv = json.loads(dict(images.build_args(image, None))["START_CHECK"])
    assert image.checkout is not None
    program = f"{image.checkout.path}/{FACTS['directory']}/{FACTS['program']}"
    assert argv == [f"{images.declared().payload_dir}/{image.starts[0]}", "--check", program]
    argv = [argv[0].replace(images.declared().payload_dir, str(PAYLOAD)), argv[1],
            str(folder / FACTS["program"])]
    return subprocess.run(["python3", str(ROOT / "env" / "containers" / "build_check.py"),
                           "start"], env=_job_env(bin_dir, START_CHECK=json.dumps(argv)),
                          cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_the_image_build_starts_the_program_as_a_job_does(image_python: Path,
                                                          tmp_path: Path) -> None:
    folder = tmp_path / "language_modeling"
    nemo_layout.write_folder(folder)
    ok = _start_check(image_python, folder, tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert nemo_layout.reports(ok.stdout) == []            # the program's main did not run
    assert f"{nemo_layout.DATASET} patched at its import" in ok.stdout
    assert ok.stdout.splitlines()[-1] == (f"image check: ok: {folder / FACTS['program']} "
                                          "starts as a job starts it")
    # No import path added: the image's own IMPORT_PATH leaves the program's folder out.
    image = images.declared().images["trn1-nemo"]
    assert str(Path(image.trainer_files()[0]).parent) not in images.import_path(image).split(":")
    # A checkout without the script's sibling stops the build, naming the script.
    (folder / "lightning_neuron_patch.py").unlink()
    broken = _start_check(image_python, folder, tmp_path)
    assert broken.returncode == 1
    assert "No module named 'lightning_neuron_patch'" in broken.stderr
    assert broken.stderr.splitlines()[-1].startswith(
        f"image check: {folder / FACTS['program']} does not start as a job starts it")


@pytest.mark.slow   # about 17 s: two instances, two passes, four torchruns
def test_nemo_starts_both_passes_on_two_sagemaker_instances(
        image_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered training job (neox20b on the SageMaker site, not --smoke), its instances
    emulated (jobgen/backends/sagemaker/rehearsal.py: the real entrypoint, each instance its
    own disk), its image tree holding the stand-in upstream folder where the image declares
    the checkout: on both instances the compile pass and the training pass start NeMo's script
    under the wrapper, its sibling imported, and each instance's leader builds its own index
    file. One worker per instance (a trn1 runs 32); the stand-in neuron_parallel_compile runs
    its command; no health gate (it checks Neuron devices)."""
    from jobgen.backends.local import runner as local_runner
    monkeypatch.chdir(tmp_path)
    spec = api.job_spec("neox20b", 2, site="sagemaker", backend="sagemaker",
                        run_name=f"start-{uuid.uuid4().hex[:8]}",
                        overrides=("job.health_gate=false", "job.data_check=false",
                                   f"job.master_port={_port()}"))
    local_runner.place_payload(spec)
    commands = local_runner.commands(spec, "attempt-1")
    tree = local_runner.image_tree(spec)
    image = images.declared().images["trn1-nemo"]
    assert image.checkout is not None
    folder = tree / image.checkout.path.lstrip("/") / FACTS["directory"]
    shutil.rmtree(folder / "checkpoint_conversion", ignore_errors=True)
    nemo_layout.write_folder(folder)           # over the rehearsal's stub of the program
    assert all(env["JOBGEN_WORKDIR"] == str(folder) for _, env in commands)
    texts = run_instances(commands, image_python, tmp_path)
    for index, (text, (_, env)) in enumerate(zip(texts, commands)):
        reports = nemo_layout.reports(text)
        assert len(reports) == 2, text[-3000:]             # the compile pass, then training
        for report in reports:
            assert report["rank"] == str(index)
            assert report["sys_path"][0] == str(folder)
            assert report["patch_ran_first"] and report["dataset_bound_patched"]
            # Global rank 1 too builds on its own instance's disk (upstream: rank 0 only).
            assert report["index"]["read"] == "built"
        assert reports[0]["index"]["built"]
        scratch = Path(env["JOBGEN_NODE_SCRATCH"]) / spec.run_name / "index_mappings"
        assert len(list(scratch.glob("*_indexmap_*"))) == 1
        assert "compile pass ended with status 0" in text
        assert "train pass ended with status 0" in text
