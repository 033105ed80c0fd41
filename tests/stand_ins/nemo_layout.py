"""neuronx-nemo-megatron's example folder and its installed packages, stood in from the facts
in jobgen/payloads/upstream/neuron_nemo_layout.json, for tests that start NeMo's script the way
a job starts it.

- ``write_folder(dest)``: every file of the folder the program needs, at upstream's names, each
  running its recorded module-level imports in upstream's order: the folder's own modules, and
  those of the stood-in packages (``lightning_lite``, ``nemo``) and of the standard library
  (the others, torch among them, are skipped: they decide nothing about the order and cost
  seconds per process). The program's ``main`` prints one line, ``nemo-standin: {json}``: its
  sys.path, __file__, argv, whether lightning_neuron_patch ran before Lightning or NeMo's
  dataset module was imported, whether the dataset module bound the patched Lightning function,
  and what its index build did (rank 0 of the dataset module builds, every rank loads); in a
  training pass at model parallel 1, the checkpoints it saved and pruned (NeMo's checkpoint IO
  stood in as upstream's: ``OVERRIDES_BODY``).
- ``interpreter(root)``: a Python environment standing in for the image's: a venv of this
  interpreter whose site-packages hold the stood-in packages (as the image's pip install puts
  NeMo there) and, after them, this environment's own (torch for torchrun), with ``torchrun``
  and a stand-in ``neuron_parallel_compile`` (it runs its command) in its bin folder. No
  PYTHONPATH: a job sets none.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FACTS: dict[str, Any] = json.loads(
    (ROOT / "jobgen" / "payloads" / "upstream" / "neuron_nemo_layout.json").read_text())
DATASET = FACTS["dataset_module"]["module"]
REBINDS = FACTS["rebinds"]
OVERRIDES = "nemo.collections.nlp.parts.nlp_overrides"
STOOD_IN = ("lightning_lite", "nemo")
REPORT = "nemo-standin: "


def _runs(module: str) -> bool:
    top = module.split(".")[0]
    return top in STOOD_IN or top in sys.stdlib_module_names


def _statement(item: dict[str, Any]) -> str:
    if "names" in item:
        return f"from {item['module']} import {', '.join(item['names'])}"
    return f"import {item['module']}"


def _module_of(path: str) -> str:
    return path[:-len("/__init__.py")].replace("/", ".") if path.endswith("__init__.py") \
        else path[:-3].replace("/", ".")


def _names_wanted() -> dict[str, set[str]]:
    """module -> the names the layout's `from` imports take from it."""
    wanted: dict[str, set[str]] = {}
    for info in FACTS["files"].values():
        for item in info["imports"]:
            wanted.setdefault(item["module"], set()).update(item.get("names", ()))
    for step in FACTS["dataset_module"]["reached_through"]:
        wanted.setdefault(step["module"], set()).update(step.get("names", ()))
    return wanted


# lightning_neuron_patch's first line: nothing of Lightning or NeMo imported before it ran.
PATCH_HEAD = '''import sys as _sys
RAN_FIRST = not any(m.split(".")[0] in ("lightning_lite", "nemo") for m in _sys.modules)'''
PROGRAM_MAIN = '''

def checkpoints(args):
    """NeMo's checkpoint callback as the rendered overrides set it, model parallel 1: a save
    every n steps up to max_steps (after the resumed step), the oldest pruned beyond the top k
    on every rank (never the one resumed from: NLPDDPStrategy.remove_checkpoint)."""
    import re, sys
    overrides = sys.modules[%(overrides)r]
    clean = {k.lstrip("+"): v.strip(chr(39) + chr(34)) for k, v in args.items()}
    every = int(clean["exp_manager.checkpoint_callback_params.every_n_train_steps"])
    top_k = int(clean["exp_manager.checkpoint_callback_params.save_top_k"])
    folder = clean["exp_manager.checkpoint_callback_params.dirpath"]
    resumed = clean.get("model.resume_from_checkpoint")
    first = int(re.search(r"step=(\\d+)", resumed).group(1)) if resumed else 0
    kept = [resumed] if resumed else []
    saved, pruned = [], []
    for step in range(first + every, int(clean["trainer.max_steps"]) + 1, every):
        path = f"{folder}/megatron_gpt--step={step}-consumed_samples={step * 256}.0.ckpt"
        os.makedirs(folder, exist_ok=True)
        overrides.save_xser(path, [96, 64, 48, 32, 16, 8])
        saved.append(path)
        kept.append(path)
        while len(kept) > top_k:
            old = next(k for k in kept if k != resumed)
            kept.remove(old)
            overrides.remove_checkpoint(old)
            pruned.append(old)
    return {"saved": saved, "pruned": pruned}


def main():
    import os, sys
    from lightning_lite.accelerators import tpu
    import lightning_neuron_patch
    dataset = sys.modules[%(dataset)r]
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    index_dir = args.get("model.data.index_mapping_dir", "null")
    built = None
    if index_dir != "null":
        built = dataset._build_index_mappings(index_dir.strip("'"), "corpus_text_document")
    saves = None
    if (args.get("exp_manager.create_checkpoint_callback") == "True"
            and args.get("model.tensor_model_parallel_size") == "1"
            and args.get("model.pipeline_model_parallel_size") == "1"):
        saves = checkpoints(args)
    print(%(report)r + json.dumps({
        "sys_path": sys.path, "file": __file__, "argv0": sys.argv[0],
        "argc": len(sys.argv), "patch_ran_first": lightning_neuron_patch.RAN_FIRST,
        "dataset_bound_patched": dataset._parse_tpu_cores is tpu._parse_tpu_cores,
        "index": built, "checkpoints": saves, "rank": os.environ.get("RANK")}), flush=True)


if __name__ == "__main__":
    main()
'''


