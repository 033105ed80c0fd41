"""The NeMo export (payload/neuron_nemo/export_neox.py, issue 51 item 1): a tiny GPT-NeoX saved as
NeMo saves it at TP=2, PP=2 (tests/stand_ins/nemo_checkpoint.py), a Megatron dataset written by
megatron-core with NeMo's index maps beside it, and a metrics.jsonl whose step N+1 loss is the
original model's on that step's batch. The export must load in transformers alone and match it;
a broken rank merge must fail the proof with both numbers, and bad input is refused in one line.
"""
from __future__ import annotations

import importlib.util
import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "stand_ins"))
import nemo_checkpoint  # noqa: E402

TP, PP, LAYERS, HIDDEN, HEADS, FFN, SEQ = 2, 2, 4, 32, 4, 64, 16
DEVICES, MBS, GBS, MAX_STEPS, SEED, STEP = 8, 2, 8, 10, 1234, 2
NAME = "megatron_neox--step={}-consumed_samples={}.0.ckpt"


def _program() -> Any:
    path = ROOT / "payload" / "neuron_nemo" / "export_neox.py"
    spec = importlib.util.spec_from_file_location("export_neox", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


program = _program()


def overrides(run: Path, prefix: str, **change: Any) -> list[str]:
    """The training pass's overrides, keyed as jobgen/payloads/neuron_nemo.py renders them."""
    values = {"trainer.devices": DEVICES, "trainer.num_nodes": 1, "trainer.max_steps": MAX_STEPS,
              "model.seed": SEED, "model.make_vocab_size_divisible_by": TP,
              "model.micro_batch_size": MBS, "model.global_batch_size": GBS,
              "model.tensor_model_parallel_size": TP, "model.pipeline_model_parallel_size": PP,
              "model.max_position_embeddings": 64, "model.encoder_seq_length": SEQ,
              "model.hidden_size": HIDDEN, "model.ffn_hidden_size": FFN,
              "model.num_layers": LAYERS, "model.num_attention_heads": HEADS,
              "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
              "model.layernorm_epsilon": 1e-05, "model.position_embedding_type": "rope",
              "model.rotary_percentage": 1.0, "model.transformer_block_type": "gpt_j",
              "model.data.data_prefix": f"[1.0,{prefix}]", "model.data.seq_length": SEQ,
              "+model.save_xser": True, "exp_manager.explicit_log_dir": run / "nemo",
              "+exp_manager.checkpoint_callback_params.dirpath": run / "nemo" / "checkpoints"}
    values.update(change)
    return ["--config-name=megatron_neox_config", *(f"{k}={v}" for k, v in values.items())]


def _tokenizer(folder: Path) -> tuple[Path, Path, int]:
    import tokenizers
    made = tokenizers.ByteLevelBPETokenizer()
    text = [" ".join(f"w{(i * 7 + j) % 53}" for j in range(30)) for i in range(60)]
    made.train_from_iterator(text, vocab_size=301, min_frequency=1,
                             special_tokens=["<|endoftext|>"], show_progress=False)
    folder.mkdir(parents=True)
    vocab, merges = made.save_model(str(folder))
    return Path(vocab), Path(merges), made.get_vocab_size()


def _model(vocab: int) -> Any:
    import transformers
    config = transformers.GPTNeoXConfig(
        vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, intermediate_size=FFN,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 1.0},
        max_position_embeddings=64, use_parallel_residual=True, tie_word_embeddings=False)
    torch.manual_seed(7)
    model = transformers.GPTNeoXForCausalLM(config)
    with torch.no_grad():   # weights of every kind distinct, so that a misplaced one shows
        for name, param in model.named_parameters():
            param.normal_(1.0 if "norm" in name and name.endswith("weight") else 0.0, 0.3)
    return model.eval()


