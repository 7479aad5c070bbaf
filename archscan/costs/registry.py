"""One registry of per-op costs, keyed by aten op.

Conventions (stated once, used everywhere; see README "Counting conventions"):

* ``flops`` are multiply-adds (Ma et al., ShuffleNetV2, ECCV 2018, footnote 1; torchvision and
  fvcore count the same way). They are counted for convolution, linear/matmul/bmm/einsum,
  attention and recurrent layers (each weight matrix once per token) only. Where PyTorch has a formula (``torch.utils.flop_counter.flop_registry``,
  which counts 2 per multiply-add) it is reused and halved; attention paths PyTorch does not
  count on CPU (``_scaled_dot_product_flash_attention_for_cpu``) and the fused
  ``nn.MultiheadAttention`` inference path (``_native_multi_head_attention``) have formulas here.
* ``elem_ops`` are element operations of element-wise, activation, normalization, reduction and
  pooling work, kept apart from ``flops`` (guideline G4 is about exactly this work). Ops whose
  work is not one per element have an element-op formula (``register_elem_ops``): interpolation
  and sampling count one per input tap, NMS one per IoU comparison (see "Vision ops" below).
* ``read_bytes``/``write_bytes``: the memory access cost (MAC) of one kernel — every distinct
  tensor it reads (activations and weights) plus every tensor it writes, at its dtype
  (paper: 1x1 conv MAC = hw(c1 + c2) + c1*c2 elements). Views move nothing. Gathers
  (embedding, index_select) read the rows they gather, not the whole table.
* Complex data: ``flops`` are real multiply-adds. A kernel that multiplies complex operands (a
  complex GEMM: BLAS ``cgemm``) does 4 real multiply-adds per complex one, (a + bi)(c + di) =
  (ac - bd) + (ad + bc)i, so every multiply-add formula counts 4 on complex operands
  (``COMPLEX_MULTIPLY_ADDS``). torch runs a complex convolution as three real convolutions (Gauss's
  trick, in ``conv1d/2d/3d``): those reach the registry as real convolutions and count as they run,
  3 real multiply-adds per complex one. FFTs (``_fft_r2c``, ``_fft_c2c``, ``_fft_c2r``) count the
  benchFFT convention converted to multiply-adds: 5 N log2 N real flops per complex transform of N
  points, half for a real one, 2 flops a multiply-add (``fft_multiply_adds``).
* Backward ops cost what their kernels do under the same conventions: a gradient GEMM or
  convolution counts its multiply-adds; norms', activations', pooling's, losses' and sampling's
  gradients count element ops ("Backward kernels" below); pure copies of a gradient (``select_backward``)
  move bytes and nothing else.
* An op with no formula is never silently 0: it is costed generically for bytes and reported
  under ``uncounted`` with its count.

The registries are keyed by qualified op name (``"aten::mm"``, ``"torchvision::nms"``), so ops of
a library that is not installed (torchvision) are registered without importing it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from torch.utils.flop_counter import flop_registry as _torch_flop_registry

from ..results import CATEGORIES
from .quantized import (Packed, activation_quantize, int_mm_flops, is_packed, packed, quantized_conv_flops,
                        quantized_linear_flops,
                        quantized_rnn_flops, quantizes_activations, real_object, stored_dtype, stored_nbytes)

aten = torch.ops.aten


FlopFormula = Callable[..., int]


@dataclass(frozen=True)
class OpCost:
    """The cost of one executed aten op."""

    op: str
    category: str
    flops: int = 0
    elem_ops: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    weight_bytes: int = 0
    counted: bool = True
    attrs: dict = field(default_factory=dict)

    @property
    def mac_bytes(self) -> int:
        return self.read_bytes + self.write_bytes


ElemFormula = Callable[..., int]

_FLOP_FORMULAS: dict[str, FlopFormula] = {}
_ELEM_FORMULAS: dict[str, ElemFormula] = {}
_CATEGORY: dict[str, str] = {}


def _key(op) -> str:
    """Registry key of an op packet or name: its qualified name, 'aten::mm' or 'torchvision::nms'."""
    return op if isinstance(op, str) else op._qualified_op_name


def _register(table: dict, what: str, ops, value) -> None:
    for op in ops:
        key = _key(op)
        if key in table:
            raise ValueError(f"{what} for {key} registered twice")
        table[key] = value


def register_flops(*ops):
    """Register a multiply-add formula for ops (packets or 'ns::name'); refuses duplicates (like
    torch's flop_registry). Formulas take the op's arguments (tensors) and ``out_val``."""

    def wrap(fn: FlopFormula) -> FlopFormula:
        _register(_FLOP_FORMULAS, "flop formula", ops, fn)
        return fn

    return wrap


def register_elem_ops(*ops):
    """Register an element-op formula for ops (packets or 'ns::name'); refuses duplicates.
    Formulas take shapes: every tensor argument arrives as its shape, the result as ``out_shape``."""

    def wrap(fn: ElemFormula) -> ElemFormula:
        _register(_ELEM_FORMULAS, "element-op formula", ops, fn)
        return fn

    return wrap


def _categorize(category: str, *ops) -> None:
    _register(_CATEGORY, "category", ops, category)


def _reuse_torch(packet) -> None:
    """Use torch.utils.flop_counter's formula (2 per multiply-add), halved."""
    torch_fn = _torch_flop_registry[packet]

    def fn(*args, out_val=None, **kwargs) -> int:
        return int(torch_fn(*args, **kwargs, out_val=out_val)) // 2

    fn.__doc__ = f"multiply-adds of {packet} (torch.utils.flop_counter formula / 2)"
    register_flops(packet)(fn)


def _opt(name: str):
    """An aten op packet if this torch build has it."""
    return getattr(aten, name, None)


for _p in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution, aten._convolution, _opt("_scaled_mm"),
           _opt("_scaled_dot_product_efficient_attention"), _opt("_scaled_dot_product_flash_attention"),
           _opt("_scaled_dot_product_cudnn_attention"), _opt("_flash_attention_forward"),
           _opt("_efficient_attention_forward"), _opt("_scaled_dot_product_efficient_attention_backward"),
           _opt("_scaled_dot_product_flash_attention_backward"), _opt("_scaled_dot_product_cudnn_attention_backward"),
           _opt("_flash_attention_backward"), _opt("_efficient_attention_backward")):
    if _p is not None and _p in _torch_flop_registry:
        _reuse_torch(_p)


def _shape(t) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


@register_flops(aten.mv, aten.addmv)
def mv_flops(*args, out_val=None, **kwargs) -> int:
    """Matrix-vector products (``matmul`` with a 1-d operand): one multiply-add per matrix element.

    # [n] = mv([n, m], [m]); addmv(bias [n], [n, m], [m])
    """
    matrix = next(t for t in args if isinstance(t, torch.Tensor) and t.dim() == 2)
    return matrix.numel()


@register_flops(aten.dot, aten.vdot)
def dot_flops(a, b, *, out_val=None, **kwargs) -> int:
    """A dot product of two n-vectors: n multiply-adds.

    # [] = dot([n], [n])
    """
    return a.numel()


@register_flops(aten.convolution_backward)
def convolution_backward_flops(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                               output_padding, groups, output_mask, *, out_val=None, **kwargs) -> int:
    """Multiply-adds of a convolution's backward: the input gradient and the weight gradient each
    cost what the forward does (the same products, read another way), for the ones asked for
    (``output_mask``); the bias gradient is a sum, not a product. Exact for grouped and depthwise
    convolutions: torch.utils.flop_counter counts their input gradient ``groups`` times over."""
    # [N, Cout, *out] = conv([N, Cin, *in], [Cout, Cin/groups, *k]): N * prod(out) * Cout * Cin/groups * prod(k);
    # transposed, [N, Cout, *out] = conv_t([N, Cin, *in], [Cin, Cout/groups, *k]): N * prod(in) * prod(weight)
    spatial = _shape(input)[2:] if transposed else _shape(grad_output)[2:]
    forward = _shape(input)[0] * math.prod(spatial) * math.prod(_shape(weight))
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def grouped_mm_shape(a, b, offs=None) -> tuple[int, ...] | None:
    """The result shape of ``aten._grouped_mm`` (mixture-of-experts GEMMs), or None for a layout
    it does not take: [T, K] x [E, K, N] (rows grouped by ``offs``) -> [T, N]; [E, T, K] x
    [E, K, N] -> [E, T, N]; [M, Ktot] x [Ktot, N] (K grouped by ``offs``) -> [E, M, N];
    [E, T, K] x [K, Ntot] (N grouped by ``offs``) -> [T, Ntot]."""
    ad, bd = a.dim(), b.dim()
    if ad == 2 and bd == 3:
        return (a.shape[0], b.shape[2])
    if ad == 3 and bd == 3:
        return (a.shape[0], a.shape[1], b.shape[2])
    if ad == 2 and bd == 2 and offs is not None:
        return (offs.shape[0], a.shape[0], b.shape[1])
    if ad == 3 and bd == 2 and offs is not None:
        return (a.shape[1], b.shape[1])
    return None


# Hugging Face's experts when torch's grouped GEMM is not taken (float32 under torch.export or
# torch.compile): a custom op looping torch.mm over the experts; [T, K] x [E, K, N] -> [T, N]
_HF_GROUPED_MM = "transformers::grouped_mm_fallback"
_HF_GROUPED_MM_BACKWARD = "transformers::grouped_mm_fallback_backward"


