"""vLLM's ROCM_ATTN backend (`engine.attention_backend: rocm`) pads every multi-token query to its prefix-prefill
kernel's tile, and Gemma 4 runs the Triton unified-attention kernel wherever no backend is named.

Truth, from vLLM's source:
- vllm/v1/attention/ops/chunked_prefill_paged_decode.py: with `max_query_len > 1` every sequence of more than one
  query token goes through `context_attention_fwd`; one-token sequences take the paged decode kernel.
- vllm/v1/attention/ops/prefix_prefill.py `context_attention_fwd`: grid (sequences, query heads,
  cdiv(query tokens, BLOCK_M)), BLOCK_M = 128 for a power-of-two KV block size and 32 otherwise. Every tile row
  walks the sequence's cached context, so a padding row costs what a query token costs: 4 x head_dim FLOPs per
  query head per cached token (QK^T and PV) in each full-attention layer.
- vllm/model_executor/models/config.py `Gemma4Config.verify_and_update_config`: TRITON_ATTN for all layers when
  head_dim != global_head_dim and no backend is named.
The model shapes come from the shipped verbatim HF configs, read here independently of capacity.inputs.models.
"""
import json

import numpy as np
import pytest

from capacity.cost.step_cost import StepCostModel
from capacity.errors import CapacityError
from capacity.paths import data_dir
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.inputs.scenario import load
from capacity.measurements.clients import attention_backend

CONTEXT = 880      # tokens, the verified ones included
BATCH = 28


def _config(name: str) -> dict:
    cfg = json.loads((data_dir() / "model_configs" / f"{name}.json").read_text())["config"]
    return cfg.get("text_config", cfg)


def _attn_flops(gpu, model, tp, backend, new_tokens, context_tokens):
    return StepCostModel(gpu, model, tp, attention_backend=backend).features(new_tokens, context_tokens).attn_flops


@pytest.fixture(scope="module")
def mi300x():
    return load_gpu("MI300X")


def test_a_verification_pays_a_128_row_tile_per_query_head_on_a_plain_model(mi300x):
    cfg = _config("Qwen__Qwen3-8B")                        # 32 query heads of 128, 36 full-attention layers
    per_row = 4 * cfg["head_dim"] * cfg["num_attention_heads"] * cfg["num_hidden_layers"] * (CONTEXT - 4)
    model = load_model("Qwen/Qwen3-8B")
    q, c = [4] * BATCH, [CONTEXT] * BATCH                  # each sequence verifies 3 drafts
    extra = _attn_flops(mi300x, model, 1, "rocm", q, c) - _attn_flops(mi300x, model, 1, "triton", q, c)
    assert extra == pytest.approx(BATCH * (128 - 4) * per_row, rel=1e-9)


def test_a_hybrid_model_pays_a_32_row_tile_in_its_full_attention_layers_only(mi300x):
    cfg = _config("Qwen__Qwen3.5-27B")                     # 24 query heads of 256, 16 of 64 layers full attention
    full_layers = sum(t == "full_attention" for t in cfg["layer_types"])
    per_row = 4 * cfg["head_dim"] * cfg["num_attention_heads"] * full_layers * (CONTEXT - 4)
    model = load_model("Qwen/Qwen3.5-27B")
    q, c = [4] * BATCH, [CONTEXT] * BATCH
    extra = _attn_flops(mi300x, model, 2, "rocm", q, c) - _attn_flops(mi300x, model, 2, "triton", q, c)
    assert extra == pytest.approx(BATCH * (32 - 4) * per_row, rel=1e-9)


def test_decode_sequences_take_the_decode_kernel_and_pay_no_padding(mi300x):
    model = load_model("Qwen/Qwen3-8B")
    q, c = [1] * BATCH, [CONTEXT] * BATCH
    assert _attn_flops(mi300x, model, 1, "rocm", q, c) == _attn_flops(mi300x, model, 1, "triton", q, c)


def test_a_whole_prompt_has_no_cached_context_to_walk_and_a_long_chunk_pads_its_last_tile(mi300x):
    model = load_model("Qwen/Qwen3-8B")
    assert (_attn_flops(mi300x, model, 1, "rocm", [1000], [1000])
            == _attn_flops(mi300x, model, 1, "triton", [1000], [1000]))
    cfg = _config("Qwen__Qwen3-8B")
    per_token_ctx = 4 * cfg["head_dim"] * cfg["num_attention_heads"] * cfg["num_hidden_layers"]
    # 300 new tokens after 700 cached: 3 tiles of 128, 84 padding rows walking the 700 cached tokens
    extra = _attn_flops(mi300x, model, 1, "rocm", [300], [1000]) - _attn_flops(mi300x, model, 1, "triton", [300], [1000])
    assert extra == pytest.approx(84 * 700 * per_token_ctx, rel=1e-9)


def test_every_pricing_path_agrees(mi300x):
    """The few-sequence Python path, the numpy path (more than AttentionTables.MAX_ROWS sequences), the
    prompt-chunk path and decode_features price the same padding."""
    model = load_model("Qwen/Qwen3-8B")
    cost = StepCostModel(mi300x, model, 1, attention_backend="rocm")
    few = cost.features([4] * 4, [CONTEXT] * 4).attn_flops
    many = cost.features(np.full(40, 4), np.full(40, CONTEXT)).attn_flops
    assert many == pytest.approx(10 * few, rel=1e-12)
    batch = cost.decode_features(np.full((3, 4), CONTEXT), 4).attn_flops
    assert batch == pytest.approx(np.full(3, few), rel=1e-12)
    # a step mixing a long prompt chunk (priced off the tables) with verifications
    mixed = cost.features([4, 4, 300], [CONTEXT, CONTEXT, 1000]).attn_flops
    assert mixed == pytest.approx(few / 2 + cost.features([300], [1000]).attn_flops, rel=1e-12)


