"""Screening switches of the expert GEMMs (capacity/cost/step_cost.py, off as shipped; docs/seed_validation.md §49):
whole BLOCK_SIZE_M tiles per expert (MOE_TILE_PADDING), CUDA's weight-only 4-bit MoE kernel (W4A16_EXPERT_KERNEL) and
the grouped GEMM's rate by tokens per expert (MOE_M_HALF).
The tile padding is checked against a direct simulation of vLLM's moe_align_block_size on random routing, not against
the code's own formula."""

from __future__ import annotations

import numpy as np
import pytest

from capacity.cost import step_cost as sc
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model


def marlin_block_m(tokens: int, top_k: int, experts: int) -> int:
    """vLLM's Marlin MoE tile rule, as written in vllm/model_executor/layers/fused_moe/fused_marlin_moe.py."""
    for block_size_m in [8, 16, 32, 48, 64]:
        if tokens * top_k / experts / block_size_m < 0.9:
            break
    return block_size_m


def simulated_padding(tokens: int, top_k: int, experts: int, trials: int = 200, seed: int = 0) -> float:
    """Padded rows over routed rows when every token picks top_k distinct experts at random and each expert's count is
    rounded up to a multiple of the tile (moe_align_block_size)."""
    rng = np.random.default_rng(seed)
    block = marlin_block_m(tokens, top_k, experts)
    ratios = []
    for _ in range(trials):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
        counts = np.bincount(picks.ravel(), minlength=experts)
        ratios.append(float((np.ceil(counts / block) * block).sum()) / (tokens * top_k))
    return float(np.mean(ratios))


@pytest.fixture
def padding_on(monkeypatch):
    monkeypatch.setattr(sc, "MOE_TILE_PADDING", True)


@pytest.mark.parametrize("tokens", [4, 64, 256, 1027, 4096])
def test_padding_matches_a_simulation_of_vllms_tiles(padding_on, tokens):
    model = load_model("openai/gpt-oss-120b")      # 128 experts, top-4
    cost = sc.StepCostModel(load_gpu("H200"), model, 1)
    f = cost.features(np.array([float(tokens)]), np.array([float(tokens)]))
    modelled = float(cost._tile_padding(cost.routed_tokens(f), sc._float_or_array(f.num_tokens)))
    assert modelled == pytest.approx(simulated_padding(tokens, model.experts_per_token, model.num_experts), rel=0.03)


def test_padding_raises_only_the_expert_flops_and_is_off_as_shipped(monkeypatch):
    model = load_model("openai/gpt-oss-120b")
    assert sc.MOE_TILE_PADDING is False
    cost = sc.StepCostModel(load_gpu("H200"), model, 1)
    f = cost.features(np.array([1027.0]), np.array([1027.0]))
    off = cost.time_parts(f)
    monkeypatch.setattr(sc, "MOE_TILE_PADDING", True)
    on = sc.StepCostModel(load_gpu("H200"), model, 1).time_parts(f)
    assert on["moe_gemm"] > off["moe_gemm"]
    assert {k: v for k, v in on.items() if k != "moe_gemm"} == {k: v for k, v in off.items() if k != "moe_gemm"}


def test_weight_only_4bit_experts_take_the_weight_only_kernel_on_cuda_only(monkeypatch):
    monkeypatch.setattr(sc, "W4A16_EXPERT_KERNEL", True)
    gpt_oss = load_model("openai/gpt-oss-120b")    # MXFP4 experts: weight-only (bf16 compute) on Hopper
    assert sc.StepCostModel(load_gpu("H100"), gpt_oss, 1).moe_efficiency_key == "moe_int4"
    assert sc.StepCostModel(load_gpu("H100"), load_model("MiniMaxAI/MiniMax-M2.5"), 4).moe_efficiency_key == "moe"
    assert sc.StepCostModel(load_gpu("MI300X"), gpt_oss, 1).moe_efficiency_key == "moe"


def test_m_half_slows_few_tokens_per_expert_and_fades_with_many(monkeypatch):
    """MOE_M_HALF (off as shipped): the grouped GEMM's rate m / (m + m_half), AITER's measured shape, so a 1k-token
    gpt-oss-120b prompt (about 32 routed tokens per expert) pays (32 + 44) / 32 on its expert FLOPs and a very long
    one (about 3,000 per expert) almost nothing."""
    model = load_model("openai/gpt-oss-120b")
    assert sc.MOE_M_HALF == 0.0

    def moe_flops_side(tokens: float, m_half: float) -> float:
        monkeypatch.setattr(sc, "MOE_M_HALF", m_half)
        monkeypatch.setattr(sc, "MOE_TOKEN_COST_PER_EXPERT", True)
        gpu = load_gpu("H200").with_overrides(efficiency={"hbm": 1.0, "moe_token_overhead_ns": 0.0})
        cost = sc.StepCostModel(gpu, model, 1)
        return float(cost.time_parts(cost.features(np.array([tokens]), np.array([tokens])))["moe_gemm"])

    assert moe_flops_side(1024.0, 44.0) / moe_flops_side(1024.0, 0.0) == pytest.approx((32 + 44) / 32, rel=0.03)
    assert moe_flops_side(98304.0, 44.0) / moe_flops_side(98304.0, 0.0) == pytest.approx(1.0, abs=0.02)
