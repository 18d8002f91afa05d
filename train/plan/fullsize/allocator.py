"""A model of PyTorch's CUDA caching allocator, replaying a full-size run's allocations and frees.

    python -m pytest -q -n 0 tests/test_fullsize.py -k allocator

Rules (torch's c10/cuda/CUDACachingAllocator.cpp, the default configuration; the model is this
project's own code on those rules):
- every request is rounded up to 512 bytes (kMinBlockSize); a request of at most 1 MiB (kSmallSize)
  goes to the small pool, a larger one to the large pool; a block never moves between pools;
- a request takes the smallest free block of its pool that holds it (best fit; ties: the older
  segment, the lower offset);
- none free: a new segment (cudaMalloc) of 2 MiB (kSmallBuffer) for a small request, of 20 MiB
  (kLargeBuffer) for a request under 10 MiB (kMinLargeAlloc), else the request rounded up to 2 MiB
  (kRoundLarge);
- a block larger than the request is split when what remains is at least 512 bytes (small pool)
  or more than 1 MiB (large pool); a freed block merges with its free neighbours in its segment;
- a cudaMalloc that would pass the device's capacity first frees every cached segment with nothing
  allocated in it (release_cached_blocks), then retries; beyond, out of memory.
With ``expandable_segments:True`` (PYTORCH_CUDA_ALLOC_CONF), each pool is one segment of address
space that grows at its end by pages of 2 MiB (small) or 20 MiB (large) when no free block holds a
request, the free block at its end growing with it; any block splits when 512 bytes or more remain.
Each stream has its own pools (a block freed returns to the pool of the stream it was allocated
on, and serves only that stream's requests); ``stream`` is an index the caller gives (0: the default).
Reserved is the bytes of segments (mapped pages); allocated the bytes of allocated blocks (rounded).
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(n: int) -> int:
    """A request rounded as the allocator rounds it (at least 512 bytes, a multiple of 512)."""
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def allocation_size(n: int) -> int:
    """The segment cudaMalloc'ed for a rounded request n that no free block holds."""
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-n // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class Block:
    """A block of one segment: [offset, offset + size) of segment ``seg``; prev/next its neighbours."""

    seg: int
    offset: int
    size: int
    small: bool
    stream: int = 0
    free: bool = True
    prev: "Block | None" = None
    next: "Block | None" = None

    def key(self):
        return (self.size, self.seg, self.offset)

    def pool(self):
        return (self.stream, self.small)


class OutOfMemory(Exception):
    """The replay needed more than the capacity: ``needed`` bytes of a new segment with ``reserved``
    bytes already reserved (after cached segments were freed)."""

    def __init__(self, needed: int, reserved: int, capacity: int):
        super().__init__(f"cudaMalloc of {needed} bytes with {reserved} reserved > capacity {capacity}")
        self.needed, self.reserved, self.capacity = needed, reserved, capacity


