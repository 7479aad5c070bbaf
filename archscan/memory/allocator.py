"""The CUDA caching allocator of torch 2.11, simulated: a sequence of allocations and frees in, the
segments it reserves and its ``torch.cuda.memory_stats()`` peaks out. Pure Python, no torch.

What it takes: requests in bytes as a program makes them (``CachingAllocator.malloc(size)`` /
``free(handle)``, or ``simulate(events)`` with events ``("alloc", key, size)`` and
``("free", key, size)``), optionally a starting state (``Segment``s holding live ``Block``s, as a
memory snapshot shows them: ``from_snapshot``), ``expandable_segments`` (as
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), a ``limit`` in bytes on what it may reserve
(what ``torch.cuda.set_per_process_memory_fraction`` enforces), ``max_split_size`` and
``roundup_power2_divisions``. What it gives: ``memory_stats()`` under torch's own keys
(``allocated_bytes.all.peak``, ``reserved_bytes.all.peak``, ``requested_bytes.all.peak``,
``segment.all.peak``, ``allocation.all.peak``...), the segments and blocks at any moment
(``segments()``), and an ``OutOfMemoryError`` (``simulate``: ``Replay.oom_at``) where torch raises
``torch.OutOfMemoryError``.

The rules, from c10/cuda/CUDACachingAllocator.cpp (torch 2.11; the constants are in
c10/core/AllocatorConfig.h):

* A request is rounded up to a multiple of 512 bytes (``kMinBlockSize``); with
  ``roundup_power2_divisions`` N, sizes above 512·N go up to the next of N equal steps between
  two powers of two.
* Rounded sizes up to 1 MiB (``kSmallSize``) take the small pool, larger ones the large pool; each
  pool (per stream) keeps its free blocks ordered by (size, address) and a request takes the first
  free block at least its size (best fit, the lowest address among equal sizes).
* With no free block, a segment is reserved (``cudaMalloc``): 2 MiB (``kSmallBuffer``) for the
  small pool, 20 MiB (``kLargeBuffer``) for a request under 10 MiB (``kMinLargeAlloc``), else the
  request rounded up to 2 MiB (``kRoundLarge``).
* The block handed out is split when what remains is at least 512 bytes (small pool) or more than
  1 MiB (large pool); otherwise the whole block is handed out and counted as allocated.
* A freed block merges with its free neighbours in the same segment.
* Blocks of ``max_split_size`` or more are never split, a request under it never takes one, and a
  request at or over it takes one only if it wastes less than ``max_non_split_rounding_size``
  (20 MiB by default); ``max_split_size`` is unlimited by default.
* With a ``limit``, a segment that would take the reserved bytes over it is not made; the allocator
  then frees the cached oversize blocks (with ``max_split_size`` set), then every cached segment with
  no live block (``release_cached_blocks``, what ``torch.cuda.empty_cache`` does), and tries once
  more before it gives up.
* With expandable segments each pool (per stream) has one segment of virtual addresses that grows
  by mapping pages (2 MiB in the small pool, 20 MiB in the large one) at the lowest free address
  that fits; every split leaving 512 bytes or more is made; ``empty_cache`` unmaps the free pages.
  Mapped pages count as reserved bytes but, as in torch, not as segments (``segment.all``).

Not modelled: several streams' events (``record_stream``: every free is complete at once), CUDA
graphs' private pools, ``garbage_collection_threshold``, IPC, a device running out of memory
before the limit. Where the driver puts a new segment is its own choice: addresses are made up
(increasing, never reused) unless ``segment_address`` gives them; they decide only which of two
free blocks of one size best fit takes, so the segment count can differ from a GPU's by one or two
over a long run (the bytes did not, in the runs of tests/test_cuda_allocator.py).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

K_MIN_BLOCK_SIZE = 512             # every block is a multiple of this
K_SMALL_SIZE = 1 << 20             # the largest request of the small pool
K_SMALL_BUFFER = 2 << 20           # a small-pool segment; an expandable small pool's page
K_MIN_LARGE_ALLOC = 10 << 20       # requests under this take a K_LARGE_BUFFER segment
K_LARGE_BUFFER = 20 << 20          # that segment; an expandable large pool's page
K_ROUND_LARGE = 2 << 20            # larger segments are rounded up to this
MAX_NON_SPLIT_ROUNDING = 20 << 20  # the default max_non_split_rounding_size

_KEY_SHIFT = 64                    # a free block's sort key: size << 64 | address
_ADDRESS_MASK = (1 << _KEY_SHIFT) - 1
_FIRST_ADDRESS = 1 << 40           # where made-up segment addresses start
_EXPANDABLE_SPACE = 1 << 44        # virtual bytes reserved for each expandable segment


class OutOfMemoryError(Exception):
    """A request the allocator could not serve under its limit, even after freeing its cache:
    ``size`` bytes asked for, a ``segment`` of so many bytes it could not reserve (what torch's
    message calls "Tried to allocate"), and the bytes allocated and reserved then."""

    def __init__(self, size: int, segment: int, allocated: int, reserved: int, limit: int | None):
        self.size, self.segment, self.allocated, self.reserved, self.limit = size, segment, allocated, reserved, limit
        super().__init__(f"out of memory: {size} bytes asked for, a {segment}-byte segment does not fit: "
                         f"{reserved} bytes reserved ({allocated} allocated) of {limit}")


@dataclass(frozen=True)
class Block:
    """One block of a segment: its address, its size (a multiple of 512) and, when allocated, the
    bytes asked for."""

    address: int
    size: int
    requested_size: int = 0
    allocated: bool = True


@dataclass(frozen=True)
class Segment:
    """One segment (a ``cudaMalloc``, or a mapped range of an expandable segment) and its blocks in
    address order. As a starting state only the allocated blocks count: the space between them is
    free, one block per gap."""

    address: int
    size: int
    blocks: tuple[Block, ...]
    pool: str = "large"            # "small" or "large"
    stream: int = 0
    expandable: bool = False


@dataclass(frozen=True)
class Replay:
    """What ``simulate`` found: the statistics at the end, under ``torch.cuda.memory_stats()``'s
    keys, and the event that ran out of memory (its index, None when none did; the replay stops
    there, as the program would) with its error."""

    stats: dict[str, int]
    oom_at: int | None = None
    oom_error: OutOfMemoryError | None = None

    @property
    def oom(self) -> bool:
        return self.oom_at is not None


class _Block:
    __slots__ = ("addr", "size", "req", "live", "prev", "next", "pool", "es", "mapped")

    def __init__(self, addr: int, size: int, pool: _Pool, es: _Expandable | None = None, mapped: bool = True):
        self.addr, self.size, self.pool, self.es, self.mapped = addr, size, pool, es, mapped
        self.req = 0
        self.live = False
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """The free blocks of one pool and stream, sorted by (size, address) as ints, and the
    unmapped blocks of its expandable segments by address."""

    __slots__ = ("small", "stream", "keys", "unmapped")

    def __init__(self, small: bool, stream: int):
        self.small, self.stream = small, stream
        self.keys: list[int] = []
        self.unmapped: list[int] = []


class _Expandable:
    __slots__ = ("base", "page", "size")

    def __init__(self, base: int, page: int, size: int):
        self.base, self.page, self.size = base, page, size


def round_size(size: int, divisions: int = 0) -> int:
    """The block size of a request: ``round_size`` of the C++ source."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        if size & (size - 1) == 0:
            return size
        floor = 1 << (size.bit_length() - 1)
        step = floor >> (divisions.bit_length() - 1)  # floor / divisions, divisions a power of two
        if step == 0:
            return floor << 1
        below = size & ~(step - 1)
        return size if below == size else below + step
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """The segment reserved for a rounded request no free block can take: ``get_allocation_size``."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


class CachingAllocator:
    """One device's caching allocator. ``malloc`` returns the block's (made-up) address, the handle
    ``free`` takes back; ``memory_stats()`` reads like torch's.

    Args:
        expandable_segments: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
        limit: the most bytes it may reserve (None: no limit).
        max_split_size: blocks this large or larger are never split (None: unlimited, torch's default).
        max_non_split_rounding_size: how much larger than a request at or over ``max_split_size`` a
            block it takes may be.
        roundup_power2_divisions: one division count for every size (0: off, torch's default).
        initial: segments to start from, their allocated blocks live (handles: their addresses).
        segment_address: where a new segment of so many bytes goes (the CUDA driver's choice, which
            decides which of two free blocks of one size is taken; an expandable segment asks for
            its whole virtual space); None: made-up addresses, increasing, never reused.
        device_memory: the device's memory in bytes; an expandable segment reserves 9/8 of it in
            virtual addresses, as torch does (None: 16 TiB).
    """

    def __init__(self, *, expandable_segments: bool = False, limit: int | None = None,
                 max_split_size: int | None = None, max_non_split_rounding_size: int = MAX_NON_SPLIT_ROUNDING,
                 roundup_power2_divisions: int = 0, initial: Iterable[Segment] = (),
                 segment_address: Callable[[int], int] | None = None, device_memory: int | None = None):
        if roundup_power2_divisions > 1 and roundup_power2_divisions & (roundup_power2_divisions - 1):
            raise ValueError(f"roundup_power2_divisions must be a power of two, not {roundup_power2_divisions}")
        self.expandable_segments = expandable_segments
        self.limit = limit
        self.max_split_size = max_split_size if max_split_size is not None else 1 << 64
        self._oversize = max_split_size is not None
        self.max_non_split_rounding_size = max_non_split_rounding_size
        self.divisions = roundup_power2_divisions
        self._pools: dict[int, _Pool] = {}             # stream << 1 | small -> its pool
        self._free: dict[int, _Block] = {}             # address -> free mapped block
        self._unmapped: dict[int, _Block] = {}         # address -> unmapped block of an expandable segment
        self._live: dict[int, _Block] = {}             # address -> allocated block
        self._segments: dict[int, _Pool] = {}          # a cudaMalloc'd segment's address -> its pool
        self._expandables: dict[int, _Expandable] = {}  # an expandable segment's address -> it
        self._next_address = _FIRST_ADDRESS
        self._place = segment_address
        self.device_memory = device_memory
        self._ranges: list[int] = []                   # every segment's address, sorted ...
        self._range_size: dict[int, int] = {}          # ... and its size (an expandable one's whole space)
        self.allocated = self.allocated_peak = 0
        self.reserved = self.reserved_peak = 0
        self.requested = self.requested_peak = 0
        self.segment_count = self.segment_peak = 0
        self.allocations = self.allocations_peak = 0
        self.num_alloc_retries = self.num_ooms = self.num_device_alloc = self.num_device_free = 0
        for segment in initial:
            self._load(segment)

    # --- the public face ------------------------------------------------------------------------

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes; the handle is the block's address (0 for 0 bytes, as torch
        hands out no block for them). Raises ``OutOfMemoryError``."""
        if size <= 0:
            if size < 0:
                raise ValueError(f"a negative size: {size}")
            return 0
        rsize = round_size(size, self.divisions) if self.divisions else \
            (size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE
        small = rsize <= K_SMALL_SIZE
        pool = self._pools.get(stream << 1 | small)
        if pool is None:
            pool = self._pools[stream << 1 | small] = _Pool(small, stream)
        # best fit: the first free block of at least rsize bytes (get_free_block)
        keys = pool.keys
        i = bisect_left(keys, rsize << _KEY_SHIFT)
        block = None
        if i < len(keys):
            block = self._free[keys[i] & _ADDRESS_MASK]
            if block.es is None and not self._oversize:
                del keys[i]
                del self._free[block.addr]
            else:
                block = self._free_block(pool, rsize, i, block)
        if block is None:
            alloc_size = allocation_size(rsize)
            block = self._alloc_block(pool, rsize, alloc_size)
            if block is None and self._release_available(pool, rsize):
                block = self._alloc_block(pool, rsize, alloc_size)
            if block is None:
                self._release_cached()
                self.num_alloc_retries += 1
                block = self._alloc_block(pool, rsize, alloc_size)
            if block is None:
                self.num_ooms += 1
                raise OutOfMemoryError(size, alloc_size, self.allocated, self.reserved, self.limit)
        remaining = block.size - rsize
        if small or self.expandable_segments:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = remaining > K_SMALL_SIZE and rsize < self.max_split_size
        if split:  # the block keeps the front; the rest is a new free block after it
            rest = _Block(block.addr + rsize, remaining, pool, block.es)
            nxt = block.next
            rest.prev, rest.next = block, nxt
            if nxt is not None:
                nxt.prev = rest
            block.next = rest
            block.size = rsize
            insort(keys, remaining << _KEY_SHIFT | rest.addr)
            self._free[rest.addr] = rest
        block.live = True
        block.req = size
        self._live[block.addr] = block
        self.allocated += block.size
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        self.requested += size
        if self.requested > self.requested_peak:
            self.requested_peak = self.requested
        self.allocations += 1
        if self.allocations > self.allocations_peak:
            self.allocations_peak = self.allocations
        return block.addr

    def free(self, handle: int) -> None:
        """Give a block back: it joins its pool's free blocks, merged with its free neighbours."""
        if handle == 0:
            return
        block = self._live.pop(handle, None)
        if block is None:
            raise KeyError(f"no live block at {handle:#x}")
        block.live = False
        self.allocated -= block.size
        self.requested -= block.req
        self.allocations -= 1
        block.req = 0
        keys, free = block.pool.keys, self._free
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.live and prev.mapped:  # [prev block] -> one block
            del keys[bisect_left(keys, prev.size << _KEY_SHIFT | prev.addr)]
            del free[prev.addr]
            block.addr, block.size = prev.addr, block.size + prev.size
            block.prev = prev = prev.prev
            if prev is not None:
                prev.next = block
        if nxt is not None and not nxt.live and nxt.mapped:  # [block next] -> one block
            del keys[bisect_left(keys, nxt.size << _KEY_SHIFT | nxt.addr)]
            del free[nxt.addr]
            block.size += nxt.size
            block.next = nxt = nxt.next
            if nxt is not None:
                nxt.prev = block
        insort(keys, block.size << _KEY_SHIFT | block.addr)
        free[block.addr] = block

    def run(self, events: Iterable[Sequence[Any]]) -> Replay:
        """Replay ``("alloc", key, size)`` / ``("free", key, size)`` events (``simulate``'s) from
        the state now; the live blocks are named by their addresses. Stops at the first request
        that runs out of memory."""
        handles: dict[Any, int] = {addr: addr for addr in self._live}
        malloc, free = self.malloc, self.free
        for i, (op, key, size) in enumerate(events):
            if op == "alloc":
                try:
                    handles[key] = malloc(size)
                except OutOfMemoryError as error:
                    return Replay(self.memory_stats(), i, error)
            elif op == "free" or op == "free_requested":
                handle = handles.pop(key, None)
                if handle is None:
                    raise ValueError(f"event {i} frees {key!r}, which is not allocated")
                free(handle)
            else:
                raise ValueError(f"event {i}: {op!r} is neither 'alloc' nor 'free'")
        return Replay(self.memory_stats())

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: free every cached segment with no live block (unmap every
        free page of an expandable segment)."""
        self._release_cached()

    def reset_peak_stats(self) -> None:
        """``torch.cuda.reset_peak_memory_stats()``: every peak back to its current value."""
        self.allocated_peak, self.reserved_peak = self.allocated, self.reserved
        self.requested_peak, self.segment_peak = self.requested, self.segment_count
        self.allocations_peak = self.allocations

    def memory_stats(self) -> dict[str, int]:
        """The statistics under ``torch.cuda.memory_stats()``'s keys (a freed block is inactive at
        once, no other stream holding it: ``active_bytes`` is ``allocated_bytes``)."""
        return {
            "allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.allocated_peak,
            "active_bytes.all.current": self.allocated, "active_bytes.all.peak": self.allocated_peak,
            "reserved_bytes.all.current": self.reserved, "reserved_bytes.all.peak": self.reserved_peak,
            "requested_bytes.all.current": self.requested, "requested_bytes.all.peak": self.requested_peak,
            "segment.all.current": self.segment_count, "segment.all.peak": self.segment_peak,
            "allocation.all.current": self.allocations, "allocation.all.peak": self.allocations_peak,
            "num_alloc_retries": self.num_alloc_retries, "num_ooms": self.num_ooms,
            "num_device_alloc": self.num_device_alloc, "num_device_free": self.num_device_free,
        }

    def segments(self) -> list[Segment]:
        """The segments and their blocks now, in address order (an expandable segment's mapped
        ranges each as one segment, as torch's snapshot shows them)."""
        heads = []
        for block in (*self._free.values(), *self._live.values()):
            if block.prev is None or not block.prev.mapped:
                heads.append(block)
        out = []
        for head in sorted(heads, key=lambda b: b.addr):
            blocks, b = [], head
            while b is not None and b.mapped:
                blocks.append(Block(b.addr, b.size, b.req, b.live))
                b = b.next
            out.append(Segment(head.addr, sum(x.size for x in blocks), tuple(blocks),
                               "small" if head.pool.small else "large", head.pool.stream, head.es is not None))
        return out

    # --- pools and free blocks ------------------------------------------------------------------

    def _pool(self, small: bool, stream: int) -> _Pool:
        pool = self._pools.get(stream << 1 | small)
        if pool is None:
            pool = self._pools[stream << 1 | small] = _Pool(small, stream)
        return pool

    def _insert(self, block: _Block) -> None:
        insort(block.pool.keys, block.size << _KEY_SHIFT | block.addr)
        self._free[block.addr] = block

    def _remove(self, block: _Block) -> None:
        keys = block.pool.keys
        del keys[bisect_left(keys, block.size << _KEY_SHIFT | block.addr)]
        del self._free[block.addr]

    def _free_block(self, pool: _Pool, size: int, i: int, block: _Block) -> _Block | None:
        """``get_free_block`` past its first candidate ``block`` (at ``i``): expandable blocks and
        ``max_split_size``'s oversize blocks."""
        keys = pool.keys
        if block.es is not None:
            if self.expandable_segments:
                # a block that can grow counts as the size it can grow to: take a smaller one first
                while i + 1 < len(keys):
                    nxt = self._free[keys[i + 1] & _ADDRESS_MASK]
                    if _expandable_size(nxt) >= _expandable_size(block):
                        break
                    i, block = i + 1, nxt
                    if block.es is None:
                        break
            else:  # expandable segments turned off: only ordinary blocks
                while block.es is not None:
                    i += 1
                    if i == len(keys):
                        return None
                    block = self._free[keys[i] & _ADDRESS_MASK]
        if size < self.max_split_size <= block.size:
            return None
        if size >= self.max_split_size and block.size >= size + self.max_non_split_rounding_size:
            return None
        del keys[i]
        del self._free[block.addr]
        return block

    # --- segments -------------------------------------------------------------------------------

    def _alloc_block(self, pool: _Pool, size: int, alloc_size: int) -> _Block | None:
        """A new segment (or newly mapped pages) for a request, None over the limit: ``alloc_block``."""
        if self.limit is not None and self.reserved + alloc_size > self.limit:
            return None
        if self.expandable_segments:
            return self._grow(pool, size)
        addr = self._new_address(alloc_size)
        block = _Block(addr, alloc_size, pool)
        self._segments[addr] = pool
        self.reserved += alloc_size
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
        self.segment_count += 1
        if self.segment_count > self.segment_peak:
            self.segment_peak = self.segment_count
        self.num_device_alloc += 1
        return block

    def _new_address(self, size: int) -> int:
        if self._place is None:
            addr = self._next_address
            self._next_address += -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
        else:
            addr = self._place(size)
        self._claim(addr, size)
        return addr

    def _claim(self, addr: int, size: int) -> None:
        """Note a segment's address range; two segments never overlap."""
        i = bisect_left(self._ranges, addr)
        below = self._ranges[i - 1] if i else None
        above = self._ranges[i] if i < len(self._ranges) else None
        if (below is not None and below + self._range_size[below] > addr) or \
                (above is not None and addr + size > above):
            raise ValueError(f"a segment at {addr:#x} of {size} bytes overlaps another")
        self._ranges.insert(i, addr)
        self._range_size[addr] = size

    def _unclaim(self, addr: int) -> None:
        del self._ranges[bisect_left(self._ranges, addr)]
        del self._range_size[addr]

    def _release_available(self, pool: _Pool, size: int) -> bool:
        """Free cached oversize blocks (whole segments) until one request fits:
        ``release_available_cached_blocks``; nothing to do without ``max_split_size``."""
        if not self._oversize:
            return False
        keys = pool.keys
        want = max(size, self.max_split_size)
        i = bisect_left(keys, want << _KEY_SHIFT)
        if i < len(keys) and self._free[keys[i] & _ADDRESS_MASK].es is None:
            block = self._free[keys[i] & _ADDRESS_MASK]
            if block.prev is None and block.next is None:
                self._release(block)
            return True
        released = 0
        i -= 1
        while released < want and i >= 0:
            block = self._free[keys[i] & _ADDRESS_MASK]
            if block.size < self.max_split_size:
                break
            if block.es is None and block.prev is None and block.next is None:
                released += block.size
                self._release(block)
            i -= 1
        return released >= want

    def _release(self, block: _Block) -> None:
        """Give a whole cudaMalloc'd segment back: ``release_block``."""
        self._remove(block)
        del self._segments[block.addr]
        self._unclaim(block.addr)
        self.reserved -= block.size
        self.segment_count -= 1
        self.num_device_free += 1

    def _release_cached(self) -> None:
        """Free every free whole segment, unmap every free page: ``release_cached_blocks``."""
        for _, pool in sorted(self._pools.items()):
            expandable = []
            for key in list(pool.keys):
                block = self._free[key & _ADDRESS_MASK]
                if block.es is not None:
                    expandable.append(block)
                elif block.prev is None and block.next is None:
                    self._release(block)
            for block in expandable:
                self._unmap(block)

    def _load(self, segment: Segment) -> None:
        """Place a starting segment: its live blocks where they are, one free block per gap."""
        if segment.expandable:
            raise ValueError("a starting state with expandable segments is not supported, only cudaMalloc'd ones")
        pool = self._pool(segment.pool == "small", segment.stream)
        self._segments[segment.address] = pool
        self._claim(segment.address, segment.size)
        self.reserved += segment.size
        self.segment_count += 1
        end = segment.address + segment.size
        self._next_address = max(self._next_address, -(-end // K_ROUND_LARGE) * K_ROUND_LARGE)
        at, prev = segment.address, None
        pieces = []
        for b in sorted((b for b in segment.blocks if b.allocated), key=lambda b: b.address):
            if b.address < at or b.address + b.size > end or b.size % K_MIN_BLOCK_SIZE:
                raise ValueError(f"block {b} does not fit segment {segment.address:#x}+{segment.size}")
            if b.address > at:
                pieces.append((at, b.address - at, None))
            pieces.append((b.address, b.size, b))
            at = b.address + b.size
        if at < end:
            pieces.append((at, end - at, None))
        for addr, size, b in pieces:
            block = _Block(addr, size, pool)
            block.prev = prev
            if prev is not None:
                prev.next = block
            prev = block
            if b is None:
                self._insert(block)
            else:
                block.live, block.req = True, b.requested_size
                self._live[addr] = block
                self.allocated += size
                self.requested += b.requested_size
                self.allocations += 1
        self.reset_peak_stats()

    # --- expandable segments --------------------------------------------------------------------

    def _grow(self, pool: _Pool, size: int) -> _Block | None:
        """Map pages for a request at the lowest address of the pool's expandable segment where it
        fits: ``try_allocate_expandable_block``."""
        candidate = self._expandable_room(pool, size)
        if not candidate.mapped:
            self._map(candidate, min(candidate.size, size))
        while candidate.size < size:  # a free block, then unmapped space: map onto its end
            nxt = candidate.next
            self._map(nxt, min(size - candidate.size, nxt.size))
            candidate = nxt
        self._remove(candidate)
        return candidate

    def _expandable_room(self, pool: _Pool, size: int) -> _Block:
        """The lowest-addressed free-or-unmapped run of at least ``size`` bytes, in a new
        expandable segment if none has one: ``find_expandable_block``."""
        for addr in pool.unmapped:
            c = self._unmapped[addr]
            if c.prev is not None and not c.prev.live:
                c = c.prev
            room, b = 0, c
            while room < size and b is not None and not b.live:
                room += b.size
                b = b.next
            if room >= size:
                return c
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        if self.device_memory is None:
            space = _EXPANDABLE_SPACE // page * page
        else:
            space = -(-(self.device_memory + self.device_memory // 8) // page) * page
        base = self._new_address(space)
        self._expandables[base] = _Expandable(base, page, space)
        block = _Block(base, space, pool, self._expandables[base], mapped=False)
        insort(pool.unmapped, base)
        self._unmapped[base] = block
        return block

    def _map(self, block: _Block, size: int) -> None:
        """Map whole pages from the start of an unmapped block over ``size`` bytes: ``map_block``."""
        page = block.es.page
        mapped = -(-size // page) * page
        pool = block.pool
        del pool.unmapped[bisect_left(pool.unmapped, block.addr)]
        del self._unmapped[block.addr]
        block.mapped = True
        if mapped < block.size:
            rest = _Block(block.addr + mapped, block.size - mapped, pool, block.es, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            insort(pool.unmapped, rest.addr)
            self._unmapped[rest.addr] = rest
        prev = block.prev
        if prev is not None and not prev.live and prev.mapped:
            self._remove(prev)
            block.addr, block.size = prev.addr, block.size + prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        nxt = block.next
        if nxt is not None and not nxt.live and nxt.mapped:
            self._remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        self._insert(block)
        self.reserved += mapped
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
        self.num_device_alloc += 1

    def _unmap(self, block: _Block) -> None:
        """Unmap the whole pages inside a free block, keeping the partial pages at its ends as free
        blocks: ``unmap_block``; a segment left with nothing mapped is given back."""
        es, pool = block.es, block.pool
        lo = -(-(block.addr - es.base) // es.page)
        hi = (block.addr + block.size - es.base) // es.page
        if lo >= hi:
            return
        start, end = es.base + lo * es.page, es.base + hi * es.page
        self._remove(block)
        if start > block.addr:
            before = _Block(block.addr, start - block.addr, pool, es)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            self._insert(before)
        if end < block.addr + block.size:
            after = _Block(end, block.addr + block.size - end, pool, es)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            self._insert(after)
        block.addr, block.size, block.mapped = start, end - start, False
        for side in (block.prev, block.next):  # merge with unmapped neighbours
            if side is None or side.mapped:
                continue
            del pool.unmapped[bisect_left(pool.unmapped, side.addr)]
            del self._unmapped[side.addr]
            if side is block.prev:
                block.addr, block.size, block.prev = side.addr, block.size + side.size, side.prev
                if side.prev is not None:
                    side.prev.next = block
            else:
                block.size, block.next = block.size + side.size, side.next
                if side.next is not None:
                    side.next.prev = block
        self.reserved -= end - start
        self.num_device_free += 1
        if block.prev is None and block.next is None:  # nothing mapped: the segment goes
            del self._expandables[es.base]
            self._unclaim(es.base)
            return
        insort(pool.unmapped, block.addr)
        self._unmapped[block.addr] = block


def _expandable_size(block: _Block) -> int:
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def simulate(events: Iterable[Sequence[Any]], *, expandable_segments: bool = False, limit: int | None = None,
             initial: Iterable[Segment] = (), **options: Any) -> Replay:
    """Replay allocations and frees through a ``CachingAllocator``.

    Args:
        events: ``("alloc", key, size)`` and ``("free", key, size)`` in order (``"free_requested"``
            is read as ``"free"``); a key names one live allocation, a starting state's blocks are
            named by their addresses.
        expandable_segments, limit, options: as ``CachingAllocator`` takes them.
        initial: the segments to start from (``from_snapshot``); peaks count from that state.

    Returns:
        A ``Replay``: ``memory_stats()`` at the end, or where the first request ran out of memory.
    """
    allocator = CachingAllocator(expandable_segments=expandable_segments, limit=limit, initial=initial, **options)
    return allocator.run(events)


def rounded_sum_peak(events: Iterable[Sequence[Any]], initial: Iterable[Segment] = ()) -> int:
    """The peak of the blocks counted as their requests rounded to 512 bytes (``round_size``), from
    the starting blocks: what the allocated peak would be if a large block were always split (the
    simulator's ``allocated_bytes.all.peak`` is this or more)."""
    now = peak = sum(b.size for s in initial for b in s.blocks)
    size_of = {}
    for op, key, size in events:
        if op == "alloc":
            size_of[key] = round_size(size)
            now += size_of[key]
            peak = max(peak, now)
        else:
            now -= size_of.pop(key)
    return peak


def from_snapshot(snapshot: dict, device: int = 0, *, empty_cache: bool = True) -> tuple[list[Segment], list[tuple]]:
    """The start of a run recorded by ``torch.cuda.memory._record_memory_history`` and the run's
    requests, from ``torch.cuda.memory._snapshot()`` taken at its end (the whole run in the trace).

    The segments at the end are rolled back to the start: those the trace made go, those it freed
    come back, and a block is live if it is allocated at the end and the trace does not leave it
    allocated, or the trace frees it before allocating it (its size then: its request rounded, a
    block that was not split being larger). With ``empty_cache`` only the segments holding a live
    block stay, as after ``torch.cuda.empty_cache()``. The events are the trace's ``alloc`` (its
    requested size) and ``free_requested``, keyed by address.
    """
    events, made, left, freed_first = [], set(), set(), {}
    segments_made, segments_freed = set(), {}
    for entry in snapshot["device_traces"][device]:
        action, addr = entry["action"], entry.get("addr")
        if action == "alloc":
            events.append(("alloc", addr, entry["size"]))
            made.add(addr)
            left.add(addr)
        elif action == "free_requested":
            events.append(("free", addr, entry["size"]))
            if addr in left:
                left.discard(addr)
            elif addr not in made:
                freed_first[addr] = entry["size"]
        elif action == "segment_alloc":
            segments_made.add(addr)
        elif action == "segment_free" and addr not in segments_made:
            segments_freed[addr] = entry["size"]
    ends = [(seg["address"], seg["total_size"], seg["segment_type"], seg.get("stream", 0),
             bool(seg.get("is_expandable", False)), seg["blocks"]) for seg in snapshot["segments"]
            if seg.get("device", device) == device and seg["address"] not in segments_made]
    ends += [(addr, size, "small" if size == K_SMALL_BUFFER else "large", 0, False, [])
             for addr, size in segments_freed.items()]
    segments = []
    for start, size, kind, stream, expandable, blocks in sorted(ends):
        live = [Block(b["address"], b["size"], b["requested_size"]) for b in blocks
                if b["state"].startswith("active") and b["address"] not in left]
        live += [Block(addr, round_size(req), req) for addr, req in freed_first.items() if start <= addr < start + size]
        if empty_cache and not live:
            continue
        segments.append(Segment(start, size, tuple(sorted(live, key=lambda b: b.address)),
                                "small" if kind == "small" else "large", stream, expandable))
    return segments, events
