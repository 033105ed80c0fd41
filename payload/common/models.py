"""The decoder models the GPT-NeoX and Llama programs train on CPU and GPU (Hugging Face
implementations at the recipe's dimensions), and the synthetic token stream of rehearsals."""
from __future__ import annotations

import argparse
from typing import Any

# The projections that write into the residual stream, per family (Hugging Face names).
OUTPUT_PROJECTIONS = {"gpt_neox": ("attention.dense", "mlp.dense_4h_to_h"),
                      "llama": ("o_proj", "down_proj")}


def synthetic_tokens(position: int, seq_length: int, vocab_size: int, seed: int) -> list[int]:
    """Sample ``position`` of the stream: an arithmetic run ``a, a+d, a+2d, … (mod vocab)``.

    Start and stride come from the position and seed alone (no RNG state to checkpoint); after two
    tokens the rest is predictable, so the loss falls quickly and visibly.
    """
    start = (seed * 7_919 + position * 104_729) % vocab_size
    stride = 1 + (position * 31 + seed) % 5
    return [(start + k * stride) % vocab_size for k in range(seq_length)]


def build_model(args: argparse.Namespace) -> Any:
    import transformers

    common: dict[str, Any] = {
        "vocab_size": args.vocab_size, "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_heads,
        "intermediate_size": args.intermediate_size,
        "max_position_embeddings": getattr(args, "max_position_embeddings", None)
        or args.seq_length,
        "initializer_range": args.init_std}
    if args.family == "gpt_neox":
        # GPT-NeoX 20B / Pythia style: rotary on a quarter of each head, parallel residual.
        # ``rotary_pct`` is the 4.x name; 5.x still accepts it (into rope_parameters).
        common.update(rotary_pct=getattr(args, "rotary_pct", None) or 0.25,
                      use_parallel_residual=True)
        return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(**common))
    if getattr(args, "rope_theta", None):
        common["rope_theta"] = args.rope_theta
    llama = transformers.LlamaConfig(
        num_key_value_heads=getattr(args, "num_kv_heads", None) or args.num_heads,
        rms_norm_eps=getattr(args, "norm_eps", None) or 1e-6, **common)
    return transformers.LlamaForCausalLM(llama)
