"""Unit tests for payload/common: schedule, events, checkpoint bookkeeping, launch helpers."""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import types
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

PAYLOAD = Path(__file__).resolve().parents[1] / "payload"
if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from common import checkpoints, loop
from common.events import (
    EventLog,
    format_event,
    open_tensorboard,
    read_events,
    to_tensorboard,
)
from common.runtime import (
    PayloadError,
    batch_positions,
    ensure_process_env,
    free_port,
    run_main,
    step_seed,
)
from common.schedule import learning_rate, steps_from_proportion

# ---------------------------------------------------------------------------------- schedule


def lr(step: int, **kw: Any) -> float:
    params: dict[str, Any] = {"peak_lr": 1.0, "max_steps": 100, "warmup_steps": 10,
                              "constant_steps": 20}
    params.update(kw)
    return learning_rate(step, **params)


def test_warmup_ramps_from_peak_over_w_to_peak() -> None:
    assert lr(0) == pytest.approx(0.1)
    assert lr(4) == pytest.approx(0.5)
    assert lr(9) == pytest.approx(1.0)


def test_hold_is_constant_until_warmup_plus_constant() -> None:
    assert lr(10) == lr(29) == 1.0


def test_linear_decay_reaches_floor_at_max_steps() -> None:
    assert lr(30) == pytest.approx(1.0)          # decay starts at the peak
    assert lr(65) == pytest.approx(0.5)          # half way through the 70 decay steps
    assert lr(99) == pytest.approx(1 / 70)       # the last update still moves
    assert lr(100) == 0.0
    assert lr(500) == 0.0


def test_min_lr_and_cosine_shape() -> None:
    assert lr(100, min_lr=0.1) == pytest.approx(0.1)
    assert lr(65, min_lr=0.1) == pytest.approx(0.55)
    assert lr(65, decay="cosine") == pytest.approx(0.5)
    assert lr(48, decay="cosine") > lr(48)  # cosine stays high longer, then falls faster
    assert lr(90, decay="cosine") < lr(90)


def test_no_warmup_starts_at_peak() -> None:
    assert lr(0, warmup_steps=0, constant_steps=0) == 1.0
    assert lr(50, warmup_steps=0, constant_steps=0) == pytest.approx(0.5)


def test_bert_1p5b_proportions_to_steps() -> None:
    # REFERENCE.md §3.1: MAX_STEPS 155000, WARMUP 0.05, CONST 0.25.
    assert steps_from_proportion(0.05, 155_000) == 7_750
    assert steps_from_proportion(0.25, 155_000) == 38_750
    with pytest.raises(ValueError):
        steps_from_proportion(1.5, 10)


def test_schedule_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        lr(-1)
    with pytest.raises(ValueError):
        lr(1, decay="step")


# ---------------------------------------------------------------------------------- events


def test_event_line_is_one_json_object_with_event_first() -> None:
    line = format_event("step", step=3, loss=float("nan"), lr=1e-3)
    assert "\n" not in line
    assert line.startswith('{"event": "step"')
    assert json.loads(line) == {"event": "step", "step": 3, "loss": None, "lr": 1e-3}


def test_event_log_rank0_only_and_metrics_file(tmp_path: Path, capsys: Any) -> None:
    metrics = tmp_path / "metrics.jsonl"
    EventLog(1, metrics).emit("step", step=1)
    EventLog(0, metrics).emit("step", step=1)
    EventLog(0, metrics).emit("done", step=1)
    out = capsys.readouterr().out
    assert [e["event"] for e in read_events(out)] == ["step", "done"]
    assert [json.loads(x)["event"] for x in metrics.read_text().splitlines()] == ["step", "done"]


def untimed(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "time"}


def test_emitted_events_carry_their_time_last(capsys: Any) -> None:
    before = datetime.now(timezone.utc)
    EventLog(0).emit("step", step=1)
    (event,) = read_events(capsys.readouterr().out)
    assert list(event) == ["event", "step", "time"]
    stamp = datetime.fromisoformat(event["time"])
    assert stamp.tzinfo is not None and stamp.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=1) <= stamp <= datetime.now(timezone.utc)


