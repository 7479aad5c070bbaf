"""LLM phases: a decoder's prefill and one decode step with its KV cache (``--decode L``).

Takes a decoder target, the new tokens' ``--input`` and the context length L; gives the two
phases' costs, the KV cache's bytes (per token, fixed per sequence), experts of a mixture, and
with a named GPU the batch × context grid of predicted times.

Modules:
    decode      the prefill and the step on fake tensors, through the model's own cache protocol
"""
