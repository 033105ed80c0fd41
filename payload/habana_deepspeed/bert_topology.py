"""The LayerNorm placement of Model-References' large BERT configs (`layer_norm_large_model`,
set for BERT 1.5B), on top of Hugging Face's BertForPreTraining.

Stock BERT normalises each sublayer's output added to its input: h <- LN(h + f(h)). The large-model
variant keeps a separate, never-normalised residual stream r that starts at zero (the embeddings
feed the first attention but are not part of r): for each layer,

    r <- r + Attention(h);  h <- LN_attention(r)
    r <- r + FFN(h);        h <- LN_output(r)

and the encoder's output is the last h. The same parameters as the stock model (the layers'
dense/LayerNorm weights keep their names), only the wiring differs, so checkpoints, ZeRO
partitioning and the optimizer's parameter groups are unchanged.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


class LargeModelEncoder(nn.Module):
    """Drop-in replacement for ``BertModel.encoder`` wiring its layers as described above."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.config = getattr(encoder, "config", None)
        self.layer = encoder.layer  # the same modules: parameter names stay bert.encoder.layer.N

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None,
                *args: Any, **kwargs: Any) -> Any:
        from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions

        stream = torch.zeros_like(hidden_states)
        for layer in self.layer:
            attention = layer.attention
            context = attention.self(hidden_states, attention_mask=attention_mask)[0]
            stream = stream + attention.output.dropout(attention.output.dense(context))
            hidden_states = attention.output.LayerNorm(stream)
            mlp = layer.output.dropout(layer.output.dense(layer.intermediate(hidden_states)))
            stream = stream + mlp
            hidden_states = layer.output.LayerNorm(stream)
        # The stock encoder's own output type: BertModel reads its fields.
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states)


def use_large_model_layer_norm(model: nn.Module) -> nn.Module:
    """Rewire a BertForPreTraining (or BertModel) in place; returns it."""
    bert = getattr(model, "bert", model)
    bert.encoder = LargeModelEncoder(bert.encoder)
    return model
