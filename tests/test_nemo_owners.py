"""NeMo checkpoints on nodes that share no disk have one owner per file, tensor files included.

With save_xser every data-parallel rank writes its own share of a checkpoint's tensor files
(neuronx-nemo-megatron d22aabf, parts/serialization.py), each on its own node's disk, while the
prune (nlp_overrides._remove_checkpoint_impl) deletes the ``.ckpt`` and its tensor folder on
data-parallel rank 0 only. On SageMaker each instance's disk is mirrored to one S3 prefix, so
without jobgen's wrapper (payload/neuron_nemo/per_node_indices.py) the other instances' shares
of every pruned checkpoint stay there. The stand-in NeMo (tests/stand_ins/nemo_layout.py) saves
and prunes as upstream does; the programs start as a job starts them."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "stand_ins"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nemo_layout  # noqa: E402
from test_nemo_start import _job_env, _port, run_instances  # noqa: E402

from jobgen import api  # noqa: E402
from jobgen.images import catalog as images  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "payload" / "neuron_nemo" / "per_node_indices.py"
NUMELS = 6                       # the stand-in model's tensors (tensor_0.pt ... tensor_5.pt)
# Pythia 6.9B on 2 instances, model parallel 1 so that 1 worker per instance makes a
# data-parallel group that spans both (as TP 8 does at 2+ instances of 32 workers): 4 saves,
# 2 kept.
SETTINGS = ("parallelism.tensor=1", "parallelism.sequence_parallel=false",
            "parallelism.pipeline=1", "schedule.max_steps=200", "checkpoint.every_steps=50",
            "checkpoint.keep=2", "job.health_gate=false", "job.data_check=false")


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nemo_layout.interpreter(tmp_path_factory.mktemp("image"))


def _args(folder: Path, keep: int = 2) -> list[str]:
    return ["--config-name=megatron_gpt_config", "model.tensor_model_parallel_size=1",
            "model.pipeline_model_parallel_size=1", "trainer.max_steps=200",
            "exp_manager.create_checkpoint_callback=True",
            f"+exp_manager.checkpoint_callback_params.dirpath={folder}",
            "+exp_manager.checkpoint_callback_params.every_n_train_steps=50",
            f"exp_manager.checkpoint_callback_params.save_top_k={keep}"]


def _second_rank(bin_dir: Path, program: Path, folder: Path, wrapped: bool,
                 since: int) -> subprocess.CompletedProcess[str]:
    """Global rank 1 of 2, the first worker of the second node, as torchrun starts it."""
    env = _job_env(bin_dir, RANK="1", LOCAL_RANK="0", WORLD_SIZE="2", JOBGEN_SHARED_FS="0",
                   JOBGEN_PASS_SINCE_NS=str(since))
    head = ["-u", str(WRAPPER)] if wrapped else ["-u"]
    return subprocess.run(["python3", *head, str(program), *_args(folder)], env=env,
                          cwd=folder.parent, capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_node_deletes_its_own_share_of_a_pruned_checkpoint_and_nothing_restored(
        image_python: Path, tmp_path: Path) -> None:
    program = nemo_layout.write_folder(tmp_path / "language_modeling")
    for wrapped in (False, True):
        folder = tmp_path / f"wrapped-{wrapped}" / "checkpoints"
        # A copy of another instance's file restored from S3 before this pass started, in the
        # folder of a checkpoint this pass saves and prunes again.
        restored = folder / "megatron_gpt--step=50-consumed_samples=12800.0.ckpt.tensors" \
            / "tensor_0.pt"
        restored.parent.mkdir(parents=True)
        restored.write_bytes(b"restored")
        since = time.time_ns()
        os.utime(restored, ns=(since - 10**9, since - 10**9))
        done = _second_rank(image_python, program, folder, wrapped, since)
        assert done.returncode == 0, done.stderr[-3000:]
        (report,) = nemo_layout.reports(done.stdout)
        saved, pruned = report["checkpoints"]["saved"], report["checkpoints"]["pruned"]
        assert [Path(p).name.split("-")[2] for p in saved] == [
            "step=50", "step=100", "step=150", "step=200"]
        assert pruned == saved[:2]
        left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                      if p.is_file())
        # Data-parallel rank 1 wrote no .ckpt; its share of each save is tensors 1, 2 and 4.
        share = [f"{Path(p).name}.tensors/tensor_{i}.pt" for p in saved for i in (1, 2, 4)]
        if not wrapped:     # upstream alone: the share of both pruned checkpoints stays
            assert left == sorted(share + [restored.relative_to(folder).as_posix()])
        else:               # its own share of the pruned ones deleted, the restored copy kept
            assert left == sorted(share[6:] + [restored.relative_to(folder).as_posix()])


class Mirror:
    """SageMaker's CheckpointConfig, emulated on files (an S3 prefix as a folder): what each
    instance wrote under its LocalPath is uploaded to the one prefix, what it deleted of what
    it was given is deleted there; a key written or deleted by two instances fails the test."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = prefix
        self.given: dict[int, dict[str, tuple[int, int]]] = {}

    @staticmethod
    def files(local: Path) -> dict[str, tuple[int, int]]:
        return {p.relative_to(local).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
                for p in local.rglob("*") if p.is_file()}

    def upload(self, locals_: list[Path]) -> None:
        owner: dict[str, int] = {}
        for node, local in enumerate(locals_):
            given, now = self.given.get(node, {}), self.files(local)
            wrote = sorted(k for k, v in now.items() if given.get(k) != v)
            gone = sorted(set(given) - set(now))
            for key in wrote + gone:
                assert key not in owner, f"{key}: written or deleted by instances " \
                                         f"{owner[key]} and {node}"
                owner[key] = node
            for key in wrote:
                target = self.prefix / key
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes((local / key).read_bytes())
            for key in gone:
                (self.prefix / key).unlink(missing_ok=True)

    def keys(self) -> list[str]:
        return sorted(self.files(self.prefix))


