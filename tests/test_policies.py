"""Speculation policies against closed forms.

The goodput policy is checked on a toy linear step model, T(B, n) = a + b·B·(n + 1) + d·n, with
i.i.d. acceptance α, where E[τ(n)] = (1 − α^(n+1)) / (1 − α) (Leviathan et al. 2023): the argmax of
E[τ(n)]·B / T(B, n) is computed here from that closed form.
"""

from __future__ import annotations

import numpy as np
import pytest

from capacity.spec.draft_cost import DraftCost
from capacity.errors import CapacityError
from capacity.spec.acceptance import IIDAcceptance
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.spec.policies import GoodputPolicy, OffAbovePolicy, StaticPolicy, policy_from_config
from capacity.cost.step_cost import StepCostModel


# every draft accepted with probability a, independently: S_j = a^j (the simulator's M0 model,
# itself checked against (1 - a^(N+1)) / (1 - a) in tests/test_acceptance.py)
Geometric = IIDAcceptance


def linear_step(a: float, b: float, d: float):
    return lambda batch, context, n: a + b * batch * (n + 1) + d * n


def closed_form_argmax(alpha: float, a: float, b: float, d: float, batch: int, max_n: int) -> int:
    g = [(1 - alpha ** (n + 1)) / (1 - alpha) * batch / (a + b * batch * (n + 1) + d * n) for n in range(max_n + 1)]
    return int(np.argmax(g))


def test_static_and_off_above():
    assert StaticPolicy(3).num_spec_tokens(1000, 5e4) == 3
    p = policy_from_config({"kind": "off_above", "max_batch_size": 40}, 3)
    assert isinstance(p, OffAbovePolicy)
    assert [p.num_spec_tokens(b, 100.0) for b in (1, 39, 40, 41, 500)] == [3, 3, 3, 0, 0]
    assert p.max_num_spec_tokens == 3
    assert isinstance(policy_from_config(None, 4), StaticPolicy)
    assert policy_from_config({"kind": "static"}, 4).num_spec_tokens(7, 0.0) == 4


@pytest.mark.parametrize("batch,expected", [(8, 6), (64, 3), (1024, 0)])
def test_goodput_picks_the_closed_form_argmax(batch, expected):
    alpha, a, b, d = 0.8, 10e-3, 0.05e-3, 0.5e-3
    p = policy_from_config({"kind": "goodput", "max_n": 7, "batch_bucket_ratio": 1, "context_bucket_ratio": 1},
                           7, acceptance=Geometric(alpha), step_time_s=linear_step(a, b, d))
    truth = closed_form_argmax(alpha, a, b, d, batch, 7)
    assert truth == expected                       # worked by hand: N shrinks as the batch grows
    assert p.num_spec_tokens(batch, 2000.0) == truth


def test_goodput_turns_speculation_off_when_nothing_is_accepted():
    gpu = load_gpu("MI300X")
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    dc = DraftCost("dflash", gpu, t, d, 1, 7)
    p = policy_from_config({"kind": "goodput", "max_n": 7}, 7, target_cost=StepCostModel(gpu, t, 1), draft_cost=dc,
                           acceptance=Geometric(0.0))
    assert all(p.num_spec_tokens(b, c) == 0 for b in (1, 8, 64, 300) for c in (10.0, 1000.0, 30000.0))


def test_goodput_with_perfect_acceptance_at_batch_one_drafts_the_most():
    # α = 1 at B = 1: every draft is accepted, the verify step is weight-bound, so E[τ] grows by 1 per
    # draft while the step grows by a fraction: the largest N wins
    gpu = load_gpu("MI300X")
    t, d = load_model("Qwen/Qwen3-8B"), load_model("z-lab/Qwen3-8B-DFlash-b16")
    dc = DraftCost("dflash", gpu, t, d, 1, 15)
    perfect = type("Perfect", (), {"expected_tokens": lambda self, n: 1.0 + n})()
    p = policy_from_config({"kind": "goodput", "max_n": 15}, 15, target_cost=StepCostModel(gpu, t, 1), draft_cost=dc,
                           acceptance=perfect)
    assert p.num_spec_tokens(1, 1000.0) == 15


def test_goodput_caches_per_bucket():
    calls = []

    def step(batch, context, n):
        calls.append((batch, context, n))
        return 1.0 + 0.01 * batch * (n + 1)

    p = GoodputPolicy(4, Geometric(0.7).expected_tokens, step, batch_bucket_ratio=1.25, context_bucket_ratio=2.0,
                      exact_batch_below=4)
    first = p.num_spec_tokens(100, 3000.0)
    n_calls = len(calls)
    assert n_calls == 5                                     # N = 0..4 priced once
    # same buckets: 100 and 105 share a 1.25-ratio batch bucket, 3000 and 3500 a 2x context bucket
    assert p.num_spec_tokens(105, 3500.0) == first and len(calls) == n_calls
    p.num_spec_tokens(3, 3000.0)                            # small batches are exact
    assert {c[0] for c in calls[n_calls:]} == {3}


