"""NeMo's checkpoints across allocations: which one a run resumes from, and how many stay.

payload/neuron_nemo/resume.py chooses the newest complete checkpoint (every rank folder's
``.ckpt`` a whole archive, and with xser its ``.ckpt.tensors`` holding every tensor it
references) and removes all but the newest ``keep - 1`` before the trainer starts; the launcher
gives NeMo's checkpoint callback a top k of ``keep - 1`` (it also holds the checkpoint it resumed
from). NeMo LLM cannot be imported here, so ``NemoCheckpointing`` below is a stand-in, written for
this test, that does what neuronx-nemo-megatron d22aabf and its pytorch-lightning 1.8.6 do with
the files (the sources it follows are cited at each step). Over several allocations, each killed
at a random point (also in the middle of a save, and between a save and its deletion), no more
than ``keep`` complete checkpoints are ever on disk besides the one being written, and every
allocation resumes from the newest complete one. The same stand-in with the overrides as they
were (no resume_if_exists, no clean-up) keeps every allocation's checkpoints: the check can fail.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Optional

import pytest

from jobgen import api, payloads
from jobgen.plumbing import resources

ROOT = Path(__file__).resolve().parent.parent
NAME = "megatron_neox--step={}-consumed_samples={}.0.ckpt"
TENSORS = 4          # tensors each rank's checkpoint file references


def _resume() -> Any:
    path = ROOT / "payload" / "neuron_nemo" / "resume.py"
    spec = importlib.util.spec_from_file_location("nemo_resume", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module     # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


resume = _resume()


class TensorReference:
    """What NeMo's xser (parts/serialization.py) pickles in place of each tensor."""

    def __init__(self, tid: int) -> None:
        self.tid, self.shape, self.dtype = tid, (2, 2), None


