"""The schemes ``--quant`` names, the torchao config that applies each on a device, and the layout
that device stores.

    int8      int8 weights, one scale per output row; activations as they are (weight-only)
    w8a8      int8 weights and int8 activations quantized per row as each batch arrives (dynamic)
    fp8       float8 (e4m3) weights, one scale per output row (weight-only)
    int4:gN   int4 weights, a scale and a zero point per group of N inputs (weight-only; N: 32, 64,
              128 or 256, default 128)

torchao (an optional extra: ``pip install 'archscan[quant]'``) is imported only here and only when
quantization is asked for. Its configs quantize ``nn.Linear`` layers only.

The layouts differ by device, and archscan reports the one that runs there. On the CPU, int4 is
``IntxWeightOnlyConfig``'s: one int8 per weight (the low four bits used) plus the group scales
and zero points, about 8.75 bits per weight at group 32, more than int8. On a CUDA GPU it is
``Int4WeightOnlyConfig``'s ``Int4Tensor`` (mslk's kernel): two weights per byte, and per group a
scale and a zero point in the model's dtype. int8, w8a8 and fp8 store the same layout on both.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from dataclasses import dataclass

from ..errors import ArchscanError

INSTALL = "pip install 'archscan[quant]' (torchao)"

SCHEMES = {
    "int8": "int8 weights, a scale per output row; activations unchanged (weight-only)",
    "w8a8": "int8 weights and int8 activations quantized per row at run time (dynamic)",
    "fp8": "float8 e4m3 weights, a scale per output row (weight-only)",
    "int4": "int4 weights, a scale and zero point per group of inputs (weight-only; int4:g32 ... int4:g256)",
}
GROUPS = (32, 64, 128, 256)
KV_SCHEMES = {"int8": 1, "fp8": 1}  # --kv: the bytes one cached element takes


@dataclass(frozen=True)
class Scheme:
    """One quantization scheme: ``name`` (a key of ``SCHEMES``), and for int4 its group size."""

    name: str
    group: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name}:g{self.group}" if self.group else self.name

    @property
    def weight_only(self) -> bool:
        return self.name != "w8a8"

    @property
    def compute_dtype(self) -> str | None:
        """The dtype the GEMM computes in when it is not the activations' (w8a8: int8 tensor cores)."""
        return "int8" if self.name == "w8a8" else None


def parse_scheme(text: str) -> Scheme:
    """``'int8'``, ``'w8a8'``, ``'fp8'``, ``'int4'`` or ``'int4:g32'``; one clear line for anything else."""
    raw = str(text).strip().lower()
    m = re.fullmatch(r"(int4)(?::g(\d+))?|(int8|w8a8|fp8)", raw)
    if m is None:
        names = ", ".join(["int8", "w8a8", "fp8", "int4[:gN]"])
        raise ArchscanError(f"unknown quantization scheme {text!r}", hint=f"use one of {names}")
    if m.group(3):
        return Scheme(m.group(3))
    group = int(m.group(2)) if m.group(2) else 128
    if group not in GROUPS:
        raise ArchscanError(f"int4 group size {group} is not one torchao's int4 kernels take",
                            hint="use " + ", ".join(f"int4:g{g}" for g in GROUPS))
    return Scheme("int4", group)


def parse_kv(text: str) -> str:
    raw = str(text).strip().lower()
    if raw not in KV_SCHEMES:
        raise ArchscanError(f"unknown KV-cache scheme {text!r}", hint="use --kv int8 or --kv fp8")
    return raw


def torchao():
    """The torchao package, imported quietly (it logs the CUDA extensions it cannot load on a CPU
    machine); one line saying what to install when it is missing."""
    try:
        with _quiet_import():
            import torchao as ao
            import torchao.quantization  # noqa: F401  (the configs)
    except ImportError as exc:
        raise ArchscanError(f"quantization needs torchao, which is not installed ({exc.name or exc})",
                            hint=INSTALL) from None
    return ao


