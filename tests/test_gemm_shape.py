"""The shape-dependent GEMM efficiency (opt-in `gemm_curve` of a hardware profile; step_cost docstring).

Checked against independent truth: the hipBLASLt size sweep the curve was fitted to (copied in
scripts/gemm_curve_profile.py with its source), the roofline by hand from the profile's YAML numbers,
and today's formula by hand for a profile without the curve.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from capacity.cost.step_cost import StepCostModel, gemm_calls
from capacity.errors import CapacityError
from capacity.inputs.hardware import load_gpu, save_profile
from capacity.inputs.models import load_model
from capacity.paths import hw_profiles_dir

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("gemm_curve_profile", ROOT / "scripts" / "gemm_curve_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def script():
    return _script()


@pytest.fixture(scope="module")
def curve_path(tmp_path_factory, script):
    path = tmp_path_factory.mktemp("curve") / "MI300X-curve.yaml"
    path.write_text(yaml.safe_dump(script.curve_profile("MI300X"), sort_keys=False))
    return path


def _yaml_value(name: str, dotted: str) -> float:
    node = yaml.safe_load((hw_profiles_dir() / f"{name}.yaml").read_text())
    for part in dotted.split("."):
        node = node[part]
    return float(node["value"])


def _llama70b_fp8():
    return load_model("Llama-3.3-70B-Instruct", weight_precision="fp8")


def _dense_flops(model, tokens: float, sampled: float) -> float:
    """2 x dense linear params per token, the LM head only for sampled positions (its definition)."""
    return (model.dense_flops_per_token - 2.0 * model.params_lm_head) * tokens + 2.0 * model.params_lm_head * sampled


def test_curve_reproduces_the_hipblaslt_sweep(script, curve_path):
    """Every fitted sweep point, and the two unfitted points of the same regime, within TOLERANCE,
    with the profile's own ceiling (measured max-achievable FP8 rate) and W_half."""
    gpu = load_gpu(curve_path)
    ceiling_tflops = gpu.gemm_ceiling("fp8") * gpu.peak_dense_tflops["fp8"]
    assert ceiling_tflops == pytest.approx(1273.0)                 # AMD's MAF, hipBLASLt-bench (Table 1)
    w_half = gpu.gemm_w_half_flops("fp8")
    checked = 0
    for m, n, k, measured, used in script.MI300X_FP8_SWEEP:
        if used or (m, n, k) in ((6144, 12288, 12288), (1024, 2145, 1024)):
            w = 2.0 * m * n * k
            curve = ceiling_tflops * w / (w + w_half)
            assert abs(curve / measured - 1) <= script.TOLERANCE, (m, n, k, curve, measured)
            checked += 1
    assert checked == 6
    # the fitted per-call time: W_half at the ceiling, ~34 us (the 1024^3 call takes 40 us measured)
    assert w_half / (ceiling_tflops * 1e12) == pytest.approx(34.1e-6, rel=0.02)


def test_curve_is_steeper_than_one_efficiency(script):
    """The sweep itself (no model): 1024^3 reaches under 5 % of the 8192^3 rate's peak fraction; one
    constant efficiency cannot price both, which is why a curve is needed at all."""
    pts = {m: v for m, n, k, v, _ in script.MI300X_FP8_SWEEP if m == n == k}
    assert pts[1024] / pts[8192] < 0.05
    assert pts[4096] / pts[8192] > 0.8


def test_small_m_gemm_is_bandwidth_bound(curve_path):
    """One decode token at TP 1: the dense GEMM time is the weight bytes over the efficient bandwidth,
    by hand from the YAML (5.3 TB/s x hbm), with or without the curve."""
    model = _llama70b_fp8()
    bw = _yaml_value("MI300X", "hbm_bandwidth_tb_s") * 1e12 * _yaml_value("MI300X", "efficiency.hbm")
    for profile in ("MI300X", str(curve_path)):
        cost = StepCostModel(load_gpu(profile), model, 1)
        t = cost.forward([1], [512]).parts_s["dense_gemm"]
        assert t == pytest.approx(model.dense_weight_bytes / bw, rel=1e-12), profile


def test_large_m_reaches_the_measured_ceiling(curve_path):
    """At a very large token count the achieved dense TFLOPS tend to gemm x ceiling x peak = the
    measured 1273 TFLOPS (gemm = 1 in the curve profile), from below."""
    model = _llama70b_fp8()
    cost = StepCostModel(load_gpu(curve_path), model, 1)
    n = 4_000_000
    t = cost.forward([n], [n], num_sampled=1.0).parts_s["dense_gemm"]
    achieved = _dense_flops(model, n, 1.0) / t / 1e12
    assert 0.98 * 1273.0 < achieved < 1273.0


def test_per_call_cost_where_compute_bound(curve_path):
    """A prefill chunk at TP 8 (compute-bound): the dense term is (FLOPs / TP + calls x W_half) over
    peak x ceiling, calls counted by hand for Llama's 80 layers (fused QKV, o, gate_up, down) + LM head."""
    model = _llama70b_fp8()
    assert gemm_calls(model) == (4 * 80 + 1, 0)
    gpu = load_gpu(curve_path)
    w_half = yaml.safe_load(Path(curve_path).read_text())["gemm_curve"]["fp8"]["value"] * 1e9
    cost = StepCostModel(gpu, model, 8)
    n = 4096
    t = cost.forward([n], [n], num_sampled=1.0).parts_s["dense_gemm"]
    expect = (_dense_flops(model, n, 1.0) / 8 + 321 * w_half) / (2614.9e12 * 1273.0 / 2614.9)
    assert t == pytest.approx(expect, rel=1e-12)