def _archive(path: Path, payload: Any) -> None:
    """A torch.save-style zip archive (archive/data.pkl), written without torch."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))


def write_ckpt(path: Path, tensors: int = TENSORS, ckpt_first: bool = False,
               written: Optional[int] = None) -> None:
    """One rank's xser checkpoint file: its tensor files (``written`` of them), then the .ckpt
    (rank 0 writes it after its own share; the other data-parallel ranks may still be writing,
    ``ckpt_first``)."""
    folder = path.with_name(path.name + ".tensors")
    folder.mkdir(parents=True, exist_ok=True)
    count = tensors if written is None else written
    if ckpt_first:
        _archive(path, {"state_dict": {f"w{i}": TensorReference(i) for i in range(tensors)}})
    for tid in range(count):
        _archive(folder / f"tensor_{tid}.pt", [tid])
    if not ckpt_first:
        _archive(path, {"state_dict": {f"w{i}": TensorReference(i) for i in range(tensors)},
                        "global_step": 1})


def test_the_step_in_the_name_decides_and_every_rank_folder_must_hold_it(
        tmp_path: Path, capsys: Any) -> None:
    # One model-parallel rank: no rank folder; the step in the name decides, not the listing.
    for step in (90, 100, 1000):
        write_ckpt(tmp_path / NAME.format(step, step * 8))
    assert resume.choose(tmp_path, 1, 1, xser=True) == tmp_path / NAME.format(1000, 8000)
    # TP 2 x PP 2: step 300 is in three of the four rank folders only.
    root = tmp_path / "tp"
    folders = resume.rank_folders(2, 2)
    assert folders[1] == "tp_rank_00_pp_rank_001"
    for folder in folders:
        write_ckpt(root / folder / NAME.format(200, 1600))
    for folder in folders[:-1]:
        write_ckpt(root / folder / NAME.format(300, 2400))
    assert resume.main([str(root), "model.tensor_model_parallel_size=2",
                        "model.pipeline_model_parallel_size=2", "+model.save_xser=True"]) == 0
    assert capsys.readouterr().out.strip() == str(root / NAME.format(200, 1600))
    assert resume.choose(tmp_path / "none", 2, 2) is None


def test_a_checkpoint_counts_only_with_every_tensor_it_references(tmp_path: Path) -> None:
    folders = resume.rank_folders(2, 1)
    for step in (100, 200):
        for folder in folders:
            write_ckpt(tmp_path / folder / NAME.format(step, step * 8))
    newest = tmp_path / folders[1] / NAME.format(200, 1600)
    assert resume.choose(tmp_path, 2, 1, xser=True) == tmp_path / NAME.format(200, 1600)
    tensors = newest.with_name(newest.name + ".tensors")
    breakages = {
        "a tensor missing (another data-parallel rank still writing)":
            lambda: (tensors / "tensor_3.pt").unlink(),
        "a tensor file cut short": lambda: (tensors / "tensor_0.pt").write_bytes(b"PK\x03\x04"),
        "a download's temporary": lambda: (tensors / ".tensor_1.pt.5f2a").write_bytes(b""),
        "the tensors folder missing": lambda: shutil.rmtree(tensors),
        "the .ckpt cut short": lambda: newest.write_bytes(newest.read_bytes()[:40]),
        "the .ckpt missing": lambda: newest.unlink(),
    }
    for why, breaking in breakages.items():
        backup = tmp_path.parent / "backup"
        shutil.rmtree(backup, ignore_errors=True)
        shutil.copytree(tmp_path / folders[1], backup)
        breaking()
        assert resume.choose(tmp_path, 2, 1, xser=True) == tmp_path / NAME.format(100, 800), why
        shutil.rmtree(tmp_path / folders[1])
        shutil.copytree(backup, tmp_path / folders[1])
    # Without xser a whole .ckpt archive is the checkpoint.
    assert resume.choose(tmp_path, 2, 1, xser=False) == tmp_path / NAME.format(200, 1600)


def test_the_reference_count_is_read_from_what_torch_itself_saved(tmp_path: Path) -> None:
    """torch.save's own archive of references (as xser's rank 0 writes it) is read without torch
    being imported by resume.py."""
    torch = pytest.importorskip("torch")
    path = tmp_path / NAME.format(10, 80)
    refs = {"state_dict": {f"w{i}": TensorReference(i) for i in range(3)},
            "optimizer_states": [{"state": {0: {"step": TensorReference(3)}}}],
            "hyper_parameters": {"cfg": {"save_xser": True}}, "global_step": 10}
    torch.save(refs, path)
    assert resume._references(path) == 4
    folder = tmp_path / (path.name + ".tensors")
    folder.mkdir()
    for tid in range(4):
        torch.save(torch.zeros(2), folder / f"tensor_{tid}.pt")
    assert resume.file_complete(path, xser=True)
    (folder / "tensor_2.pt").unlink()
    assert not resume.file_complete(path, xser=True)


def test_zero1_optimizer_files_belong_to_the_checkpoint(tmp_path: Path) -> None:
    name = NAME.format(300, 2400)
    layout = resume.Layout(tp=2, pp=1, xser=True, dp=2, keep=3)
    for folder in resume.rank_folders(2, 1):
        write_ckpt(tmp_path / folder / name)
        for dp in range(2):
            write_ckpt(tmp_path / folder / "optim" / f"dp_rank_{dp:03d}" /
                       resume.optimizer_name(name))
    unit = resume.units(tmp_path, layout)[0]
    assert resume.complete(unit, layout)
    shutil.rmtree(tmp_path / "mp_rank_01" / "optim" / "dp_rank_001")
    assert not resume.complete(unit, layout)
    resume.remove(tmp_path, unit)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


# --- NeMo's checkpoint callback, as d22aabf and pytorch-lightning 1.8.6 run it ----------------

def inject(tp_rank: int, pp_rank: int, tp: int, pp: int) -> str:
    """The rank folder nemo/utils/model_utils.py inject_model_parallel_rank (d22aabf L598-617)
    saves a rank into: none for one rank, ``mp_rank_TT`` without pipeline stages, else
    ``tp_rank_TT_pp_rank_PPP`` (written here from upstream, not from resume.py)."""
    if tp * pp <= 1:
        return ""
    if pp == 1:
        return f"mp_rank_{tp_rank:02d}"
    return f"tp_rank_{tp_rank:02d}_pp_rank_{pp_rank:03d}"


FOLDERS = [inject(t, 0, 2, 1) for t in range(2)]      # TP 2 x PP 1: model_parallel_size 2


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (8, 1), (2, 2), (8, 4), (1, 4)])
def test_resume_looks_in_the_folders_nemo_saves_each_rank_into(tp: int, pp: int) -> None:
    """pythia6.9b (TP 8, PP 1) saves into mp_rank_TT: resume.py once looked for
    tp_rank_TT_pp_rank_000 there and never found a checkpoint to resume from."""
    want = [inject(t, p, tp, pp) for t in range(tp) for p in range(pp)]
    assert resume.rank_folders(tp, pp) == [w for w in want if w]


def uninject(path: str) -> str:
    """nemo/utils/model_utils.py uninject_model_parallel_rank (d22aabf L587-595)."""
    if "mp_rank" in path or "tp_rank" in path:
        return os.path.join(os.path.dirname(os.path.dirname(path)), os.path.basename(path))
    return path


class NemoCheckpointing:
    """NeMoModelCheckpoint with Lightning's ModelCheckpoint top k and NLPDDPStrategy's removal,
    monitor "step", mode "max", save_last off."""

    def __init__(self, dirpath: Path, save_top_k: int, n_resume: bool,
                 restore_path: Optional[str], dp: int = 0) -> None:
        self.dirpath, self.save_top_k, self.monitor = str(dirpath), save_top_k, "step"
        self.dp = dp                               # ZeRO-1: each dp rank's optimizer file
        self.restore_path = restore_path           # cfg.model.resume_from_checkpoint
        self.model_parallel_size = len(FOLDERS)    # the config's ${multiply:tp, pp}
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        # exp_manager.py L787-789: only with n_resume (resume_if_exists) and a finite top k.
        if self.save_top_k != -1 and n_resume:
            self.nemo_topk_check_previous_run()

    def nemo_topk_check_previous_run(self) -> None:
        """exp_manager.py L791-839."""
        for found in Path(self.dirpath).rglob("*.ckpt"):
            checkpoint = str(found)
            if "mp_rank" in checkpoint or "tp_rank" in checkpoint:
                checkpoint = uninject(checkpoint)
            if checkpoint[-10:] == "-last.ckpt":
                continue
            index = checkpoint.find(self.monitor) + len(self.monitor) + 1
            match = re.search("[A-z]", checkpoint[index:])
            if match:
                self.best_k_models[checkpoint] = float(
                    checkpoint[index:index + match.start() - 1])
        if not self.best_k_models:
            return
        best = sorted(self.best_k_models, key=self.best_k_models.get, reverse=True)   # max
        for _ in range(len(best) - self.model_parallel_size * self.save_top_k):
            model = best.pop(-1)
            self.best_k_models.pop(model)
            # _del_model_without_trainer (L958-977): AppState's model_parallel_size is set when
            # the model is built, after exp_manager: the path keeps no rank folder, and only the
            # file would go. Nothing is there to remove.
            Path(model).unlink(missing_ok=True)
        self.kth_best_model_path = best[-1]

    def save(self, step: int, write: Any) -> None:
        """ModelCheckpoint.check_monitor_top_k (L470-487) and _update_best_and_save (L664-704)."""
        k = self.save_top_k
        if len(self.best_k_models) >= k and step <= self.best_k_models[self.kth_best_model_path]:
            return
        delete = None
        if len(self.best_k_models) == k and k > 0:
            delete = self.kth_best_model_path
            self.best_k_models.pop(delete)
        filepath = os.path.join(self.dirpath, NAME.format(step, step * 8))
        self.best_k_models[filepath] = float(step)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = min(self.best_k_models, key=self.best_k_models.get)
        write(filepath)                     # the save; an allocation may end inside it
        if delete is not None and filepath != delete:
            self.remove_checkpoint(delete)

    def remove_checkpoint(self, filepath: str) -> None:
        """NLPDDPStrategy.remove_checkpoint (nlp_overrides.py L1501-1506): never the restore path;
        _remove_checkpoint_impl (L378-403): the file and its .tensors, per rank, and each dp
        rank's optimizer file."""
        if self.restore_path and uninject(filepath) == uninject(self.restore_path):
            return
        name = os.path.basename(filepath)
        for folder in FOLDERS:
            paths = [Path(self.dirpath, folder, name)] + [
                Path(self.dirpath, folder, "optim", f"dp_rank_{dp:03d}",
                     resume.optimizer_name(name)) for dp in range(self.dp)]
            for path in paths:
                path.unlink(missing_ok=True)
                shutil.rmtree(path.with_name(path.name + ".tensors"), ignore_errors=True)


