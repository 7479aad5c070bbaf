"""Tiny Hugging Face decoders (transformers is imported when one is built), for the parallel plans' tests."""

from __future__ import annotations


def tiny_llama():
    """A 2-layer LlamaForCausalLM with grouped-query attention (4 heads, 2 key/value heads), SDPA."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config)


def tiny_bamba():
    """A 4-layer BambaForCausalLM (IBM's hybrid): Mamba-2 mixers with a chunked scan (chunks of 16
    tokens) and grouped-query attention in layers 1 and 3."""
    import transformers

    config = transformers.BambaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096,
                                      attn_layer_indices=[1, 3], mamba_n_heads=8, mamba_d_head=32, mamba_d_state=16,
                                      mamba_n_groups=1, mamba_expand=2, mamba_chunk_size=16)
    return transformers.BambaForCausalLM(config)


def tiny_qwen3_next():
    """A 4-layer Qwen3NextForCausalLM: gated delta-rule linear attention (its prefill loops over chunks
    of 64 tokens in Python) every other layer, full attention between, routed experts."""
    import transformers

    config = transformers.Qwen3NextConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                          max_position_embeddings=4096, head_dim=32, linear_num_value_heads=4,
                                          linear_num_key_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
                                          num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                          shared_expert_intermediate_size=64, full_attention_interval=2,
                                          decoder_sparse_step=1)
    return transformers.Qwen3NextForCausalLM(config)


def tiny_phimoe():
    """A 2-layer PhimoeForCausalLM: 8 experts, two per token, chosen by its sparsemixer (two maxes, no top-k)."""
    import transformers

    config = transformers.PhimoeConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=500, num_local_experts=8, num_experts_per_tok=2,
                                       max_position_embeddings=512)
    return transformers.PhimoeForCausalLM(config)


def tiny_mixtral():
    """A 2-layer MixtralForCausalLM: 8 experts, two per token by a top-k router."""
    import transformers

    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=500, num_local_experts=8, num_experts_per_tok=2,
                                        max_position_embeddings=512)
    return transformers.MixtralForCausalLM(config)


def tiny_gpt_oss():
    """A 2-layer GptOssForCausalLM: 8 experts with biases, two per token by a top-k router."""
    import transformers

    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16, vocab_size=500, num_local_experts=8,
                                       num_experts_per_tok=2, max_position_embeddings=512, sliding_window=8,
                                       layer_types=["sliding_attention", "full_attention"])
    return transformers.GptOssForCausalLM(config)


def tiny_llama4():
    """A 2-layer Llama4ForCausalLM, both layers mixtures of 8 experts with one per token, which its code runs on every
    token (each expert's rows scaled by the router's scores, zero for the seven not chosen)."""
    import transformers

    config = transformers.Llama4TextConfig(hidden_size=64, intermediate_size=128, intermediate_size_mlp=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           vocab_size=500, num_local_experts=8, num_experts_per_tok=1,
                                           interleave_moe_layer_step=1, max_position_embeddings=512)
    return transformers.Llama4ForCausalLM(config)


def tiny_deepseek_v2(attention="sdpa"):
    """A 2-layer DeepseekV2ForCausalLM (dense layers): multi-head latent attention, a value head (16) narrower than the
    query and key heads (16 + 8 rotary), with ``attention`` as its attention implementation ('sdpa' or 'eager')."""
    import transformers

    config = transformers.DeepseekV2Config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                           vocab_size=500, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=8,
                                           qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                                           first_k_dense_replace=2, max_position_embeddings=512)
    config._attn_implementation = attention
    return transformers.DeepseekV2ForCausalLM(config)
