"""Model architectures read from Hugging Face ``config.json``-style files.

Every shipped model is a JSON file in ``capacity/data/model_configs/`` (copied verbatim from the
research folder; see its README.md for where each config came from). A shipped file wraps the HF
config: ``{"hf_id", "role", "source", "config", "notes", "inferred", "stated_params", "derived", ...}``.
`load_model` also accepts the path of a user's own plain ``config.json`` (the top-level object is the
HF config itself).

What is computed, and how (all DERIVED from the config fields, formulas below; nothing is copied
from the research ``derived`` blocks, which the tests only use as a cross-check):

* Parameters are counted from the tensor shapes the config implies, the same conventions as the
  research README: gated MLP (SwiGLU/GeGLU) = 3·H·I; MoE = E·3·H·I + router H·E (+ E bias when
  the router has a score-correction bias: ``topk_method == "noaux_tc"`` or ``use_routing_bias``);
  GQA attention = H·nq·hd (×2 with ``attn_output_gate``) + 2·H·nkv·hd + nq·hd·H; MLA = q_a, q_b,
  kv_a (with rope), kv_b, o and the two LoRA norms; Gated DeltaNet = in_proj_qkv/z/a/b + conv +
  out_proj + A_log/dt_bias + head norm. Norm vectors are included, biases only where the
  architecture has them. Vision towers and native MTP modules are excluded from ``params_total``
  (the MTP size is reported separately in ``params_native_mtp``).
* ``params_active`` leaves out the input-embedding lookup and includes the LM-head matmul (a tied
  embedding counts once, as the LM head).
* KV bytes per context token: GQA 2·nkv·hd·b per layer; MLA (kv_lora_rank + qk_rope_head_dim)·b;
  sliding layers hold at most ``sliding_window`` tokens; Gated DeltaNet layers hold a constant state
  per sequence: conv (2·nk·dk + nv·dv)·(kernel − 1) at the model dtype + ssm nv·dk·dv at
  ``mamba_ssm_dtype``. ``b`` = 1 for an fp8 KV cache, 2 for bf16/fp16.
* Sparse attention (DeepSeek-style DSA ``index_topk``; MiniMax MSA ``sparse_attention_config``):
  those layers still cache K/V for every token (they count as full-attention layers), but a step
  attends to (and reads) at most ``sparse_attention_tokens`` of them; the indexer's own key cache
  (fp8 + one fp32 scale per 128 values — assumed, the vLLM/LightLLM DeepSeek-V3.2 indexer-cache
  layout) is read for every context token.
* Attention-score FLOPs per query token per context token: 4·nq·hd per GQA layer (QKᵀ and AV);
  absorbed MLA 2·nh·(2·kv_lora_rank + qk_rope_head_dim) (the decode form vLLM uses). It is applied to
  every chunk: for long prefill chunks vLLM switches to the non-absorbed form, 2·nh·(qk_nope + qk_rope
  + v_head_dim) per context token plus the kv_b up-projection of the context, so MLA prefill attention
  FLOPs are over-estimated (about 3.4x for DeepSeek-V3). An indexer adds 2·index_heads·index_dim per
  layer per context token. Gated DeltaNet: 7·nv·dk·dv per layer per token
  (decay dk·dv, Sᵀk 2·dk·dv, rank-1 update 2·dk·dv, readout Sᵀq 2·dk·dv) + the depthwise conv
  2·kernel·(2·nk·dk + nv·dv) — derived from the recurrence, not measured.

Not modelled: non-gated MLPs (GPT-2/OPT style; every MLP is taken as gated, 3·H·I), chunked
attention (Llama 4), Gemma-3n per-layer embeddings, vision/audio towers.

Draft models (role "draft") are costed per forward position like targets. A DFlash drafter borrows
the target's embedding and LM head: ``params_lm_head`` is that borrowed head, counted in
``params_active``/``dense_*`` (it runs on every drafted position) but not in ``params_total`` or
``weight_bytes_total`` (the target stores it). The Gemma-4 assistant holds no KV of its own
(``kv_bytes_per_token`` 0): it attends over the target's last sliding and last full layer, which its
attention FLOPs include; the bytes it reads there are the target's.

Architecture facts that HF keeps in modelling code rather than in config.json (which layers carry
q/k norms, Gemma's extra norms, gpt-oss's attention sinks and expert biases, Qwen's shared-expert
gate, Qwen2's qkv bias) are keyed on ``model_type`` in `_TRAITS`; everything else is read from the
config fields.

Weight precision (`load_model(weight_precision=...)`): None keeps the checkpoint's own format
(``quantization_config``; if a config has none, a format named in the checkpoint id such as
``-MXFP8``; else bf16). An override applies to the quantizable linear layers:
  * fp8 / mxfp8: every linear layer except the input embedding and the LM head;
  * int4 / mxfp4 / fp4 / nvfp4 (and nvfp4_w4a4 / mxfp4_w4a4, whose activations are 4-bit too, and mxfp4_w4a8, whose
    activations are 8-bit): the routed experts only for MoE models (the rest stays bf16, as in
    the openai/gpt-oss MXFP4 and moonshotai/Kimi-K2.5 INT4 checkpoints), every linear layer except
    the embedding and LM head for dense models (assumed: the usual AWQ/GPTQ/MXFP4 recipe);
  * bf16: everything 2 bytes.
Routers, gates, norms, biases and convolution kernels always stay at 2 bytes (assumed: the public
FP8/MXFP4/INT4 checkpoints list them in ``modules_to_not_convert`` / ``ignore``; they are <0.1 % of
the weights). Bytes per parameter including block scales are in `WEIGHT_FORMATS`.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from capacity.errors import CapacityError
from capacity.paths import data_dir

# --------------------------------------------------------------------------------------------------
# Data tables
# --------------------------------------------------------------------------------------------------

# name -> (bytes per parameter including block scales, source)
WEIGHT_FORMATS: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "bfloat16 / float16: 16 bits per value"),
    "fp8": (1.0, "FP8 E4M3: 8 bits per value; per-channel or 128x128-block fp32 scales add <= 4 B per "
                 "16,384 values (0.02 %) and are neglected (DeepSeek-R1/MiniMax-M2.5 quantization_config "
                 "weight_block_size [128, 128])"),
    "mxfp8": (1.0 + 1.0 / 32, "OCP Microscaling Formats (MX) Specification v1.0: 32-value blocks of FP8 "
                              "E4M3 + one 8-bit E8M0 shared scale"),
    "mxfp4": (0.5 + 1.0 / 32, "OCP Microscaling Formats (MX) Specification v1.0: 32-value blocks of FP4 "
                              "E2M1 + one 8-bit E8M0 shared scale"),
    "fp4": (0.5 + 1.0 / 32, "treated as MXFP4 (OCP MX v1.0) unless nvfp4 is named"),
    "nvfp4": (0.5 + 1.0 / 16, "NVIDIA NVFP4: FP4 E2M1 with one FP8 E4M3 scale per 16 values (+ one fp32 "
                              "scale per tensor, neglected)"),
    "nvfp4_w4a4": (0.5 + 1.0 / 16, "NVFP4 weights (as nvfp4) whose activations are quantized to NVFP4 too, so the "
                                   "GEMM runs on FP4 tensor cores where the GPU has them (GpuProfile.compute_dtype): "
                                   "ModelOpt's NVFP4 recipe, which vLLM serves with its ModelOpt NVFP4 linear and MoE "
                                   "methods"),
    "mxfp4_w4a8": (0.5 + 1.0 / 32, "MXFP4 weights (as mxfp4) whose activations are quantized to MXFP8, so the GEMM runs "
                                   "on FP8 tensor cores (vLLM's FlashInfer MXFP4 x MXFP8 MoE on Blackwell, "
                                   "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1)"),
    "mxfp4_w4a4": (0.5 + 1.0 / 32, "MXFP4 weights (as mxfp4) with MXFP4 activations: the GEMM runs on FP4 tensor cores "
                                   "where the GPU has them"),
    "int4": (0.5 + 2.0 / 32, "compressed-tensors pack-quantized INT4, symmetric, group_size 32 "
                             "(moonshotai/Kimi-K2.5 quantization_config) with one bf16 scale per group "
                             "(scale dtype assumed bf16)"),
}
_OVERRIDE_FORMATS = ("bf16", "fp8", "mxfp8", "int4", "mxfp4", "fp4", "nvfp4", "nvfp4_w4a4", "mxfp4_w4a4", "mxfp4_w4a8")
_FOUR_BIT = ("int4", "mxfp4", "fp4", "nvfp4", "nvfp4_w4a4", "mxfp4_w4a4", "mxfp4_w4a8")

# Bytes of the small tensors that are never quantized (norms, routers, biases): the bf16 checkpoint dtype.
_UNQUANTIZED_BYTES = 2.0

# KV-cache dtype -> bytes per element (vLLM --kv-cache-dtype spellings; "auto" = the model dtype, bf16).
KV_DTYPE_BYTES: dict[str, float] = {
    "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0, "auto": 2.0,
    "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp8_e4m3fnuz": 1.0,
}

# Sparse-attention indexer key cache: fp8 values + one fp32 scale per 128 values (assumed: the
# DeepSeek-V3.2 indexer cache layout of vLLM / LightLLM, k_cache fp8_e4m3 + k_scale fp32 per
# index_quant_block_size 128). Used for GLM-5 (DSA) and MiniMax-M3 (MSA).
_INDEX_KEY_BYTES_PER_VALUE = 1.0
_INDEX_SCALE_BYTES_PER_BLOCK = 4.0
_INDEX_QUANT_BLOCK = 128
# MLA runs in two forms in vLLM (vllm/model_executor/layers/attention/mla_attention.py module docstring, lines
# 66-89 "Compute Friendly Approach" and the forward_impl dispatch at 700-737; before 2026 the same text in
# vllm/v1/attention/backends/mla/common.py): decode tokens (query length at most the backend's
# reorder_batch_threshold, 1 or 1 + num_speculative_tokens where MLA backends take speculation as decode:
# vllm/v1/attention/backend.py _init_reorder_batch_threshold) run the absorbed latent MQA, QK over
# kv_lora_rank + qk_rope_head_dim and PV over kv_lora_rank per head; prompt chunks run ordinary MHA on
# k_nope, v up-projected from the latent (QK over qk_nope + qk_rope, PV over v_head_dim per head: 3.4x
# fewer FLOPs per context token for DeepSeek-V3 / Kimi-K2), and up-project the chunk's cached context
# (kv_b_proj over every earlier token, _compute_prefill_context). Sparse (DSA) MLA layers run the absorbed
# form at prefill too (FlashMLA sparse prefill). The threshold here bounds every verified width in use
# (1 + N, N <= 15); a prompt chunk of at most this many tokens is priced in the decode form (basis: assumed).
MLA_DECODE_MAX_QUERY_TOKENS = 16

# Architecture facts HF keeps in modelling code, keyed on model_type (top level or text_config).
#   qk_norm: "per_head" q_norm/k_norm over head_dim (Qwen3, Gemma 3/4, OLMo-style)
#   norms_per_layer: RMSNorm vectors of width H per decoder layer (Llama 2; Gemma 4 4)
#   moe_extra_norms / router_scale: Gemma 4 MoE layers add 3 norms and an H-wide router scale
#     (the research README's derived counts for gemma-4-26B-A4B reproduce 25.2B with these)
#   sinks: gpt-oss per-head attention sinks; expert_bias / router_bias: gpt-oss MoE biases
#   qkv_bias: Qwen2 q/k/v biases without a config flag
_TRAITS: dict[str, dict[str, Any]] = {
    **{t: {"qk_norm": "per_head"} for t in (
        "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
        "olmoe", "glm4_moe")},
    **{t: {"qk_norm": "per_head", "norms_per_layer": 4} for t in ("gemma3", "gemma3_text")},
    **{t: {"qk_norm": "per_head", "norms_per_layer": 4, "moe_extra_norms": 3, "router_scale": True}
       for t in ("gemma4", "gemma4_text", "gemma4_assistant")},
    "gemma": {"norms_per_layer": 2}, "gemma2": {"norms_per_layer": 4},
    "gpt_oss": {"sinks": True, "expert_bias": True, "router_bias": True},
    "qwen2": {"qkv_bias": True}, "qwen2_moe": {"qkv_bias": True},
}

# Shared-expert styles: Qwen (`shared_expert_intermediate_size`) has a sigmoid gate Linear(H, 1).

# Shipped draft configs were reconstructed (README "Not found"); some lack fields the parser needs.
# hf_id -> (fields to fill when missing or not numeric, or the hf_id of a sibling file to copy them
# from; the reason). Every value here is an ASSUMPTION and is reported in ModelArch.assumptions.
_ASSUMED_DRAFT_FIELDS: dict[str, tuple[dict[str, Any] | str, str]] = {
    "Inferact/MiniMax-M3-EAGLE3": (
        {"num_attention_heads": 48, "num_key_value_heads": 48, "head_dim": 128,
         "intermediate_size": 12288, "vocab_size": 200064, "draft_vocab_size": 32000},
        "assumed: config.json not found; hidden 6144 / Llama head_dim 128 = 48 heads, MHA (recipe comment), "
        "MLP width = target dense_intermediate_size 12288, vocab = target 200064, draft vocab 32000 "
        "(SpecForge default)"),
    "RedHatAI/gemma-4-31B-it-speculator.dspark": (
        {"num_hidden_layers": 5, "hidden_size": 5376, "num_attention_heads": 32, "num_key_value_heads": 16,
         "head_dim": 256, "intermediate_size": 21504, "vocab_size": 262144, "markov_rank": 256},
        "assumed (very low confidence): only block 8, draft vocab 32000 and 8.39 GB are known; 5 layers at "
        "the target's width + rank-256 Markov head as the file's notes guess"),
    "z-lab/Qwen3.5-27B-DFlash": (
        "z-lab/Qwen3.6-27B-DFlash",
        "assumed: fields other than the trimmed ones copied from z-lab/Qwen3.6-27B-DFlash (the file's 'inferred')"),
}

# Checkpoint-id tokens that name a weight format, for configs without a quantization_config.
_NAME_FORMATS = {"mxfp8": "mxfp8", "fp8": "fp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp4": "fp4",
                 "int4": "int4", "w4a16": "int4", "awq": "int4"}

_DRAFT_METHODS = ("eagle3", "dflash", "dspark", "gemma4_mtp", "draft_model")


# --------------------------------------------------------------------------------------------------
# Public types
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftInfo:
    """How a draft model drafts (from its config and the research notes)."""

    method: str                                   # eagle3 | dflash | dspark | gemma4_mtp | draft_model
    target: str | None                            # hf_id of the target it was trained for
    block_size: int | None = None                 # DFlash/DSpark block: at most block_size - 1 drafts per pass (DFlash)
    target_layer_ids: tuple[int, ...] | None = None   # target layers whose hidden states feed the draft
    shares_target_kv: bool = False                # Gemma-4 assistant: no KV of its own, reads the target's
    markov_rank: int | None = None                # DSpark Markov head rank
    draft_vocab_size: int | None = None           # EAGLE-3 / DSpark reduced LM-head vocabulary
    parallel_drafting: bool = False               # one forward proposes the whole block (DFlash, DSpark backbone)
    uses_target_lm_head: bool = False             # borrows the target's embedding and LM head (DFlash)


@dataclass(frozen=True)
class ModelArch:
    """One model's architecture with the sizes the step-cost model needs.

    Units: params in parameters, bytes in bytes, FLOPs in floating-point operations (a multiply-add = 2).
    """

    name: str
    model_type: str
    role: str                                 # "target" or "draft"
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int                         # MLA: 1 (one shared latent per token, replicated over TP ranks)
    head_dim: int                             # MLA: qk_nope_head_dim + qk_rope_head_dim
    num_full_attention_layers: int            # layers whose KV grows with every context token (full GQA/MHA/MSA/DSA, MLA)
    num_sliding_attention_layers: int
    sliding_window: int | None
    num_linear_attention_layers: int          # Gated DeltaNet etc.: constant recurrent state per sequence
    uses_mla: bool
    params_total: int                         # incl. embeddings (tied counted once); excl. vision towers and MTP modules
    params_active: int                        # per token: excl. the input-embedding lookup, incl. the LM head
    params_embedding: int                     # input embedding table (0 if the model borrows the target's)
    params_lm_head: int                       # LM-head matmul (tied: the embedding table; DFlash: the target's, borrowed)
    num_moe_layers: int
    num_experts: int
    experts_per_token: int
    num_shared_experts: int
    params_per_expert: int                    # one routed expert in one layer
    weight_precision: str                     # bf16 | fp8 | mxfp8 | int4 | mxfp4 | fp4 | nvfp4 | nvfp4_w4a4 | mxfp4_w4a4 | mxfp4_w4a8
    compute_weight_dtype: str                 # dtype of the bulk of the linear FLOPs' weights (routed experts for MoE)
    bytes_per_param: dict[str, float]         # {"dense", "expert", "embedding", "other"} incl. block scales
    weight_bytes_total: float                 # bytes the model's own weights occupy
    dense_weight_bytes: float                 # read by every forward pass: attention, dense MLPs, shared experts, routers, norms, LM head
    expert_weight_bytes: float                # ONE routed expert in ONE layer
    dense_flops_per_token: float              # 2 x dense linear params per token (incl. LM head)
    expert_flops_per_token: float             # 2 x routed-expert linear params per token
    kv_dtype: str
    kv_bytes_per_token: float                 # per context token over full-KV layers (MLA latent+rope; + indexer keys)
    swa_kv_bytes_per_token: float             # per context token over sliding layers (at most sliding_window tokens held)
    state_bytes_per_seq: float                # constant per-sequence recurrent state (linear attention conv + ssm)
    attn_flops_per_token_per_ctx: float       # per query token per context token over full/MLA layers that attend densely (+ indexer scoring)
    swa_attn_flops_per_token_per_ctx: float   # per query token per (windowed) context token over sliding layers
    linear_attn_flops_per_token: float        # per token over linear-attention layers (state update + readout + conv)
    native_mtp_layers: int                    # 0 if none
    draft: DraftInfo | None
    source: str
    # ---- beyond the minimal interface ----
    dense_weight_dtype: str = "bf16"          # format of the dense (non-expert) linear layers
    full_num_kv_heads: int = 0                # KV heads of the full-attention layers (Gemma 4: num_global_key_value_heads)
    full_head_dim: int = 0                    # head dim of the full-attention layers (Gemma 4: global_head_dim)
    num_sparse_attention_layers: int = 0      # full-KV layers that attend to at most sparse_attention_tokens tokens (DSA/MSA)
    sparse_attention_tokens: int | None = None
    sparse_kv_bytes_per_token: float = 0.0    # the part of kv_bytes_per_token held by sparse layers (excl. indexer keys)
    index_kv_bytes_per_token: float = 0.0     # the part of kv_bytes_per_token that is indexer keys (read in full)
    sparse_attn_flops_per_token_per_ctx: float = 0.0   # per query token per ATTENDED token over sparse layers
    # dense MLA layers (MLA_DECODE_MAX_QUERY_TOKENS): their share of attn_flops_per_token_per_ctx (absorbed decode
    # form), the same in the prompt-chunk MHA form, and the up-projection FLOPs per cached context token of a chunk
    mla_decode_flops_per_token_per_ctx: float = 0.0
    mla_prefill_flops_per_token_per_ctx: float = 0.0
    mla_context_flops_per_token: float = 0.0
    params_native_mtp: int = 0                # native MTP modules, excl. the shared embedding and LM head
    mtp_kv_bytes_per_token: float = 0.0       # KV per context token the native MTP layers add when used
    tied_embeddings: bool = False             # the LM head is the input embedding table (stored once)
    max_position_embeddings: int | None = None   # the config's context window: vLLM's default --max-model-len
    mlp_intermediate_size: int = 0            # width of the dense MLP layers (0: none)
    expert_intermediate_size: int = 0         # width of one routed expert (0: no MoE layers)
    shared_expert_intermediate_size: int = 0  # total width of a MoE layer's shared experts (0: none)
    qk_norm: str | None = None                # "per_head" | "per_layer" q/k RMSNorm of GQA layers (None: none, or MLA)
    attention_sinks: bool = False             # per-head attention sinks (gpt-oss): a kernel must support them
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    def __hash__(self) -> int:
        return hash((self.name, self.role, self.weight_precision, self.kv_dtype, self.params_total,
                     self.weight_bytes_total, self.kv_bytes_per_token, self.source))

    @property
    def _prefill_flops_per_ctx(self) -> float:
        """attn_flops_per_token_per_ctx with the dense MLA layers in their prompt-chunk (MHA) form."""
        return self.attn_flops_per_token_per_ctx - self.mla_decode_flops_per_token_per_ctx \
            + self.mla_prefill_flops_per_token_per_ctx

    # ---------------------------------------------------------------------------------------- costs
    def kv_cache_bytes(self, context_tokens: np.ndarray) -> np.ndarray:
        """Bytes of cache a sequence of each context length holds: full-KV layers for every token,
        sliding layers for min(context, window) tokens, plus the constant recurrent state."""
        c = np.asarray(context_tokens, dtype=np.float64)
        return self.kv_bytes_per_token * c + self.swa_kv_bytes_per_token * _cap(c, self.sliding_window) \
            + self.state_bytes_per_seq

    def kv_read_bytes(self, context_tokens: np.ndarray) -> np.ndarray:
        """Bytes of cache one decode step reads for each sequence: as `kv_cache_bytes`, except that
        sparse-attention layers read only their at most `sparse_attention_tokens` selected tokens
        (their indexer keys are read for every token)."""
        c = np.asarray(context_tokens, dtype=np.float64)
        dense_kv = self.kv_bytes_per_token - self.sparse_kv_bytes_per_token
        return dense_kv * c + self.sparse_kv_bytes_per_token * _cap(c, self.sparse_attention_tokens) \
            + self.swa_kv_bytes_per_token * _cap(c, self.sliding_window) + self.state_bytes_per_seq

    @property
    def largest_head_dim(self) -> int:
        """The largest attention head size of any layer (Gemma 4: its 512-wide global layers), which decides
        the attention backends vLLM can run the model on."""
        return max(self.head_dim, self.full_head_dim or 0)

    def attention_flops(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> np.ndarray:
        """Attention FLOPs per sequence for a chunk of `new_tokens` tokens whose last token sits at
        context length `context_tokens` (the chunk included). Causal: the i-th new token
        (i = 1..n) attends to c − n + i tokens, so a full layer sees n·c − n(n−1)/2 context
        tokens; sliding and sparse layers see min(position, window / sparse budget) per token.
        Includes the linear-attention per-token work (n × `linear_attn_flops_per_token`). Dense MLA
        layers are priced in vLLM's prompt-chunk form for chunks longer than MLA_DECODE_MAX_QUERY_TOKENS."""
        n = np.asarray(new_tokens, dtype=np.float64)
        c = np.asarray(context_tokens, dtype=np.float64)
        if np.any(n < 0) or np.any(n > c):
            raise ValueError("attention_flops needs 0 <= new_tokens <= context_tokens")
        full = n * c - n * (n - 1.0) / 2.0
        if self.mla_prefill_flops_per_token_per_ctx:
            dense = np.where(n > MLA_DECODE_MAX_QUERY_TOKENS,
                             self._prefill_flops_per_ctx * full + self.mla_context_flops_per_token * (c - n),
                             self.attn_flops_per_token_per_ctx * full)
        else:
            dense = self.attn_flops_per_token_per_ctx * full
        out = dense + self.linear_attn_flops_per_token * n
        if self.swa_attn_flops_per_token_per_ctx:
            out = out + self.swa_attn_flops_per_token_per_ctx * _capped_sum(n, c, self.sliding_window)
        if self.sparse_attn_flops_per_token_per_ctx:
            out = out + self.sparse_attn_flops_per_token_per_ctx * _capped_sum(n, c, self.sparse_attention_tokens)
        return out

    def attention_flops_one(self, new_tokens: int, context_tokens: int) -> float:
        """`attention_flops` of one sequence in plain Python floats, the same operations in the same
        order (so the same bits): a step's few prompt chunks skip numpy's per-call cost."""
        n, c = float(new_tokens), float(context_tokens)
        if n < 0 or n > c:
            raise ValueError("attention_flops needs 0 <= new_tokens <= context_tokens")
        full = n * c - n * (n - 1.0) / 2.0
        if self.mla_prefill_flops_per_token_per_ctx and n > MLA_DECODE_MAX_QUERY_TOKENS:
            dense = self._prefill_flops_per_ctx * full + self.mla_context_flops_per_token * (c - n)
        else:
            dense = self.attn_flops_per_token_per_ctx * full
        out = dense + self.linear_attn_flops_per_token * n
        if self.swa_attn_flops_per_token_per_ctx:
            out = out + self.swa_attn_flops_per_token_per_ctx * _capped_sum_one(n, c, self.sliding_window)
        if self.sparse_attn_flops_per_token_per_ctx:
            out = out + self.sparse_attn_flops_per_token_per_ctx * _capped_sum_one(n, c, self.sparse_attention_tokens)
        return float(out)

    # ---------------------------------------------------------------------------------------- output
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable summary (for ``capacity models --json``)."""
        d = asdict(self)
        if self.draft is not None and self.draft.target_layer_ids is not None:
            d["draft"]["target_layer_ids"] = list(self.draft.target_layer_ids)
        d["assumptions"] = list(self.assumptions)
        d["bytes_per_param"] = dict(self.bytes_per_param)
        return d


# --------------------------------------------------------------------------------------------------
# Vectorised helpers
# --------------------------------------------------------------------------------------------------

def _cap(c: np.ndarray, limit: int | None) -> np.ndarray:
    return c if limit is None else np.minimum(c, float(limit))


def _capped_sum(n: np.ndarray, c: np.ndarray, limit: int | None) -> np.ndarray:
    """Σ_{j=c−n+1}^{c} min(j, limit): context tokens a chunk's queries see in a windowed layer."""
    if limit is None:
        return n * c - n * (n - 1.0) / 2.0
    k = float(limit)
    a = c - n + 1.0                       # first position of the chunk
    m = np.minimum(c, k)                  # last position below the cap
    below = np.where(m >= a, (a + m) * (m - a + 1.0) / 2.0, 0.0)
    above = k * np.maximum(0.0, c - np.maximum(a - 1.0, k))
    return below + above


