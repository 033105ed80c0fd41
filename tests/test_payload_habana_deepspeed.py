"""Tests for payload/habana_deepspeed: LAMB, hdf5 data, config, and real DeepSpeed runs on CPU."""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = ROOT / "payload"
BERT_DIR = PAYLOAD / "habana_deepspeed"
PROGRAM = BERT_DIR / "pretrain_bert.py"
for entry in (str(PAYLOAD), str(BERT_DIR)):
    if entry not in sys.path:
        sys.path.insert(0, entry)

from common.events import read_events
from conftest import need

# ---------------------------------------------------------------------------------- LAMB


def test_lamb_first_step_matches_hand_computation() -> None:
    need("torch")
    import torch
    from lamb import Lamb

    weight = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    weight.grad = torch.tensor([0.5, -1.0], dtype=torch.float64)
    Lamb([weight], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    # By hand: after bias correction m = g and v = g², so the Adam direction is g/(|g|+eps)
    # = [0.999998, -0.999999]; plus decay 0.01·w gives u = [1.029998, -0.959999], |u| = 1.408011;
    # trust = |w|/|u| = 5/1.408011 = 3.551110; w ← w − 0.1·trust·u.
    assert weight.tolist() == pytest.approx([2.6342364, 4.3409062], rel=1e-7)


def test_lamb_second_step_and_state() -> None:
    need("torch")
    import torch
    from lamb import Lamb

    weight = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    opt = Lamb([weight], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
               adapt_undecayed=True)
    grads = ([0.5, -1.0], [0.2, 0.4])
    w = [3.0, 4.0]
    m, v = [0.0, 0.0], [0.0, 0.0]
    for t, g in enumerate(grads, start=1):
        weight.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        m = [0.9 * a + 0.1 * b for a, b in zip(m, g)]
        v = [0.999 * a + 0.001 * b * b for a, b in zip(v, g)]
        u = [(a / (1 - 0.9**t)) / (math.sqrt(b / (1 - 0.999**t)) + 1e-6) for a, b in zip(m, v)]
        trust = math.hypot(*w) / math.hypot(*u)
        w = [a - 0.1 * trust * b for a, b in zip(w, u)]
    assert weight.tolist() == pytest.approx(w, rel=1e-9)
    assert opt.state[weight]["step"] == 2


def test_lamb_zero_tensor_gets_trust_one() -> None:
    need("torch")
    import torch
    from lamb import Lamb

    bias = torch.nn.Parameter(torch.zeros(2))
    bias.grad = torch.tensor([1.0, -2.0])
    Lamb([bias], lr=0.5, weight_decay=0.0, adapt_undecayed=True).step()
    # ||w|| = 0, so the ratio is undefined and taken as 1: a plain Adam first step of ±lr.
    assert bias.tolist() == pytest.approx([-0.5, 0.5], rel=1e-5)


def test_lamb_undecayed_group_takes_a_plain_adam_step() -> None:
    need("torch")
    import torch
    from lamb import Lamb

    # As the reference's NVLAMB: no weight decay means no trust ratio (||w|| / ||u|| = 5 / ~1.414
    # would otherwise scale the step by ~3.5).
    weight = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    weight.grad = torch.tensor([0.5, -1.0], dtype=torch.float64)
    Lamb([weight], lr=0.1, eps=1e-6, weight_decay=0.0).step()
    assert weight.tolist() == pytest.approx([3.0 - 0.1 * 0.999998, 4.0 + 0.1 * 0.999999],
                                            rel=1e-7)
    # Opting in gives the trust ratio back.
    adapted = torch.nn.Parameter(torch.tensor([3.0, 4.0], dtype=torch.float64))
    adapted.grad = torch.tensor([0.5, -1.0], dtype=torch.float64)
    Lamb([adapted], lr=0.1, eps=1e-6, weight_decay=0.0, adapt_undecayed=True).step()
    trust = 5.0 / math.hypot(0.999998, 0.999999)
    assert adapted.tolist() == pytest.approx([3.0 - 0.1 * trust * 0.999998,
                                              4.0 + 0.1 * trust * 0.999999], rel=1e-7)


def test_default_no_decay_is_the_reference_list_and_spares_exactly_the_1d_parameters() -> None:
    need("torch", "transformers")
    import torch
    from accelerators import REFERENCE_NO_DECAY, Accelerator, build_optimizer
    from pretrain_bert import build_model

    model = build_model(_tiny_args("--layer-norm-large-model"))
    cpu = Accelerator("cpu", torch.device("cpu"), "gloo")
    optimizer, _ = build_optimizer("lamb", model, cpu, 0.001, 0.01)
    explicit, _ = build_optimizer("lamb", model, cpu, 0.001, 0.01, no_decay=REFERENCE_NO_DECAY)
    decayed, plain = optimizer.param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.01, 0.0)
    assert [len(g["params"]) for g in explicit.param_groups] == [len(decayed["params"]),
                                                                  len(plain["params"])]
    # Today's rule before --no-decay existed: matrices and embeddings decayed, 1-D tensors not.
    assert {id(p) for p in decayed["params"]} == {id(p) for p in model.parameters() if p.ndim > 1}
    assert {id(p) for p in plain["params"]} == {id(p) for p in model.parameters() if p.ndim < 2}


