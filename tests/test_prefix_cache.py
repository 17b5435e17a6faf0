"""Prefix caching (sim/prefix_cache.py and its use in sim/engine.py) against vLLM v1's own rules.

vLLM cannot be imported here (it needs torch and a GPU build), so its rules are ported into small
cases, each citing where it comes from (vllm-project/vllm; kv_cache_manager.py @003df2961dd8830c317a61f9745ccd557da9fa06):
  [hit cap]   KVCacheManager.get_computed_blocks: "max_cache_hit_length = request.num_tokens - 1"
  [scan]      FullAttentionManager.find_longest_cache_hit (single_type_kv_cache_manager.py): left to
              right, stop at the first block hash not cached; "Need to drop the last matched block if
              eagle is enabled"
  [free]      KVCacheManager.free: "We free the blocks in reverse order so that the tail blocks are
              evicted first"; BlockPool.free_blocks appends blocks whose ref_cnt falls to 0 to the free
              queue's tail; BlockPool.get_new_blocks pops from its head and evicts a popped block's hash
  [touch]     BlockPool.touch: a hit on a block with ref_cnt 0 takes it out of the free queue
  [cache]     allocate_slots caches full blocks up to min(num_computed + num_new_tokens, num_tokens)
  [stats]     PrefixCacheStats.record(num_tokens, num_hits, preempted) (vllm/v1/metrics/stats.py),
              called at admission
"""

from __future__ import annotations

import numpy as np

from capacity.sim.engine import EngineLimits
from capacity.sim.prefix_cache import PrefixCache, RequestBlocks
from capacity.cost.step_cost import TokenTable

from engine_helpers import ConstantCost, LinearCost, blocks_for, run_replica


class ListKeys:
    """Block identities given per request (the traffic's PrefixKeys protocol)."""

    def __init__(self, keys: list[list[int]]):
        self.keys = keys

    def block_keys(self, request: int, block_size: int) -> list[int]:
        return list(self.keys[request])


def units_table(block_size: int = 16) -> TokenTable:
    return TokenTable(blocks_for(block_size))


def limits(**kw) -> EngineLimits:
    base = dict(max_num_batched_tokens=8192, max_num_seqs=256, block_size=16, num_gpu_blocks=100_000,
                enable_prefix_caching=True)
    base.update(kw)
    return EngineLimits(**base)


def run(prompt, output, arrival, keys, lim, cost=None, drop_last_hit=False):
    return run_replica(prompt, output, arrival, cost or ConstantCost(0.01), lim,
                       prefix_keys=None if keys is None else ListKeys(keys), drop_last_hit=drop_last_hit)


# ------------------------------------------------------------------ the block pool alone
def test_tails_are_evicted_first_and_hits_stop_at_the_first_miss():
    """[free] + [scan]: a finished request's blocks go to the free queue tail last-block first, so new
    allocations evict its tail, and the next look-up finds only the head of its prefix."""
    pool = PrefixCache(num_blocks=6, block_size=16, units_at=units_table())
    free = 6
    a = RequestBlocks(keys=[10, 11, 12, 13])
    free -= 4                                    # request a allocates 4 blocks (taken lazily)
    pool.cache(a, 4)
    free += pool.free(a, total_units=4)
    assert free == 6 and pool.queued_units == 10   # 4 allocations not yet taken from the head
    free -= 4                                    # another request takes 4 blocks: 2 fresh, then 13, 12
    pool.take(free)
    assert pool.match([10, 11, 12, 13], 4) == 2
    assert pool.evicted == 2
    assert pool.queued_units == free


def test_hit_leaves_the_last_token_to_compute_and_eagle_drops_a_block():
    """[hit cap]: a 64-token prompt whose 4 blocks are all cached starts at 48 tokens, not 64;
    [scan]: with an EAGLE-family drafter one more block is given back."""
    pool = PrefixCache(num_blocks=100, block_size=16, units_at=units_table())
    owner = RequestBlocks(keys=[1, 2, 3, 4])
    pool.cache(owner, 4)
    assert pool.hit_blocks([1, 2, 3, 4], num_tokens=64) == 3
    assert pool.hit_blocks([1, 2, 3, 4], num_tokens=65) == 4
    eagle = PrefixCache(num_blocks=100, block_size=16, units_at=units_table(), drop_last_hit=True)
    eagle.cache(RequestBlocks(keys=[1, 2, 3, 4]), 4)
    assert eagle.hit_blocks([1, 2, 3, 4], num_tokens=65) == 3


