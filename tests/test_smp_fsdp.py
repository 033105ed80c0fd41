"""payload/smp_fsdp/train_fsdp.py trains as SageMaker's own SMP v2 example does (issue 34).

SMP v2 (``torch.sagemaker``) installs only in SageMaker's images, so its path runs here against
tests/stand_ins/torch_sagemaker, a stand-in written from SMP v2's documentation: ``transform``
puts its own TransformerLayer class where the Hugging Face decoder layers were and, with tensor
parallelism, splits their MLP weights over the TP group. Everything else is real: FSDP (FSDP1 on
the SMP path, FSDP2 without), activation checkpointing, torch.distributed.checkpoint, gloo.

The in-process tests build the trainer on a one-rank gloo group; the multi-process ones run under
torchrun through tests/stand_ins/smp_scenarios.py: two ranks without SMP (about 12 s), and four
ranks with TP 2 x hybrid shard 2 (two launches of about 27 s each: marked slow).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
STAND_INS = Path(__file__).resolve().parent / "stand_ins"
PROGRAM_DIR = ROOT / "payload" / "smp_fsdp"
TINY = ["--family", "llama", "--num-layers", "2", "--hidden-size", "64", "--num-heads", "4",
        "--intermediate-size", "128", "--seq-length", "16", "--vocab-size", "128",
        "--micro-batch-size", "2", "--gradient-accumulation", "1", "--lr", "1e-2",
        "--max-steps", "10", "--checkpoint-every", "100", "--device", "cpu", "--synthetic",
        "--phase", "train"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def make_trainer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Builds the program's trainer on a one-rank gloo group, with or without the stand-in."""
    monkeypatch.syspath_prepend(str(STAND_INS))
    monkeypatch.syspath_prepend(str(PROGRAM_DIR))
    import torch_sagemaker
    import train_fsdp

    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SM_HP_MP_PARAMETERS", raising=False)

    def make(*flags: str, smp: bool = True) -> Any:
        if smp:
            monkeypatch.setattr(torch_sagemaker, "state", torch_sagemaker._State())
            for alias, real in torch_sagemaker._NAMES.items():
                monkeypatch.setitem(sys.modules, alias, sys.modules[real])
        else:
            monkeypatch.setitem(sys.modules, "torch.sagemaker", None)   # import fails
        args = train_fsdp.parse_args([*TINY, "--output-dir", str(tmp_path / "run"), *flags])
        return train_fsdp.FsdpTrainer(args, "launcher")

    yield make
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def inner(module: Any) -> Any:
    """The module inside a checkpoint wrapper (or the module itself)."""
    return getattr(module, "_checkpoint_wrapped_module", module)


