"""NeMo's dataset index files on nodes that share no disk (payload/common/node_indices.py and
payload/neuron_nemo/per_node_indices.py), without NeMo: a module shaped as upstream's
gpt_dataset.py (global rank 0 builds, every rank loads) stands in for it, installed in the
site-packages of the interpreter that runs the wrapper (no PYTHONPATH: a job sets none). The
multi-instance proofs are tests/test_nemo_start.py's SageMaker rehearsal (NeMo's script under
the wrapper on two emulated instances) and the smoke trainer's retry rehearsal
(tests/test_rehearsal_checkpoints.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from common import node_indices  # noqa: E402

# Upstream's shape (neuronx-nemo-megatron d22aabf, _build_index_mappings): rank 0 builds what is
# missing, a rendezvous of every rank, then every rank loads.
FAKE_DATASET = '''
import os, types
torch = types.SimpleNamespace(distributed=types.SimpleNamespace(
    get_rank=lambda: int(os.environ["RANK"]), barrier=lambda: None))

def _build_index_mappings(index_dir, prefix):
    name = os.path.join(index_dir, os.path.basename(prefix))
    name += "_train_indexmap_8ns_4sl_1s_doc_idx.npy"
    if torch.distributed.get_rank() == 0 and not os.path.isfile(name):
        with open(name, "w") as f:
            f.write("built")
        print("BUILT", flush=True)
    torch.distributed.barrier()
    with open(name) as f:
        return f.read()
'''
FAKE_PROGRAM = '''
import sys
from nemo.collections.nlp.data.language_modeling.megatron import gpt_dataset
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
prefix = args["model.data.data_prefix"].strip("[]").split(",")[1]
print("LOADED", gpt_dataset._build_index_mappings(args["model.data.index_mapping_dir"], prefix))
'''


def _fake_nemo(root: Path) -> Path:
    """The program in ROOT, the stand-in NeMo package in a site folder of its interpreter
    (ROOT/python: a venv, as the image's pip install puts NeMo in its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "python")],
                   check=True, timeout=120)
    site = Path(subprocess.run([str(root / "python" / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    package = site / "nemo" / "collections" / "nlp" / "data" / "language_modeling" / "megatron"
    package.mkdir(parents=True)
    for folder in [package, *package.parents][:6]:
        (folder / "__init__.py").touch()
    (package / "gpt_dataset.py").write_text(FAKE_DATASET)
    program = root / "megatron_gpt_pretraining.py"
    program.write_text(FAKE_PROGRAM)
    return program


def _run(tmp_path: Path, program: Path, rank: str, local_rank: str, shared: str,
         index_dir: Path, prefix: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(RANK=rank, LOCAL_RANK=local_rank, JOBGEN_SHARED_FS=shared)
    # As node_launch's torchrun starts it: `python -u WRAPPER PROGRAM ARG...`, no PYTHONPATH.
    return subprocess.run(
        [str(tmp_path / "python" / "bin" / "python"), "-u",
         str(PAYLOAD / "neuron_nemo" / "per_node_indices.py"), str(program),
         "--config-path=/nowhere", f"model.data.data_prefix=[1.0,{prefix}]",
         f"model.data.index_mapping_dir={index_dir}"],
        env=env, capture_output=True, text=True, timeout=60)


def test_each_nodes_local_rank_0_builds_its_own_copy(tmp_path: Path) -> None:
    program = _fake_nemo(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    prefix = data / "corpus_text_document"
    node1 = tmp_path / "algo-2-scratch"
    # Global rank 2, the first rank of the second node: upstream would not build, and its
    # load would fail on this node's disk; here it builds.
    built = _run(tmp_path, program, "2", "0", "0", node1, prefix)
    assert built.returncode == 0, built.stderr
    assert built.stdout.split() == ["BUILT", "LOADED", "built"]
    # The other ranks of a node never build (they load what their node's leader built).
    other = _run(tmp_path, program, "3", "1", "0", tmp_path / "algo-2-other", prefix)
    assert other.returncode != 0 and "FileNotFoundError" in other.stderr
    # Where the nodes share the folder nothing changes: rank 2 does not build.
    shared = _run(tmp_path, program, "2", "0", "1", tmp_path / "shared", prefix)
    assert shared.returncode != 0 and "BUILT" not in shared.stdout


def test_files_built_in_advance_beside_the_data_are_used(tmp_path: Path) -> None:
    program = _fake_nemo(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    prefix = data / "corpus_text_document"
    (data / "corpus_text_document_train_indexmap_8ns_4sl_1s_doc_idx.npy").write_text("advance")
    (data / "other_text_document_train_indexmap_8ns_4sl_1s_doc_idx.npy").write_text("no")
    scratch = tmp_path / "algo-1-scratch"
    done = _run(tmp_path, program, "0", "0", "0", scratch, prefix)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["LOADED", "advance"]        # nothing built: linked
    assert "1 index file(s) built in advance" in done.stderr
    assert sorted(p.name for p in scratch.iterdir()) == [
        "corpus_text_document_train_indexmap_8ns_4sl_1s_doc_idx.npy"]


def test_install_changes_the_rank_in_that_module_only() -> None:
    ranks = types.SimpleNamespace(get_rank=lambda: 5, get_world_size=lambda: 8)
    module = types.SimpleNamespace(torch=types.SimpleNamespace(distributed=ranks, zeros=0))
    leader = {"JOBGEN_SHARED_FS": "0", "LOCAL_RANK": "0"}
    assert node_indices.install(module, leader)
    assert module.torch.distributed.get_rank() == 0
    assert module.torch.distributed.get_world_size() == 8 and module.torch.zeros == 0
    assert ranks.get_rank() == 5
    assert not node_indices.install(module, leader)            # once
    follower = types.SimpleNamespace(torch=types.SimpleNamespace(distributed=ranks))
    assert node_indices.install(follower, {"JOBGEN_SHARED_FS": "0", "LOCAL_RANK": "3"})
    assert follower.torch.distributed.get_rank() == 5
    untouched = types.SimpleNamespace(torch=types.SimpleNamespace(distributed=ranks))
    assert not node_indices.install(untouched, {"LOCAL_RANK": "0"})
    assert untouched.torch.distributed.get_rank() == 5