@register_flops(*[p for p in (_opt("_grouped_mm"),) if p is not None], _HF_GROUPED_MM)
def grouped_mm_flops(a, b, offs=None, *args, out_val=None, **kwargs) -> int:
    """Multiply-adds of the experts' grouped GEMMs, exact and independent of the routing: every row
    of ``a`` meets one group's [K, N] (T rows: T·K·N, however the rows are routed); batched
    [E, T, K] x [E, K, N]: E·T·K·N; K grouped ([M, Ktot] x [Ktot, N]): M·Ktot·N."""
    ad, bd = a.dim(), b.dim()
    if ad == 2 and bd == 3:
        return a.shape[0] * a.shape[1] * b.shape[2]
    if ad == 3 and bd == 3:
        return a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    if ad == 2 and bd == 2:
        return a.shape[0] * a.shape[1] * b.shape[1]
    if ad == 3 and bd == 2:  # N grouped: each group's rows meet that group's [K, N_g] columns
        return a.shape[1] * a.shape[2] * b.shape[1]
    return 0


@register_flops(_HF_GROUPED_MM_BACKWARD)
def grouped_mm_backward_flops(a, b, offs, grad_output, *args, out_val=None, **kwargs) -> int:
    """The input and the weight gradient of a [T, K] x [E, K, N] grouped GEMM: T·K·N each."""
    return 2 * grouped_mm_flops(a, b, offs)


@register_flops(aten._scaled_dot_product_flash_attention_for_cpu)
def sdpa_cpu_flops(query, key, value, *args, out_val=None, **kwargs) -> int:
    """Q K^T and A V of scaled_dot_product_attention on CPU.

    # [b, h, l, ev] = sdpa([b, h, l, e], [b, hk, s, e], [b, hk, s, ev]); hk may be < h (GQA)
    """
    *batch, l, e = _shape(query)
    s, ev = _shape(value)[-2], _shape(value)[-1]
    bh = 1
    for d in batch:
        bh *= d
    return bh * l * s * (e + ev)