def write_folder(dest: Path) -> Path:
    """The example folder at ``dest``; returns the program's path."""
    wanted = _names_wanted()
    for rel, info in FACTS["files"].items():
        lines = [f"# stand-in for {FACTS['directory']}/{rel} at {FACTS['commit']}",
                 "import json"]
        if rel == REBINDS["file"]:
            lines.append(PATCH_HEAD)
        lines += [_statement(i) for i in info["imports"] if i.get("local") or _runs(i["module"])]
        if rel == REBINDS["file"]:
            lines.append(f"import {REBINDS['module']} as _target")
            for attr in REBINDS["attributes"]:
                owner, _, name = attr.rpartition(".")
                where = f"_target.{owner}" if owner else "_target"
                lines.append(f"setattr({where}, {name!r}, lambda *a, **k: 'patched')")
        lines += [f"def {n}(*a, **k):\n    return None" for n in sorted(
            wanted.get(_module_of(rel), ())) if n.isidentifier()]
        if rel == FACTS["program"]:
            lines.append(PROGRAM_MAIN % {"dataset": DATASET, "report": REPORT,
                                         "overrides": OVERRIDES})
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest / FACTS["program"]


DATASET_BODY = '''
import os, time, types
# Lightning-bound code that NeMo runs at import (its core imports pytorch_lightning).
from lightning_lite.accelerators.tpu import _parse_tpu_cores
# Upstream's rank test: this module's own torch global, rank 0 builds, every rank loads.
torch = types.SimpleNamespace(distributed=types.SimpleNamespace(
    get_rank=lambda: int(os.environ["RANK"]), barrier=lambda: None))


def build_train_valid_test_datasets(*args, **kwargs):
    return None


def _build_index_mappings(index_dir, prefix):
    name = os.path.join(index_dir, prefix + "_train_indexmap_8ns_4sl_1s_doc_idx.npy")
    built = False
    if torch.distributed.get_rank() == 0 and not os.path.isfile(name):
        os.makedirs(index_dir, exist_ok=True)
        with open(name + ".tmp", "w") as f:
            f.write("built")
        os.replace(name + ".tmp", name)
        built = True
    torch.distributed.barrier()
    deadline = time.monotonic() + 60      # the rendezvous: every rank waits for the builder
    while not os.path.isfile(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(name) as f:
        return {"built": built, "read": f.read()}
'''
# NeMo's checkpoint IO as neuronx-nemo-megatron d22aabf has it (parts/nlp_overrides.py, the
# xser serialization it calls: parts/serialization.py), without torch: model parallel 1, the
# data-parallel rank this process's RANK. save_xser: the tensors split over the data-parallel
# ranks by size (largest first, to the least-loaded rank), each rank writing its share as
# <file>.ckpt.tensors/tensor_<id>.pt, rank 0 the .ckpt (references in place of the tensors);
# the prune: every rank calls _remove_checkpoint_impl, which deletes the .ckpt and its tensor
# folder on data-parallel rank 0 only (and each rank's ZeRO-1 optimizer file).
OVERRIDES_BODY = '''
import os, pickle, shutil, types, zipfile
parallel_state = types.SimpleNamespace(
    get_data_parallel_rank=lambda: int(os.environ["RANK"]),
    get_data_parallel_world_size=lambda: int(os.environ["WORLD_SIZE"]))


class TensorReference:
    def __init__(self, tid, shape, dtype):
        self.tid, self.shape, self.dtype = tid, shape, dtype


def _shares(sizes, ranks):
    """Largest tensor first, each to the rank that holds the fewest bytes so far."""
    held, owned = [0] * ranks, [[] for _ in range(ranks)]
    for tid in sorted(range(len(sizes)), key=lambda t: -sizes[t]):
        least = held.index(min(held))
        owned[least].append(tid)
        held[least] += sizes[tid]
    return owned


def _archive(path, payload):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)


def save_xser(filepath, numels):
    """One save of a model whose tensors hold ``numels`` float32 elements: this rank's share
    of the tensor files, and on rank 0 the .ckpt of references."""
    rank = parallel_state.get_data_parallel_rank()
    ranks = parallel_state.get_data_parallel_world_size()
    tensors = filepath + ".tensors"
    os.makedirs(tensors, exist_ok=True)
    mine = _shares([n * 4 for n in numels], ranks)[rank]
    for tid in mine:
        _archive(os.path.join(tensors, "tensor_%d.pt" % tid), bytes(numels[tid] * 4))
    if rank == 0:
        refs = [TensorReference(tid, (n,), "float32") for tid, n in enumerate(numels)]
        _archive(filepath, pickle.dumps(refs))
    return mine


def _optimizer_file(checkpoint, dp_rank):
    folder = os.path.join(os.path.dirname(checkpoint), "optim", "dp_rank_%03d" % dp_rank)
    return os.path.join(folder, os.path.basename(checkpoint).replace(
        ".ckpt", "-optimizer_states.ckpt"))


def _delete(checkpoint):
    if os.path.lexists(checkpoint):
        os.unlink(checkpoint)
    shutil.rmtree(checkpoint + ".tensors", ignore_errors=True)


def _remove_checkpoint_impl(checkpoint_filepath):
    """Upstream's rule: the .ckpt and its tensor folder go on data-parallel rank 0 only; each
    rank's own optimizer file on every rank."""
    dp_rank = parallel_state.get_data_parallel_rank()
    if dp_rank == 0:
        _delete(checkpoint_filepath)
    _delete(_optimizer_file(checkpoint_filepath, dp_rank))


def remove_checkpoint(filepath):
    """Synchronous, through the module's global, as the strategy calls it."""
    _remove_checkpoint_impl(filepath)
'''
TPU_BODY = '''
def _parse_tpu_cores(*a, **k):
    return "original"


_parse_tpu_cores_str = _tpu_cores_valid = _parse_tpu_cores


class TPUAccelerator:
    auto_device_count = is_available = staticmethod(_parse_tpu_cores)
'''


