"""The simulator's speed shortcuts give the same bits as the plain computation they replace."""

from __future__ import annotations

import numpy as np
import pytest

from capacity.inputs import scenario

from capacity.sim import simulate
from capacity.sim.engine import StepRecorder, _float_sum
from capacity.cost.step_cost import AttentionTables, StepFeatures, StepTime, float_sum


@pytest.mark.parametrize("k", list(range(1, 20)) + [64, 200])
def test_float_sum_is_numpys_sum(k: int) -> None:
    """Short runs are summed in plain Python: the same bits as ndarray.sum() (widely spread values,
    so that a different order of additions would show in the last bits)."""
    rng = np.random.default_rng(k)
    for _ in range(200):
        x = rng.standard_normal(k + 3) * 10.0 ** rng.integers(-6, 9, k + 3)
        assert _float_sum(x, k) == float(x[:k].sum())


@pytest.mark.parametrize("n", list(range(0, 40)) + [63, 64, 65, 127, 128, 129, 200, 300, 1000])
def test_python_float_sum_is_numpys_sum(n: int) -> None:
    """float_sum (plain Python, numpy's pairwise order) gives np.add.reduce's bits: widely spread
    values, so that another order of additions would show in the last bits."""
    rng = np.random.default_rng(1000 + n)
    for _ in range(100):
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 9, n)
        assert float_sum(x.tolist()) == float(np.add.reduce(x))


