"""vLLM's start-up memory profile (capacity/sim/memory.py) against vLLM's own logs of it.

The measurements are vLLM v0.11.0's DEBUG memory-profile lines of eight H100 deployments
(capacity/data/measurements/vllm_memory_profiles.csv, from llm-d). memory.py takes one constant from
the Llama-3.1-8B row (the sampler's bytes per logit); every other row checks it: other vocabularies
and hidden sizes, a MoE model, tensor parallelism, and the KV cache a whole deployment is left with.
"""

from __future__ import annotations

import csv
from types import SimpleNamespace

import pytest

from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.paths import data_dir
from capacity.sim import memory, simulate

GIB = 2 ** 30
VLLM_DEFAULT_BATCHED_TOKENS = 8192   # vLLM's OpenAI server default on a >= 70 GiB GPU (vllm/engine/arg_utils.py)
VLLM_DEFAULT_SEQS = 1024
TRAFFIC = {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 5,
           "classes": [{"name": "a", "input_tokens": {"dist": "fixed", "value": 100},
                        "output_tokens": {"dist": "fixed", "value": 10}}]}


def _rows() -> dict[tuple[str, int], dict]:
    with open(data_dir() / "measurements" / "vllm_memory_profiles.csv", newline="") as f:
        return {(r["model"], int(r["tensor_parallel_size"])): r for r in csv.DictReader(f)}


def _dense(h, heads, kv_heads, head_dim, inter, vocab):
    """The attributes memory.py reads, from a model's Hugging Face config.json."""
    return SimpleNamespace(hidden_size=h, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                           mlp_intermediate_size=inter, vocab_size=vocab, num_moe_layers=0, num_experts=0,
                           experts_per_token=0, expert_intermediate_size=0, shared_expert_intermediate_size=0)


# config.json of each model (Hugging Face): hidden_size, num_attention_heads, num_key_value_heads, head_dim,
# intermediate_size, vocab_size
QWEN3_06B = _dense(1024, 16, 8, 128, 3072, 151936)
QWEN3_32B = _dense(5120, 64, 8, 128, 25600, 151936)
GPT_OSS_20B = SimpleNamespace(hidden_size=2880, num_attention_heads=64, num_kv_heads=8, head_dim=64,
                              mlp_intermediate_size=0, vocab_size=201088, num_moe_layers=24, num_experts=32,
                              experts_per_token=4, expert_intermediate_size=2880, shared_expert_intermediate_size=0)


@pytest.mark.parametrize("model, key", [(QWEN3_06B, ("Qwen3-0.6B", 1)), (QWEN3_32B, ("Qwen3-32B", 1)),
                                        (QWEN3_32B, ("Qwen3-32B", 2)), (GPT_OSS_20B, ("gpt-oss-20b", 1))])
def test_the_profiling_peak_matches_vllms_log_for_other_vocabularies_sizes_and_tp(model, key):
    measured = float(_rows()[key]["torch_peak_gib"]) * GIB
    predicted = memory.profile_peak_bytes(model, VLLM_DEFAULT_BATCHED_TOKENS, VLLM_DEFAULT_SEQS, key[1])
    assert predicted == pytest.approx(measured, rel=0.02)


def test_the_profiling_peak_of_shipped_models_matches_vllms_log():
    from capacity.inputs.models import load_model
    rows = _rows()
    for name, precision, key in [("meta-llama/Llama-3.3-70B-Instruct", "fp8", ("Llama-3.3-70B-FP8", 2)),
                                 ("openai/gpt-oss-120b", "mxfp4", ("gpt-oss-120b", 1))]:
        model = load_model(name, weight_precision=precision)
        predicted = memory.profile_peak_bytes(model, VLLM_DEFAULT_BATCHED_TOKENS, VLLM_DEFAULT_SEQS, key[1])
        assert predicted == pytest.approx(float(rows[key]["torch_peak_gib"]) * GIB, rel=0.02), name


