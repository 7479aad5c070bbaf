"""The CUDA caching allocator, simulated (``archscan.memory.allocator``), against torch 2.11's rules
and against what an H200 recorded (``tests/gpu_truth``, captured by its ``capture.py``).

The recorded data: for each memory configuration, ``summary.jsonl`` holds ``memory_stats()`` over
the measured run, which started right after ``torch.cuda.empty_cache()`` with the resident tensors
(parameters, inputs, optimizer state, library workspaces) allocated; ``snapshot.json.gz`` is
taken after one more run of the same step (the recorded run), which started from the measured
run's end, its segments all cached, and traced every request. ``from_snapshot`` rolls the end
state back to the resident blocks and keeps the segments holding one: the measured run's start.
Replaying the trace's requests from there gives the measured run's peaks; from the replay's end,
the recorded run again, address for address.

Rules are checked on hand-made sequences whose answers follow from the C++ source (the
arithmetic is in the comments); expandable segments and the limit against runs on an H100. No
GPU and no torch needed: the module is loaded from its file, and the file takes a few seconds.
"""

from __future__ import annotations

import ast
import collections
import functools
import gzip
import hashlib
import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_allocator():
    """archscan/memory/allocator.py from its file: the package's __init__ imports torch (for its
    tracker), which this module does not need; so the file runs in about a second, not five."""
    path = os.path.join(os.path.dirname(HERE), "archscan", "memory", "allocator.py")
    spec = importlib.util.spec_from_file_location("_allocator_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


allocator = _load_allocator()
Block, CachingAllocator, OutOfMemoryError, Segment = (allocator.Block, allocator.CachingAllocator,
                                                      allocator.OutOfMemoryError, allocator.Segment)
allocation_size, from_snapshot, round_size, simulate = (allocator.allocation_size, allocator.from_snapshot,
                                                        allocator.round_size, allocator.simulate)
TRUTH = os.path.join(HERE, "gpu_truth")
MiB = 1 << 20


@functools.lru_cache(maxsize=None)
def summary() -> dict[str, dict]:
    with open(os.path.join(TRUTH, "summary.jsonl"), encoding="utf-8") as fh:
        return {r["id"]: r for r in map(json.loads, fh)}


CONFIGS = sorted(name for name in os.listdir(TRUTH) if name.startswith("mem_"))
PEAKS = ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "requested_bytes.all.peak",
         "allocation.all.peak", "segment.all.peak")


@functools.lru_cache(maxsize=None)
def snapshot(name: str) -> dict:
    with gzip.open(os.path.join(TRUTH, name, "snapshot.json.gz"), "rt", encoding="utf-8") as fh:
        return json.load(fh)


def test_the_data_is_all_there():
    """Guards against a glob that finds nothing: 12 memory configurations, each with its stats."""
    assert len(CONFIGS) == 12, CONFIGS
    assert all("stats" in summary()[name] for name in CONFIGS)
    assert summary()["env"]["torch"].startswith("2.11.")


@pytest.mark.parametrize("name", CONFIGS)
def test_the_runs_used_the_default_settings(name):
    """The simulator's defaults are the settings the runs had: no expandable segments, no
    max_split_size (-1: unlimited), no power-of-two rounding, no garbage collection."""
    settings = snapshot(name)["allocator_settings"]
    assert settings["expandable_segments"] is False
    assert settings["max_split_size"] == -1
    assert set(settings["roundup_power2_divisions"].values()) == {0}
    assert settings["garbage_collection_threshold"] == 0.0


# --- the measured runs, replayed ------------------------------------------------------------------

# segment.all.peak of the two Llama training steps comes out one short (reserved bytes exact): the
# replay makes one 32 MiB segment where the GPU made two of 16 MiB. Which of two free blocks of one
# size best fit takes is decided by their addresses, and a new segment's address is the CUDA
# driver's choice, which the simulator makes up. Given the driver's addresses
# (test_the_recorded_run_address_for_address) one of the two is exact; over random orders of the
# other's recorded addresses the count comes out 322, 323 or 324, reserved bytes always exact.
SEGMENT_TOLERANCE = {"mem_llama_1b_train_2x2048_bf16w": 1, "mem_llama_1b_train_2x2048_bf16w_labels": 1}