@contextlib.contextmanager
def _quiet_import():
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]  # the second: an
    levels = [logger.level for logger in loggers]  # enum torchao registers that torch now handles itself
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


INT4_ON_CPU = ("int4 here is torchao's CPU layout (IntxUnpackedToInt8Tensor: a byte per weight beside the group "
               "scales and zero points, more bytes than int8); the packed 4-bit layout (Int4WeightOnlyConfig) needs a "
               "CUDA GPU and torchao's mslk kernels: --quant int4 --device-profile h100 analyses it")


def layout_of(scheme: Scheme, gpu: bool) -> str:
    """The torchao tensor that stores ``scheme`` on the device in question."""
    if scheme.name == "int4":
        return "Int4Tensor (packed, mslk)" if gpu else "IntxUnpackedToInt8Tensor"
    return "Float8Tensor" if scheme.name == "fp8" else "Int8Tensor"


def config(scheme: Scheme, gpu: bool = False):
    """torchao's config for ``scheme`` in the layout of a CUDA GPU (``gpu``) or of the CPU."""
    torchao()
    import torch
    from torchao.quantization import (Float8WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig)

    if scheme.name == "int8":
        return Int8WeightOnlyConfig()
    if scheme.name == "w8a8":
        return Int8DynamicActivationInt8WeightConfig()
    if scheme.name == "fp8":
        return Float8WeightOnlyConfig()
    if gpu:
        from torchao.quantization import Int4WeightOnlyConfig

        return Int4WeightOnlyConfig(group_size=scheme.group)
    from torchao.quantization import IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerGroup

    return IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(scheme.group))


def cannot_use(scheme: Scheme, in_features: int, out_features: int, gpu: bool) -> str | None:
    """Why a layer's channel counts cannot take ``scheme``'s kernel, or None.

    w8a8's ``torch._int_mm`` takes inner and outer sizes that are multiples of 8; int4 quantizes
    whole groups of inputs, and the GPU's int4 kernel takes outputs in multiples of 8. int8 and fp8
    weight-only dequantize into the activations' GEMM, which takes any size."""
    k, n = in_features, out_features
    if scheme.name == "w8a8" and (k % 8 or n % 8):
        return f"{k} inputs × {n} outputs: torch._int_mm takes multiples of 8"
    if scheme.name == "int4" and k % scheme.group:
        return f"{k} inputs are not whole groups of {scheme.group}"
    if scheme.name == "int4" and gpu and n % 8:
        return f"{n} outputs: the int4 kernel takes multiples of 8"
    return None


def int8_bytes(out_features: int, in_features: int) -> dict:
    """The bytes of ``Int8Tensor`` (int8 and w8a8, on the CPU and a GPU) for an [out, in] weight, from
    its shapes: ``qdata`` [out, in] int8, a float32 ``scale`` and an int8 ``zero_point`` per row,
    whatever the model's dtype (``tests/test_quant.py`` checks it against torchao's own)."""
    return {"qdata": out_features * in_features, "scale": 4 * out_features, "zero_point": out_features}


def gpu_int4_bytes(out_features: int, in_features: int, group: int, scale_bytes: int) -> dict:
    """The bytes of ``Int4Tensor`` (torchao's CUDA int4 layout) for an [out, in] weight, from its
    shapes: ``qdata`` [out, in/2] uint8 (two weights a byte), ``scale`` and ``zero_point``
    [in/group, out] in the model's dtype (torchao/quantization/quantize_/workflows/int4/int4_tensor.py)."""
    groups = -(-in_features // group) * out_features
    return {"qdata": out_features * (-(-in_features // 2)), "scale": groups * scale_bytes,
            "zero_point": groups * scale_bytes}


__all__ = ["GROUPS", "INSTALL", "INT4_ON_CPU", "KV_SCHEMES", "SCHEMES", "Scheme", "cannot_use", "config", "gpu_int4_bytes",
           "int8_bytes", "layout_of", "parse_kv", "parse_scheme", "torchao"]