def test_non_torch_memory_is_the_logged_figure_at_tp1_and_tp2():
    rows = _rows()
    assert memory.non_torch_bytes(1) == pytest.approx(float(rows[("Llama-3.1-8B", 1)]["non_torch_gib"]) * GIB, rel=0.05)
    assert memory.non_torch_bytes(2) == pytest.approx(float(rows[("Qwen3-32B", 2)]["non_torch_gib"]) * GIB, rel=0.05)


def test_h100_reports_the_total_vllm_logged():
    assert load_gpu("H100").runtime_memory_bytes() == pytest.approx(79.18 * GIB, rel=1e-4)


def test_the_kv_cache_of_a_deployment_is_what_vllm_left():
    """End to end: Llama-3.3-70B FP8 at TP 2 on H100s. vLLM left 32.00 GiB per GPU for the KV cache."""
    sc = scenario_mod.from_dict({"deployment": {"gpu": "H100", "model": "meta-llama/Llama-3.3-70B-Instruct",
                                                "precision": "fp8", "tensor_parallel_size": 2},
                                 "traffic": TRAFFIC}, "memory")
    kv_gb = simulate.deploy(sc).memory["kv_cache_per_gpu_gb"]
    assert kv_gb * 1e9 == pytest.approx(float(_rows()[("Llama-3.3-70B-FP8", 2)]["kv_cache_gib"]) * GIB, rel=0.05)


def test_a_larger_token_budget_makes_the_forward_pass_the_peak():
    """At vLLM's defaults the sampler's logits are the peak (the logged peak does not change with the context
    length); a step of 131,072 tokens on one GPU (MI300X Llama-3.3-70B in InferenceX) keeps far more
    activations live in its MLP than the sampler ever does."""
    from capacity.inputs.models import load_model
    model = load_model("meta-llama/Llama-3.3-70B-Instruct", weight_precision="fp8")
    default = memory.profile_peak_bytes(model, VLLM_DEFAULT_BATCHED_TOKENS, VLLM_DEFAULT_SEQS, 1)
    assert default == memory.sampler_peak_bytes(model, VLLM_DEFAULT_SEQS, VLLM_DEFAULT_BATCHED_TOKENS)
    big = memory.profile_peak_bytes(model, 131072, VLLM_DEFAULT_SEQS, 1)
    assert big > 3 * default
    assert memory.profile_peak_bytes(model, 131072, VLLM_DEFAULT_SEQS, 8) < big   # TP splits the MLP


def test_fewer_sequences_leave_more_kv_cache():
    """The sampler's buffers scale with max_num_seqs: a server started with fewer gets a larger KV cache."""
    def kv(seqs):
        sc = scenario_mod.from_dict({"deployment": {"gpu": "H100", "model": "meta-llama/Llama-3.1-8B"},
                                     "engine": {"max_num_seqs": seqs}, "traffic": TRAFFIC}, "memory")
        return simulate.deploy(sc).memory["kv_cache_per_gpu_gb"]
    assert kv(256) > kv(1024)


def test_an_explicit_reserve_replaces_the_derived_one():
    sc = scenario_mod.from_dict({"deployment": {"gpu": "H100", "model": "meta-llama/Llama-3.1-8B"},
                                 "engine": {"activation_reserve_gb": 2.5}, "traffic": TRAFFIC}, "memory")
    assert simulate.deploy(sc).memory["activation_reserve_per_gpu_gb"] == 2.5


def test_overriding_the_capacity_scales_the_runtime_memory():
    gpu = load_gpu("MI300X")
    half = gpu.with_overrides(hbm_capacity_gb=96)
    assert half.runtime_memory_bytes() == pytest.approx(gpu.runtime_memory_bytes() / 2)
    assert gpu.with_overrides(hbm_capacity_gb=96, hbm_runtime_gib=90).runtime_memory_bytes() == 90 * GIB