def test_read_events_skips_library_noise() -> None:
    text = 'warning: x\n{"event": "step", "step": 1}\n{"event": broken\n[INFO] y\n'
    assert read_events(text) == [{"event": "step", "step": 1}]


# ---------------------------------------------------------------------------------- checkpoints


def make_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    directory = checkpoints.prepare_save_dir(root, step)
    (directory / "weights.pt").write_text("w")
    if complete:
        checkpoints.mark_complete(root, step, {"consumed_samples": step * 8})
    return directory


def test_newest_complete_ignores_incomplete_and_foreign(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    make_checkpoint(root, 3)
    make_checkpoint(root, 6)
    make_checkpoint(root, 9, complete=False)            # crashed mid-save
    bad = make_checkpoint(root, 12, complete=False)
    (bad / checkpoints.MARKER).write_text("{not json")   # torn marker
    wrong = make_checkpoint(root, 15, complete=False)
    (wrong / checkpoints.MARKER).write_text('{"step": 3}')  # marker of another step
    (root / "something_else").mkdir()
    newest = checkpoints.newest_complete(root)
    assert newest is not None
    assert (newest.step, newest.tag, newest.info["consumed_samples"]) == (6, "step_00000006", 48)
    assert (root / checkpoints.LATEST).read_text() == "step_00000006"
    complete, incomplete = checkpoints.list_checkpoints(root)
    assert [c.step for c in complete] == [3, 6]
    assert [p.name for p in incomplete] == ["step_00000009", "step_00000012", "step_00000015"]


def test_newest_complete_of_missing_or_empty_root(tmp_path: Path) -> None:
    assert checkpoints.newest_complete(tmp_path / "nope") is None
    assert checkpoints.newest_complete(tmp_path) is None


def test_prune_keeps_newest_and_newer_debris(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (3, 6, 9, 12):
        make_checkpoint(root, step)
    make_checkpoint(root, 4, complete=False)
    make_checkpoint(root, 15, complete=False)
    removed = checkpoints.prune(root, keep=2)
    assert sorted(p.name for p in removed) == ["step_00000003", "step_00000004", "step_00000006"]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "step_00000009", "step_00000012", "step_00000015"]
    with pytest.raises(ValueError):
        checkpoints.prune(root, keep=0)


def _instance_save(disks: list[Path], step: int, shard_bytes: int = 16) -> None:
    """One sealed save of a two-node job whose nodes keep their own disks (SageMaker): each
    node writes and seals its shard on its disk, node 0 writes the marker on its disk."""
    for node, disk in enumerate(disks):
        directory = checkpoints.prepare_save_dir(disk, step)
        (directory / f"shard-{node}.pt").write_bytes(b"x" * shard_bytes)
        checkpoints.seal_node(disk, step, node)
    checkpoints.mark_complete(disks[0], step, {"consumed_samples": step * 8, "nodes": 2})


def _restore(disks: list[Path], into: Path) -> None:
    """What a retry finds on each instance: every instance's files, merged (the S3 prefix)."""
    import shutil
    for disk in disks:
        shutil.copytree(disk, into, dirs_exist_ok=True)


def test_a_step_counts_only_with_every_nodes_part(tmp_path: Path) -> None:
    disks = [tmp_path / "algo-1", tmp_path / "algo-2"]
    for step in (3, 6):
        _instance_save(disks, step)
    # Alone, neither disk holds a whole checkpoint: node 0's lacks node 1's part.
    assert checkpoints.newest_complete(disks[0]) is None
    assert checkpoints.newest_complete(disks[1]) is None
    restored = tmp_path / "restored"
    _restore(disks, restored)
    newest = checkpoints.newest_complete(restored)
    assert newest is not None and newest.step == 6 and newest.info["nodes"] == 2
    # Node 1's shard of step 6 never arrived, or arrived cut short: step 3 is the newest.
    (restored / "step_00000006" / "shard-1.pt").write_bytes(b"x")
    assert [c.step for c in checkpoints.list_checkpoints(restored)[0]] == [3]
    (restored / "step_00000006" / "shard-1.pt").unlink()
    assert [c.step for c in checkpoints.list_checkpoints(restored)[0]] == [3]
    # A seal that lists what is not there, or no seal at all, is no part either.
    (restored / "step_00000003" / checkpoints.seal_name(1)).unlink()
    assert checkpoints.newest_complete(restored) is None


def test_a_seal_lists_hidden_files_but_no_temporaries_or_seals(tmp_path: Path) -> None:
    directory = checkpoints.prepare_save_dir(tmp_path, 2)
    (directory / ".metadata").write_bytes(b"abc")        # torch.distributed.checkpoint's
    (directory / "__1_0.distcp").write_bytes(b"abcd")
    (directory / ".state.pt.tmp").write_bytes(b"x")      # a writer still at work elsewhere
    (directory / checkpoints.seal_name(0)).write_text("{}")
    assert checkpoints.seal_node(tmp_path, 2, 1) == {".metadata": 3, "__1_0.distcp": 4}


def test_each_node_prunes_its_own_disk_by_its_seals(tmp_path: Path) -> None:
    disks = [tmp_path / "algo-1", tmp_path / "algo-2"]
    for step in (3, 6, 9):
        _instance_save(disks, step)
    # Node 1's disk has no marker (node 0 writes it): judged by node 1's own seals.
    assert checkpoints.prune(disks[1], keep=2) == []
    removed = checkpoints.prune(disks[1], keep=2, node=1)
    assert [p.name for p in removed] == ["step_00000003"]
    assert [p.name for p in checkpoints.prune(disks[0], keep=2, node=0)] == ["step_00000003"]
    for disk in disks:
        assert sorted(p.name for p in disk.iterdir() if p.is_dir()) == [
            "step_00000006", "step_00000009"]


def _keys(disk: Path) -> dict[str, tuple[int, int]]:
    return {p.relative_to(disk).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in disk.rglob("*") if p.is_file()}


def _own_disk_save(disk: Path, step: int, node: int, nodes: int = 2) -> None:
    """One node's part of a sealed save on its own disk, as loop.sealed_save does it there:
    node 0 writes the marker and ``latest``; file names repeat at every step."""
    directory = checkpoints.prepare_save_dir(disk, step, node)
    (directory / f"shard-{node}.pt").write_bytes(b"y" * (8 + step))
    if node == 0:
        (directory / ".metadata").write_bytes(b"m" * step)
    checkpoints.seal_node(disk, step, node)
    if node == 0:
        checkpoints.mark_complete(disk, step, {"nodes": nodes})
    checkpoints.prune(disk, keep=2, node=node)


def test_on_sagemaker_each_instance_writes_and_deletes_only_its_own_keys(
        tmp_path: Path) -> None:
    """SageMaker mirrors each instance's writes and deletes under LocalPath to one S3 prefix and
    restores the whole prefix on every instance of a retry. Emulated: the keys each instance
    wrote or deleted (its disk before and after) are disjoint, the prefix keeps `keep` steps,
    and a retry that re-saves a restored step touches no other instance's key."""
    s3: dict[str, bytes] = {}
    disks = [tmp_path / "algo-1", tmp_path / "algo-2"]

    def attempt(steps: list[int]) -> None:
        before = [_keys(d) for d in disks]
        for step in steps:
            for node, disk in enumerate(disks):
                _own_disk_save(disk, step, node)
        touched = []
        for node, disk in enumerate(disks):
            after = _keys(disk)
            wrote = {k for k, v in after.items() if before[node].get(k) != v}
            gone = set(before[node]) - set(after)
            touched.append(wrote | gone)
            s3.update({k: (disk / k).read_bytes() for k in wrote})
            for k in gone:
                s3.pop(k, None)
        assert not touched[0] & touched[1], touched[0] & touched[1]

    attempt([3, 6, 9])
    assert sorted({k.split("/")[0] for k in s3}) == ["latest", "step_00000006", "step_00000009"]
    # Node 1's shard of step 9 never reached S3; a retry restores the prefix on both instances.
    del s3["step_00000009/shard-1.pt"]
    disks = [tmp_path / "retry-1", tmp_path / "retry-2"]
    for disk in disks:
        for key, data in s3.items():
            (disk / key).parent.mkdir(parents=True, exist_ok=True)
            (disk / key).write_bytes(data)
    assert [c.step for c in checkpoints.list_checkpoints(disks[1])[0]] == [6]
    attempt([9, 12, 15])   # resumed from 6: step 9 is saved again over the restored one
    assert sorted({k.split("/")[0] for k in s3}) == ["latest", "step_00000012", "step_00000015"]
    # A restored copy of another instance's key stays on the disk, untouched (its owner deleted
    # the key); the step no longer counts there either.
    assert (disks[1] / "step_00000006" / "shard-0.pt").is_file()
    assert not (disks[1] / "step_00000006" / "shard-1.pt").exists()
    seal = json.loads(s3["step_00000015/COMPLETE.node-00001"])
    assert seal["files"] == {"shard-1.pt": 23}


def test_a_nodes_debris_goes_by_its_names_never_another_nodes(tmp_path: Path) -> None:
    disk = tmp_path / "algo-2"
    for step in (3, 6):
        _own_disk_save(disk, step, 1)
    # A restored step 4 that every node's save died in: node 0's files, node 1's unsealed shard.
    debris = disk / "step_00000004"
    debris.mkdir()
    (debris / "shard-0.pt").write_bytes(b"a")
    (debris / "shard-1.pt").write_bytes(b"b")
    assert checkpoints.prune(disk, keep=2, node=1) == [debris]
    assert sorted(p.name for p in debris.iterdir()) == ["shard-0.pt"]


def test_node_place_reads_torchrun_and_the_flow() -> None:
    env = {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "0", "GROUP_RANK": "1",
           "JOBGEN_SHARED_FS": "0"}
    assert loop.node_place(env) == (1, 2, True, True)
    assert loop.node_place(dict(env, LOCAL_RANK="3", JOBGEN_SHARED_FS="1")) == (1, 2, False, False)
    assert loop.node_place({}) == (0, 1, True, False)   # by hand: one shared folder


def test_prepare_save_dir_clears_a_previous_attempt(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    old = make_checkpoint(root, 6)
    (old / "stale_rank_1.pt").write_text("x")
    fresh = checkpoints.prepare_save_dir(root, 6)
    assert fresh == old and list(fresh.iterdir()) == []
    assert checkpoints.newest_complete(root) is None


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    checkpoints.write_atomic(tmp_path / "latest", "step_00000003")
    checkpoints.write_atomic(tmp_path / "latest", "step_00000006")
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]
    assert (tmp_path / "latest").read_text() == "step_00000006"


def test_tags_sort_by_step() -> None:
    assert checkpoints.tag_for(7) < checkpoints.tag_for(10) < checkpoints.tag_for(155_000)
    assert checkpoints.step_of("step_00000042") == 42
    assert checkpoints.step_of("global_step42") is None


# ---------------------------------------------------------------------------------- runtime


@pytest.mark.parametrize("world", [1, 2, 4])
def test_batch_positions_tile_the_stream(world: int) -> None:
    micro, accumulation, consumed = 3, 2, 120
    taken = []
    for rank in range(world):
        micro_batches = batch_positions(consumed, micro, accumulation, world, rank)
        assert len(micro_batches) == accumulation
        assert all(len(mb) == micro for mb in micro_batches)
        taken += [p for mb in micro_batches for p in mb]
    assert sorted(taken) == list(range(consumed, consumed + micro * accumulation * world))


def test_step_seed_differs_by_step_and_rank() -> None:
    seeds = {step_seed(1, s, r) for s in range(50) for r in range(8)}
    assert len(seeds) == 400


RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
             "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def clear_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in RANK_VARS:
        monkeypatch.setenv(name, "")  # records the original state, so teardown restores it
        monkeypatch.delenv(name)


def test_process_env_defaults_only_without_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_rank_env(monkeypatch)
    assert ensure_process_env() == "single"
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "0", "1", "0")
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and int(os.environ["MASTER_PORT"]) > 0
    monkeypatch.setenv("RANK", "3")
    assert ensure_process_env() == "launcher"
    assert os.environ["RANK"] == "3"