def test_shared_blocks_count_once_and_return_when_the_last_holder_leaves():
    """[touch]: a hit on a held block costs nothing; on an evictable one it takes the block off the
    free queue; a block goes back only when nobody holds it."""
    pool = PrefixCache(num_blocks=10, block_size=16, units_at=units_table())
    a, b = RequestBlocks(keys=[1, 2, 3]), RequestBlocks(keys=[1, 2, 3])
    pool.cache(a, 3)
    assert pool.evictable_units([1, 2, 3]) == 0       # a holds them
    assert pool.touch(b, 3) == 0
    assert pool.free(a, total_units=5) == 2           # a's 2 anonymous blocks; 1-3 stay with b
    assert pool.free(b, total_units=3) == 3
    c = RequestBlocks(keys=[1, 2, 3])
    assert pool.evictable_units([1, 2]) == 2
    assert pool.touch(c, 2) == 2                      # evictable hits come off the free queue


# ------------------------------------------------------------------ in the engine
def test_caching_off_or_without_identities_changes_nothing():
    rng = np.random.default_rng(3)
    n = 200
    prompt, output = rng.integers(1, 3000, n), rng.integers(1, 300, n)
    arrival = np.cumsum(rng.exponential(0.05, n))
    cost = LinearCost(0.004, 2e-6)
    base, _, _ = run(prompt, output, arrival, None, limits(enable_prefix_caching=False, num_gpu_blocks=3000), cost)
    same, rep, _ = run(prompt, output, arrival, None, limits(num_gpu_blocks=3000), cost)
    for col in ("first_token", "finish", "num_chunks", "num_preemptions", "out"):
        assert np.array_equal(getattr(base, col), getattr(same, col))
    assert rep.counters.hits == 0 and rep.counters.queries + rep.counters.preempted_queries > 0


def test_repeated_prompt_starts_at_its_cached_prefix_and_tokens_are_conserved():
    """Request 1 re-sends request 0's 1,000-token prompt after it finished: it starts at
    floor(999 / 16) * 16 = 992 cached tokens [hit cap]; the engine computes exactly the tokens not
    found in the cache (prompt - cached + output - 1 per request, without speculation)."""
    keys = [list(range(62)), list(range(62))]       # 1000 // 16 = 62 full blocks
    table, rep, _ = run([1000, 1000], [50, 50], [0.0, 5.0], keys, limits(max_num_batched_tokens=512))
    assert table.cached_tokens.tolist() == [0, 992]
    ttft = table.first_token - table.arrival
    assert ttft[1] < ttft[0]
    computed = rep.recorder.batch_tokens.sum()
    assert computed == (1000 - 0 + 49) + (1000 - 992 + 49)
    assert rep.counters.queries == 2000 and rep.counters.hits == 992      # [stats]
    assert rep.free_blocks == rep.limits.num_gpu_blocks


def test_same_step_admissions_share_what_the_first_caches():
    """[cache]: blocks are cached when their chunk is scheduled, so a request admitted in the same
    step as another with the same prefix already hits the first one's blocks."""
    keys = [list(range(12)), list(range(12))]
    table, rep, _ = run([200, 200], [5, 5], [0.0, 0.0], keys, limits())
    assert table.first_scheduled[0] == table.first_scheduled[1]
    assert table.cached_tokens.tolist() == [0, 192]


