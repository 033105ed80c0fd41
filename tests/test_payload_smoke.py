"""Tests for payload/smoke/train.py, the CPU stand-in that rehearses the Trainium recipes."""
from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
PROGRAM = PAYLOAD / "smoke" / "train.py"
if str(PAYLOAD) not in sys.path:
    sys.path.insert(0, str(PAYLOAD))

from common.events import read_events
from common.runtime import PayloadError
from conftest import need


def smoke_module() -> ModuleType:
    """Import the script under a unique name (``train`` alone would be too generic)."""
    spec = importlib.util.spec_from_file_location("payload_smoke_train", PROGRAM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------- unit


def test_defaults() -> None:
    args = smoke_module().parse_args([])
    assert (args.family, args.num_layers, args.hidden_size, args.num_heads, args.seq_length,
            args.vocab_size, args.intermediate_size, args.phase, args.compile_steps,
            args.steps, args.keep_checkpoints) == (
        "gpt_neox", 2, 64, 4, 32, 512, 256, "train", 3, -1, 3)


def test_synthetic_tokens_are_deterministic_and_learnable() -> None:
    smoke = smoke_module()
    row = smoke.synthetic_tokens(17, 32, 512, seed=3)
    assert row == smoke.synthetic_tokens(17, 32, 512, seed=3)
    assert row != smoke.synthetic_tokens(18, 32, 512, seed=3)
    assert len(row) == 32 and all(0 <= t < 512 for t in row)
    strides = {(b - a) % 512 for a, b in itertools.pairwise(row)}
    assert len(strides) == 1  # one constant stride: predictable after two tokens


@pytest.mark.parametrize("flags, message", [
    (["--hidden-size", "66"], "--hidden-size 66 is not divisible by --num-heads 4"),
    (["--warmup-steps", "30", "--max-steps", "20"], "--warmup-steps must lie in [0, --max-steps]"),
    (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
])
def test_bad_flags(flags: list[str], message: str) -> None:
    smoke = smoke_module()
    with pytest.raises(PayloadError) as error:
        smoke.validate(smoke.parse_args(flags))
    assert str(error.value) == message


def test_nxd_program_flag_names_are_accepted() -> None:
    """--schedule is the NxD program's name for --decay; the new flags default to what the
    smoke trainer did before they existed."""
    smoke = smoke_module()
    args = smoke.parse_args(["--schedule", "linear"])
    assert args.decay == "linear"
    defaults = smoke.parse_args([])
    assert (defaults.decay, defaults.no_decay, defaults.scaled_init, defaults.eps,
            defaults.decay_steps) == ("cosine", None, False, 1e-8, None)


def test_samples_digest_depends_on_every_row() -> None:
    need("torch")
    import torch
    smoke = smoke_module()
    rows = torch.tensor([smoke.synthetic_tokens(p, 8, 64, 1) for p in range(3)])
    chained = smoke.samples_digest(rows[2:], smoke.samples_digest(rows[:2]))
    assert chained == smoke.samples_digest(rows)
    assert smoke.samples_digest(rows[[0, 2, 1]]) != smoke.samples_digest(rows)


def test_fault_knobs() -> None:
    knobs = smoke_module().fault_knobs
    assert knobs({}) == (0.0, None)
    assert knobs({"JOBGEN_SMOKE_STEP_DELAY": "0.25", "JOBGEN_SMOKE_FAIL_AT_STEP": "6"}) == (0.25, 6)
    assert knobs({"JOBGEN_SMOKE_STEP_DELAY": " ", "JOBGEN_SMOKE_FAIL_AT_STEP": ""}) == (0.0, None)
    for env, message in [
        ({"JOBGEN_SMOKE_STEP_DELAY": "soon"}, "JOBGEN_SMOKE_STEP_DELAY='soon' is not a number"),
        ({"JOBGEN_SMOKE_STEP_DELAY": "-1"}, "must be a finite number >= 0"),
        ({"JOBGEN_SMOKE_STEP_DELAY": "nan"}, "must be a finite number >= 0"),
        ({"JOBGEN_SMOKE_FAIL_AT_STEP": "0"}, "JOBGEN_SMOKE_FAIL_AT_STEP='0' must be a step"),
        ({"JOBGEN_SMOKE_FAIL_AT_STEP": "x"}, "must be a step number >= 1"),
    ]:
        with pytest.raises(PayloadError, match=message.replace("[", r"\[")):
            knobs(env)


def test_tiny_models_have_the_family_traits() -> None:
    need("torch", "transformers")
    smoke = smoke_module()
    neox = smoke.build_model(smoke.parse_args(["--family", "gpt_neox"]))
    rope = getattr(neox.config, "rope_parameters", None) or {}
    assert rope.get("partial_rotary_factor", getattr(neox.config, "rotary_pct", None)) == 0.25
    assert neox.config.use_parallel_residual is True
    llama = smoke.build_model(smoke.parse_args(["--family", "llama", "--num-layers", "3"]))
    assert type(llama).__name__ == "LlamaForCausalLM"
    assert (llama.config.num_hidden_layers, llama.config.num_key_value_heads) == (3, 4)


# ---------------------------------------------------------------------------------- real runs

ARGS = ["--max-steps", "9", "--warmup-steps", "2", "--lr", "3e-3", "--min-lr", "3e-4",
        "--micro-batch-size", "2", "--gradient-accumulation", "2", "--checkpoint-every", "3",
        "--keep-checkpoints", "2", "--seed", "11"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(args: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(PROGRAM)]
    started = time.monotonic()
    result = subprocess.run(cmd + args, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    print(f"[smoke x2] {' '.join(args[-5:])}: rc={result.returncode} "
          f"{time.monotonic() - started:.1f}s")
    return result


def events_of(result: subprocess.CompletedProcess, kind: str) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [e for e in read_events(result.stdout) if e["event"] == kind]


# The NxD Llama program's loop settings on the smoke scale (HLAT shape: cosine to min_lr at a
# decay step before max_steps, eps, betas, weight decay on every parameter, scaled init).
HLAT_LIKE = ["--schedule", "cosine", "--decay-steps", "7", "--eps", "1e-5", "--beta2", "0.95",
             "--weight-decay", "0.1", "--no-decay", "--scaled-init", "--init-std", "0.021"]


def expected_digests(step: int, world: int = 2) -> list[int]:
    """The data_crc32 each rank should report at ``step`` (1-based) with ARGS: computed here
    from the stream positions, independently of the trainer's own bookkeeping."""
    import torch
    from common.runtime import batch_positions
    smoke = smoke_module()
    micro, accumulation, seed = 2, 2, 11
    consumed = (step - 1) * micro * accumulation * world
    digests = []
    for rank in range(world):
        crc = 0
        for positions in batch_positions(consumed, micro, accumulation, world, rank):
            rows = [smoke.synthetic_tokens(p, 32, 512, seed) for p in positions]
            crc = smoke.samples_digest(torch.tensor(rows, dtype=torch.long), crc)
        digests.append(crc)
    return digests


def final_weights(out: Path, step: int) -> dict[str, Any]:
    import torch
    state = torch.load(out / "checkpoints" / f"step_{step:08d}" / "state.pt",
                       map_location="cpu", weights_only=False)
    return dict(state["model"])


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt_neox", "llama"])
def test_compile_then_train_then_resume(family: str, tmp_path: Path) -> None:
    need("torch", "transformers")
    out = tmp_path / "out"
    extra = HLAT_LIKE if family == "llama" else []
    common = ARGS + extra + ["--family", family, "--output-dir", str(out)]

    compiled = launch(common + ["--phase", "compile"], tmp_path)
    assert [e["step"] for e in events_of(compiled, "step")] == [1, 2, 3]
    # The compile pass runs the save path once, into a scratch folder that it removes: nothing
    # that the training pass would resume from.
    assert events_of(compiled, "checkpoint") == []
    assert [e["step"] for e in events_of(compiled, "compile_save")] == [3]
    assert not out.exists()

    first = launch(common + ["--phase", "train", "--steps", "6"], tmp_path)
    steps = events_of(first, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert [e["step"] for e in events_of(first, "checkpoint")] == [3, 6]
    # Same nodes, same settings: the compile pass trained exactly what training starts with.
    assert [e["loss"] for e in events_of(compiled, "step")] == [e["loss"] for e in steps[:3]]
    assert steps[-1]["loss"] < steps[0]["loss"]  # it learns

    second = launch(common + ["--phase", "train"], tmp_path)
    assert [e["step"] for e in events_of(second, "resume")] == [6]
    resumed = events_of(second, "step")
    assert resumed[0]["step"] == 7 and [e["step"] for e in resumed] == [7, 8, 9]
    assert all(math.isfinite(e["loss"]) and e["grad_norm"] > 0 for e in resumed)
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if p.is_dir())
    assert ckpts == ["step_00000006", "step_00000009"]
    # Sharded: rank 0's weights, each rank's slice of the optimizer state, the node's seal.
    assert sorted(p.name for p in (out / "checkpoints" / ckpts[-1]).iterdir()) == [
        "COMPLETE", "COMPLETE.node-00000", "optim-rank-00000.pt", "optim-rank-00001.pt",
        "state.pt"]
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in logged if e["event"] == "step"] == list(range(1, 10))

    if family == "llama":  # one family is enough to prove resuming is exact
        # The resumed run read exactly the samples the stream assigns to steps 7..9 (not the
        # start of the data again), rank by rank.
        for event in steps + resumed:
            assert event["data_crc32"] == expected_digests(event["step"]), event["step"]
        assert resumed[-1]["lr"] == pytest.approx(3e-4)          # at the floor after step 7
        straight_out = tmp_path / "straight"
        straight = events_of(launch(ARGS + extra + ["--family", family, "--output-dir",
                                                    str(straight_out)], tmp_path), "step")
        keys = ("step", "loss", "grad_norm", "lr", "consumed_samples", "data_crc32")
        assert [[e[k] for k in keys] for e in straight[6:]] == [[e[k] for k in keys]
                                                                 for e in resumed]
        import torch
        interrupted, uninterrupted = final_weights(out, 9), final_weights(straight_out, 9)
        assert interrupted.keys() == uninterrupted.keys()
        assert all(torch.equal(interrupted[k], uninterrupted[k]) for k in interrupted)


@pytest.mark.deepspeed
@pytest.mark.slow
def test_bad_flag_fails_the_launch(tmp_path: Path) -> None:
    need("torch")
    result = launch(["--hidden-size", "66", "--output-dir", str(tmp_path / "o")], tmp_path)
    assert result.returncode != 0
    assert ("smoke-train: error: --hidden-size 66 is not divisible by --num-heads 4"
            in result.stderr.splitlines())


def test_watch_fault_switches_parse() -> None:
    faults = smoke_module().watch_faults
    assert faults({}) == {"slow_seconds": 1.0, "hang_node": None, "fail_node": None}
    got = faults({"JOBGEN_SMOKE_SPIKE_AT_STEP": "5", "JOBGEN_SMOKE_HANG_AT_STEP": "7",
                  "JOBGEN_SMOKE_HANG_NODE": "1", "JOBGEN_SMOKE_SLOW_SECONDS": "0.5"})
    assert (got["spike"], got["hang"], got["hang_node"], got["slow_seconds"]) == (5, 7, 1, 0.5)
    for env, message in [
        ({"JOBGEN_SMOKE_NAN_AT_STEP": "0"}, "JOBGEN_SMOKE_NAN_AT_STEP='0' must be a step"),
        ({"JOBGEN_SMOKE_HANG_NODE": "last"}, "must be a node index"),
        ({"JOBGEN_SMOKE_SLOW_SECONDS": "inf"}, "must be a finite number >= 0"),
    ]:
        with pytest.raises(PayloadError, match=message):
            faults(env)


@pytest.mark.slow   # several seconds: the full tier runs it
def test_injected_spikes_are_real_and_every_node_beats(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    need("torch", "transformers")
    monkeypatch.setenv("JOBGEN_SMOKE_SPIKE_AT_STEP", "5")
    monkeypatch.setenv("JOBGEN_SMOKE_LOSS_SPIKE_AT_STEP", "7")
    result = launch(ARGS + ["--output-dir", str(tmp_path / "out")], tmp_path)
    steps = {e["step"]: e for e in events_of(result, "step") if e["phase"] == "train"}
    norms = {n: e["grad_norm"] for n, e in steps.items()}
    assert norms[5] > 30 * max(norms[4], norms[6])          # x100 back-propagated at step 5
    assert steps[7]["loss"] > 1.2 * steps[6]["loss"]         # output layer x30 before step 7
    # One beat per step from the node's local rank 0, before the step's own event.
    beats = [e for e in events_of(result, "beat") if e["phase"] == "train"]
    assert [(b["node"], b["step"]) for b in beats] == [(0, n) for n in range(1, 10)]


@pytest.mark.slow   # several seconds: the full tier runs it
def test_an_injected_hang_happens_once_per_run(tmp_path: Path) -> None:
    need("torch", "transformers")
    out = tmp_path / "out"
    env = dict(os.environ, JOBGEN_SMOKE_HANG_AT_STEP="4", JOBGEN_SMOKE_HANG_NODE="0",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, str(PROGRAM), *ARGS, "--output-dir", str(out)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / ".jobgen-smoke-hang").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    time.sleep(1.0)
    assert proc.poll() is None             # still there, doing nothing
    proc.kill()
    stdout, stderr = proc.communicate()
    assert "JOBGEN_SMOKE_HANG_AT_STEP=4: node 0 (rank 0) stops before step 4" in stderr
    assert max(e["step"] for e in read_events(stdout) if e["event"] == "step") == 3
    again = subprocess.run([sys.executable, str(PROGRAM), *ARGS, "--output-dir", str(out)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
                           check=False)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [e["step"] for e in read_events(again.stdout) if e["event"] == "done"] == [9]
