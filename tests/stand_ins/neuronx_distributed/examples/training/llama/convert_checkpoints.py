"""Stand-in for NxD's examples/training/llama/convert_checkpoints.py (aws-neuron/
neuronx-distributed 4f95471; CheckpointConverterBase in scripts/checkpoint_converter.py), for
tests/test_export_llama.py: neuronx_distributed and torch_xla do not install here.

Its output contract, as read upstream: the same flags (parse_known_args; ``type=bool`` flags
take any value as true), rank files looked up as upstream does, and ``--convert_to_full_state``
writes OUTPUT_DIR/checkpoint.pt, one dict in Hugging Face Llama names. The weights are a seeded
LlamaForCausalLM's (built from --config; seed JOBGEN_STAND_IN_SEED, default 0), not the ranks'.
JOBGEN_STAND_IN_BREAK=rename|transpose|fail breaks the output, or exits 1, for the tests.
"""
import argparse
import json
import os
import sys


def parser():
    p = argparse.ArgumentParser()
    for flag in ("--input_dir", "--output_dir"):
        p.add_argument(flag, type=str, required=True)
    p.add_argument("--config", type=str)
    p.add_argument("--model_key", type=str, default="model")
    for flag in ("--tp_size", "--pp_size", "--ep_size", "--virtual_pp_size",
                 "--kv_size_multiplier"):
        p.add_argument(flag, type=int, default=1)
    p.add_argument("--n_layers", type=int, default=0)
    for flag in ("--coalesce_qkv", "--qkv_linear", "--fuse_qkv", "--load_xser", "--save_xser"):
        p.add_argument(flag, type=bool, default=False)
    for flag in ("--convert_from_xser", "--convert_to_xser", "--convert_from_full_state",
                 "--convert_to_full_state"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--model_style", type=str, choices=["hf", "megatron"], default="hf")
    return p


def weights(config: dict, seed: int) -> dict:
    """The seeded model's state_dict: what the stand-in says the ranks merge into."""
    import torch
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).state_dict()


def rank_file(input_dir: str, tp: int, pp: int) -> str:
    """Upstream's get_input_filename: the v1 folder, else the v2 file, else an error."""
    v1 = f"tp_rank_{tp:02d}_pp_rank_{pp:02d}"
    for name in (v1, f"dp_rank_00_{v1}.pt"):
        if os.path.exists(os.path.join(input_dir, name)):
            return name
    raise RuntimeError(f"Error: neither {v1} nor dp_rank_00_{v1}.pt exist in {input_dir}")


def main() -> None:
    import torch

    args, _ = parser().parse_known_args()
    assert sum(int(getattr(args, f)) for f in ("convert_from_full_state", "convert_to_full_state",
                                               "convert_from_xser", "convert_to_xser")) == 1, \
        "Exactly one '--convert_*' flag must be specified"
    assert args.convert_to_full_state, "the stand-in converts to the full state only"
    if os.environ.get("JOBGEN_STAND_IN_BREAK") == "fail":
        raise RuntimeError("stand-in told to fail")
    # Upstream keeps all but the last three parts of a rank file's path, joined without the
    # leading "/": only an absolute --input_dir names the files it then loads.
    if not os.path.isabs(args.input_dir):
        raise FileNotFoundError(f"{args.input_dir}: relative (upstream loads the wrong path)")
    if not args.load_xser:
        raise RuntimeError("without --load_xser the xser reference files load as references")
    if args.qkv_linear:
        raise KeyError("model.layers.0.self_attn.qkv_proj.weight_q (a fused qkv_proj is not "
                       "QKVLinear's)")
    for tp in range(args.tp_size):
        for pp in range(args.pp_size):
            rank_file(args.input_dir, tp, pp)
    with open(args.config) as handle:
        config = json.load(handle)
    state = weights(config, int(os.environ.get("JOBGEN_STAND_IN_SEED", "0")))
    broken = os.environ.get("JOBGEN_STAND_IN_BREAK")
    if broken == "rename":
        state["model.layers.0.mlp.gate.weight"] = state.pop("model.layers.0.mlp.gate_proj.weight")
    elif broken == "transpose":   # square: the shapes still match, the function does not
        name = "model.layers.0.self_attn.o_proj.weight"
        state[name] = state[name].t().contiguous()
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, "checkpoint.pt")
    print(f"Saving full checkpoint to {path}")
    torch.save(state, path)


if __name__ == "__main__":
    sys.exit(main())
