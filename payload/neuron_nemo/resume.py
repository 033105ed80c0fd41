"""The checkpoint a NeMo training pass resumes from, and the old ones removed before it starts.

usage: resume.py CHECKPOINTS_DIR HYDRA_OVERRIDE...   (prints the path, or nothing)

Run once per node by the launcher (launch.sh) before the trainer starts, so nothing is writing
checkpoints while it looks. Every node reads the same files (a shared file system, or SageMaker's
restore of the whole prefix on every instance) and so makes the same choice.

Which one: the newest complete checkpoint by the step in NeMo's file name
(``...--step=400-consumed_samples=...ckpt``), not by modification time as NeMo's exp_manager
would (after a restore from S3 that is download time, and nodes could disagree). Complete means,
in every tensor/pipeline rank folder (``tp_rank_TT_pp_rank_PPP``, ``mp_rank_TT`` at PP 1):

- the ``.ckpt`` file is a whole torch zip archive (its central directory, written last, is there);
- with ``save_xser`` (neuronx-nemo-megatron's ``parts/serialization.py``), its
  ``<name>.ckpt.tensors`` folder holds ``tensor_<i>.pt`` for every tensor the ``.ckpt``
  references, each a whole archive, and nothing else (a foreign name is a temporary or a partial
  download). The ``.ckpt`` alone proves nothing: the data-parallel ranks write the tensor files
  in parallel and rank 0 may write the ``.ckpt`` before the others are done;
- with ZeRO-1 (``model.wrap_with_zero``), the same holds for every data-parallel rank's optimizer
  file under ``optim/dp_rank_DDD/``.
A checkpoint that fails any of these is not offered; the one before it is.

How many stay: NeMo's checkpoint callback (exp_manager ``NeMoModelCheckpoint``, with
``resume_if_exists``) counts the checkpoints it finds in the folder as its top k and deletes the
oldest as it saves new ones, but it cannot delete what an earlier allocation left beyond that
(its own clean-up counts each checkpoint ``model_parallel_size`` times and deletes only the
``.ckpt``, not its ``.tensors``), and the strategy never deletes the checkpoint the run resumed
from (``NLPDDPStrategy.remove_checkpoint``). So here, before the trainer starts, everything but
the newest ``keep - 1`` complete checkpoints is removed (incomplete ones, older ones, a ``-last``
copy of a kept step), and the launcher gives the callback a top k of ``keep - 1``: with the held
resumed one that is ``keep`` complete checkpoints at most, plus the one being written.
Tensor folders whose ``.ckpt`` is gone (another node's xser share of a checkpoint data-parallel
rank 0 deleted, restored from S3) go too, up to the resumed step (``orphans``).
"""
from __future__ import annotations

import pickle
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STEP = re.compile(r"(?:^|-)step=(\d+)")
RANK = re.compile(r"^(?:tp_rank_\d+_pp_rank_\d+|mp_rank_\d+)$")
TENSOR = re.compile(r"^tensor_(\d+)\.pt$")
TOP_K = "exp_manager.checkpoint_callback_params.save_top_k"
OPTIMIZER = "-optimizer_states"


def _value(overrides: list[str], key: str) -> str | None:
    for item in reversed(overrides):   # Hydra: the last one given wins
        name, _, value = item.partition("=")
        if name.lstrip("+") == key:
            return value.strip()
    return None


def _size(overrides: list[str], key: str) -> int:
    value = _value(overrides, key) or ""
    return max(1, int(value)) if value.isdigit() else 1


def _flag(overrides: list[str], key: str) -> bool:
    return (_value(overrides, key) or "").lower() == "true"


@dataclass(frozen=True)
class Layout:
    """What a complete checkpoint consists of, from the rendered overrides."""

    tp: int = 1
    pp: int = 1
    xser: bool = False
    dp: int = 0          # data-parallel ranks with their own optimizer file (ZeRO-1), else 0
    keep: int = 0        # the rendered top k (0: unknown, nothing removed)

    @classmethod
    def of(cls, overrides: list[str]) -> "Layout":
        tp = _size(overrides, "model.tensor_model_parallel_size")
        pp = _size(overrides, "model.pipeline_model_parallel_size")
        world = _size(overrides, "trainer.devices") * _size(overrides, "trainer.num_nodes")
        dp = world // (tp * pp) if _flag(overrides, "model.wrap_with_zero") else 0
        keep = _value(overrides, TOP_K) or ""
        return cls(tp, pp, _flag(overrides, "model.save_xser"), dp,
                   int(keep) if keep.isdigit() else 0)