@pytest.mark.parametrize("name", CONFIGS)
def test_the_measured_run_replayed(name):
    record = summary()[name]
    initial, events = from_snapshot(snapshot(name))
    # the start: the resident blocks, what memory_allocated() said just before the run
    assert sum(b.size for s in initial for b in s.blocks) == record["resident_bytes"]
    replay = simulate(events, initial=initial)
    assert not replay.oom
    measured = record["stats"]
    for key in PEAKS:
        assert abs(replay.stats[key] - measured[key]) <= (SEGMENT_TOLERANCE.get(name, 0) if key == "segment.all.peak"
                                                          else 0), (key, replay.stats[key], measured[key])


rounded_sum_peak = allocator.rounded_sum_peak


@pytest.mark.parametrize("name", CONFIGS)
def test_allocated_bytes_are_blocks_not_rounded_requests(name):
    """``allocated_bytes`` sums block sizes: a request rounded to 512 bytes, or the whole block when
    what would remain of it is too small to split off (1 MiB or less in the large pool). The running
    sum of rounded requests is never above the recorded peak, and below it in 8 of 12 runs (by up
    to 38 MiB: RoBERTa under bf16 autocast); the replay has it exact (test above)."""
    initial, events = from_snapshot(snapshot(name))
    peak, recorded = rounded_sum_peak(events, initial), summary()[name]["stats"]["allocated_bytes.all.peak"]
    assert peak <= recorded
    assert (peak < recorded) == (name not in {"mem_llama_1b_fwd_1x8192_bf16", "mem_llama_1b_train_2x2048_bf16w",
                                              "mem_llama_1b_train_2x2048_bf16w_labels", "mem_pythia_160m_train_4x1024",
                                              "mem_resnet50_fwd_b64"})


def driver_addresses(snap: dict, initial: list[Segment]):
    """``segment_address`` for the replay of both runs: the CUDA driver's addresses, read from the
    snapshot. The measured run's new segments are the end state's segments that it did not start
    with and the recorded run did not make; which of them came first is not recorded, so each size
    takes them lowest address first. Then come the recorded run's own, in its trace's order."""
    made = [e for e in snap["device_traces"][0] if e["action"] == "segment_alloc"]
    known = {s.address for s in initial} | {e["addr"] for e in made}
    queue = collections.defaultdict(list)
    for seg in sorted(snap["segments"], key=lambda s: s["address"]):
        if seg["address"] not in known:
            queue[seg["total_size"]].append(seg["address"])
    for e in made:
        queue[e["size"]].append(e["addr"])
    return lambda size: queue[size].pop(0)


ADDRESSES_DIFFER = {"mem_llama_1b_train_2x2048_bf16w": "the measured run's new segments came in an order "
                    "the lowest-address-first guess does not reproduce: its replay ends with another state"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=ADDRESSES_DIFFER[n]))
                                  if n in ADDRESSES_DIFFER else n for n in CONFIGS])
def test_the_recorded_run_address_for_address(name):
    """With the driver's addresses for new segments, the measured run's replay has every peak exact,
    segments included, and its end is the recorded run's start: replayed from there, every request
    of the recorded run gets the very address the GPU gave it, and the segments and blocks at the
    end are the snapshot's. This is best fit, splitting and merging checked block by block."""
    snap = snapshot(name)
    initial, events = from_snapshot(snap)
    gpu = CachingAllocator(initial=initial, segment_address=driver_addresses(snap, initial))
    measured = gpu.run(events)
    assert {k: measured.stats[k] for k in PEAKS} == {k: summary()[name]["stats"][k] for k in PEAKS}
    gpu.reset_peak_stats()
    handles, wrong = {}, []
    for i, (op, key, size) in enumerate(events):
        if op == "alloc":
            handles[key] = gpu.malloc(size)
            if handles[key] != key:
                wrong.append(i)
        else:
            gpu.free(handles.pop(key))
    allocs = sum(op == "alloc" for op, _, _ in events)
    assert not wrong, f"{len(wrong)} of {allocs} requests elsewhere, the first at event {wrong[0]}"
    recorded = [(s["address"], s["total_size"], [(b["address"], b["size"], b["state"] == "active_allocated",
                                                  b["requested_size"] if b["state"] == "active_allocated" else 0)
                                                 for b in s["blocks"]]) for s in snap["segments"]]
    simulated = [(s.address, s.size, [(b.address, b.size, b.allocated, b.requested_size) for b in s.blocks])
                 for s in gpu.segments()]
    assert simulated == sorted(recorded)


