"""Expert GEMMs of int4 (W4A16) MoE models stream their weights at the profile's `moe_int4` efficiency and
run their FLOPs at `moe` (vLLM's triton int4 grouped GEMM unpacks each weight tile to bf16 in registers, once per
block of an expert's tokens, and multiplies on the bf16 matrix cores: fused_moe.py `fused_moe_kernel_gptq_awq`);
every other expert format
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


def test_int4_prefill_computes_at_moe_where_the_weights_keep_up(monkeypatch):
    """16 prompt chunks of 2048 tokens with the int4 weights unpacked fast (`moe_int4` 1 under tuned tiles): the
    grouped GEMM is compute-bound and its time is the routed-expert FLOPs at bf16 over `moe`."""
    from capacity.cost import step_cost

    monkeypatch.setattr(step_cost, "INT4_DEFAULT_TILES", False)   # MI300X has no tuned int4 tiles (test_int4_moe_tiles)
    base = _moe_seconds("moonshotai/Kimi-K2.5", tokens=2048, moe=0.4, moe_int4=1.0)
    assert _moe_seconds("moonshotai/Kimi-K2.5", tokens=2048, moe=0.4, moe_int4=0.9) == pytest.approx(base, rel=1e-12)
    assert _moe_seconds("moonshotai/Kimi-K2.5", tokens=2048, moe=0.2, moe_int4=1.0) == pytest.approx(2 * base, rel=1e-12)


def _monte_carlo_blocks(tokens: int, experts: int = 384, top_k: int = 8, block_m: int = 64, draws: int = 40) -> float:
    """Mean over random routings of sum over experts of ceil(tokens routed to it / block_m): each token picks top_k
    distinct experts uniformly, as the kernel's blocks are counted in vLLM's moe_align_block_size."""
    rng = np.random.default_rng(7)
    total = 0.0
    for _ in range(draws):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k].ravel()
        total += np.ceil(np.bincount(picks, minlength=experts) / block_m).sum()
    return total / draws


def test_int4_weights_are_unpacked_once_per_block_of_tokens_on_rocm():
    """vLLM's Triton int4 MoE (fused_moe.py `fused_moe_kernel_gptq_awq`) runs one program per BLOCK_SIZE_M tokens
    of an expert and unpacks the expert's weight panel in each, so with the unpacking as the bound (`moe_int4` low,
    `moe` high) one 8k-token prompt chunk of Kimi-K2.5 (384 experts, top 8, 64-token blocks) costs what its blocks
    count against a 1k chunk's, one block per expert: about 3.05x, from random routings."""
    gpu = load_gpu("MI300X")
    cost = StepCostModel(gpu, load_model("moonshotai/Kimi-K2.5"), 8)
    eff = {**gpu.efficiency, "moe": 1.0, "moe_int4": 0.02}

    def seconds(tokens: int) -> float:
        return float(cost.time_parts(cost.features(np.array([tokens]), np.array([tokens])), eff)["moe_gemm"])

    expected = _monte_carlo_blocks(8192) / _monte_carlo_blocks(1024)
    assert 2.9 < expected < 3.2
    assert seconds(8192) / seconds(1024) == pytest.approx(expected, rel=0.01)


def test_int4_block_size_follows_vllms_default_config():
    """fused_moe.py `get_default_config` for int4_w4a16: BLOCK_SIZE_M 16 for M <= 20 tokens, 32 for M <= 40, 64 above."""
    from capacity.cost.step_cost import int4_triton_block_m

    assert [int4_triton_block_m(m) for m in (1, 20, 21, 40, 41, 8192)] == [16, 16, 32, 32, 64, 64]


def test_int4_decode_touches_each_expert_once():
    """A decode step's experts each get fewer tokens than a block holds: the weight term counts touched experts,
    E (1 - (1 - k/E)^n) (modelling_notes section 3.1), whether or not the per-block rule is on."""
    from capacity.cost import step_cost

    assert step_cost.expected_expert_blocks(384, 8, 64.0, 64.0) == pytest.approx(
        step_cost.expected_distinct_experts(384, 8, 64.0), rel=1e-12)


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


def test_the_tuned_int4_config_works_through_the_weights_as_many_times_faster_as_vllm_measured():
    """MI300X runs vLLM's int4 MoE under `get_default_config`'s untuned tiles (vLLM ships no int4_w4a16 config for its
    E=384 shapes); MI355X's rows ran the tuned `E=384,N=256,device_name=AMD_Instinct_MI355X,dtype=int4_w4a16.json`,
    whose pull request (vLLM #35093) measured the MoE alone "~5-7x" faster than the default on CDNA4. The two shipped
    fits price a Kimi-K2.5 decode step's int4 weight reads at fractions of each GPU's own HBM bandwidth that differ by
    about that factor (4-8x allowed: the measurement is one GPU's, the fits two GPUs')."""
    def weight_fraction(name: str) -> float:
        gpu = load_gpu(name)
        cost = StepCostModel(gpu, load_model("moonshotai/Kimi-K2.5"), 8)
        seconds = float(cost.time_parts(cost.features(np.ones(4), np.full(4, 1024)),
                                        {**gpu.efficiency, "moe": 1.0})["moe_gemm"])
        return 1.0 / (seconds * gpu.hbm_bandwidth_tb_s)   # the same weight bytes on both: rate / bandwidth

    assert 4.0 < weight_fraction("MI355X") / weight_fraction("MI300X") < 8.0
