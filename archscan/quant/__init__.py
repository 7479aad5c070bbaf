"""Quantization, analysed (``--quant``) and applied (``archscan quantize``).

Takes a scan's model and report and a scheme (``schemes``: int8, w8a8, fp8, int4:gN); gives
``report.quant``: each ``nn.Linear`` quantized or kept in high precision and why, its weight's bytes
as stored on the device in question, and the forward's bytes, multiply-adds and predicted time
before and after; with ``--decode``, the decode step's tokens/s before and after, and with ``--kv``
the KV cache quantized too.

- ``schemes``: the schemes, torchao's config for each, the layout each device stores, the channel
  counts a kernel cannot take. torchao is optional and imported only here, when asked for.
- ``analyse``: bytes as stored, read from the inner tensors of torchao's own quantized weights made
  on the meta device (no weights, no kernels: ``__tensor_flatten__``'s storages); the GPU's int4
  layout, whose kernel package a CPU machine lacks, from its shapes. Costs as the fused kernel runs
  them: a dequantizing GEMM reads the stored weight and its scales once and computes in the
  activations' dtype; w8a8 quantizes the activations in a kernel of its own and runs the GEMM on int8
  tensor cores. (Counting the ops as eager PyTorch dispatches them would be wrong: on the CPU, int8
  weight-only dequantizes the whole weight to the activations' dtype before a plain GEMM.)
"""

from .analyse import Layer, decode_variant, inner_bytes, plan_layers, quant_section, quantized, rewrite, times
from .schemes import INSTALL, KV_SCHEMES, SCHEMES, Scheme, parse_kv, parse_scheme, torchao

__all__ = ["INSTALL", "KV_SCHEMES", "Layer", "SCHEMES", "Scheme", "decode_variant", "inner_bytes", "parse_kv",
           "parse_scheme", "plan_layers", "quant_section", "quantized", "rewrite", "times", "torchao"]
