"""Named GPUs: the memory a budget (``--memory h100``) stands for.

Memory sizes are the datasheets' figures, read as binary units the way HBM is built (an H100's
80 GB is 80 GiB of HBM3). CUDA keeps part of it for its context and the caching allocator rounds
each block, so what a process can hold is somewhat less: ``torch.cuda.mem_get_info()`` says how
much on the machine itself, and an exact size (``--memory 78GiB``) can always be given instead.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    source: str
    fp32_tflops: float | None = None      # dense, CUDA cores (float32 matmuls run here unless TF32 is allowed)
    bf16_tflops: float | None = None      # dense tensor cores (the datasheets' "with sparsity" figures halved)
    bandwidth_tbs: float | None = None    # memory bandwidth, TB/s

    @property
    def capability(self) -> tuple[int, int] | None:
        """CUDA compute capability (major, minor), which decides the kernels torch picks; None for
        a GPU CUDA does not run (MI300X)."""
        return CAPABILITY.get(self.name)


# name -> GPU; the first name of each line is the one reports use. Compute and bandwidth where a
# datasheet profile (``--device-profile``) is offered: dense FP32 and BF16 TFLOPS (2 per
# multiply-add), memory bandwidth in TB/s, as the datasheets give them.
_TABLE = [
    (("h100", "h100-sxm"), 80, "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80 GB)", 67.0, 989.4, 3.35),
    (("h100-pcie",), 80, "NVIDIA H100 Tensor Core GPU datasheet (PCIe 80 GB)", 51.0, 756.0, 2.0),
    (("h100-nvl",), 94, "NVIDIA H100 NVL datasheet (94 GB)"),
    (("h200",), 141, "NVIDIA H200 Tensor Core GPU datasheet (141 GB)", 67.0, 989.4, 4.8),
    (("b200",), 180, "NVIDIA HGX B200 datasheet (180 GB per GPU)", 75.0, 2250.0, 7.7),
    (("a100-80gb", "a100"), 80, "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM)", 19.5, 312.0, 2.039),
    (("a100-40gb",), 40, "NVIDIA A100 Tensor Core GPU datasheet (40 GB SXM)", 19.5, 312.0, 1.555),
    (("l40s",), 48, "NVIDIA L40S datasheet (48 GB)", 91.6, 362.05, 0.864),
    (("l40",), 48, "NVIDIA L40 datasheet (48 GB)"),
    (("l4",), 24, "NVIDIA L4 datasheet (24 GB)", 30.3, 121.0, 0.3),
    (("a10", "a10g"), 24, "NVIDIA A10 datasheet (24 GB)"),
    (("t4",), 16, "NVIDIA T4 datasheet (16 GB)"),
    (("v100-32gb", "v100"), 32, "NVIDIA V100 datasheet (32 GB)"),
    (("v100-16gb",), 16, "NVIDIA V100 datasheet (16 GB)"),
    (("rtx4090",), 24, "NVIDIA GeForce RTX 4090 specifications (24 GB)"),
    (("rtx3090",), 24, "NVIDIA GeForce RTX 3090 specifications (24 GB)"),
    (("a6000", "rtx-a6000"), 48, "NVIDIA RTX A6000 datasheet (48 GB)"),
    (("mi300x",), 192, "AMD Instinct MI300X datasheet (192 GB)"),
]

# The memory CUDA reports (``torch.cuda.get_device_properties().total_memory``), where it was read
# on the GPU itself: less than the datasheet's binary figure (an H100's "80 GB" is 79.2 GiB to CUDA).
# tests/gpu_truth: the H200 of 2026-11-26 and the H100 of heldout-h100-2026-11-26.
CUDA_TOTAL = {"h200": 150_109_880_320, "h100": 85_017_493_504}

# CUDA compute capability by the first name of each line (NVIDIA's CUDA GPUs table).
CAPABILITY = {"h100": (9, 0), "h100-pcie": (9, 0), "h100-nvl": (9, 0), "h200": (9, 0), "b200": (10, 0),
              "a100-80gb": (8, 0), "a100-40gb": (8, 0), "l40s": (8, 9), "l40": (8, 9), "l4": (8, 9),
              "a10": (8, 6), "t4": (7, 5), "v100-32gb": (7, 0), "v100-16gb": (7, 0), "rtx4090": (8, 9),
              "rtx3090": (8, 6), "a6000": (8, 6)}

# Streaming multiprocessors (``multiProcessorCount``) by the first name of each line, which sizes
# the grids torch's CUDA kernels launch (NVIDIA's architecture whitepapers and datasheets).
SMS = {"h100": 132, "h100-pcie": 114, "h100-nvl": 132, "h200": 132, "b200": 148, "a100-80gb": 108,
       "a100-40gb": 108, "l40s": 142, "l40": 142, "l4": 58, "a10": 72, "t4": 40, "v100-32gb": 80,
       "v100-16gb": 80, "rtx4090": 128, "rtx3090": 82, "a6000": 84}

GPUS: dict[str, GPU] = {alias: GPU(names[0], gib * GiB, source, *rest) for names, gib, source, *rest in _TABLE
                        for alias in names}


def gpu(name: str) -> GPU | None:
    """The GPU of that name (case and ``_``/`` `` ignored: 'H100', 'a100_40gb'), or None."""
    return GPUS.get(name.strip().lower().replace("_", "-").replace(" ", "-"))


def gpu_named_like(device_name: str) -> GPU | None:
    """The GPU a driver's device name stands for ('NVIDIA H100 80GB HBM3' -> h100,
    'NVIDIA A100-SXM4-40GB' -> a100-40gb): the longest name whose every part is a word of it."""
    words = set(device_name.lower().replace("_", " ").replace("-", " ").split())
    for alias in sorted(GPUS, key=len, reverse=True):
        if all(part in words for part in alias.split("-")):
            return GPUS[alias]
    return None