# ---------------------------------------------------------------------------------- data


def make_shards(out: Path, samples: int = 64, shards: int = 1, seed: int = 0) -> Path:
    import make_tiny_shard

    make_tiny_shard.main(["--out", str(out), "--samples", str(samples), "--seq-length", "32",
                          "--max-predictions", "5", "--vocab-size", "1000", "--seed", str(seed),
                          "--shards", str(shards)])
    return out


def test_mlm_labels_by_hand() -> None:
    need("numpy", "h5py")
    import numpy as np
    from bert_data import mlm_labels

    positions = np.array([[1, 3, 0], [2, 0, 0]])
    ids = np.array([[11, 33, 0], [22, 0, 0]])
    assert mlm_labels(5, positions, ids).tolist() == [
        [-100, 11, -100, 33, -100],
        [-100, -100, 22, -100, -100]]


def test_tiny_shard_layout_and_determinism(tmp_path: Path) -> None:
    need("numpy", "h5py")
    import h5py

    first = make_shards(tmp_path / "a") / "tiny_training_0.hdf5"
    second = make_shards(tmp_path / "b") / "tiny_training_0.hdf5"
    with h5py.File(first, "r") as a, h5py.File(second, "r") as b:
        shapes = {key: a[key].shape for key in a}
        assert all((a[key][()] == b[key][()]).all() for key in a)
        ids, positions = a["input_ids"][()], a["masked_lm_positions"][()]
        assert (ids[:, 0] == 1).all()  # [CLS]
        assert ids.max() < 1000 and (positions[:, 0] > 0).all()  # at least one prediction
    assert shapes == {"input_ids": (64, 32), "input_mask": (64, 32), "segment_ids": (64, 32),
                      "masked_lm_positions": (64, 5), "masked_lm_ids": (64, 5),
                      "next_sentence_labels": (64,)}


def test_batches_build_labels_at_masked_positions(tmp_path: Path) -> None:
    need("numpy", "h5py")
    import numpy as np
    from bert_data import ShardedSamples, find_training_files

    data = ShardedSamples(find_training_files(make_shards(tmp_path)), 32, 5, seed=7)
    batch = data.batch([0, 1, 2, 3])
    assert {k: v.shape for k, v in batch.items()} == {
        "input_ids": (4, 32), "attention_mask": (4, 32), "token_type_ids": (4, 32),
        "labels": (4, 32), "next_sentence_label": (4,)}
    assert all(v.dtype == np.int64 for v in batch.values())
    masked = batch["labels"] != -100
    assert masked.any(axis=1).all()
    assert (batch["input_ids"][masked] == 3).all()  # [MASK] wherever a label is set
    assert (batch["labels"][masked] >= 5).all()     # labels are real word ids


def test_sample_order_is_a_deterministic_permutation_per_epoch(tmp_path: Path) -> None:
    need("numpy", "h5py")
    from bert_data import ShardedSamples, find_training_files

    files = find_training_files(make_shards(tmp_path, samples=10, shards=3))
    data = ShardedSamples(files, 32, 5, seed=1)
    assert data.total == 30
    epoch0 = [data.locate(p) for p in range(30)]
    epoch1 = [data.locate(p) for p in range(30, 60)]
    assert sorted(epoch0) == sorted(epoch1) == [(s, r) for s in range(3) for r in range(10)]
    assert epoch0 != epoch1
    again = ShardedSamples(files, 32, 5, seed=1)
    assert [again.locate(p) for p in range(59, 29, -1)] == epoch1[::-1]  # any access order
    other = ShardedSamples(files, 32, 5, seed=2)
    assert [other.locate(p) for p in range(30)] != epoch0


