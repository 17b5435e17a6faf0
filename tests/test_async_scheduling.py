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
    base = {"name": "a", "deployment": {"gpu": "MI300X", "model": MODEL},
            "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 4,
                        "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 64},
                                     "output_tokens": {"dist": "fixed", "value": 8}}]}}
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
