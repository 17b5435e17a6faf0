"""vLLM v1's automatic prefix caching for one replica: hashed full blocks, reference counts and an
LRU free queue, with block identities as integers (the traffic's `PrefixKeys`).

The rules, from vLLM (repo vllm-project/vllm, read at the commits given):

* A block is cached once it is full: `KVCacheManager.allocate_slots` caches, when it schedules a
  chunk, every full block up to `min(num_computed + num_new_tokens, request.num_tokens)` (draft
  tokens are never cached) (vllm/v1/core/kv_cache_manager.py @003df2961dd8830c317a61f9745ccd557da9fa06,
  "num_tokens_to_cache"; `BlockPool.cache_full_blocks` in vllm/v1/core/block_pool.py).
* A new or resumed request (`num_computed_tokens == 0`) starts at its longest cached prefix of full
  blocks, looked up left to right and stopped at the first miss
  (`FullAttentionManager.find_longest_cache_hit`, vllm/v1/core/single_type_kv_cache_manager.py),
  capped at `request.num_tokens - 1` tokens so that the last token is computed for its logits
  (`get_computed_blocks`: "max_cache_hit_length = request.num_tokens - 1"); with an EAGLE-family
  drafter (`SpeculativeConfig.use_eagle()`: eagle, eagle3, mtp, dflash, dspark, vllm/config/speculative.py)
  the last matched block is dropped ("Need to drop the last matched block if eagle is enabled").
* A hit block is shared: `BlockPool.touch` raises its reference count and, if nobody held it
  (an evictable block, reference count 0), takes it out of the free queue, so admitting a request
  costs its new blocks plus its evictable hit blocks (`get_num_blocks_to_allocate`).
* `KVCacheManager.free` releases a request's blocks in reverse order ("so that the tail blocks are
  evicted first"); a block whose count falls to 0 goes to the tail of the free queue
  (`FreeKVCacheBlockQueue`, vllm/v1/core/kv_cache_utils.py) and stays cached, hittable, until
  `BlockPool.get_new_blocks` pops it from the head for a new allocation and evicts its hash.
* The hit-rate counters: `PrefixCacheStats.record(num_tokens, num_hits, preempted)`
  (vllm/v1/metrics/stats.py), recorded when the request is admitted ("Record at admission so
  unscheduled lookups are not counted", vllm/v1/core/sched/scheduler.py); resumed (preempted)
  requests are counted apart, and `prefix_cache_hits / prefix_cache_queries` counts new ones.

Memory here is the engine's KV units (`kv_blocks_for`: bytes over a block's bytes, which for a
model with sliding-window layers or a drafter's KV is not one unit per 16 tokens): block j of a
request stands for the units `kv_blocks_for((j + 1) * bs) - kv_blocks_for(j * bs)` (one for a plain
full-attention model), so the units a request holds are unchanged by caching.

Allocations are not told to this object one by one: the replica keeps its free-unit count, and
the units the free queue holds beyond it are allocations not yet taken from the queue's head. They
are taken (evicting what they pop) before anything looks at or changes the queue's order. Taking
them later is exact: they come from the head, which frees (appended at the tail) do not reach.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestBlocks:
    """What a running request holds in the cache: the keys of its cached blocks in block order
    (blocks it computed while an equal block was already cached stay anonymous), and how many of its
    leading full blocks have been through `cache`."""

    keys: list[int]                    # its block identities (PrefixKeys.block_keys), maybe fewer than its blocks
    held: list[int] = field(default_factory=list)
    num_cached: int = 0
    held_units: int = 0


@dataclass
class HitCounters:
    """vLLM's PrefixCacheStats: tokens looked up and found, new and resumed requests apart."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    def add(self, other: "HitCounters") -> "HitCounters":
        return HitCounters(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple())))

    def as_tuple(self) -> tuple[int, ...]:
        return (self.requests, self.queries, self.hits, self.preempted_requests, self.preempted_queries,
                self.preempted_hits)

    def summary(self) -> dict[str, float | int]:
        return {
            "prefix_cache_hit_rate": self.hits / self.queries if self.queries else 0.0,
            "prefix_cache_queries_tokens": self.queries,
            "prefix_cache_hits_tokens": self.hits,
            "requests": self.requests,
            "preempted_hit_rate": self.preempted_hits / self.preempted_queries if self.preempted_queries else 0.0,
            "preempted_queries_tokens": self.preempted_queries,
            "preempted_hits_tokens": self.preempted_hits,
        }


