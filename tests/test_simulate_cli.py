"""End to end: scenario -> simulation -> metrics -> CLI, against independent truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from capacity.sim import metrics

from capacity.inputs import scenario

from capacity.sim import simulate
from capacity.cli import main
from capacity.inputs.hardware import load_gpu


def small(**traffic) -> scenario.Scenario:
    data = {
        "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
        "traffic": {"arrival": {"process": "poisson", "rate_rps": 6.0}, "num_requests": 400,
                    "classes": [{"name": "chat", "input_tokens": {"dist": "uniform", "low": 100, "high": 2000},
                                 "output_tokens": {"dist": "uniform", "low": 20, "high": 300}}]},
    }
    data["traffic"].update(traffic)
    return scenario.from_dict(data)


def test_littles_law_holds():
    res = simulate.run(small())
    r = res.requests
    t0, t1 = r.arrival_s.min(), r.finish_s.max()
    lam = len(r) / (t1 - t0)
    mean_e2e = (r.finish_s - r.arrival_s).mean()
    assert metrics.mean_in_system(r, t0, t1) == pytest.approx(lam * mean_e2e, rel=0.02)


def test_tokens_out_equal_tokens_requested():
    res = simulate.run(small())
    assert res.metrics["completed"] == 400
    assert res.metrics["total_output_tokens"] == int(res.requests.output_tokens.sum())


def test_zero_load_latencies_equal_the_step_model():
    """One request alone: TTFT = request overhead + one prefill step, TPOT = mean of its decode steps."""
    sc = small(arrival={"process": "poisson", "rate_rps": 0.001}, num_requests=1,
               classes=[{"name": "one", "input_tokens": {"dist": "fixed", "value": 1000},
                         "output_tokens": {"dist": "fixed", "value": 50}}])
    res = simulate.run(sc)
    cost = res.deployed.cost
    prefill = cost.step_time_s(np.array([1000]), np.array([1000]))
    decode = [cost.step_time_s(np.array([1]), np.array([1000 + i])) for i in range(1, 50)]
    r = res.requests.iloc[0]
    delay = res.deployed.gpu.efficiency["request_overhead_ms"] * 1e-3  # serving stack before the scheduler
    assert r.first_token_s - r.arrival_s == pytest.approx(delay + prefill, rel=1e-9)
    assert (r.finish_s - r.first_token_s) / 49 == pytest.approx(np.mean(decode), rel=1e-9)


def test_overload_is_reported_unstable():
    res = simulate.run(small(arrival={"process": "poisson", "rate_rps": 400.0}, num_requests=3000))
    assert not res.stable


def test_same_seed_same_bytes(capsys):
    args = ["simulate", "--json", "--set", "traffic.num_requests=60"]  # default: speculation on + comparison
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    for part in ("metrics", "stable", "num_gpus", "scenario"):
        assert json.loads(first)[part] == second[part]
    assert {"metrics", "stable", "num_gpus", "scenario"} <= second.keys()
    assert set(second["metrics"]["ttft_ms"]) >= {"mean", "p50", "p90", "p99"}
    # the default model (gemma-4-31B) is not among MI300X's calibration models: a left-out model's error applies
    err = second["step_cost_error"]
    assert err["basis"] == "leave_one_model_out" and err["model_in_fit"] is False
    assert err["figures"] == load_gpu(second["scenario"]["deployment"]["gpu"]).cross_validation["leave_one_model_out"]


def test_json_reruns_are_byte_identical(capsys, tmp_path):
    """The whole `--json` output and the written result.json carry no wall-clock figure, so two runs
    of one scenario and seed compare byte for byte (the text summary says how long a run took)."""
    outputs = []
    for i in range(2):
        assert main(["simulate", "--json", "--set", "traffic.num_requests=60", "--out", str(tmp_path / f"r{i}")]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert (tmp_path / "r0" / "result.json").read_bytes() == (tmp_path / "r1" / "result.json").read_bytes()
    assert "wall_time_s" not in outputs[0] and "speed_x_real_time" not in outputs[0]


@pytest.mark.parametrize("args, words", [
    (["simulate", "--set", "deployment.tensor_paralel_size=2"], "unknown key"),
    (["simulate", "--set", "deployment.gpu=A100"], "unknown GPU"),
    (["simulate", "--set", "deployment.model=nope/none"], "unknown model"),
    (["simulate", "--set", "traffic.arrival.rate_rps=-1"], "rate_rps"),
    (["simulate", "--set", "deployment.model=meta-llama/Llama-3.1-405B", "--set", "speculative.method=none"], "does not fit"),
    (["simulate", "no/such/scenario.yaml"], "not found"),
    # vLLM: "Total number of attention heads (32) must be divisible by tensor parallel size (3)" (vllm/config/model.py
    # ModelConfig.verify_with_parallel_config); gemma-4-31B-it has 32 heads (its config.json)
    (["simulate", "--set", "deployment.tensor_parallel_size=3"], "32 attention heads"),
    # one MI300X server is 8 GPUs on xGMI (hw_profiles/MI300X.yaml scaleup_world_size): TP16 would cross servers
    (["simulate", "--set", "deployment.tensor_parallel_size=16"], "more than one scale-up domain"),
    (["validate", "--gpu", "MI999"], "unknown GPU 'MI999'"),
    (["validate", "--gpu", "MI325X"], "efficiencies are MI300X's"),    # a transferred profile: no rows of its own
])
def test_bad_input_is_one_line_and_exit_2(args, words, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_hardware_and_models_listings(capsys):
    assert main(["hardware", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert {g["name"] for g in gpus} >= {"MI300X", "MI325X", "MI355X", "H100", "H200", "B200"}
    assert main(["models"]) == 0
    assert "meta-llama/Llama-3.1-8B" in capsys.readouterr().out


def test_validate_on_shipped_rows(capsys):
    """The validation command runs on the shipped measurements and predicts every measured column."""
    assert main(["validate", "--max-rows", "3", "--json", "--quiet", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["modelled"] == 3
    row = out["rows"][0]
    assert row["skipped"] is None
    for col in ("output_tok_s_per_gpu", "ttft_ms", "tpot_ms"):
        if row[col] not in ("", None):
            assert row[f"predicted_{col}"] > 0


def _stream(arrival, prompt, output):
    from capacity.inputs.traffic import RequestStream

    n = len(prompt)
    return RequestStream(arrival_s=np.asarray(arrival, dtype=float), prompt_tokens=np.asarray(prompt, dtype=np.int64),
                         output_tokens=np.asarray(output, dtype=np.int64), class_index=np.zeros(n, dtype=np.int64),
                         class_names=["c"], concurrency=None)


def test_requests_above_max_model_len_are_failed_and_change_nothing_else():
    """vLLM refuses a request whose prompt + output exceed --max-model-len and `vllm bench serve`
    counts it in `failed`, outside every statistic (vllm/benchmarks/serve.py calculate_metrics). So an
    open-loop run with such requests equals, for the others, the run without them."""
    from capacity.inputs import scenario
    from capacity.sim import simulate

    rng = np.random.default_rng(1)
    n = 120
    arrival = np.cumsum(rng.exponential(0.5, n))
    prompt = rng.integers(100, 1500, n)
    output = rng.integers(20, 300, n)
    limit = 1200
    too_long = prompt + output > limit                    # computed here, independently of the simulator
    assert 10 < too_long.sum() < n - 10
    sc = scenario.from_dict({"name": "mml", "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
                             "engine": {"max_model_len": limit},
                             "traffic": {"arrival": {"process": "poisson", "rate_rps": 2.0}, "num_requests": n,
                                         "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 10},
                                                      "output_tokens": {"dist": "fixed", "value": 10}}]}}, "test")
    with_refused = simulate.run(sc, stream=_stream(arrival, prompt, output))
    keep = ~too_long
    without = simulate.run(sc, stream=_stream(arrival[keep], prompt[keep], output[keep]))
    m, ref = with_refused.metrics, without.metrics
    assert m["failed"] == int(too_long.sum()) and ref["failed"] == 0
    assert m["completed"] == ref["completed"] == int(keep.sum())
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):            # the same requests, the same times
        assert m[key] == pytest.approx(ref[key], rel=1e-12)   # (a mean summed over a filtered frame: last bits)
    assert m["total_output_tokens"] == ref["total_output_tokens"] == int(output[keep].sum())


def test_every_request_above_max_model_len_is_one_line(capsys):
    rc = main(["simulate", "--no-compare", "--set", "engine.max_model_len=16", "--set", "traffic.num_requests=20"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "max_model_len 16" in err[0]


def test_a_closed_loop_user_sends_the_next_request_after_a_refusal(capsys):
    args = ["simulate", "chatbot_single_turn", "--no-compare", "--json", "--set", "engine.max_model_len=2000", "--set", "traffic.num_requests=200",
            "--set", "traffic.arrival={process: closed_loop, concurrency: 4}"]
    assert main(args) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert m["failed"] > 0 and m["failed"] + m["completed"] == 200 and m["unfinished"] == 0
