"""The vLLM-v1 engine against independent truth: queueing closed forms, conservation, vLLM's rules.

These tests drive a Replica with a stub cost model whose step time is known exactly, so the
expected values come from queueing theory and vLLM's scheduler semantics, not from the code.
"""

from __future__ import annotations

import numpy as np
import pytest

from capacity.sim.engine import EngineLimits
from engine_helpers import ConstantCost, LinearCost, run_replica   # tests/engine_helpers.py (tests/ is on sys.path)


def limits(**kw):
    base = dict(max_num_batched_tokens=8192, max_num_seqs=256, block_size=16, num_gpu_blocks=100_000)
    base.update(kw)
    return EngineLimits(**base)


def test_md1_queue_matches_pollaczek_khinchine():
    """One-step requests served one at a time = an M/D/1 queue: Wq = λD² / (2(1−ρ))."""
    rng = np.random.default_rng(1)
    lam, d, n = 70.0, 0.01, 60_000
    arrival = np.cumsum(rng.exponential(1 / lam, n))
    table, _, finished = run_replica(np.full(n, 8), np.ones(n, dtype=int), arrival, ConstantCost(d),
                                     limits(max_num_seqs=1))
    assert len(finished) == n
    rho = lam * d
    wq_expected = lam * d * d / (2 * (1 - rho))
    wait = (table.first_token - table.arrival) - d       # TTFT = queueing + one step
    # standard error from batch means (waits are autocorrelated)
    batches = wait[n // 10:].reshape(50, -1).mean(axis=1)
    se = batches.std(ddof=1) / np.sqrt(len(batches))
    assert abs(wait[n // 10:].mean() - wq_expected) < 4 * se + 1e-4
    assert np.all(wait >= -1e-12)


def test_tokens_conserved_and_blocks_returned():
    rng = np.random.default_rng(2)
    n = 300
    prompt = rng.integers(1, 3000, n)
    output = rng.integers(1, 400, n)
    arrival = np.cumsum(rng.exponential(0.05, n))
    lim = limits(max_num_batched_tokens=2048, num_gpu_blocks=4000)
    table, replica, finished = run_replica(prompt, output, arrival, LinearCost(0.005, 2e-6), lim)
    assert sorted(finished) == list(range(n))
    assert np.array_equal(table.out, output)              # every requested token came out, no more
    assert np.array_equal(table.num_chunks, output)       # one token per chunk without speculation
    assert replica.free_blocks == lim.num_gpu_blocks       # every KV block returned
    assert np.all(table.first_token <= table.finish)
    assert np.all(table.first_scheduled >= table.arrival)


def test_token_budget_and_max_num_seqs_are_respected():
    n = 64
    lim = limits(max_num_batched_tokens=512, max_num_seqs=8)
    table, replica, _ = run_replica(np.full(n, 700), np.full(n, 20), np.zeros(n), ConstantCost(0.01), lim)
    assert max(replica.recorder.batch_tokens) <= 512
    assert max(replica.recorder.running) <= 8
    # chunked prefill: a 700-token prompt with a 512 budget needs two steps, so no request can
    # get its first token in the first step
    assert np.nanmin(table.first_token) >= 2 * 0.01 - 1e-12


def test_running_requests_are_scheduled_before_waiting_ones():
    """FCFS with running-first: request 0's decode steps are never starved by later prefills."""
    lim = limits(max_num_batched_tokens=100, max_num_seqs=4)
    prompt = [50, 400, 400]
    output = [10, 2, 2]
    table, replica, _ = run_replica(prompt, output, [0.0, 0.001, 0.001], ConstantCost(1.0), lim)
    # request 0: prefill in step 1, then one decode token per step, 10 tokens by the end of step 10
    assert table.first_token[0] == pytest.approx(1.0)
    assert table.finish[0] == pytest.approx(10.0)


def test_preemption_by_recompute_when_kv_runs_out():
    """A cache too small for every running request forces vLLM-style preemption; all still finish."""
    n = 12
    lim = limits(max_num_batched_tokens=4096, max_num_seqs=12, block_size=16, num_gpu_blocks=60)
    table, replica, finished = run_replica(np.full(n, 100), np.full(n, 150), np.zeros(n), ConstantCost(0.01), lim)
    assert sorted(finished) == list(range(n))
    assert table.num_preemptions.sum() > 0
    assert np.array_equal(table.out, np.full(n, 150))
    assert replica.free_blocks == lim.num_gpu_blocks
    # the cache never held more blocks than it has
    assert max(replica.recorder.kv_used) <= 1.0


def test_zero_load_decode_takes_one_step_per_token():
    lim = limits()
    table, _, _ = run_replica([100], [50], [0.0], ConstantCost(0.02), lim)
    assert table.first_token[0] == pytest.approx(0.02)            # one prefill step
    tpot = (table.finish[0] - table.first_token[0]) / (50 - 1)
    assert tpot == pytest.approx(0.02)


def test_same_inputs_same_result():
    rng = np.random.default_rng(5)
    n = 200
    args = (rng.integers(1, 2000, n), rng.integers(1, 300, n), np.cumsum(rng.exponential(0.02, n)))
    a, _, _ = run_replica(*args, LinearCost(0.004, 1e-6), limits(num_gpu_blocks=3000))
    b, _, _ = run_replica(*args, LinearCost(0.004, 1e-6), limits(num_gpu_blocks=3000))
    assert np.array_equal(a.finish, b.finish) and np.array_equal(a.first_token, b.first_token)


def test_decode_runs_equal_step_by_step_simulation():
    """Fast-forwarding runs of identical decode steps must not change any result."""
    from capacity.inputs import scenario
    from capacity.sim import simulate

    sc = scenario.from_dict({
        "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
        "traffic": {"arrival": {"process": "poisson", "rate_rps": 8.0}, "num_requests": 150,
                    "classes": [{"name": "c", "input_tokens": {"dist": "uniform", "low": 50, "high": 3000},
                                 "output_tokens": {"dist": "uniform", "low": 1, "high": 400}}]},
        "engine": {"max_num_batched_tokens": 1024},
    })
    fast = simulate.run(sc)
    original = simulate.Replica.__init__

    def slow_init(self, *a, **kw):
        original(self, *a, **kw)
        self.fast_forward = False

    simulate.Replica.__init__ = slow_init
    try:
        slow = simulate.run(sc)
    finally:
        simulate.Replica.__init__ = original
    for col in ("first_token_s", "finish_s", "num_chunks", "num_preemptions"):
        np.testing.assert_allclose(fast.requests[col].to_numpy(float), slow.requests[col].to_numpy(float), rtol=1e-9)
    assert fast.num_steps == slow.num_steps
