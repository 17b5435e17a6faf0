"""Per-layer fixed cost weighted by the kernels each layer launches (opt-in `kernels_per_dense_layer`).

Independent truth: the kernel counts written out from vLLM's decoder layers (a dense layer 9 kernels, a MoE
layer 13, a shared expert 3 more, an MLA attention block 7 more than a GQA one, a q/k RMSNorm 2 more;
capacity/cost/step_cost.py states where they come from) and the models' layer structure from their
config.json files."""

from __future__ import annotations

import pytest

from capacity.cost.step_cost import StepCostModel, layer_overhead_units
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model

LEAF = """kernels_per_dense_layer:
  value: 9
  unit: kernels
  basis: assumed
  source: counted from vLLM's model code
"""


@pytest.mark.parametrize("model, units", [
    ("Llama-3.3-70B-Instruct", 80.0),                 # 80 dense layers
    ("gpt-oss-120b", 36 * 13 / 9),                    # 36 MoE layers, no shared expert
    # first layer dense, 60 MoE layers with a shared expert; all 61 layers MLA (kv_lora_rank in its config)
    ("Kimi-K2.5", (1 * (9 + 7) + 60 * (13 + 3 + 7)) / 9),
    ("MiniMax-M2.5", 62 * (13 + 2) / 9),               # 62 MoE layers, use_qk_norm (per layer), no shared expert
])
def test_kernel_weighted_layer_units(model, units):
    assert layer_overhead_units(load_model(model), 9) == pytest.approx(units)


def _profile_file(tmp_path, kernels: bool):
    """The shipped MI300X profile with the kernel count (as shipped) or without it (the opt-out)."""
    from pathlib import Path
    import yaml
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "hw_profiles" / "MI300X.yaml").read_text())
    doc.pop("kernels_per_dense_layer", None)
    if kernels:
        doc["kernels_per_dense_layer"] = yaml.safe_load(LEAF)["kernels_per_dense_layer"]
    path = tmp_path / f"MI300X_{'k' if kernels else 'plain'}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_without_the_opt_in_the_overhead_is_per_layer(tmp_path):
    m = load_model("gpt-oss-120b")
    assert layer_overhead_units(m) == m.num_layers
    assert load_gpu(_profile_file(tmp_path, kernels=False)).kernels_per_dense_layer == 0
    assert load_gpu("H100").kernels_per_dense_layer == 0   # a profile without the entry


def test_the_opt_in_profile_prices_a_moe_layer_by_its_kernels(tmp_path):
    g = load_gpu(_profile_file(tmp_path, kernels=True))
    m = load_model("gpt-oss-120b")
    plain, counted = StepCostModel(load_gpu(_profile_file(tmp_path, kernels=False)), m), StepCostModel(g, m)
    f = plain.features([1], [100])
    extra = counted.time_parts(f)["overhead"] - plain.time_parts(f)["overhead"]
    assert extra == pytest.approx(g.efficiency["layer_overhead_us"] * 1e-6 * (36 * 13 / 9 - 36))


def test_a_dense_model_pays_the_same_either_way(tmp_path):
    """A dense layer is the unit the overhead is fitted in, so the count changes nothing for Llama."""
    m = load_model("Llama-3.3-70B-Instruct")
    plain = StepCostModel(load_gpu(_profile_file(tmp_path, kernels=False)), m)
    counted = StepCostModel(load_gpu(_profile_file(tmp_path, kernels=True)), m)
    f = plain.features([1], [100])
    assert counted.time_parts(f)["overhead"] == pytest.approx(plain.time_parts(f)["overhead"])


def test_a_family_transfer_carries_the_kernel_count(tmp_path):
    """MI325X takes MI300X's fitted efficiencies; a layer overhead fitted per dense layer's kernels keeps
    that meaning only with the count, so the count travels with it."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "hw_profiles"
    text = (root / "MI325X.yaml").read_text()
    for kernels, expected in ((True, 9), (False, 0)):
        sibling = _profile_file(tmp_path, kernels)
        child = tmp_path / f"MI325X_{expected}.yaml"
        child.write_text(re.sub(r"(family_transfer:\n  from: ).*", r"\g<1>" + str(sibling), text))
        assert load_gpu(child).kernels_per_dense_layer == expected
    assert load_gpu("MI325X").kernels_per_dense_layer == load_gpu("MI300X").kernels_per_dense_layer == 9


@pytest.mark.parametrize("model, moe_layers, shared", [("gpt-oss-120b", 36, False), ("Kimi-K2.5", 60, True),
                                                       ("MiniMax-M2.5", 62, False), ("Llama-3.3-70B-Instruct", 0, False)])
def test_aiters_fused_moe_runs_two_kernels_fewer_per_moe_layer(model, moe_layers, shared):
    """AITER's two-stage fused MoE fuses the activation into the first grouped GEMM and the top-k weighted sum
    into the second (aiter/fused_moe.py: ck_moe_stage1 / ck_moe_stage2), so each MoE layer runs two kernels fewer
    than vLLM's Triton fused MoE (separate silu_and_mul and moe_sum); a dense model is the same on both."""
    m = load_model(model)
    triton, aiter = layer_overhead_units(m, 9, "triton"), layer_overhead_units(m, 9, "aiter")
    assert (triton - aiter) * 9 == pytest.approx(2 * moe_layers)
    assert layer_overhead_units(m, 9) == triton                       # vLLM's default path