# --- expandable segments and the limit, on a GPU ------------------------------------------------

def h100_events(seed: int, n: int = 3000) -> list[tuple]:
    """The requests run on an H100: sizes log-uniform from 512 bytes to 64 MiB, frees in random
    order (45% of the events while anything is live, every one past 300 live blocks)."""
    rng, live, events, key = random.Random(seed), [], [], 0
    while len(events) < n:
        if live and (rng.random() < 0.45 or len(live) > 300):
            events.append(("free", live.pop(int(rng.random() * len(live))), 0))
        else:
            events.append(("alloc", key, int(2 ** (9 + rng.random() * 17))))
            live.append(key)
            key += 1
    return events


H100_MEMORY = 85_017_493_504   # cudaMemGetInfo's total on the H100 80GB HBM3
H100_LIMIT = 1_020_209_922     # set_per_process_memory_fraction(0.012): int(0.012 * H100_MEMORY)
# Recorded 2026-11-26 on an NVIDIA H100 80GB HBM3, torch 2.11.0+cu130: each run a fresh process that
# made h100_events(seed) with torch.cuda.caching_allocator_alloc / caching_allocator_delete (under
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the expandable ones), read memory_stats() and
# the trace of _record_memory_history, and stopped at torch.OutOfMemoryError. The addresses: the
# expandable segments' bases (large pool, then small) and the sha256 of every allocation's address
# in order; the plain runs' 63 and 29 segment addresses are not kept.
H100_RUNS = {
    "plain": (0, False, None, None, None, None, dict(
        reserved=2269118464, allocated=2010535936, requested=1988249825, segments=63, allocations=301,
        retries=0, ooms=0, device_alloc=63, device_free=0)),
    "expandable": (0, True, None, None, (12918456320, 108582141952), "fcf478eab8d047b4", dict(
        reserved=2218786816, allocated=1988321792, requested=1988249825, segments=0, allocations=301,
        retries=0, ooms=0, device_alloc=71, device_free=0)),
    "plain, limited": (1, False, H100_LIMIT, 815, None, None, dict(
        reserved=1010827264, allocated=908459008, requested=900749962, segments=28, allocations=135,
        retries=2, ooms=1, device_alloc=29, device_free=1)),
    "expandable, limited": (1, True, H100_LIMIT, 841, (12918456320, 108582141952), "5408a94eb7e4ffc0", dict(
        reserved=1002438656, allocated=943459840, requested=943424916, segments=0, allocations=140,
        retries=1, ooms=1, device_alloc=33, device_free=0)),
}
STAT_KEYS = dict(reserved="reserved_bytes.all.peak", allocated="allocated_bytes.all.peak",
                 requested="requested_bytes.all.peak", segments="segment.all.peak", allocations="allocation.all.peak",
                 retries="num_alloc_retries", ooms="num_ooms", device_alloc="num_device_alloc",
                 device_free="num_device_free")


def test_the_h100_requests_are_these():
    """The generator is the one that ran: the sum of its request sizes, per seed, as recorded."""
    assert [sum(size for _, _, size in h100_events(seed)) for seed in (0, 1)] == [9191822200, 10237415390]


