"""Time-varying load (traffic rate_profile) and the plan's GPUs over the day (issue 18 item 7)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from capacity.cli import main
from capacity.inputs.traffic import RateProfile, TrafficConfig, build_requests

CLASS = [{"name": "a", "input_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 10}}]
PROFILE = {"step_s": 100.0, "multipliers": [1.0, 3.0, 0.5]}


def test_the_rate_in_each_step_is_the_rate_times_its_multiplier():
    """A Poisson process at 2 req/s shaped by (1, 3, 0.5) for 100 s each, repeated for 30,000 s: each
    step's count is Poisson with mean 2 x m x 100 x 100 repetitions (tolerance 5 standard errors)."""
    cfg = TrafficConfig.model_validate({"arrival": {"process": "poisson", "rate_rps": 2.0, "rate_profile": PROFILE},
                                        "duration_s": 30_000, "classes": CLASS})
    t = build_requests(cfg, np.random.default_rng(0)).arrival_s
    assert np.all(np.diff(t) >= 0) and t.max() < 30_000
    counts = np.bincount(((t % 300) // 100).astype(int), minlength=3)
    for count, m in zip(counts, PROFILE["multipliers"]):
        mean = 2.0 * m * 100 * 100
        assert abs(count - mean) < 5 * math.sqrt(mean), (count, mean)


def test_the_operational_clock_and_its_inverse():
    p = RateProfile(**PROFILE)
    t = np.array([0.0, 50.0, 100.0, 150.0, 250.0, 300.0, 450.0])
    # by hand: 50 s at x1 = 50; 100 + 50 x 3 = 250; 100 + 300 + 50 x 0.5 = 425; one period (300 s) = 450;
    # 450 s = one period + 150 s = 450 + 100 + 50 x 3 = 700
    np.testing.assert_allclose(p.operational(t), [0, 50, 100, 250, 425, 450, 700])
    np.testing.assert_allclose(p.real(p.operational(t)), t)


def test_sessions_start_along_the_profile():
    cfg = TrafficConfig.model_validate({
        "arrival": {"process": "sessions", "rate_sessions_per_s": 1.0, "rate_profile": PROFILE},
        "duration_s": 30_000,
        "classes": [{**CLASS[0], "turns": {"dist": "fixed", "value": 2}}]})
    s = build_requests(cfg, np.random.default_rng(1))
    starts = s.arrival_s[s.follows < 0]
    counts = np.bincount(((starts % 300) // 100).astype(int), minlength=3)
    assert counts[1] > 2.5 * counts[0] > 5 * counts[2] / 1.2


def test_a_profile_on_an_infinite_rate_is_one_line(capsys):
    rc = main(["simulate", "chatbot_single_turn", "--set", "traffic.arrival.rate_rps=.inf",
               "--set", "traffic.arrival.rate_profile={multipliers: [1, 2]}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "rate_profile" in err[0]


def test_the_plan_follows_the_profile_from_the_confirmed_per_replica_rate():
    """GPUs per step = ceil(target x m / max m x (1 + headroom) / confirmed per-replica rate) x TP,
    computed by hand here; GPU-hours a day = the sum over steps x step hours x steps per day."""
    from capacity.studies import plan

    base = {"deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
            "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0,
                                    "rate_profile": {"step_s": 21600, "multipliers": [0.25, 1.0, 0.5, 0.1]}},
                        "num_requests": 10, "classes": CLASS},
            "plan": {"target_rate_rps": 40}}
    cfg = plan.PlanConfig.model_validate(base["plan"])
    st = plan._Setup(base, cfg, [], 10.0, 10.0, 10.0, 40 * 1.2)
    best = plan.Candidate("MI300X", 2, "none", 0, {}, {}, replicas=6, total_gpus=12, cost_per_gpu_hour_usd=2.0,
                          max_rate_per_replica_rps=48 / 6)
    d = plan.daily(st, best)
    # rates 10, 40, 20, 4 req/s; x 1.2 / 8 req/s per replica -> 1.5, 6, 3, 0.6 -> 2, 6, 3, 1 replicas
    assert [x["replicas"] for x in d["steps"]] == [2, 6, 3, 1]
    assert [x["gpus"] for x in d["steps"]] == [4, 12, 6, 2]
    assert d["gpu_hours_per_day_following"] == pytest.approx((4 + 12 + 6 + 2) * 6)
    assert d["gpu_hours_per_day_at_peak"] == 12 * 24
    assert d["cost_per_day_following_usd"] == pytest.approx(144 * 2.0)
    no_profile = {**base, "traffic": {**base["traffic"], "arrival": {"process": "poisson", "rate_rps": 1.0}}}
    assert plan.daily(plan._Setup(no_profile, cfg, [], 10.0, 10.0, 10.0, 48.0), best) is None