def test_aiters_fused_moe_is_refused_off_amd_in_one_line():
    from capacity.errors import CapacityError
    with pytest.raises(CapacityError, match="AMD Instinct GPUs only; H100 is not one"):
        StepCostModel(load_gpu("H100"), load_model("gpt-oss-120b"), 1, moe_backend="aiter")
    assert StepCostModel(load_gpu("MI355X"), load_model("gpt-oss-120b"), 1, moe_backend="aiter").moe_backend == "aiter"


@pytest.mark.parametrize("gpu, precision, backend", [
    ("MI355X", "mxfp4_w4a4", "aiter"),    # gfx950 supports MX: QuarkOCP_MX_MoEMethod runs rocm_aiter_fused_experts
    ("MI350X", "mxfp4_w4a4", "aiter"),
    ("MI355X", "mxfp4", "triton"),        # MXFP4 weights under 16-bit activations: vLLM's default fused MoE
    ("MI355X", "fp8", "triton"),
    ("B200", "mxfp4_w4a4", "triton"),     # not ROCm: AITER does not exist there
])
def test_auto_moe_backend_follows_vllms_quark_mxfp4_rule(gpu, precision, backend):
    """engine.moe_backend 'auto' is vLLM's own choice. Truth: vllm/model_executor/layers/quantization/quark/
    quark_moe.py `QuarkOCP_MX_MoEMethod`: `_emulate` is False where `current_platform.supports_mx()` (gfx950 only,
    vllm/platforms/rocm.py) and the scheme is w_mxfp4*, and `apply` then calls `rocm_aiter_fused_experts`; every
    other expert format takes vLLM's default Triton fused MoE."""
    m = load_model("MiniMax-M2.5", weight_precision=precision)
    assert StepCostModel(load_gpu(gpu), m, 2).moe_backend == backend
    assert StepCostModel(load_gpu(gpu), load_model("Llama-3.3-70B-Instruct"), 2).moe_backend == "triton"   # dense


@pytest.mark.parametrize("model", ["MiniMax-M2.5", "Llama-3.3-70B-Instruct"])
def test_mxfp4_w4a4_on_a_rocm_gpu_without_mx_tensor_cores_is_refused_in_one_line(model):
    """vLLM emulates MXFP4 w4a4 layers on gfx942 (quark_ocp_mx.py / quark_moe.py: `emulate` where not
    `current_platform.supports_mx()`, i.e. every GPU but gfx950): weights dequantized to 16 bit on every pass. The
    simulator does not price that, so it refuses the deployment with the fix, instead of pricing it as native; CUDA
    GPUs without fp4 run such checkpoints weight-only and stay priced."""
    from capacity.errors import CapacityError
    m = load_model(model, weight_precision="mxfp4_w4a4")
    for gpu in ("MI300X", "MI325X"):
        with pytest.raises(CapacityError, match=r"no MXFP4 tensor cores: vLLM emulates mxfp4_w4a4 .* use a gfx950 GPU"):
            StepCostModel(load_gpu(gpu), m, 2)
    StepCostModel(load_gpu("MI355X"), m, 2)
    StepCostModel(load_gpu("H100"), m, 2)


@pytest.mark.parametrize("precision", ["nvfp4", "nvfp4_w4a4"])
@pytest.mark.parametrize("model", ["MiniMax-M2.5", "Llama-3.3-70B-Instruct"])
def test_nvfp4_on_any_rocm_gpu_is_refused_in_one_line(model, precision):
    """vLLM has no native NVFP4 kernel on ROCm: vllm/model_executor/kernels/linear/__init__.py lists one NVFP4 linear
    kernel for PlatformEnum.ROCM, `EmulationNvFp4LinearKernel` (read at 006fc898), which dequantizes the weights to bf16
    on every pass, and the NVFP4 fused-MoE backends are CUDA kernels or that emulation. MI355X's fp4 tensor cores take
    OCP-MX blocks, not NVFP4's. So every AMD GPU refuses an NVFP4 deployment with the fix, and a CUDA GPU stays priced."""
    from capacity.errors import CapacityError
    m = load_model(model, weight_precision=precision)
    for gpu in ("MI300X", "MI325X", "MI355X", "MI350X"):
        with pytest.raises(CapacityError, match=rf"no NVFP4 kernel on ROCm and emulates {precision} layers .* use an MXFP4"):
            StepCostModel(load_gpu(gpu), m, 2)
    for gpu in ("H100", "B200"):
        StepCostModel(load_gpu(gpu), m, 2)


