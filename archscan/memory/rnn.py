"""The bytes of the CPU's LSTM kernel (``aten.mkldnn_rnn_layer`` and its backward: one layer, one
direction, as ``nn.LSTM`` calls it), from shapes alone.

The kernel is oneDNN's (v3.12, bundled with torch 2.13), driven through ideep. Read from its
sources (``rnn_utils`` set_offsets and get_good_ld, the reference and brgemm implementations,
``memory_tracking``) and checked to the byte against the CPU allocator's events on 44 shapes at 1,
2 and 4 threads (``tests/test_memory.py``):

* **The workspace** (the forward's fourth result, saved for the backward; made only in grad mode,
  whatever the ``train`` argument says): gates, the cell's outputs and five state buffers, each
  starting on a 4,096-byte page. Fake tensors give it no bytes at all (torch's meta kernel returns
  an empty one), so ``workspace_bytes`` stands for it.
* **The forward's scratch**: the two biases summed, the weights reordered to oneDNN's layout
  (padded for the reference kernel that trains; 16- or 32-wide blocks for the brgemm kernel that
  infers) and the primitive's scratchpad (each booking its size plus 128 bytes).
* **The backward's scratch**: the weights reordered where their rows are not already padded, the
  zeroed padded weight gradients, the scratchpad, and copies of gradients that come in missing or
  not contiguous.

On AVX2, float32: AVX-512 CPUs block the brgemm kernel's weights otherwise (``modelled`` says no
and the op is named as not modelled).

``T`` time steps, ``N`` sequences, ``I`` input size, ``H`` hidden size; float32.
"""

from __future__ import annotations

import functools
import re

import torch

PAGE = 4096
FLOAT = 4
POINTER = 8
BATCH_ELEMENT = 40   # oneDNN's brgemm batch element (bytes), per k block and thread
BOOKING_ALIGN = 128  # what each scratchpad booking costs beyond its size, at least
LSTM = 2             # ``mode`` of ``aten.mkldnn_rnn_layer``


def _up(a: int, b: int) -> int:
    return -(-a // b) * b


def good_ld(dim: int) -> int:
    """oneDNN's leading dimension for ``dim`` floats: up to a multiple of 16, and 16 more where that
    is a multiple of 256 (4K aliasing)."""
    ld = _up(dim, 16)
    return ld + 16 if ld % 256 == 0 else ld


def _pages(parts: list[int]) -> int:
    """Parts laid out each on a new page, the total rounded up to a page."""
    end = 0
    for part in parts:
        end = _up(end, PAGE) + part
    return _up(end, PAGE)


def _workspace_parts(T: int, N: int, I: int, H: int, training: bool) -> list[int]:
    states, ld = 2 * (T + 1) * N, good_ld(max(I, H))
    return [T * N * good_ld(4 * H) * FLOAT if training else 0,  # gates
            T * N * good_ld(H) * FLOAT if training else 0,      # the cell's outputs
            states * ld * FLOAT,                                # h states (layer and iteration)
            states * H * FLOAT,                                 # c states
            states * ld * FLOAT if training else 0,             # their gradients: layer, iteration, c
            states * ld * FLOAT if training else 0,
            states * H * FLOAT if training else 0]


def workspace_bytes(T: int, N: int, I: int, H: int) -> int:
    """The workspace the forward makes in grad mode (and the backward reads)."""
    return _pages(_workspace_parts(T, N, I, H, True))


def _bookings(*sizes: tuple[int, int]) -> int:
    """A scratchpad's bytes: each non-empty booking its size plus its alignment (128 at least), with
    the weight and bias pointer tables every RNN books."""
    common = [(POINTER, 8)] * 3 + [(4 * POINTER, 8)]
    return sum(size + max(align, BOOKING_ALIGN) for size, align in [*sizes, *common] if size > 0)


def _padded_weight(K: int, H: int) -> int:
    """A [K, 4H] weight in oneDNN's ldigo layout with padded rows (a dim of one has no stride)."""
    return (K * good_ld(4 * H) if K > 1 else 4 * H) * FLOAT


def forward_scratch(T: int, N: int, I: int, H: int, grad: bool, threads: int) -> int:
    """The forward's peak beyond its results: the summed biases, the reordered weights and the
    scratchpad. In grad mode the reference kernel runs (weights padded; a dim of one needs no
    reorder); without, the brgemm kernel (weights blocked by 16, by 32 for one sequence; the states
    in the scratchpad, not a workspace)."""
    bias = 4 * H * FLOAT
    if grad:
        weights = (_padded_weight(I, H) if I > 1 else 0) + (_padded_weight(H, H) if H > 1 else 0)
        rows = T if N < 128 else 1  # the layer's GEMM merged over time for fewer than 128 sequences
        pad = _pages([rows * N * good_ld(4 * H) * FLOAT, N * good_ld(H) * FLOAT, N * good_ld(H) * FLOAT])
        return bias + weights + _bookings((pad, PAGE))
    block = 32 if N == 1 else 16
    weights = (I + H) * 4 * _up(H, block) * FLOAT
    merged = N == 1 and T >= 2
    pad = _pages(_workspace_parts(T, N, I, H, False)
                 + [(T if merged else 1) * N * good_ld(4 * H) * FLOAT, N * good_ld(H) * FLOAT])
    k_blocks = 2 * (2 if I == H and not merged else 1)
    return bias + weights + _bookings((pad, PAGE), (k_blocks * threads * BATCH_ELEMENT, 8))


def backward_scratch(T: int, N: int, I: int, H: int, copies: int) -> int:
    """The backward's peak beyond its seven results: weights reordered where their rows are not
    padded already, zeroed padded weight gradients and a bias gradient, the scratchpad, and
    ``copies`` bytes of gradients copied (missing or not contiguous) or states cloned."""
    reorders = (4 * H * good_ld(I) * FLOAT if good_ld(I) != I else 0) + (4 * H * good_ld(H) * FLOAT if good_ld(H) != H else 0)
    gradients = _padded_weight(I, H) + _padded_weight(H, H) + 4 * H * FLOAT
    pad = _pages([T * N * good_ld(4 * H) * FLOAT, N * good_ld(H) * FLOAT, N * good_ld(H) * FLOAT])
    return copies + reorders + gradients + _bookings((pad, PAGE))


@functools.cache
def onednn_3() -> bool:
    """Is torch built with oneDNN 3 (whose RNN layout the formulas read; torch's build config says)?"""
    found = re.search(r"MKL-DNN v(\d+)\.", torch.__config__.show())
    return found is not None and found.group(1) == "3"


def modelled(x: torch.Tensor, mode: int, has_biases: bool, batch_sizes) -> bool:
    """Is this call one the formulas cover: an LSTM of float32 with biases on the CPU, not a packed
    sequence, with oneDNN 3? (The caller checks the CPU blocks as AVX2's does: ``scratch.onednn_block``.)"""
    return (isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 3
            and mode == LSTM and has_biases and not batch_sizes and onednn_3())


def sizes(x: torch.Tensor, w_ih: torch.Tensor) -> tuple[int, int, int, int]:
    """(T, N, I, H) of a call: torch hands the kernel its input as [T, N, I] whatever ``batch_first``
    says (it transposes a batch-first input first)."""
    T, N, I = x.shape
    return int(T), int(N), int(I), int(w_ih.shape[0]) // 4


__all__ = ["backward_scratch", "forward_scratch", "good_ld", "modelled", "sizes", "workspace_bytes"]