class Killed(Exception):
    pass


def _complete_steps(root: Path, dp: int = 0) -> set[int]:
    """The steps whose every rank holds every tensor file (what a load would need)."""
    layout = resume.Layout(2, 1, True, dp)
    return {unit.step for unit in resume.units(root, layout) if resume.complete(unit, layout)}


def _steps_on_disk(root: Path) -> set[int]:
    return {int(m.group(1)) for p in root.rglob("*") if (m := resume.STEP.search(p.name))}


def _allocations(root: Path, keep: int, fixed: bool, seed: int, count: int,
                 zero1: bool = False, n_resume: Optional[bool] = None) -> tuple[int, int]:
    """``count`` allocations of one run; returns the most complete checkpoints seen at once
    besides the one being written, and the most steps with files on disk at an allocation's
    end. Asserts that each allocation resumes from the newest complete one.
    ``n_resume``: resume_if_exists as rendered (on, except with ZeRO-1) unless given."""
    rng = random.Random(seed)
    dp = 2 if zero1 else 0
    rendered = ["model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=1",
                "+model.save_xser=True", f"{resume.TOP_K}={keep}", "trainer.devices=4",
                f"model.wrap_with_zero={zero1}"]
    if n_resume is None:
        n_resume = fixed and not zero1
    step, most, resumed, piled = 0, 0, 0, 0
    for _ in range(count):
        newest = max(_complete_steps(root, dp), default=None)
        if fixed:   # launch.sh: resume.py, then a top k of keep - 1 when resuming
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
                assert resume.main([str(root), *rendered]) == 0
            chosen = printed.getvalue().strip() or None
            top_k = keep - 1 if chosen else keep
        else:       # as before: resume.py chose, no resume_if_exists, top k = keep
            found = resume.choose(root, 2, 1, xser=True)
            chosen, top_k = (str(found) if found else None), keep
        assert (chosen is None) == (newest is None)
        if chosen is not None:
            assert resume.STEP.search(chosen).group(1) == str(newest)   # type: ignore[union-attr]
            step, resumed = newest, resumed + 1
        callback = NemoCheckpointing(root, top_k, n_resume, restore_path=chosen, dp=dp)
        ends_after = rng.randint(1, 3 * keep)        # saves until the allocation ends
        try:
            for save in range(ends_after + 1):
                step += 100
                last = save == ends_after
                how = rng.choice(["mid-save", "ckpt-before-others", "before-delete", "between"])

                def write(filepath: str, last: bool = last, how: str = how) -> None:
                    name = os.path.basename(filepath)
                    for i, folder in enumerate(FOLDERS):
                        for rank in range(dp):
                            write_ckpt(root / folder / "optim" / f"dp_rank_{rank:03d}" /
                                       resume.optimizer_name(name))
                        partial = last and how in ("mid-save", "ckpt-before-others") and i == 1
                        write_ckpt(root / folder / name, ckpt_first=how == "ckpt-before-others",
                                   written=rng.randint(0, TENSORS - 1) if partial else None)
                    if last and how in ("mid-save", "ckpt-before-others"):
                        raise Killed
                    complete = _complete_steps(root, dp) - {
                        int(resume.STEP.search(name).group(1))}  # type: ignore[union-attr]
                    nonlocal most
                    most = max(most, len(complete))
                    if last and how == "before-delete":
                        raise Killed

                if last and how == "between":
                    raise Killed
                callback.save(step, write)
                most = max(most, len(_complete_steps(root, dp)))
        except Killed:
            pass
        piled = max(piled, len(_steps_on_disk(root)))
    assert resumed == count - 1    # each allocation saved something the next resumed from
    return most, piled