@register_flops(*[p for p in (_opt("_scaled_dot_product_flash_attention_for_cpu_backward"),) if p is not None])
def sdpa_cpu_backward_flops(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    """The backward of scaled_dot_product_attention on CPU, as torch.utils.flop_counter counts the
    GPU kernels' (halved): the scores Q K^T recomputed, dP = dO V^T, dV = P^T dO, dQ = dS K,
    dK = dS^T Q.

    # [b, h, l, e], [b, hk, s, e], [b, hk, s, ev] = sdpa_backward(dO [b, h, l, ev], ...); GQA: per query head
    """
    *batch, l, e = _shape(query)
    s, ev = _shape(value)[-2], _shape(value)[-1]
    return math.prod(batch) * l * s * (3 * e + 2 * ev)


@register_flops(aten._native_multi_head_attention)
def native_mha_flops(query, key, value, embed_dim, num_head, qkv_weight, *args, out_val=None, **kwargs) -> int:
    """nn.MultiheadAttention's fused inference path: in-projection, Q K^T, A V, out-projection.

    # [b, l, e] = mha([b, l, e], [b, s, e], [b, s, e]); unbatched inputs are [l, e]
    """
    q, k = _shape(query), _shape(key)
    b = q[0] if len(q) == 3 else 1
    l, s, e = q[-2], k[-2], int(embed_dim)
    in_proj = b * l * e * e + 2 * b * s * e * e
    attn = 2 * b * l * s * e
    out_proj = b * l * e * e
    return in_proj + attn + out_proj


@register_flops(aten._transformer_encoder_layer_fwd)
def encoder_layer_flops(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                        norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                        ffn_weight_1, *args, out_val=None, **kwargs) -> int:
    """nn.TransformerEncoderLayer's fused inference path: self-attention plus the two FFN linears.

    # [b, l, e] = encoder_layer([b, l, e]); ffn_weight_1 is [f, e]
    """
    attention = native_mha_flops(src, src, src, embed_dim, num_heads, qkv_weight)
    shape = _shape(src)
    tokens = shape[0] * shape[1] if len(shape) == 3 else shape[0]
    ffn = 2 * tokens * int(embed_dim) * int(ffn_weight_1.shape[0])
    return attention + ffn


def _rnn_flops(input, weights, input_size: int) -> int:
    """Every RNN weight matrix multiplies once per token: tokens * sum of the 2-D weights' sizes."""
    tokens = input.numel() // input_size if input_size else 0
    return tokens * sum(w.numel() for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2)


@register_flops(*[p for p in (_opt("mkldnn_rnn_layer"),) if p is not None])
def mkldnn_rnn_layer_flops(input, w_ih, w_hh, *args, out_val=None, **kwargs) -> int:
    """One LSTM/GRU/RNN layer on CPU (oneDNN).

    # [t*b, h] from input [b, t, i]: w_ih [gates*h, i], w_hh [gates*h, h]
    """
    return _rnn_flops(input, (w_ih, w_hh), int(w_ih.shape[1]))


@register_flops(*[p for p in (_opt("_cudnn_rnn"),) if p is not None])
def cudnn_rnn_flops(input, weight, *args, out_val=None, **kwargs) -> int:
    """A whole cuDNN RNN (all layers and directions): the first layer's w_ih gives the input size.

    # input [t, b, i] or [b, t, i]; weight = [w_ih, w_hh, (b_ih, b_hh)] per layer and direction
    """
    return _rnn_flops(input, weight, int(input.shape[-1]))


@register_flops(*[p for p in (_opt("mkldnn_rnn_layer_backward"),) if p is not None])
def mkldnn_rnn_layer_backward_flops(input, w_ih, w_hh, *args, out_val=None, **kwargs) -> int:
    """The backward of one oneDNN LSTM layer: twice its forward. With the gates' gradient dG
    [tokens, gates*h], the input and hidden-state gradients dx = dG w_ih, dh = dG w_hh and the
    weight gradients dw_ih = dG^T x, dw_hh = dG^T h each multiply every weight matrix once per token.
    oneDNN computes all of them (the op takes no output mask: dx and dhx too where nothing needs them).

    # (dx [b, t, i], dw_ih, dw_hh, db_ih, db_hh, dhx, dcx) = mkldnn_rnn_layer_backward(x [b, t, i], w_ih, w_hh, ...)
    """
    return 2 * _rnn_flops(input, (w_ih, w_hh), int(w_ih.shape[1]))


@register_flops(*[p for p in (_opt("_cudnn_rnn_backward"),) if p is not None])
def cudnn_rnn_backward_flops(input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                             grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
                             bidirectional, batch_sizes, dropout_state, reserve, output_mask, *, out_val=None,
                             **kwargs) -> int:
    """The backward of a whole cuDNN RNN: the data gradient (dx and dhx through every layer, the
    forward's multiply-adds) always, since torch runs it unconditionally (it mutates the reserve
    space), and the weight gradient (the forward's multiply-adds again) when ``output_mask[3]`` asks.

    # (dx, dhx, dcx, [dw...]) = _cudnn_rnn_backward(input, [w_ih, w_hh, (b_ih, b_hh)] per layer, ...)
    """
    return cudnn_rnn_flops(input, weight) * (1 + int(bool(output_mask[3])))


_categorize("rnn", *[p for p in (_opt("mkldnn_rnn_layer"), _opt("_cudnn_rnn"), _opt("mkldnn_rnn_layer_backward"),
                                 _opt("_cudnn_rnn_backward")) if p is not None])
_categorize("rnn", "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl",
            "aten::_thnn_fused_gru_cell", "aten::_thnn_fused_gru_cell_backward")


@register_elem_ops("aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_gru_cell")
def fused_rnn_cell_elem_ops(input_gates: tuple, *args, out_shape, **kwargs) -> int:
    """The pointwise tail of an LSTM or GRU cell on a GPU (the gates' GEMMs run before it, as mm):
    one element op per gate element (sum of the two projections, its sigmoid or tanh, its share of
    the state update).

    # (hy [b, h], cy [b, h], workspace) = _thnn_fused_lstm_cell(input_gates [b, 4h], hidden_gates [b, 4h], cx [b, h])
    """
    return math.prod(input_gates)


@register_elem_ops("aten::_thnn_fused_lstm_cell_backward_impl", "aten::_thnn_fused_gru_cell_backward")
def fused_rnn_cell_backward_elem_ops(*args, out_shape, **kwargs) -> int:
    """The backward of a fused cell's pointwise tail: one element op per gate gradient element.

    # (dgates [b, 4h], dcx [b, h], dbias [4h]) = _thnn_fused_lstm_cell_backward_impl(dhy, dcy, cx, cy, workspace)
    """
    return math.prod(out_shape[0])


_categorize("attention", *[p for p in (
    _opt("_scaled_dot_product_flash_attention_for_cpu"), _opt("_native_multi_head_attention"),
    _opt("_transformer_encoder_layer_fwd"),
    _opt("_scaled_dot_product_efficient_attention"), _opt("_scaled_dot_product_flash_attention"),
    _opt("_scaled_dot_product_cudnn_attention"), _opt("_flash_attention_forward"),
    _opt("_efficient_attention_forward")) if p is not None])
_categorize("conv", aten.convolution, aten._convolution)
_categorize("matmul", aten.mm, aten.bmm, aten.baddbmm, aten.mv, aten.addmv, aten.dot, aten.vdot,
            *[p for p in (_opt("_grouped_mm"), _opt("_scaled_mm")) if p is not None],
            _HF_GROUPED_MM, _HF_GROUPED_MM_BACKWARD)
_categorize("linear", aten.addmm)
_categorize("embedding", aten.embedding, aten.embedding_bag, aten._embedding_bag, aten.embedding_dense_backward)


@register_elem_ops(aten.embedding_dense_backward)
def embedding_backward_elem_ops(grad_output: tuple, indices: tuple, num_weights: int, *args, out_shape: tuple,
                                **kwargs) -> int:
    """An embedding's weight gradient adds each gradient row into its token's row: one add per
    element of the gradient (no multiply-adds), on top of zeroing the table's gradient."""
    # [num_weights, dim] = embedding_dense_backward([..., dim], [...])
    return math.prod(grad_output) + math.prod(out_shape)
_categorize("norm", *[p for p in (
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten.native_layer_norm, aten.native_group_norm, _opt("_fused_rms_norm"), aten.batch_norm,
    aten.layer_norm, aten.group_norm, aten.instance_norm, _opt("rms_norm"), aten._batch_norm_impl_index,
    aten.cudnn_batch_norm, aten.miopen_batch_norm) if p is not None])
_categorize("pooling", *[p for p in (
    aten.max_pool2d_with_indices, aten.max_pool2d, aten.max_pool1d, aten.max_pool3d,
    aten.max_pool3d_with_indices, aten.avg_pool1d, aten.avg_pool2d, aten.avg_pool3d,
    aten.adaptive_avg_pool1d, aten.adaptive_avg_pool2d, aten._adaptive_avg_pool2d,
    aten.adaptive_avg_pool3d, aten._adaptive_avg_pool3d, aten.adaptive_max_pool1d,
    aten.adaptive_max_pool2d, aten.adaptive_max_pool3d, aten.mkldnn_max_pool2d) if p is not None])
_categorize("activation", *[p for p in (
    aten.relu, aten.relu_, aten.gelu, aten.gelu_, aten.silu, aten.silu_, aten.sigmoid, aten.sigmoid_,
    aten.tanh, aten.tanh_, aten.hardswish, aten.hardswish_, aten.hardsigmoid, aten.hardsigmoid_,
    aten.hardtanh, aten.hardtanh_, aten.leaky_relu, aten.leaky_relu_, aten.elu, aten.elu_,
    aten.softplus, aten.mish, aten.mish_, aten.relu6, aten.prelu, aten._prelu_kernel, aten.glu,
    aten._softmax, aten.softmax, aten._safe_softmax, aten._log_softmax, aten.log_softmax) if p is not None])
_categorize("data_movement", *[p for p in (
    aten.clone, aten.cat, aten.stack, aten.copy_, aten._to_copy, aten.copy, aten.contiguous,
    aten.constant_pad_nd, aten.pad, aten.reflection_pad2d, aten.replication_pad2d, aten.repeat,
    aten.repeat_interleave, aten.flip, aten.roll, aten.index_select, aten.gather, aten.index,
    aten._unsafe_index, aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle,
    aten.native_channel_shuffle, aten.tril, aten.triu, aten.masked_fill, aten.masked_fill_,
    aten.scatter, aten.index_put, aten.index_put_, aten.slice_scatter, aten.select_scatter,
    aten.lift_fresh_copy, aten.narrow_copy, aten.tile) if p is not None])
_categorize("reduction", *[p for p in (  # scans and selections: one element op per input element
    aten.cumsum, aten.cumprod, aten.logcumsumexp, aten.topk, aten.sort, aten.argsort, aten.kthvalue,
    aten.median, aten.mode, _opt("cummax"), _opt("cummin"), aten.histc, aten.bincount) if p is not None])
_categorize("host_sync", *[p for p in (
    aten._local_scalar_dense, aten.item, aten.nonzero, aten.masked_select, aten._unique2,
    aten.unique_dim, aten.unique_consecutive, aten.argwhere, aten.nonzero_static,
    aten.is_nonzero, aten.equal, aten.allclose) if p is not None])
_categorize("factory", *[p for p in (
    aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
    aten.zeros, aten.zeros_like, aten.ones, aten.ones_like, aten.full, aten.full_like, aten.new_zeros,
    aten.new_ones, aten.new_full, aten.arange, aten.scalar_tensor, aten.fill_, aten.fill, aten.zero_,
    aten.randn, aten.rand, aten.randint, aten.randn_like, aten.rand_like, aten.normal_, aten.uniform_,
    aten.bernoulli, aten.bernoulli_, aten.linspace, aten.eye, aten.tensor, aten.lift_fresh) if p is not None])


# --- Backward kernels, losses, scatters -----------------------------------------------------------------
#
# A backward op is filed with its forward's category and counts element ops the way its forward does:
# norms one per element of the normalized tensor, activations one per gradient element, pooling and
# interpolation the taps their forward read (max pooling: the one input each output's index names).
# Losses are reductions over their input (one element op per input element, NLL one per target) and
# their gradients element-wise. Gradients that only copy (``select_backward``) move bytes, nothing else.
# Scatter-style aggregation (``index_add``, ``scatter_add``, ``scatter_reduce``) adds one element op per
# source element combined into the result; it has no multiply-adds.

_NORM_BACKWARD = ("aten::native_layer_norm_backward", "aten::native_batch_norm_backward",
                  "aten::native_group_norm_backward", "aten::batch_norm_backward", "aten::_fused_rms_norm_backward",
                  "aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward",
                  "aten::batch_norm_backward_elemt", "aten::batch_norm_backward_reduce",
                  "aten::_weight_norm_interface_backward")
_categorize("norm", *_NORM_BACKWARD, "aten::_weight_norm_interface")


@register_elem_ops(*_NORM_BACKWARD)
def norm_backward_elem_ops(first: tuple, second: tuple, *args, out_shape, **kwargs) -> int:
    """One element op per element of the normalized tensor, as its forward counts (the second
    argument: ``input``, or cuDNN's and MIOpen's ``grad_output``, of the same shape).

    # (dx [n, d], dw [d], db [d]) = native_layer_norm_backward(dy [n, d], x [n, d], [d], mean, rstd, w, b, mask)
    """
    return math.prod(second)


_categorize("activation", *[p for p in (
    aten._softmax_backward_data, aten._log_softmax_backward_data, _opt("_masked_softmax_backward"),
    aten._prelu_kernel_backward, aten.elu_backward, aten.glu_backward, aten.hardsigmoid_backward,
    aten.hardswish_backward, aten.hardtanh_backward, aten.leaky_relu_backward, aten.log_sigmoid_backward,
    aten.mish_backward, aten.rrelu_with_noise_backward, aten.softplus_backward, aten.hardshrink_backward,
    aten.softshrink_backward, _opt("infinitely_differentiable_gelu_backward"), aten.log_sigmoid_forward,
    aten.rrelu_with_noise, _opt("_masked_softmax")) if p is not None])

_MAX_POOL_BACKWARD = ("aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward",
                      "aten::max_pool2d_backward", "aten::adaptive_max_pool2d_backward",
                      "aten::adaptive_max_pool3d_backward", "aten::fractional_max_pool2d_backward",
                      "aten::fractional_max_pool3d_backward", "aten::mkldnn_max_pool2d_backward",
                      "aten::mkldnn_max_pool3d_backward")
_ADAPTIVE_AVG_POOL_BACKWARD = ("aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward",
                               "aten::adaptive_avg_pool3d_backward", "aten::mkldnn_adaptive_avg_pool2d_backward")
_categorize("pooling", *_MAX_POOL_BACKWARD, *_ADAPTIVE_AVG_POOL_BACKWARD, "aten::avg_pool2d_backward",
            "aten::avg_pool3d_backward", "aten::fractional_max_pool2d", "aten::fractional_max_pool3d")


@register_elem_ops(*_MAX_POOL_BACKWARD)
def max_pool_backward_elem_ops(grad_output: tuple, *args, out_shape, **kwargs) -> int:
    """Each output gradient goes to the one input its saved index names: one per output element.

    # dx [n, c, h, w] = max_pool2d_with_indices_backward(dy [n, c, ho, wo], x, kernel, ..., indices)
    """
    return math.prod(grad_output)


@register_elem_ops(*_ADAPTIVE_AVG_POOL_BACKWARD)
def adaptive_avg_pool_backward_elem_ops(grad_output: tuple, input: tuple, *args, out_shape, **kwargs) -> int:
    """One element op per input element, as its forward counts (each takes its share of its bins).

    # dx [n, c, h, w] = _adaptive_avg_pool2d_backward(dy [n, c, ho, wo], x [n, c, h, w])
    """
    return math.prod(input)


def _avg_pool_backward(dims: int) -> ElemFormula:
    def formula(grad_output, input, kernel_size, *args, out_shape, **kwargs) -> int:
        window = math.prod(kernel_size) if len(kernel_size) > 1 else int(kernel_size[0]) ** dims
        return math.prod(grad_output) * window

    formula.__doc__ = (f"Each output gradient is spread over its {dims}-d window: output elements x window, "
                       "as the forward counts")
    return formula


register_elem_ops("aten::avg_pool2d_backward")(_avg_pool_backward(2))
register_elem_ops("aten::avg_pool3d_backward")(_avg_pool_backward(3))


def embedding_bag_backward_elem_ops(grad: tuple, indices: tuple, num_weights: int, zeroes_table: bool = True) -> int:
    """An embedding bag's weight gradient adds its bag's gradient row into the row of every index
    it pooled: one add per (index, feature), on top of zeroing the table's gradient (dense).

    # [num_weights, d] = _embedding_bag_backward(grad [bags, d], indices [k], ...)
    """
    d = grad[-1]
    return math.prod(indices) * d + (int(num_weights) * d if zeroes_table else 0)


@register_elem_ops("aten::_embedding_bag_backward")
def _embedding_bag_backward_elem_ops(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                                     scale_grad_by_freq, mode, sparse, *args, out_shape, **kwargs) -> int:
    """``nn.EmbeddingBag``'s weight gradient: see ``embedding_bag_backward_elem_ops`` (sparse: no zeroing)."""
    return embedding_bag_backward_elem_ops(grad, indices, num_weights, zeroes_table=not sparse)


@register_elem_ops("aten::_embedding_bag_dense_backward")
def _embedding_bag_dense_backward_elem_ops(grad, indices, offset2bag, bag_size, maximum_indices, num_weights, *args,
                                           out_shape, **kwargs) -> int:
    """The dense weight gradient of an embedding bag: see ``embedding_bag_backward_elem_ops``."""
    return embedding_bag_backward_elem_ops(grad, indices, num_weights)


@register_elem_ops("aten::_embedding_bag_sparse_backward")
def _embedding_bag_sparse_backward_elem_ops(grad, indices, *args, out_shape, **kwargs) -> int:
    """The sparse weight gradient of an embedding bag: one row per index, no table to zero."""
    return embedding_bag_backward_elem_ops(grad, indices, 0, zeroes_table=False)


@register_elem_ops("aten::_embedding_bag_per_sample_weights_backward")
def embedding_bag_per_sample_weights_backward_elem_ops(grad: tuple, weight: tuple, indices: tuple, *args,
                                                       out_shape, **kwargs) -> int:
    """The gradient of ``per_sample_weights``: a dot of the bag's gradient with each index's row.

    # [k] = _embedding_bag_per_sample_weights_backward(grad [bags, d], weight [v, d], indices [k], ...)
    """
    return math.prod(indices) * grad[-1]


_categorize("embedding", "aten::_embedding_bag_backward", "aten::_embedding_bag_dense_backward",
            "aten::_embedding_bag_sparse_backward", "aten::_embedding_bag_per_sample_weights_backward")

_categorize("reduction", *[p for p in (  # losses: one element op per input element
    aten.nll_loss_forward, aten.nll_loss2d_forward, aten.mse_loss, aten.smooth_l1_loss, aten.huber_loss,
    aten.binary_cross_entropy, aten.binary_cross_entropy_with_logits, aten.soft_margin_loss,
    aten.multi_margin_loss, aten.multilabel_margin_loss_forward) if p is not None])
_categorize("elementwise", *[p for p in (  # their gradients: one per input element
    aten.nll_loss_backward, aten.nll_loss2d_backward, aten.mse_loss_backward, aten.smooth_l1_loss_backward,
    aten.huber_loss_backward, aten.binary_cross_entropy_backward, aten.soft_margin_loss_backward,
    aten.multi_margin_loss_backward, aten.multilabel_margin_loss_backward) if p is not None])


@register_elem_ops("aten::nll_loss_forward", "aten::nll_loss2d_forward")
def nll_loss_elem_ops(input: tuple, target: tuple, *args, out_shape, **kwargs) -> int:
    """Negative log-likelihood gathers one log-probability per target and sums them: one per target.

    # ([], []) = nll_loss_forward(log_probs [n, classes], target [n], ...)
    """
    return math.prod(target)


@register_elem_ops("aten::nll_loss_backward", "aten::nll_loss2d_backward")
def nll_loss_backward_elem_ops(grad_output: tuple, input: tuple, target: tuple, *args, out_shape, **kwargs) -> int:
    """Its gradient writes one value per target into a zeroed [n, classes]: one per target.

    # dx [n, classes] = nll_loss_backward(dy [], log_probs [n, classes], target [n], ...)
    """
    return math.prod(target)


_categorize("data_movement", *[p for p in (
    aten.select_backward, aten.slice_backward, aten.diagonal_backward, aten.unfold_backward,
    aten.masked_scatter_backward, aten.diag_embed, aten.im2col, aten.col2im, aten.take, aten.put, aten.put_,
    aten.index_copy, aten.index_copy_, aten.index_fill, aten.index_fill_, aten.masked_scatter,
    aten.masked_scatter_, aten.scatter_, aten.max_unpool2d, aten.max_unpool3d,
    aten.reflection_pad1d, aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad3d,
    aten.reflection_pad1d_backward, aten.reflection_pad2d_backward, aten.reflection_pad3d_backward,
    aten.replication_pad1d_backward, aten.replication_pad2d_backward, aten.replication_pad3d_backward) if p is not None])

_INDEX_ADDS = ("aten::index_add", "aten::index_add_", "aten::index_reduce", "aten::index_reduce_")
_SCATTER_ADDS = ("aten::scatter_add", "aten::scatter_add_", "aten::scatter_reduce", "aten::scatter_reduce_")
_categorize("data_movement", *_INDEX_ADDS, *_SCATTER_ADDS)


@register_elem_ops(*_INDEX_ADDS)
def index_add_elem_ops(self: tuple, dim: int, index: tuple, source: tuple, *args, out_shape, **kwargs) -> int:
    """One add (or max, min, product: ``index_reduce``) per element of ``source`` combined into the
    result; alpha's scaling is folded in, the mean's division not counted.

    # [n, d] = index_add([n, d], 0, index [k], source [k, d]): k*d
    """
    return math.prod(source)


@register_elem_ops(*_SCATTER_ADDS)
def scatter_add_elem_ops(self: tuple, dim: int, index: tuple, src: tuple, *args, out_shape, **kwargs) -> int:
    """One add (or reduction) per element ``index`` names: ``src`` may be larger than ``index``,
    only its first index-shaped block is combined; the mean's division is not counted.

    # [n, d] = scatter_add([n, d], 0, index [k, d], src [k, d]): k*d
    """
    return math.prod(index)


# --- Complex data and FFTs ------------------------------------------------------------------------------
#
# flops are real multiply-adds. A complex multiply-add (a + bi)(c + di) + (e + fi) is 4 real ones: the
# real part accumulates ac and -bd, the imaginary part ad and bc (the product's 2 real adds are folded
# into the accumulation). ``cost_op`` multiplies every multiply-add formula by ``COMPLEX_MULTIPLY_ADDS``
# when an operand is complex, except the formulas in ``_REAL_MULTIPLY_ADDS``, which count real work
# already (the FFTs).

COMPLEX_MULTIPLY_ADDS = 4
FFT_FLOPS_PER_POINT_LOG2 = 5  # benchFFT: a complex transform of N points is 5 N log2 N real flops


def fft_multiply_adds(sizes: Sequence[int], transforms: int = 1, real: bool = False) -> int:
    """Real multiply-adds of ``transforms`` FFTs over ``sizes`` (the transformed dims), by benchFFT's
    convention (www.fftw.org/speed/method.html): 5 N log2 N real flops per complex transform of
    N = prod(sizes) points (the radix-2 Cooley-Tukey count: N/2 log2 N butterflies, each a complex
    multiply, 6 flops, and two complex adds, 4 flops), half that for a real-input or real-output
    transform; 2 flops per multiply-add. The same formula for every N: it is a convention for
    comparing transforms, not the count of one algorithm. The scaling of ``norm=`` is element-wise
    work and not counted. Rounded to the nearest integer.

    # complex N: 5/2 N log2 N multiply-adds; real N: 5/4 N log2 N
    """
    n = math.prod(int(s) for s in sizes)
    if n <= 1:
        return 0
    flops = FFT_FLOPS_PER_POINT_LOG2 * n * math.log2(n) / (2 if real else 1)
    return int(transforms * flops / 2 + 0.5)


def _fft_points(t, dim) -> tuple[list[int], int]:
    """The transformed sizes of ``t`` along ``dim`` and how many transforms its other dims make."""
    sizes = [int(t.shape[d]) for d in dim]
    n = math.prod(sizes)
    return sizes, (t.numel() // n if n else 0)


@register_flops(aten._fft_c2c)
def fft_c2c_flops(input, dim, normalization, forward, *, out_val=None, **kwargs) -> int:
    """A complex-to-complex FFT (``torch.fft.fft/ifft/fftn``): see ``fft_multiply_adds``.

    # [..., n] complex = _fft_c2c([..., n] complex, dim)
    """
    return fft_multiply_adds(*_fft_points(input, dim))


@register_flops(aten._fft_r2c)
def fft_r2c_flops(input, dim, normalization, onesided, *, out_val=None, **kwargs) -> int:
    """A real-input FFT (``torch.fft.rfft/rfftn``, and ``fft`` of a real tensor): half a complex one.

    # [..., n//2 + 1] complex = _fft_r2c([..., n] real, dim, onesided=True); [..., n] when two-sided
    """
    return fft_multiply_adds(*_fft_points(input, dim), real=True)


@register_flops(aten._fft_c2r)
def fft_c2r_flops(input, dim, normalization, last_dim_size, *, out_val=None, **kwargs) -> int:
    """A real-output inverse FFT (``torch.fft.irfft/irfftn/hfft``): half a complex one, over the
    real output's sizes.

    # [..., last_dim_size] real = _fft_c2r([..., n//2 + 1] complex, dim, last_dim_size)
    """
    return fft_multiply_adds(*_fft_points(out_val, dim), real=True)


_REAL_MULTIPLY_ADDS = {_key(aten._fft_c2c), _key(aten._fft_r2c), _key(aten._fft_c2r)}


# --- Vision ops: interpolation, sampling, RoI pooling, NMS, deformable convolution ---------------------
#
# Element ops count the input taps each output combines (a multiply-add per weight). Bytes are the
# generic count: every input read once, every output written once (for gathers that read part of
# their input, that bounds the bytes from above). torchvision ops are keyed by name: torchvision is
# not imported, and its ops are costed whenever a model that did import it runs one.


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def interpolation_elem_ops(in_shape: tuple, out_shape: tuple, taps_per_dim: int, antialias: bool = False) -> int:
    """Input taps combined per output element, times the output elements.

    # [n, c, *out] = upsample([n, c, *in]): nearest 1 tap per dim, linear 2, cubic 4, so per output
    # element bilinear 2*2 = 4 and bicubic 4*4 = 16 (fvcore: nearest 1, bilinear 4; Keys 1981: the
    # cubic kernel spans 4 samples). Antialiased downscaling widens the filter by the factor in/out
    # (Pillow's convention, as in ATen's _upsample_*_aa): ceil(taps_per_dim * in / out) taps per dim.
    """
    per_output = 1
    for i, o in zip(in_shape[2:], out_shape[2:]):
        per_output *= _ceil_div(taps_per_dim * i, o) if antialias and i > o else taps_per_dim
    return math.prod(out_shape) * per_output


def _interpolation(taps_per_dim: int, antialias: bool = False) -> ElemFormula:
    def formula(input, *args, out_shape, **kwargs) -> int:
        return interpolation_elem_ops(input, out_shape, taps_per_dim, antialias)

    formula.__doc__ = (f"{taps_per_dim} input tap(s) per spatial dim per output element"
                       + (", widened by the downscaling factor (antialias)" if antialias else ""))
    return formula


# the interpolation ops by their taps per spatial dim (and antialias): each forward's formula, and
# (below) each backward's, which spreads every output gradient over the same taps
_INTERPOLATIONS = (
    (("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
      "_upsample_nearest_exact2d", "_upsample_nearest_exact3d"), 1, False),
    (("upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d"), 2, False),
    (("upsample_bicubic2d",), 4, False),
    (("_upsample_bilinear2d_aa",), 2, True),
    (("_upsample_bicubic2d_aa",), 4, True),
)
for _names, _taps, _aa in _INTERPOLATIONS:
    register_elem_ops(*(f"aten::{n}" for n in _names))(_interpolation(_taps, antialias=_aa))

GRID_SAMPLER_TAPS_PER_DIM = {0: 2, 1: 1, 2: 4}  # interpolation_mode: bilinear, nearest, bicubic


@register_elem_ops("aten::grid_sampler_2d", "aten::grid_sampler_3d", "aten::_grid_sampler_2d_cpu_fallback")
def grid_sampler_elem_ops(input: tuple, grid: tuple, interpolation_mode: int, *args, out_shape: tuple, **kwargs) -> int:
    """Like interpolation, by mode: bilinear 4 taps per output element (trilinear 8), nearest 1, bicubic 16.

    # [n, c, *out] = grid_sampler([n, c, *in], grid [n, *out, dims]); fvcore counts 4 (bilinear)
    """
    return math.prod(out_shape) * GRID_SAMPLER_TAPS_PER_DIM[int(interpolation_mode)] ** (len(input) - 2)


@register_elem_ops("aten::cudnn_grid_sampler")
def cudnn_grid_sampler_elem_ops(input: tuple, grid: tuple, *, out_shape: tuple) -> int:
    """cuDNN's grid sampler is bilinear only: 4 taps per output element."""
    return math.prod(out_shape) * 4


@register_elem_ops("aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward")
def grid_sampler_backward_elem_ops(grad_output: tuple, input: tuple, grid: tuple, interpolation_mode: int,
                                   padding_mode: int, align_corners: bool, output_mask, *, out_shape) -> int:
    """Each gradient asked for visits every tap of every output once: the input gradient adds
    w * dy into each tap, the grid gradient accumulates dy * v * dw/dx from each.

    # (d_input [n, c, *in], d_grid [n, *out, dims]) = grid_sampler_2d_backward(dy [n, c, *out], input, grid, ...)
    """
    taps = grid_sampler_elem_ops(input, grid, interpolation_mode, out_shape=grad_output)
    return taps * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


@register_elem_ops("aten::_grid_sampler_2d_cpu_fallback_backward")
def grid_sampler_fallback_backward_elem_ops(grad_output: tuple, input: tuple, grid: tuple, interpolation_mode: int,
                                            *args, out_shape) -> int:
    """The CPU fallback's backward computes both gradients: twice the forward's taps."""
    return 2 * grid_sampler_elem_ops(input, grid, interpolation_mode, out_shape=grad_output)


@register_elem_ops("aten::cudnn_grid_sampler_backward")
def cudnn_grid_sampler_backward_elem_ops(input: tuple, grid: tuple, grad_output: tuple, *, out_shape) -> int:
    """cuDNN's bilinear sampler's backward: both gradients, 4 taps per output element each."""
    return 2 * 4 * math.prod(grad_output)


def affine_grid_flops(theta: tuple, out_shape: tuple) -> int:
    """Multiply-adds of ``F.affine_grid``: every output point is theta [dims, dims + 1] times its
    homogeneous base coordinate (ATen: base_grid [n, points, dims + 1] bmm theta^T). Its backward,
    theta's gradient, is the same product transposed (torch decomposes it into that bmm).

    # [n, h, w, 2] = affine_grid_generator(theta [n, 2, 3], size [n, c, h, w]): n*h*w * 2*3
    # [n, d, h, w, 3] = affine_grid_generator(theta [n, 3, 4], size [n, c, d, h, w]): n*d*h*w * 3*4
    """
    return math.prod(out_shape[:-1]) * theta[-2] * theta[-1]


@register_flops("aten::affine_grid_generator", "aten::cudnn_affine_grid_generator")
def _affine_grid_flops(theta, *args, out_val=None, **kwargs) -> int:
    """``F.affine_grid`` (spatial transformers, Jaderberg et al., NeurIPS 2015): see ``affine_grid_flops``."""
    return affine_grid_flops(_shapes(theta), _shapes(out_val))


@register_flops("aten::cudnn_affine_grid_generator_backward")
def _affine_grid_backward_flops(grad, n, c, h, w, *, out_val=None, **kwargs) -> int:
    """cuDNN's theta gradient: grad [n, h, w, 2] against the base grid, the forward's multiply-adds."""
    return affine_grid_flops(_shapes(out_val), _shapes(grad))


_categorize("matmul", "aten::affine_grid_generator", "aten::cudnn_affine_grid_generator",
            "aten::cudnn_affine_grid_generator_backward")


def _interpolation_backward(taps_per_dim: int, antialias: bool = False) -> ElemFormula:
    def formula(grad_output, output_size, input_size, *args, out_shape, **kwargs) -> int:
        return interpolation_elem_ops(tuple(input_size), grad_output, taps_per_dim, antialias)

    formula.__doc__ = (f"The backward of interpolation: each output gradient is spread over the same "
                       f"{taps_per_dim} input tap(s) per spatial dim its forward read"
                       + (", widened by the downscaling factor (antialias)" if antialias else ""))
    return formula


for _names, _taps, _aa in _INTERPOLATIONS:
    register_elem_ops(*(f"aten::{n}_backward" for n in _names))(_interpolation_backward(_taps, antialias=_aa))


ROI_ADAPTIVE_SAMPLES = 4  # 2x2 points per bin when sampling_ratio <= 0 (adaptive: the boxes decide)


def roi_align_elem_ops(out_shape: tuple, sampling_ratio: int) -> int:
    """Output elements x sampling points per bin x 4 bilinear taps per point.

    # [k, c, ph, pw] = roi_align([n, c, h, w], rois [k, 5]); sampling_ratio s > 0: s*s points per bin.
    # Adaptive sampling (s <= 0) takes ceil(box / bin) points, which depends on the boxes: counted as
    # 2x2, the four regularly sampled locations of Mask R-CNN (He et al., ICCV 2017, Sec. 3).
    """
    points = int(sampling_ratio) ** 2 if int(sampling_ratio) > 0 else ROI_ADAPTIVE_SAMPLES
    return math.prod(out_shape) * points * 4


@register_elem_ops("torchvision::roi_align")
def _roi_align_elem_ops(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned=False, *,
                        out_shape) -> int:
    """torchvision.ops.roi_align: see ``roi_align_elem_ops``."""
    return roi_align_elem_ops(out_shape, sampling_ratio)


@register_elem_ops("torchvision::ps_roi_align")
def _ps_roi_align_elem_ops(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, *,
                           out_shape) -> int:
    """Position-sensitive roi_align (R-FCN): returns (output [k, c/(ph*pw), ph, pw], channel map)."""
    return roi_align_elem_ops(out_shape[0], sampling_ratio)


@register_elem_ops("torchvision::roi_pool", "torchvision::ps_roi_pool")
def roi_pool_elem_ops(input, rois, spatial_scale, pooled_height, pooled_width, *, out_shape) -> int:
    """One max (or mean) per input cell of a bin, a bin counted as 2x2 cells (its size depends on the boxes).

    # ([k, c', ph, pw], argmax or channel map) = roi_pool([n, c, h, w], rois [k, 5]); Fast R-CNN
    # (Girshick, ICCV 2015) max-pools each h/ph x w/pw sub-window; counted like adaptive roi_align
    """
    return math.prod(out_shape[0]) * ROI_ADAPTIVE_SAMPLES


@register_elem_ops("torchvision::nms")
def nms_elem_ops(dets: tuple, scores: tuple, iou_threshold: float, *, out_shape) -> int:
    """IoU comparisons of greedy NMS on n boxes: at most n*(n-1)/2, every pair once (an upper bound:
    torchvision's kernel skips boxes already suppressed; the kept count depends on the data).

    # [m] = nms(dets [n, 4], scores [n]), m <= n
    """
    n = int(dets[0])
    return n * (n - 1) // 2


def deform_conv2d_flops(input: tuple, weight: tuple, out_shape: tuple) -> int:
    """Multiply-adds of a deformable convolution: those of the same regular convolution.

    # [n, co, ho, wo] = deform_conv2d([n, ci, h, w], weight [co, ci/g, kh, kw], offset, mask, bias)
    """
    n, c_out, h_out, w_out = out_shape
    _, c_in_per_group, kh, kw = weight
    return n * c_out * h_out * w_out * c_in_per_group * kh * kw


@register_flops("torchvision::deform_conv2d")
def _deform_conv2d_flops(input, weight, *args, out_val=None, **kwargs) -> int:
    """torchvision.ops.deform_conv2d: see ``deform_conv2d_flops`` (flop formulas get tensors)."""
    return deform_conv2d_flops(_shapes(input), _shapes(weight), _shapes(out_val))


@register_elem_ops("torchvision::deform_conv2d")
def deform_conv2d_elem_ops(input: tuple, weight: tuple, offset, mask, bias, stride_h, stride_w, pad_h, pad_w,
                           dilation_h, dilation_w, groups, offset_groups, use_mask, *, out_shape: tuple) -> int:
    """Bilinear sampling of the input at the offset positions: 4 taps per sample, plus 1 for the
    modulation mask (DCNv2, Zhu et al., CVPR 2019) when ``use_mask``.

    # samples = n * ci * kh * kw * ho * wo: torchvision's deformable_im2col, one per column entry
    """
    n, c_in = input[:2]
    kh, kw = weight[2:]
    samples = n * c_in * kh * kw * out_shape[2] * out_shape[3]
    return samples * (5 if use_mask else 4)


_categorize("data_movement", "aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d",
            "aten::_upsample_nearest_exact1d", "aten::_upsample_nearest_exact2d", "aten::_upsample_nearest_exact3d",
            "aten::upsample_linear1d", "aten::upsample_bilinear2d", "aten::upsample_trilinear3d",
            "aten::upsample_bicubic2d", "aten::_upsample_bilinear2d_aa", "aten::_upsample_bicubic2d_aa",
            "aten::grid_sampler_2d", "aten::grid_sampler_3d", "aten::_grid_sampler_2d_cpu_fallback",
            "aten::cudnn_grid_sampler",
            "aten::upsample_nearest1d_backward", "aten::upsample_nearest2d_backward",
            "aten::upsample_nearest3d_backward", "aten::_upsample_nearest_exact1d_backward",
            "aten::_upsample_nearest_exact2d_backward", "aten::_upsample_nearest_exact3d_backward",
            "aten::upsample_linear1d_backward", "aten::upsample_bilinear2d_backward",
            "aten::upsample_trilinear3d_backward", "aten::upsample_bicubic2d_backward",
            "aten::_upsample_bilinear2d_aa_backward", "aten::_upsample_bicubic2d_aa_backward",
            "aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward",
            "aten::_grid_sampler_2d_cpu_fallback_backward", "aten::cudnn_grid_sampler_backward")
_categorize("pooling", "torchvision::roi_align", "torchvision::ps_roi_align", "torchvision::roi_pool",
            "torchvision::ps_roi_pool")
_categorize("host_sync", "torchvision::nms")  # its output size depends on the data, like nonzero
_categorize("conv", "torchvision::deform_conv2d")  # refined by groups, as aten convolutions are


# --- Quantized models as they are (``quantized.py``) ---------------------------------------------------
#
# torch.ao's quantized layers call ops of the ``quantized`` namespace with their weights packed in a
# TorchScript object (no tensor the dispatcher sees): ``cost_op`` reads a packed argument as a weight at
# its bytes as stored (``quantized.packed``), and the formulas count the float layer's multiply-adds.
# torchao's tensor-subclass weights meet ``F.linear``: the recorder costs the call whole
# (``subclass_linear_costs``), as the fused kernels that serve it run.

_QUANTIZED_LINEARS = ("quantized::linear", "quantized::linear_relu", "quantized::linear_dynamic",
                      "quantized::linear_relu_dynamic", "quantized::linear_dynamic_fp16",
                      "quantized::linear_relu_dynamic_fp16")
_QUANTIZED_CONVS = ("quantized::conv1d", "quantized::conv2d", "quantized::conv3d", "quantized::conv1d_relu",
                    "quantized::conv2d_relu", "quantized::conv3d_relu", "quantized::conv_transpose1d",
                    "quantized::conv_transpose2d", "quantized::conv_transpose3d")
_QUANTIZED_RNNS = ("aten::quantized_lstm", "aten::quantized_gru")


@register_flops(*_QUANTIZED_LINEARS)
def _quantized_linear_flops(x, w_prepack, *args, out_val=None, **kwargs) -> int:
    """A torch.ao quantized linear (static or dynamic): see ``quantized.quantized_linear_flops``."""
    return quantized_linear_flops(_shape(x), _shape(out_val))


@register_flops(*_QUANTIZED_CONVS)
def _quantized_conv_flops(x, packed_weight, *args, out_val=None, **kwargs) -> int:
    """A torch.ao quantized convolution: see ``quantized.quantized_conv_flops``."""
    found = packed(packed_weight)
    if found is None or not found.shapes:
        return 0
    return quantized_conv_flops(found.shapes[0], _shape(out_val), _packed_transposed(packed_weight), _shape(x))


@register_flops(*_QUANTIZED_RNNS)
def _quantized_rnn_flops(x, hx, params, *args, out_val=None, **kwargs) -> int:
    """``quantize_dynamic``'s LSTM and GRU: see ``quantized.quantized_rnn_flops``."""
    shapes = tuple(s for p in params if (found := packed(p)) is not None for s in found.shapes)
    return quantized_rnn_flops(_shape(x), shapes)


@register_flops("aten::_int_mm")
def _int_mm_flops(a, b, *, out_val=None, **kwargs) -> int:
    """The int8 GEMM (torchao's dynamic-activation int8 path): see ``quantized.int_mm_flops``."""
    return int_mm_flops(_shape(a), _shape(b))


def _packed_transposed(obj) -> bool:
    try:
        return bool(real_object(obj).transpose())
    except Exception:
        return False


def _quantized_conv_attrs(args) -> dict:
    """Channels, groups, kernel and stride of a quantized convolution, from its packed weight."""
    obj, x = real_object(args[1]), args[0]
    w = packed(obj).weights[0]
    groups, transposed = int(obj.groups()), _packed_transposed(obj)
    c_out, c_in = (int(w.shape[1]) * groups, int(w.shape[0])) if transposed else (int(w.shape[0]), int(x.shape[1]))
    return {"in_channels": c_in, "out_channels": c_out, "groups": groups,
            "kernel": tuple(int(k) for k in w.shape[2:]), "stride": tuple(int(s) for s in obj.stride()),
            "transposed": transposed, "in_shape": tuple(int(d) for d in x.shape)}


_categorize("linear", *_QUANTIZED_LINEARS)
_categorize("conv", *_QUANTIZED_CONVS)  # refined by groups, as aten convolutions are
_categorize("rnn", *_QUANTIZED_RNNS)
_categorize("matmul", "aten::_int_mm")
# (de)quantizing converts each element once; quantized element-wise ops work on int8 values
_categorize("elementwise", "aten::quantize_per_tensor", "aten::quantize_per_tensor_dynamic",
            "aten::quantize_per_channel", "aten::dequantize", "quantized::add", "quantized::add_relu",
            "quantized::add_scalar", "quantized::add_scalar_relu", "quantized::mul", "quantized::mul_relu",
            "quantized::mul_scalar", "quantized::mul_scalar_relu", "quantized::hardswish", "quantized::sigmoid",
            "quantized::leaky_relu", "quantized::relu6", "quantized::celu", "quantized::threshold")
_categorize("norm", "quantized::batch_norm1d", "quantized::batch_norm2d", "quantized::batch_norm3d",
            "quantized::batch_norm2d_relu", "quantized::batch_norm3d_relu", "quantized::layer_norm",
            "quantized::group_norm", "quantized::instance_norm")
_categorize("data_movement", "quantized::cat", "quantized::cat_relu")


_PACKED_OPS = frozenset(_QUANTIZED_LINEARS + _QUANTIZED_CONVS + _QUANTIZED_RNNS)


def _packed_attrs(found: Packed, key: str, attrs: dict) -> dict:
    """What a torch.ao quantized layer's node says of its packed weight: the type it stores, its bytes
    as stored, a linear layer's features; a dynamic int8 linear computes in int8 (its activations
    quantized inside the kernel), which ``compute_dtype`` names."""
    attrs = {**attrs, "weight_dtype": found.dtype,
             "weight_stored_bytes": attrs.get("weight_stored_bytes", 0) + found.nbytes}
    if key in _QUANTIZED_LINEARS and found.shapes:
        attrs.update(in_features=found.shapes[0][1], out_features=found.shapes[0][0])
        if key.endswith(("_dynamic", "_relu_dynamic")) and found.dtype == "qint8":
            attrs["compute_dtype"] = "qint8"
    return attrs


def _packed_reads(args) -> list:
    """The packed-parameter objects among an op's arguments (a list of them for quantized RNNs)."""
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(x for x in a if is_packed(x))
        elif is_packed(a):
            out.append(a)
    return out


def subclass_linear_costs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                          weight_keys: frozenset | set = frozenset()) -> list[OpCost]:
    """``F.linear`` on a tensor-subclass weight (torchao), as the fused kernel that serves it runs:
    one GEMM of the float layer's multiply-adds (M·N·K) reading the weight at its bytes as stored
    (every inner tensor once: values, scales, zero points) and the bias. A weight that quantizes the
    activations it meets (dynamic-activation configs) computes in int8 (or float8) on activations a
    kernel before it quantizes: that kernel reads them and writes them one byte each with a float32
    scale per row, and the GEMM reads the bytes (as ``archscan.quant`` counts a w8a8 layer).

    # [..., N] = linear(x [..., K], W [N, K] stored, bias [N])
    """
    k = int(weight.shape[-1])
    rows = x.numel() // k if k else 0
    stored = stored_nbytes(weight)
    bias_bytes = _nbytes(bias) if isinstance(bias, torch.Tensor) else 0
    weight_read = stored + (bias_bytes if isinstance(bias, torch.Tensor) and storage_key(bias) in weight_keys else 0)
    attrs = {"in_features": k, "out_features": int(weight.shape[0]), "weight_dtype": stored_dtype(weight),
             "weight_stored_bytes": stored}
    name = f"{type(weight).__module__.partition('.')[0]}.linear"
    flops = quantized_linear_flops(_shape(x), _shape(out))
    if not quantizes_activations(weight):
        return [OpCost(name, "linear", flops, 0, _nbytes(x) + stored + bias_bytes, _nbytes(out), weight_read,
                       attrs=attrs)]
    quantized = x.numel()  # one byte each, and a float32 scale per row
    compute = "float8_e4m3fn" if "float8" in (attrs["weight_dtype"] or "") else "int8"
    quantize = OpCost(f"{name.partition('.')[0]}.quantize_activations", "elementwise", 0,
                      *activation_quantize(x.numel(), x.element_size(), rows))
    gemm = OpCost(name, "linear", flops, 0, quantized + stored + bias_bytes, _nbytes(out), weight_read,
                  attrs={**attrs, "compute_dtype": compute})
    return [quantize, gemm]


# Not views by schema, but they only reinterpret metadata: no bytes move.
_FREE = {p for p in (aten._unsafe_view, aten.lift_fresh, aten.detach_, aten.resize_, aten.set_,
                     _opt("_assert_tensor_metadata"), _opt("_assert_async"), _opt("_assert_scalar"),
                     _opt("sym_constrain_range"), _opt("sym_constrain_range_for_size"), _opt("_functional_assert_async"),
                     _opt("unsafe_split"), _opt("unsafe_split_with_sizes"), _opt("unsafe_chunk"),
                     aten._reshape_alias, aten.sym_size, aten.sym_stride, aten.sym_numel,
                     aten.sym_storage_offset, aten.dim, aten.is_contiguous, aten.size, aten.stride)
         if p is not None}
# Write-only ops: nothing is read (empty/empty_like allocate without writing).
_NO_WRITE = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}
_GATHERS = {aten.embedding, aten.index_select, aten.gather, aten.index, aten._unsafe_index}
_ACTIVATION_FAMILY = {"activation", "norm", "elementwise"}


