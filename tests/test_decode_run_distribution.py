"""Decode runs that go on past completions (issue 20) against runs that end at the first completion.

With speculation the two draw the acceptance samples in another order (a run draws its steps once;
after a completion the old engine drew the next run's steps afresh), so single results differ; the
distributions must not: over many seeds the per-seed metrics of the two agree within what their
seed-to-seed spread allows. Without speculation nothing is drawn and every result agrees with the
engine stepped one step at a time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from capacity.inputs import scenario
from capacity.sim import simulate
from capacity.sim.engine import Replica

SEEDS = range(30)
# (name, scenario, overrides): open loop with runs cut at arrivals known ahead, conversations (later
# turns sent at finish + think time, prefix caching on), a closed loop (the next request sent at a
# completion: the run must end there)
CASES = {
    "open_loop": ("chatbot_single_turn", ["traffic.num_requests=80", "traffic.arrival.rate_rps=3"]),
    "sessions": (None, ["traffic.arrival.num_sessions=25", "traffic.arrival.rate_sessions_per_s=2"]),
    "closed_loop": ("chatbot_single_turn", ["traffic.num_requests=60",
                                            "traffic.arrival={process: closed_loop, concurrency: 8}"]),
}


def _figures(res: simulate.SimulationResult) -> dict[str, float]:
    m, req = res.metrics, res.requests
    steps = req["spec_steps"].to_numpy(float).sum()
    return {
        "ttft_mean": m["ttft_ms"]["mean"], "tpot_mean": m["tpot_ms"]["mean"], "itl_mean": m["itl_ms"]["mean"],
        "e2e_mean": m["e2e_ms"]["mean"], "output_throughput": m["output_throughput_tok_s"],
        "running_mean": m["running"]["mean"], "duration": m["duration_s"], "steps": float(res.num_steps),
        "accepted_per_step": req["spec_accepted"].to_numpy(float).sum() / steps if steps else 0.0,
    }


def _runs(monkeypatch, name, overrides, past_finish: bool) -> list[dict[str, float]]:
    monkeypatch.setattr(Replica, "runs_past_finish", past_finish)
    return [_figures(simulate.run(scenario.load(name, overrides + [f"simulation.seed={seed}"]))) for seed in SEEDS]


@pytest.mark.parametrize("case", list(CASES))
def test_runs_past_completions_keep_the_distributions(monkeypatch, case: str) -> None:
    """Per metric over 30 seeds: the mean of the new engine is within 4 standard errors of the old
    one's (the standard error of a difference of two means from the seed-to-seed spreads), and the
    mean of the per-seed differences (each seed's traffic is the same for both) within 4 of its own
    standard errors; the spreads themselves within a factor 1.6."""
    name, overrides = CASES[case]
    new = _runs(monkeypatch, name, overrides, True)
    old = _runs(monkeypatch, name, overrides, False)
    n = len(SEEDS)
    for key in new[0]:
        a = np.array([r[key] for r in new])
        b = np.array([r[key] for r in old])
        if np.all(a == b):
            continue
        se = math.sqrt(a.var(ddof=1) / n + b.var(ddof=1) / n)
        assert abs(a.mean() - b.mean()) <= 4.0 * se, (key, a.mean(), b.mean(), se)
        d = a - b
        assert abs(d.mean()) <= 4.0 * d.std(ddof=1) / math.sqrt(n) + 1e-12 * abs(b.mean()), (key, d.mean(), d.std())
        if b.std() > 0:
            assert 1 / 1.6 <= a.std(ddof=1) / b.std(ddof=1) <= 1.6, (key, a.std(), b.std())


@pytest.mark.parametrize("overrides", [
    ["speculative.method=none"],
    # a KV cache of a few requests: preemptions, runs ended before a step that would preempt
    ["speculative.method=none", "traffic.arrival.rate_rps=6", "engine.gpu_memory_utilization=0.75"],
    ["speculative.method=none", "traffic.arrival={process: closed_loop, concurrency: 8}"],
])
def test_without_speculation_runs_past_completions_change_nothing(monkeypatch, overrides: list[str]) -> None:
    """Nothing is drawn without speculation: runs past completions give the results of runs that
    end at the first completion and of the engine stepped one step at a time (to rounding: a run's
    step ends are one cumulative sum from its start)."""
    sc = scenario.load("chatbot_single_turn", ["traffic.num_requests=150", *overrides])
    # runs as long as their requests (its segments end where the old runs end: the KV use recorded
    # per run or segment is the same)
    monkeypatch.setattr(Replica, "run_cells", 10 ** 9)
    results = {}
    for label, past, fast in (("new", True, True), ("old", False, True), ("steps", True, False)):
        monkeypatch.setattr(Replica, "runs_past_finish", past)
        original = Replica.__init__

        def init(self, *a, _original=original, _fast=fast, **kw):
            _original(self, *a, **kw)
            self.fast_forward = _fast

        monkeypatch.setattr(Replica, "__init__", init)
        results[label] = simulate.run(sc)
        monkeypatch.setattr(Replica, "__init__", original)
    new = results["new"]
    for other in (results["old"], results["steps"]):
        assert new.num_steps == other.num_steps
        for col in ("first_scheduled_s", "first_token_s", "finish_s", "num_chunks", "num_preemptions"):
            np.testing.assert_allclose(new.requests[col].to_numpy(float), other.requests[col].to_numpy(float),
                                       rtol=1e-9, err_msg=col)
        for a, b in zip(new.cluster.replicas, other.cluster.replicas):
            np.testing.assert_allclose(a.recorder.t, b.recorder.t, rtol=1e-9)
            np.testing.assert_allclose(a.recorder.features, b.recorder.features, rtol=1e-9)
        np.testing.assert_allclose(np.sort(np.concatenate([c for r in new.cluster.replicas for c in r.recorder.itl_chunks])),
                                   np.sort(np.concatenate([c for r in other.cluster.replicas for c in r.recorder.itl_chunks])),
                                   rtol=1e-7)
    assert new.metrics["preemptions"] == results["steps"].metrics["preemptions"]
    # recorded per run or segment (a step recorded alone counts the running requests after it)
    for a, b in zip(new.cluster.replicas, results["old"].cluster.replicas):
        np.testing.assert_array_equal(a.recorder.running, b.recorder.running)
        np.testing.assert_allclose(a.recorder.kv_used, b.recorder.kv_used, rtol=1e-9, atol=1e-12)