def test_training_files_are_picked_by_name(tmp_path: Path) -> None:
    need("numpy", "h5py")
    from bert_data import find_training_files
    from common.runtime import PayloadError

    make_shards(tmp_path, shards=2)
    shutil.copy(tmp_path / "tiny_training_0.hdf5", tmp_path / "tiny_test_0.hdf5")
    assert [p.name for p in find_training_files(tmp_path)] == [
        "tiny_training_0.hdf5", "tiny_training_1.hdf5"]
    with pytest.raises(PayloadError, match="is not a directory"):
        find_training_files(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PayloadError, match="expected hdf5 files whose name contains 'training'"):
        find_training_files(tmp_path / "empty")


def test_shard_shape_mismatch_is_reported(tmp_path: Path) -> None:
    need("numpy", "h5py")
    from bert_data import ShardedSamples, find_training_files
    from common.runtime import PayloadError

    files = find_training_files(make_shards(tmp_path))
    with pytest.raises(PayloadError, match=r"input_ids has shape \(64, 32\), expected \(64, 128\)"):
        ShardedSamples(files, 128, 5, seed=0)


# ---------------------------------------------------------------------------------- config


def bert_args(*extra: str) -> Any:
    import pretrain_bert

    return pretrain_bert.parse_args([
        "--num-layers", "48", "--hidden-size", "1600", "--num-heads", "25",
        "--intermediate-size", "6400", "--vocab-size", "30522", "--input-dir", "/data",
        "--micro-batch-size", "16", "--gradient-accumulation", "24", "--lr", "0.0015",
        "--warmup", "0.05", "--constant", "0.25", "--max-steps", "155000", *extra])


def test_bert_1p5b_flags_give_the_reference_deepspeed_config() -> None:
    import pretrain_bert

    args = bert_args()
    pretrain_bert.validate(args)
    # REFERENCE.md §3.2: 384 samples per accelerator per step, ZeRO-1, BF16, clip 1.0.
    assert pretrain_bert.deepspeed_config(args, world_size=128) == {
        "train_batch_size": 384 * 128, "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 24, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 1}, "bf16": {"enabled": True},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
        "wall_clock_breakdown": False}
    fp32 = pretrain_bert.deepspeed_config(bert_args("--precision", "fp32"), world_size=8)
    assert fp32["bf16"] == {"enabled": False}


def test_bert_schedule_boundaries() -> None:
    import pretrain_bert

    args = bert_args()
    assert pretrain_bert.schedule(args, 0) == pytest.approx(0.0015 / 7750)
    assert pretrain_bert.schedule(args, 7749) == pytest.approx(0.0015)
    assert pretrain_bert.schedule(args, 7750 + 38750 - 1) == pytest.approx(0.0015)
    assert pretrain_bert.schedule(args, 155_000) == 0.0


def test_bert_defaults_and_launcher_flag() -> None:
    args = bert_args("--local_rank=3")
    assert (args.seq_length, args.max_predictions, args.optimizer, args.zero_stage,
            args.precision, args.phase, args.compile_steps, args.steps, args.keep_checkpoints,
            args.weight_decay, args.grad_clip, args.accelerator, args.max_position_embeddings,
            args.type_vocab_size) == (128, 20, "lamb", 1, "bf16", "train", 3, -1, 3, 0.01, 1.0,
                                      "auto", 512, 2)


@pytest.mark.parametrize("flags, message", [
    (("--num-heads", "24"), "--hidden-size 1600 is not divisible by --num-heads 24"),
    (("--warmup", "0.9"), "--warmup and --constant must be >= 0 and sum to at most 1"),
    (("--micro-batch-size", "0"), "--micro-batch-size must be at least 1"),
    (("--steps", "-2"), "--steps must be -1 (no bound) or >= 0"),
])
def test_bad_flags_are_user_errors(flags: tuple[str, ...], message: str) -> None:
    import pretrain_bert
    from common.runtime import PayloadError

    with pytest.raises(PayloadError) as error:
        pretrain_bert.validate(bert_args(*flags))
    assert str(error.value) == message


def test_program_never_imports_jobgen() -> None:
    for path in PAYLOAD.rglob("*.py"):
        text = path.read_text()
        assert "import jobgen" not in text and "from jobgen" not in text, path