def test_an_mla_model_never_runs_rocm_attn(mi300x):
    """vLLM's selector gives an MLA model only MLA backends (vllm/platforms/rocm.py `_get_backend_priorities`)."""
    with pytest.raises(CapacityError, match="MLA"):
        StepCostModel(mi300x, load_model("moonshotai/Kimi-K2.5"), 8, attention_backend="rocm")


def test_rocm_attn_queries_run_at_the_triton_kernels_efficiency(mi300x):
    model = load_model("Qwen/Qwen3-8B")
    assert StepCostModel(mi300x, model, 1, attention_backend="rocm").attention_key == "attention_triton"


def test_gemma_4_runs_the_triton_kernel_where_no_backend_is_named(mi300x):
    cfg = _config("google__gemma-4-26B-A4B-it")
    assert cfg["head_dim"] != cfg["global_head_dim"]       # 256 and 512: vLLM forces TRITON_ATTN
    for name in ("google/gemma-4-26B-A4B-it", "google/gemma-4-31B-it"):
        assert mi300x.attention_efficiency_key(load_model(name)) == "attention_triton"
        assert load_gpu("H200").attention_efficiency_key(load_model(name)) == "attention_triton"
    assert mi300x.attention_efficiency_key(load_model("Qwen/Qwen3-8B")) == "attention"


def test_a_scenario_can_name_rocm_attn_and_the_seed_rows_name_what_their_commands_set():
    sc = load(None, ["engine.attention_backend=rocm"])
    assert sc.engine.attention_backend == "rocm"
    assert attention_backend({"target": "MiniMaxAI/MiniMax-M3-MXFP8"}) == "triton"   # --attention-backend TRITON_ATTN
    assert attention_backend({"target": "moonshotai/Kimi-K2.5"}) == "auto"


def test_the_serve_line_names_the_kernels_the_plan_priced_where_vllms_default_differs():
    """vLLM >= 0.19 on ROCm runs ROCM_ATTN unless told otherwise; the plan's serve line names what it priced:
    AITER's flash attention for "auto" on a plain model (as InferenceX's MI355X scripts do), nothing where vLLM
    picks the priced kernel itself (sinks, Gemma 4, MLA) or on CUDA."""
    from capacity.studies.plan import attention_backend_args

    mi355x, h200 = load_gpu("MI355X"), load_gpu("H200")
    qwen = load_model("Qwen/Qwen3-8B")
    assert attention_backend_args(mi355x, qwen, "auto") == (["VLLM_ROCM_USE_AITER=1"],
                                                            ["--attention-backend", "ROCM_AITER_FA"])
    assert attention_backend_args(mi355x, qwen, "rocm") == ([], ["--attention-backend", "ROCM_ATTN"])
    assert attention_backend_args(mi355x, qwen, "triton") == ([], ["--attention-backend", "TRITON_ATTN"])
    assert attention_backend_args(h200, qwen, "auto") == ([], [])
    for name in ("google/gemma-4-31B-it", "openai/gpt-oss-120b", "moonshotai/Kimi-K2.5"):
        assert attention_backend_args(mi355x, load_model(name), "auto") == ([], [])


def test_the_serve_line_runs_the_fused_moe_kernels_the_plan_priced():
    """VLLM_ROCM_USE_AITER=1, which the serve line sets for AITER's flash attention, also turns on AITER's fused MoE
    (vllm/_aiter_ops.py `is_fused_moe_enabled`: `_AITER_ENABLED and _FMOE_ENABLED`, VLLM_ROCM_USE_AITER_MOE on by
    default). A MoE model priced on Triton's fused MoE then needs VLLM_ROCM_USE_AITER_MOE=0; one priced on AITER's
    needs VLLM_ROCM_USE_AITER=1; a dense model, CUDA, and Quark MXFP4 experts on gfx950 (AITER's either way,
    quark_moe.py) need nothing."""
    from capacity.studies.plan import moe_backend_env

    mi355x, h200 = load_gpu("MI355X"), load_gpu("H200")
    minimax = load_model("MiniMax-M2.5", weight_precision="fp8")
    aiter_env = ["VLLM_ROCM_USE_AITER=1"]
    assert moe_backend_env(mi355x, minimax, "auto", aiter_env) == ["VLLM_ROCM_USE_AITER_MOE=0"]
    assert moe_backend_env(mi355x, minimax, "triton", []) == []
    assert moe_backend_env(mi355x, minimax, "aiter", aiter_env) == []
    assert moe_backend_env(mi355x, minimax, "aiter", []) == ["VLLM_ROCM_USE_AITER=1"]
    assert moe_backend_env(mi355x, load_model("Qwen/Qwen3-8B"), "auto", aiter_env) == []
    assert moe_backend_env(h200, minimax, "auto", []) == []
    w4a4 = load_model("MiniMax-M2.5", weight_precision="mxfp4_w4a4")
    assert moe_backend_env(mi355x, w4a4, "auto", aiter_env) == []
    assert moe_backend_env(mi355x, w4a4, "auto", []) == []
