"""Speculative-verification terms of the step cost (capacity/cost/step_cost.py module docstring):
correlated expert routing of one sequence's 1 + N verification tokens, and the recurrent-state
snapshots Gated DeltaNet layers store per verified draft. Expectations are closed forms from the
model configs and the GPU profile, not the code's own output."""

from __future__ import annotations

import numpy as np
import pytest

from capacity.inputs.hardware import int4_tile_table, load_gpu
from capacity.inputs.models import load_model
from capacity.cost.step_cost import StepCostModel, StepFeatures


def _verify_features(batch: int, n: int, ctx: float = 1000.0) -> StepFeatures:
    """A pure verification step: `batch` sequences with 1 + n tokens each (attention terms 0)."""
    q = 1 + n
    return StepFeatures(num_tokens=float(batch * q), num_seqs=float(batch), num_sampled=float(batch * q),
                        attn_flops=0.0, kv_read_bytes=0.0, verify_seqs=float(batch if n else 0))


def test_kimi_expert_bytes_use_correlated_routing() -> None:
    """Kimi-K2.5 (384 experts, top-8, 60 MoE layers; config): 4 sequences verifying 3 drafts each
    read E·(1 − (1 − k/E)^(B·(1+N)^rho)) experts per MoE layer."""
    gpu = load_gpu("MI300X")
    m = load_model("moonshotai/Kimi-K2.5")
    assert (m.num_experts, m.experts_per_token, m.num_moe_layers) == (384, 8, 60)
    bw = gpu.hbm_bandwidth_tb_s * 1e12 * gpu.efficiency["hbm"]
    tp, batch, n = 4, 4, 3
    for rho in (1.0, 0.5, 0.0):
        cost = StepCostModel(gpu, m, tp, verify_routing_exponent=rho)
        routed = batch * (1 + n) ** rho
        experts = 384 * (1 - (1 - 8 / 384) ** routed)
        # int4 experts, on MI300X under vLLM's default tiles (tests/test_int4_moe_tiles.py)
        rate = gpu.efficiency["moe_int4"] / int4_tile_table().default_tiles_slowdown
        bytes_s = 60 * experts * m.expert_weight_bytes / (tp * bw * rate)
        got = float(cost.time_parts(_verify_features(batch, n))["moe_gemm"])
        assert got == pytest.approx(bytes_s, rel=1e-9)   # weight-bound at 16 tokens


def test_routing_exponent_leaves_decode_and_prefill_alone() -> None:
    """No verification (verify_seqs = 0): the step costs the same whatever rho is."""
    gpu = load_gpu("MI300X")
    m = load_model("moonshotai/Kimi-K2.5")
    a, b = StepCostModel(gpu, m, 4, verify_routing_exponent=1.0), StepCostModel(gpu, m, 4, verify_routing_exponent=0.3)
    decode = b.decode_features(np.full((3, 8), 900.0), tokens_per_seq=1)
    assert np.all(decode.verify_seqs == 0)
    np.testing.assert_allclose(a.total_time(decode), b.total_time(decode), rtol=1e-12)
    prefill = a.features(np.array([512, 1]), np.array([512, 700]))
    assert a.total_time(prefill) == pytest.approx(b.total_time(prefill), rel=1e-12)


def test_mixed_step_counts_only_verifying_sequences() -> None:
    """A 300-token prefill chunk plus two sequences verifying 3 drafts: routed tokens = 300 + 2·4^rho."""
    gpu = load_gpu("MI300X")
    cost = StepCostModel(gpu, load_model("moonshotai/Kimi-K2.5"), 4, verify_routing_exponent=0.5)
    f = cost.features(np.array([300, 4, 4]), np.array([300, 904, 1204]), num_sampled=3 + 6, num_spec=np.array([0, 3, 3]))
    assert f.verify_seqs == 2
    assert cost.routed_tokens(f) == pytest.approx(300 + 2 * 4 ** 0.5)


def test_qwen35_verification_stores_one_state_per_draft() -> None:
    """Qwen3.5-27B (config): 48 Gated DeltaNet layers, 48 value heads of 128 x 128 fp32 state and a
    conv state of (2·16·128 + 48·128) channels x (4 − 1) taps in bf16. Verifying N drafts stores N
    states per sequence beyond decode's one, at 1/4 of the efficiency-scaled HBM bandwidth, split
    over the TP ranks."""
    gpu = load_gpu("MI300X")
    m = load_model("Qwen/Qwen3.5-27B")
    state = 48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 3 * 2)
    tp, batch, n = 2, 20, 3
    cost = StepCostModel(gpu, m, tp, state_snapshot_write_efficiency=0.25)
    bw = gpu.hbm_bandwidth_tb_s * 1e12 * gpu.efficiency["hbm"]
    with_v = float(cost.time_parts(_verify_features(batch, n))["attention"])
    f0 = _verify_features(batch, n)
    no_v = float(cost.time_parts(StepFeatures(f0.num_tokens, f0.num_seqs, f0.num_sampled, 0.0, 0.0, 0.0))["attention"])
    assert with_v - no_v == pytest.approx(state * batch * n / (tp * bw * 0.25), rel=1e-9)


def test_dense_target_has_no_snapshot_term() -> None:
    gpu = load_gpu("MI300X")
    cost = StepCostModel(gpu, load_model("Qwen/Qwen3-8B"), 1)
    f = _verify_features(16, 4)
    assert float(cost.snapshot_bytes(f)) == 0.0