def test_policy_config_errors():
    with pytest.raises(CapacityError, match="unknown speculation policy kind"):
        policy_from_config({"kind": "adaptive"}, 3)
    with pytest.raises(CapacityError, match="max_batch_size"):
        policy_from_config({"kind": "off_above"}, 3)
    with pytest.raises(CapacityError, match="unknown key"):
        policy_from_config({"kind": "off_above", "max_batch_size": 4, "min_batch": 2}, 3)
    with pytest.raises(CapacityError, match="acceptance"):
        policy_from_config({"kind": "goodput", "max_n": 3}, 3)
    with pytest.raises(CapacityError, match="max_n"):
        policy_from_config({"kind": "goodput", "max_n": -1}, 3, acceptance=Geometric(0.5),
                           step_time_s=linear_step(1, 1, 1))


def test_break_even_batch_matches_the_closed_form():
    """Step time a + b·B·(1 + n) (a fixed cost plus a compute-bound part): one step with n drafts
    yields τ tokens per request against one, so speculation pays while τ·(a + bB) ≥ a + bB(1 + n),
    i.e. up to B* = a(τ − 1) / (b(1 + n − τ))."""
    import math

    from capacity.spec.policies import break_even

    a, b, n = 0.010, 0.00004, 3
    acc = {1: 1.7, 2: 2.2, 3: 2.6}                       # E[τ(k)], a chain with falling rates
    step = lambda batch, ctx, k: a + b * batch * (1 + k)   # noqa: E731
    res = break_even(step, acc.__getitem__, n, 500.0, 1024, at_batch=64)
    tau = acc[n]
    assert res["pays_up_to"] == math.floor(a * (tau - 1) / (b * (1 + n - tau)))     # 285
    assert res["policy"] == {"kind": "off_above", "max_batch_size": res["pays_up_to"]}
    assert res["speedup_at_1"] == pytest.approx(tau * (a + b) / (a + b * (1 + n)))
    assert res["speedup_at_batch"] == pytest.approx(tau * (a + 64 * b) / (a + 64 * b * (1 + n)))
    # the goodput-best N at B = 64: argmax of τ(k) / (a + 64 b (1 + k)) over k = 0..3
    good = [([1.0] + [acc[k] for k in (1, 2, 3)])[k] / (a + 64 * b * (1 + k)) for k in range(4)]
    assert res["best_n_at_batch"] == good.index(max(good))


def test_break_even_when_speculation_always_or_never_pays():
    from capacity.spec.policies import break_even

    free = break_even(lambda B, c, k: 0.01, lambda k: 1.0 + 0.5 * k, 2, 100.0, 256)
    assert free["pays_up_to"] == 256 and free["policy"] == {"kind": "static"}
    costly = break_even(lambda B, c, k: 0.01 * (1 + k), lambda k: 1.0 + 0.5 * k, 2, 100.0, 256)
    assert costly["pays_up_to"] == 0


def _closed_loop_speedup(users: int):
    """(simulated speedup of gemma4_mtp N=3 at i.i.d. alpha 0.7, the run's break-even analysis) for a
    closed loop of `users` with tiny prompts and no request delay: almost nothing but decode steps."""
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import simulate
    from capacity.sim import summary

    def run(spec):
        return simulate.run(scenario_mod.from_dict({
            "name": "decode",
            "deployment": {"gpu": "MI300X", "model": "google/gemma-4-31B-it",
                           "gpu_overrides": {"efficiency": {"request_overhead_ms": 0.0}}},
            "speculative": spec,
            "traffic": {"arrival": {"process": "closed_loop", "concurrency": users}, "num_requests": 4 * users + 4,
                        "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 16},
                                     "output_tokens": {"dist": "fixed", "value": 768}}]}}, "t"))

    on = run({"method": "gemma4_mtp", "num_speculative_tokens": 3, "acceptance": {"model": "iid", "alpha": 0.7}})
    off = run({"method": "none"})
    return on.metrics["output_throughput_tok_s"] / off.metrics["output_throughput_tok_s"], summary.speculation_by_batch(on)


def test_break_even_speedup_at_one_request_is_what_a_single_user_simulation_gets():
    """`speculation_by_batch` prices one decode step analytically; the simulation of one user must
    agree (the step context grows during a request, the analysis uses the mean)."""
    simulated, sb = _closed_loop_speedup(1)
    assert sb["at_batch"] == 1
    assert sb["speedup_at_1"] == pytest.approx(simulated, rel=0.03)


def test_the_simulation_crosses_break_even_where_the_analysis_says():
    """Half the break-even batch still gains in simulation, twice it loses (measured: 1.51x at 24
    users and 0.64x at 96 around a break-even of 48)."""
    _, sb = _closed_loop_speedup(1)
    limit = sb["pays_up_to"]
    assert 8 <= limit <= 512
    below, _ = _closed_loop_speedup(limit // 2)
    above, _ = _closed_loop_speedup(2 * limit)
    assert below > 1.0 > above
