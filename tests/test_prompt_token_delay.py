"""The serving stack's delay per prompt token (`prompt_token_overhead_us`): the API server tokenises the
prompt text `vllm bench serve` sends (vllm/benchmarks/datasets.py `RandomDataset.sample` decodes random
token ids and sends `SampleRequest(prompt=...)`), so a request reaches the scheduler
request_overhead_ms + prompt_token_overhead_us x prompt tokens after it is sent.

Truth here is closed form (a lone request's TTFT is that delay plus one prefill step). That re-pricing a
recorded schedule with per-request delays reproduces the simulation exactly is
tests/test_calibrate_roundtrip.py's (its truth carries 6 us/token)."""

from __future__ import annotations

import numpy as np
import pytest

from capacity.fidelity import calibrate
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.inputs.traffic import RequestStream
from capacity.measurements import bench_writer, readers
from capacity.sim import simulate

MODEL = "meta-llama/Llama-3.1-8B"


def _scenario(arrival: dict, n: int, inputs: dict, outputs: dict, eff: dict) -> dict:
    return {"name": "ptd", "deployment": {"gpu": "MI300X", "model": MODEL, "tensor_parallel_size": 1,
                                          "gpu_overrides": {"efficiency": eff}},
            "traffic": {"arrival": arrival, "num_requests": n,
                        "classes": [{"name": "c", "input_tokens": inputs, "output_tokens": outputs}]}}


@pytest.mark.parametrize("prompt", [200, 4000])
def test_lone_request_ttft_is_both_delays_plus_one_prefill(prompt):
    eff = {"request_overhead_ms": 12.0, "prompt_token_overhead_us": 7.5}
    sc = _scenario({"process": "poisson", "rate_rps": 0.001}, 1, {"dist": "fixed", "value": prompt},
                   {"dist": "fixed", "value": 20}, eff)
    res = simulate.run(scenario_mod.from_dict(sc))
    prefill = res.deployed.cost.step_time_s(np.array([prompt]), np.array([prompt]))
    r = res.requests.iloc[0]
    assert r.first_token_s - r.arrival_s == pytest.approx(12e-3 + 7.5e-6 * prompt + prefill, rel=1e-9)


def test_a_long_prompt_sent_first_reaches_the_scheduler_after_a_short_one_sent_later():
    """Open loop: 8,000 tokens at 20 us/token take 160 ms to reach the scheduler, so a 100-token prompt
    sent 1 ms later is scheduled first and its first token comes first."""
    eff = {"request_overhead_ms": 0.0, "prompt_token_overhead_us": 20.0}
    sc = _scenario({"process": "poisson", "rate_rps": 1.0}, 2, {"dist": "fixed", "value": 100},
                   {"dist": "fixed", "value": 4}, eff)
    scenario = scenario_mod.from_dict(sc)
    stream = RequestStream(arrival_s=np.array([0.0, 1e-3]), prompt_tokens=np.array([8000, 100]),
                           output_tokens=np.array([4, 4]), class_index=np.array([0, 0]), class_names=["c"])
    res = simulate.run(scenario, stream=stream)
    first_long, first_short = res.requests.sort_values("arrival_s").first_token_s.to_numpy()
    assert first_short < first_long
    assert first_long >= 160e-3


def test_one_prompt_length_cannot_identify_a_time_per_prompt_token(tmp_path):
    eff = dict(load_gpu("MI300X").efficiency, prompt_token_overhead_us=5.0)
    pricers = []
    for c in (1, 8):
        sc = _scenario({"process": "closed_loop", "concurrency": c}, 2 * c, {"dist": "fixed", "value": 1000},
                       {"dist": "fixed", "value": 64}, eff)
        res = simulate.run(scenario_mod.from_dict(sc))
        path = tmp_path / f"c{c}.json"
        bench_writer.write(res, path, MODEL, max_concurrency=c, metadata={"tp": 1, "gpu": "MI300X"})
        (row,) = readers.read_vllm_results(path).to_dict(orient="records")
        pricers.append(calibrate.Repricer(calibrate.record_row(row, efficiency=eff), load_gpu("MI300X")))
    keys, why = calibrate.identifiable_keys(pricers, eff)
    assert "prompt_token_overhead_us" not in keys
    assert "one prompt length" in why["prompt_token_overhead_us"]