def test_engine_records_verifying_sequences() -> None:
    """A simulated speculative run records verify_seqs = the batch in its verification steps."""
    from capacity.fidelity import speedups as v
    from capacity.fidelity.common import simulate_scenario
    from capacity.measurements.row_scenario import speculative_config

    row = {"target": "Qwen/Qwen3.5-27B", "method": "Native MTP", "draft_checkpoint": "(built-in MTP module)",
           "num_speculative_tokens": 2, "per_position_acceptance": "0.9 0.8"}
    dep = v.Deployment("Qwen/Qwen3.5-27B", "MI300X", 2, None, None, None)
    res = simulate_scenario(v.scenario_dict(dep, 4, 4, speculative_config(row)))
    f = np.asarray(res.cluster.replicas[0].recorder.features, dtype=float)
    assert f.shape[1] == 6
    verifying = f[:, 2] > f[:, 1]
    assert verifying.any()
    assert np.all(f[verifying, 5] >= 1) and np.all(f[~verifying, 5] == 0)


def test_host_cost_per_verifying_sequence_on_the_v1_runner_only() -> None:
    """spec_seq_overhead_us is charged once per sequence that verifies drafts (V1 model runner):
    the overhead part of a step with B verifying sequences grows by exactly B x the profile value,
    a plain decode step with the same sequences is unchanged, and the V2 runner charges nothing."""
    gpu = load_gpu("MI300X").with_overrides(efficiency={"spec_seq_overhead_us": 400.0, "spec_token_overhead_us": 0.0})
    m = load_model("Qwen/Qwen3-8B")
    # without async scheduling, so that the host terms add (their overlap: tests/test_async_scheduling.py)
    v1 = StepCostModel(gpu, m, 1, async_scheduling=False)
    v2 = StepCostModel(gpu, m, 1, model_runner="v2", async_scheduling=False)
    e = gpu.efficiency
    # MI300X prices its layer overhead per dense layer's 9 kernels; a Qwen3 layer runs 9 + 2 (q/k norm)
    plain = (e["step_overhead_ms"] * 1e-3 + e["layer_overhead_us"] * 1e-6 * m.num_layers * (9 + 2) / 9
             + e["per_seq_overhead_us"] * 1e-6 * 12)
    assert float(v1.time_parts(_verify_features(12, 0))["overhead"]) == pytest.approx(plain, rel=1e-12)
    assert float(v1.time_parts(_verify_features(12, 3))["overhead"]) == pytest.approx(plain + 12 * 400e-6, rel=1e-12)
    assert float(v2.time_parts(_verify_features(12, 3))["overhead"]) == pytest.approx(plain, rel=1e-12)


def test_cost_per_verified_draft_token_on_either_runner() -> None:
    """spec_token_overhead_us is charged once per draft token a step verifies (B sequences x N drafts),
    on both model runners, and not at all in a plain decode step."""
    gpu = load_gpu("MI300X").with_overrides(efficiency={"spec_seq_overhead_us": 0.0, "spec_token_overhead_us": 25.0})
    m = load_model("Qwen/Qwen3-8B")
    e = gpu.efficiency
    # MI300X prices its layer overhead per dense layer's 9 kernels; a Qwen3 layer runs 9 + 2 (q/k norm)
    plain = (e["step_overhead_ms"] * 1e-3 + e["layer_overhead_us"] * 1e-6 * m.num_layers * (9 + 2) / 9
             + e["per_seq_overhead_us"] * 1e-6 * 12)
    for runner in ("v1", "v2"):
        cost = StepCostModel(gpu, m, 1, model_runner=runner, async_scheduling=False)
        assert float(cost.time_parts(_verify_features(12, 0))["overhead"]) == pytest.approx(plain, rel=1e-12)
        assert float(cost.time_parts(_verify_features(12, 3))["overhead"]) == pytest.approx(plain + 12 * 3 * 25e-6, rel=1e-12)
    # many steps at once (arrays), as the engine's decode runs price them
    cost = StepCostModel(gpu, m, 1, async_scheduling=False)
    runs = cost.decode_features(np.array([[100] * 12, [200] * 12]), tokens_per_seq=1 + 4)
    assert np.allclose(np.asarray(cost.time_parts(runs)["overhead"], dtype=float), plain + 12 * 4 * 25e-6, rtol=1e-12)


def test_hybrid_target_pays_the_host_cost_on_the_v2_runner_too() -> None:
    """A target with linear-attention (Gated DeltaNet) layers is charged spec_seq_overhead_us per
    verifying sequence on either runner; an attention-only target only on V1."""
    gpu = load_gpu("MI300X").with_overrides(efficiency={"spec_seq_overhead_us": 400.0, "spec_token_overhead_us": 0.0})
    hybrid, plain_model = load_model("Qwen/Qwen3.6-27B"), load_model("google/gemma-4-26B-A4B-it")
    assert hybrid.num_linear_attention_layers > 0 and plain_model.num_linear_attention_layers == 0
    for m, charged_on_v2 in ((hybrid, True), (plain_model, False)):
        for runner in ("v1", "v2"):
            cost = StepCostModel(gpu, m, 2, model_runner=runner)
            extra = (float(cost.time_parts(_verify_features(12, 3))["overhead"])
                     - float(cost.time_parts(_verify_features(12, 0))["overhead"]))
            expected = 12 * 400e-6 if (runner == "v1" or charged_on_v2) else 0.0
            assert extra == pytest.approx(expected, abs=1e-12)
