"""Runs NeMo's pretraining script (argv[1], then its arguments) on nodes that share no disk
(launch.sh uses it wherever JOBGEN_SHARED_FS=0): its GPT dataset's index files made on every
node where NeMo is given a model.data.index_mapping_dir (the design and why:
payload/common/node_indices.py), and each node's own tensor files of a pruned checkpoint
deleted (below).

The script starts as `python3 SCRIPT ARG...` starts it: the script's folder in place of this
file's at sys.path[0] (upstream's script imports its siblings lightning_neuron_patch and
checkpoint_conversion from there: jobgen/payloads/upstream/neuron_nemo_layout.json), __file__
its absolute path, sys.argv the script and its arguments, run as __main__. Nothing of this
wrapper stays on sys.path or in sys.modules under a name the script could import.

Before the script runs: on each node's local rank 0, index files built in advance beside the
data prefixes are linked into the index folder. NeMo's gpt_dataset module is not imported here:
a finder on sys.meta_path makes it build the missing files on each node's local rank 0 (its own
rendezvous then waits for all builders) once the script imports it, after the script's own
first imports (its lightning_neuron_patch rebinds Lightning functions before anything binds
them).

Pruning on such nodes: NeMo's checkpoint callback prunes through nlp_overrides'
_remove_checkpoint_impl, called on every rank; upstream's deletes the ``.ckpt`` and its
``.tensors`` folder on data-parallel rank 0 only, but with save_xser every data-parallel rank
writes its own share of the tensor files, each on its own node's disk, so the shares of the
other nodes would stay (and stay in the S3 prefix SageMaker mirrors each instance's disk to).
A second finder wraps it once NeMo imports that module (``prune_own``): a rank of another
data-parallel rank also deletes, of the pruned checkpoint's tensor folder, the files written on
its node during this pass (``JOBGEN_PASS_SINCE_NS``, set by launch.sh before the trainer
starts): each key has one owner, its writer; restored copies of another instance's files are
that instance's to delete.

`per_node_indices.py --check SCRIPT` (the image build: env/containers/build_check.py start)
starts the script the same way, the per-node build installed as on a node's local rank 0, but
under another name than __main__: its module-level imports run, its main does not, and the
check fails unless the script imported the dataset module and NeMo's overrides module and both
were patched.
"""
from __future__ import annotations

import builtins
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

HERE = os.path.dirname(os.path.realpath(__file__))
# neuronx-nemo-megatron's module that builds the index files (d22aabf): _build_index_mappings.
DATASET_MODULE = "nemo.collections.nlp.data.language_modeling.megatron.gpt_dataset"
# Its module whose _remove_checkpoint_impl deletes a pruned checkpoint (d22aabf, line 396).
OVERRIDES_MODULE = "nemo.collections.nlp.parts.nlp_overrides"
SINCE_ENV = "JOBGEN_PASS_SINCE_NS"
CHECK_NAME = "__jobgen_check__"
CONFIG_ERROR = 78


def _load_node_indices() -> Any:
    """payload/common/node_indices.py, loaded from its file under a private name: the payload
    root never goes on sys.path, and no `common` module is left for the script to find."""
    path = Path(HERE).parent / "common" / "node_indices.py"
    spec = importlib.util.spec_from_file_location("_jobgen_node_indices", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


node_indices = _load_node_indices()


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def override(args: list[str], key: str) -> str | None:
    """The last value given to Hydra override ``key`` (``key=...`` or ``+key=...``)."""
    found = None
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and name.lstrip("+") == key:
            found = value
    return found


def data_prefixes(value: str | None) -> list[str]:
    """The paths of ``model.data.data_prefix=[w1,path1,w2,path2,...]`` (weights dropped)."""
    if not value:
        return []
    items = [_unquote(item) for item in re.split(r",", value.strip().strip("[]")) if item.strip()]
    return [item for item in items[1::2] if item]


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then ``patch(module)``; everything else is the loader's."""

    def __init__(self, loader: Any, patch: Callable[[types.ModuleType], Any]) -> None:
        self._loader, self._patch = loader, patch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._patch(module)


class PatchOnImport(importlib.abc.MetaPathFinder):
    """A finder, first on sys.meta_path, for one module name: the finders after it find the
    module as they would, and the module is patched right after its own code ran, whoever
    imports it first. ``patched`` counts the patches."""

    def __init__(self, name: str, patch: Callable[[types.ModuleType], Any]) -> None:
        self.name, self.patch, self.patched = name, patch, 0

    def _after(self, module: types.ModuleType) -> None:
        self.patch(module)
        self.patched += 1

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self._after)
                return spec
        return None

    def install(self) -> PatchOnImport:
        sys.meta_path.insert(0, self)
        return self


def written_since(folder: Path, since_ns: int) -> list[Path]:
    """The files directly in ``folder`` last written at or after ``since_ns`` (epoch ns)."""
    found = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            if entry.is_file() and entry.stat().st_mtime_ns >= since_ns:
                found.append(entry)
        except OSError:
            continue
    return found