@pytest.mark.parametrize("run", H100_RUNS)
def test_expandable_segments_and_the_limit_as_an_h100_ran_them(run):
    """Every statistic of the four runs exact, the out-of-memory error at the same request (after
    freeing the cache: ``num_alloc_retries``), and in expandable segments every address: the pages
    mapped where the GPU mapped them, the blocks placed where it placed them."""
    seed, expandable, limit, oom_at, bases, digest, expected = H100_RUNS[run]
    places = iter(bases or ())
    gpu = CachingAllocator(expandable_segments=expandable, limit=limit, device_memory=H100_MEMORY,
                           segment_address=(lambda size: next(places)) if bases else None)
    addresses, handles = [], {}
    for i, (op, key, size) in enumerate(h100_events(seed)):
        if op == "alloc":
            try:
                handles[key] = gpu.malloc(size)
            except OutOfMemoryError:
                assert i == oom_at
                break
            addresses.append(handles[key])
        else:
            gpu.free(handles.pop(key))
    else:
        assert oom_at is None
    stats = gpu.memory_stats()
    assert {name: stats[key] for name, key in STAT_KEYS.items()} == expected
    if digest is not None:
        assert hashlib.sha256(",".join(map(str, addresses)).encode()).hexdigest()[:16] == digest


# --- the negative check: wrong rules do not reproduce the runs ------------------------------------

VARIANTS = {
    "blocks of 256 bytes": ("K_MIN_BLOCK_SIZE", 256),
    "no 20 MiB segments: every large one the request rounded to 2 MiB": ("K_MIN_LARGE_ALLOC", 0),
    "large segments rounded to 20 MiB": ("K_ROUND_LARGE", 20 * MiB),
    "a small pool up to 2 MiB": ("K_SMALL_SIZE", 2 * MiB),
    "expandable segments": None,
    "rounded requests, no blocks": None,
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_wrong_rule_does_not_reproduce_the_peaks(variant, monkeypatch):
    """The replay test can fail: with one rule changed, ResNet-50's training step comes out with
    another allocated or reserved peak than the GPU's."""
    name = "mem_resnet50_train_b32"
    initial, events = from_snapshot(snapshot(name))
    if variant == "rounded requests, no blocks":  # and a segment per block: reserved as allocated
        allocated = reserved = rounded_sum_peak(events, initial)
    else:
        if VARIANTS[variant] is not None:
            monkeypatch.setattr(allocator, *VARIANTS[variant])
        replay = simulate(events, initial=initial, expandable_segments=variant == "expandable segments")
        allocated, reserved = replay.stats["allocated_bytes.all.peak"], replay.stats["reserved_bytes.all.peak"]
    measured = summary()[name]["stats"]
    assert (allocated, reserved) != (measured["allocated_bytes.all.peak"], measured["reserved_bytes.all.peak"])


# --- the rules, one at a time -------------------------------------------------------------------

def test_rounding():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    # roundup_power2_divisions 4 above 4 * 512 bytes: 5000 lies in [4096, 8192), steps of 1024 -> 5120
    assert round_size(5000, 4) == 5120 and round_size(4096, 4) == 4096 and round_size(1200, 4) == 1536
    gpu = CachingAllocator()
    gpu.malloc(1)
    stats = gpu.memory_stats()
    assert (stats["allocated_bytes.all.current"], stats["requested_bytes.all.current"]) == (512, 1)


def test_small_and_large_pools_and_their_segments():
    assert [allocation_size(s) for s in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB)] == \
        [2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]
    gpu = CachingAllocator()
    gpu.malloc(MiB)           # small pool: a 2 MiB segment
    gpu.malloc(MiB + 1)       # 1 MiB + 512 after rounding: large pool, a 20 MiB segment
    gpu.malloc(10 * MiB - 1)  # under 10 MiB: fits in what the 20 MiB segment has left (18 MiB)
    gpu.malloc(11 * MiB)      # 11 MiB: its own segment, rounded to 12 MiB
    stats = gpu.memory_stats()
    assert stats["reserved_bytes.all.current"] == (2 + 20 + 12) * MiB
    assert stats["segment.all.current"] == 3
    assert [(s.pool, s.size) for s in gpu.segments()] == [("small", 2 * MiB), ("large", 20 * MiB), ("large", 12 * MiB)]