def test_process_env_from_srun_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_rank_env(monkeypatch)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    with pytest.raises(PayloadError, match="export MASTER_ADDR and MASTER_PORT"):
        ensure_process_env()
    monkeypatch.setenv("MASTER_ADDR", "n1")
    monkeypatch.setenv("MASTER_PORT", "41000")
    assert ensure_process_env() == "slurm"
    assert [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")] == ["5", "8", "1"]
    monkeypatch.setenv("SLURM_NTASKS", "1")  # a 1-task allocation is just a single process
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    assert ensure_process_env() == "single"


def test_run_main_exit_codes(capsys: Any) -> None:
    def user_error() -> int:
        raise PayloadError("no training shards in /data")

    def crash() -> int:
        raise RuntimeError("boom")

    with pytest.raises(SystemExit) as exited:
        run_main(user_error, "prog")
    assert exited.value.code == 2
    assert capsys.readouterr().err == "prog: error: no training shards in /data\n"
    with pytest.raises(SystemExit) as exited:
        run_main(crash, "prog")
    assert exited.value.code == 1
    assert capsys.readouterr().err.splitlines()[-1] == "prog: error: RuntimeError: boom"
    with pytest.raises(SystemExit) as exited:
        run_main(lambda: 0, "prog")
    assert exited.value.code == 0


# ---------------------------------------------------------------------------------- loop


def test_target_step() -> None:
    assert loop.target_step("compile", 40, 100, 3, -1) == 3
    assert loop.target_step("train", 40, 100, 3, -1) == 100
    assert loop.target_step("train", 40, 100, 3, 6) == 46
    assert loop.target_step("train", 98, 100, 3, 6) == 100
    assert loop.target_step("train", 100, 100, 3, -1) == 100


class FakeRunner:
    """Counts steps, saves and resumes; its events go to a string buffer."""

    def __init__(self, step: int = 0, resume_to: int = 0) -> None:
        self.step, self.consumed = step, step * 8
        self.saves: list[int] = []
        self.resume_to = resume_to
        self.out = io.StringIO()
        self.log = EventLog(0, stream=self.out)
        self.tensorboard = None
        self.ckpt_root = Path("/nonexistent/run/checkpoints")
        self.scratch_saves: list[tuple[int, Path]] = []

    def train_step(self) -> dict[str, Any]:
        self.step += 1
        self.consumed += 8
        return {"loss": 1.0 / self.step}

    def save(self, root: Path | None = None) -> None:
        if root is None:
            self.saves.append(self.step)
        else:
            self.scratch_saves.append((self.step, root))

    def resume(self) -> None:
        self.step, self.consumed = self.resume_to, self.resume_to * 8

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind, without their emission time (checked once, below)."""
        return [untimed(e) for e in read_events(self.out.getvalue()) if e["event"] == kind]


def invocation(phase: str, steps: int = -1) -> argparse.Namespace:
    return argparse.Namespace(phase=phase, max_steps=10, compile_steps=3, steps=steps,
                              checkpoint_every=3)


def test_run_steps_saves_every_k_and_at_the_end() -> None:
    runner = FakeRunner(step=2)
    loop.run_steps(runner, phase="train", target=10, checkpoint_every=3)
    assert [e["step"] for e in runner.events("step")] == list(range(3, 11))
    assert runner.events("step")[0] == {"event": "step", "phase": "train", "step": 3,
                                        "consumed_samples": 24, "loss": 1 / 3}
    assert runner.saves == [3, 6, 9, 10]


def test_run_steps_no_double_save_and_nothing_to_do() -> None:
    runner = FakeRunner()
    loop.run_steps(runner, phase="train", target=6, checkpoint_every=3)
    assert runner.saves == [3, 6]
    idle = FakeRunner(step=6)
    loop.run_steps(idle, phase="train", target=6, checkpoint_every=3)
    assert idle.saves == [] and idle.events("step") == []


def test_compile_invocation_never_resumes_and_saves_only_into_scratch() -> None:
    runner = FakeRunner(resume_to=6)
    loop.run_invocation(runner, invocation("compile"))
    assert [e["step"] for e in runner.events("step")] == [1, 2, 3]
    # The save path runs once, at the last compile step, beside the checkpoint folder.
    assert runner.saves == []
    assert runner.scratch_saves == [(3, Path("/nonexistent/run/compile-save"))]
    assert runner.events("done") == [
        {"event": "done", "phase": "compile", "step": 3, "consumed_samples": 24}]


def test_train_invocation_resumes_and_honours_the_bound() -> None:
    runner = FakeRunner(resume_to=6)
    loop.run_invocation(runner, invocation("train", steps=2))
    assert [e["step"] for e in runner.events("step")] == [7, 8]
    assert runner.saves == [8]  # end of a bounded run
    rest = FakeRunner(resume_to=8)
    loop.run_invocation(rest, invocation("train"))
    assert [e["step"] for e in rest.events("step")] == [9, 10] and rest.saves == [9, 10]
    assert rest.events("done")[0]["step"] == 10


def test_common_does_not_import_torch() -> None:
    # Flag and data checks run before the heavy imports, so a bad job fails in a second.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import common.checkpoints, common.events, common.loop, common.runtime, "
            "common.schedule, common.optim, common.init, common.stream; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code, str(PAYLOAD)], check=True, timeout=60)


# ---------------------------------------------------------------------------------- optimizer
# groups and initialisation (shared by the NxD Llama program and the smoke trainer)


class Param:
    def __init__(self, requires_grad: bool = True) -> None:
        self.requires_grad = requires_grad


def test_parameter_groups_no_fragments_decays_every_parameter() -> None:
    from common.optim import parameter_groups
    named = [("embed.weight", Param()), ("layers.0.input_layernorm.weight", Param()),
             ("layers.0.mlp.down_proj.bias", Param()), ("frozen.weight", Param(False))]
    (only,) = parameter_groups(named, 0.1, [])
    assert only["params"] == [p for n, p in named[:3]] and only["weight_decay"] == 0.1
    decayed, plain = parameter_groups(named, 0.1, ["Bias", "norm"])   # case does not matter
    assert decayed["params"] == [named[0][1]] and plain["weight_decay"] == 0.0
    assert len(plain["params"]) == 2


def test_scaled_std_for_hlat() -> None:
    from common.init import scaled_std
    assert scaled_std(0.021, 32) == pytest.approx(0.021 / 8)
    assert scaled_std(0.02, 2) == pytest.approx(0.01)


def test_sharded_draw_is_the_slice_of_the_full_draw() -> None:
    torch = pytest.importorskip("torch")
    from common.init import normal_draw, sharded_draw
    full = normal_draw(torch.Generator().manual_seed(3))("w", torch.empty(4, 12), 0.5)
    for dim, shape in ((1, (4, 3)), (0, (1, 12))):
        parts = [sharded_draw(4, r, dim, torch.Generator().manual_seed(3))("w",
                                                                           torch.empty(shape), 0.5)
                 for r in range(4)]
        assert torch.equal(torch.cat(parts, dim=dim), full)


def test_scale_output_projections_leaves_the_rest_and_checks_shapes() -> None:
    torch = pytest.importorskip("torch")
    from common.init import scale_output_projections, scaled_std
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"o_proj": torch.nn.Linear(64, 512),
                                 "q_proj": torch.nn.Linear(64, 64)})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    names = scale_output_projections(model, ["o_proj"], 0.02, 8,
                                     torch.Generator().manual_seed(1))
    assert names == ["o_proj.weight"]
    after = dict(model.named_parameters())
    assert after["o_proj.weight"].std().item() == pytest.approx(scaled_std(0.02, 8), rel=0.03)
    for unchanged in ("o_proj.bias", "q_proj.weight", "q_proj.bias"):
        assert torch.equal(after[unchanged], before[unchanged])
    with pytest.raises(ValueError, match=r"o_proj.weight: drew \(2, 2\) for a parameter"):
        scale_output_projections(model, ["o_proj"], 0.02, 8,
                                 draw=lambda name, param, std: torch.zeros(2, 2))


# ---------------------------------------------------------------------------------- tensorboard


class FakeWriter:
    def __init__(self, directory: str) -> None:
        self.directory, self.scalars = directory, []

    def add_scalar(self, key: str, value: float, step: int) -> None:
        self.scalars.append((key, value, step))


def test_tensorboard_writer_when_installed(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = FakeWriter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    writer = open_tensorboard(tmp_path / "tb", EventLog(0))
    assert isinstance(writer, FakeWriter) and writer.directory == str(tmp_path / "tb")
    to_tensorboard(writer, 7, {"loss": 2.5, "grad_norm": None, "lr": 1e-3})
    assert writer.scalars == [("train/loss", 2.5, 7), ("train/lr", 1e-3, 7)]
    assert open_tensorboard(tmp_path / "tb", EventLog(1)) is None  # only rank 0 writes


def test_tensorboard_missing_is_a_one_line_notice(tmp_path: Path, capsys: Any,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    assert open_tensorboard(tmp_path / "tb", EventLog(0)) is None
    assert [untimed(e) for e in read_events(capsys.readouterr().out)] == [
        {"event": "notice",
         "message": "tensorboard is not installed; TensorBoard logging is off"}]
    to_tensorboard(None, 1, {"loss": 1.0})  # a missing writer is a no-op


# ------------------------------------------------------------- stop on request (time limit)

class SignalledRunner(FakeRunner):
    """Sends itself the stop signal while training step `at` (as Slurm's warning would)."""

    def __init__(self, at: int, **kw: Any) -> None:
        super().__init__(**kw)
        self.at = at

    def train_step(self) -> dict[str, Any]:
        import signal
        numbers = super().train_step()
        if self.step == self.at:
            os.kill(os.getpid(), signal.SIGUSR1)
        return numbers


@pytest.fixture
def usr1_restored() -> Any:
    import signal
    previous = signal.getsignal(signal.SIGUSR1)
    yield
    signal.signal(signal.SIGUSR1, previous)


def test_stop_request_saves_the_step_just_trained_and_stops(usr1_restored: Any) -> None:
    runner = SignalledRunner(at=5)
    stop = loop.StopRequest({"JOBGEN_STOP_SIGNAL": "USR1"})
    assert loop.run_steps(runner, phase="train", target=10, checkpoint_every=3, stop=stop)
    assert [e["step"] for e in runner.events("step")] == [1, 2, 3, 4, 5]
    assert runner.saves == [3, 5]


def test_stop_request_on_a_checkpoint_step_saves_once(usr1_restored: Any) -> None:
    runner = SignalledRunner(at=6)
    stop = loop.StopRequest({"JOBGEN_STOP_SIGNAL": "SIGUSR1"})
    assert loop.run_steps(runner, phase="train", target=10, checkpoint_every=3, stop=stop)
    assert runner.saves == [3, 6]


def test_a_request_made_while_the_trainer_started_is_read_from_its_record(
        usr1_restored: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The time-limit warning reached the trainer while it was still importing torch, with USR1
    ignored as the flow's shells leave it (CI saw it: the trainer then trained 9 steps into the
    requeue). The flow wrote the warning down before it signalled: the trainer stops before its
    first step, saves nothing new (it resumed at 6) and tells the controller."""
    import signal
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGUSR1)              # lost: nothing listens yet
    (tmp_path / "time-limit").write_text("1795700000 60\n")
    monkeypatch.setenv("JOBGEN_STOP_SIGNAL", "USR1")
    monkeypatch.setenv("JOBGEN_LOG_DIR", str(tmp_path))
    runner = FakeRunner(resume_to=6)
    loop.run_invocation(runner, invocation("train"))
    assert runner.events("step") == [] and runner.saves == [] and runner.events("done") == []
    assert [e["step"] for e in runner.events("stopped")] == [6]
    assert json.loads((tmp_path / "stopped.json").read_text()) == {"step": 6, "signal": "USR1"}


@pytest.mark.parametrize("written,node,asked", [
    ("time-limit", "1", True),                     # the job's warning: every node's
    ("node-1/stop-requested", "1", True),          # this node's SIGTERM, forwarded
    ("node-0/stop-requested", "1", False),         # another node's: not this trainer's
    (None, "1", False),
])
def test_which_records_are_a_stop_request(usr1_restored: Any, tmp_path: Path,
                                          written: Any, node: str, asked: bool) -> None:
    if written:
        (tmp_path / written).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / written).write_text("")
    stop = loop.StopRequest({"JOBGEN_STOP_SIGNAL": "USR1", "JOBGEN_LOG_DIR": str(tmp_path),
                             "JOBGEN_NODE_RANK": node})
    assert stop.requested is asked and stop.agreed() is asked
    runner = FakeRunner()
    assert loop.run_steps(runner, phase="train", target=4, checkpoint_every=3,
                          stop=stop) is asked
    assert runner.saves == ([] if asked else [3, 4])
    # Without the stop variable the records mean nothing (a trainer that cannot stop).
    assert not loop.StopRequest({"JOBGEN_LOG_DIR": str(tmp_path),
                                 "JOBGEN_NODE_RANK": node}).requested


def test_without_the_variable_the_signal_is_not_taken(usr1_restored: Any) -> None:
    import signal
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    stop = loop.StopRequest({})
    assert not stop.active and not stop.agreed()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
    runner = SignalledRunner(at=2)
    assert not loop.run_steps(runner, phase="train", target=4, checkpoint_every=3, stop=stop)
    assert runner.saves == [3, 4]
    with pytest.raises(ValueError, match="JOBGEN_STOP_SIGNAL='NOPE' is not a signal name"):
        loop.StopRequest({"JOBGEN_STOP_SIGNAL": "nope"})


def test_stopped_invocation_reports_and_tells_the_controller(
        usr1_restored: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBGEN_STOP_SIGNAL", "USR1")
    monkeypatch.setenv("JOBGEN_LOG_DIR", str(tmp_path))
    runner = SignalledRunner(at=8, resume_to=6)
    loop.run_invocation(runner, invocation("train"))
    assert runner.saves == [8] and runner.events("done") == []
    assert runner.events("stopped") == [{"event": "stopped", "phase": "train", "step": 8,
                                         "consumed_samples": 64, "signal": "USR1"}]
    assert json.loads((tmp_path / "stopped.json").read_text()) == {"step": 8, "signal": "USR1"}
    # The compile pass never takes the request: it is three steps that save nothing.
    compiling = SignalledRunner(at=99)
    loop.run_invocation(compiling, invocation("compile"))
    assert compiling.events("done")[0]["step"] == 3


AGREEMENT = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from common import loop

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
stop = loop.StopRequest({"JOBGEN_STOP_SIGNAL": "USR1"})
steps = 0
while steps < 20:
    steps += 1
    if rank == 1 and steps == 4:        # only one rank hears the signal
        os.kill(os.getpid(), signal.SIGUSR1)
    if stop.agreed():
        break
# one write per line: two ranks share the pipe, and print's separate newline could interleave
os.write(1, f"rank {rank} stopped after step {steps} (heard: {stop.requested})\n".encode())
dist.barrier()        # neither rank leaves while the other still talks to it
# What is tested is the agreement, not gloo's teardown: on a loaded machine a rank whose peer
# has already closed its pairs could abort in destroy_process_group (SIGABRT, seen in CI twice).
os._exit(0)
"""


@pytest.mark.slow   # several seconds: the full tier runs it
def test_ranks_agree_on_the_step_when_one_hears_the_signal(tmp_path: Path) -> None:
    """Two real processes (torchrun, gloo): the signal reaches one; both stop at the same step."""
    script = tmp_path / "agree.py"
    script.write_text(AGREEMENT)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), str(script), str(PAYLOAD)],
        capture_output=True, text=True, timeout=120, check=False)
    # The head of stderr says why a rank died (a CI run once saw rank 1 abort, SIGABRT, in gloo);
    # the tail is torchrun's summary.
    assert proc.returncode == 0, (proc.stdout[-1000:], proc.stderr[:3000], proc.stderr[-1500:])
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 stopped after step 4 (heard: False)",
                     "rank 1 stopped after step 4 (heard: True)"]
