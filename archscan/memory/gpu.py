"""The GPU execution model of memory: a run counted as CUDA runs it on a named GPU, not as the CPU does.

Takes a GPU (``archscan.devices.gpus``: its compute capability decides the kernels); gives
``Execution`` (``cpu`` or a GPU), ``executing`` (the context every analysis below runs in: the
tracker's scratch registry, the attention kernels and the optimizer's default follow it),
``current`` and ``GpuKernels``.

Where a GPU run differs from the CPU's, as torch 2.11 runs it (read from the allocator's events
recorded on an H200, ``tests/gpu_truth``):

* **Attention.** ``F.scaled_dot_product_attention`` runs the backend torch's CUDA dispatcher picks
  (``attention_backend``: cuDNN first on sm90/sm100, then flash, memory-efficient, math, each with
  its constraints on dtype, head size, mask and dropout). A fused backend saves its output and a
  float32 log-sum-exp for the backward, never the S×S probabilities and dropout mask of the math
  path the CPU takes when training with dropout; its backward holds the workspace the kernel asks
  the caching allocator for (``scratch.py``'s GPU entries).
* **Dropout** in training keeps a one-byte mask (CUDA's fused ``native_dropout``), not a mask
  of the input's dtype (the CPU's).
* **Scratch.** No oneDNN reorders (the CPU's scratch registry): the GPU's own registry.
* **The optimizer.** torch's default implementation for CUDA tensors is foreach.
* **The allocator.** Blocks are rounded and segments reserved by the CUDA caching allocator
  (``allocator.py``); the CUDA libraries keep workspaces in it once used (``LIBRARY_BYTES``) and
  the CUDA context lives outside it (``CONTEXT_BYTES``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..devices.gpus import CUDA_TOTAL, GPU, SMS, gpu

aten = torch.ops.aten

# What the CUDA libraries keep in the caching allocator once used: cuBLAS's and cuBLASLt's
# workspaces (a float32 and a bf16 matmul, a convolution and its backward), 64.0 MiB on an H200
# with torch 2.11 (reports/memory-cuda-2026-11-26, `benchmarks/bench_memory_gpu.py measure`).
LIBRARY_BYTES = 64 << 20
# The CUDA context (the driver's and the kernels' images), outside the caching allocator: an
# estimate, not measured by archscan's runs (on the GPU: the device's used bytes by
# `torch.cuda.mem_get_info()` less `torch.cuda.memory_reserved()`, after a first kernel); CUDA
# 12-13 with lazily loaded kernels commonly takes 400-600 MiB.
CONTEXT_BYTES = 500 << 20


@dataclass(frozen=True)
class Execution:
    """Whose kernels run the analysis: the CPU's (``capability`` None), or a GPU's: its name,
    CUDA compute capability and memory."""

    name: str = "cpu"
    capability: tuple[int, int] | None = None
    memory_bytes: int | None = None
    sms: int | None = None  # streaming multiprocessors (how CUDA's reductions split their work)

    @property
    def is_gpu(self) -> bool:
        return self.capability is not None

    def to_json(self) -> dict:
        if not self.is_gpu:
            return {"name": "cpu", "kind": "cpu"}
        return {"name": self.name, "kind": "cuda", "capability": list(self.capability),
                "memory_bytes": self.memory_bytes, "sms": self.sms}


CPU = Execution()
_CURRENT: contextvars.ContextVar[Execution] = contextvars.ContextVar("archscan_execution", default=CPU)


def of_gpu(found: GPU) -> Execution:
    """A named GPU's execution model; the CPU's for one CUDA does not run (no compute capability)."""
    if found.capability is None:
        return CPU
    return Execution(found.name, found.capability, found.memory_bytes, SMS.get(found.name))


def execution_for(name: str | None) -> Execution:
    """The execution model of ``name``: 'cpu' (or None), a GPU of ``archscan.devices.gpus``
    ('h100', 'H200'), or 'cuda[:N]' (this machine's device). ValueError for any other name."""
    if name is None or name.strip().lower() in ("", "cpu"):
        return CPU
    if name.strip().lower().startswith("cuda"):  # this machine's CUDA device
        try:
            device = torch.device(name.strip().lower())
        except RuntimeError:
            raise ValueError(f"no device {name!r}") from None
        if not torch.cuda.is_available():
            raise ValueError("CUDA is not available on this machine")
        return of_device(device)
    found = gpu(name)
    if found is None:
        raise ValueError(f"no GPU named {name!r}")
    return of_gpu(found)


def of_device(device: torch.device) -> Execution:
    """The execution model of a real device: the CPU's, or the CUDA device's own (its name as the
    driver gives it, its capability and memory)."""
    if device.type != "cuda":
        return CPU
    props = torch.cuda.get_device_properties(device)
    return Execution(props.name, (props.major, props.minor), props.total_memory, props.multi_processor_count)


def current() -> Execution:
    """The execution model the analyses run under now (the CPU's unless ``executing`` says)."""
    return _CURRENT.get()


@contextlib.contextmanager
def executing(execution: Execution) -> Iterator[Execution]:
    """Run the analyses inside as ``execution`` runs them (see the module docstring)."""
    token = _CURRENT.set(execution)
    try:
        yield execution
    finally:
        _CURRENT.reset(token)


# --- attention ---------------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)


def attention_backend(capability: tuple[int, int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None, dropout: float, causal: bool, grad: bool) -> str:
    """The backend torch 2.11's CUDA dispatcher picks for scaled-dot-product attention
    (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, cuDNN 9.19 as the recorded H200
    ran it): 'cudnn', 'flash', 'efficient' or 'math'."""
    major, minor = capability
    d_qk, d_v = q.shape[-1], v.shape[-1]
    s_q, s_k = q.shape[-2], k.shape[-2]
    dims4 = q.dim() == 4 and k.dim() == 4 and v.dim() == 4
    gqa_ok = dims4 and k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
    stride1 = all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (q, k, v))
    order = ["cudnn", "flash", "efficient"] if major in (9, 10) else ["flash", "efficient"]
    for backend in order:
        if backend == "cudnn":
            limit = 128 if not (d_qk == 192 and d_v == 128) else 192
            if (q.dtype in _HALF and (8, 0) <= (major, minor) <= (12, 1) and dims4 and gqa_ok and stride1
                    and d_qk <= limit and d_v <= limit and d_qk % 8 == 0 and d_v % 8 == 0 and s_k != 1
                    and not (dropout > 0 and s_q == 1)):
                return "cudnn"
        elif backend == "flash":
            sm86_89 = (8, 6) <= (major, minor) <= (8, 9) or (12, 0) <= (major, minor) <= (12, 1)
            if (mask is None and q.dtype in _HALF and (8, 0) <= (major, minor) <= (12, 1) and dims4 and gqa_ok
                    and d_qk == k.shape[-1] == d_v and d_qk <= 256 and stride1
                    and not (causal and s_q != s_k)
                    and not (grad and sm86_89 and not (d_qk <= 192 or (dropout == 0 and d_qk > 224)))):
                return "flash"
        else:
            align = 8 if q.dtype in _HALF and major >= 7 else 4 if major >= 8 else 1
            dtypes = (torch.float16, torch.float32, torch.bfloat16) if major >= 8 else (torch.float16, torch.float32)
            if (q.dtype in dtypes and major >= 5 and d_qk == k.shape[-1] and d_qk % align == 0 and d_v % align == 0
                    and (not dims4 or gqa_ok)):
                return "efficient"
    return "math"


class GpuKernels:
    """The functions whose CUDA kernels differ from the CPU's in what they allocate and save, run
    as CUDA runs them on the fake tensors of the analysis:

    * ``F.scaled_dot_product_attention``: the fused backend's op (``attention_backend``), whose
      outputs are what it saves for the backward. Under autocast the inputs are cast first, as
      CUDA's autocast casts them (attention is on its lower-precision list).
    * ``F.dropout`` in training: the fused ``native_dropout``, which keeps a one-byte mask (the
      CPU's dropout multiplies by a mask of the input's dtype: four bytes in float32).

    Inside ``with GpuKernels(execution):`` both names of ``torch.nn.functional`` are replaced (code
    that looks them up, ``nn.Dropout`` and ``F.multi_head_attention_forward`` among it, calls these)
    and a torch-function mode catches the builtins called directly (``torch._C._nn``, ``torch.dropout``).
    """

    def __init__(self, execution: Execution):
        self.execution = execution
        self.backends: dict[str, int] = {}  # backend -> calls
        self._mode = _Builtins(self)
        self._saved: tuple = ()

    def __enter__(self) -> "GpuKernels":
        self._saved = (F.scaled_dot_product_attention, F.dropout)
        F.scaled_dot_product_attention, F.dropout = self.attention, self.dropout
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._mode.__exit__(*exc)
        finally:
            F.scaled_dot_product_attention, F.dropout = self._saved

    def dropout(self, input, p=0.5, training=True, inplace=False):
        """CUDA's dropout: ``native_dropout`` when it is fused (0 < p < 1, a non-empty input)."""
        with torch._C.DisableTorchFunction():
            if not (training and 0 < p < 1 and input.numel() > 0):
                return _DROPOUT(input, p, training, inplace)
            out = aten.native_dropout(input, p, True)[0]
            return input.copy_(out) if inplace else out

    def attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cpu"):
            low = torch.get_autocast_dtype("cpu")
            q, k, v = (t.to(low) if t.dtype == torch.float32 else t for t in (q, k, v))
            if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype == torch.float32:
                attn_mask = attn_mask.to(low)
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        backend = attention_backend(self.execution.capability, q, k, v, attn_mask, dropout_p, is_causal, grad)
        if q.dim() == 4 and q.shape[1] != k.shape[1] and not enable_gqa:
            backend = "math"  # heads that differ without enable_gqa: torch's own error, from its own path
        self.backends[backend] = self.backends.get(backend, 0) + 1
        with torch._C.DisableTorchFunction():
            if backend == "cudnn":
                return aten._scaled_dot_product_cudnn_attention(q, k, v, attn_mask, grad, dropout_p, is_causal, False,
                                                                scale=scale)[0]
            if backend == "flash":
                return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            if backend == "efficient":
                if q.dim() == 4 and q.shape[1] != k.shape[1]:  # grouped heads: keys and values repeated per head
                    k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
                return aten._scaled_dot_product_efficient_attention(q, k, v, attn_mask, grad, dropout_p, is_causal,
                                                                    scale=scale)[0]
            return aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                                                           enable_gqa=enable_gqa)[0]