def test_split_thresholds():
    gpu = CachingAllocator()
    gpu.malloc(19 * MiB)               # 20 MiB segment, 1 MiB would remain: not > 1 MiB, the block stays whole
    assert gpu.memory_stats()["allocated_bytes.all.current"] == 20 * MiB
    gpu = CachingAllocator()
    gpu.malloc(19 * MiB - 512)         # 1 MiB + 512 remain: split
    assert gpu.memory_stats()["allocated_bytes.all.current"] == 19 * MiB - 512
    gpu = CachingAllocator()
    gpu.malloc(MiB)                    # small pool: 2 MiB segment, 1 MiB remains (>= 512): split
    gpu.malloc(MiB - 512)              # takes the 1 MiB remainder, 512 bytes remain: split again
    last = gpu.malloc(512)             # takes those 512 bytes: still one segment
    assert gpu.memory_stats()["segment.all.current"] == 1
    assert gpu.memory_stats()["allocated_bytes.all.current"] == 2 * MiB
    assert last == gpu.segments()[0].address + 2 * MiB - 512


def test_best_fit_lowest_size_then_lowest_address():
    gpu = CachingAllocator()
    a, b, c = gpu.malloc(12 * MiB), gpu.malloc(14 * MiB), gpu.malloc(12 * MiB)  # three segments, a < b < c
    for h in (a, b, c):
        gpu.free(h)                    # free blocks: 12 MiB at a, 14 MiB at b, 12 MiB at c
    assert gpu.malloc(11 * MiB) == a   # the smallest that fits, the lowest address of the two
    assert gpu.malloc(12 * MiB) == c
    assert gpu.malloc(13 * MiB) == b
    assert gpu.memory_stats()["segment.all.peak"] == 3  # no new segment


def test_freed_blocks_merge_with_their_free_neighbours():
    gpu = CachingAllocator()
    x, y, z = (gpu.malloc(4 * MiB) for _ in range(3))  # one 20 MiB segment: 4 | 4 | 4 | 8 free
    gpu.free(x)
    gpu.free(z)                                         # z merges with the 8 MiB after it
    assert [(b.size, b.allocated) for b in gpu.segments()[0].blocks] == [(4 * MiB, False), (4 * MiB, True),
                                                                       (12 * MiB, False)]
    gpu.free(y)                                         # all three become one block
    assert [(b.size, b.allocated) for b in gpu.segments()[0].blocks] == [(20 * MiB, False)]
    assert gpu.malloc(16 * MiB) == x                    # which now serves 16 MiB without a new segment
    gpu.empty_cache()                                   # a live block: the segment stays
    assert gpu.memory_stats()["reserved_bytes.all.current"] == 20 * MiB


def test_empty_cache_frees_whole_free_segments_only():
    gpu = CachingAllocator()
    a = gpu.malloc(12 * MiB)                            # a 12 MiB segment
    gpu.malloc(4 * MiB)                                 # a 20 MiB one, split
    gpu.free(a)
    gpu.empty_cache()
    stats = gpu.memory_stats()
    assert (stats["reserved_bytes.all.current"], stats["segment.all.current"], stats["num_device_free"]) == \
        (20 * MiB, 1, 1)


def test_out_of_memory_after_freeing_the_cache():
    gpu = CachingAllocator(limit=40 * MiB)
    gpu.free(gpu.malloc(12 * MiB))     # a cached 12 MiB segment
    gpu.malloc(30 * MiB)               # 12 + 30 > 40: the cache is freed, then 30 fits
    stats = gpu.memory_stats()
    assert (stats["reserved_bytes.all.current"], stats["num_alloc_retries"], stats["reserved_bytes.all.peak"]) == \
        (30 * MiB, 1, 30 * MiB)
    with pytest.raises(OutOfMemoryError) as error:
        gpu.malloc(12 * MiB)           # 30 + 12 > 40 with nothing cached
    assert (error.value.size, error.value.segment, error.value.reserved) == (12 * MiB, 12 * MiB, 30 * MiB)
    assert gpu.memory_stats()["num_ooms"] == 1
    replay = simulate([("alloc", "a", 12 * MiB), ("free", "a", 0), ("alloc", "b", 30 * MiB), ("alloc", "c", MiB)],
                      limit=31 * MiB)  # c needs a 2 MiB small segment: 32 > 31
    assert (replay.oom_at, replay.oom_error.segment) == (3, 2 * MiB)
    assert replay.stats["reserved_bytes.all.peak"] == 30 * MiB


