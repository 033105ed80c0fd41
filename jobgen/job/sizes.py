"""Sizes of a job's model that more than the planner needs: its parameters and the bytes of one
checkpoint (the health gate sizes the free space a node needs from them)."""
from __future__ import annotations

from .spec import JobSpec

# Bytes per parameter in a checkpoint: the weights plus Adam's or LAMB's two moments.
# - fp32: 4 + 2 x 4.
# - bf16 (mixed precision, DeepSpeed): bf16 weights, fp32 master weights and moments: 2 + 4 + 8.
# - bf16_sr (XLA_USE_BF16 on Neuron): tensors are bf16 on the device but reach the host, and so
#   the checkpoint, as fp32: 4 + 8.
CHECKPOINT_BYTES_PER_PARAM = {"fp32": 12, "bf16": 14, "bf16_sr": 12}


def parameters(spec: JobSpec) -> int:
    """Every trained parameter (weights and biases of the layers, embeddings, the output head
    unless it is tied to the input embedding, as BERT's is)."""
    m = spec.recipe.model
    h, f, layers, vocab = m.hidden_size, m.ffn_hidden_size, m.num_layers, m.vocab_size
    head_dim = h // m.num_attention_heads
    kv = (m.num_kv_heads or m.num_attention_heads) * head_dim
    if m.family == "llama":    # no biases, SwiGLU (three matrices), RMSNorm (one vector)
        attention = h * h + 2 * h * kv + h * h
        mlp = 3 * h * f
        norms = 2 * h
        embeddings = vocab * h * 2 + h       # input, untied output head, final norm
    else:                      # GPT-NeoX and BERT: biases, two-matrix MLP, LayerNorm
        attention = h * (h + 2 * kv) + (h + 2 * kv) + h * h + h
        mlp = 2 * h * f + f + h
        norms = 4 * h
        if m.family == "gpt_neox":
            embeddings = vocab * h * 2 + 2 * h
        else:  # BERT: word, position and type embeddings, the pooler and the MLM transform
            embeddings = (vocab + m.max_position_embeddings + 2) * h + 2 * h + 2 * (h * h + h)
    return layers * (attention + mlp + norms) + embeddings


def checkpoint_bytes(spec: JobSpec) -> int:
    return parameters(spec) * CHECKPOINT_BYTES_PER_PARAM[spec.recipe.precision]
