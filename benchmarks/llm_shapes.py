"""Published language-model shapes as Hugging Face configs (random weights, nothing downloaded),
for the figures in docs/llm.md. Needs ``transformers``.

    archscan benchmarks/llm_shapes.py:mixtral_8x7b --input 1,128:int64 --dtype bf16
    archscan benchmarks/llm_shapes.py:deepseek_v3 --input 1,1:int64 --decode 32768 --dtype bf16
    archscan benchmarks/llm_shapes.py:llama2_7b --input 1,1:int64 --decode 128 --dtype bf16 --device-profile a100
"""

import transformers


def mixtral_8x7b():
    """Mixtral-8x7B: transformers' MixtralConfig defaults are the published model's."""
    return transformers.MixtralForCausalLM(transformers.MixtralConfig())


def deepseek_v3():
    """DeepSeek-V3 (671 B): transformers' DeepseekV3Config defaults, with the published 163,840
    positions (the defaults say 4,096)."""
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(max_position_embeddings=163840))


def llama2_7b():
    """Llama-2-7B, as gpt-fast measured it."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000))
