"""Speculative decoding inside the simulator, against the draft-and-verify arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capacity.inputs import scenario

from capacity.sim import simulate
from capacity.cli import main


def spec_scenario(method="eagle3", n=3, acceptance=None, prompt=200, output=200, concurrency=1, num=None,
                  model="Qwen/Qwen3-8B"):
    return scenario.from_dict({
        "deployment": {"gpu": "MI300X", "model": model},
        "speculative": {"method": method, "num_speculative_tokens": n, "acceptance": acceptance},
        "traffic": {"arrival": {"process": "closed_loop", "concurrency": concurrency},
                    "num_requests": num or max(4 * concurrency, 4),
                    "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": prompt},
                                 "output_tokens": {"dist": "fixed", "value": output}}]},
    })


def test_n_zero_is_byte_identical_to_speculation_off(capsys):
    base = ["simulate", "--json", "--no-compare", "--set", "traffic.num_requests=80"]
    assert main(base + ["--set", "speculative.method=none"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert main(base + ["--set", "speculative.method=gemma4_mtp", "--set", "speculative.num_speculative_tokens=0"]) == 0
    zero = json.loads(capsys.readouterr().out)
    assert off["metrics"] == zero["metrics"]
    assert main(base + ["--set", "speculative.method=gemma4_mtp", "--set", "speculative.num_speculative_tokens=3"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert on["metrics"] != off["metrics"]


def test_zero_load_speedup_is_accepted_length_times_step_ratio():
    """One request at a time, every draft accepted: each round emits N + 1 tokens, so
    TPOT = round time / (N + 1) and speedup = (N + 1) · baseline step / round time."""
    n = 3
    off = simulate.run(spec_scenario(method="none", n=0))
    on = simulate.run(spec_scenario(n=n, acceptance={"model": "iid", "alpha": 1.0}))
    r_off, r_on = off.requests.iloc[0], on.requests.iloc[0]
    tpot_off = (r_off.finish_s - r_off.first_token_s) / (200 - 1)
    # decode rounds of the spec run: 199 tokens after the first, N + 1 per round
    rounds = int(np.ceil(199 / (n + 1)))
    assert on.requests.num_chunks.iloc[0] == 1 + rounds
    round_time = (r_on.finish_s - r_on.first_token_s) / rounds
    cost = on.deployed.cost
    ctx = 200 + 1 + n
    # the target forward over 1 + N tokens, plus the profile's speculative costs: host time per
    # verifying sequence (V1 runner) and time per verified draft token
    expected_round = (cost.step_time_s(np.array([1 + n]), np.array([ctx]), num_sampled=1 + n)
                      + cost.efficiency["spec_seq_overhead_us"] * 1e-6 + n * cost.efficiency["spec_token_overhead_us"] * 1e-6)
    assert round_time == pytest.approx(expected_round + on.step_breakdown_s["draft"] / on.num_steps, rel=0.05)
    speedup = tpot_off / ((r_on.finish_s - r_on.first_token_s) / 199)
    assert speedup == pytest.approx((n + 1) * tpot_off / round_time, rel=0.05)
    assert speedup > 1.5


def test_mean_accepted_length_matches_iid_formula_in_the_engine():
    alpha, n = 0.7, 4
    res = simulate.run(spec_scenario(n=n, acceptance={"model": "iid", "alpha": alpha}, output=400, concurrency=8, num=64))
    r = res.requests
    tau = 1 + r.spec_accepted.sum() / r.spec_steps.sum()
    expected = (1 - alpha ** (n + 1)) / (1 - alpha)
    steps = r.spec_steps.sum()
    se = np.sqrt(2.0 / steps)  # Var(A) < 2 for these parameters (truncated geometric)
    assert tau == pytest.approx(expected, abs=4 * se)
    assert r.num_chunks.sum() < r.output_tokens.sum()  # several tokens per streamed chunk


def _speedup(concurrency, prompt):
    kw = dict(prompt=prompt, output=128, concurrency=concurrency, num=2 * concurrency)
    off = simulate.run(spec_scenario(method="none", n=0, **kw))
    on = simulate.run(spec_scenario(n=3, acceptance={"model": "iid", "alpha": 0.6}, **kw))
    return on.metrics["output_throughput_tok_s"] / off.metrics["output_throughput_tok_s"]


def test_speedup_falls_with_batch_at_short_context_and_holds_better_at_long_context():
    short_1, short_b = _speedup(1, 128), _speedup(128, 128)
    long_1, long_b = _speedup(1, 16000), _speedup(128, 16000)
    assert short_b < short_1
    assert long_b / long_1 > short_b / short_1


def test_bad_speculative_input_is_one_line(capsys):
    for sets, words in ((["speculative.method=medusa9", "speculative.num_speculative_tokens=2"], "unknown"),
                        (["speculative.method=dflash", "speculative.num_speculative_tokens=40"], "block"),
                        (["speculative.method=eagle3", "speculative.num_speculative_tokens=2",
                          "speculative.acceptance={model: iid, alpha: 1.5}"], "alpha")):
        args = ["simulate"] + [x for s in sets for x in ("--set", s)]
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert words in err.lower() and "\n" not in err