def _one_user_runs(tmp_path, eff: dict) -> list[str]:
    """vllm bench serve result files of one user at 500- and 4,000-token prompts, simulated with `eff`."""
    files = []
    for isl in (500, 4000):
        sc = _scenario({"process": "closed_loop", "concurrency": 1}, 3, {"dist": "fixed", "value": isl},
                       {"dist": "fixed", "value": 16}, eff)
        res = simulate.run(scenario_mod.from_dict(sc))
        path = tmp_path / f"isl{isl}.json"
        bench_writer.write(res, path, MODEL, max_concurrency=1, metadata={"tensor_parallel_size": 1})
        files.append(str(path))
    return files


def test_a_fit_on_the_upper_bound_is_reported_as_failed(tmp_path):
    """Runs whose TTFT grows by 100 us per prompt token (past any tokeniser: the bound is 30) leave the
    fitted time per prompt token on its bound, and the calibration says the fit failed."""
    eff = dict(load_gpu("MI300X").efficiency, request_overhead_ms=5.0, prompt_token_overhead_us=100.0)
    files = _one_user_runs(tmp_path, eff)
    result = calibrate.run(files, "MI300X", progress=False, workers=1, cross_validate=False, rounds=1,
                           keys=("request_overhead_ms", "prompt_token_overhead_us"), prior_weight=0.0)
    assert result.fitted["prompt_token_overhead_us"] == pytest.approx(calibrate.PROMPT_TOKEN_OVERHEAD_MAX_US, rel=1e-3)
    assert any("prompt_token_overhead_us landed on its upper bound" in w for w in result.warnings)


def test_a_fit_on_the_floor_is_reported(tmp_path):
    """Runs made with no time per prompt token at all leave the fitted time per prompt token on its floor 0,
    and the calibration says so (a value on either bound is not a measurement of the mechanism)."""
    eff = dict(load_gpu("MI300X").efficiency, request_overhead_ms=5.0, prompt_token_overhead_us=0.0)
    files = _one_user_runs(tmp_path, eff)
    result = calibrate.run(files, "MI300X", progress=False, workers=1, cross_validate=False, rounds=1,
                           keys=("request_overhead_ms", "prompt_token_overhead_us"), prior_weight=0.0)
    assert result.fitted["prompt_token_overhead_us"] <= calibrate.FLOOR_TOLERANCE["prompt_token_overhead_us"]
    assert any("prompt_token_overhead_us fitted to 0" in w for w in result.warnings)
    assert not any("request_overhead_ms fitted to 0" in w for w in result.warnings)


def test_a_held_parameter_keeps_the_profile_value_and_the_others_absorb_it(tmp_path):
    """`--hold prompt_token_overhead_us` (an ablation): runs made with 10 us/token, fitted with the term
    held at the profile's 0, leave it at 0, say why, and the constant delay grows to carry part of it."""
    eff = dict(load_gpu("MI300X").efficiency, request_overhead_ms=5.0, prompt_token_overhead_us=10.0)
    files = _one_user_runs(tmp_path, eff)
    result = calibrate.run(files, "MI300X", progress=False, workers=1, cross_validate=False, rounds=1,
                           hold=("prompt_token_overhead_us",), prior_weight=0.0)
    assert "prompt_token_overhead_us" not in result.fitted_keys
    assert result.fitted["prompt_token_overhead_us"] == load_gpu("MI300X").efficiency["prompt_token_overhead_us"] == 0.0
    assert "--hold" in result.not_fitted["prompt_token_overhead_us"]
    # the others absorb the per-token time: the constant delay grows, and the prefill's efficiencies (which price
    # a prompt's tokens too) fall below the values the runs were made with (how it splits depends on the profile)
    assert result.fitted["request_overhead_ms"] > 5.0
    assert min(result.fitted[k] / eff[k] for k in ("gemm", "attention")) < 0.95