def independent_hit_rate(prompt, output, keys, bs):
    """Hits when nothing is evicted and requests do not overlap: a request finds the longest
    prefix of its keys that some earlier request computed (its first floor((P + O - 1) / bs) blocks,
    as far as it has keys), capped at floor((P - 1) / bs) blocks [hit cap]."""
    seen: set[int] = set()
    hits = queries = 0
    for p, o, k in zip(prompt, output, keys):
        h = 0
        for key in k[: (p - 1) // bs]:
            if key not in seen:
                break
            h += 1
        hits += h * bs
        queries += p
        seen.update(k[: (p + o - 1) // bs])
    return hits / queries


def conversation_keys(rng, n_sessions, turns, bs):
    """Sessions of a shared 100-block system prompt + per-session history (keys as in traffic)."""
    prompt, output, keys = [], [], []
    for s in range(n_sessions):
        history = 1600
        for _ in range(turns):
            user, answer = int(rng.integers(20, 200)), int(rng.integers(20, 300))
            p = history + user
            total_blocks = (p + answer) // bs
            keys.append([j if (j + 1) * bs <= 1600 else (s + 1) * 10_000 + j for j in range(total_blocks)])
            prompt.append(p)
            output.append(answer)
            history = p + answer
    return prompt, output, keys


def test_hit_rate_matches_an_independent_count_and_falls_as_the_pool_shrinks():
    rng = np.random.default_rng(5)
    prompt, output, keys = conversation_keys(rng, n_sessions=12, turns=5, bs=16)
    order = rng.permutation(len(prompt))                       # turns of different sessions interleave
    prompt = [prompt[i] for i in order]
    output = [output[i] for i in order]
    keys = [keys[i] for i in order]
    arrival = np.arange(len(prompt)) * 10.0                    # one request at a time
    expected = independent_hit_rate(prompt, output, keys, 16)
    rates = []
    for blocks in (100_000, 2_000, 900, 400):
        _, rep, finished = run(prompt, output, arrival, keys, limits(num_gpu_blocks=blocks))
        assert len(finished) == len(prompt)
        c = rep.counters
        rates.append(c.hits / c.queries)
        assert rep.free_blocks == blocks and all(v == 0 for v in rep.cache.ref.values())
    assert abs(rates[0] - expected) < 1e-12
    assert rates == sorted(rates, reverse=True) and rates[-1] < rates[0]


def test_a_preempted_request_hits_its_own_blocks_on_resume():
    """A KV pool too small for the batch preempts; the resumed request finds the blocks it freed
    (still cached) and the resumed look-ups are counted apart [stats]."""
    n = 6
    keys = [[r * 1000 + j for j in range(80)] for r in range(n)]
    lim = limits(num_gpu_blocks=240, max_num_batched_tokens=4096)
    table, rep, finished = run(np.full(n, 700), np.full(n, 600), np.zeros(n), keys, lim)
    assert sorted(finished) == list(range(n))
    assert table.num_preemptions.sum() > 0
    c = rep.counters
    assert c.preempted_requests > 0 and c.preempted_hits > 0
    assert c.hits == 0                                           # nobody shares a prefix
    assert rep.free_blocks == lim.num_gpu_blocks


# ------------------------------------------------------------------ Mooncake's conversation trace
def trace_leading_block_reuse(n: int) -> float:
    """The trace's own figure, from the shipped file and nothing of the simulator: per request, the
    leading 512-token blocks whose hash ids appeared in an earlier request (the ids are chained, so
    a seen id means the whole prefix up to it was sent before), in prompt tokens, over all prompt
    tokens."""
    import gzip
    import json
    from capacity.paths import data_dir

    seen: set[int] = set()
    hit = total = 0
    with gzip.open(data_dir() / "traces" / "mooncake_conversation.jsonl.gz", "rt") as f:
        for line, _ in zip(f, range(n)):
            row = json.loads(line)
            k = 0
            for h in row["hash_ids"]:
                if h not in seen:
                    break
                k += 1
            hit += min(k * 512, row["input_length"])
            total += row["input_length"]
            seen.update(row["hash_ids"])
    return hit / total


def test_mooncake_replay_hits_what_the_trace_reuses_and_less_as_the_pool_shrinks():
    """Done-when of issue 17: with a KV pool that never evicts, the replay's prefix_cache_hit_rate
    equals the trace's leading-block reuse within 0.5 % (the first 1,000 requests, replayed 10x
    slower so one Llama-3.1-8B replica serves them all); with smaller pools it is lower and falls as
    the pool shrinks (192 GB is an MI300X's own HBM)."""
    from capacity.inputs import scenario
    from capacity.sim import simulate

    expected = trace_leading_block_reuse(1000)
    rates = []
    for hbm_gb in (2000, 400, 192, 80):
        sc = scenario.load("mooncake_conversation", ["traffic.num_requests=1000", "traffic.arrival.time_scale=0.1",
                                                     f"deployment.gpu_overrides.hbm_capacity_gb={hbm_gb}"])
        res = simulate.run(sc)
        assert res.metrics["completed"] == 1000
        rates.append(res.metrics["prefix_cache_hit_rate"])
    assert abs(rates[0] - expected) <= 0.005 * expected, (rates[0], expected)
    assert all(a >= b for a, b in zip(rates, rates[1:])) and rates[-1] < rates[0], rates


SESSIONS = {
    "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B", "replicas": 4},
    "speculative": {"method": "none"},
    "traffic": {"arrival": {"process": "sessions", "rate_sessions_per_s": 2.0, "num_sessions": 150},
                "classes": [{"name": "support", "system_prompt_tokens": 1200,
                             "turns": {"dist": "uniform", "low": 2, "high": 8},
                             "input_tokens": {"dist": "uniform", "low": 20, "high": 200},
                             "output_tokens": {"dist": "uniform", "low": 50, "high": 400},
                             "think_time_s": {"dist": "fixed", "value": 10}}]},
    "simulation": {"seed": 0},
}


def test_cache_aware_routers_keep_more_hits_than_round_robin_and_caching_cuts_ttft():
    """Over 4 replicas a conversation's history is cached where its previous turn ran: round robin
    finds it there about 1 time in 4 (the shared system prompt everywhere); session affinity and the
    prefix-aware picker send the turn back to it. With caching off every prompt is computed whole."""
    import copy

    from capacity.inputs import scenario
    from capacity.sim import simulate

    def run_with(router: str, caching: bool = True):
        data = copy.deepcopy(SESSIONS)
        data["deployment"]["router"] = router
        data["engine"] = {"enable_prefix_caching": caching}
        return simulate.run(scenario.from_dict(data))

    rr, affinity, aware = (run_with(r) for r in ("round_robin", "session_affinity", "prefix_aware"))
    hit = {name: res.metrics["prefix_cache_hit_rate"] for name, res in
           (("round_robin", rr), ("session_affinity", affinity), ("prefix_aware", aware))}
    assert hit["prefix_aware"] > hit["round_robin"] + 0.1 and hit["session_affinity"] > hit["round_robin"] + 0.1
    per_replica = rr.metrics["prefix_cache"]["per_replica"]
    assert len(per_replica) == 4
    assert sum(r["prefix_cache_hits_tokens"] for r in per_replica) == rr.metrics["prefix_cache"]["prefix_cache_hits_tokens"]
    off = run_with("session_affinity", caching=False)
    assert "prefix_cache_hit_rate" not in off.metrics
    assert affinity.metrics["ttft_ms"]["p50"] < 0.7 * off.metrics["ttft_ms"]["p50"]
    # a turn is sent after its previous answer is complete plus the think time
    req, stream = affinity.requests, affinity.cluster.stream
    later = stream.follows >= 0
    prev_finish = req["finish_s"].to_numpy()[stream.follows[later]]
    np.testing.assert_allclose(req["arrival_s"].to_numpy()[later], prev_finish + stream.think_s[later])


def test_prefix_cache_figures_show_the_hit_rate_and_refuse_runs_without_caching():
    import pandas as pd
    import pytest

    from capacity.errors import CapacityError
    from capacity.report import figures

    req = pd.DataFrame({"prompt_tokens": [100, 200, 400], "cached_tokens": [0, 100, 400 - 16],
                        "first_scheduled_s": [0.0, 1.0, 2.0]})
    fig = figures.prefix_cache_figure(req, {"prefix_cache_hit_rate": 484 / 700, "per_replica": []})
    assert "69%" in fig.layout.title.text
    assert list(fig.data[0].y)[-1] == 1.0
    with pytest.raises(CapacityError, match="cached_tokens"):
        figures.prefix_cache_figure(req.drop(columns="cached_tokens"))
    plan = figures.prefix_caching_plan_figure({"gpus": 2, "gpus_without_caching": 6, "router": "session_affinity",
                                               "prefix_cache_hit_rate": 0.95, "routers": []})
    assert list(plan.data[0].y) == [2, 6]
    with pytest.raises(CapacityError, match="prefix_caching"):
        figures.prefix_caching_plan_figure({})
