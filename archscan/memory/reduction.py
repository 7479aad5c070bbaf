"""The scratch a CUDA reduction kernel takes from the caching allocator: torch 2.11's
``setReduceConfig`` ported to integer arithmetic.

Takes a reduction's input (shape and strides in elements, storage offset), its reduced dims, the
input and result dtypes, the op (``sum``, ``mean``, ``amax``... see ``OPS``) and the GPU (its
``multiProcessorCount`` and maximum resident threads per SM, ``threads_per_sm``). Gives the
``ReduceConfig`` the kernel launches with and the bytes ``gpu_reduce_kernel`` asks the caching
allocator for besides the result: a staging buffer (``global_memory_size()``) and one semaphore per
column of output blocks (``semaphore_size()``), both only when each output is split across several
CTAs (``should_global_reduce()``); and, for a reduction too large for 32-bit indexing that runs in
pieces, the accumulation buffer it keeps across them when its result cannot hold partial results.

Sources (pytorch/pytorch, torch 2.11): aten/src/ATen/native/cuda/Reduce.cuh (``ReduceConfig``,
``setReduceConfig``, ``get_output_vec_size``, ``gpu_reduce_kernel``); aten/src/ATen/TensorIterator.cpp
(``reorder_dimensions``, ``coalesce_dimensions``, ``num_reduce_dims``, ``num_output_elements``,
``can_use_32bit_indexing``, ``get_dim_to_split``, ``split``); aten/src/ATen/native/ReduceOpsUtils.h
(the result is contiguous, viewed with stride 0 in the reduced dims; a half or bfloat16 input with
a float result is read as is); the ops' kernels in ReduceSumProdKernel.cu, ReduceMomentKernel.cu,
ReduceMaxValuesKernel.cu, ReduceMinValuesKernel.cu, ReduceLogicKernel.cu (their accumulator
``arg_t``, ``vt0`` and ``input_vec_size``).

Units: bytes. The caching allocator hands out blocks of a multiple of 512 bytes (``round_block``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

INT32_MAX = (1 << 31) - 1
MAX_THREADS_PER_SM = 2048      # maxThreadsPerMultiProcessor of compute capability 7.0, 8.0, 9.0, 10.0
BLOCK = 512                    # kMinBlockSize of the caching allocator
_MIN_VALUES_PER_THREAD = 16    # CUDA (ROCm: 128)
_MAX_VALUES_PER_THREAD = 256
_WARP = 32

_LOWP = (torch.float16, torch.bfloat16)


def _opmath_bytes(scalar: torch.dtype) -> int:
    """sizeof(opmath_type<scalar_t>): half and bfloat16 accumulate in float, complex32 in complex64."""
    if scalar in _LOWP:
        return 4
    return 8 if scalar == torch.complex32 else scalar.itemsize


def _welford_bytes(scalar: torch.dtype) -> int:
    """sizeof(WelfordData<acc_type<scalar_t, true>, int32_t>): mean, m2, n (int32), nf."""
    return 16 if _opmath_bytes(scalar) == 4 else 32     # double: 8 + 8 + 4 (+4 padding) + 8


@dataclass(frozen=True)
class Kernel:
    """What an op's CUDA kernel instantiates ``gpu_reduce_kernel`` with."""
    arg_bytes: Callable[[torch.dtype], int]   # scalar_t -> sizeof(arg_t), what each staging slot holds
    vt0: int = 4               # values each thread loads per step
    vec16: bool = False        # 16-bit inputs load 8 per vector (input_vec_size=8), else vt0; this
                               # shapes the block but never decides whether outputs split across CTAs
    read_lowp: bool = True     # a half/bfloat16 input with a float result is read without a cast
    read_input: bool = False   # the kernel reads the input's own dtype (all, any)
    arg_to_out: bool = True    # arg_t converts to the result type (not WelfordData)