def rank_folders(tp: int, pp: int) -> list[str]:
    """The folders NeMo saves model-parallel ranks into (none for a single rank), TP-major:
    ``mp_rank_TT`` without pipeline stages, as inject_model_parallel_rank (nemo/utils/
    model_utils.py, d22aabf) names them, else ``tp_rank_TT_pp_rank_PPP``."""
    if tp * pp == 1:
        return []
    if pp == 1:
        return [f"mp_rank_{t:02d}" for t in range(tp)]
    return [f"tp_rank_{t:02d}_pp_rank_{p:03d}" for t in range(tp) for p in range(pp)]


class Stub:
    """Whatever class a pickle names, so a checkpoint's references are read without torch."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "Stub":
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass


class _References(pickle.Unpickler):
    """Counts the TensorReference objects xser's ``.ckpt`` holds in place of its tensors."""

    SAFE = {"builtins", "collections"}

    def __init__(self, handle: Any) -> None:
        super().__init__(handle)
        self.count = 0

    def find_class(self, module: str, name: str) -> Any:
        if module in self.SAFE and name not in ("eval", "exec", "__import__", "getattr"):
            return super().find_class(module, name)
        if name == "TensorReference":
            unpickler = self

            class Reference(Stub):
                def __new__(cls, *args: Any, **kwargs: Any) -> "Stub":
                    unpickler.count += 1
                    return object.__new__(cls)
            return Reference
        if module == "copyreg" and name == "_reconstructor":
            return lambda cls, base, state: cls()
        return type(name, (Stub,), {})

    def persistent_load(self, pid: Any) -> None:
        return None


def _references(path: Path) -> int | None:
    """How many tensors an xser ``.ckpt`` references; None if its pickle cannot be read here."""
    try:
        with zipfile.ZipFile(path) as archive:
            member = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            with archive.open(member) as handle:
                reader = _References(handle)
                reader.load()
                return reader.count
    except Exception:   # noqa: BLE001  (any pickle this stand-in cannot follow)
        return None


def file_complete(path: Path, xser: bool) -> bool:
    """A NeMo checkpoint file (and with xser its tensor folder) written or restored in full."""
    if not path.is_file() or not zipfile.is_zipfile(path):
        return False
    if not xser:
        return True
    folder = path.with_name(path.name + ".tensors")
    if not folder.is_dir():
        return False
    ids = set()
    for entry in folder.iterdir():
        match = TENSOR.match(entry.name)
        if not match or not entry.is_file():
            return False
        ids.add(int(match.group(1)))
    wanted = _references(path)
    if wanted is None:          # unreadable references: at least one tensor file must be there
        return bool(ids) and all(zipfile.is_zipfile(folder / f"tensor_{i}.pt") for i in ids)
    return ids == set(range(wanted)) and all(
        zipfile.is_zipfile(folder / f"tensor_{i}.pt") for i in ids)


def optimizer_name(name: str) -> str:
    """The ZeRO-1 optimizer file's name for a checkpoint (NeMo's
    _get_zero1_optimizer_states_filepath)."""
    if name.endswith("-last.ckpt"):
        return name[:-len("-last.ckpt")] + OPTIMIZER + "-last.ckpt"
    return name[:-len(".ckpt")] + OPTIMIZER + ".ckpt"


@dataclass(frozen=True)
class Unit:
    """One checkpoint: its file name, in every folder it needs."""

    name: str
    step: int
    folders: tuple[Path, ...]

    @property
    def last(self) -> bool:
        return self.name.endswith("-last.ckpt")