def _capped_sum_one(n: float, c: float, limit: int | None) -> float:
    """`_capped_sum` for one sequence, in Python floats (same operations, same order)."""
    if limit is None:
        return n * c - n * (n - 1.0) / 2.0
    k = float(limit)
    a = c - n + 1.0
    m = min(c, k)
    below = (a + m) * (m - a + 1.0) / 2.0 if m >= a else 0.0
    above = k * max(0.0, c - max(a - 1.0, k))
    return below + above


# --------------------------------------------------------------------------------------------------
# Config access
# --------------------------------------------------------------------------------------------------

_NUM_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def _number(value: Any) -> float | int | None:
    """A config value as a number: ints/floats as is; "64 (inferred)" -> 64; anything else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        m = _NUM_RE.match(value)
        if m:
            text = m.group(1)
            return float(text) if any(ch in text for ch in ".eE") else int(text)
    return None


class _Config:
    """A flattened HF config: top-level fields overlaid with the text/transformer sub-config."""

    def __init__(self, raw: dict[str, Any], label: str):
        self.label = label
        self.top = raw
        merged = dict(raw)
        for key in ("text_config", "transformer_layer_config", "llm_config", "language_config"):
            sub = raw.get(key)
            if isinstance(sub, dict):
                merged.update(sub)
        self.c = merged

    def raw(self, *names: str) -> Any:
        for name in names:
            if name in self.c and self.c[name] is not None:
                return self.c[name]
        return None

    def num(self, *names: str, default: Any = None, required: bool = False) -> Any:
        for name in names:
            value = self.c.get(name)
            if isinstance(value, str) and value.strip().startswith("=="):
                ref = value.strip()[2:].split()[0]          # "== num_attention_heads (...)"
                value = self.c.get(ref)
            num = _number(value)
            if num is not None:
                return num
        if required:
            raise CapacityError(
                f"model config {self.label} is missing '{names[0]}'; add it (as in the model's Hugging Face "
                f"config.json) or pass a complete config.json")
        return default

    def int(self, *names: str, default: Any = None, required: bool = False) -> Any:
        v = self.num(*names, default=default, required=required)
        return int(v) if isinstance(v, (int, float)) else v

    def flag(self, name: str, default: bool = False) -> bool:
        v = self.c.get(name)
        return default if v is None else bool(v)

    def model_types(self) -> list[str]:
        out = []
        for v in (self.top.get("model_type"), self.c.get("model_type")):
            if isinstance(v, str) and v not in out:
                out.append(v)
        return out


def _traits(cfg: _Config) -> dict[str, Any]:
    t: dict[str, Any] = {}
    for mt in cfg.model_types():
        t.update(_TRAITS.get(mt, {}))
    return t


# --------------------------------------------------------------------------------------------------
# Parameter accounting
# --------------------------------------------------------------------------------------------------

@dataclass
class _Parts:
    dense_linear: int = 0      # quantizable linear weights every token runs through
    small_linear: int = 0      # routers and gates: linear, every token, never quantized
    other: int = 0             # norms, biases, sinks, conv kernels, scalars: never quantized
    lookup: int = 0            # lookup tables besides the input embedding (DSpark Markov w1)

    def add(self, other: "_Parts") -> None:
        self.dense_linear += other.dense_linear
        self.small_linear += other.small_linear
        self.other += other.other
        self.lookup += other.lookup

    @property
    def total(self) -> int:
        return self.dense_linear + self.small_linear + self.other + self.lookup


@dataclass
class _Attn:
    """Per-layer attention cost contributions."""

    params: _Parts
    kv_bytes: float = 0.0          # per context token
    flops_per_ctx: float = 0.0     # per query token per attended context token
    prefill_flops_per_ctx: float | None = None   # MLA: the same in the prompt-chunk (MHA) form; None: as flops_per_ctx
    context_flops: float = 0.0     # MLA: FLOPs per cached context token a prompt chunk up-projects (kv_b_proj)


def _qk_norm(cfg: _Config, tr: dict[str, Any]) -> str | None:
    """"per_head" (an RMSNorm over each head's q and k), "per_layer" (over all of q and all of k, MiniMax-M2's
    `qk_norm_type`) or None: the config's use_qk_norm / qk_norm_type where it has them, else the model type's trait."""
    if "use_qk_norm" in cfg.c:
        return (cfg.raw("qk_norm_type") or "per_head") if cfg.flag("use_qk_norm") else None
    return tr.get("qk_norm")


def _gqa(cfg: _Config, tr: dict[str, Any], h_in: int, h: int, nq: int, nkv: int, hd: int, *,
         has_v: bool, kv_shared: bool, kv_b: float) -> _Attn:
    gated = cfg.flag("attn_output_gate")
    p = _Parts()
    q_out = nq * hd * (2 if gated else 1)
    p.dense_linear += h_in * q_out + nq * hd * h
    if not kv_shared:
        p.dense_linear += h_in * nkv * hd * (2 if has_v else 1)
    bias = cfg.flag("attention_bias")
    if bias or tr.get("qkv_bias"):
        p.other += q_out + (0 if kv_shared else nkv * hd * (2 if has_v else 1))
    if bias:
        p.other += h                                            # o_proj bias
    qk = _qk_norm(cfg, tr)
    if qk == "per_layer":
        p.other += nq * hd + (0 if kv_shared else nkv * hd)
    elif qk:
        p.other += hd + (0 if kv_shared else hd)
    if tr.get("sinks"):
        p.other += nq
    kv = 0.0 if kv_shared else 2.0 * nkv * hd * kv_b           # K and V (Gemma k_eq_v: both cached, README)
    return _Attn(params=p, kv_bytes=kv, flops_per_ctx=4.0 * nq * hd)


def _mla(cfg: _Config, h_in: int, h: int, nh: int, kv_b: float) -> _Attn:
    q_lora = cfg.int("q_lora_rank")
    kv_lora = cfg.int("kv_lora_rank", required=True)
    nope = cfg.int("qk_nope_head_dim", required=True)
    rope = cfg.int("qk_rope_head_dim", required=True)
    v = cfg.int("v_head_dim", required=True)
    p = _Parts()
    if q_lora:
        p.dense_linear += h_in * q_lora + q_lora * nh * (nope + rope)
        p.other += q_lora                                       # q_a_layernorm
    else:
        p.dense_linear += h_in * nh * (nope + rope)
    p.dense_linear += h_in * (kv_lora + rope) + kv_lora * nh * (nope + v) + nh * v * h
    p.other += kv_lora                                          # kv_a_layernorm
    return _Attn(params=p, kv_bytes=(kv_lora + rope) * kv_b,
                 flops_per_ctx=2.0 * nh * (2 * kv_lora + rope),             # absorbed: QK (kv_lora + rope), PV kv_lora
                 prefill_flops_per_ctx=2.0 * nh * (nope + rope + v),        # MHA: QK (nope + rope), PV v
                 context_flops=2.0 * kv_lora * nh * (nope + v))             # kv_b_proj of one cached token


def _gated_deltanet(cfg: _Config, h: int) -> tuple[_Parts, float, float]:
    """Params, state bytes per sequence and FLOPs per token of one Gated DeltaNet layer."""
    nk = cfg.int("linear_num_key_heads", required=True)
    dk = cfg.int("linear_key_head_dim", required=True)
    nv = cfg.int("linear_num_value_heads", required=True)
    dv = cfg.int("linear_value_head_dim", required=True)
    kernel = cfg.int("linear_conv_kernel_dim", required=True)
    conv_dim = 2 * nk * dk + nv * dv
    p = _Parts()
    p.dense_linear += h * conv_dim + h * nv * dv + nv * dv * h   # in_proj_qkv, in_proj_z, out_proj
    p.small_linear += 2 * h * nv                                 # in_proj_a, in_proj_b
    p.other += conv_dim * kernel + 2 * nv + dv                   # conv1d, A_log + dt_bias, gated head norm
    ssm_bytes = 4.0 if str(cfg.raw("mamba_ssm_dtype") or "").lower() in ("float32", "fp32") else 2.0
    state = conv_dim * (kernel - 1) * 2.0 + nv * dk * dv * ssm_bytes
    flops = 7.0 * nv * dk * dv + 2.0 * kernel * conv_dim
    return p, state, flops


def _mlp(h: int, inter: int) -> _Parts:
    return _Parts(dense_linear=3 * h * inter)


# --------------------------------------------------------------------------------------------------
# Layer layout
# --------------------------------------------------------------------------------------------------

_LAYER_TYPE_NAMES = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear",
                     "global": "full", "local": "sliding"}


def _layer_kinds(cfg: _Config, n_layers: int) -> list[str]:
    lt = cfg.raw("layer_types")
    if isinstance(lt, list):
        if len(lt) != n_layers:
            raise CapacityError(
                f"model config {cfg.label} lists {len(lt)} layer_types for {n_layers} layers; make them agree")
        out = []
        for t in lt:
            if t not in _LAYER_TYPE_NAMES:
                raise CapacityError(
                    f"model config {cfg.label} has layer type '{t}'; capacity knows "
                    f"{', '.join(sorted(_LAYER_TYPE_NAMES))}")
            out.append(_LAYER_TYPE_NAMES[t])
        return out
    if cfg.raw("linear_num_value_heads") is not None:            # hybrid without layer_types
        interval = cfg.int("full_attention_interval", default=4)
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(n_layers)]
    window = cfg.int("sliding_window")
    use = cfg.c.get("use_sliding_window")
    if window and use is not False:
        pattern = cfg.int("sliding_window_pattern")
        if pattern:
            return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(n_layers)]
        if use is True and cfg.int("max_window_layers") is not None:   # Qwen2 semantics
            first_full = cfg.int("max_window_layers")
            return ["sliding" if i >= first_full else "full" for i in range(n_layers)]
        return ["sliding"] * n_layers
    return ["full"] * n_layers


def _moe_layers(cfg: _Config, n_layers: int, n_experts: int) -> list[bool]:
    if not n_experts:
        return [False] * n_layers
    moe = [True] * n_layers
    first_dense = cfg.int("first_k_dense_replace", default=0)
    freq = cfg.raw("moe_layer_freq")
    step = cfg.int("decoder_sparse_step")
    only_mlp = cfg.raw("mlp_only_layers") or []
    for i in range(n_layers):
        if i < first_dense:
            moe[i] = False
        if isinstance(freq, list):
            if len(freq) != n_layers:
                raise CapacityError(
                    f"model config {cfg.label} has {len(freq)} moe_layer_freq entries for {n_layers} layers; "
                    f"make them agree")
            moe[i] = moe[i] and bool(freq[i])
        elif isinstance(freq, int) and freq > 1:
            moe[i] = moe[i] and i % freq == 0
        if step and step > 1:
            moe[i] = moe[i] and (i + 1) % step == 0
        if i in only_mlp:
            moe[i] = False
    return moe


# --------------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------------

def _mentions_attention(patterns: Any) -> bool:
    if not isinstance(patterns, list):
        return False
    return any(isinstance(p, str) and ("self_attn" in p or "attn" in p.split(".")[-1] or "attention" in p)
               for p in patterns)


def _native_format(cfg: _Config, name: str, is_moe: bool) -> tuple[str, str, dict[str, float], str | None]:
    """(dense format, expert format, format-bytes overrides, assumption note) of the checkpoint."""
    q = cfg.raw("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "")).lower()
        fmt, ignore, extra = None, None, {}
        if method == "mxfp4":
            fmt, ignore = "mxfp4", q.get("modules_to_not_convert")
        elif method in ("fp8", "fbgemm_fp8", "ptpc_fp8"):
            block = q.get("weight_block_size")
            fmt = "mxfp8" if isinstance(block, list) and list(block) == [1, 32] and \
                str(q.get("scale_fmt", "")).lower() == "ue8m0" else "fp8"
            ignore = q.get("modules_to_not_convert") or q.get("ignored_layers")
        elif method == "compressed-tensors":
            groups = q.get("config_groups") or {}
            w = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
            if isinstance(w, dict):
                bits, kind, gsize = w.get("num_bits"), str(w.get("type", "")), w.get("group_size")
                if bits == 8 and kind == "float":
                    fmt = "fp8"
                elif bits == 4 and kind == "int":
                    fmt = "int4"
                    g = int(gsize) if gsize else 32
                    extra["int4"] = 0.5 + 2.0 / g + (0.0 if w.get("symmetric", True) else 0.5 / g)
                elif bits == 4 and kind == "float":
                    fmt = "nvfp4" if (gsize or 16) == 16 else "mxfp4"
            ignore = q.get("ignore")
        elif method == "quark":
            w = (q.get("global_quant_config") or {}).get("weight") or {}
            dtype = str(w.get("dtype", "")).lower()
            fmt = {"fp8_e4m3": "fp8", "fp4": "mxfp4", "mxfp4": "mxfp4", "int4": "int4", "uint4": "int4"}.get(dtype)
            ignore = q.get("exclude")
        elif method == "modelopt":
            algo = str(q.get("quant_algo", "")).upper()
            fmt = {"FP8": "fp8", "NVFP4": "nvfp4", "MXFP8": "mxfp8"}.get(algo)
            ignore = q.get("exclude_modules")
        elif method in ("awq", "gptq", "auto-round") and q.get("bits") == 4:
            fmt = "int4"
            g = int(q.get("group_size") or 128)
            extra["int4"] = 0.5 + 2.0 / g + (0.5 / g if not q.get("sym", False) else 0.0)
            ignore = q.get("modules_to_not_convert")
        if fmt is None:
            raise CapacityError(
                f"model config {cfg.label} has a quantization_config (quant_method '{method}') capacity cannot "
                f"read; pass weight_precision= one of {', '.join(_OVERRIDE_FORMATS)}")
        experts_only = is_moe and (fmt in _FOUR_BIT or _mentions_attention(ignore))
        return ("bf16" if experts_only else fmt), fmt, extra, None
    # No quantization_config: a format named in the checkpoint id (e.g. MiniMax-M3-MXFP8).
    tokens = re.split(r"[-_./]", name.lower().split("/")[-1])
    for token, fmt in _NAME_FORMATS.items():
        if token in tokens:
            dense = "bf16" if (is_moe and fmt in _FOUR_BIT) else fmt
            return dense, fmt, {}, (f"weight format {fmt} taken from the checkpoint name '{name}' "
                                    f"(the config has no quantization_config; assumed to cover "
                                    f"{'the routed experts' if dense == 'bf16' else 'all linear layers except embedding and LM head'})")
    return "bf16", "bf16", {}, None


def _override_format(precision: str, is_moe: bool) -> tuple[str, str]:
    p = precision.lower()
    if p in ("fp16", "bfloat16", "float16"):
        p = "bf16"
    if p not in _OVERRIDE_FORMATS:
        raise CapacityError(f"unknown weight precision '{precision}'; use one of: {', '.join(_OVERRIDE_FORMATS)}")
    if p in _FOUR_BIT and is_moe:
        return "bf16", p
    return p, p


# --------------------------------------------------------------------------------------------------
# Building a ModelArch
# --------------------------------------------------------------------------------------------------

def _draft_method(cfg: _Config, wrapper_method: str | None) -> str | None:
    arch = " ".join(str(a) for a in (cfg.top.get("architectures") or [])).lower()
    if "gemma4_assistant" in cfg.model_types() or "assistant" in arch:
        return "gemma4_mtp"
    if cfg.top.get("speculators_model_type") == "eagle3" or "eagle3" in arch:
        return "eagle3"
    if "dspark" in arch or cfg.raw("markov_rank") is not None:
        return "dspark"
    if isinstance(cfg.raw("dflash_config"), dict) or "dflash" in arch:
        return "dflash"
    if wrapper_method:
        m = wrapper_method.lower()
        for key, method in (("eagle", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"), ("mtp", "gemma4_mtp")):
            if key in m:
                return method
        return "draft_model"
    return None


# ---- the config, as read -------------------------------------------------------------------------

def _prepared_config(raw_cfg: dict[str, Any], name: str, label: str,
                     wrapper: dict[str, Any] | None) -> tuple[_Config, list[str]]:
    """The flattened config, with the fields `_ASSUMED_DRAFT_FIELDS` fills in for a reconstructed
    draft config, and the assumptions so far (the research notes' inferences, then the filled fields)."""
    assumptions: list[str] = []
    if wrapper is not None:
        assumptions += [f"research note: {s}" for s in (wrapper.get("inferred") or [])]
    overlay = _ASSUMED_DRAFT_FIELDS.get(name)
    cfg = _Config(dict(raw_cfg), label)
    if overlay is not None:
        fields, why = overlay
        if isinstance(fields, str):
            fields = _Config(_read_shipped(fields)[1]["config"], fields).c
        filled = {k: v for k, v in fields.items()
                  if k not in ("hf_id", "architectures", "dflash_config", "auto_map")
                  and _number(cfg.c.get(k)) is None and not isinstance(cfg.c.get(k), (list, dict))}
        cfg.c.update(filled)
        if filled:
            assumptions.append(f"{why}: {', '.join(sorted(filled))}")
    return cfg, assumptions


def _kv_value_bytes(kv_dtype: str) -> float:
    if kv_dtype.lower() not in KV_DTYPE_BYTES:
        raise CapacityError(f"unknown kv_dtype '{kv_dtype}'; use one of: {', '.join(KV_DTYPE_BYTES)}")
    return KV_DTYPE_BYTES[kv_dtype.lower()]


def _role_and_method(cfg: _Config, role: str | None, wrapper: dict[str, Any] | None,
                     tr: dict[str, Any]) -> tuple[str, str | None, dict[str, Any]]:
    """(role, draft method, traits): a target has no method; a draft without a recognised one is a
    plain draft_model. DFlash/DSpark backbones without traits of their own take Qwen3's."""
    method = _draft_method(cfg, wrapper.get("method") if wrapper else None)
    if method in ("dflash", "dspark") and not tr:
        tr = dict(_TRAITS["qwen3"])          # DFlash/DSpark backbones are Qwen3-style decoders (README)
    if role is None:
        role = "draft" if method else "target"
    if role == "target":
        method = None
    elif method is None:
        method = "draft_model"
    return role, method, tr


@dataclass(frozen=True)
class _Shape:
    """The sizes and layer layout every costing step reads from the config."""

    cfg: _Config
    tr: dict[str, Any]                  # _TRAITS of the model type
    kv_b: float                         # bytes per cached KV value
    n_layers: int
    h: int
    vocab: int
    nq: int
    nkv: int
    hd: int
    full_nkv: int                       # full-attention layers' KV heads and head dim (Gemma 4: global_*)
    full_hd: int
    k_eq_v: bool                        # Gemma 4 full layers: no v_proj (V = K)
    uses_mla: bool
    norms: int                          # RMSNorm vectors of width H per decoder layer
    n_experts: int
    top_k: int
    dense_inter: int | None
    expert_inter: int | None
    kinds: list[str]                    # per layer: full | sliding | linear
    moe: list[bool]                     # per layer: an MoE block
    parallel_dense_mlp: bool            # Gemma 4: a dense MLP AND an MoE block in each MoE layer
    window: int | None
    kv_shared_from: int                 # layers from this index reuse an earlier layer's KV


def _shape(cfg: _Config, tr: dict[str, Any], kv_b: float) -> _Shape:
    n_layers = cfg.int("num_hidden_layers", "n_layer", "num_layers", required=True)
    h = cfg.int("hidden_size", "d_model", "n_embd", required=True)
    vocab = cfg.int("vocab_size", required=True)
    nq = cfg.int("num_attention_heads", "n_head", required=True)
    nkv = cfg.int("num_key_value_heads", default=nq)
    hd = cfg.int("head_dim", default=h // nq)
    n_experts = cfg.int("n_routed_experts", "num_experts", "num_local_experts", default=0) or 0
    top_k = cfg.int("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_topk", default=0) or 0
    if n_experts and not top_k:
        raise CapacityError(f"model config {cfg.label} is missing 'num_experts_per_tok' for its {n_experts} "
                            f"experts; add it")
    dense_inter = cfg.int("dense_intermediate_size", "intermediate_size")
    expert_inter = cfg.int("moe_intermediate_size", "expert_intermediate_size", "intermediate_size")
    if dense_inter is None and expert_inter is None:
        raise CapacityError(f"model config {cfg.label} is missing 'intermediate_size'; add it (as in the model's "
                            f"Hugging Face config.json) or pass a complete config.json")
    kinds = _layer_kinds(cfg, n_layers)
    return _Shape(
        cfg=cfg, tr=tr, kv_b=kv_b, n_layers=n_layers, h=h, vocab=vocab, nq=nq, nkv=nkv, hd=hd,
        full_nkv=cfg.int("num_global_key_value_heads", default=nkv), full_hd=cfg.int("global_head_dim", default=hd),
        k_eq_v=cfg.flag("attention_k_eq_v"), uses_mla=cfg.int("kv_lora_rank") is not None,
        norms=tr.get("norms_per_layer", 2),                   # input + post-attention RMSNorm by default
        n_experts=n_experts, top_k=top_k, dense_inter=dense_inter, expert_inter=expert_inter,
        kinds=kinds, moe=_moe_layers(cfg, n_layers, n_experts), parallel_dense_mlp=cfg.flag("enable_moe_block"),
        window=cfg.int("sliding_window") if "sliding" in kinds else None,
        kv_shared_from=n_layers - (cfg.int("num_kv_shared_layers", default=0) or 0))


def _reported_heads(s: _Shape) -> tuple[int, int, int, int]:
    """(num_kv_heads, head_dim, full_num_kv_heads, full_head_dim) as ModelArch reports them: an MLA
    model caches one latent per token (one KV head, replicated over TP ranks) of qk_nope + qk_rope."""
    if s.uses_mla:
        mla_hd = s.cfg.int("qk_nope_head_dim") + s.cfg.int("qk_rope_head_dim")
        return 1, mla_hd, 1, mla_hd
    return s.nkv, s.hd, s.full_nkv, s.full_hd


# ---- attention -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Sparse:
    """Sparse attention (DSA `index_topk` / MiniMax MSA `sparse_attention_config`); none: all False / 0."""

    flags: list[bool]                   # per layer: a full layer that attends to at most `tokens` tokens
    tokens: int | None
    heads: int                          # indexer heads and dim
    dim: int
    style: str                          # "dsa" | "msa" | ""
    key_bytes: float                    # indexer key cache per context token per sparse layer


def _sparse_attention(s: _Shape, assumptions: list[str]) -> _Sparse:
    cfg = s.cfg
    flags = [False] * s.n_layers
    tokens = None
    heads = dim = 0
    style = ""
    sac = cfg.raw("sparse_attention_config")
    if isinstance(sac, dict) and sac.get("use_sparse_attention"):
        freq = sac.get("sparse_attention_freq") or [1] * s.n_layers
        flags = [bool(f) and s.kinds[i] == "full" for i, f in enumerate(freq)]
        blocks = int(sac.get("sparse_topk_blocks", 0)) + int(sac.get("sparse_local_block", 0)) \
            + int(sac.get("sparse_init_block", 0))
        tokens = blocks * int(sac.get("sparse_block_size", 0))
        heads, dim = int(sac.get("sparse_num_index_heads", 0)), int(sac.get("sparse_index_dim", 0))
        style = "msa"
    elif cfg.int("index_topk") and cfg.int("index_n_heads"):
        flags = [k == "full" for k in s.kinds]
        tokens = cfg.int("index_topk")
        heads, dim = cfg.int("index_n_heads"), cfg.int("index_head_dim", required=True)
        style = "dsa"
    key_bytes = (dim * _INDEX_KEY_BYTES_PER_VALUE
                 + math.ceil(dim / _INDEX_QUANT_BLOCK) * _INDEX_SCALE_BYTES_PER_BLOCK) if dim else 0.0
    if dim:
        assumptions.append("indexer key cache fp8 + fp32 scale per 128 values (vLLM/LightLLM DeepSeek-V3.2 layout)")
    return _Sparse(flags, tokens, heads, dim, style, key_bytes)


def _indexer(s: _Shape, sp: _Sparse) -> _Parts:
    """One sparse layer's indexer. DSA: wq_b (from the q LoRA), wk, k_norm (LayerNorm weight + bias),
    weights_proj; MSA: index q heads + one shared index key."""
    if sp.style == "dsa":
        return _Parts(dense_linear=s.cfg.int("q_lora_rank") * sp.heads * sp.dim + s.h * sp.dim,
                      small_linear=s.h * sp.heads, other=2 * sp.dim)
    return _Parts(dense_linear=s.h * sp.heads * sp.dim + s.h * sp.dim)


def _attention_layer(s: _Shape, kind: str, h_in: int, kv_shared: bool) -> _Attn:
    """One full or sliding layer's attention: MLA, or GQA with that kind's heads. A KV-shared layer
    (``num_kv_shared_layers``) reads an earlier layer's cache and holds none of its own."""
    if s.uses_mla:
        a = _mla(s.cfg, h_in, s.h, s.nq, s.kv_b)
    elif kind == "full":
        a = _gqa(s.cfg, s.tr, h_in, s.h, s.nq, s.full_nkv, s.full_hd, has_v=not s.k_eq_v,
                 kv_shared=kv_shared, kv_b=s.kv_b)
    else:
        a = _gqa(s.cfg, s.tr, h_in, s.h, s.nq, s.nkv, s.hd, has_v=True, kv_shared=kv_shared, kv_b=s.kv_b)
    if kv_shared:
        a.kv_bytes = 0.0
    return a


@dataclass
class _AttnSums:
    """Attention over all decoder layers: params, KV bytes per context token and FLOPs per query
    token per context token by layer kind, linear-attention state per sequence and FLOPs per token."""

    params: _Parts = field(default_factory=_Parts)
    full_kv: float = 0.0
    sparse_kv: float = 0.0
    swa_kv: float = 0.0
    index_kv: float = 0.0
    state: float = 0.0
    full_flops: float = 0.0
    sparse_flops: float = 0.0
    swa_flops: float = 0.0
    index_flops: float = 0.0
    lin_flops: float = 0.0
    mla_decode_flops: float = 0.0     # the dense MLA layers' share of full_flops (absorbed form)
    mla_prefill_flops: float = 0.0    # the same layers in the prompt-chunk (MHA) form
    mla_context_flops: float = 0.0    # their kv_b_proj FLOPs per cached context token of a prompt chunk


def _attention(s: _Shape, sp: _Sparse, h_in: int) -> _AttnSums:
    out = _AttnSums()
    for i, kind in enumerate(s.kinds):
        if kind == "linear":
            p, state, flops = _gated_deltanet(s.cfg, s.h)
            out.params.add(p)
            out.state += state
            out.lin_flops += flops
            continue
        a = _attention_layer(s, kind, h_in, kv_shared=i >= s.kv_shared_from)
        out.params.add(a.params)
        if kind == "sliding":
            out.swa_kv += a.kv_bytes
            out.swa_flops += a.flops_per_ctx
        elif sp.flags[i]:
            out.sparse_kv += a.kv_bytes
            out.sparse_flops += a.flops_per_ctx
        else:
            out.full_kv += a.kv_bytes
            out.full_flops += a.flops_per_ctx
            if a.prefill_flops_per_ctx is not None:
                out.mla_decode_flops += a.flops_per_ctx
                out.mla_prefill_flops += a.prefill_flops_per_ctx
                out.mla_context_flops += a.context_flops
        if sp.flags[i]:                                  # the indexer reads its keys for every context token
            out.params.add(_indexer(s, sp))
            out.index_kv += sp.key_bytes
            out.index_flops += 2.0 * sp.heads * sp.dim
    return out


# ---- MLP / MoE -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Experts:
    """The MoE blocks' sizes (0 for a dense model)."""

    n_moe: int                          # MoE layers
    n_shared: int                       # shared experts per MoE layer, each `shared_width` wide
    shared_width: int
    shared_gate: bool                   # Qwen: a sigmoid gate Linear(H, 1) on the shared expert
    linear: int                         # ONE routed expert in ONE layer: gated MLP
    other: int                          # its biases (gpt-oss)


def _experts(s: _Shape) -> _Experts:
    cfg = s.cfg
    n_moe = sum(s.moe)
    shared_width = 0
    n_shared = 0
    shared_gate = False
    if n_moe:
        if cfg.int("shared_expert_intermediate_size"):
            shared_width, n_shared, shared_gate = cfg.int("shared_expert_intermediate_size"), 1, True
        elif cfg.int("n_shared_experts"):
            n_shared = cfg.int("n_shared_experts")
            shared_width = cfg.int("shared_intermediate_size") or s.expert_inter
        elif cfg.int("shared_intermediate_size"):
            shared_width, n_shared = cfg.int("shared_intermediate_size"), 1
    return _Experts(n_moe, n_shared, shared_width, shared_gate,
                    linear=3 * s.h * s.expert_inter if n_moe else 0,
                    other=(2 * s.expert_inter + s.h) if (n_moe and s.tr.get("expert_bias")) else 0)


def _score_bias(cfg: _Config) -> bool:
    """The router has an E-wide score-correction bias (DeepSeek noaux_tc, use_routing_bias)."""
    return cfg.raw("topk_method") == "noaux_tc" or cfg.flag("use_routing_bias")


def _mlps(s: _Shape, ex: _Experts) -> _Parts:
    """Every decoder layer's MLP side except the routed experts (counted per expert): a dense MLP, or
    the MoE block's router with its biases, scale and norms, shared experts and (Gemma 4) dense MLP."""
    p = _Parts()
    for is_moe in s.moe:
        if not is_moe:
            p.add(_mlp(s.h, s.dense_inter if s.dense_inter else s.expert_inter))
            continue
        if s.parallel_dense_mlp and s.dense_inter:
            p.add(_mlp(s.h, s.dense_inter))
        p.small_linear += s.h * s.n_experts                  # router
        if s.tr.get("router_bias"):
            p.other += s.n_experts
        if _score_bias(s.cfg):
            p.other += s.n_experts                           # e_score_correction_bias
        if s.tr.get("router_scale"):
            p.other += s.h
        p.other += s.tr.get("moe_extra_norms", 0) * s.h
    p.dense_linear += ex.n_moe * ex.n_shared * 3 * s.h * ex.shared_width
    if ex.shared_gate:
        p.small_linear += ex.n_moe * s.h
    return p


# ---- outside the decoder layers ------------------------------------------------------------------

@dataclass
class _Outer:
    """The embedding, LM head and the params outside the decoder layers (final norm; a drafter's fc
    over the target taps and projections), with the draft fields DraftInfo reports."""

    h_in_attn: int                      # attention input width (EAGLE-3: concat(embed, hidden) = 2H)
    extra: _Parts
    embed: int
    lm_head: int
    lm_head_owned: bool                 # False: borrowed from the target (DFlash)
    tied: bool
    layer_ids: Any
    block: Any
    draft_vocab: int | None
    markov_rank: int | None


def _outer(s: _Shape, method: str | None, assumptions: list[str]) -> _Outer:
    cfg, h = s.cfg, s.h
    o = _Outer(h_in_attn=h, extra=_Parts(), embed=s.vocab * h, lm_head=s.vocab * h, lm_head_owned=True,
               tied=cfg.flag("tie_word_embeddings", default=any(t.startswith("gemma") for t in cfg.model_types())),
               layer_ids=cfg.raw("target_layer_ids"), block=cfg.int("block_size"),
               draft_vocab=cfg.int("draft_vocab_size"), markov_rank=cfg.int("markov_rank"))
    dcfg = cfg.raw("dflash_config")
    if isinstance(dcfg, dict):
        o.layer_ids = dcfg.get("target_layer_ids", o.layer_ids)
    if o.layer_ids is None:
        o.layer_ids = cfg.raw("eagle_aux_hidden_state_layer_ids")
    if o.block is None and isinstance(dcfg, dict):
        o.block = _number(dcfg.get("block_size"))
    o.extra.other += h                                       # final norm
    if method == "eagle3":
        taps = len(o.layer_ids) if isinstance(o.layer_ids, list) else 3
        o.h_in_attn = 2 * h                                  # attention input concat(embed, hidden)
        o.extra.dense_linear += taps * h * h                 # fc over the target taps
        o.extra.other += h                                   # hidden_norm
        o.lm_head = (o.draft_vocab or s.vocab) * h
        o.tied = False
    elif method in ("dflash", "dspark"):
        if isinstance(o.layer_ids, list):
            taps = len(o.layer_ids)
        else:
            taps = s.n_layers
            assumptions.append(f"number of target taps unknown: assumed = draft layers ({s.n_layers})")
        o.extra.dense_linear += taps * h * h                 # fc over the target taps
        o.extra.other += h                                   # hidden_norm
        if method == "dflash":                               # no embedding / LM head of its own
            o.embed, o.lm_head_owned, o.tied = 0, False, False
        else:
            mv = o.draft_vocab or s.vocab
            o.lm_head = mv * h
            if o.markov_rank:
                o.extra.lookup += mv * o.markov_rank         # markov_w1 [V, r] gathered
                o.extra.dense_linear += mv * o.markov_rank   # markov_w2 [V, r] matmul per step
    elif method == "gemma4_mtp":
        backbone = cfg.int("backbone_hidden_size", required=True)
        o.extra.dense_linear += 2 * backbone * h + h * backbone    # pre_projection 2·Hb→H, post_projection H→Hb
    return o


# ---- native MTP ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Mtp:
    layers: int = 0
    params: int = 0
    kv: float = 0.0                     # per context token, when the MTP layers are used


def _native_mtp(s: _Shape, role: str, sp: _Sparse, ex: _Experts, assumptions: list[str]) -> _Mtp:
    """A target's native MTP modules, kept out of params_total: per layer fc 2H->H + 3 norms + one
    full-attention decoder layer (with the indexer under DSA; an MoE block, all experts, if MoE)."""
    cfg, h = s.cfg, s.h
    n_mtp = 0
    if role == "target":
        if cfg.int("num_mtp_modules"):
            n_mtp = cfg.int("num_mtp_modules") * (cfg.int("mtp_transformer_layers", default=1) or 1)
        else:
            n_mtp = cfg.int("num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0
    if not n_mtp:
        return _Mtp()
    a = _attention_layer(s, "full", h, kv_shared=False)
    one = a.params.total + 2 * h * h + 3 * h + s.norms * h
    index_kv = 0.0
    if sp.style == "dsa":                                    # the MTP layer is a full decoder layer: indexer too
        one += _indexer(s, sp).total
        index_kv = sp.key_bytes
    if ex.n_moe:
        one += s.h * s.n_experts + (s.n_experts if _score_bias(cfg) else 0)
        one += s.n_experts * (ex.linear + ex.other) + ex.n_shared * 3 * h * ex.shared_width \
            + (h if ex.shared_gate else 0)
    else:
        one += _mlp(h, s.dense_inter or s.expert_inter).total
    if cfg.int("num_mtp_modules"):
        assumptions.append("MiniMax MTP module = one full-attention MoE decoder layer + fc 2H->H "
                           "(structure not published; README)")
    return _Mtp(layers=n_mtp, params=n_mtp * one, kv=n_mtp * (a.kv_bytes + index_kv))


# ---- precision and totals ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Precision:
    dense_fmt: str                      # the dense (non-expert) linear layers
    expert_fmt: str                     # the routed experts (= dense_fmt for a dense model)
    label: str                          # the bulk of the weights: the experts' format if MoE
    b_dense: float                      # bytes per parameter incl. block scales
    b_expert: float
    b_emb: float
    b_other: float


def _precision(s: _Shape, name: str, weight_precision: str | None, is_moe: bool,
               assumptions: list[str]) -> _Precision:
    """The checkpoint's own formats (weight_precision None) or the override's; embeddings, LM head and
    the small tensors stay 2 bytes."""
    if weight_precision is None:
        dense_fmt, expert_fmt, fmt_bytes, note = _native_format(s.cfg, name, is_moe)
        if note:
            assumptions.append(note)
    else:
        dense_fmt, expert_fmt = _override_format(weight_precision, is_moe)
        fmt_bytes = {}
    fmt_table = {k: v[0] for k, v in WEIGHT_FORMATS.items()}
    fmt_table.update(fmt_bytes)
    return _Precision(dense_fmt, expert_fmt, expert_fmt if is_moe else dense_fmt,
                      fmt_table[dense_fmt], fmt_table[expert_fmt], 2.0, _UNQUANTIZED_BYTES)


@dataclass(frozen=True)
class _Totals:
    lm_params: int
    params_total: int
    params_active: int
    weight_bytes_total: float
    dense_weight_bytes: float
    expert_weight_bytes: float
    dense_flops: float
    expert_flops: float


def _totals(s: _Shape, layers: _Parts, o: _Outer, ex: _Experts, pr: _Precision, method: str | None) -> _Totals:
    """Params, weight bytes and linear FLOPs per token. A tied LM head is the embedding table, stored
    once; the routed experts are stored E times per MoE layer and run top_k times per token."""
    lm_params = o.lm_head
    if o.tied and method not in ("eagle3", "dspark"):
        lm_params = o.embed if o.embed else o.lm_head
    stored_tables = o.embed + (o.lm_head if (o.lm_head_owned and not o.tied) else 0)
    extra = o.extra
    routed = ex.linear + ex.other
    body = layers.total + extra.total
    linear_every_token = layers.dense_linear + extra.dense_linear
    small_every_token = layers.small_linear + extra.small_linear + layers.other + extra.other
    expert_weight_bytes = ex.linear * pr.b_expert + ex.other * pr.b_other
    return _Totals(
        lm_params=lm_params,
        params_total=stored_tables + body + ex.n_moe * s.n_experts * routed,
        params_active=lm_params + body - extra.lookup - layers.lookup + ex.n_moe * s.top_k * routed,
        weight_bytes_total=(stored_tables * pr.b_emb + linear_every_token * pr.b_dense
                            + (small_every_token + layers.lookup + extra.lookup) * pr.b_other
                            + ex.n_moe * s.n_experts * expert_weight_bytes),
        dense_weight_bytes=lm_params * pr.b_emb + linear_every_token * pr.b_dense + small_every_token * pr.b_other,
        expert_weight_bytes=expert_weight_bytes,
        dense_flops=2.0 * (lm_params + linear_every_token + layers.small_linear + extra.small_linear),
        expert_flops=2.0 * ex.n_moe * s.top_k * ex.linear)


# ---- the result ----------------------------------------------------------------------------------

def _draft_info(s: _Shape, wrapper: dict[str, Any] | None, method: str | None, o: _Outer) -> DraftInfo:
    target = (wrapper or {}).get("target")
    if target is None:
        verifier = (s.cfg.top.get("speculators_config") or {}).get("verifier") or {}
        target = verifier.get("name_or_path")
    return DraftInfo(
        method=method or "draft_model",
        target=target,
        block_size=int(o.block) if o.block else None,
        target_layer_ids=tuple(int(x) for x in o.layer_ids) if isinstance(o.layer_ids, list) else None,
        shares_target_kv=method == "gemma4_mtp" or s.kv_shared_from <= 0,
        markov_rank=o.markov_rank,
        draft_vocab_size=o.draft_vocab,
        parallel_drafting=method in ("dflash", "dspark"),
        uses_target_lm_head=method == "dflash",
    )


def _build(raw_cfg: dict[str, Any], *, name: str, role: str | None, label: str, source: str,
           wrapper: dict[str, Any] | None, weight_precision: str | None, kv_dtype: str) -> ModelArch:
    """One model's ModelArch from its config. The steps keep this order: each appends its
    assumptions (ModelArch.assumptions lists them in this order), and a config missing several
    fields reports the first one read."""
    cfg, assumptions = _prepared_config(raw_cfg, name, label, wrapper)
    kv_b = _kv_value_bytes(kv_dtype)
    role, method, tr = _role_and_method(cfg, role, wrapper, _traits(cfg))
    s = _shape(cfg, tr, kv_b)
    sp = _sparse_attention(s, assumptions)
    o = _outer(s, method, assumptions)
    attn = _attention(s, sp, o.h_in_attn)
    ex = _experts(s)
    layers = _Parts(other=s.n_layers * s.norms * s.h)         # the per-layer norms
    layers.add(attn.params)
    layers.add(_mlps(s, ex))
    mtp = _native_mtp(s, role, sp, ex, assumptions)
    pr = _precision(s, name, weight_precision, ex.n_moe > 0, assumptions)
    tot = _totals(s, layers, o, ex, pr, method)
    draft = _draft_info(s, wrapper, method, o) if role == "draft" else None
    return _model_arch(name, role, source, kv_dtype, assumptions, s, sp, o, attn, ex, mtp, pr, tot, draft)


def _model_arch(name: str, role: str, source: str, kv_dtype: str, assumptions: list[str], s: _Shape, sp: _Sparse,
                o: _Outer, attn: _AttnSums, ex: _Experts, mtp: _Mtp, pr: _Precision, tot: _Totals,
                draft: DraftInfo | None) -> ModelArch:
    """The ModelArch the steps of `_build` add up to."""
    kv_heads, head_dim, full_kv_heads, full_head_dim = _reported_heads(s)
    n_moe = ex.n_moe
    return ModelArch(
        name=name,
        model_type=str(s.cfg.top.get("model_type") or s.cfg.c.get("model_type") or "unknown"),
        role=role,
        num_layers=s.n_layers,
        hidden_size=s.h,
        vocab_size=s.vocab,
        num_attention_heads=s.nq,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        num_full_attention_layers=s.kinds.count("full"),
        num_sliding_attention_layers=s.kinds.count("sliding"),
        sliding_window=s.window,
        max_position_embeddings=s.cfg.int("max_position_embeddings"),
        num_linear_attention_layers=s.kinds.count("linear"),
        uses_mla=s.uses_mla,
        params_total=int(tot.params_total),
        params_active=int(tot.params_active),
        params_embedding=int(o.embed),
        params_lm_head=int(tot.lm_params),
        num_moe_layers=n_moe,
        num_experts=s.n_experts if n_moe else 0,
        experts_per_token=s.top_k if n_moe else 0,
        num_shared_experts=ex.n_shared,
        params_per_expert=int(ex.linear + ex.other),
        weight_precision=pr.label,
        compute_weight_dtype=pr.label,
        bytes_per_param={"dense": pr.b_dense, "expert": pr.b_expert, "embedding": pr.b_emb, "other": pr.b_other},
        weight_bytes_total=float(tot.weight_bytes_total),
        dense_weight_bytes=float(tot.dense_weight_bytes),
        expert_weight_bytes=float(tot.expert_weight_bytes),
        dense_flops_per_token=tot.dense_flops,
        expert_flops_per_token=tot.expert_flops,
        kv_dtype=kv_dtype.lower(),
        kv_bytes_per_token=attn.full_kv + attn.sparse_kv + attn.index_kv,
        swa_kv_bytes_per_token=attn.swa_kv,
        state_bytes_per_seq=attn.state,
        attn_flops_per_token_per_ctx=attn.full_flops + attn.index_flops,
        swa_attn_flops_per_token_per_ctx=attn.swa_flops,
        linear_attn_flops_per_token=attn.lin_flops,
        native_mtp_layers=mtp.layers,
        draft=draft,
        source=source,
        dense_weight_dtype=pr.dense_fmt,
        full_num_kv_heads=full_kv_heads,
        full_head_dim=full_head_dim,
        num_sparse_attention_layers=sum(sp.flags),
        sparse_attention_tokens=sp.tokens,
        sparse_kv_bytes_per_token=attn.sparse_kv,
        index_kv_bytes_per_token=attn.index_kv,
        sparse_attn_flops_per_token_per_ctx=attn.sparse_flops,
        mla_decode_flops_per_token_per_ctx=attn.mla_decode_flops,
        mla_prefill_flops_per_token_per_ctx=attn.mla_prefill_flops,
        mla_context_flops_per_token=attn.mla_context_flops,
        params_native_mtp=int(mtp.params),
        mtp_kv_bytes_per_token=mtp.kv,
        tied_embeddings=bool(o.tied and o.embed and o.lm_head_owned),
        mlp_intermediate_size=int((s.dense_inter or s.expert_inter or 0) if n_moe < s.n_layers or s.parallel_dense_mlp
                                  else 0),
        expert_intermediate_size=int(s.expert_inter or 0) if n_moe else 0,
        shared_expert_intermediate_size=int(ex.shared_width * ex.n_shared),
        qk_norm=None if s.uses_mla else _qk_norm(s.cfg, s.tr),
        attention_sinks=bool(s.tr.get("sinks")),
        assumptions=tuple(assumptions),
    )


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------

def _configs_dir() -> Path:
    return data_dir() / "model_configs"


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CapacityError(f"cannot read model config {path}: {exc.strerror}; check the path") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CapacityError(f"model config {path} is not valid JSON (line {exc.lineno}: {exc.msg}); "
                            f"fix the file") from None
    if not isinstance(data, dict):
        raise CapacityError(f"model config {path} must hold a JSON object; pass a Hugging Face config.json")
    return data


@lru_cache(maxsize=None)
def _shipped_index() -> tuple[dict[str, str], dict[str, str]]:
    """(lower-cased hf_id / file stem / part after '/' -> file path, hf_id -> file path)."""
    index: dict[str, str] = {}
    by_id: dict[str, str] = {}
    for path in sorted(_configs_dir().glob("*.json")):
        hf_id = str(_read_json(path).get("hf_id") or path.stem.replace("__", "/", 1))
        by_id[hf_id] = str(path)
        for key in (hf_id, path.stem, hf_id.split("/")[-1]):
            index.setdefault(key.lower(), str(path))
    return index, by_id


def _read_shipped(hf_id: str) -> tuple[Path, dict[str, Any]]:
    path = Path(_shipped_index()[1][hf_id])
    return path, _read_json(path)


def _source_text(src: Any, file_name: str) -> str:
    shipped = f"capacity/data/model_configs/{file_name}"
    primary = src.get("primary") if isinstance(src, dict) else None
    if isinstance(primary, dict):
        if primary.get("repo"):
            where = f"{primary['repo']}@{str(primary.get('commit', ''))[:12]}:{primary.get('path', '')}"
        elif primary.get("url"):
            where = primary["url"]
        elif primary.get("index_file_id"):
            where = f"search-index file id {primary['index_file_id']}"
        else:
            where = "see file"
        return f"{where} (via {shipped})"
    return shipped


def _load_file(path: Path, weight_precision: str | None, kv_dtype: str) -> ModelArch:
    data = _read_json(path)
    if isinstance(data.get("config"), dict) and "hf_id" in data:      # shipped wrapper
        return _build(data["config"], name=data["hf_id"], role=data.get("role"), label=str(path),
                      source=_source_text(data.get("source"), path.name), wrapper=data,
                      weight_precision=weight_precision, kv_dtype=kv_dtype)
    name = data.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem)
    return _build(data, name=str(name), role=None, label=str(path), source=str(path), wrapper=None,
                  weight_precision=weight_precision, kv_dtype=kv_dtype)


def load_model(name_or_path: str, weight_precision: str | None = None, kv_dtype: str = "bf16") -> ModelArch:
    """A model by HF id ("Qwen/Qwen3-8B"), file stem ("Qwen__Qwen3-8B") or the part after "/"
    ("Qwen3-8B"), case-insensitive; or the path of a Hugging Face config.json (or of its folder).

    weight_precision None keeps the checkpoint's own format; otherwise see the module docstring for
    which layers the override applies to. kv_dtype: "bf16" (2 B) or "fp8" (1 B) per cached value.
    """
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        return _load_file(path, weight_precision, kv_dtype)
    shipped = _shipped_index()[0].get(str(name_or_path).strip().lower())
    if shipped is not None:
        return _load_file(Path(shipped), weight_precision, kv_dtype)
    if str(name_or_path).endswith(".json"):
        raise CapacityError(f"model config file '{name_or_path}' does not exist; check the path")
    names = sorted(_shipped_index()[1], key=str.lower)
    forms = {**{n.lower(): n for n in names}, **{n.split("/")[-1].lower(): n for n in names}}   # id, or name after "/"
    asked = str(name_or_path).strip().lower()
    close = list(dict.fromkeys(forms[f] for f in difflib.get_close_matches(asked, list(forms), n=6, cutoff=0.5)))[:3]
    hint = f"closest known: {', '.join(close)}; " if close else ""
    raise CapacityError(f"unknown model '{name_or_path}'; {hint}`capacity models` lists all {len(names)} known ones; "
                        f"or pass the path of a Hugging Face config.json")


def list_models() -> list[ModelArch]:
    """Every shipped model (targets and drafts) at its native precision and a bf16 KV cache."""
    return [_load_file(p, None, "bf16") for p in sorted(_configs_dir().glob("*.json"))]