def prune_own(module: types.ModuleType, env: dict[str, str]) -> None:
    """Wrap ``module._remove_checkpoint_impl`` (NeMo's nlp_overrides): upstream's removal, then,
    on a rank of data-parallel rank above 0, the pruned checkpoint's tensor files written on
    this node since the pass started. The wrapper keeps upstream's name, so a background
    save's executor (forked) finds it by name as it found upstream's."""
    original = getattr(module, "_remove_checkpoint_impl", None)
    state = getattr(module, "parallel_state", None)
    if original is None or state is None:
        sys.stderr.write(f"per_node_indices.py: {module.__name__} has no _remove_checkpoint_impl "
                         "or parallel_state: not the neuronx-nemo-megatron release this payload "
                         "patches (jobgen/payloads/upstream/neuron_nemo.json)\n")
        sys.exit(CONFIG_ERROR)
    since = int(env.get(SINCE_ENV) or time.time_ns())

    @functools.wraps(original)
    def _remove_checkpoint_impl(checkpoint_filepath: Any) -> Any:
        result = original(checkpoint_filepath)
        if state.get_data_parallel_rank() != 0:
            folder = Path(f"{checkpoint_filepath}.tensors")
            for path in written_since(folder, since):
                path.unlink(missing_ok=True)
            try:
                folder.rmdir()          # only where nothing else is left in it
            except OSError:
                pass
        return result

    module._remove_checkpoint_impl = _remove_checkpoint_impl  # type: ignore[attr-defined]


def prepare(args: list[str], env: dict[str, str] | None = None) -> list[PatchOnImport]:
    """On nodes with disks of their own: install the prune of each node's own tensor files for
    when NeMo's overrides module is imported; where NeMo is told an index folder, link what was
    built in advance and install the per-node build for when NeMo's dataset module is imported.
    Returns the finders installed (none where the nodes share a disk)."""
    env = dict(os.environ) if env is None else env
    if not node_indices.per_node(env):
        return []
    finders = [PatchOnImport(OVERRIDES_MODULE, lambda module: prune_own(module, env)).install()]
    index_dir = override(args, "model.data.index_mapping_dir")
    if not index_dir or index_dir == "null":
        return finders
    index_dir = _unquote(index_dir)
    if str(env.get("LOCAL_RANK", "0") or "0") == "0":
        Path(index_dir).mkdir(parents=True, exist_ok=True)
        linked = node_indices.seed_prebuilt(
            data_prefixes(override(args, "model.data.data_prefix")), index_dir)
        if linked:
            print(f"jobgen: {len(linked)} index file(s) built in advance beside the data, "
                  f"linked into {index_dir}", file=sys.stderr, flush=True)
    return finders + [PatchOnImport(DATASET_MODULE,
                                    lambda module: node_indices.install(module, env)).install()]


def run_as_main(program: str, args: list[str], name: str = "__main__") -> None:
    """Run ``program`` as `python3 program args...` runs it (CPython's pymain_run_file): its
    folder (symbolic links resolved) in place of this file's at sys.path[0] (left alone where
    Python put none there: -P, -I, PYTHONSAFEPATH), its absolute path as __file__ and its
    code's file name, sys.argv[0] as given, a fresh module as sys.modules[name]."""
    if sys.path and sys.path[0] == HERE:
        sys.path[0] = os.path.dirname(os.path.realpath(program))
    path = os.path.abspath(program)
    loader = importlib.machinery.SourceFileLoader(name, path)
    code = loader.source_to_code(loader.get_data(path), path)
    module = types.ModuleType(name)
    module.__dict__.update(__file__=path, __cached__=None, __loader__=loader, __spec__=None,
                           __package__=None, __builtins__=builtins)
    sys.argv[:] = [program, *args]
    sys.modules[name] = module
    exec(code, module.__dict__)


def main() -> None:
    argv = sys.argv[1:]
    check = argv[:1] == ["--check"]
    if check:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: per_node_indices.py [--check] PROGRAM [ARG...]")
    program, args = argv[0], argv[1:]
    if not check:
        prepare(args)
        run_as_main(program, args)
        return
    leader = {node_indices.SHARED_FS_ENV: "0", "LOCAL_RANK": "0"}
    finders = [PatchOnImport(DATASET_MODULE, lambda m: node_indices.install(m, leader)).install(),
               PatchOnImport(OVERRIDES_MODULE, lambda m: prune_own(m, leader)).install()]
    run_as_main(program, args, CHECK_NAME)
    for finder, what in zip(finders, ("the per-node index build", "the prune of each node's "
                                      "own tensor files")):
        if finder.patched != 1:
            sys.exit(f"per_node_indices.py --check: {program} imported no {finder.name}: "
                     f"{what} would not be in place")
    print(f"per_node_indices.py --check: {program} imported; {DATASET_MODULE} patched at its "
          f"import; {OVERRIDES_MODULE} patched at its import", flush=True)


if __name__ == "__main__":
    main()