@pytest.mark.slow   # about 15 s: two instances, two passes, four torchruns
def test_sagemaker_prefix_holds_the_kept_checkpoints_of_every_data_parallel_rank(
        image_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rendered training job (pythia6.9b on the SageMaker site, not --smoke, its
    instances emulated: jobgen/backends/sagemaker/rehearsal.py), NeMo's script stood in where
    the image declares the checkout: after 4 saves at keep 2, the prefix both instances'
    disks are mirrored to holds exactly the 2 newest checkpoints, the .ckpt and every
    data-parallel rank's tensor files, and no key has two owners."""
    from jobgen.backends.local import runner as local_runner
    monkeypatch.chdir(tmp_path)
    spec = api.job_spec("pythia6.9b", 2, site="sagemaker", backend="sagemaker",
                        run_name=f"own-{uuid.uuid4().hex[:8]}",
                        overrides=(*SETTINGS, f"job.master_port={_port()}"))
    local_runner.place_payload(spec)
    commands = local_runner.commands(spec, "attempt-1")
    image = images.declared().images["trn1-nemo"]
    assert image.checkout is not None
    folder = local_runner.image_tree(spec) / image.checkout.path.lstrip("/") \
        / nemo_layout.FACTS["directory"]
    nemo_layout.write_folder(folder)           # over the rehearsal's stub of the program
    texts = run_instances(commands, image_python, tmp_path)
    saved = []
    for index, text in enumerate(texts):
        train = nemo_layout.reports(text)[-1]
        assert train["rank"] == str(index) and len(train["checkpoints"]["saved"]) == 4
        saved.append([Path(p).name for p in train["checkpoints"]["saved"]])
    assert saved[0] == saved[1]
    mirror = Mirror(tmp_path / "s3-prefix")
    mirror.upload([Path(env["SM_INPUT_CONFIG_DIR"]).parents[1] / "checkpoints"
                   for _, env in commands])
    ckpts = f"{spec.run_name}/nemo/checkpoints"
    held = [k for k in mirror.keys() if k.startswith(ckpts + "/")]
    expected = sorted(f"{ckpts}/{name}{tail}" for name in saved[0][2:] for tail in
                      [""] + [f".tensors/tensor_{i}.pt" for i in range(NUMELS)])
    assert held == expected
