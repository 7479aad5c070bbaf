"""archscan.memory.reduction (torch 2.11's ``setReduceConfig``, ported) against what CUDA reductions
took from the caching allocator: every reduction op that allocated in the H200 traces
(tests/gpu_truth/reductions.json, written by benchmarks/extract_reductions.py), requests counted on
an H100 under torch 2.11, and configs derived by hand from Reduce.cuh."""

from __future__ import annotations

import json
import os

import pytest
import torch

from archscan.devices.gpus import SMS
from archscan.memory.reduction import (
    ReduceConfig,
    accumulation_bytes,
    reduce_configs,
    reduction_buffers,
    reduction_scratch,
    round_block,
    threads_per_sm,
)

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "gpu_truth", "reductions.json")) as f:
    RECORDED = json.load(f)
H200 = SMS["h200"]
MiB = 1 << 20
f32, bf16 = torch.float32, torch.bfloat16

# Recorded blocks larger than the request: the caching allocator handed out a free block (or a
# fresh 2 MiB-rounded segment) whole, since it splits a large-pool block only when more than 1 MiB
# (kSmallSize) would remain; a recorded size is then at least the request and at most 1 MiB more.
# (trace, shape, recorded block) -> what would have remained
WHOLE_BLOCKS = {
    ("mem_vit_b_16_train_b16", (3152, 768), 19677184): 16384,      # 19660800 requested
    ("mem_vit_b_16_train_b16", (3152, 3072), 79691776): 1 * MiB,   # 78643200 requested
}


def _args(case: dict) -> tuple:
    return (case["shape"], case["strides"], case["dims"], getattr(torch, case["in_dtype"]),
            getattr(torch, case["out_dtype"]))


def _predicted_blocks(case: dict, sms: int = H200) -> list[int]:
    """The blocks the port says the kernel allocates after its result: staging, semaphores."""
    staging, semaphores = reduction_buffers(*_args(case), sms, op=case["op"], keepdim=case["keepdim"])
    return [round_block(n) for n in (staging, semaphores) if n]


def _case_id(case: dict) -> str:
    return f"{case['trace'][4:]}-{case['op']}-{'x'.join(map(str, case['shape']))}-d{case['dims']}-{case['scratch']}"


def test_the_table_holds_every_kind_of_case():
    ops = {c["op"] for c in RECORDED}
    assert {"sum", "mean", "all"} <= ops
    with_scratch = [c for c in RECORDED if c["scratch"]]
    assert len(with_scratch) >= 10 and len(RECORDED) > len(with_scratch)
    assert sum(c["count"] for c in RECORDED) > 600        # every op of the traces, not one per shape


@pytest.mark.parametrize("case", RECORDED, ids=_case_id)
def test_recorded_case(case):
    # the first block is the result: the attribution to the op is right
    outputs = 1
    dims = {d % len(case["shape"]) for d in case["dims"]} if case["dims"] else set(range(len(case["shape"])))
    for d, n in enumerate(case["shape"]):
        outputs *= 1 if d in dims else n
    assert case["result"] == round_block(outputs * getattr(torch, case["out_dtype"]).itemsize)

    predicted = _predicted_blocks(case)
    whole = [WHOLE_BLOCKS.get((case["trace"], tuple(case["shape"]), r)) for r in case["scratch"]]
    if not any(whole):
        assert case["scratch"] == predicted                    # blocks carved to the request
        return
    assert len(case["scratch"]) == len(predicted)
    for recorded, request, remainder in zip(case["scratch"], predicted, whole):
        if remainder is None:
            assert recorded == request
        else:                                                  # a large block handed out whole
            assert request > MiB and recorded - request == remainder <= MiB


def test_a_wrong_sm_count_gives_other_bytes():
    changed = [c for c in RECORDED if c["scratch"] and _predicted_blocks(c, SMS["l4"]) != _predicted_blocks(c)]
    assert changed
    # bias gradient [4096, 3072] on an L4 (58 SMs): grid.x = 3072/4/32 = 24 column blocks; 512/4 = 128
    # threads a block, 2048/128 = 16 blocks an SM, target 58*16 = 928 blocks; CTAs per output
    # max(min(ceil(928/24) = 39, 1024/16 = 64), 1024/256 = 4) = 39 (H200: min(88, 64) = 64)
    staging, semaphores = reduction_buffers([4096, 3072], [3072, 1], [0], f32, f32, SMS["l4"])
    assert staging == 4 * 3072 * 39 * 32 * 4 == 61341696 and semaphores == 4 * 24
    assert reduction_buffers([4096, 3072], [3072, 1], [0], f32, f32, H200)[0] == 4 * 3072 * 64 * 32 * 4