@pytest.mark.parametrize("seed", range(3))
def test_keep_holds_across_allocations_with_nemos_callback(tmp_path: Path, seed: int) -> None:
    keep = 2 + seed % 2
    most, piled = _allocations(tmp_path, keep, fixed=True, seed=seed, count=4)
    # Nothing else piles up either: at most keep steps and the one being written have files.
    assert most <= keep and piled <= keep + 1


@pytest.mark.parametrize("seed", range(2))
def test_keep_holds_with_zero1_optimizer_files(tmp_path: Path, seed: int) -> None:
    """With ZeRO-1 resume_if_exists stays off (see the next test): only the resumed checkpoint
    is kept at the start, and the callback's top k of keep - 1 rolls beside it."""
    most, piled = _allocations(tmp_path, 3, fixed=True, seed=seed, count=4, zero1=True)
    assert most <= 3 and piled <= 4


def test_with_zero1_nemos_restore_would_stop_deleting(tmp_path: Path) -> None:
    """Why: the callback's restore counts each rank folder's optimizer file as a checkpoint of
    its own (uninject keeps their optim/ folder), so its top k never fills to exactly k again
    and Lightning deletes nothing for the rest of the allocation."""
    most, _ = _allocations(tmp_path, 3, fixed=True, seed=1, count=4, zero1=True, n_resume=True)
    assert most > 3


def test_without_the_fix_every_allocation_keeps_its_own(tmp_path: Path) -> None:
    assert _allocations(tmp_path, 3, fixed=False, seed=1, count=4)[0] > 3


