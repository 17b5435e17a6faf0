"""`moe_token_overhead_ns`: work of a MoE layer that every tensor-parallel rank repeats for each token and each expert
it is routed to (routing, sorting, the tokens' gather and scatter), so TP does not divide it. Truth: n tokens x top-k
x MoE layers x the time per routed token, the same at every TP size, and nothing for a dense model or with the entry
absent (0)."""

import numpy as np
import pytest

from capacity.cost.step_cost import StepCostModel
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model

TOKENS = 4096


def _moe_s(gpu, model, tp):
    return StepCostModel(gpu, model, tp).forward([TOKENS], [TOKENS]).parts_s.get("moe_gemm", 0.0)


def test_the_per_token_moe_cost_is_the_same_at_every_tp_size():
    model = load_model("MiniMaxAI/MiniMax-M2.5", weight_precision="fp8")
    base = load_gpu("MI355X").with_overrides(efficiency={"moe_token_overhead_ns": 0.0})   # none
    assert load_gpu("MI300X").efficiency["moe_token_overhead_ns"] == 0.0          # absent from a profile: none
    with_cost = base.with_overrides(efficiency={"moe_token_overhead_ns": 500.0})
    expected = 500e-9 * TOKENS * model.experts_per_token * model.num_moe_layers
    for tp in (1, 2, 8):
        assert _moe_s(with_cost, model, tp) - _moe_s(base, model, tp) == pytest.approx(expected, rel=1e-9)


def test_a_dense_model_pays_none():
    model = load_model("meta-llama/Llama-3.3-70B-Instruct", weight_precision="fp8")
    gpu = load_gpu("MI355X").with_overrides(efficiency={"moe_token_overhead_ns": 500.0})
    base = StepCostModel(load_gpu("MI355X"), model, 2).forward([TOKENS], [TOKENS]).total_s
    assert StepCostModel(gpu, model, 2).forward([TOKENS], [TOKENS]).total_s == base


def test_expert_parallelism_does_not_split_it():
    # vLLM's TP + EP without DP routes every token on every GPU (top-k, sorting, the expert map) and only the grouped
    # GEMMs skip other GPUs' experts; MI355X's EP2/4/8 rows fit worse with the cost split by EP (docs section 32)
    model = load_model("MiniMaxAI/MiniMax-M2.5", weight_precision="fp8")
    base = load_gpu("MI355X").with_overrides(efficiency={"moe_token_overhead_ns": 0.0})
    with_cost = base.with_overrides(efficiency={"moe_token_overhead_ns": 500.0})
    expected = 500e-9 * TOKENS * model.experts_per_token * model.num_moe_layers

    def moe(gpu):
        return StepCostModel(gpu, model, 8, expert_parallel=True).forward([TOKENS], [TOKENS]).parts_s["moe_gemm"]
    assert moe(with_cost) - moe(base) == pytest.approx(expected, rel=1e-9)


def test_a_profile_that_ships_the_term_refits_it_without_being_asked():
    from capacity.fidelity.calibrate import opt_in_keys_fitted
    keys = ("gemm", "moe_token_overhead_ns")
    why: dict[str, str] = {}
    assert opt_in_keys_fitted(keys, (), load_gpu("H200").efficiency, why) == keys      # H200 ships it (fitted)
    assert opt_in_keys_fitted(keys, (), load_gpu("MI355X").efficiency, why) == keys    # so does MI355X (2026-12-06)
    assert opt_in_keys_fitted(keys, (), load_gpu("MI300X").efficiency, why) == ("gemm",)   # MI300X has none: opt-in
    assert "--fit" in why["moe_token_overhead_ns"]
    assert opt_in_keys_fitted(keys, ("moe_token_overhead_ns",), load_gpu("MI300X").efficiency, {}) == keys


@pytest.mark.parametrize("tp, stored", [(1, 3072), (2, 1536), (4, 768), (8, 512)])
def test_gpt_oss_expert_rounding_on_rocm_follows_vllms_round_up(monkeypatch, tp, stored):
    """The screening switch GPT_OSS_ROCM_EXPERT_ROUNDING prices vLLM's rounding of gpt-oss's expert width per rank
    on ROCm (quark_moe.py: round_up(intermediate_size_per_partition, 256)): 2880 / TP stored as `stored`, so the
    expert bytes and FLOPs per GPU grow by stored / (2880 / TP); nothing on CUDA, nothing with the switch off."""
    from capacity.cost import step_cost

    m = load_model("openai/gpt-oss-120b")
    gpu = load_gpu("MI355X").with_overrides(efficiency={"moe_token_overhead_ns": 0.0})   # moe_gemm: the roofline only
    f = StepCostModel(gpu, m, tp).decode_features(np.full((1, 4), 1024))
    off = StepCostModel(gpu, m, tp).time_parts(f, with_overhead=False)["moe_gemm"]
    monkeypatch.setattr(step_cost, "GPT_OSS_ROCM_EXPERT_ROUNDING", 256)
    on = StepCostModel(gpu, m, tp).time_parts(f, with_overhead=False)["moe_gemm"]
    assert float(np.ravel(on)[0]) == pytest.approx(float(np.ravel(off)[0]) * stored / (2880 / tp), rel=1e-12)
    h200 = StepCostModel(load_gpu("H200"), m, tp)
    assert h200._expert_pad == 1.0