def test_expandable_segments_grow_instead_of_making_new_ones():
    plain, grown = CachingAllocator(), CachingAllocator(expandable_segments=True)
    plain_handles = [plain.malloc(12 * MiB) for _ in range(3)]
    grown_handles = [grown.malloc(12 * MiB) for _ in range(3)]
    # plain: 12 MiB (not under 10 MiB) takes a segment of its own, three of them
    assert [s.size for s in plain.segments()] == [12 * MiB] * 3
    # expandable: one segment, the blocks back to back, two 20 MiB pages mapped (36 <= 40)
    base = grown_handles[0]
    assert grown_handles == [base, base + 12 * MiB, base + 24 * MiB]
    assert [(s.address, s.size) for s in grown.segments()] == [(base, 40 * MiB)]
    assert grown.memory_stats()["segment.all.peak"] == 0  # torch counts mapped pages as no segment
    for gpu, handles in ((plain, plain_handles), (grown, grown_handles)):
        for h in handles:
            gpu.free(h)
        gpu.malloc(30 * MiB)
    # plain: no free 12 MiB block fits 30 MiB, a fourth segment; expandable: the one free 40 MiB block does
    assert plain.memory_stats()["reserved_bytes.all.peak"] == (36 + 30) * MiB
    assert grown.memory_stats()["reserved_bytes.all.peak"] == 40 * MiB


