"""Speculation policies against closed forms.

The goodput policy is checked on a toy linear step model, T(B, n) = a + b·B·(n + 1) + d·n, with
i.i.d. acceptance α, where E[τ(n)] = (1 − α^(n+1)) / (1 − α) (Leviathan et al. 2023): the argmax of
E[τ(n)]·B / T(B, n) is computed here from that closed form.
"""

from __future__ import annotations

import numpy as np
import pytest

from capacity.drafting import DraftCost
from capacity.errors import CapacityError
from capacity.acceptance import IIDAcceptance
from capacity.hardware import load_gpu
from capacity.models import load_model
from capacity.policies import GoodputPolicy, OffAbovePolicy, StaticPolicy, policy_from_config
from capacity.step_cost import StepCostModel


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