def units(root: Path, layout: Layout) -> list[Unit]:
    """Every checkpoint name found, newest step first (a step's top-k file before its -last)."""
    expected = [root / name for name in rank_folders(layout.tp, layout.pp)]
    # One rank: NeMo saves in the folder itself; a single-rank folder is read too.
    look = expected or [root] + sorted(p for p in root.glob("*") if RANK.match(p.name))
    found: dict[str, list[Path]] = {}
    for folder in look:
        if folder.is_dir():
            for path in sorted(folder.glob("*.ckpt")):
                if STEP.search(path.name):
                    found.setdefault(path.name, []).append(folder)
    out = [Unit(name, int(STEP.search(name).group(1)),  # type: ignore[union-attr]
                tuple(expected) if expected else (folders[0],))
           for name, folders in found.items()]
    return sorted(out, key=lambda u: (u.step, not u.last, u.name), reverse=True)


def complete(unit: Unit, layout: Layout) -> bool:
    for folder in unit.folders:
        if not file_complete(folder / unit.name, layout.xser):
            return False
        for dp in range(layout.dp):
            optim = folder / "optim" / f"dp_rank_{dp:03d}" / optimizer_name(unit.name)
            if not file_complete(optim, layout.xser):
                return False
    return True


def remove(root: Path, unit: Unit) -> None:
    """A checkpoint's files in every folder that holds any (another node may remove them too)."""
    folders = {root, *unit.folders, *(p for p in root.glob("*") if RANK.match(p.name))}
    for folder in folders:
        paths = [folder / unit.name]
        paths += sorted(folder.glob(f"optim/dp_rank_*/{optimizer_name(unit.name)}"))
        for path in paths:
            shutil.rmtree(path.with_name(path.name + ".tensors"), ignore_errors=True)
            path.unlink(missing_ok=True)


def orphans(root: Path, below: int) -> list[Path]:
    """Tensor folders (``<name>.ckpt.tensors``, the model's or a ZeRO-1 optimizer file's) whose
    ``.ckpt`` is gone, of a step at most ``below``. xser's data-parallel ranks write them beside
    the file only data-parallel rank 0 writes and deletes: where the nodes keep their own disks
    (SageMaker), another node's share outlives the checkpoint. A step after ``below`` is left:
    training from the resumed step saves it again, into the same names."""
    found = []
    for folder in [root, *sorted(p for p in root.glob("*") if RANK.match(p.name))]:
        for tensors in [*folder.glob("*.ckpt.tensors"),
                        *folder.glob("optim/dp_rank_*/*.ckpt.tensors")]:
            step = STEP.search(tensors.name)
            if (tensors.is_dir() and step and int(step.group(1)) <= below
                    and not tensors.with_name(tensors.name[:-len(".tensors")]).exists()):
                found.append(tensors)
    return sorted(found)


def plan(root: Path, layout: Layout, hold: int) -> tuple[list[Unit], list[Unit]]:
    """The newest ``hold`` complete checkpoints of distinct steps (newest first), and the rest."""
    kept: list[Unit] = []
    rest: list[Unit] = []
    for unit in units(root, layout):
        if (len(kept) < hold and all(k.step != unit.step for k in kept)
                and complete(unit, layout)):
            kept.append(unit)
        else:
            rest.append(unit)
    return kept, rest


def choose(root: Path, tp: int, pp: int, xser: bool = False) -> Path | None:
    """The newest complete checkpoint's path, without the rank folder (NeMo adds it per rank)."""
    kept, _ = plan(root, Layout(tp, pp, xser), 1)
    return (root / kept[0].name) if kept else None


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: resume.py CHECKPOINTS_DIR HYDRA_OVERRIDE...", file=sys.stderr)
        return 2
    root, layout = Path(argv[0]), Layout.of(argv[1:])
    # keep - 1 stay beside the one NeMo will hold for resuming; with no top k known, one. With
    # ZeRO-1 the callback does not take over the old ones (resume_if_exists is off: its restore
    # counts each rank's optimizer file as a checkpoint): only the resumed one stays.
    kept, rest = plan(root, layout, 1 if layout.dp else max(1, layout.keep - 1))
    if layout.keep:
        for unit in rest:
            print(f"resume.py: removing {unit.name} (not among the newest {len(kept) or 'no'} "
                  "complete checkpoints kept)", file=sys.stderr)
            remove(root, unit)
        for folder in orphans(root, kept[0].step if kept else -1):
            print(f"resume.py: removing {folder.relative_to(root)} (its checkpoint file is gone)",
                  file=sys.stderr)
            shutil.rmtree(folder, ignore_errors=True)
    if kept:
        print(root / kept[0].name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
