"""vLLM's async scheduling: the scheduler prepares step k+1 while the GPU runs step k
(vllm/v1/engine/core.py `step_with_batch_queue`, `max_concurrent_batches` 2 when
`scheduler_config.async_scheduling`; vllm/config/vllm.py sets it True by default unless
incompatible, e.g. the CPU n-gram proposer). So a forward pass lasts max(GPU time, host time), not
their sum. The expectations are that closed form, built from the profile's values by hand."""

from __future__ import annotations

import pytest

from capacity.cost.step_cost import StepCostModel, StepFeatures
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.inputs import scenario as scenario_mod
from capacity.measurements.clients import async_scheduling
from capacity.sim.simulate import deploy

MODEL = "meta-llama/Llama-3.1-8B"


def _decode(batch: int) -> StepFeatures:
    return StepFeatures(num_tokens=float(batch), num_seqs=float(batch), num_sampled=float(batch),
                        attn_flops=0.0, kv_read_bytes=0.0, verify_seqs=0.0)


def _costs(host_ms: float, per_seq_us: float):
    gpu = load_gpu("MI300X").with_overrides(efficiency={"step_overhead_ms": host_ms, "per_seq_overhead_us": per_seq_us,
                                                        "spec_seq_overhead_us": 0.0, "spec_token_overhead_us": 0.0})
    m = load_model(MODEL)
    return gpu, m, StepCostModel(gpu, m, 1), StepCostModel(gpu, m, 1, async_scheduling=False)


def _small_scenario() -> dict:
    return {"name": "a", "deployment": {"gpu": "MI300X", "model": MODEL},
            "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 4,
                        "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 64},
                                     "output_tokens": {"dist": "fixed", "value": 8}}]}}


@pytest.mark.parametrize("host_ms, per_seq_us", [(0.5, 5.0), (40.0, 5.0), (1.0, 400.0)])
def test_a_step_lasts_the_longer_of_gpu_and_host_time(host_ms, per_seq_us) -> None:
    gpu, m, overlapped, serial = _costs(host_ms, per_seq_us)
    batch = 16
    host = host_ms * 1e-3 + per_seq_us * 1e-6 * batch
    # the GPU's share: the serial step minus its host time (weights over HBM, kernels' fixed time)
    gpu_s = serial.total_time(_decode(batch)) - host
    assert gpu_s > 0.0018   # Llama-3.1-8B's 16 GB of weights at MI300X's fitted bandwidth: milliseconds
    assert overlapped.total_time(_decode(batch)) == pytest.approx(max(gpu_s, host), rel=1e-12)


def test_hidden_host_time_costs_nothing_and_exposed_host_time_costs_the_difference() -> None:
    _, _, small, _ = _costs(0.1, 0.0)
    _, _, none, _ = _costs(0.0, 0.0)
    assert small.total_time(_decode(8)) == pytest.approx(none.total_time(_decode(8)), rel=1e-12)
    _, _, big, _ = _costs(100.0, 0.0)
    assert big.total_time(_decode(8)) == pytest.approx(0.1, rel=1e-12)


def test_the_engine_turns_it_off_for_cpu_ngram_and_by_request() -> None:
    base = _small_scenario()
    assert deploy(scenario_mod.from_dict(base)).cost.async_scheduling is True
    off = dict(base, engine={"async_scheduling": False})
    assert deploy(scenario_mod.from_dict(off)).cost.async_scheduling is False
    ngram = dict(base, speculative={"method": "ngram", "num_speculative_tokens": 3})
    assert deploy(scenario_mod.from_dict(ngram)).cost.async_scheduling is False


@pytest.mark.parametrize("version, expected", [("vllm/vllm-openai:v0.11.2", False), ("v0.6.7", False),
                                               ("vllm/vllm-openai-rocm:v0.16.0", True), ("0.23.1rc1", True),
                                               ("vllm/vllm-openai:deepseekv4-cu130", True), ("", True)])
def test_measured_rows_schedule_asynchronously_from_vllm_0_14(version, expected) -> None:
    assert async_scheduling({"framework_version": version}) is expected


# ---- the step already scheduled: a request that arrives while a step runs joins the step after next ----
# vllm/v1/engine/core.py `step_with_batch_queue` (batch_queue_size 2 with async scheduling): after it
# submits step k it schedules step k+1 at once and only then blocks on step k; requests that arrived
# meanwhile are added when step k returns, so the first step that can take them is k+2. With the engine
# idle it schedules a request at once; and the scheduler does not schedule a request whose tokens in
# flight already reach its max_tokens (vllm/v1/core/sched/scheduler.py, the RUNNING loop's
# `num_output_placeholders` guard, L440-471 at 6cf7b26bd4bf), so behind a step in which every running
# request ends there is no step to wait for. Truth: those rules on a clock of constant 10 ms steps.

STEP_S = 0.010


def _first_token_s(output_a: int, arrival_b_s: float, async_on: bool) -> tuple[float, float]:
    from engine_helpers import ConstantCost, run_replica
    from capacity.sim.engine import EngineLimits
    limits = EngineLimits(max_num_batched_tokens=8192, max_num_seqs=8, block_size=16, num_gpu_blocks=1000,
                          async_scheduling=async_on)
    table, _, _ = run_replica([16, 16], [output_a, 4], [0.0, arrival_b_s], ConstantCost(STEP_S), limits)
    return float(table.first_token[0]), float(table.first_token[1])


@pytest.mark.parametrize("async_on, b_first_token_s", [(False, 0.040), (True, 0.050)])
def test_a_request_arriving_mid_step_waits_for_the_step_scheduled_behind_it(async_on, b_first_token_s) -> None:
    # A decodes in steps [0, 10), [10, 20), [20, 30) ms, ...; B arrives at 25 ms, during step 2. Step 3
    # was scheduled at 20 ms without B: synchronous, B's prefill is step 3 (ends 40 ms); async, step 4 (50 ms)
    a, b = _first_token_s(100, 0.025, async_on)
    assert a == pytest.approx(STEP_S, abs=1e-12)           # an idle engine took A at once
    assert b == pytest.approx(b_first_token_s, abs=1e-12)


def test_behind_a_step_in_which_every_running_request_ends_there_is_nothing_to_wait_for() -> None:
    # A's 3 tokens end with step 2 (20-30 ms); B arrives at 25 ms: no step was scheduled behind step 2, so
    # B's prefill is step 3 (ends 40 ms), with or without async scheduling
    for async_on in (False, True):
        assert _first_token_s(3, 0.025, async_on)[1] == pytest.approx(0.040, abs=1e-12)


def test_the_simulator_holds_arrivals_only_where_vllm_schedules_asynchronously() -> None:
    base = _small_scenario()
    assert deploy(scenario_mod.from_dict(base)).limits.async_scheduling is True
    assert deploy(scenario_mod.from_dict(dict(base, engine={"async_scheduling": False}))).limits.async_scheduling is False
    ngram = dict(base, speculative={"method": "ngram", "num_speculative_tokens": 3})
    assert deploy(scenario_mod.from_dict(ngram)).limits.async_scheduling is False