def _tensors(tree) -> list[torch.Tensor]:
    """Tensors in nested args (tuples, lists, dict values), in order; cheaper than pytree."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    out: list[torch.Tensor] = []
    if type(tree) is tuple:  # a flat tuple: most ops' args and outputs
        for x in tree:
            kind = type(x)
            if kind is tuple or kind is list or kind is dict:
                out.clear()
                break
            if isinstance(x, torch.Tensor):
                out.append(x)
        else:
            return out
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
    return out


def _shapes(tree):
    """Tensors in nested args replaced by their shapes (tuples), everything else kept."""
    if isinstance(tree, torch.Tensor):
        return tuple(tree.shape)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_shapes(x) for x in tree)
    if isinstance(tree, dict):
        return {k: _shapes(v) for k, v in tree.items()}
    return tree


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tensor_key(t: torch.Tensor):
    """Identity of the memory a tensor reads: storage, offset, shape, strides."""
    try:
        storage = t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        storage = id(t)
    return (storage, t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def storage_key(t: torch.Tensor):
    """Identity of a tensor's storage; views share it with their base."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def _conv_attrs(args) -> dict:
    x, w = args[0], args[1]
    groups = int(args[8]) if len(args) > 8 else 1
    transposed = bool(args[6]) if len(args) > 6 else False
    c_out, c_in_per_group = int(w.shape[0]), int(w.shape[1])
    c_in = int(x.shape[1]) if x.dim() > 1 else c_in_per_group * groups
    if transposed:
        c_in, c_out = int(w.shape[0]), int(w.shape[1]) * groups
    return {
        "in_channels": c_in, "out_channels": c_out, "groups": groups,
        "kernel": tuple(int(k) for k in w.shape[2:]),
        "stride": tuple(int(s) for s in args[3]) if len(args) > 3 else (1,),
        "transposed": transposed,
        "in_shape": tuple(int(d) for d in x.shape),
    }


