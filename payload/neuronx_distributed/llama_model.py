"""The model of the Llama program (train_llama.py): the NxD example's LlamaForCausalLM
(modeling_llama_nxd) configured from the recipe's Hugging Face config; the upstream modules are
imported only when the model is built."""
from __future__ import annotations

import argparse
from typing import Any

from common.init import scale_output_projections, sharded_draw
from common.runtime import PayloadError

OUTPUT_PROJECTIONS = ("o_proj", "down_proj")  # they write into the residual stream
ROW_PARALLEL_DIM = 1  # NxD's RowParallelLinear splits its weight along the input dimension


def build_model(args: argparse.Namespace, torch: Any, parallel_state: Any) -> Any:
    """The example's LlamaForCausalLM as the recipe configures it, built on this rank (NxD's
    initialize_parallel_model calls this): the example's settings, one rotary table for every
    layer, and the output projections scaled and drawn as NxD draws its parallel layers."""
    from modeling_llama_nxd import LlamaForCausalLM
    from training_utils import get_sin_cos_matrix
    from transformers import LlamaConfig

    config = LlamaConfig.from_json_file(str(args.model_config))
    config.use_cache = False
    config.max_position_embeddings = max(config.max_position_embeddings, args.seq_length)
    config.sequence_parallel_enabled = args.sequence_parallel
    config.selective_checkpoint_enabled = args.selective_checkpoint
    # As the example's 7B script and model config set them: fused QKV, the NKI flash
    # attention kernel, no KV replication, each MLP moved to the device as it is built.
    config.kv_shared_group_size = 1
    config.qkv_linear = True
    config.use_flash_attention = True
    for name, value in (("move_model_to_device", True), ("pretraining_tp", 1),
                        # read from NxD 2.21 / 2.23 on, set as those examples default them
                        ("fuse_qkv", True), ("transpose_nki_inputs", True)):
        if not hasattr(config, name):
            setattr(config, name, value)
    config.initializer_range = args.init_std
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # One sine/cosine table for every layer (the example's trick: the compiler then
        # keeps a single lookup).
        cos, sin = get_sin_cos_matrix(config)
        for layer in model.model.layers:
            layer.self_attn.rotary_emb.cos_cached = cos
            layer.self_attn.rotary_emb.sin_cached = sin
    if args.scaled_init:
        # Draw each full matrix from one seeded stream and keep this rank's slice, as NxD
        # initialises its parallel layers: the same model for any tensor-parallel degree.
        draw = sharded_draw(parallel_state.get_tensor_model_parallel_size(),
                            parallel_state.get_tensor_model_parallel_rank(),
                            ROW_PARALLEL_DIM, torch.Generator().manual_seed(args.seed))
        names = scale_output_projections(model, OUTPUT_PROJECTIONS, args.init_std,
                                         config.num_hidden_layers, draw=draw)
        if len(names) != 2 * config.num_hidden_layers:
            raise PayloadError(f"--scaled-init: expected {2 * config.num_hidden_layers} "
                               f"output projections ({', '.join(OUTPUT_PROJECTIONS)}), "
                               f"the example's model has {len(names)}")
    return model