class PrefixCache:
    """The block pool of one replica with caching on (see the module docstring)."""

    def __init__(self, num_blocks: int, block_size: int, units_at: Any, drop_last_hit: bool = False):
        self.block_size = block_size
        self.drop_last_hit = drop_last_hit
        self._units_at = units_at          # kv units held at t tokens: the replica's TokenTable (.lookup)
        self._fresh = num_blocks           # never-used units, at the head of the free queue
        # then, in the order freed, entries (key, tag) in two deques (plain ints, which the garbage
        # collector does not track, unlike tuples); an entry is live while _tag[key] is its tag (a hit
        # takes a block off the queue by dropping its tag: the stale entry is skipped when popped)
        self._queue: deque[int] = deque()
        self._queue_tags: deque[int] = deque()
        self._tag: dict[int, int] = {}     # keys in the free queue -> the tag of their live entry
        self._next_tag = 0
        self._anonymous: dict[int, int] = {}   # keys < 0: runs of anonymous units -> their units
        self._queued = 0                   # units in the free queue
        self._next_anonymous = -1
        self.ref: dict[int, int] = {}      # cached key -> requests holding it (0: evictable, in the queue)
        self.units: dict[int, int] = {}    # cached key -> its kv units (unless every block is one unit)
        self.counters = HitCounters()
        self.evicted = 0                   # cached blocks evicted for new allocations
        # one kv unit per block (a plain full-attention model): the units need not be looked up
        self.uniform = units_at.lookup(range(0, 8192 * block_size + 1, block_size)) == list(range(8193))

    # -------------------------------------------------------------- the free queue
    @property
    def queued_units(self) -> int:
        """Units in the free queue, counting allocations not yet taken from its head."""
        return self._fresh + self._queued

    def take(self, free_units: int) -> None:
        """Take from the queue's head the units allocated since last time (the queue holds more
        than the replica's `free_units`), evicting the cached blocks they pop."""
        need = self._fresh + self._queued - free_units
        if need <= 0:
            if need < 0:
                raise AssertionError(f"free queue holds {self._fresh + self._queued} units, the replica {free_units}")
            return
        fresh = min(self._fresh, need)
        self._fresh -= fresh
        need -= fresh
        queue, queue_tags, tags = self._queue, self._queue_tags, self._tag
        ref, units, anonymous = self.ref, self.units, self._anonymous
        while need > 0:
            key, tag = queue.popleft(), queue_tags.popleft()
            if tags.get(key) != tag:                       # taken off by a hit since
                continue
            del tags[key]
            if key >= 0:                                   # a cached block: evicted
                n = 1 if self.uniform else units.pop(key)
                del ref[key]
                self.evicted += 1
            else:
                n = anonymous.pop(key)
            self._queued -= n
            if n > need:                                   # the rest of the run (or block) stays at the head
                self._push(n - need, left=True)
                n = need
            need -= n

    def _push(self, n: int, left: bool = False) -> None:
        """A run of n anonymous units into the free queue (at its tail, or its head)."""
        key, tag = self._next_anonymous, self._next_tag
        self._next_anonymous -= 1
        self._next_tag += 1
        self._anonymous[key] = n
        self._tag[key] = tag
        if left:
            self._queue.appendleft(key)
            self._queue_tags.appendleft(tag)
        else:
            self._queue.append(key)
            self._queue_tags.append(tag)
        self._queued += n

    def _push_blocks(self, keys: list[int]) -> int:
        """Cached blocks nobody holds any more, in this order, into the free queue's tail; returns their units."""
        start = self._next_tag
        self._next_tag += len(keys)
        tags = range(start, start + len(keys))
        self._tag.update(zip(keys, tags))
        self._queue.extend(keys)
        self._queue_tags.extend(tags)
        n = len(keys) if self.uniform else sum(map(self.units.__getitem__, keys))
        self._queued += n
        return n

    # -------------------------------------------------------------- look-ups
    def match(self, keys: list[int], max_blocks: int) -> int:
        """Leading blocks of `keys` cached now, at most max_blocks (the caller has taken pending
        allocations: `take`)."""
        ref = self.ref
        n = 0
        for key in keys[:max_blocks]:
            if key not in ref:
                break
            n += 1
        return n

    def hit_blocks(self, keys: list[int], num_tokens: int) -> int:
        """Blocks a request of num_tokens known tokens would start with (vLLM's cap and EAGLE rule)."""
        h = self.match(keys, (num_tokens - 1) // self.block_size)
        if h and self.drop_last_hit:
            h -= 1
        return h

    def evictable_units(self, keys: list[int]) -> int:
        """Units of these cached blocks that nobody holds (a hit on them takes them off the queue)."""
        tags = self._tag
        free = [k for k in keys if k in tags]
        return len(free) if self.uniform else sum(map(self.units.__getitem__, free))

    # -------------------------------------------------------------- a request's blocks
    def touch(self, state: RequestBlocks, num_blocks: int) -> int:
        """The request starts with its first num_blocks blocks from the cache; returns the units
        taken off the free queue (its evictable hit blocks)."""
        ref, tags = self.ref, self._tag
        keys = state.keys[:num_blocks]
        evictable = [k for k in keys if k in tags]
        for k in evictable:                                  # off the free queue (their entries go stale)
            del tags[k]
        taken = len(evictable) if self.uniform else sum(map(self.units.__getitem__, evictable))
        ref.update({k: ref[k] + 1 for k in keys})
        self._queued -= taken
        state.held = keys
        state.held_units = len(keys) if self.uniform else sum(map(self.units.__getitem__, keys))
        state.num_cached = num_blocks
        return taken

    def cache(self, state: RequestBlocks, num_full_blocks: int) -> None:
        """The request's leading num_full_blocks blocks are full of computed tokens: cache the new
        ones (BlockPool.cache_full_blocks)."""
        end = min(num_full_blocks, len(state.keys))
        start = state.num_cached
        if end <= start:
            return
        ref, units, bs = self.ref, self.units, self.block_size
        held = state.held
        new = [k for k in state.keys[start:end] if k not in ref]    # an equal block cached: this one stays anonymous
        if self.uniform:                                 # one unit each: `units` is not kept
            ref.update(dict.fromkeys(new, 1))
            held.extend(new)
            state.held_units += len(new)
        else:
            at = self._units_at.lookup(range(start * bs, end * bs + 1, bs))
            for j in range(start, end):
                key = state.keys[j]
                if key in ref:
                    continue
                u = at[j + 1 - start] - at[j - start]
                ref[key] = 1
                units[key] = u
                held.append(key)
                state.held_units += u
        state.num_cached = end

    def free(self, state: RequestBlocks, total_units: int) -> int:
        """Release a request's blocks (`total_units` in all), tails first; returns the units that
        went back to the free queue (blocks other requests still hold stay with them)."""
        freed = total_units - state.held_units
        if freed > 0:                                      # its anonymous blocks (the tail, duplicates)
            self._push(freed)
        else:
            freed = 0
        ref, held = self.ref, state.held
        back = [k for k in reversed(held) if ref[k] == 1]  # nobody else holds them: evictable now
        if len(back) == len(held):
            ref.update(dict.fromkeys(back, 0))
        else:
            ref.update({k: ref[k] - 1 for k in held})
        if back:
            freed += self._push_blocks(back)
        state.held = []
        state.held_units = 0
        state.num_cached = 0
        return freed