def test_bias_gradient_config():
    # sum(0) of [4096, 768] fp32: lanes hold 4 adjacent outputs each (output_vec_size 4), a block of
    # 32x4 threads (512/4 = 128 at most), warps split the 4096 inputs; grid.x = 768/4/32 = 6;
    # values per thread 4096/4 = 1024; CTAs max(min(ceil(132*16/6) = 352, 1024/16 = 64), 4) = 64
    (config,) = reduce_configs([4096, 768], [768, 1], [0], f32, f32, H200)
    assert config == ReduceConfig(element_size_bytes=4, num_outputs=768, num_inputs=4096, block_width=32,
                                  block_height=4, vectorize_input=False, output_vec_size=4, step_input=256,
                                  step_output=32, ctas_per_output=64, input_mult=(0, 1, 4), output_mult=(1, 0))
    # 4 bytes * 768 outputs * 64 CTAs * 32 lanes * 4 outputs a lane: 8 bytes per input element
    assert config.global_memory_size() == 4 * 768 * 64 * 32 * 4 == 25165824 == 4096 * 768 * 8
    assert config.semaphore_size() == 4 * 6
    assert reduction_scratch([4096, 768], [768, 1], [0], f32, f32, H200) == 25165824 + 512


def test_full_reduction_to_a_scalar():
    # [2**20] fp32: vectorized input (2**20/4 = 2**18 >= 512 lanes): a block of 512x1; 2**20/512 = 2048
    # values per thread; 2048/512 = 4 blocks an SM; CTAs max(min(132*4 = 528, 2048/16 = 128), 2048/256 = 8)
    (config,) = reduce_configs([1 << 20], [1], [], f32, f32, H200)
    assert (config.block_width, config.block_height, config.vectorize_input) == (512, 1, True)
    assert config.ctas_per_output == 128
    assert reduction_buffers([1 << 20], [1], [], f32, f32, H200) == (4 * 128, 4)   # lanes reduce together
    assert reduction_scratch([1 << 20], [1], [], f32, f32, H200) == 512 + 512
    # [100000]: ceil(100000/512) = 196 values per thread, under 256: one CTA, no scratch
    assert reduction_scratch([100000], [1], [], f32, f32, H200) == 0
    # every dim of a [4, 1024, 50304] logits tensor: 206045184/512 = 402432 values per thread, CTAs
    # max(min(528, 25152), ceil(402432/256) = 1572): 4 * 1572 = 6288 bytes, a 6656-byte block
    assert reduction_buffers([4, 1024, 50304], [51511296, 50304, 1], [], f32, f32, H200) == (6288, 4)


def test_reduction_over_the_last_dim():
    # [8, 2**20] over dim -1: a block of 64x8 (a row of lanes per output), 2**20/512 = 2048 values per
    # thread, grid.x 8; CTAs max(min(ceil(528/8) = 66, 128), 8) = 66: 4 * 8 * 66 = 2112 bytes
    (config,) = reduce_configs([8, 1 << 20], [1 << 20, 1], [-1], f32, f32, H200)
    assert (config.block_width, config.block_height, config.ctas_per_output) == (64, 8, 66)
    assert reduction_buffers([8, 1 << 20], [1 << 20, 1], [-1], f32, f32, H200) == (2112, 32)
    # with 108 SMs (A100): ceil(432/8) = 54 CTAs
    assert reduction_buffers([8, 1 << 20], [1 << 20, 1], [-1], f32, f32, SMS["a100-80gb"]) == (4 * 8 * 54, 32)
    # [64, 2**16]: 2**16/512 = 128 values per thread: no split
    assert reduction_buffers([64, 1 << 16], [1 << 16, 1], [-1], f32, f32, H200) == (0, 0)


def test_non_contiguous_inputs():
    # a transposed view walks memory as the contiguous [4096, 768] does over dim 0
    assert (reduction_buffers([768, 4096], [1, 768], [1], f32, f32, H200)
            == reduction_buffers([4096, 768], [768, 1], [0], f32, f32, H200))
    # every other column of [4096, 1536]: stride 8 bytes, no vectorization; a block of 32x16, grid.x
    # 768/32 = 24, 4096/16 = 256 values per thread; CTAs max(min(ceil(528/24) = 22, 16), 1) = 16
    (config,) = reduce_configs([4096, 768], [1536, 2], [0], f32, f32, H200)
    assert (config.output_vec_size, config.block_width, config.block_height) == (1, 32, 16)
    assert config.global_memory_size() == 4 * 768 * 16 * 32 == 1572864
    # channels-last [16, 768, 14, 14] over (0, 2, 3): 3136 inputs an output, 49 CTAs
    assert reduction_buffers([16, 768, 14, 14], [151296, 1, 10752, 768], [0, 2, 3], f32, f32,
                             H200) == (4 * 768 * 49 * 32 * 4, 4 * 6)