# ---------------------------------------------------------------------------------- real runs

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-heads", "4",
        "--intermediate-size", "256", "--vocab-size", "1000", "--seq-length", "32",
        "--max-predictions", "5", "--micro-batch-size", "2", "--gradient-accumulation", "2",
        "--lr", "1e-3", "--warmup", "0.1", "--constant", "0.2", "--max-steps", "9",
        "--optimizer", "lamb", "--zero-stage", "1", "--precision", "bf16", "--seed", "5",
        "--checkpoint-every", "3", "--keep-checkpoints", "2"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env() -> dict[str, str]:
    """The test's env minus any rank variables it may itself have inherited."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT")}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def launch(args: list[str], cwd: Path, nproc: int = 2, launcher: str = "torchrun",
           timeout: int = 300) -> subprocess.CompletedProcess:
    """Run the program as a job would; the first launch on a fresh machine may JIT DeepSpeed's
    shm op (about a minute), hence the generous timeout."""
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(PROGRAM)]
    elif launcher == "deepspeed":
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nproc),
               "--master_port", str(free_port()), str(PROGRAM)]
    else:
        cmd = [sys.executable, str(PROGRAM)]
    started = time.monotonic()
    result = subprocess.run(cmd + args, cwd=cwd, env=clean_env(), capture_output=True, text=True,
                            timeout=timeout, check=False)
    print(f"[{launcher} x{nproc}] {' '.join(args[-6:])}: rc={result.returncode} "
          f"{time.monotonic() - started:.1f}s")
    return result


def events_of(result: subprocess.CompletedProcess, kind: str) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [e for e in read_events(result.stdout) if e["event"] == kind]


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need("numpy", "h5py")
    return make_shards(tmp_path_factory.mktemp("wikicorpus"))


@pytest.mark.deepspeed
@pytest.mark.slow
def test_compile_then_train_then_resume(shard_dir: Path, tmp_path: Path) -> None:
    need("torch", "deepspeed", "transformers", "h5py")
    out = tmp_path / "out"
    common = TINY + ["--input-dir", str(shard_dir), "--output-dir", str(out)]

    # Compile pass: exactly 3 steps from a fresh model, nothing written.
    compiled = launch(common + ["--phase", "compile"], tmp_path)
    compile_steps = events_of(compiled, "step")
    assert [e["step"] for e in compile_steps] == [1, 2, 3]
    assert all(e["phase"] == "compile" and math.isfinite(e["loss"]) for e in compile_steps)
    start = events_of(compiled, "start")[0]
    assert (start["world_size"], start["ranks_from"], start["accelerator"],
            start["optimizer"]) == (2, "launcher", "cpu", "payload.Lamb")
    assert [{k: v for k, v in e.items() if k != "time"} for e in events_of(compiled, "done")] == [
        {"event": "done", "phase": "compile", "step": 3, "consumed_samples": 24}]
    assert events_of(compiled, "checkpoint") == [] and not out.exists()

    # Training pass, bounded to 6 steps: checkpoints at 3 and 6.
    first = launch(common + ["--phase", "train", "--steps", "6"], tmp_path)
    steps = events_of(first, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    # Same nodes, same settings: the compile pass ran exactly the first training steps.
    assert [e["loss"] for e in compile_steps] == [e["loss"] for e in steps[:3]]
    assert [e["step"] for e in events_of(first, "checkpoint")] == [3, 6]
    assert events_of(first, "resume") == []
    root = out / "checkpoints"
    marker = json.loads((root / "step_00000006" / "COMPLETE").read_text())
    assert (marker["step"], marker["consumed_samples"]) == (6, 48)

    # A save that crashed half way (files, no marker) must not be resumed from.
    shutil.copytree(root / "step_00000006", root / "step_00000008")
    (root / "step_00000008" / "COMPLETE").unlink()

    second = launch(common + ["--phase", "train"], tmp_path)  # on to --max-steps 9
    resume = events_of(second, "resume")
    assert [(e["step"], e["consumed_samples"]) for e in resume] == [(6, 48)]
    resumed = events_of(second, "step")
    assert resumed[0]["step"] == 7 and [e["step"] for e in resumed] == [7, 8, 9]
    assert events_of(second, "done")[0]["step"] == 9
    # --keep-checkpoints 2; the crashed save's debris is gone too.
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "step_00000006", "step_00000009"]
    assert (root / "latest").read_text() == "step_00000009"
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in logged if e["event"] == "step"] == list(range(1, 10))
    # The schedule continues where it stopped: 9 steps, warmup 1, hold 2, decay to 0 at 9.
    assert [round(e["lr"] / 1e-3, 4) for e in resumed] == [0.5, 0.3333, 0.1667]


@pytest.mark.deepspeed
@pytest.mark.slow
def test_failing_run_exits_nonzero_with_one_line(tmp_path: Path) -> None:
    need("torch")
    empty = tmp_path / "no_shards"
    empty.mkdir()
    (empty / "wiki_test_0.hdf5").write_text("")
    # One rank: with two, their identical error lines can interleave on the shared stderr.
    result = launch(TINY + ["--input-dir", str(empty), "--output-dir", str(tmp_path / "o")],
                    tmp_path, nproc=1)
    assert result.returncode != 0
    message = (f"pretrain_bert: error: no training shards in {empty} "
               "(expected hdf5 files whose name contains 'training')")
    assert message in result.stderr.splitlines()


@pytest.mark.deepspeed
@pytest.mark.slow
def test_single_process_without_launcher(shard_dir: Path, tmp_path: Path) -> None:
    need("torch", "deepspeed", "transformers", "h5py")
    result = launch(TINY + ["--input-dir", str(shard_dir), "--output-dir", str(tmp_path / "o"),
                            "--phase", "compile", "--optimizer", "adamw", "--precision", "fp32"],
                    tmp_path, nproc=1, launcher="none")
    assert [e["step"] for e in events_of(result, "step")] == [1, 2, 3]
    start = events_of(result, "start")[0]
    assert (start["world_size"], start["ranks_from"], start["optimizer"]) == (
        1, "single", "torch.AdamW")


@pytest.mark.deepspeed
@pytest.mark.slow
def test_deepspeed_launcher(shard_dir: Path, tmp_path: Path) -> None:
    need("torch", "deepspeed", "transformers", "h5py")
    out = tmp_path / "out"
    result = launch(TINY + ["--input-dir", str(shard_dir), "--output-dir", str(out),
                            "--phase", "train", "--steps", "3"], tmp_path, launcher="deepspeed")
    assert [e["step"] for e in events_of(result, "step")] == [1, 2, 3]
    assert events_of(result, "start")[0]["world_size"] == 2
    assert [e["step"] for e in events_of(result, "checkpoint")] == [3]


# ---------------------------------------------------------------------- reference fidelity

def _tiny_args(*extra: str) -> Any:
    from pretrain_bert import parse_args
    return parse_args(["--num-layers", "3", "--hidden-size", "32", "--num-heads", "4",
                       "--intermediate-size", "64", "--vocab-size", "97", "--input-dir", "x",
                       "--micro-batch-size", "2", "--lr", "0.001", "--max-steps", "10",
                       "--hidden-dropout", "0", "--attention-dropout", "0", *extra])


def _reference_large_model_forward(model: Any, input_ids: Any, token_types: Any,
                                   mask: Any) -> Any:
    """The large-model wiring written out from the reference's equations with plain tensor
    operations: a zero-started residual stream r; r += attention(h), h = LN(r); r += FFN(h),
    h = LN(r). Padding is masked as the reference does, adding -10000 to the scores of padded
    keys."""
    import torch
    import torch.nn.functional as F
    bert, cfg = model.bert, model.config
    h = bert.embeddings(input_ids=input_ids, token_type_ids=token_types)
    additive = (1.0 - mask[:, None, None, :].float()) * -10000.0
    r = torch.zeros_like(h)
    heads, size = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    for layer in bert.encoder.layer:
        sa = layer.attention.self
        def split(x: Any) -> Any:
            return x.view(x.shape[0], x.shape[1], heads, size).transpose(1, 2)
        q, k, v = (split(F.linear(h, m.weight, m.bias)) for m in (sa.query, sa.key, sa.value))
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + additive, dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(h.shape)
        out = layer.attention.output
        r = r + F.linear(context, out.dense.weight, out.dense.bias)
        h = F.layer_norm(r, (cfg.hidden_size,), out.LayerNorm.weight, out.LayerNorm.bias,
                         cfg.layer_norm_eps)
        inter = layer.intermediate
        mid = F.gelu(F.linear(h, inter.dense.weight, inter.dense.bias))
        o = layer.output
        r = r + F.linear(mid, o.dense.weight, o.dense.bias)
        h = F.layer_norm(r, (cfg.hidden_size,), o.LayerNorm.weight, o.LayerNorm.bias,
                         cfg.layer_norm_eps)
    return h


def test_large_model_layer_norm_is_the_reference_wiring() -> None:
    need("torch", "transformers")
    import torch
    from pretrain_bert import build_model
    torch.manual_seed(0)
    model = build_model(_tiny_args("--layer-norm-large-model")).eval()
    input_ids = torch.randint(0, 97, (2, 16))
    token_types = torch.tensor([[0] * 8 + [1] * 8, [0] * 5 + [1] * 11])
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 11:] = 0  # the second sample is padded
    inputs = {"input_ids": input_ids, "token_type_ids": token_types, "attention_mask": mask}
    with torch.no_grad():
        ours = model.bert(**inputs).last_hidden_state
        expected = _reference_large_model_forward(model, input_ids, token_types, mask)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    # Same parameters as the stock network (checkpoints and optimizer groups are unchanged),
    # but a different function of them.
    torch.manual_seed(0)
    stock = build_model(_tiny_args()).eval()
    assert [n for n, _ in stock.named_parameters()] == [n for n, _ in model.named_parameters()]
    stock.load_state_dict(model.state_dict())
    with torch.no_grad():
        plain = stock.bert(**inputs).last_hidden_state
    assert not torch.allclose(plain, ours, atol=1e-3)


def test_model_and_optimizer_values_reach_their_places() -> None:
    need("torch", "transformers")
    import torch
    from accelerators import Accelerator, build_optimizer
    from pretrain_bert import build_model
    args = _tiny_args("--hidden-dropout", "0.15", "--attention-dropout", "0.05",
                      "--layer-norm-eps", "1e-7", "--init-std", "0.03", "--beta1", "0.8",
                      "--beta2", "0.95", "--eps", "1e-5", "--no-decay", "bias", "LayerNorm")
    model = build_model(args)
    cfg = model.config
    assert (cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob) == (0.15, 0.05)
    assert (cfg.layer_norm_eps, cfg.initializer_range) == (1e-7, 0.03)
    cpu = Accelerator("cpu", torch.device("cpu"), "gloo")
    for kind in ("lamb", "adamw"):
        opt, _ = build_optimizer(kind, model, cpu, args.lr, 0.01, (args.beta1, args.beta2),
                                 args.eps, args.no_decay)
        assert opt.defaults["betas"] == (0.8, 0.95) and opt.defaults["eps"] == 1e-5
        decayed, plain = opt.param_groups
        names = {id(p): n for n, p in model.named_parameters()}
        assert all("bias" not in names[id(p)] and "LayerNorm" not in names[id(p)]
                   for p in decayed["params"])
        assert decayed["weight_decay"] == 0.01 and plain["weight_decay"] == 0.0
    # An empty list decays every parameter.
    opt, _ = build_optimizer("adamw", model, cpu, args.lr, 0.01, (0.9, 0.999), 1e-6, [])
    assert len(opt.param_groups) == 1
    assert len(opt.param_groups[0]["params"]) == len(list(model.parameters()))


def test_schedule_flags_shape_the_learning_rate() -> None:
    from pretrain_bert import parse_args, schedule
    args = parse_args(["--num-layers", "1", "--hidden-size", "8", "--num-heads", "2",
                       "--intermediate-size", "16", "--vocab-size", "10", "--input-dir", "x",
                       "--micro-batch-size", "1", "--lr", "0.01", "--max-steps", "100",
                       "--warmup", "0.1", "--min-lr", "0.001", "--decay-steps", "60",
                       "--schedule", "cosine"])
    assert schedule(args, 9) == pytest.approx(0.01)          # end of warmup
    assert schedule(args, 35) == pytest.approx(0.0055)       # cosine midpoint of 10..60
    assert schedule(args, 60) == schedule(args, 99) == pytest.approx(0.001)


@pytest.mark.deepspeed
@pytest.mark.slow
def test_large_model_network_trains_under_zero1(shard_dir: Path, tmp_path: Path) -> None:
    """BERT 1.5B's wiring under the real DeepSpeed ZeRO-1 bf16 engine on 2 CPU processes, with the
    reference's optimizer values: the loss goes down."""
    need("torch", "deepspeed", "transformers", "h5py")
    result = launch(TINY + ["--input-dir", str(shard_dir), "--output-dir", str(tmp_path / "o"),
                            "--phase", "train", "--steps", "8", "--layer-norm-large-model",
                            "--eps", "1e-6", "--no-decay", "bias", "gamma", "beta", "LayerNorm",
                            "--lr", "0.01", "--warmup", "0", "--constant", "1"], tmp_path)
    losses = [e["loss"] for e in events_of(result, "step")]
    assert len(losses) == 8
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