def _documents(prefix: str, vocab: int, seed: int = 3) -> list[np.ndarray]:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    rng = np.random.RandomState(seed)
    docs = [rng.randint(0, vocab, size=int(rng.randint(5, 40))) for _ in range(30)]
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in docs:
        builder.add_item(torch.tensor(doc, dtype=torch.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return docs


def _reader(stem: str, docs: list[np.ndarray]) -> Any:
    """Sample i of one prefix read independently: the documents laid end to end in doc_idx
    order, sample i the seq + 1 tokens from its shuffled sample_idx row's position."""
    doc_idx = np.load(stem + "_doc_idx.npy")
    rows = np.load(stem + "_sample_idx.npy")
    shuffle = np.load(stem + "_shuffle_idx.npy")
    stream = np.concatenate([docs[d] for d in doc_idx])
    starts = np.cumsum([0] + [len(docs[d]) for d in doc_idx])

    def sample(i: int) -> np.ndarray:
        j, off = rows[shuffle[i % (len(rows) - 1)]]
        at = int(starts[j]) + int(off)
        return stream[at:at + SEQ + 1]
    return sample


def _step_batch(sample: Any, consumed: int) -> list[torch.Tensor]:
    """The next step's micro-batches: NeMo's batch sampler deals sample j of the step to
    data-parallel rank j % dp, each rank's share cut into micro-batches in order."""
    dp = DEVICES // (TP * PP)
    batch = [consumed + j for j in range(GBS)]
    out = []
    for rank in range(dp):
        mine = batch[rank::dp]
        for k in range(0, len(mine), MBS):
            out.append(torch.tensor(np.stack([sample(i) for i in mine[k:k + MBS]]),
                                    dtype=torch.long))
    return out


def _loss(model: Any, batches: list[torch.Tensor]) -> float:
    with torch.no_grad():
        losses = [float(model(input_ids=b, labels=b).loss) for b in batches]
    return sum(losses) / len(losses)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("nemo")
    vocab_file, merges_file, tokens = _tokenizer(base / "gpt2")
    padded = -(-tokens // (TP * TP)) * TP * TP
    prefix = str(base / "data" / "corpus_text_document")
    (base / "data").mkdir()
    docs = _documents(prefix, tokens)
    samples = int(math.ceil(MAX_STEPS * GBS * 1.0 * 1.005))
    stem = f"{prefix}_train_indexmap_{samples}ns_{SEQ}sl_{SEED}s"
    nemo_checkpoint.index_maps(stem, [len(d) for d in docs], samples, SEQ, SEED)
    model = _model(padded)
    hf = model.state_dict()
    ranks = nemo_checkpoint.rank_states(hf, TP, PP, LAYERS, HIDDEN // HEADS)
    logged = _loss(model, _step_batch(_reader(stem, docs), STEP * GBS))
    return {"base": base, "vocab": vocab_file, "merges": merges_file, "prefix": prefix,
            "ranks": ranks, "model": model, "logged": logged, "tokens": tokens}


def _run(made: dict[str, Any], tmp: Path, xser: bool = True,
         logged: float | None = None, pp: int = PP) -> Path:
    """A run folder: the checkpoint of STEP (and an incomplete one after it), the metrics.
    Rank folders as NeMo's inject_model_parallel_rank names them: mp_rank_TT at PP 1."""
    run = tmp / "run"
    ranks = made["ranks"] if pp == PP else nemo_checkpoint.rank_states(
        made["model"].state_dict(), TP, pp, LAYERS, HIDDEN // HEADS)
    for step, whole in ((STEP, True), (STEP + 2, False)):
        for (t, p), state in ranks.items():
            folder = f"mp_rank_{t:02d}" if pp == 1 else f"tp_rank_{t:02d}_pp_rank_{p:03d}"
            path = run / "nemo" / "checkpoints" / folder / NAME.format(step, step * GBS)
            nemo_checkpoint.save(nemo_checkpoint.lightning(state, step), path, xser)
            if not whole and (t, p) == (1, pp - 1):
                if xser:
                    (path.with_name(path.name + ".tensors") / "tensor_0.pt").unlink()
                else:
                    path.write_bytes(path.read_bytes()[:100])
    (run / "train").mkdir(parents=True)
    loss = made["logged"] if logged is None else logged
    events = [{"event": "step", "phase": "train", "step": s, "loss": loss + (s != 3)}
              for s in (1, 2, 3, 4)]
    (run / "train" / "metrics.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in events))
    return run


def _export(made: dict[str, Any], run: Path, *extra: str, xser: bool = True,
            change: dict[str, Any] | None = None) -> int:
    return program.main([
        *overrides(run, made["prefix"], **{"+model.save_xser": xser, **(change or {})}),
        "--tokenizer-files", str(made["vocab"]), str(made["merges"]), "--precision", "fp32",
        "--export-root", str(run / "export"), *extra])


@pytest.mark.parametrize("xser", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_the_export_loads_in_transformers_alone_and_computes_the_trainers_loss(
        made: dict[str, Any], tmp_path: Path, xser: bool,
        capsys: pytest.CaptureFixture[str]) -> None:
    import transformers
    run = _run(made, tmp_path, xser)
    assert _export(made, run, xser=xser) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"step-{STEP}: exported and proven" in out
    folder = run / "export" / f"step-{STEP}"
    record = json.loads((folder / "jobgen-export.json").read_text())
    assert record["proof"]["ok"] is True and record["proof"]["micro_batches"] == 4
    assert (record["tensor_parallel"], record["pipeline_parallel"]) == (TP, PP)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.arange(20).reshape(1, 20)
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, made["model"](ids).logits, atol=1e-4)
    assert abs(record["proof"]["measured_loss"] - made["logged"]) < 1e-5 * made["logged"]


@pytest.mark.slow   # an export (about 6 s)
def test_without_pipeline_stages_the_ranks_are_read_from_nemos_mp_rank_folders(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(made, tmp_path, pp=1)
    assert _export(made, run, change={"model.pipeline_model_parallel_size": 1}) == 0, \
        capsys.readouterr().err
    record = json.loads((run / "export" / f"step-{STEP}" / "jobgen-export.json").read_text())
    assert (record["pipeline_parallel"], record["proof"]["micro_batches"]) == (1, 4)


def test_qkv_joined_in_the_wrong_tp_order_fails_the_proof_with_both_numbers(
        made: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    join = program.join
    monkeypatch.setattr(program, "join", lambda name, slices, dim: join(
        name, slices[::-1] if "query_key_value" in name else slices, dim))
    run = _run(made, tmp_path)
    assert _export(made, run) == 2
    err = capsys.readouterr().err
    assert "differs from the trainer's" in err and f"{made['logged']:.6g}" in err
    assert len(err.strip().splitlines()) == 1
    assert not (run / "export" / f"step-{STEP}").exists()
    assert [p.name for p in (run / "export").iterdir()] == []


def test_a_row_parallel_weight_joined_on_dim_0_is_refused_as_another_shape(
        made: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(program.IN_LAYER, "mlp.dense_4h_to_h.weight",
                        ("mlp.dense_4h_to_h.weight", 0))
    assert _export(made, _run(made, tmp_path)) == 2
    err = capsys.readouterr().err
    assert "of another shape gpt_neox.layers.0.mlp.dense_4h_to_h.weight" in err
    assert len(err.strip().splitlines()) == 1


def test_an_incomplete_step_is_refused_in_one_line_and_not_chosen_by_default(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(made, tmp_path)
    assert _export(made, run, "--step", str(STEP + 2), "--on-node") == 78
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"step {STEP + 2} is not complete" in err
    assert f"complete: {STEP}" in err


def test_a_checkpoint_of_another_model_is_refused_in_one_line(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(made, tmp_path)
    assert _export(made, run, change={"model.num_layers": 6}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds another model" in err
    assert "missing gpt_neox.layers.2." in err


def test_a_partial_rotary_model_is_refused_before_its_ranks_are_read(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """NeMo's partial rotary embedding at d22aabf is not GPT-NeoX's (export_neox.py's
    PARTIAL_ROTARY): no Hugging Face config computes it, so the export refuses it up front."""
    run = _run(made, tmp_path)
    assert _export(made, run, change={"model.rotary_percentage": 0.25}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.rotary_percentage=0.25" in err
    assert "not GPT-NeoX's" in err and not (run / "export").exists()


@pytest.mark.slow   # an export (about 6 s)
def test_a_blend_of_two_prefixes_is_read_as_nemo_blends_them(
        made: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Weights 0.1 and 0.9: 9 + 73 samples (ceil(80 w 1.005)), so NeMo blends in 82 bins (fewer
    than 100): int(8.2) = 8 to the first prefix, then the second's (blended idx - 8), so this
    step's blended samples 16..23 are the second prefix's 8..15."""
    (tmp_path / "data").mkdir()
    readers = []
    for k, weight in enumerate((0.1, 0.9)):
        prefix = str(tmp_path / "data" / f"part{k}_text_document")
        docs = _documents(prefix, made["tokens"], seed=10 + k)
        samples = int(math.ceil(MAX_STEPS * GBS * weight * 1.005))
        stem = f"{prefix}_train_indexmap_{samples}ns_{SEQ}sl_{SEED}s"
        nemo_checkpoint.index_maps(stem, [len(d) for d in docs], samples, SEQ, SEED)
        readers.append((prefix, _reader(stem, docs)))
    second = readers[1][1]
    logged = _loss(made["model"], _step_batch(lambda i: second(i - 8), STEP * GBS))
    run = _run(made, tmp_path, logged=logged)
    blend = f"[0.1,{readers[0][0]},0.9,{readers[1][0]}]"
    assert _export(made, run, change={"model.data.data_prefix": blend}) == 0, \
        capsys.readouterr().err
    record = json.loads((run / "export" / f"step-{STEP}" / "jobgen-export.json").read_text())
    assert abs(record["proof"]["measured_loss"] - logged) < 1e-5 * logged
    assert abs(logged - made["logged"]) > 1e-2      # another batch than the single prefix's


def test_the_export_stage_of_a_nemo_recipe_runs_it_with_the_training_passs_overrides(
        tmp_path: Path) -> None:
    from tests.test_rehearsal_data import jobgen, ok
    text = ok(jobgen(tmp_path, "render", "neox20b", "--stage", "export", "--step", "4",
                     "--set", "model.rotary_percentage=1.0"))
    assert "PROGRAM=neuron_nemo/export_neox.py\n" in text
    block = re.search(r"^ARGS=\(\n(.*?)^\)\n", text, re.M | re.S)
    assert block is not None
    words = [w for line in block.group(1).splitlines() for w in shlex.split(line)]
    args = program.parse_args(words)
    o = program.Overrides(args.overrides)
    dims = program.model_dims(o)
    assert (dims["hidden_size"], dims["num_hidden_layers"], dims["num_attention_heads"],
            dims["intermediate_size"], dims["rotary_pct"]) == (6144, 44, 64, 24576, 1.0)
    assert program.padded_vocab(50257, o) == 50304     # 8 x 8 = 64 (TP 8)
    assert (args.step, args.precision, args.on_node, args.micro_batches) == (4, "bf16", True, 8)
    assert [str(f) for f in args.tokenizer_files][0].endswith("gpt2/gpt2-vocab.json")
    assert o.listed("model.data.data_prefix")[1].endswith("my-gpt2_text_document")


def test_the_nemo_recipes_as_published_are_refused_an_export_in_one_line(
        tmp_path: Path) -> None:
    from tests.test_rehearsal_data import jobgen
    for recipe in ("neox20b", "pythia6.9b"):
        done = jobgen(tmp_path, "render", recipe, "--stage", "export")
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr.count("\n") == 1
        assert "model.rotary_percentage 0.25" in done.stderr and "not GPT-NeoX's" in done.stderr


def test_every_k_runs_the_follower_with_the_nemo_export_and_refuses_the_published_recipes(
        tmp_path: Path) -> None:
    """--every K builds the follower of the export stage's own words: it lists the sealed steps
    with them (--list-sealed), and its metrics.jsonl is the one the export proves with."""
    from tests.test_rehearsal_data import jobgen, ok
    text = ok(jobgen(tmp_path, "submit", "neox20b", "--stages", "train,export", "--every", "8",
                     "--dry-run", "--set", "model.rotary_percentage=1.0"))
    follower = text[text.index("PROGRAM=common/follow_steps.py\n"):]
    block = re.search(r"^ARGS=\(\n(.*?)^\)\n", follower, re.M | re.S)
    assert block is not None
    words = [w for line in block.group(1).splitlines() for w in shlex.split(line)]
    own, export = words[:words.index("+export")], words[words.index("+export") + 1:]
    assert export[0] == "neuron_nemo/export_neox.py" and "--step" not in export
    args = program.parse_args(export[1:])
    _, root, metrics = program.placed(program.Overrides(args.overrides))
    assert own[own.index("--metrics") + 1] == str(metrics)
    assert str(metrics).endswith("/train/metrics.jsonl") and root.name == "checkpoints"
    assert own[own.index("--every") + 1] == "8" and "--checkpoints" not in own
    for recipe in ("neox20b", "pythia6.9b"):   # as published: refused as --stage export is
        done = jobgen(tmp_path, "submit", recipe, "--stages", "train,export", "--every", "8",
                      "--dry-run")
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr.count("\n") == 1, done.stderr
        assert "model.rotary_percentage 0.25" in done.stderr and "not GPT-NeoX's" in done.stderr