_SDPA, _DROPOUT = F.scaled_dot_product_attention, F.dropout  # torch's own (the builtin; the Python function)


class _Builtins(TorchFunctionMode):
    """Attention and dropout called as torch's builtins, handed to ``GpuKernels``."""

    def __init__(self, kernels: GpuKernels):
        super().__init__()
        self.kernels = kernels

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            return self.kernels.attention(*args, **kwargs)
        if func is torch.dropout or func is _DROPOUT:
            return self.kernels.dropout(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def gpu_kernels() -> Iterator[GpuKernels | None]:
    """Inside: attention and dropout as the current GPU runs them (``GpuKernels``); nothing under
    the CPU's model."""
    execution = current()
    if not execution.is_gpu:
        yield None
        return
    with GpuKernels(execution) as kernels:
        yield kernels


def default_optimizer_impl() -> dict:
    """The optimizer arguments torch's default takes for the current execution: foreach on a
    GPU (``torch.optim.optimizer._default_to_fused_or_foreach`` for CUDA tensors), nothing on the
    CPU (its default, the for-loop, for CPU tensors)."""
    return {"foreach": True} if current().is_gpu else {}


# A budget's limit is replayed 2% short: where the GPU's fragmentation under the limit differs from
# the simulated one, the answer errs on the side that runs. Without it EfficientNet-B0's forward in
# 24 GiB came out at batch 1,704 where the H100 ran out of memory at 1,672 (tests/gpu_truth's
# held-out searches: docs/memory.md).
BUDGET_MARGIN = 0.02

_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("archscan_allocator_limit", default=None)


@contextlib.contextmanager
def limited(nbytes: int | None) -> Iterator[None]:
    """Inside: the simulated caching allocator may reserve at most ``nbytes`` (what
    ``torch.cuda.set_per_process_memory_fraction`` enforces); ``allocator_peaks`` says whether the
    run ran out of memory under it."""
    token = _LIMIT.set(nbytes)
    try:
        yield
    finally:
        _LIMIT.reset(token)


def allocator_peaks(log) -> dict:
    """What the CUDA caching allocator (``allocator.py``, simulated) holds over a tracked run: its
    allocated peak (blocks rounded, a large block handed out whole) and its reserved peak (the
    segments: what runs out of memory), the CUDA libraries' workspaces allocated first.
    ``log``: a ``MemoryTracker``'s (made, storage, ...) entries in order."""
    from .allocator import simulate

    events = [("alloc", "libraries", LIBRARY_BYTES)]
    events += [("alloc" if made else "free", record.serial, record.nbytes)
               for made, record, *_ in log if record.nbytes > 0]
    expandable = expandable_segments()
    stats = simulate(events, expandable_segments=expandable).stats
    out = {"allocated_peak_bytes": stats["allocated_bytes.all.peak"] - LIBRARY_BYTES,
           "reserved_peak_bytes": stats["reserved_bytes.all.peak"],
           "library_bytes": LIBRARY_BYTES, "segments_peak": stats["segment.all.peak"],
           "expandable_segments": expandable,
           "counts": "the CUDA caching allocator simulated on the run's allocations (torch 2.11's rules); the "
                     "reserved peak includes the CUDA libraries' workspaces (library_bytes), the allocated peak not"}
    limit = _LIMIT.get()
    if limit is not None:  # the allocator frees its cache and retries before it runs out: replayed under the limit
        out["limit_bytes"] = limit
        out["out_of_memory"] = simulate(_repeated(log), limit=int(limit * (1 - BUDGET_MARGIN)),
                                        expandable_segments=expandable).oom
    return out


def expandable_segments() -> bool:
    """Does this process ask the caching allocator for expandable segments, as torch reads it
    (``PYTORCH_CUDA_ALLOC_CONF`` or ``PYTORCH_ALLOC_CONF``: ``expandable_segments:True``)? The
    simulation follows the setting the user's training would run with."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for option in os.environ.get(name, "").split(","):
            key, _, value = option.partition(":")
            if key.strip() == "expandable_segments":
                return value.strip().lower() in ("true", "1")
    return False


def _repeated(log) -> list[tuple]:
    """The run as a program that repeats it meets it: the libraries' workspaces, what existed
    before (the weights, the inputs), the run once (a training step's first, before its optimizer
    state exists), the optimizer state, then the run again into the segments the first one left
    cached. Where a batch runs out of memory under a limit depends on those segments."""
    first = next((i for i, (made, record, _, phase) in enumerate(log) if phase != "before"), len(log))
    resident = [("alloc" if made else "free", r.serial, r.nbytes) for made, r, *_ in log[:first]
                if r.nbytes > 0 and r.category != "optimizer_state"]
    state = [("alloc" if made else "free", r.serial, r.nbytes) for made, r, *_ in log[:first]
             if r.nbytes > 0 and r.category == "optimizer_state"]
    run = [("alloc" if made else "free", r.serial, r.nbytes) for made, r, *_ in log[first:] if r.nbytes > 0]
    made = {key for op, key, _ in run if op == "alloc"}
    once = [(op, ("first", key), n) for op, key, n in run if key in made]
    return [("alloc", "libraries", LIBRARY_BYTES), *resident, *once, *state, *run]


def usable_bytes(execution: Execution) -> int | None:
    """What the caching allocator can reserve on the whole GPU: the memory CUDA reports
    (``CUDA_TOTAL`` where read on the GPU, else the datasheet's) less the CUDA context."""
    if not execution.is_gpu or execution.memory_bytes is None:
        return None
    return CUDA_TOTAL.get(execution.name, execution.memory_bytes) - CONTEXT_BYTES