@dataclass
class Allocator:
    """The caching allocator's state. capacity: bytes it may reserve (None: unlimited);
    expandable: expandable_segments:True. Counters: allocated, reserved and their peaks (bytes),
    segments made (cudaMalloc calls), retries (a malloc that freed cached segments first)."""

    capacity: int | None = None
    expandable: bool = False
    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    mallocs: int = 0
    retries: int = 0
    _free: dict = field(default_factory=lambda: defaultdict(list))  # (stream, small?) -> sorted keys
    _by_key: dict = field(default_factory=dict)
    _segments: dict = field(default_factory=dict)  # seg -> [size, first block]
    _ends: dict = field(default_factory=dict)  # expandable: (stream, small?) -> (seg, mapped bytes)

    # -- free lists
    def _add_free(self, b: Block) -> None:
        bisect.insort(self._free[b.pool()], b.key())
        self._by_key[b.key()] = b

    def _drop_free(self, b: Block) -> None:
        keys = self._free[b.pool()]
        del keys[bisect.bisect_left(keys, b.key())]
        del self._by_key[b.key()]

    def _best_fit(self, n: int, pool: tuple) -> Block | None:
        keys = self._free[pool]
        i = bisect.bisect_left(keys, (n, -1, -1))
        return self._by_key[keys[i]] if i < len(keys) else None

    # -- segments
    def _new_segment(self, n: int, small: bool, stream: int) -> Block:
        size = allocation_size(n)
        if self.capacity is not None and self.reserved + size > self.capacity:
            self.retries += 1
            self.release_cached()
            if self.reserved + size > self.capacity:
                raise OutOfMemory(size, self.reserved, self.capacity)
        seg = len(self._segments) + 1 + max(self._segments, default=0)
        b = Block(seg, 0, size, small, stream)
        self._segments[seg] = [size, b]
        self.reserved += size
        self.mallocs += 1
        return b

    def _grow(self, n: int, small: bool, stream: int) -> Block:
        """expandable: the free block at the end of the pool's segment, grown to hold n."""
        page = SMALL_BUFFER if small else LARGE_BUFFER
        seg, mapped = self._ends.get((stream, small), (None, 0))
        if seg is None:
            seg = len(self._segments) + 1 + max(self._segments, default=0)
            self._segments[seg] = [0, None]
        last = self._segments[seg][1]
        while last is not None and last.next is not None:
            last = last.next
        if last is not None and last.free:
            self._drop_free(last)
            start = last.offset
        else:
            start = mapped
            last = None
        new_mapped = max(mapped, -(-(start + n) // page) * page)
        grow = new_mapped - mapped
        if self.capacity is not None and self.reserved + grow > self.capacity:
            if last is not None:
                self._add_free(last)
            raise OutOfMemory(grow, self.reserved, self.capacity)
        self.reserved += grow
        self.mallocs += 1 if grow else 0
        self._ends[(stream, small)] = (seg, new_mapped)
        self._segments[seg][0] = new_mapped
        if last is None:
            tail = self._segments[seg][1]
            while tail is not None and tail.next is not None:
                tail = tail.next
            last = Block(seg, start, new_mapped - start, small, stream, prev=tail)
            if tail is None:
                self._segments[seg][1] = last
            else:
                tail.next = last
        else:
            last.size = new_mapped - start
        return last

    def release_cached(self) -> int:
        """Free every segment with nothing allocated (torch's release_cached_blocks; empty_cache).
        Returns the bytes released."""
        gone = 0
        for seg, (size, first) in list(self._segments.items()):
            if first is not None and first.free and first.next is None and seg not in {s for s, _ in self._ends.values()}:
                self._drop_free(first)
                del self._segments[seg]
                self.reserved -= size
                gone += size
        return gone

    # -- the two calls
    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        """Allocate nbytes on ``stream``; the Block handed out. Raises OutOfMemory past the capacity."""
        n = round_size(nbytes)
        small = n <= SMALL_SIZE
        b = self._best_fit(n, (stream, small))
        if b is not None:
            self._drop_free(b)
        elif self.expandable:
            b = self._grow(n, small, stream)
        else:
            b = self._new_segment(n, small, stream)
        rest = b.size - n
        if rest >= MIN_BLOCK if (small or self.expandable) else rest > SMALL_SIZE:
            tail = Block(b.seg, b.offset + n, rest, small, b.stream, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = tail
            b.next, b.size = tail, n
            self._add_free(tail)
        b.free = False
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return b

    def free(self, b: Block) -> None:
        """Return block b to its pool, merged with its free neighbours."""
        self.allocated -= b.size
        b.free = True
        for other in (b.prev, b.next):
            if other is not None and other.free:
                self._drop_free(other)
                if other is b.prev:
                    other.size += b.size
                    other.next = b.next
                    if b.next is not None:
                        b.next.prev = other
                    if self._segments[b.seg][1] is b:
                        self._segments[b.seg][1] = other
                    b = other
                else:
                    b.size += other.size
                    b.next = other.next
                    if other.next is not None:
                        other.next.prev = b
        self._add_free(b)