def test_on_the_compute_side_a_weight_bound_step_hides_it(monkeypatch):
    """The screening form (MOE_TOKEN_COST_COMPUTE_SIDE): the per-routed-token time joins the grouped GEMM's compute,
    max(compute + n x k x layers x t, weight reads). A 4-token decode step of MiniMax-M2.5 reads ~30 touched experts'
    weights per layer, far longer than 4 x 8 x 62 routed tokens at 10 ns, so its time does not move; a 16,384-token
    prompt step, whose expert FLOPs outlast every expert's weights, pays the whole amount."""
    from capacity.cost import step_cost
    monkeypatch.setattr(step_cost, "MOE_TOKEN_COST_COMPUTE_SIDE", True)
    model = load_model("MiniMaxAI/MiniMax-M2.5", weight_precision="fp8")
    base = load_gpu("MI355X").with_overrides(efficiency={"moe_token_overhead_ns": 0.0})
    with_cost = base.with_overrides(efficiency={"moe_token_overhead_ns": 10.0})

    def moe(gpu, tokens):
        cost = StepCostModel(gpu, model, 2)
        if tokens == 1:
            return cost.forward(np.ones(4, int), np.full(4, 1000)).parts_s["moe_gemm"]
        return cost.forward([tokens], [tokens]).parts_s["moe_gemm"]

    assert moe(with_cost, 1) == pytest.approx(moe(base, 1), rel=1e-12)
    expected = 10e-9 * 16384 * model.experts_per_token * model.num_moe_layers
    assert moe(with_cost, 16384) - moe(base, 16384) == pytest.approx(expected, rel=1e-9)


# ---- `aiter_moe_token_overhead_ns`: the same form, paid only by a step on AITER's fused MoE (docs section 46: the
# rows' images ran AITER's untuned defaults for these models' MoE shapes, which the kernel curve does not describe)

def _moe_on(gpu, model, tp, backend):
    return StepCostModel(gpu, model, tp, moe_backend=backend).forward([TOKENS], [TOKENS]).parts_s.get("moe_gemm", 0.0)


def test_the_aiter_per_token_time_is_paid_on_aiters_moe_only_and_at_every_tp_size():
    model = load_model("MiniMaxAI/MiniMax-M2.5", weight_precision="fp8")
    base = load_gpu("MI300X").with_overrides(efficiency={"aiter_moe_token_overhead_ns": 0.0})
    with_cost = base.with_overrides(efficiency={"aiter_moe_token_overhead_ns": 500.0})
    expected = 500e-9 * TOKENS * model.experts_per_token * model.num_moe_layers
    for tp in (1, 2, 8):
        assert _moe_on(with_cost, model, tp, "aiter") - _moe_on(base, model, tp, "aiter") == pytest.approx(expected,
                                                                                                          rel=1e-9)
        assert _moe_on(with_cost, model, tp, "triton") == _moe_on(base, model, tp, "triton")     # Triton's MoE: none
    dense = load_model("meta-llama/Llama-3.3-70B-Instruct", weight_precision="fp8")
    assert (StepCostModel(with_cost, dense, 2).forward([TOKENS], [TOKENS]).total_s
            == StepCostModel(base, dense, 2).forward([TOKENS], [TOKENS]).total_s)


def test_the_aiter_per_token_time_adds_to_the_every_backend_one():
    model = load_model("MiniMaxAI/MiniMax-M2.5", weight_precision="fp8")
    none = load_gpu("MI355X").with_overrides(efficiency={"moe_token_overhead_ns": 0.0, "aiter_moe_token_overhead_ns": 0.0})
    both = none.with_overrides(efficiency={"moe_token_overhead_ns": 300.0, "aiter_moe_token_overhead_ns": 200.0})
    expected = 500e-9 * TOKENS * model.experts_per_token * model.num_moe_layers
    assert _moe_on(both, model, 2, "aiter") - _moe_on(none, model, 2, "aiter") == pytest.approx(expected, rel=1e-9)
    assert (_moe_on(both, model, 2, "triton") - _moe_on(none, model, 2, "triton")
            == pytest.approx(expected * 300 / 500, rel=1e-9))