def test_the_launcher_resumes_with_a_top_k_of_keep_minus_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """launch.sh as it runs, with node_launch replaced by one that writes its arguments."""
    monkeypatch.chdir(tmp_path)
    s = api.job_spec("neox20b", 1, site="local", backend="slurm")
    train = payloads.for_spec(s, "slurm").train_args
    assert "exp_manager.resume_if_exists=True" in train
    assert "exp_manager.checkpoint_callback_params.save_last=False" in train
    payload = tmp_path / "payload"
    shutil.copytree(resources.folder("payload") / "neuron_nemo", payload / "neuron_nemo")
    (payload / "common").mkdir()
    (payload / "common" / "node_launch.sh").write_text(
        'JOBGEN_CONFIG_ERROR=78\nnode_say() { :; }\n'
        'node_launch() { printf "%s\\n" "$@" > "$ARGS_OUT"; }\n')
    run = tmp_path / "run"
    tp = next(a for a in train if a.startswith("model.tensor_model_parallel_size="))
    folders = resume.rank_folders(int(tp.split("=")[1]), 4)
    for step in (200, 400, 600, 800):
        for folder in folders:
            write_ckpt(run / "nemo" / "checkpoints" / folder / NAME.format(step, step * 8))
    env = {**os.environ, "JOBGEN_RUN_DIR": str(run), "JOBGEN_NODE_RANK": "1",
           "JOBGEN_WORKDIR": str(tmp_path), "ARGS_OUT": str(tmp_path / "args")}
    proc = subprocess.run(["bash", str(payload / "neuron_nemo" / "launch.sh"), "train", *train],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "args").read_text().splitlines()
    path = str(run / "nemo" / "checkpoints" / NAME.format(800, 6400))
    assert f"model.resume_from_checkpoint='{path}'" in args
    assert f"+exp_manager.explicit_ckpt_path='{path}'" in args
    assert "exp_manager.checkpoint_callback_params.save_top_k=2" in args
    assert "exp_manager.checkpoint_callback_params.save_top_k=3" not in args
    assert _steps_on_disk(run / "nemo" / "checkpoints") == {600, 800}
    assert "removing" in proc.stderr


def test_keep_1_is_refused() -> None:
    from jobgen.plumbing.errors import ConfigError
    with pytest.raises(ConfigError, match="keeps at least 2"):
        api.job_spec("neox20b", 1, site="local", backend="slurm",
                     overrides=("checkpoint.keep=1",))


def test_zero1_renders_without_resume_if_exists() -> None:
    def train(*overrides: str) -> list[str]:
        s = api.job_spec("neox20b", 1, site="local", backend="slurm", overrides=overrides)
        return list(payloads.for_spec(s, "slurm").train_args)
    assert "exp_manager.resume_if_exists=True" in train()
    zero1 = train("parallelism.zero1=true")
    assert "exp_manager.resume_if_exists=False" in zero1 and "model.wrap_with_zero=True" in zero1


def test_tensor_folders_whose_checkpoint_is_gone_are_removed_up_to_the_resumed_step(
        tmp_path: Path, capsys: Any) -> None:
    """xser: every data-parallel rank writes its share of a checkpoint's tensor files, and only
    data-parallel rank 0 writes and deletes the .ckpt (nlp_overrides.py _remove_checkpoint_impl,
    d22aabf L396-402). Where a data-parallel group spans nodes that keep their own disks, the
    other nodes' shares outlive the checkpoint, and a restore brings them back to every node."""
    folders = resume.rank_folders(2, 1)
    for step in (100, 200, 300):
        for folder in folders:
            write_ckpt(tmp_path / folder / NAME.format(step, step * 8))
    for step in (50, 400):      # shares left behind: tensor files, no .ckpt
        for folder in folders:
            write_ckpt(tmp_path / folder / NAME.format(step, step * 8))
            (tmp_path / folder / NAME.format(step, step * 8)).unlink()
    optim = tmp_path / folders[0] / "optim" / "dp_rank_001"
    write_ckpt(optim / resume.optimizer_name(NAME.format(60, 480)))
    (optim / resume.optimizer_name(NAME.format(60, 480))).unlink()
    assert resume.main([str(tmp_path), "model.tensor_model_parallel_size=2",
                        "+model.save_xser=True", f"{resume.TOP_K}=3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / NAME.format(300, 2400))
    # Step 100 went with its files (not among the newest 2), the orphans of steps 50 and 60
    # with it; step 400's share stays: training from step 300 saves it again, into its names.
    assert _steps_on_disk(tmp_path) == {200, 300, 400}
    for folder in folders:
        assert sorted(p.name for p in (tmp_path / folder).glob("*.tensors")) == [
            NAME.format(s, s * 8) + ".tensors" for s in (200, 300, 400)]
    assert not list(optim.iterdir())
