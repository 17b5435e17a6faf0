"""The H200 microbenchmark (capacity/data/measurements/gpu_microbench_h200.csv, measured with
scripts/gpu_microbench.py) against the H200 profile, and the per-GEMM-call fixed time it measures.

Independent truth here: the measured kernel times themselves, the published figures the profile's
`measured` anchors come from (a second, independent measurement of the same chip), and the
step-cost formula written out by hand.
"""

from __future__ import annotations

import pytest
import yaml

from capacity.cost.step_cost import StepCostModel, gemm_calls
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.measurements import microbench as mb
from capacity.paths import hw_profiles_dir

PEAK = {"bf16": 989.0, "fp8": 1979.0}   # H200 dense peaks, TFLOPS (the profile's vendor figures)


@pytest.fixture(scope="module")
def df():
    return mb.load("H200")


@pytest.fixture(scope="module")
def fit(df):
    return mb.fit_gemm_calls(df, PEAK)


def test_the_data_is_one_h200_with_every_section(df):
    env = yaml.safe_load(mb.microbench_path("H200").with_suffix(".json").read_text())
    assert env["name"] == "NVIDIA H200" and env["device"] == "cuda"
    kinds = set(df["kind"])
    assert {"gemm", "hbm_read", "hbm_copy", "decode_attention", "prefill_attention", "kernel_graph"} <= kinds
    assert df[df["kind"] == "gemm"]["us_per_call"].notna().all()     # no shape failed


def test_published_anchors_agree_with_this_measurement(df):
    """The profile's `measured` values come from other people's runs (MAMF finder, Azure's STREAM and
    FlashAttention-2); this machine's best figures land within a few per cent of each."""
    g = load_gpu("H200")
    assert mb.best(df, "gemm", "tflops", "bf16") == pytest.approx(g.measured["gemm_bf16_tflops"], rel=0.03)
    assert mb.best(df, "gemm", "tflops", "fp8") == pytest.approx(g.measured["gemm_fp8_tflops"], rel=0.03)
    assert mb.best(df, "hbm_read", "tb_s") == pytest.approx(g.measured["hbm_stream_tb_s"], rel=0.05)
    assert mb.best(df, "prefill_attention", "tflops") == pytest.approx(g.measured["flash_attention_tflops"], rel=0.03)


def test_a_fixed_time_per_gemm_call_explains_the_serving_shapes(fit, df):
    """time = call + max(compute, bytes) fits the 182 layer-shaped GEMMs far better than the roofline alone,
    with a streaming rate and compute ceilings at or under the measured peaks."""
    plain = mb.fit_gemm_calls(df, PEAK, with_call=False)
    assert fit.calls == plain.calls == 182
    assert fit.median_error < 0.07 and fit.p90_error < 0.13
    assert plain.p90_error > 1.5 * fit.p90_error
    assert 3.0 < fit.call_us < 8.0
    assert fit.bandwidth_tb_s <= mb.best(df, "hbm_read", "tb_s")          # no faster than a pure read
    assert fit.ceiling["bf16"] * PEAK["bf16"] <= mb.best(df, "gemm", "tflops", "bf16")
    assert fit.ceiling["fp8"] * PEAK["fp8"] <= mb.best(df, "gemm", "tflops", "fp8")


def test_small_gemms_are_mostly_fixed_time(df):
    """The measurement itself: a 4096 x 4096 bf16 GEMM at one token (32 MiB of weights) takes far longer
    than its bytes at the measured read bandwidth, a large one (lm_head, 1 GiB) barely longer."""
    g = mb.serving_gemms(df)
    read = mb.best(df, "hbm_read", "tb_s") * 1e12
    small = g[(g["m"] == 1) & (g["n"] == 4096) & (g["k"] == 4096)].iloc[0]
    big = g[(g["m"] == 1) & (g["n"] == 128256)].iloc[0]
    assert small["us_per_call"] > 1.5 * small["bytes"] / read * 1e6
    assert big["us_per_call"] < 1.1 * big["bytes"] / read * 1e6


def test_the_profile_holds_the_fitted_intercept(fit):
    assert load_gpu("H200").gemm_call_us == pytest.approx(fit.call_us, abs=0.01)
    doc = yaml.safe_load((hw_profiles_dir() / "H200.yaml").read_text())
    assert doc["gemm_call_us"]["basis"].startswith("measured")


def test_each_gemm_call_of_a_step_pays_it():
    """By hand: Llama-3.1-8B at one token; the GEMM part grows by calls x gemm_call_us, nothing else moves."""
    g = load_gpu("H200")
    without = g.with_overrides(gemm_call_us=0.0)
    m = load_model("meta-llama/Llama-3.1-8B")
    dense_calls, expert_calls = gemm_calls(m)
    assert (dense_calls, expert_calls) == (4 * 32 + 1, 0)         # QKV, o, gate_up, down per layer; LM head
    a, b = StepCostModel(without, m), StepCostModel(g, m)
    f = a.features([1], [100])
    pa, pb = a.time_parts(f), b.time_parts(f)
    assert pb["dense_gemm"] - pa["dense_gemm"] == pytest.approx(dense_calls * g.gemm_call_us * 1e-6)
    assert pb["attention"] == pa["attention"]


def test_moe_layers_pay_it_for_their_grouped_gemms():
    g = load_gpu("H200")
    without = g.with_overrides(gemm_call_us=0.0)
    m = load_model("gpt-oss-120b")
    _, expert_calls = gemm_calls(m)
    assert expert_calls == 2 * m.num_moe_layers
    a, b = StepCostModel(without, m), StepCostModel(g, m)
    f = a.features([1], [100])
    assert b.time_parts(f)["moe_gemm"] - a.time_parts(f)["moe_gemm"] == pytest.approx(expert_calls * 5.15e-6)


def test_a_family_transfer_carries_the_per_call_time(tmp_path):
    """A sibling's efficiencies were fitted with its per-call time, so a transferred profile takes both
    (as it takes the kernel count); a sibling without one leaves 0."""
    import re
    root = hw_profiles_dir()
    sibling_text = (root / "MI300X.yaml").read_text()
    leaf = ("gemm_call_us:\n  value: 4.0\n  unit: us\n  basis: assumed\n  source: a test value\n")
    with_call = tmp_path / "MI300X_call.yaml"
    with_call.write_text(sibling_text.replace("board_power_w:\n", leaf + "board_power_w:\n", 1))
    child_text = (root / "MI325X.yaml").read_text()
    for sibling, expected in ((with_call, 4.0), (root / "MI300X.yaml", 0.0)):
        child = tmp_path / f"MI325X_{expected}.yaml"
        child.write_text(re.sub(r"(family_transfer:\n  from: ).*", r"\g<1>" + str(sibling), child_text))
        g = load_gpu(child)
        assert g.gemm_call_us == expected
        if expected:
            assert g.provenance["gemm_call_us"].basis.startswith("transferred from MI300X")