def test_expandable_empty_cache_unmaps_whole_free_pages():
    gpu = CachingAllocator(expandable_segments=True)
    a, b, c = (gpu.malloc(12 * MiB) for _ in range(3))  # 0..12, 12..24, 24..36 of two 20 MiB pages
    gpu.free(a)
    gpu.free(b)                                         # free: 0..24 MiB, which holds one whole page
    gpu.empty_cache()
    assert gpu.memory_stats()["reserved_bytes.all.current"] == 20 * MiB
    assert [(s.address - a, [(x.size // MiB, x.allocated) for x in s.blocks]) for s in gpu.segments()] == \
        [(20 * MiB, [(4, False), (12, True), (4, False)])]
    assert gpu.malloc(2 * MiB) == a + 20 * MiB          # the 4 MiB free block below c is the best fit
    gpu.free(a + 20 * MiB)
    gpu.free(c)
    gpu.empty_cache()                                   # nothing mapped: the segment goes
    assert gpu.memory_stats()["reserved_bytes.all.current"] == 0 and gpu.segments() == []


def test_expandable_small_pool_maps_2_mib_pages():
    gpu = CachingAllocator(expandable_segments=True)
    handles = [gpu.malloc(MiB) for _ in range(3)]    # 3 MiB in 2 MiB pages: 4 MiB mapped
    assert handles == [handles[0] + i * MiB for i in range(3)]
    assert gpu.memory_stats()["reserved_bytes.all.current"] == 4 * MiB
    plain = CachingAllocator()
    for _ in range(3):
        plain.malloc(MiB)
    assert plain.memory_stats()["segment.all.current"] == 2  # two 2 MiB segments


def test_max_split_size():
    gpu = CachingAllocator(max_split_size=30 * MiB)
    gpu.free(gpu.malloc(40 * MiB))                    # a cached 40 MiB block, oversize
    gpu.malloc(8 * MiB)                               # under max_split_size: never takes it, a new 20 MiB segment
    assert gpu.memory_stats()["segment.all.current"] == 2
    big = gpu.malloc(35 * MiB)                        # at or over: takes it, 40 < 35 + 20, and does not split it
    assert gpu.memory_stats()["allocated_bytes.all.current"] == (8 + 40) * MiB and big == gpu.segments()[0].address
    gpu.free(big)
    assert gpu.malloc(19 * MiB) != big                # 40 >= 19 + 20: too wasteful, a new segment


def test_a_starting_state():
    base = 1 << 32
    seg = Segment(base, 20 * MiB, (Block(base + 4 * MiB, 4 * MiB, 4 * MiB - 100),))  # free 0..4 and 8..20 MiB
    gpu = CachingAllocator(initial=[seg])
    stats = gpu.memory_stats()
    assert (stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"], stats["requested_bytes.all.peak"]) == \
        (4 * MiB, 20 * MiB, 4 * MiB - 100)
    assert gpu.malloc(3 * MiB) == base                # best fit: the 4 MiB gap, 1 MiB left: not split
    gpu.free(base + 4 * MiB)                          # the starting block, named by its address
    replay = simulate([("free", base + 4 * MiB, 0), ("alloc", 1, 16 * MiB)], initial=[seg])
    assert replay.stats["segment.all.peak"] == 1      # the freed block merges with both gaps: 20 MiB


def test_from_snapshot_rolls_the_end_state_back():
    """A made-up snapshot: block r was there before the trace, t was made by it and is still live,
    f was freed by it without being made (it is live at the start, sized as its request rounded);
    the small segment holds nothing live at the start and goes with empty_cache; the trace made
    the segment at 2**35 (it was not there at the start) and freed the one at 2**36 (it was)."""
    r, t, f = 1 << 32, (1 << 32) + 4 * MiB, (1 << 32) + 8 * MiB
    free_block = {"size": 2 * MiB, "requested_size": 0, "state": "inactive"}
    snap = {"segments": [
        {"address": 1 << 32, "total_size": 20 * MiB, "segment_type": "large", "stream": 0, "blocks": [
            {"address": r, "size": 4 * MiB, "requested_size": 4 * MiB, "state": "active_allocated"},
            {"address": t, "size": 4 * MiB, "requested_size": 3 * MiB, "state": "active_allocated"},
            {"address": f, "size": 12 * MiB, "requested_size": 0, "state": "inactive"}]},
        {"address": 1 << 34, "total_size": 2 * MiB, "segment_type": "small", "blocks": [
            {"address": 1 << 34, **free_block}]},
        {"address": 1 << 35, "total_size": 2 * MiB, "segment_type": "small", "blocks": [
            {"address": 1 << 35, **free_block}]}],
        "device_traces": [[{"action": "free_requested", "addr": f, "size": 1000},
                           {"action": "free_completed", "addr": f, "size": 1000},
                           {"action": "segment_alloc", "addr": 1 << 35, "size": 2 * MiB},
                           {"action": "alloc", "addr": t, "size": 3 * MiB},
                           {"action": "segment_free", "addr": 1 << 36, "size": 2 * MiB},
                           {"action": "oom", "device_free": 0, "size": 1 << 40}]]}
    initial, events = from_snapshot(snap)
    assert initial == [Segment(1 << 32, 20 * MiB, (Block(r, 4 * MiB, 4 * MiB), Block(f, 1024, 1000)))]
    assert events == [("free", f, 1000), ("alloc", t, 3 * MiB)]
    assert [(s.address, s.size, s.pool) for s in from_snapshot(snap, empty_cache=False)[0]] == \
        [(1 << 32, 20 * MiB, "large"), (1 << 34, 2 * MiB, "small"), (1 << 36, 2 * MiB, "small")]
    assert simulate(events, initial=initial).stats["allocated_bytes.all.current"] == 4 * MiB + 3 * MiB


def test_bad_input_is_refused():
    gpu = CachingAllocator()
    with pytest.raises(KeyError):
        gpu.free(12345)
    with pytest.raises(ValueError, match="not allocated"):
        simulate([("free", "x", 0)])
    with pytest.raises(ValueError, match="overlaps"):
        CachingAllocator(initial=[Segment(1 << 32, 20 * MiB, ()), Segment((1 << 32) + 2 * MiB, 20 * MiB, ())])
    with pytest.raises(ValueError, match="power of two"):
        CachingAllocator(roundup_power2_divisions=3)


def test_the_module_needs_no_torch():
    """It imports nothing but the standard library, and runs where torch cannot be imported."""
    path = allocator.__file__
    tree = ast.parse(open(path, encoding="utf-8").read())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "bisect", "dataclasses", "typing"}, imported
    code = textwrap.dedent(f"""
        import importlib.util, sys
        sys.modules["torch"] = None  # import torch raises
        spec = importlib.util.spec_from_file_location("allocator", {path!r})
        module = importlib.util.module_from_spec(spec)
        sys.modules["allocator"] = module
        spec.loader.exec_module(module)
        print(module.simulate([("alloc", 1, 1000)]).stats["reserved_bytes.all.peak"])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(2 * MiB)