def test_smp_path_makes_one_fsdp_unit_per_smp_layer_and_checkpoints_those(
        make_trainer: Callable[..., Any]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch_sagemaker.transformer import TransformerLayer

    trainer = make_trainer("--activation-checkpointing", "full")
    units = [m for m in trainer.sharded.modules() if isinstance(m, FullyShardedDataParallel)]
    assert units[0] is trainer.sharded
    assert [type(inner(u.module)) for u in units[1:]] == [TransformerLayer, TransformerLayer]
    wrapped = [m for m in trainer.sharded.modules() if isinstance(m, CheckpointWrapper)]
    assert [type(inner(w)) for w in wrapped] == [TransformerLayer, TransformerLayer]
    # Original parameters, not FSDP's flat ones: the optimizer and the decay rule see names.
    from fsdp_model import clean_name
    names = [clean_name(n) for n, _ in trainer.sharded.named_parameters()]
    assert names and not any("flat_param" in n for n in names)
    assert "model.layers.0.layer.mlp.down_proj.weight" in names


def test_selective_checkpointing_wraps_every_second_layer(
        make_trainer: Callable[..., Any]) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    trainer = make_trainer("--activation-checkpointing", "selective", "--num-layers", "4")
    layers = trainer.sharded.module.model.layers
    checkpointed = [isinstance(layer._fsdp_wrapped_module, CheckpointWrapper) for layer in layers]
    assert checkpointed == [True, False, True, False]


@pytest.mark.parametrize("smp", [True, False])
def test_buffers_stay_fp32_while_parameters_compute_in_bf16(
        make_trainer: Callable[..., Any], smp: bool) -> None:
    trainer = make_trainer("--precision", "bf16", smp=smp)
    seen: dict[str, Any] = {}
    rotary = next(m for n, m in trainer.sharded.named_modules() if n.endswith("rotary_emb"))
    rotary.register_forward_pre_hook(
        lambda module, _: seen.update(buffer=module.inv_freq.dtype))
    layer = next(m for m in trainer.sharded.modules() if type(m).__name__ == "LlamaMLP")
    layer.register_forward_hook(lambda module, _, out: seen.update(compute=out.dtype))
    numbers = trainer.train_step()
    assert seen == {"buffer": torch.float32, "compute": torch.bfloat16}
    assert numbers["loss"] > 0


def test_smp_path_leaves_the_process_groups_to_smp(make_trainer: Callable[..., Any]) -> None:
    """FSDP gets no mesh and no group from the program: it shards over SMP's groups. The
    stand-in's patch, like SMP's, hands FSDP its own groups, so a program that still passed a
    device mesh would meet FSDP's refusal of both, as below."""
    import torch_sagemaker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    trainer = make_trainer()
    assert trainer.mesh is None
    assert trainer.sharded.process_group is torch_sagemaker.state.shard_process_group
    assert trainer.sharding["shard_group"] == 1 and trainer.sharding["replicas"] == 1
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
    with pytest.raises(ValueError, match="Cannot pass both process_group and device_mesh"):
        FullyShardedDataParallel(torch.nn.Linear(2, 2), device_mesh=mesh,
                                 sharding_strategy=ShardingStrategy.HYBRID_SHARD,
                                 device_id=torch.device("cpu"))


@pytest.mark.parametrize(("smp", "family"), [(True, "llama"), (False, "llama"),
                                             (True, "gpt_neox"), (False, "gpt_neox")])
def test_weight_decay_goes_to_the_matrices_not_norms_or_biases(
        make_trainer: Callable[..., Any], smp: bool, family: str) -> None:
    """The SMP example's groups: LayerNorm and RMSNorm parameters and every bias undecayed;
    the matrices and the embeddings decayed (Llama has no biases; GPT-NeoX has them)."""
    trainer = make_trainer("--weight-decay", "0.1", "--family", family, smp=smp)
    name_of = {id(p): n for n, p in trainer.sharded.named_parameters()}
    decayed = {name_of[id(p)] for g in trainer.optimizer.param_groups
               if g["weight_decay"] == 0.1 for p in g["params"]}
    plain = {name_of[id(p)] for g in trainer.optimizer.param_groups
             if g["weight_decay"] == 0.0 for p in g["params"]}
    assert decayed | plain == set(name_of.values()) and not decayed & plain
    if family == "llama":
        assert plain and all(n.endswith("norm.weight") for n in plain)
        assert any(n.endswith("q_proj.weight") for n in decayed)
        assert any(n.endswith("embed_tokens.weight") for n in decayed)
    else:
        assert any("layernorm.weight" in n for n in plain)
        assert any(n.endswith("query_key_value.bias") for n in plain)
        assert all(n.endswith(("norm.weight", "norm.bias", ".bias")) for n in plain)
        assert any(n.endswith("query_key_value.weight") for n in decayed)
        assert any(n.endswith("embed_in.weight") for n in decayed)
    assert {g["eps"] for g in trainer.optimizer.param_groups} == {1e-8}   # AdamW's default


def test_recipe_no_decay_fragments_decide_by_name(make_trainer: Callable[..., Any]) -> None:
    trainer = make_trainer("--weight-decay", "0.1", "--no-decay", "norm", "embed")
    name_of = {id(p): n for n, p in trainer.sharded.named_parameters()}
    plain = {name_of[id(p)] for g in trainer.optimizer.param_groups
             if g["weight_decay"] == 0.0 for p in g["params"]}
    assert {n for n in name_of.values() if "norm" in n or "embed" in n} == plain


def test_activation_offloading_follows_smps_configuration(
        make_trainer: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SM_HP_MP_PARAMETERS", json.dumps({"sm_activation_offloading": True}))
    trainer = make_trainer("--activation-checkpointing", "full")
    assert type(trainer.model).__name__ == "OffloadWrapper"
    assert inner(trainer.model) is trainer.sharded
    assert trainer.train_step()["loss"] > 0


def test_plain_path_shards_each_decoder_layer_with_fsdp2(
        make_trainer: Callable[..., Any]) -> None:
    from torch.distributed.fsdp import FSDPModule
    trainer = make_trainer("--activation-checkpointing", "full", smp=False)
    units = [m for m in trainer.sharded.modules() if isinstance(m, FSDPModule)]
    assert units[0] is trainer.sharded
    assert [type(inner(u)).__name__ for u in units[1:]] == ["LlamaDecoderLayer"] * 2


def scenario(name: str, out: Path, *flags: str, ranks: int = 4,
             tp: int = 2) -> list[dict[str, Any]]:
    """Ranks under torchrun running smp_scenarios.py (TP x hybrid shard 2); their reports."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(ranks), str(STAND_INS / "smp_scenarios.py"), name,
               str(out), *TINY, "--output-dir", str(out / "run"), "--precision", "fp32",
               "--tensor-parallel", str(tp), "--hybrid-shard", "2", *flags]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("smp-tp")
    return out, scenario("train-save", out, "--grad-clip", "1e9",
                         "--activation-checkpointing", "full")


@pytest.mark.slow
def test_smp_clip_gives_the_unsharded_models_norm_on_every_rank(
        tp_run: tuple[Path, list[dict[str, Any]]]) -> None:
    _, reports = tp_run
    norms = {r["norm"] for r in reports}
    assert len(norms) == 1, norms
    assert reports[0]["norm"] == pytest.approx(reports[0]["reference_norm"], rel=1e-5)


@pytest.mark.slow   # two FSDP2 ranks on gloo (about 20 s)
def test_plain_fsdp2_clip_gives_the_unsharded_models_norm_on_every_rank(tmp_path: Path) -> None:
    reports = scenario("plain-norm", tmp_path, "--grad-clip", "1e9", ranks=2, tp=1)
    assert reports[0]["norm"] == reports[1]["norm"]
    assert reports[0]["norm"] == pytest.approx(reports[0]["reference_norm"], rel=1e-5)


@pytest.mark.slow
def test_tensor_parallel_checkpoint_keeps_every_slice_through_a_restart(
        tp_run: tuple[Path, list[dict[str, Any]]]) -> None:
    out, saved = tp_run
    step = out / "run" / "checkpoints" / "step_00000003"
    assert (step / "tp2-0").is_dir() and (step / "tp2-1").is_dir()
    # The two TP ranks hold different slices under the same names: each must come back.
    assert [r["tp_rank"] for r in saved] == [0, 1, 0, 1]
    # FSDP's shard groups are SMP's (hybrid shard 2 over each TP rank's data-parallel peers).
    assert [r["shard_ranks"] for r in saved] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert saved[0]["mlp_slice_sum"] != saved[1]["mlp_slice_sum"]
    loaded = scenario("load", out)
    for report in loaded:
        assert report["resumed_step"] == 3 and report["same_names"]
        assert report["difference_before_load"] > 0   # trained weights differ from fresh ones
        assert report["max_difference"] == 0.0


def test_the_background_saves_staging_follows_what_this_torch_takes(
        monkeypatch: pytest.MonkeyPatch, make_trainer: Callable[..., Any]) -> None:
    """async_save's staging argument: none on a torch whose async_save has no `async_stager`
    (2.4.1, SMP v2's image, where passing one is a TypeError), DCP's default for FSDP2's state
    (ours only for FSDP1's ShardedTensors, under SMP)."""
    import fsdp_checkpoint
    import torch.distributed.checkpoint as dcp

    trainer = make_trainer(smp=False)
    state = fsdp_checkpoint.state(trainer)
    assert fsdp_checkpoint._stager(state) == {}

    def old_async_save(state_dict: Any, *, checkpoint_id: Any = None, storage_writer: Any = None,
                       planner: Any = None, process_group: Any = None) -> Any:
        raise AssertionError("not called")

    monkeypatch.setattr(dcp, "async_save", old_async_save)        # torch 2.4.1's signature
    sharded_state = {"model": {"w": object()}}
    assert fsdp_checkpoint._stager(sharded_state) == {}
    assert fsdp_checkpoint._stager(state) == {}