# op -> its kernel; an op not here raises (never a silent zero).
OPS: dict[str, Kernel] = {
    "sum": Kernel(_opmath_bytes, vec16=True),                 # sum_functor
    "mean": Kernel(_opmath_bytes, vec16=True),                # mean_kernel_impl, MeanOps
    "nansum": Kernel(_opmath_bytes),                          # nansum_functor, NanSumOps
    "prod": Kernel(_opmath_bytes),                            # prod_functor (jitted)
    "amax": Kernel(lambda s: s.itemsize, read_lowp=False),    # max_values_kernel_cuda_impl
    "amin": Kernel(lambda s: s.itemsize, read_lowp=False),    # min_values_kernel_cuda_impl
    "var": Kernel(_welford_bytes, vt0=2, arg_to_out=False),   # std_var_kernel_impl, WelfordOps
    "std": Kernel(_welford_bytes, vt0=2, arg_to_out=False),
    "all": Kernel(lambda s: 1, read_input=True),              # and_kernel_cuda: arg_t bool
    "any": Kernel(lambda s: 1, read_input=True),              # or_kernel_cuda
}


# maxThreadsPerMultiProcessor where it is not 2048 (CUDA C++ Programming Guide, compute capabilities)
_THREADS_PER_SM = {(7, 5): 1024, (8, 6): 1536, (8, 9): 1536, (12, 0): 1536}


def threads_per_sm(capability: tuple[int, int] | None) -> int:
    """Maximum resident threads per SM of a compute capability (2048 where unknown)."""
    return _THREADS_PER_SM.get(capability, MAX_THREADS_PER_SM) if capability else MAX_THREADS_PER_SM