def test_bf16_stages_in_float():
    # sum and mean of bfloat16 accumulate (and stage) in float: as many bytes as fp32
    fp32 = reduction_buffers([4096, 768], [768, 1], [0], f32, f32, H200)
    assert reduction_buffers([4096, 768], [768, 1], [0], bf16, bf16, H200) == fp32
    assert reduction_buffers([4096, 768], [768, 1], [0], bf16, f32, H200, op="mean") == fp32
    # amax keeps bfloat16: half; var keeps WelfordData<float, int32> (16 bytes): four times
    assert reduction_buffers([4096, 768], [768, 1], [0], bf16, bf16, H200, op="amax")[0] == fp32[0] // 2
    assert reduction_buffers([4096, 768], [768, 1], [0], f32, f32, H200, op="var")[0] == fp32[0] * 4


def test_an_input_over_2_gib_runs_in_pieces():
    # [131072, 16384] bf16 (4 GiB) over dim 0: split at dim 0 into two [65536, 16384] pieces, each
    # 16384 outputs, 65536/4 = 16384 values per thread, grid.x 4096/32 = 128, CTAs max(min(17, 1024), 64)
    configs = reduce_configs([131072, 16384], [16384, 1], [0], bf16, bf16, H200)
    assert [c.num_inputs for c in configs] == [65536, 65536]
    assert {(c.global_memory_size(), c.semaphore_size()) for c in configs} == {(4 * 16384 * 64 * 32 * 4, 512)}
    # bf16 into bf16 keeps float partial sums across the pieces: 16384 outputs * 4 bytes
    assert accumulation_bytes([131072, 16384], [16384, 1], [0], bf16, bf16) == 65536
    assert accumulation_bytes([131072, 16384], [16384, 1], [0], bf16, f32) == 0
    assert reduction_scratch([131072, 16384], [16384, 1], [0], bf16, bf16, H200) == 536870912 + 512 + 65536


# Requests torch 2.11.0+cu130 made on an NVIDIA H100 80GB HBM3 (132 SMs, 2048 threads an SM):
# torch.cuda.memory_stats()["requested_bytes.all.allocated"] across the op, less its result
# (op, shape, strides, dims, input dtype, bytes)
H100_REQUESTS = [
    ("sum", [4096, 768], [768, 1], [0], "float32", 25165848),
    ("sum", [3152, 3072], [3072, 1], [0], "float32", 78643296),
    ("sum", [2, 2048, 2048], [4194304, 2048, 1], [0, 1], "bfloat16", 67108928),
    ("sum", [4, 1024, 50304], [51511296, 50304, 1], [], "float32", 6292),
    ("sum", [16, 768, 14, 14], [151296, 1, 10752, 768], [0, 2, 3], "float32", 19267608),
    ("sum", [1048576], [1], [], "float32", 516),
    ("sum", [100000], [1], [], "float32", 0),
    ("sum", [268435456], [1], [], "float32", 8196),
    ("sum", [8, 1048576], [1048576, 1], [-1], "float32", 2144),
    ("sum", [4096, 768], [1536, 2], [0], "float32", 1572960),
    ("sum", [768, 4096], [1, 768], [1], "float32", 25165848),
    ("amax", [4096, 768], [768, 1], [0], "bfloat16", 12582936),
    ("var", [4096, 768], [768, 1], [0], "float32", 100663320),
    ("mean", [4096, 768], [768, 1], [0], "bfloat16", 25165848),
    ("sum", [4096, 768], [768, 1], [0], "bfloat16", 25165848),
    ("sum", [131072, 16384], [16384, 1], [0], "bfloat16", 1073808384),   # two pieces and the buffer
    ("sum", [64, 65536], [65536, 1], [-1], "float32", 0),
    ("mean", [512, 50000], [50000, 1], [0], "float32", 0),
    ("amax", [2, 4096, 4096], [16777216, 4096, 1], [0, 1], "float32", 138412160),
]


@pytest.mark.parametrize("op,shape,strides,dims,dtype,requested", H100_REQUESTS)
def test_h100_requests(op, shape, strides, dims, dtype, requested):
    dt = getattr(torch, dtype)
    configs = reduce_configs(shape, strides, dims, dt, dt, SMS["h100"], op=op)
    total = sum(c.global_memory_size() + c.semaphore_size() for c in configs)
    assert total + accumulation_bytes(shape, strides, dims, dt, dt, op=op) == requested


def test_rounding_and_limits():
    assert [round_block(n) for n in (0, 1, 512, 513, 6288)] == [0, 512, 512, 1024, 6656]
    assert threads_per_sm((9, 0)) == 2048 and threads_per_sm((8, 9)) == 1536 and threads_per_sm(None) == 2048
    # an L4 (58 SMs, 1536 threads an SM) fills fewer blocks than 2048 threads would say
    assert (reduction_buffers([8, 1 << 20], [1 << 20, 1], [-1], f32, f32, SMS["l4"], max_threads_per_sm=1536)
            == (4 * 8 * 22, 32))                              # ceil(58*3/8) = 22 CTAs
    with pytest.raises(ValueError, match="argmax"):
        reduction_scratch([8, 8], [8, 1], [0], f32, f32, H200, op="argmax")