@pytest.mark.parametrize("precision", ["mxfp4", "mxfp4_w4a8"])
def test_mxfp4_dense_linears_on_a_rocm_gpu_without_mx_tensor_cores_are_refused(precision):
    """vLLM's MXFP4 linear kernels on ROCm (vllm/model_executor/kernels/linear/__init__.py `_POSSIBLE_MXFP4_KERNELS`, read
    at 006fc898) are AiterMxfp4LinearKernel, which `is_supported` only where `current_platform.supports_mx()` (gfx950),
    then EmulationMxfp4LinearKernel. So a dense model in MXFP4 is emulated on MI300X / MI325X and refused there; MXFP4
    experts are not (gpt-oss-120b's run natively on MI300X through vLLM's Triton MoE, as its InferenceX rows show), and a
    gfx950 or CUDA GPU stays priced."""
    from capacity.errors import CapacityError
    dense = load_model("Llama-3.3-70B-Instruct", weight_precision=precision)
    for gpu in ("MI300X", "MI325X"):
        with pytest.raises(CapacityError, match=rf"no MXFP4 tensor cores: vLLM emulates {precision} layers .* use a gfx950"):
            StepCostModel(load_gpu(gpu), dense, 1)
        StepCostModel(load_gpu(gpu), load_model("gpt-oss-120b"), 1)                          # MXFP4 experts, bf16 dense
        StepCostModel(load_gpu(gpu), load_model("MiniMax-M2.5", weight_precision=precision), 2)
    for gpu in ("MI355X", "H100"):
        StepCostModel(load_gpu(gpu), dense, 1)


# ---- activation quantization of MXFP4 w4a4 dense linears on ROCm (docs/seed_validation.md section 44)
# Truth: vLLM's quark_ocp_mx.py `gemm_with_dynamic_quant` runs a quantization kernel (per_1x32_f4_quant_hip or
# dynamic_mxfp4_quant) before each w4a4 GEMM; a decoder layer has QKV and o_proj, a dense MLP gate_up and down, a
# shared expert gate_up and down; the router and the LM head stay unquantized.

@pytest.mark.parametrize("model, kernels", [
    ("Llama-3.3-70B-Instruct", 80 * 4),                # 80 dense layers: QKV, o_proj, gate_up, down
    ("gpt-oss-120b", 36 * 2),                          # 36 MoE layers, no shared expert: QKV, o_proj
    ("Kimi-K2.5", 61 * 2 + 1 * 2 + 60 * 2),            # 61 attention blocks, 1 dense MLP, 60 shared experts
])
def test_w4a4_dense_linears_add_one_quantization_kernel_each(model, kernels):
    from dataclasses import replace
    from capacity.cost.step_cost import activation_quant_kernels
    m = load_model(model)
    assert activation_quant_kernels(replace(m, dense_weight_dtype="mxfp4_w4a4")) == kernels
    assert activation_quant_kernels(m) == 0                                        # native checkpoints
    assert activation_quant_kernels(replace(m, dense_weight_dtype="mxfp4")) == 0   # weight-only: no activation


def test_a_w4a4_dense_model_pays_its_quantization_kernels_on_rocm_only():
    m4a4, m4 = load_model("Qwen3.5-27B", "mxfp4_w4a4"), load_model("Qwen3.5-27B", "mxfp4")
    gpu = load_gpu("MI355X")
    # Qwen3.5-27B: 64 dense layers, 4 quantized linears each (its linear-attention layers' projections counted as
    # two, as gemm_calls counts them: assumed)
    quant = 64 * 4
    extra = StepCostModel(gpu, m4a4).layer_kernels_s() - StepCostModel(gpu, m4).layer_kernels_s()
    assert extra == pytest.approx(gpu.efficiency["layer_overhead_us"] * 1e-6 * quant / gpu.kernels_per_dense_layer)
    assert layer_overhead_units(m4a4, 9) == layer_overhead_units(m4, 9)   # without the ROCm flag nothing is added
