"""Expert GEMMs of int4 (W4A16) MoE models stream their weights at the profile's `moe_int4` efficiency and
run their FLOPs at `moe` (vLLM's triton int4 grouped GEMM unpacks each weight tile to bf16 in registers and
multiplies on the bf16 matrix cores: fused_moe.py `fused_moe_kernel_gptq_awq`); every other expert format
uses `moe` for both (capacity.inputs.hardware.GpuProfile.moe_efficiency_key)."""

import numpy as np
import pytest

from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.cost.step_cost import StepCostModel


def _moe_seconds(model_id: str, tokens: int = 1, **eff) -> float:
    gpu = load_gpu("MI300X")
    cost = StepCostModel(gpu, load_model(model_id), 8)
    f = cost.features(np.full(16, tokens), np.full(16, 2048))
    return float(cost.time_parts(f, {**gpu.efficiency, **eff})["moe_gemm"])


def test_int4_experts_scale_inversely_with_moe_int4_only():
    base = _moe_seconds("moonshotai/Kimi-K2.5", moe_int4=0.4)
    # both roofline terms of the expert GEMM divide by the efficiency: halving it doubles the time
    assert _moe_seconds("moonshotai/Kimi-K2.5", moe_int4=0.2) == pytest.approx(2 * base, rel=1e-12)
    assert _moe_seconds("moonshotai/Kimi-K2.5", moe_int4=0.4, moe=0.9) == pytest.approx(base, rel=1e-12)


def test_int4_prefill_computes_at_moe_not_moe_int4():
    """16 prompt chunks of 2048 tokens: 32k tokens touch every expert, so the grouped GEMM is compute-bound
    and its time is the routed-expert FLOPs at bf16 over `moe`, whatever `moe_int4` is."""
    base = _moe_seconds("moonshotai/Kimi-K2.5", tokens=2048, moe=0.8, moe_int4=0.4)
    assert _moe_seconds("moonshotai/Kimi-K2.5", tokens=2048, moe=0.8, moe_int4=0.2) == pytest.approx(base, rel=1e-12)
    assert _moe_seconds("moonshotai/Kimi-K2.5", tokens=2048, moe=0.4, moe_int4=0.4) == pytest.approx(2 * base, rel=1e-12)


def test_other_expert_formats_ignore_moe_int4():
    base = _moe_seconds("openai/gpt-oss-120b", moe=0.5)
    assert _moe_seconds("openai/gpt-oss-120b", moe=0.5, moe_int4=0.05) == pytest.approx(base, rel=1e-12)
    assert _moe_seconds("openai/gpt-oss-120b", moe=0.25) == pytest.approx(2 * base, rel=1e-12)


def test_efficiency_key_by_weight_format():
    gpu = load_gpu("MI355X")
    assert [gpu.moe_efficiency_key(d) for d in ("int4", "AWQ", "w4a16", "mxfp4", "fp8", "bf16")] == \
        ["moe_int4", "moe_int4", "moe_int4", "moe", "moe", "moe"]


def _decode_step_s(gpu, users: int, tp: int = 2) -> float:
    cost = StepCostModel(gpu, load_model("openai/gpt-oss-120b"), tp)
    return float(cost.step_time_s(np.ones(users), np.full(users, 1536)))


@pytest.mark.parametrize("users", [4, 16, 64])
def test_hopper_siblings_decode_moe_at_one_expert_rate(users):
    """InferenceX's vLLM v0.18.0 rows (capacity/data/measurements/serving_vllm.csv): gpt-oss-120b at TP2, 1k
    prompts, decodes at H100 / H200 TPOT 1.06, 1.04, 1.03 at 4, 16, 64 users (v0.18.0), although H200 has 1.43x the HBM
    bandwidth (dense Llama-3.3-70B FP8 at TP2, 1k: 1.17-1.32). H200 priced with H100's efficiencies, as a family transfer
    does, must keep that ratio below 1.12 (it gives 1.02-1.04); with the expert efficiency taken as a fraction
    of H200's own HBM it was 1.15-1.33."""
    h100 = load_gpu("H100")
    transfer = load_gpu("H200").with_overrides(efficiency=dict(h100.efficiency),
                                               expert_stream_bandwidth_tb_s=h100.hbm_bandwidth_tb_s)
    ratio = _decode_step_s(h100, users) / _decode_step_s(transfer, users)
    assert 1.0 <= ratio <= 1.12
    as_own_hbm = load_gpu("H200").with_overrides(efficiency=dict(h100.efficiency))
    assert _decode_step_s(h100, users) / _decode_step_s(as_own_hbm, users) > ratio