def write_packages(site: Path) -> None:
    """The stood-in packages (every module the layout imports from them) under ``site``."""
    wanted = _names_wanted()
    modules = {m for m in wanted if m.split(".")[0] in STOOD_IN}
    modules |= {REBINDS["module"], DATASET}
    bodies = {DATASET: DATASET_BODY, REBINDS["module"]: TPU_BODY, OVERRIDES: OVERRIDES_BODY
              + "\n".join(f"{n} = type({n!r}, (), {{}})" for n in sorted(wanted[OVERRIDES]))}
    packages = {".".join(m.split(".")[:depth]) for m in modules
                for depth in range(1, len(m.split(".")))}
    for package in packages:
        folder = site.joinpath(*package.split("."))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").touch()
    for module in sorted(modules):
        parts = module.split(".")
        body = bodies.get(module) or "\n".join(
            f"{n} = type({n!r}, (), {{}})" for n in sorted(wanted.get(module, ())))
        if module == FACTS["dataset_module"]["reached_through"][0]["module"]:
            body = "from %s import build_train_valid_test_datasets\n%s" % (DATASET, body)
        target = site.joinpath(*parts, "__init__.py") if module in packages else \
            site.joinpath(*parts[:-1], parts[-1] + ".py")
        target.write_text(body + "\n", encoding="utf-8")


def interpreter(root: Path) -> Path:
    """The stand-in image Python under ``root``; returns its bin folder."""
    venv = root / "image-python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    write_packages(site)
    own = sysconfig.get_paths()["purelib"]
    (site / "zz-jobgen-test-env.pth").write_text(f"import site; site.addsitedir({own!r})\n")
    (venv / "bin" / "torchrun").write_text(
        f"#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    (venv / "bin" / "neuron_parallel_compile").write_text(
        "#!/bin/sh\n# stand-in for Neuron's neuron_parallel_compile: runs its command\n"
        'exec "$@"\n')
    for tool in ("torchrun", "neuron_parallel_compile"):
        os.chmod(venv / "bin" / tool, 0o755)
    return venv / "bin"


def reports(text: str) -> list[dict[str, Any]]:
    """The stand-in program's reports in a log."""
    return [json.loads(line[line.index(REPORT) + len(REPORT):]) for line in text.splitlines()
            if REPORT in line]