def _deform_conv_attrs(args) -> dict:
    """torchvision::deform_conv2d(input, weight, offset, mask, bias, stride_h, stride_w, ..., groups, ...)."""
    x, w, groups = args[0], args[1], int(args[11])
    return {
        "in_channels": int(x.shape[1]), "out_channels": int(w.shape[0]), "groups": groups,
        "kernel": tuple(int(k) for k in w.shape[2:]), "stride": (int(args[5]), int(args[6])),
        "transposed": False, "in_shape": tuple(int(d) for d in x.shape),
    }


_GROUPED_MM = _opt("_grouped_mm")


def expert_reads(rows: torch.Tensor, experts: torch.Tensor, routing: tuple[int, int] | None = None) -> dict:
    """The expert weights a grouped GEMM reads: [R, K] routed rows against [E, K, N] experts.

    ``routing`` is (tokens T, experts per token k) of the top-k that routed the rows (R = T·k).
    Balanced routing is assumed: each token picks k distinct experts uniformly, so an expert is
    missed by a token with probability 1 − k/E and E·(1 − (1 − k/E)^T) experts are expected to
    be read (k for one token); at worst min(E, T·k). Without a top-k that matches (R ≠ T·k), each
    row counts as a token of its own (k = 1). The bytes counted are the expected ones; ``attrs``
    carry both."""
    r, e = int(rows.shape[0]), int(experts.shape[0])
    tokens, k = routing if routing and routing[0] * routing[1] == r and routing[1] else (r, 1)
    per_expert = _nbytes(experts) // max(e, 1)
    expected = expected_experts(e, k, tokens)
    return {"experts": e, "routed_rows": r, "tokens": tokens, "experts_per_token": k,
            "expected_experts": round(expected, 3), "worst_case_experts": min(e, r),
            "idle_expert_params": experts.numel() * (e - min(k, e)) // max(e, 1),  # not one token's k
            "expert_bytes_read": round(expected * per_expert), "expert_bytes_worst_case": min(e, r) * per_expert}