def test_profile_without_curve_prices_as_before():
    """The shipped MI300X (no gemm_curve): max(FLOPs / (TP x peak x gemm), bytes / (TP x bw x hbm)) by
    hand from the YAML numbers, for a prefill chunk (compute-bound) and a decode batch (bandwidth-bound)."""
    gpu = load_gpu("MI300X")
    assert gpu.gemm_curve == {}
    model = _llama70b_fp8()
    peak = _yaml_value("MI300X", "peak_dense_tflops.fp8") * 1e12
    gemm = _yaml_value("MI300X", "efficiency.gemm")
    bw = _yaml_value("MI300X", "hbm_bandwidth_tb_s") * 1e12 * _yaml_value("MI300X", "efficiency.hbm")
    for tp, new, ctx, sampled in ((2, [2048], [2048], 1.0), (4, [1] * 32, [900] * 32, 32.0)):
        cost = StepCostModel(gpu, model, tp)
        t = cost.forward(new, ctx, num_sampled=sampled).parts_s["dense_gemm"]
        flops = _dense_flops(model, sum(new), sampled)
        assert t == max(flops / (tp * peak * gemm), model.dense_weight_bytes / (tp * bw))


def test_moe_experts_get_the_curve_at_their_compute_dtype(curve_path):
    """gpt-oss-120b (MXFP4 experts, weight-only: bf16 compute): the expert FLOPs run at the bf16 ceiling
    (708 / 1307.4), with two grouped GEMMs per MoE layer, at a token count where every expert is touched."""
    model = load_model("gpt-oss-120b")
    assert gemm_calls(model)[1] == 2 * 36
    gpu = load_gpu(curve_path)
    cost = StepCostModel(gpu, model, 1)
    n = 65536
    f = cost.features([n], [n])
    t = cost.time_parts(f)["moe_gemm"]
    w_half = gpu.gemm_w_half_flops("mxfp4")
    eff = gpu.efficiency
    compute = (model.expert_flops_per_token * n + 72 * w_half) / (1307.4e12 * eff["gemm"] * (708 / 1307.4) * eff["moe"])
    bw = 5.3e12 * eff["hbm"]
    weights = model.num_moe_layers * model.num_experts * model.expert_weight_bytes / (bw * eff["moe"])  # every expert read
    assert compute > weights
    assert t == pytest.approx(compute, rel=1e-9)


def test_curve_survives_save_profile_and_overrides(curve_path, tmp_path):
    gpu = load_gpu(curve_path)
    out = tmp_path / "refit.yaml"
    save_profile(gpu, out, {"gemm": 0.8}, "a test")
    again = load_gpu(out)
    assert again.gemm_curve == gpu.gemm_curve and again.efficiency["gemm"] == 0.8
    off = gpu.with_overrides(gemm_curve={"fp8": 0.0})
    assert off.gemm_curve["fp8"] == 0.0


def test_curve_without_its_measured_ceiling_is_refused(tmp_path, script):
    doc = script.curve_profile("MI300X")
    del doc["measured"]["gemm_fp8_tflops"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(CapacityError, match="gemm_curve.fp8.*measured.gemm_fp8_tflops"):
        load_gpu(path)


def test_a_kv_read_fraction_divides_the_kv_bound_attention_time_and_is_off_by_default():
    """The screening switch `kv_read` (step_cost.KV_READ_DEFAULT): KV bytes are read at HBM bandwidth x `hbm`
    x kv_read. A KV-bound attention (few FLOPs, many bytes) takes exactly 1 / kv_read as long; no entry
    is the old pricing (closed form: bytes / (bandwidth x hbm), TP1)."""
    gpu = load_gpu("H200")
    cost = StepCostModel(gpu, load_model("meta-llama/Llama-3.1-8B"), 1)
    eff = dict(cost.efficiency)
    kv_bytes = 4e9
    plain = cost.attention_time(1.0, kv_bytes, eff)
    assert plain == pytest.approx(kv_bytes / (gpu.hbm_bandwidth_tb_s * 1e12 * eff["hbm"]))
    assert cost.attention_time(1.0, kv_bytes, eff | {"kv_read": 0.5}) == pytest.approx(2 * plain)


def test_tile_padding_switch_computes_m_half_more_rows(tmp_path, script, monkeypatch):
    """The screening switch GEMM_TILE_M_HALF (off by default, docs/seed_validation.md section 48): with it a compute-
    bound step of n tokens costs what n + M_half tokens cost without it (every dense GEMM and the LM head compute M_half
    padding rows), on the ceiling-only curve; without a curve it changes nothing."""
    from capacity.cost import step_cost

    assert step_cost.GEMM_TILE_M_HALF == 0.0
    path = tmp_path / "MI300X-ceiling.yaml"
    path.write_text(yaml.safe_dump(script.curve_profile("MI300X", 0.0, 0.0), sort_keys=False))
    model = _llama70b_fp8()
    n, pad = 4096, 128
    curve = StepCostModel(load_gpu(path), model, 8)
    plain = StepCostModel(load_gpu("MI300X"), model, 8)
    without = curve.forward([n + pad], [n + pad], num_sampled=1.0 + pad).parts_s["dense_gemm"]
    before = plain.forward([n], [n], num_sampled=1.0).parts_s["dense_gemm"]
    monkeypatch.setattr(step_cost, "GEMM_TILE_M_HALF", float(pad))
    curve = StepCostModel(load_gpu(path), model, 8)
    plain = StepCostModel(load_gpu("MI300X"), model, 8)
    assert curve.forward([n], [n], num_sampled=1.0).parts_s["dense_gemm"] == pytest.approx(without, rel=1e-12)
    assert plain.forward([n], [n], num_sampled=1.0).parts_s["dense_gemm"] == before