def round_block(nbytes: int) -> int:
    """The block the caching allocator hands out for a request (0 for none): a multiple of 512."""
    return 0 if nbytes <= 0 else -(-nbytes // BLOCK) * BLOCK


def _div_up(a: int, b: int) -> int:
    return -(-a // b)


def _last_pow2(n: int) -> int:
    """The largest power of two not above n (1 for n < 1): ``last_pow2``."""
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


@dataclass(frozen=True)
class ReduceIter:
    """A reduction TensorIterator after ``reorder_dimensions`` and ``coalesce_dimensions``: reduced
    dims first, dim 0 the fastest; strides in bytes, operand 0 the result, operand 1 the input."""
    shape: list[int]
    out: list[int]
    inp: list[int]
    in_offset: int = 0         # bytes from the input's (512-aligned) allocation to its first element

    def num_reduce_dims(self) -> int:
        return sum(1 for s in self.out if s == 0)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def num_output_elements(self) -> int:
        n = 1
        for size, s in zip(self.shape, self.out):
            if s != 0 or size == 1:
                n *= size
        return n

    def can_use_32bit_indexing(self) -> bool:
        if self.numel() > INT32_MAX:
            return False
        return all(1 + sum((n - 1) * s for n, s in zip(self.shape, strides)) <= INT32_MAX
                   for strides in (self.out, self.inp))

    def split(self) -> tuple[ReduceIter, ReduceIter]:
        """The two halves ``SplitUntil32Bit`` makes: the dim of largest extent, cut in two."""
        best, dim = -1, -1
        for d in range(len(self.shape) - 1, -1, -1):
            if self.shape[d] == 0:
                continue
            for strides in (self.out, self.inp):
                extent = (self.shape[d] - 1) * abs(strides[d])
                if extent > best:
                    best, dim = extent, d
        first = self.shape[dim] // 2
        head = ReduceIter(self.shape[:dim] + [first] + self.shape[dim + 1:], self.out, self.inp, self.in_offset)
        tail = ReduceIter(self.shape[:dim] + [self.shape[dim] - first] + self.shape[dim + 1:], self.out, self.inp,
                          self.in_offset + first * self.inp[dim])
        return head, tail


def _contiguous(shape) -> list[int]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return strides[::-1]


def _dense(shape, strides) -> bool:
    """``is_non_overlapping_and_dense``: the elements fill a block of memory without gaps."""
    expected = 1
    for n, s in sorted(((n, s) for n, s in zip(shape, strides) if n != 1), key=lambda p: p[1]):
        if s != expected:
            return False
        expected *= n
    return True


def reduction_iterator(shape, strides, dims, in_bytes: int, out_bytes: int, *, keepdim: bool = False,
                       storage_offset: int = 0) -> ReduceIter:
    """The TensorIterator ``TensorIterator::reduce_op(result, input)`` builds (dims empty: all)."""
    ndim = len(shape)
    reduced = {d % ndim for d in dims} if dims and ndim else set(range(ndim))
    out_shape = [1 if d in reduced else n for d, n in enumerate(shape)]
    out = [s * out_bytes for s in _contiguous(out_shape)]
    for d in reduced:
        if shape[d] != 1 or not keepdim:   # review_reduce_result / compute_strides give stride 0
            out[d] = 0
    inp = [s * in_bytes for s in strides]

    def should_swap(d0: int, d1: int) -> int:
        for strides_, is_output in ((out, True), (inp, False)):
            s0, s1 = strides_[d0], strides_[d1]
            if is_output and (s0 == 0) != (s1 == 0):
                return 1 if s1 == 0 else -1        # reduced dims to the front
            if s0 == 0 or s1 == 0:
                continue
            if s0 != s1:
                return -1 if s0 < s1 else 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(ndim))[::-1]
    for i in range(1, ndim):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            c = should_swap(perm[dim0], perm[dim1])
            if c > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif c < 0:
                break
    it_shape = [shape[p] for p in perm]
    ops = [[out[p] for p in perm], [inp[p] for p in perm]]

    # coalesce: adjacent dims merge when either has size 1 or every operand steps across both evenly
    if ndim > 1:
        prev = 0
        for d in range(1, ndim):
            n0, n1 = it_shape[prev], it_shape[d]
            if n0 == 1 or n1 == 1 or all(n0 * s[prev] == s[d] for s in ops):
                if n0 == 1:
                    for s in ops:
                        s[prev] = s[d]
                it_shape[prev] *= n1
            else:
                prev += 1
                if prev != d:
                    for s in ops:
                        s[prev] = s[d]
                    it_shape[prev] = it_shape[d]
        it_shape = it_shape[:prev + 1]
        ops = [s[:prev + 1] for s in ops]
    return ReduceIter(it_shape, ops[0], ops[1], storage_offset * in_bytes)


@dataclass(frozen=True)
class ReduceConfig:
    """The launch ``setReduceConfig`` chooses for one 32-bit-indexable piece of a reduction."""
    element_size_bytes: int    # sizeof(arg_t)
    num_outputs: int
    num_inputs: int            # inputs per output
    block_width: int
    block_height: int
    vectorize_input: bool
    output_vec_size: int
    step_input: int
    step_output: int
    ctas_per_output: int
    input_mult: tuple[int, int, int]
    output_mult: tuple[int, int]

    @property
    def num_threads(self) -> int:
        return self.block_width * self.block_height

    def grid(self) -> tuple[int, int]:
        return _div_up(self.num_outputs // self.output_vec_size, self.step_output), self.ctas_per_output

    def should_global_reduce(self) -> bool:
        return self.input_mult[2] != 0

    def global_memory_size(self) -> int:
        """Bytes of the staging buffer: one accumulator per output, CTA (and lane, when lanes hold
        different outputs)."""
        if not self.should_global_reduce():
            return 0
        size = self.element_size_bytes * self.num_outputs * self.ctas_per_output
        if self.input_mult[0] == 0:        # not block-x-reducing
            size *= self.block_width * self.output_vec_size
        return size

    def semaphore_size(self) -> int:
        """Bytes of the semaphores: one int per column of output blocks."""
        return 4 * self.grid()[0] if self.should_global_reduce() else 0


def _output_vec_size(it: ReduceIter, scalar_bytes: int) -> int:
    """``get_output_vec_size``: 4, halved until it divides the input's address (in elements), the
    first output dim and every other input stride."""
    vec = 4
    output_index = it.num_reduce_dims()
    values = [it.in_offset // scalar_bytes, it.shape[output_index]]
    values += [s // scalar_bytes for j, s in enumerate(it.inp) if j != output_index]
    for n in values:
        while n % vec:
            vec //= 2
    return vec


def _config(it: ReduceIter, arg_bytes: int, scalar_bytes: int, input_vec_size: int, sms: int,
            max_threads_per_sm: int, max_num_threads: int = 512) -> ReduceConfig:
    """``setReduceConfig`` on one piece."""
    num_outputs = it.num_output_elements()
    num_inputs = it.numel() // num_outputs
    ndim, nred = len(it.shape), it.num_reduce_dims()
    if ndim > 0:
        on_fastest = nred == ndim or it.inp[0] < it.inp[nred]
        if on_fastest:     # block.x along the reduced dim: lanes reduce together
            dim0, dim1, fastest_stride = num_inputs, num_outputs, it.inp[0]
        else:              # block.x along the fastest output dim: lanes hold different outputs
            dim0, dim1, fastest_stride = num_outputs, num_inputs, it.inp[nred]
    else:
        on_fastest, fastest_stride, dim0, dim1 = True, scalar_bytes, 1, 1

    vectorize_input, output_vec_size = False, 1
    if fastest_stride == scalar_bytes:
        if on_fastest and dim0 >= 128 and nred == 1:
            vectorize_input = True
            dim0 //= input_vec_size
        elif not on_fastest:
            output_vec_size = _output_vec_size(it, scalar_bytes)
            dim0 //= output_vec_size

    # set_block_dimension
    threads = max_num_threads // output_vec_size
    dim0_pow2 = _last_pow2(dim0) if dim0 < threads else threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < threads else threads
    width = min(dim0_pow2, _WARP)
    height = min(dim1_pow2, threads // width)
    width = min(dim0_pow2, threads // height)

    step_input, step_output = 1, 1
    input_mult, output_mult = [0, 0, 0], [0, 0]
    if ndim == 0 or on_fastest:
        input_mult[0], step_input = step_input, step_input * width
    else:
        output_mult[0], step_output = step_output, step_output * width

    if _div_up(num_inputs, step_input) >= min(height * 16, _MAX_VALUES_PER_THREAD):
        input_mult[1], step_input = step_input, step_input * height        # split across warps
    else:
        output_mult[1], step_output = step_output, step_output * height

    target_grid = sms * (max_threads_per_sm // (width * height))
    grid_x = _div_up(num_outputs // output_vec_size, step_output)
    values_per_thread = _div_up(num_inputs, step_input)
    ctas = 1
    if input_mult[1] != 0 and values_per_thread >= _MAX_VALUES_PER_THREAD and grid_x <= target_grid:
        # split each output across CTAs until the SMs are busy, keeping 16..256 values per thread
        ctas = max(min(_div_up(target_grid, grid_x), _div_up(values_per_thread, _MIN_VALUES_PER_THREAD)),
                   _div_up(values_per_thread, _MAX_VALUES_PER_THREAD))
        if ctas > 1:
            input_mult[2], step_input = step_input, step_input * ctas
    return ReduceConfig(arg_bytes, num_outputs, num_inputs, width, height, vectorize_input, output_vec_size,
                        step_input, step_output, ctas, tuple(input_mult), tuple(output_mult))


def _kernel_dtypes(op: str, in_dtype: torch.dtype, out_dtype: torch.dtype) -> tuple[Kernel, torch.dtype]:
    """The op's kernel and the dtype it reads (scalar_t)."""
    try:
        kernel = OPS[op]
    except KeyError:
        raise ValueError(f"no CUDA reduction config for {op!r}: known {sorted(OPS)}") from None
    if kernel.read_input or (kernel.read_lowp and in_dtype in _LOWP and out_dtype == torch.float32):
        return kernel, in_dtype
    return kernel, out_dtype


def _pieces(shape, strides, dims, in_dtype, out_dtype, op, keepdim, storage_offset):
    """The op's kernel, the dtype it reads, the whole iterator and its 32-bit-indexable pieces."""
    kernel, scalar = _kernel_dtypes(op, in_dtype, out_dtype)
    if scalar != in_dtype:      # read after ``self.to(scalar)``, which keeps a dense input's strides
        strides = strides if _dense(shape, strides) else _contiguous(shape)
        storage_offset = 0
    it = reduction_iterator(shape, strides, dims, scalar.itemsize, out_dtype.itemsize, keepdim=keepdim,
                            storage_offset=storage_offset)
    pieces, todo = [], [it] if it.numel() else []
    while todo:
        piece = todo.pop()
        if piece.can_use_32bit_indexing():
            pieces.append(piece)
        else:
            todo.extend(piece.split())
    return kernel, scalar, it, pieces


def reduce_configs(shape, strides, dims, in_dtype: torch.dtype, out_dtype: torch.dtype, sms: int, *,
                   op: str = "sum", max_threads_per_sm: int = MAX_THREADS_PER_SM, keepdim: bool = False,
                   storage_offset: int = 0) -> list[ReduceConfig]:
    """The launch config of each kernel the reduction runs: one, or one per 32-bit-indexable piece
    of an input or result over 2 GiB. ``dims`` empty reduces every dim; strides in elements."""
    kernel, scalar, _, pieces = _pieces(shape, strides, dims, in_dtype, out_dtype, op, keepdim, storage_offset)
    input_vec = 8 if kernel.vec16 and scalar.itemsize == 2 else kernel.vt0
    return [_config(p, kernel.arg_bytes(scalar), scalar.itemsize, input_vec, sms, max_threads_per_sm)
            for p in pieces]


def reduction_buffers(shape, strides, dims, in_dtype: torch.dtype, out_dtype: torch.dtype, sms: int,
                      **kwargs) -> tuple[int, int]:
    """Bytes ``gpu_reduce_kernel`` requests for (staging, semaphores), 0 and 0 when one CTA reduces
    each output; of the piece that needs most where the reduction runs in pieces."""
    pairs = [(c.global_memory_size(), c.semaphore_size())
             for c in reduce_configs(shape, strides, dims, in_dtype, out_dtype, sms, **kwargs)]
    return max(pairs, key=lambda p: round_block(p[0]) + round_block(p[1]), default=(0, 0))


def accumulation_bytes(shape, strides, dims, in_dtype: torch.dtype, out_dtype: torch.dtype, *,
                       op: str = "sum", keepdim: bool = False) -> int:
    """Bytes of the ``AccumulationBuffer`` a reduction that runs in pieces keeps across them when
    its result cannot hold partial sums (half into half, bfloat16 into bfloat16, var and std): one
    arg_t per output element; 0 otherwise."""
    kernel, scalar, it, _ = _pieces(shape, strides, dims, in_dtype, out_dtype, op, keepdim, 0)
    lowp_pair = scalar == out_dtype and out_dtype in _LOWP
    if it.can_use_32bit_indexing() or kernel.arg_to_out and not lowp_pair:
        return 0
    extent = max([out_dtype.itemsize] + [n * s for n, s in zip(it.shape, it.out)])
    return extent // out_dtype.itemsize * kernel.arg_bytes(scalar)


def reduction_scratch(shape, strides, dims, in_dtype: torch.dtype, out_dtype: torch.dtype, sms: int, *,
                      op: str = "sum", max_threads_per_sm: int = MAX_THREADS_PER_SM, keepdim: bool = False,
                      storage_offset: int = 0) -> int:
    """Bytes a CUDA reduction holds from the caching allocator besides its result: staging plus
    semaphores, each rounded up to a 512-byte block (0 when one CTA reduces each output), plus the
    accumulation buffer of a reduction that runs in 32-bit pieces."""
    configs = reduce_configs(shape, strides, dims, in_dtype, out_dtype, sms, op=op,
                             max_threads_per_sm=max_threads_per_sm, keepdim=keepdim,
                             storage_offset=storage_offset)
    per_piece = max((round_block(c.global_memory_size()) + round_block(c.semaphore_size()) for c in configs),
                    default=0)
    return per_piece + round_block(accumulation_bytes(shape, strides, dims, in_dtype, out_dtype, op=op,
                                                      keepdim=keepdim))