def _routed_table(table: torch.Tensor, indices: Sequence[torch.Tensor], routing: tuple[int, int] | None) -> dict:
    """A weight of one row per expert gathered by the routed rows' expert ids (GPT-OSS's per-expert
    biases: ``bias[expert_ids]``, [E, N] read for the R = T·k routed rows) leaves E − k of its rows
    idle for one token, as the experts' own weights do: ``{"idle_expert_params"}``; {} for any
    other gather (an embedding read by token ids, a table read before any router)."""
    if not routing or routing[1] < 1 or table.dim() < 2 or len(indices) != 1:
        return {}
    tokens, k = routing
    (ids,) = indices
    experts = int(table.shape[0])
    if ids.dim() != 1 or ids.is_floating_point() or int(ids.numel()) != tokens * k or experts <= k:
        return {}
    return {"idle_expert_params": table.numel() * (experts - k) // experts}


def _dense_experts(rows: torch.Tensor, experts: torch.Tensor, routing: tuple[int, int]) -> dict:
    """Experts run on every token as written (Hugging Face's Llama-4: every token's row repeated for
    each of the E experts, [E, T, K] against [E, K, N] expert weights, the router's top-k only
    scaling them): one token needs k of them. ``{"dense_experts": E, "experts_per_token": k,
    "idle_expert_params"}`` (and ``routed_flops`` once the multiply-adds are known); {} for a
    batched product of another shape."""
    tokens, k = routing
    if experts.dim() != 3 or rows.dim() != 3 or k < 1:
        return {}
    e = int(experts.shape[0])
    if int(rows.shape[0]) != e or int(rows.shape[1]) != tokens or e <= k:
        return {}
    return {"dense_experts": e, "experts_per_token": k, "tokens": tokens,
            "idle_expert_params": experts.numel() * (e - k) // e}


def expected_experts(experts: int, per_token: int, tokens: int) -> float:
    """Experts read by ``tokens`` tokens each picking ``per_token`` distinct ones uniformly (balanced
    routing): E·(1 − (1 − k/E)^T)."""
    return experts * (1 - (1 - min(per_token, experts) / experts) ** tokens) if experts else 0.0


def topk_routing(func, out: Any, current: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """(tokens, k) of a router's choice, or None for an op that makes none: a top-k's result ([..., k]
    values and indices). A router without a top-k (PhiMoE's sparsemixer picks its two experts with a
    ``max`` each, masking the first, and concatenates the indices) is read from ``current``, the
    routing so far: before any top-k, a ``max``/``argmax``'s indices are one expert for each of the
    tokens, and a concatenation of integer [T, k] indices after a routing of the same T tokens
    picks k."""
    packet = func.overloadpacket
    if packet is aten.topk:
        if not isinstance(out, (tuple, list)) or not out:
            return None
        values = out[0]
        k = int(values.shape[-1]) if values.dim() else 0
        return (values.numel() // k, k) if k else None
    if packet in (aten.max, aten.argmax) and current is None:
        indices = out[1] if isinstance(out, (tuple, list)) and len(out) == 2 else out
        if isinstance(indices, torch.Tensor) and indices.dtype == torch.int64 and indices.dim() >= 1 and indices.numel():
            return (indices.numel(), 1)
        return None
    if packet is aten.cat and current is not None and isinstance(out, torch.Tensor) and out.dtype == torch.int64 \
            and out.dim() == 2 and out.shape[0] == current[0] and out.shape[1] > current[1]:
        return (int(out.shape[0]), int(out.shape[1]))
    return None


def composite_attention(ops: list[OpCost], query: Any, key: Any, is_causal: bool) -> list[OpCost]:
    """The ops of one ``scaled_dot_product_attention`` call that the CPU ran as its math
    decomposition (no fused kernel takes a value head size other than the query's: DeepSeek's
    multi-head latent attention), as one attention's: the two batched products are attention
    (priced as such), and with ``is_causal`` their executed multiply-adds are those of the pairs
    the mask leaves, as for the fused kernel. ``ops`` unchanged when one is attention already."""
    if any(c.category == "attention" for c in ops) or not isinstance(query, torch.Tensor) \
            or not isinstance(key, torch.Tensor) or query.dim() < 2 or key.dim() < 2:
        return ops
    queries, keys = int(query.shape[-2]), int(key.shape[-2])
    out = []
    for c in ops:
        if c.op.startswith("aten.bmm") and c.flops:
            attrs = {**c.attrs, **({"causal": True, "executed_flops": c.flops * causal_pairs(queries, keys)
                                    // max(queries * keys, 1)} if is_causal else {})}
            c = replace(c, category="attention", attrs=attrs)
        out.append(c)
    return out


def causal_pairs(queries: int, keys: int) -> int:
    """Query-key pairs a causal mask leaves (torch's ``is_causal``: query i sees keys 0..i):
    S(S+1)/2 for a prefill of S tokens."""
    full = min(queries, keys)
    return full * (full + 1) // 2 + max(queries - keys, 0) * keys


MASK_ELEMENTS = 1 << 24  # the largest attention mask evaluated (a 4,096 × 4,096 causal mask)


def mask_pairs(mask) -> tuple[int, int] | None:
    """(entries of an attention mask that let a query-key pair through, its entries), from its
    values: a bool mask lets True through, a float one any entry above its dtype's lowest value
    (-inf, or finfo.min); None for an empty mask or another dtype."""
    if not isinstance(mask, torch.Tensor) or mask.numel() == 0:
        return None
    if mask.dtype == torch.bool:
        through = mask
    elif mask.is_floating_point():
        through = mask > torch.finfo(mask.dtype).min
    else:
        return None
    return int(through.sum()), mask.numel()


def bound_arguments(func, args: Sequence, kwargs: dict) -> dict:
    """An aten op's arguments by their schema's names (those given; {} for a target without a schema)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return {}
    return {**dict(zip((a.name for a in schema.arguments), args)), **kwargs}


def _causal_attrs(func, args: tuple, kwargs: dict, flops: int) -> dict:
    """``{"causal": True, "executed_flops"}`` for attention run with ``is_causal``: the multiply-adds
    of the query-key pairs the mask leaves (the dense count stays ``flops``); {} otherwise."""
    bound = bound_arguments(func, args, kwargs)
    q, k = bound.get("query"), bound.get("key")
    if not bound.get("is_causal") or not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        return {}
    queries, keys = int(q.shape[-2]), int(k.shape[-2])
    return {"causal": True, "executed_flops": flops * causal_pairs(queries, keys) // (queries * keys)}


# Ops whose attributes (channels, groups, kernel) name their layer; convolutions are refined by groups.
_ATTRS = {"aten::convolution": _conv_attrs, "aten::_convolution": _conv_attrs,
          "torchvision::deform_conv2d": _deform_conv_attrs, **dict.fromkeys(_QUANTIZED_CONVS, _quantized_conv_attrs)}


def _conv_category(attrs: dict) -> str:
    g = attrs["groups"]
    if g == 1:
        return "conv"
    if g == attrs["in_channels"]:
        return "depthwise_conv"
    return "grouped_conv"


def _pool_window(func, args) -> int:
    packet = func.overloadpacket
    if packet in (aten.max_pool2d_with_indices, aten.max_pool2d, aten.avg_pool2d, aten.max_pool1d,
                  aten.avg_pool1d, aten.max_pool3d, aten.max_pool3d_with_indices, aten.avg_pool3d,
                  aten.mkldnn_max_pool2d):
        k = args[1]
        n = 1
        for d in (k if isinstance(k, (list, tuple)) else [k]):
            n *= int(d)
        dims = {aten.max_pool1d: 1, aten.avg_pool1d: 1, aten.max_pool3d: 3,
                aten.max_pool3d_with_indices: 3, aten.avg_pool3d: 3}.get(packet, 2)
        if isinstance(k, (list, tuple)) and len(k) == 1:
            n = int(k[0]) ** dims
        return n
    return 0


def is_free(func) -> bool:
    """True for views and metadata-only ops (in-place views such as ``transpose_`` too): no bytes move."""
    return func.is_view or func.overloadpacket in _FREE or torch.Tag.inplace_view in func.tags


@functools.lru_cache(maxsize=None)
def _op_info(func) -> tuple[str, Any, str, bool, str, FlopFormula | None, ElemFormula | None]:
    """(name, packet, key, free, category, flop formula, element-op formula) of an op, computed once per op."""
    packet = func.overloadpacket
    key = _key(packet)
    free = is_free(func)
    cat = "view" if free else _CATEGORY.get(key)
    if cat is None:
        tags = func.tags
        if torch.Tag.pointwise in tags:
            cat = "elementwise"
        elif torch.Tag.reduction in tags:
            cat = "reduction"
        elif torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags:
            cat = "host_sync"
        else:
            cat = "other"
    return str(func), packet, key, free, cat, _FLOP_FORMULAS.get(key), _ELEM_FORMULAS.get(key)


def category_of(func) -> str:
    """The category of an aten op before looking at its arguments (conv groups refine it)."""
    return _op_info(func)[4]


_MATMULS = (aten.mm, aten.bmm, aten.baddbmm)


def cost_op(func, args: tuple, kwargs: dict, out: Any, weight_keys: frozenset | set = frozenset(),
            routing: tuple[int, int] | None = None) -> OpCost:
    """Cost one executed aten op from its arguments and result (shapes and dtypes only).

    Args:
        func: the OpOverload (aten, or a library's such as torchvision's).
        args, kwargs, out: what the op was called with and returned (real, fake or meta tensors).
        weight_keys: storage keys of the model's parameters and buffers, so weight reads
            are told apart from activation reads.
        routing: (tokens, k) of the last top-k router run (``topk_routing``), for the expert
            weights a grouped GEMM reads.
    """
    name, packet, key, free, category, formula, elem_formula = _op_info(func)
    if free:
        return OpCost(name, "view")
    attrs: dict = {}
    ins = _tensors(args) + _tensors(kwargs) if kwargs else _tensors(args)
    outs = _tensors(out)

    # Bytes: each distinct tensor read once, each output written once.
    read = weight = 0
    if packet in _GATHERS:
        # [n, d] = embedding([v, d], [n]): read the indices and the gathered rows only.
        gathered = sum(_nbytes(t) for t in outs)
        read = sum(_nbytes(t) for t in ins if not t.is_floating_point()) + gathered
        if storage_key(ins[0]) in weight_keys:
            weight = gathered
            attrs = _routed_table(ins[0], ins[1:], routing)
    elif packet not in _NO_WRITE and category != "factory":
        seen = set()
        for t in (ins[1:2] if packet is aten.copy_ else ins):
            k = tensor_key(t)
            if k in seen:
                continue
            seen.add(k)
            nbytes = _nbytes(t)
            read += nbytes
            if k[0] in weight_keys:
                weight += nbytes
    write = 0 if packet in _NO_WRITE else sum(_nbytes(t) for t in outs)
    if (packet is _GROUPED_MM or key == _HF_GROUPED_MM) and len(args) > 1 and args[0].dim() == 2 \
            and args[1].dim() == 3:
        attrs = expert_reads(args[0], args[1], routing)  # the experts the routed rows touch, not all of them
        read -= _nbytes(args[1]) - attrs["expert_bytes_read"]
        if storage_key(args[1]) in weight_keys:
            weight -= _nbytes(args[1]) - attrs["expert_bytes_read"]
    elif packet is aten.bmm and routing and len(args) > 1 and storage_key(args[1]) in weight_keys:
        attrs = _dense_experts(args[0], args[1], routing)

    if key in _PACKED_OPS:  # torch.ao's quantized layers: the packed weights they read, at their bytes as stored
        for found in (packed(obj) for obj in _packed_reads(args)):
            read += found.nbytes
            weight += found.nbytes
            attrs = _packed_attrs(found, key, attrs)

    flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
    if flops and key not in _REAL_MULTIPLY_ADDS and any(t.is_complex() for t in ins):
        flops *= COMPLEX_MULTIPLY_ADDS  # real multiply-adds of complex operands (see "Complex data and FFTs")
    if category == "attention" and flops:
        attrs = _causal_attrs(func, args, kwargs, flops)
    if "dense_experts" in attrs:
        attrs["routed_flops"] = flops * attrs["experts_per_token"] // attrs["dense_experts"]
    if key in _ATTRS:
        attrs = {**_ATTRS[key](args), **attrs}
        category = _conv_category(attrs)
    elif packet in _MATMULS and weight:
        category = "linear"
    if category == "linear":
        # [n, out] = x [n, in] @ w.t() [in, out]
        w = next((t for t in ins if t.dim() == 2 and storage_key(t) in weight_keys), None)
        if w is not None:
            attrs = {"in_features": int(w.shape[0]), "out_features": int(w.shape[1])}

    elem = 0
    if elem_formula is not None:
        elem = int(elem_formula(*_shapes(args), out_shape=_shapes(out), **_shapes(kwargs)))
    elif category in _ACTIVATION_FAMILY:
        elem = outs[0].numel() if outs else 0
    elif category in ("reduction", "host_sync"):
        elem = ins[0].numel() if ins else 0
    elif category == "pooling":
        window = _pool_window(func, args)
        elem = outs[0].numel() * window if window else ins[0].numel()

    counted = formula is not None or elem_formula is not None or category != "other"
    return OpCost(name, category, flops, elem, read, write, weight, counted, attrs)
