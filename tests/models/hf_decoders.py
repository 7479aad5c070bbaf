"""Tiny Hugging Face decoders (transformers is imported when one is built), for the parallel plans' tests."""

from __future__ import annotations


def tiny_llama():
    """A 2-layer LlamaForCausalLM with grouped-query attention (4 heads, 2 key/value heads), SDPA."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(config)
