"""Which attention kernel family prices a model's attention FLOPs (GpuProfile.attention_efficiency_key).

Truth: vLLM PR #36702 ("[ROCm] Attention selector reordering"): on ROCm a model that needs attention sinks
(gpt-oss) falls back to the Triton unified-attention backend (AITER_UNIFIED / TRITON_ATTN); other models run the
flash-attention kernels. On CUDA, vLLM's FlashAttention 3 serves sinks itself. A FLOP-bound prefill's attention
time is its attention FLOPs / (TP x bf16 peak x the kernel's efficiency).
"""
import pytest

from capacity.cost.step_cost import StepCostModel
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model

PROMPT = 8192


def _attention_s(gpu, model, backend="auto"):
    cost = StepCostModel(gpu, model, 1, attention_backend=backend)
    return cost.forward([PROMPT], [PROMPT]).parts_s["attention"]


def _flop_bound_s(gpu, model, efficiency):
    flops = float(model.attention_flops([PROMPT], [PROMPT])[0])
    return flops / (gpu.peak_tflops("bf16") * 1e12 * efficiency)


@pytest.fixture(scope="module")
def models():
    return (load_model("openai/gpt-oss-120b", weight_precision="mxfp4"),
            load_model("MiniMaxAI/MiniMax-M2.5", weight_precision="fp8"))


def test_a_sinks_model_on_rocm_runs_the_triton_kernel_and_others_the_flash_kernels(models):
    sinks, plain = models
    assert sinks.attention_sinks and not plain.attention_sinks
    gpu = load_gpu("MI355X").with_overrides(efficiency={"attention": 0.30, "attention_triton": 0.06})
    assert gpu.attention_efficiency_key(sinks) == "attention_triton"
    assert gpu.attention_efficiency_key(plain) == "attention"
    assert _attention_s(gpu, sinks) == pytest.approx(_flop_bound_s(gpu, sinks, 0.06), rel=1e-9)
    assert _attention_s(gpu, plain) == pytest.approx(_flop_bound_s(gpu, plain, 0.30), rel=1e-9)
    # the scenario's engine.attention_backend names the family outright
    assert _attention_s(gpu, sinks, "flash") == pytest.approx(_flop_bound_s(gpu, sinks, 0.30), rel=1e-9)
    assert _attention_s(gpu, plain, "triton") == pytest.approx(_flop_bound_s(gpu, plain, 0.06), rel=1e-9)


def test_cuda_serves_sinks_with_its_flash_kernels(models):
    sinks, _ = models
    gpu = load_gpu("H100").with_overrides(efficiency={"attention": 0.30, "attention_triton": 0.06})
    assert gpu.attention_efficiency_key(sinks) == "attention"
    assert _attention_s(gpu, sinks) == pytest.approx(_flop_bound_s(gpu, sinks, 0.30), rel=1e-9)


def test_a_profile_without_a_triton_value_follows_its_attention_value():
    gpu = load_gpu("H100")
    assert gpu.provenance["efficiency.attention_triton"].basis == "assumed"
    assert gpu.efficiency["attention_triton"] == gpu.efficiency["attention"]
    # an override of `attention` carries over to it, as a refit does
    assert gpu.with_overrides(efficiency={"attention": 0.2}).efficiency["attention_triton"] == 0.2
