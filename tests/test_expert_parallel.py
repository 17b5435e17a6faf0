"""Expert parallelism (capacity/cost/step_cost.py module docstring): the MoE part of a step is priced at
the busiest of the EP GPUs. Truth: a Monte Carlo of uniform top-k routing over experts laid out
whole on the GPUs, the closed form of the tensor-parallel price, and vLLM's EP = TP layout."""

from __future__ import annotations

import numpy as np
import pytest

from capacity.errors import CapacityError
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.cost.step_cost import StepCostModel, StepFeatures, expected_max_std_normal


def _decode(batch: int) -> StepFeatures:
    return StepFeatures(num_tokens=float(batch), num_seqs=float(batch), num_sampled=float(batch),
                        attn_flops=0.0, kv_read_bytes=0.0, verify_seqs=0.0)


def _busiest_gpu_monte_carlo(num_experts: int, k: int, ep: int, tokens: int, trials: int = 400,
                             seed: int = 0) -> tuple[float, float]:
    """E[max over GPUs of distinct local experts touched], E[max over GPUs of token-expert pairs]."""
    rng = np.random.default_rng(seed)
    local = num_experts // ep
    touched_max, pairs_max = [], []
    for _ in range(trials):
        chosen = np.argsort(rng.random((tokens, num_experts)), axis=1)[:, :k]   # k distinct experts per token
        gpu_of = chosen // local
        pairs_max.append(np.bincount(gpu_of.ravel(), minlength=ep).max())
        hit = np.zeros(num_experts, dtype=bool)
        hit[chosen.ravel()] = True
        touched_max.append(hit.reshape(ep, local).sum(axis=1).max())
    return float(np.mean(touched_max)), float(np.mean(pairs_max))


def test_expected_max_of_normals_matches_known_values() -> None:
    # E[max of 2] = 1/sqrt(pi); of 4 and 8 from order-statistics tables (1.0294, 1.4236)
    assert expected_max_std_normal(1) == 0.0
    assert expected_max_std_normal(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-6)
    assert expected_max_std_normal(4) == pytest.approx(1.0294, abs=1e-4)
    assert expected_max_std_normal(8) == pytest.approx(1.4236, abs=1e-4)


@pytest.mark.parametrize("tokens", [4, 16, 64])
def test_busiest_gpu_matches_a_routing_monte_carlo(tokens: int) -> None:
    """MiniMax-M2.5 on MI355X at EP = TP = 8 (the shipped InferenceX rows' layout): the EP/TP ratio of
    the weight-read and the FLOP terms equals the busiest GPU's share in a routing simulation."""
    gpu = load_gpu("MI355X")
    m = load_model("MiniMaxAI/MiniMax-M2.5")
    tp = 8
    ep_cost, tp_cost = StepCostModel(gpu, m, tp, expert_parallel=True), StepCostModel(gpu, m, tp)
    touched, pairs = _busiest_gpu_monte_carlo(m.num_experts, m.experts_per_token, tp, tokens)
    mean_touched = m.num_experts / tp * (1 - (1 - m.experts_per_token / m.num_experts) ** tokens)
    mean_pairs = tokens * m.experts_per_token / tp
    f, n = _decode(tokens), float(tokens)
    from capacity.cost.step_cost import expected_distinct_experts
    experts = expected_distinct_experts(m.num_experts, m.experts_per_token, n)
    flops_ratio, bytes_ratio = ep_cost._busiest_expert_gpu(1.0, 1.0, n, experts)
    assert bytes_ratio == pytest.approx(touched / mean_touched, rel=0.05)
    assert flops_ratio == pytest.approx(pairs / mean_pairs, rel=0.05)
    # and the whole MoE part is the TP price times the binding ratio
    ep_t, tp_t = float(ep_cost.time_parts(f)["moe_gemm"]), float(tp_cost.time_parts(f)["moe_gemm"])
    assert ep_t >= tp_t
    assert ep_t / tp_t <= max(flops_ratio, bytes_ratio) + 1e-12


def test_one_gpu_or_a_dense_model_is_unchanged() -> None:
    gpu = load_gpu("MI300X")
    moe = load_model("Qwen/Qwen3.5-122B-A10B")
    for f in (_decode(1), _decode(64)):
        assert StepCostModel(gpu, moe, 1, expert_parallel=True).time_parts(f) == StepCostModel(gpu, moe, 1).time_parts(f)
    dense = load_model("Qwen/Qwen3-8B")
    assert StepCostModel(gpu, dense, 2, expert_parallel=True).time_parts(_decode(8)) == \
        StepCostModel(gpu, dense, 2).time_parts(_decode(8))


def test_imbalance_vanishes_for_large_batches() -> None:
    """With many tokens every GPU touches all its experts and gets ~1/EP of the pairs: EP -> TP."""
    gpu = load_gpu("MI355X")
    m = load_model("MiniMaxAI/MiniMax-M2.5")
    f = _decode(200_000)
    ep_t = float(StepCostModel(gpu, m, 8, expert_parallel=True).time_parts(f)["moe_gemm"])
    tp_t = float(StepCostModel(gpu, m, 8).time_parts(f)["moe_gemm"])
    assert ep_t == pytest.approx(tp_t, rel=0.02)


def test_scenario_rejects_expert_parallel_on_a_dense_model() -> None:
    from capacity.sim import simulate
    from capacity.inputs.scenario import from_dict

    sc = from_dict({"deployment": {"gpu": "MI300X", "model": "Qwen/Qwen3-8B", "expert_parallel": True},
                             "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
                                         "classes": [{"name": "a", "input_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}}]}})
    with pytest.raises(CapacityError, match="expert_parallel"):
        simulate.run(sc)


def test_validation_rows_with_ep_equal_to_tp_are_modelled() -> None:
    from capacity.measurements.row_scenario import row_scenario

    row = {"framework": "vllm", "gpu": "MI355X", "model": "MiniMax-M2.5", "precision": "fp8", "tp": 4, "ep": 4,
           "isl": 1024, "osl": 1024, "concurrency_or_qps": 8, "load_type": "closed_loop_concurrency",
           "num_gpus": 4, "tpot_ms": 20.0, "spec_method": "none"}
    scenario, reason = row_scenario(row)
    assert reason is None and scenario["deployment"]["expert_parallel"] is True
    # InferenceX EP rows state num_gpus = tp x ep; their per-GPU rates are per tp GPUs: one TP group
    scenario, _ = row_scenario({**row, "num_gpus": 16})
    assert scenario["deployment"]["replicas"] == 1
    scenario, _ = row_scenario({**row, "num_gpus": 8})      # two TP groups of 4 GPUs
    assert scenario["deployment"]["replicas"] == 2
    scenario, reason = row_scenario({**row, "ep": 8, "num_gpus": 8})
    assert scenario is None and "EP = TP" in reason