def test_attention_sums_are_the_per_sequence_sums() -> None:
    """AttentionTables.sums (plain Python look-ups) equals the model's own functions summed by numpy,
    for decode-width chunks, whole prompts, prompt continuations and one width for all."""
    sc = scenario.load(None, [])
    arch = simulate.deploy(sc).model
    tables = AttentionTables(arch)
    rng = np.random.default_rng(3)
    for n in (1, 3, 8, 9, 17, 32):
        c = rng.integers(1, 5000, n)
        q = np.minimum(rng.choice([1, 2, 4, 600], n), c)
        q[: n // 3] = c[: n // 3]                                   # whole prompts
        attn, kv = tables.sums(q.tolist(), c.tolist())
        assert attn == float(arch.attention_flops(q, c).sum())
        assert kv == float(arch.kv_read_bytes(c).sum())
        attn4, _ = tables.sums(4, np.maximum(c, 4).tolist())
        assert attn4 == float(arch.attention_flops(np.full(n, 4), np.maximum(c, 4)).sum())


def test_recorder_series_are_the_steps_in_order() -> None:
    """Steps and runs (arrays or one value for all steps, arrays longer than the run) give the
    per-step series written out step by step, and totals summed step by step per record."""
    rec = StepRecorder()
    f1 = StepFeatures(10.0, 2.0, 2.0, 5.0, 7.0, 0.0)
    rec.add_step(0.5, 0.5, 3, 2, 0.25, 10, StepTime({"dense_gemm": 0.3, "overhead": 0.2}), f1)
    run = StepFeatures(8.0, 2.0, 8.0, np.array([1.0, 2.0, 3.0, 99.0]), np.array([4.0, 5.0, 6.0, 99.0]), 2.0)
    parts = {"dense_gemm": 0.1, "attention": np.array([0.01, 0.02, 0.03, 9.0]), "draft": np.array([0.4, 0.5, 0.6, 9.0])}
    ends = np.array([1.0, 1.5, 2.25])
    rec.add_run(ends, np.array([0.5, 0.5, 0.75]), 2, 0.5, parts, run, 3, parts["draft"])
    assert rec.num_steps == 4
    np.testing.assert_array_equal(rec.t, [0.5, 1.0, 1.5, 2.25])
    np.testing.assert_array_equal(rec.waiting, [3, 0, 0, 0])
    np.testing.assert_array_equal(rec.running, [2, 2, 2, 2])
    np.testing.assert_array_equal(rec.kv_used, [0.25, 0.5, 0.5, 0.5])
    np.testing.assert_array_equal(rec.batch_tokens, [10, 8, 8, 8])
    np.testing.assert_array_equal(rec.draft_s, [0.0, 0.4, 0.5, 0.6])
    np.testing.assert_array_equal(rec.features, [[10, 2, 2, 5, 7, 0], [8, 2, 8, 1, 4, 2], [8, 2, 8, 2, 5, 2],
                                                 [8, 2, 8, 3, 6, 2]])
    assert rec.parts == {"dense_gemm": 0.3 + ((0.1 + 0.1) + 0.1), "overhead": 0.2,
                         "attention": (0.01 + 0.02) + 0.03, "draft": (0.4 + 0.5) + 0.6}
    assert rec.busy_s == 0.5 + ((0.5 + 0.5) + 0.75)
    # a step added after reading joins the series read before
    rec.add_step(3.0, 0.75, 0, 1, 0.1, 4, StepTime({"overhead": 0.75}), StepFeatures(4.0, 1.0, 1.0, 1.0, 1.0, 0.0))
    np.testing.assert_array_equal(rec.t, [0.5, 1.0, 1.5, 2.25, 3.0])
    assert rec.features.shape == (5, 6)
    assert rec.parts["overhead"] == 0.2 + 0.75


def _small() -> scenario.Scenario:
    return scenario.load(None, ["traffic.num_requests=80"])


def test_runs_sharing_price_memos_match_runs_that_do_not(monkeypatch) -> None:
    """Simulations of one deployment share the drafter's and the target's exact price memos; with the
    sharing switched off (a fresh memo per run) every output is the same."""
    simulate._SHARED.clear()
    first = simulate.run(_small())
    second = simulate.run(_small())                       # reuses the memos filled by the first
    assert second.deployed.cost is first.deployed.cost
    assert second.deployed.speculation.draft_cost.price_memos().steps is first.deployed.speculation.draft_cost.price_memos().steps
    monkeypatch.setattr(simulate, "_SHARED_MAX", 0)      # every run keeps its own memos
    simulate._SHARED.clear()
    alone = simulate.run(_small())
    assert alone.deployed.cost is not first.deployed.cost
    for res in (second, alone):
        assert res.metrics == first.metrics
        assert res.step_breakdown_s == first.step_breakdown_s
        np.testing.assert_array_equal(res.cluster.replicas[0].recorder.features, first.cluster.replicas[0].recorder.features)


def test_a_different_deployment_does_not_share() -> None:
    """One efficiency changed: another fingerprint, so other memos (and other step times)."""
    simulate._SHARED.clear()
    base = simulate.run(_small())
    other = simulate.run(scenario.load(None, ["traffic.num_requests=80", "deployment.gpu_overrides={efficiency: {hbm: 0.5}}"]))
    assert other.deployed.cost is not base.deployed.cost
    assert other.deployed.speculation.draft_cost.price_memos().steps is not base.deployed.speculation.draft_cost.price_memos().steps
    assert other.metrics["duration_s"] != base.metrics["duration_s"]


@pytest.mark.parametrize("overrides", [[], ["deployment.replicas=3", "deployment.router=round_robin",
                                             "traffic.arrival.rate_rps=6"]])
def test_arrivals_known_ahead_cut_runs_as_interrupts_do(monkeypatch, overrides: list[str]) -> None:
    """(Independent requests: conversations' later turns are not known ahead.) An open-loop arrival known to come to a replica cuts its decode run when the run is set up,
    instead of interrupting it: every output is the same bits as with interrupts only."""
    sc = scenario.load("chatbot_single_turn", ["traffic.num_requests=150", *overrides])
    cut = simulate.run(sc)
    monkeypatch.setattr(simulate.Cluster, "next_arrival_for", lambda self, replica: None)
    interrupted = simulate.run(sc)
    assert cut.metrics == interrupted.metrics and cut.num_steps == interrupted.num_steps
    assert cut.step_breakdown_s == interrupted.step_breakdown_s
    pd_cut, pd_int = cut.requests, interrupted.requests
    for col in ("first_token_s", "finish_s", "num_chunks", "spec_accepted"):
        np.testing.assert_array_equal(pd_cut[col].to_numpy(), pd_int[col].to_numpy())
    for a, b in zip(cut.cluster.replicas, interrupted.cluster.replicas):
        np.testing.assert_array_equal(a.recorder.t, b.recorder.t)


@pytest.mark.parametrize("overrides", [
    [],                                                                       # dense, TP 1
    ["deployment.model=Qwen/Qwen3.5-27B", "speculative.method=mtp"],          # linear attention (snapshots)
    ["deployment.model=google/gemma-4-26B-A4B-it", "speculative.method=eagle3"],   # MoE
    ["deployment.model=mistralai/Mixtral-8x7B-v0.1", "deployment.tensor_parallel_size=2",
     "deployment.expert_parallel=true", "speculative.method=ngram"],          # all-reduce, EP, serial host time
])
def test_decode_parts_are_the_time_parts_of_decode_features(overrides: list[str]) -> None:
    """StepCostModel.decode_parts (per-shape constants kept, attention priced in place) gives
    time_parts(decode_features(...)) bit for bit, with the same keys in the same order."""
    cost = simulate.deploy(scenario.load("chatbot_single_turn", overrides)).cost
    rng = np.random.default_rng(5)
    for steps, batch, q in [(1, 1, 1), (5, 3, 4), (17, 9, 4), (40, 12, 1), (3, 2, 8), (5, 3, 4)]:   # a shape again
        ctx = np.sort(rng.integers(q, 20000, (steps, batch)), axis=0)
        f, parts = cost.decode_parts(ctx, q)
        plain = cost.decode_features(ctx, q)
        assert f.as_tuple()[:3] + f.as_tuple()[5:] == plain.as_tuple()[:3] + plain.as_tuple()[5:]
        assert np.array_equal(f.attn_flops, plain.attn_flops) and np.array_equal(f.kv_read_bytes, plain.kv_read_bytes)
        expected = cost.time_parts(plain)
        assert list(parts) == list(expected)
        for key, value in expected.items():
            assert np.array_equal(np.broadcast_to(parts[key], (steps,)), np.broadcast_to(value, (steps,))), key
