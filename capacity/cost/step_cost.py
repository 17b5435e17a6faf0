"""Time of one engine step: a roofline of one forward pass over a batch of scheduled tokens.

A step is one vLLM engine iteration: every scheduled sequence contributes `new_tokens` (a prefill
chunk, one decode token, or 1 + N verification tokens with speculative decoding) at a context
that ends at `context_tokens`. The step time is the sum of per-component rooflines, each
`max(FLOPs / (peak · gemm-efficiency), bytes / (HBM bandwidth · hbm-efficiency))`, plus the
tensor-parallel all-reduces and a fixed CPU/launch overhead (modelling_notes §3.2, GenZ-style
per-operator max). Draft work of speculative decoding is added by the caller as its own
component, priced by the same `forward()` on the drafter's architecture.

Work per GPU under tensor parallelism: weights, FLOPs and (GQA) KV heads are split over the TP
ranks; an MLA latent cache has no heads to split, so every rank reads all of it.

Two terms apply to speculative verification only (sequences that verify N > 0 drafts; a plain
decode or prefill step is priced as before):

* Correlated expert routing. The 1 + N tokens one sequence verifies are consecutive tokens of one
  text, which largely reuse the same experts, so for the distinct-expert (weight-bytes) term they
  count as (1 + N)^rho routed tokens instead of 1 + N (rho = 1: independent routing, the uniform
  formula of `expected_distinct_experts`; rho = 0: every draft routes like its sequence's first
  token). `VERIFY_ROUTING_EXPONENT`, fitted on the seed article's rows (docs/seed_validation.md).
* Recurrent-state snapshots of linear-attention (Gated DeltaNet) layers. vLLM's recurrent kernel
  stores the full state after every token of a multi-token (verification) query, one slot per
  token, so that the state after the last accepted token can be resumed
  (vllm/model_executor/layers/fla/ops/fused_recurrent.py: "keep the states for multi-query tokens",
  one `tl.store` of the [K, V] state per token). A decode step stores one state per sequence, which
  the fitted HBM efficiency of the baseline already carries; verification stores N more per
  sequence, written in [128 x 8] fp32 tiles, i.e. 32-byte row segments
  (`STATE_SNAPSHOT_WRITE_EFFICIENCY`).
* Host time per step (`step_overhead_ms`: scheduler, input preparation, output processing) and per
  running sequence (`per_seq_overhead_us`) of the hardware profile, against GPU time. With vLLM's
  async scheduling (`async_scheduling`; on by default since vLLM 0.14, vllm/config/vllm.py: None
  becomes True unless incompatible, `max_concurrent_batches` 2) the scheduler works one step ahead
  while the GPU runs, so a step lasts max(GPU time, host time) and only host time the GPU does not
  cover shows (docs/seed_validation.md section 19); without it (older vLLM, CPU n-gram drafting)
  the two add. The fixed GPU cost of a step's kernels (`layer_overhead_us` per layer or per dense
  layer's kernels, `layer_overhead_units`) and the speculative host terms below, which the V1
  runner does not overlap, are paid in series either way.
* Host work per verifying sequence (`spec_seq_overhead_us` of the hardware profile, part of
  "overhead"). With vLLM's V1 model runner a speculative step does per-request CPU work that a
  plain decode step overlaps with the forward pass (draft-token bookkeeping, rejection-sampler
  output parsing, drafter input preparation; vllm PR #23569's full CPU/GPU overlap did not cover
  speculative decoding). Fitted per GPU on the seed article's rows (docs/seed_validation.md §12):
  the intercept of a speculative step's cost is then ~0.4–0.6 ms per sequence on every V1-runner
  MI300X target whatever its size, TP or drafter. The V2 model runner (vllm PR #25266) prepares
  inputs and counts accepted drafts with GPU kernels (e.g. PR #30029), and its runs of an
  attention-only target show no such intercept (gemma-4-26B-A4B-it), so `model_runner="v2"` does
  not charge it there. A hybrid target with linear-attention (Gated DeltaNet) state still pays it
  on V2: Qwen3.6-27B on V2 shows Qwen3.5-27B's V1 intercept (docs/seed_validation.md §14). The
  mechanism is not identified; a candidate is the V2 runner's per-step recurrent-state metadata for
  speculative steps (vllm PR #47428: `MambaHybridModelState.build_metadata`, the accepted-token
  counts per request).
* Time per verified draft token (`spec_token_overhead_us` of the hardware profile, part of
  "overhead"), on either runner. The seed article's rows show a verification step growing with
  the number of draft tokens much faster than the roofline of its extra tokens says (Gemma 4
  DFlash at C = 36: +1.8 ms per extra draft position, ~50 us per draft token, on a 4B-active MoE),
  which per-pass draft overheads cannot express for one-pass drafters (DFlash). Fitted per GPU with
  the other speculative overheads (docs/seed_validation.md §13): stable at 28-37 us on MI300X in
  every leave-one-target-out fold. Its mechanism is not identified; candidates are work per
  verified position outside the roofline: attention tiles that re-read a sequence's KV once per
  BLOCK_Q query tokens (vLLM's triton unified attention), grouped-GEMM tile padding, the
  rejection sampler's passes over full-vocabulary logits.
* Query-tile padding of vLLM's ROCM_ATTN backend (`attention_backend="rocm"`; the ROCm default from
  vLLM 0.19 where no `--attention-backend` is given, docs/seed_validation.md §33). Every sequence with
  more than one query token (a prompt chunk, or a verification step's 1 + N tokens) goes through the
  Triton prefix-prefill kernel (vllm/v1/attention/ops/chunked_prefill_paged_decode.py:
  `max_query_len > 1` -> `context_attention_fwd`), whose grid is (sequences, query heads,
  cdiv(query tokens, BLOCK_M)) with BLOCK_M = 128 for power-of-two KV block sizes and 32 otherwise
  (vllm/v1/attention/ops/prefix_prefill.py `context_attention_fwd`; hybrid models' KV blocks are
  enlarged to the recurrent state's page, e.g. Qwen3.5's 784 and 1,056 tokens, so 32). Each of a
  tile's BLOCK_M rows walks the sequence's cached context, so a 1 + N-token verification costs the
  attention FLOPs of BLOCK_M query tokens over that context (`query_tile_padding_flops`), at the
  Triton kernels' efficiency `attention_triton`. One-token (decode) sequences take the paged decode
  kernel and pay nothing extra. This is the upstream path as read; a later rewrite (vLLM PR #45234,
  closed) would send batches with decode rows to the unified kernel, and which path a given release
  runs is not established (docs/seed_validation.md §33).
* Shape-dependent GEMM efficiency (opt-in per hardware profile: its `gemm_curve` section). Without
  it every GEMM runs at one fraction `gemm` of peak. With it a GEMM call of W FLOPs (per GPU) of
  compute dtype d reaches gemm x ceiling_d x W / (W + W_half_d) of peak: ceiling_d is the measured
  max-achievable rate over peak (hipBLASLt/cuBLASLt MAF, `GpuProfile.gemm_ceiling`), W_half_d the
  work at which a call reaches half of it, fitted to the GEMM size sweep (the profile says where
  from), and `gemm` becomes a multiplier on that measured curve (1 = the microbenchmark). Summed over
  the calls of a step the compute term is (FLOPs + calls x W_half) / (peak x gemm x ceiling): each
  call costs W_half / (peak x ceiling) seconds more, the fixed per-call time the sweep's small sizes
  show; large GEMMs (prefill) approach the ceiling and small-M decode GEMMs stay bound by their
  weight bytes through the roofline's max(). Calls per step: `gemm_calls` (vLLM's fused linear
  layers). Experts get the same curve at the experts' compute dtype, times `moe`.
* Fixed time per GEMM kernel (opt-in per hardware profile: its `gemm_call_us`). A GEMM call inside a
  graph-replayed step takes `gemm_call_us + max(FLOPs / rate, weight bytes / bandwidth)`: the intercept of a
  sweep of the models' own GEMM shapes (M = 1...8192 tokens, back to back in one CUDA graph, weights several
  times the L2 cache; scripts/gpu_microbench.py), which no single-GEMM benchmark shows. On an H200 the 182
  such calls fit with 5.2 us per call, weights streamed at 4.0 TB/s and 0.73 / 0.66 of the bf16 / fp8 peaks
  (median error 5.7 %); without the intercept the same fit needs 3.4 TB/s and misses by 8.3 / 21.6 % (median
  / p90, capacity/data/measurements/gpu_microbench_h200.csv). Each step pays it for every GEMM kernel it
  runs (`gemm_calls`: vLLM's fused linear layers and FusedMoE's two grouped GEMMs per MoE layer), so it is a
  fixed cost counted from the model's structure; the rest of a layer's fixed time stays in
  `layer_overhead_us`.
* Steps that run without a CUDA/HIP graph (opt-in per hardware profile: its efficiency entry `eager_kernel_us`).
  vLLM V1 captures graphs for batches of up to `cudagraph_max_tokens` scheduled tokens: min(2 x max_num_seqs x
  (1 + num_speculative_tokens), 512, max_num_batched_tokens) (vllm/config/vllm.py `_set_cudagraph_sizes`, vLLM PRs
  #20628, #26016, #30330); a larger step, e.g. any step with a 1k-token prompt chunk, runs no graph
  (vllm/v1/cudagraph_dispatcher.py: `num_tokens > self.max_capture_size` -> CUDAGraphMode.NONE) and its
  torch.compile'd pieces launch every kernel from the host. Such a step pays `eager_kernel_us` per kernel of the
  forward pass (the layer kernels `layer_overhead_units` counts, times `kernels_per_dense_layer`) in series with its
  GPU time: the host time to launch a kernel and the gap the GPU waits for it, which TP does not divide
  (docs/seed_validation.md section 37). Graph-replayed steps (decode) pay nothing extra.
* Weight-only int4 experts (W4A16: compressed-tensors / AWQ / GPTQ, e.g. Kimi-K2.5's INT4 checkpoint). vLLM
  runs them in its triton grouped GEMM for int4 weights (vllm/model_executor/layers/fused_moe/fused_moe.py
  `fused_moe_kernel_gptq_awq`, `use_int4_w4a16`): each tile of packed int4 weights is loaded, unpacked and
  scaled to bf16 in registers and multiplied with `tl.dot` on the bf16 matrix cores. The unpacking is
  paid per weight tile per block of BLOCK_SIZE_M tokens (16-64, `get_default_config`): `moe_int4` prices
  it (the rate of working through the packed weights against HBM bandwidth), once per block of each
  expert's tokens on ROCm (`expected_expert_blocks`, INT4_TRITON_BLOCK_M: one block per touched expert at
  decode, about three per expert for an 8k-token Kimi-K2.5 prompt chunk; docs/seed_validation.md section 38),
  once per touched expert on CUDA, whose Marlin MoE kernel is not modelled in blocks. The FLOPs run at the
  bf16 grouped-GEMM rate `moe` like every other format's experts; the step takes the larger of the two.
  One efficiency on both sides made an 8k-token Kimi-K2.5 INT4 prefill 2.1x slower than measured on
  MI355X (TP8) once decode had pulled `moe_int4` down. On ROCm `moe_int4` is the kernel's rate under the tiles
  vLLM ships tuned for a GPU and MoE shape; a shape without such a file runs the default tiles, which stream the
  experts 6x slower (capacity/data/vllm_int4_moe_configs.yaml, INT4_DEFAULT_TILES; docs/seed_validation.md
  section 52): Kimi-K2.5 on MI300X at any TP, or on MI355X at TP4.
* Expert parallelism (vLLM `--enable-expert-parallel` with tensor parallelism and no data
  parallelism: EP size = TP size). Each GPU holds E / EP whole experts instead of a 1/TP slice of
  every expert, so the per-GPU memory and the mean per-GPU MoE work are the same as with TP; the
  step waits for the busiest GPU. Under uniform routing the experts a GPU's tokens touch are
  Binomial(E/EP, p) (p = the chance one expert is touched, as in `expected_distinct_experts`) and
  the token-expert assignments it computes Binomial(n·k, 1/EP); the busiest of EP GPUs is priced
  at mean + z_EP·sd (normal approximation, z_EP = expected maximum of EP standard normals).
  Attention stays tensor-parallel and the MoE output is still all-reduced (naive all-to-all of
  vLLM's TP+EP without DP), so the all-reduce term is unchanged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Callable

import numpy as np

from capacity.errors import CapacityError
from capacity.inputs.hardware import (ATTENTION_BACKEND_KEYS, int4_tile_table, measured_allreduce, moe_kernel_curve,
                                      weight_format)

if TYPE_CHECKING:
    from capacity.inputs.hardware import GpuProfile, MeasuredAllreduce, MoeKernelCurve
    from capacity.inputs.models import ModelArch

# False prices host time serially even where the engine schedules asynchronously (an ablation switch
# for scripts/screen_cost_terms.py; the engine's `async_scheduling` decides otherwise)
HOST_OVERLAP = True
COMPONENTS = ("dense_gemm", "moe_gemm", "attention", "allreduce", "overhead", "draft")

ACTIVATION_BYTES = 2  # bf16 activations travel through the all-reduce

# Routed-token exponent of one sequence's 1 + N verification tokens (module docstring). basis:
# fitted on the 292 rows of the seed article (capacity/data/measurements/seed_spec_decode.csv),
# 2026-11-29, jointly with per-method draft-pass overheads bounded to <= 1 ms; it is set by the
# Kimi-K2.5 rows (384 experts, C = 4), where the expert term dominates a step (docs/seed_validation.md).
VERIFY_ROUTING_EXPONENT = 0.5

# Fraction of the (efficiency-scaled) HBM bandwidth at which verification's extra recurrent-state
# snapshots are written. basis: assumed from the kernel's access pattern: fused_recurrent stores a
# [BK = 128, BV = 8] fp32 tile whose rows are 8 contiguous floats (32 bytes) at a stride of V floats,
# so each store fills 32 bytes of a 128-byte line (MI300X/MI355X L2 line; CDNA3 ISA guide) -> 1/4.
STATE_SNAPSHOT_WRITE_EFFICIENCY = 0.25
# Rate at which attention reads the KV cache, as a fraction of the rate the other streams get (HBM
# bandwidth x `hbm`): the efficiency entry `kv_read` where one is given, else 1.0 (the same rate). A screening
# switch, not in any shipped profile (scripts/screen_cost_terms.py --variant "NAME=GPU;eff.kv_read=0.6"). The H200
# measured here (gpu_microbench_h200.csv, torch SDPA FlashAttention-2 decode, GQA 64/8, contiguous KV) reads it
# at 1.9-2.7 TB/s at 64-256 sequences of 256-16k tokens against 4.2 TB/s for a plain 1-4 GiB read (0.46-0.65),
# 2.1-4.4 TB/s at 1-16 sequences of 16-64k tokens.
KV_READ_DEFAULT = 1.0
# True prices the launches of a step without a graph (`eager_kernel_us`) as host time the GPU's work covers (the step
# lasts max(GPU, host)); False (shipped) in series with it. A screening switch (scripts/screen_cost_terms.py
# --variant "NAME=GPU;EAGER_HOST_OVERLAP=True"); docs/seed_validation.md section 37.
EAGER_HOST_OVERLAP = False
_NO_KERNEL_COUNT = ("{gpu}: efficiency.eager_kernel_us needs kernels_per_dense_layer in the profile (the kernels a "
                    "forward pass launches); add it or remove eager_kernel_us")
# Whether the per-routed-token MoE time (`moe_token_overhead_ns`) is split over expert-parallel GPUs: True if it
# is work on the tokens a GPU's own experts receive (the grouped GEMMs' tiles), False if every GPU does it for
# all routed tokens (routing, sorting). A screening switch (scripts/screen_cost_terms.py
# --variant "NAME=GPU;MOE_TOKEN_COST_SPLIT_BY_EP=True"); docs/seed_validation.md section 32.
MOE_TOKEN_COST_SPLIT_BY_EP = False
# Whether that time is paid per routed token (token x expert, True) or per token and MoE layer whatever its top-k
# (False: work every rank does once per token, e.g. the router and the activation's quantization; the fitted value is
# then about top-k times larger). A screening switch (--variant "NAME=PROFILE;MOE_TOKEN_COST_PER_EXPERT=False");
# docs/seed_validation.md section 48.
MOE_TOKEN_COST_PER_EXPERT = True
# A screening switch (--variant "NAME=PROFILE;MOE_TILE_PADDING=True"), off: where the experts' FLOPs are priced by
# `gemm` x `moe` (no AITER kernel curve), each expert's tokens are computed in whole BLOCK_SIZE_M tiles, as vLLM's
# grouped GEMMs do (moe_align_block_size pads every expert's token count to a multiple of BLOCK_SIZE_M and the kernel
# multiplies the padded rows): the FLOPs of a layer are those of expected_expert_blocks x BLOCK_SIZE_M rows, not of its
# routed tokens. BLOCK_SIZE_M by the Marlin MoE's rule (vllm/model_executor/layers/fused_moe/fused_marlin_moe.py: the
# first of 8, 16, 32, 48, 64 with M x top-k / E / block < 0.9, else 64), which fits the tile to the mean tokens per
# expert as tuned configurations do. docs/seed_validation.md section 49.
MOE_TILE_PADDING = False
MOE_TILE_BLOCKS_M = (8.0, 16.0, 32.0, 48.0, 64.0)   # the Marlin rule's tiles, smallest first
# A screening switch (--variant "NAME=PROFILE;W4A16_EXPERT_KERNEL=True"), off: on CUDA, experts with 4-bit weights
# computed in bf16 (int4 W4A16, and MXFP4 / NVFP4 on a GPU without FP4 tensor cores, e.g. gpt-oss-120b on Hopper) run
# vLLM's weight-only 4-bit MoE kernels (Marlin's MoE, or the Triton MXFP4 kernel), which dequantize every weight tile in
# the GEMM's inner loop: both their weight stream and their FLOPs at that kernel's efficiency `moe_int4` instead of
# `moe`. docs/seed_validation.md section 49.
W4A16_EXPERT_KERNEL = False
# A screening switch (--variant "NAME=PROFILE;MOE_M_HALF=44"), 0 = off: where the experts' FLOPs are priced by `gemm` x
# `moe` (no AITER kernel curve), the grouped GEMM's rate is scaled by m / (m + MOE_M_HALF), m the routed tokens per
# touched expert, the shape AITER's measured fused-MoE times show (capacity/data/moe_kernel_curves.yaml: m_half 41-47 on
# CDNA3 / CDNA4), carried to the other grouped-GEMM kernels as an assumption. docs/seed_validation.md section 49.
MOE_M_HALF = 0.0
# Where the per-routed-token MoE time (`moe_token_overhead_ns`) goes: False (shipped) after the grouped GEMM's
# max(compute, weight reads), in series with both; True on its compute side, max(compute + per-token time, weight
# reads), as work of the kernel's tiles (the tokens' gather, the epilogue that scales and writes each routed
# token's row) that the weight stream of a bandwidth-bound step covers. A screening switch
# (scripts/screen_cost_terms.py --variant "NAME=GPU;MOE_TOKEN_COST_COMPUTE_SIDE=True").
MOE_TOKEN_COST_COMPUTE_SIDE = False
# The architectures (GpuProfile.architecture) on which a step on AITER's fused MoE (`engine.moe_backend: aiter`) prices
# its experts from the measured kernel curve (capacity/data/moe_kernel_curves.yaml, `aiter_moe_layer_s`: nothing fitted
# to serving rows) instead of `gemm` x `moe` and `moe` x `hbm`: those whose shipped profiles were fitted with it
# (MI300X, and MI325X by family transfer; MI355X, and MI350X by family transfer, since section 44). A screening switch
# (scripts/screen_cost_terms.py --variant "NAME=GPU;AITER_MOE_KERNEL_CURVE=()", or "...=CDNA3 (gfx942)"); docs/seed_validation.md
# sections 41, 43, 44.
AITER_MOE_KERNEL_CURVE: tuple[str, ...] = ("CDNA3 (gfx942)", "CDNA4 (gfx950)")
# Whether the curve prices only the kernels AITER's tables timed (`MoeKernelCurve.formats`, e.g. "fp8 x fp8"): another
# pairing (int4 experts; MXFP4 experts under bf16 or FP8 activations on CDNA3, whose tables time bf16 and FP8 only) runs
# a kernel the curve knows nothing of, and is priced by `gemm` x `moe` and `moe` x `hbm` instead. False prices every
# AITER MoE by the curve, an untimed pairing at the bf16 / FP8 kernels' `compute` (a screening switch;
# docs/seed_validation.md section 43: that is what put MI355X's `hbm` on its bound in section 42).
AITER_MOE_CURVE_MEASURED_FORMATS_ONLY = True
# Multiple that vLLM rounds gpt-oss's expert width per tensor-parallel rank up to on ROCm (0: no rounding priced).
# vllm/model_executor/layers/quantization/quark/quark_moe.py `QuarkOCP_MX_MoEMethod.create_weights`: for model_type
# gpt_oss on ROCm, intermediate_size_per_partition_after_pad = round_up(intermediate_size_per_partition, 256), so
# 2880 / TP = 2880, 1440, 720, 360 are stored and multiplied as 3072, 1536, 768, 512 (+7 % at TP1-4, +42 % at TP8).
# A screening switch (scripts/screen_cost_terms.py --variant "NAME=GPU;GPT_OSS_ROCM_EXPERT_ROUNDING=256");
# docs/seed_validation.md section 34.
GPT_OSS_ROCM_EXPERT_ROUNDING = 0


@dataclass(frozen=True)
class StepTime:
    """A step's time in seconds, by component (COMPONENTS). `total_s` is their sum."""

    parts_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return float(sum(self.parts_s.values()))

    def __add__(self, other: "StepTime") -> "StepTime":
        # keys in a fixed order (this step's, then the other's new ones): `total_s` sums them in this
        # order, and a set's order would change the last bits of the sum with the hash seed
        keys = list(self.parts_s) + [k for k in other.parts_s if k not in self.parts_s]
        return StepTime({k: self.parts_s.get(k, 0.0) + other.parts_s.get(k, 0.0) for k in keys})


def expected_distinct_experts(num_experts, experts_per_token,
                              num_tokens: np.ndarray | float) -> np.ndarray | float:
    """Expected number of distinct experts a layer touches for `num_tokens` routed tokens
    (scalar or array; E and k may be arrays too). Uniform routing: E · (1 − (1 − k/E)^n) (modelling_notes §3.1, [S21][S22])."""
    if np.ndim(num_experts) == 0 and num_experts <= 0:
        return np.zeros_like(num_tokens, dtype=float)
    n = np.maximum(num_tokens, 0.0)
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** n)


# The exponent of the smooth maximum that joins a kernel's streaming and compute times, (s^q + c^q)^(1/q)
# (`roofline_join`; basis: assumed). A kernel slows before either side alone binds; on AITER's tuned fused-MoE times
# q = 2-8 fit alike (median |error| 6.3-7.5 %), a hard maximum worse at the CDNA4 rows' transition (8.3 / 21.5 % and a
# streaming fraction on its bound 1), docs/seed_validation.md section 41.
ROOFLINE_JOIN_EXPONENT = 4.0


def roofline_join(stream_s, compute_s):
    """The time of a kernel that streams for `stream_s` and computes for `compute_s` (ROOFLINE_JOIN_EXPONENT)."""
    q = ROOFLINE_JOIN_EXPONENT
    return (np.asarray(stream_s) ** q + np.asarray(compute_s) ** q) ** (1.0 / q)


def aiter_moe_parts_s(curve: "MoeKernelCurve", num_tokens, experts, experts_per_token, expert_bytes,
                      flops_per_routed_token, hbm_bytes_s, peak_flops) -> tuple:
    """AITER's fused MoE on one GPU, one layer, without its floor: (seconds streaming the touched experts' weights,
    seconds of their FLOPs), for `num_tokens` tokens routed to `experts_per_token` of `experts` local experts, each
    `expert_bytes` of weights and `flops_per_routed_token` per token at this GPU's width. The grouped GEMM's rate is
    `curve.compute` of the dtype peak times m / (m + m_half), m the routed tokens per touched expert: AITER sorts each
    expert's tokens into blocks of its tile height (aiter/fused_moe.py `moe_sorting`), so few tokens per expert waste
    most of each tile (scripts/fit_moe_kernel_curve.py fits the four numbers to AITER's tuned kernel times)."""
    n = np.maximum(num_tokens, 0.0)
    touched = np.maximum(expected_distinct_experts(experts, experts_per_token, n), 1e-12)
    routed = n * experts_per_token
    per_expert = routed / touched
    stream_s = touched * expert_bytes / (hbm_bytes_s * curve.stream)
    compute_s = (routed * flops_per_routed_token
                 / (peak_flops * curve.compute * per_expert / np.maximum(per_expert + curve.m_half, 1e-12)))
    return stream_s, compute_s


def aiter_moe_layer_s(curve: "MoeKernelCurve", num_tokens, experts, experts_per_token, expert_bytes,
                      flops_per_routed_token, hbm_bytes_s, peak_flops):
    """Seconds of AITER's fused MoE for one layer on one GPU (aiter_moe_parts_s joined, plus the kernel's floor; 0 for
    no tokens)."""
    stream_s, compute_s = aiter_moe_parts_s(curve, num_tokens, experts, experts_per_token, expert_bytes,
                                            flops_per_routed_token, hbm_bytes_s, peak_flops)
    return (curve.floor_us * 1e-6 + roofline_join(stream_s, compute_s)) * (np.asarray(num_tokens) > 0)


# vLLM's Triton int4 grouped GEMM for weight-only int4 experts on ROCm (`fused_moe_kernel_gptq_awq`, use_int4_w4a16)
# tiles each expert's tokens into blocks of BLOCK_SIZE_M rows; every block (one program per BLOCK_SIZE_N columns)
# loads, unpacks and scales the expert's whole K x BLOCK_SIZE_N weight panel before its tl.dot, so the weight work
# is paid once per block of tokens, not once per expert. BLOCK_SIZE_M by the number of tokens M in the call:
# vLLM's default for int4_w4a16 (vllm/model_executor/layers/fused_moe/fused_moe.py `get_default_config`: 16 for
# M <= 20, 32 for M <= 40, 64 above; read at 000d1458, an older stored version, the rule docs/seed_validation.md
# section 28 quoted; not re-read at v0.18.0), which MI300X runs (vLLM ships no int4_w4a16 config for it); MI355X's tuned
# `E=384,N=256,device_name=AMD_Instinct_MI355X,dtype=int4_w4a16.json` (vLLM PR #35093, read at 0f77f932) takes
# 16 up to 20 tokens, 32 up to 112 and 64 from 128, the same 64 wherever an expert gets more than one block.
INT4_TRITON_BLOCK_M = ((20, 16), (40, 32))   # (largest M, BLOCK_SIZE_M)
INT4_TRITON_BLOCK_M_ABOVE = 64               # BLOCK_SIZE_M above the table's largest M
# A screening switch (scripts/screen_cost_terms.py --variant "NAME=GPU;INT4_WEIGHT_PER_BLOCK=False"): False prices
# the int4 weights once per touched expert, as before docs/seed_validation.md section 38.
INT4_WEIGHT_PER_BLOCK = True
# The same kernel's tiles: vLLM reads tuned ones from a file per GPU and MoE shape (E local experts, N the expert width
# per GPU), else takes `get_default_config`'s, which PR #35093 measured 5-7x slower on Kimi-K2.5's shapes
# (capacity/data/vllm_int4_moe_configs.yaml). `moe_int4` is the rate under tuned tiles; a shape without a file streams
# its experts at `moe_int4` / `default_tiles_slowdown`. A screening switch: False prices every shape at `moe_int4`, as
# before docs/seed_validation.md section 52.
INT4_DEFAULT_TILES = True
# A screening switch (scripts/screen_cost_terms.py --variant "NAME=PROFILE;GEMM_TILE_M_HALF=128", PROFILE with a
# `gemm_curve` section): where a profile has the GEMM curve, every dense GEMM call of a step computes this many token
# rows more than the step has (a tile's padding rows, M + M_half instead of M), so mid-M decode GEMMs run below the
# ceiling and prompt-sized ones at it. 0: off (docs/seed_validation.md section 48).
GEMM_TILE_M_HALF = 0.0


def runs_int4_triton_moe(gpu: "GpuProfile", model: "ModelArch") -> bool:
    """Whether vLLM runs this model's experts in its Triton int4 MoE kernel on `gpu`: weight-only int4 experts on ROCm
    (`fused_moe_kernel_gptq_awq`; CUDA runs Marlin's MoE)."""
    return bool(gpu.is_rocm and model.num_moe_layers > 0
                and gpu.moe_efficiency_key(model.compute_weight_dtype) == "moe_int4")


def int4_default_tiles(gpu: "GpuProfile", model: "ModelArch", tensor_parallel_size: int, expert_parallel_size: int = 1
                       ) -> bool:
    """Whether vLLM runs this model's int4 experts on `gpu` under its default tiles: no tuned file for the GPU, the experts
    on one GPU (E / EP) and the expert width on one GPU (the whole expert under EP, else a 1/TP slice); INT4_DEFAULT_TILES.
    Only meaningful where vLLM's Triton int4 MoE runs (int4 experts on ROCm)."""
    ep = max(int(expert_parallel_size), 1)
    width = model.expert_intermediate_size // (1 if ep > 1 else int(tensor_parallel_size))
    return not int4_tile_table().has_tuned(gpu.name, model.num_experts // ep, width)


def int4_triton_block_m(num_tokens: np.ndarray | float) -> np.ndarray | float:
    """BLOCK_SIZE_M of vLLM's default int4_w4a16 MoE config for a call on `num_tokens` tokens (INT4_TRITON_BLOCK_M)."""
    n = np.asarray(num_tokens, dtype=float)
    out = np.full(n.shape, float(INT4_TRITON_BLOCK_M_ABOVE))
    for largest, block in reversed(INT4_TRITON_BLOCK_M):
        out = np.where(n <= largest, float(block), out)
    return out if out.ndim else float(out)


def expected_expert_blocks(num_experts: int, experts_per_token: int, num_tokens: np.ndarray | float,
                           block_m: np.ndarray | float) -> np.ndarray | float:
    """Expected number of BLOCK_SIZE_M token blocks a layer's grouped GEMM runs over all experts for `num_tokens`
    routed tokens: sum over experts of E[ceil(X / block_m)], X ~ Binomial(n, k/E) the expert's tokens under
    uniform routing, i.e. E * sum_j P(X > j * block_m). The j = 0 term is `expected_distinct_experts`; the rest
    count the extra blocks of experts with more tokens than one block holds (a prompt chunk)."""
    touched = expected_distinct_experts(num_experts, experts_per_token, num_tokens)
    if num_experts <= 0:
        return touched
    n = np.maximum(np.asarray(num_tokens, dtype=float), 0.0)
    b = np.broadcast_to(np.asarray(block_m, dtype=float), n.shape)
    p = experts_per_token / num_experts
    if float(np.max(n / b, initial=0.0)) * p <= 0.05:   # no expert needs a second block
        return touched
    if n.ndim == 0:
        return float(touched + num_experts * _extra_blocks(float(n), float(b), p))
    # once per distinct (tokens, block) pair of the steps where an expert can need a second block (n > block_m; the
    # rest add nothing): a re-pricing prices the same steps many times
    flat_n, flat_b = n.ravel(), b.ravel()
    big = flat_n > flat_b
    extra = np.zeros(flat_n.shape)
    if big.any():
        pairs, where = np.unique(np.stack([flat_n[big], flat_b[big]]), axis=1, return_inverse=True)
        extra[big] = np.array([_extra_blocks(float(t), float(m), p) for t, m in pairs.T])[where.ravel()]
    return touched + num_experts * extra.reshape(n.shape)


@functools.lru_cache(maxsize=65536)
def _extra_blocks(n: float, block_m: float, p: float) -> float:
    """sum over j >= 1 of P(X > j * block_m), X ~ Binomial(n, p): one expert's blocks beyond its first."""
    if n <= block_m:
        return 0.0
    from scipy.special import betainc   # imported when first needed (int4 experts on ROCm only)

    lam = n * p
    total = 0.0
    for j in range(1, int(np.ceil((lam + 10.0 * np.sqrt(lam) + 10.0) / block_m)) + 1):
        k = j * block_m
        if k >= n:
            break
        total += float(betainc(k + 1.0, n - k, p))   # P(X > k) = I_p(k + 1, n - k); real n: routed_tokens may be fractional
    return total


def expected_max_std_normal(m: int) -> float:
    """E[max of m independent standard normals] (0 for m = 1): ∫ x · m φ(x) Φ(x)^(m−1) dx."""
    if m <= 1:
        return 0.0
    from scipy import integrate, stats   # imported when first needed (EP > 1 only): scipy takes about a second to import

    value, _ = integrate.quad(lambda x: x * m * stats.norm.pdf(x) * stats.norm.cdf(x) ** (m - 1), -12.0, 12.0)
    return float(value)


# vLLM's custom all-reduce (one- and two-shot, for messages up to its buffer) and its dispatch rule; larger
# messages go to RCCL/NCCL, whose ring moves what a two-shot does. basis: vllm csrc/custom_all_reduce.cuh,
# CustomAllreduce::allreduce (REDUCE_CASE: world size 2 -> 1stage; fully connected, world <= 4 and < 512 KiB
# or world <= 8 and < 256 KiB -> 1stage; else 2stage; AITER's ROCm copy has the same thresholds) and
# vllm/distributed/device_communicators/custom_all_reduce.py (max_size = 8192 * 1024 bytes by default).
CUSTOM_ALLREDUCE_MAX_BYTES = 8192 * 1024
ONE_SHOT_BELOW_BYTES = {4: 512 * 1024, 8: 256 * 1024}   # world sizes 3-4 and 5-8; world size 2 is always one-shot


def allreduce_traffic(message_bytes, tp: int, algorithm: str = "vllm"):
    """Bytes one GPU moves to its peers for one all-reduce of `message_bytes` over `tp` GPUs (scalar or
    array): a one-shot reads the whole message from each of the tp - 1 peers, a two-shot (reduce-scatter
    then all-gather) and a ring move 2 (tp - 1) / tp of it. Divided by the bandwidth a GPU reaches its
    peers with (`GpuProfile.allreduce_bandwidth_gb_s`): on a full mesh one-shot costs message / link
    bandwidth and two-shot 2 message / (tp x link bandwidth). `algorithm="ring"`: every message as a ring.
    Opt-in: StepCostModel uses vLLM's rule only for a profile that states its mesh (`scaleup_links_per_gpu`,
    none shipped: docs/seed_validation.md section 18), and a ring at the whole scale-up bandwidth otherwise."""
    two_shot = 2.0 * (tp - 1) / tp * message_bytes
    if algorithm == "ring" or tp <= 1:
        return two_shot
    one_shot = (tp - 1) * message_bytes
    if tp == 2:                     # one-shot and a ring both move the whole message once
        return one_shot
    below = ONE_SHOT_BELOW_BYTES[4 if tp <= 4 else 8] if tp <= 8 else 0
    if type(message_bytes) is float:
        return one_shot if message_bytes < below else two_shot
    return np.where(np.asarray(message_bytes) < below, one_shot, two_shot)


# vLLM's QuickReduce on ROCm (VLLM_ROCM_QUICK_REDUCE_QUANTIZATION, default NONE = off): on gfx94x/gfx95x
# (MI300X, MI325X, MI350X, MI355X) at TP 2, 4 or 8 it takes every all-reduce of at least a minimum size ahead of
# the custom all-reduce and RCCL, as a two-shot whose wire bytes are block-quantized (one fp16 scale per 32
# values). basis, vLLM v0.18.0 (the same in v0.10.0 and v0.19.1; docs/rocm_allreduce_paths.md):
# cuda_communicator.py L191-199 (QR first), quick_all_reduce.py L47-58 (world sizes, _QR_MIN_SIZE: the fp16 row,
# which bf16 inputs use too since VLLM_ROCM_QUICK_REDUCE_CAST_BF16_TO_FP16 defaults to 1, L168),
# L85-89 (gfx94/gfx95 only), L247-269 (should_quick_allreduce), quick_reduce.h L164-194 (always two-shot) and
# quick_reduce_impl.cuh codecs (bytes per 2048-value atom: FP 4096, INT8 2176, INT6 1664, INT4 1152).
# The (de)quantization's own time is not priced (assumed: the kernel is bound by its peer writes).
QUICK_REDUCE_MIN_BYTES = {   # {tp: {codec: bytes}}, MiB = 2**20
    2: {"fp": 1 << 20, "int8": 2 << 20, "int6": 2 << 20, "int4": 1 << 20},
    4: {"fp": 1 << 20, "int8": 16 << 20, "int6": 4 << 20, "int4": 2 << 20},
    8: {"fp": 16 << 20, "int8": 4 << 20, "int6": 4 << 20, "int4": 2 << 20},
}
QUICK_REDUCE_WIRE_FRACTION = {"fp": 1.0, "int8": 2176 / 4096, "int6": 1664 / 4096, "int4": 1152 / 4096}
QUICK_REDUCE_ARCHS = ("gfx94", "gfx95")


def quick_reduce_rule(architecture: str, tp: int, quantization: str) -> tuple[float, float] | None:
    """(minimum message bytes, wire bytes per 16-bit byte) of vLLM's QuickReduce for this GPU and TP size,
    or None where vLLM does not use it (quantization "none", another architecture, TP not 2, 4 or 8)."""
    q = quantization.lower()
    if q == "none" or tp not in QUICK_REDUCE_MIN_BYTES or not any(a in architecture for a in QUICK_REDUCE_ARCHS):
        return None
    return float(QUICK_REDUCE_MIN_BYTES[tp][q]), QUICK_REDUCE_WIRE_FRACTION[q]


def allreduce_bytes(message_bytes, tp: int, algorithm: str = "vllm", quick_reduce: tuple[float, float] | None = None):
    """`allreduce_traffic`, with messages QuickReduce takes (`quick_reduce_rule`) sent as its quantized
    two-shot instead."""
    traffic = allreduce_traffic(message_bytes, tp, algorithm)
    if quick_reduce is None:
        return traffic
    floor, fraction = quick_reduce
    quick = 2.0 * (tp - 1) / tp * message_bytes * fraction
    if type(message_bytes) is float:
        return quick if message_bytes >= floor else traffic
    return np.where(np.asarray(message_bytes) >= floor, quick, traffic)


# True: where a GPU's fabric has measured all-reduce latencies (hardware.measured_allreduce: capacity/data/measurements/
# allreduce_latency.yaml, MI300X and MI325X), one all-reduce costs the latency measured for its TP size, message size
# and the path vLLM takes (`measured_allreduce_s`), over `efficiency.allreduce` (then the fraction of that measured rate
# reached in serving; 1 = the microbenchmark). Shipped since docs/seed_validation.md section 44: MI300X holds `allreduce`
# at 1 and its request delay at a sourced 4 ms (fitted free, the rows put the delay on its floor 0, section 39). False,
# and elsewhere: the latency-plus-bytes form of `allreduce_bytes` at the profile's scale-up bandwidth. A screening switch
# (scripts/screen_cost_terms.py --variant "NAME=PROFILE.yaml;ALLREDUCE_MEASURED_LATENCY=False").
ALLREDUCE_MEASURED_LATENCY = True
# A screening switch (--variant "NAME=PROFILE;LARGE_ALLREDUCE_BUSBW_GB_S=679.61"), off (0): on a GPU priced by the
# latency-plus-bytes form, messages at or above the size from which vLLM hands an all-reduce to NCCL on CUDA
# (capability 10.0: TP2 8 MiB, TP4 32 MiB, TP8 128 MiB, vllm/distributed/device_communicators/all_reduce_utils.py
# SYMM_MEM_ALL_REDUCE_MAX_SIZES; docs/nvidia_allreduce_paths.md) move their ring bytes at this bus bandwidth (NCCL's
# large-message rate) instead of at the fitted fraction `allreduce` of the links. docs/seed_validation.md section 50.
LARGE_ALLREDUCE_BUSBW_GB_S = 0.0
NCCL_FROM_BYTES = {2: 8 << 20, 4: 32 << 20, 8: 128 << 20}


def _interp_extrapolate(x, xs: np.ndarray, ys: np.ndarray):
    """Piecewise-linear y(x) through (xs, ys): held at ys[0] below xs[0], extended at the last segment's slope above xs[-1]."""
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    if type(x) is float or np.ndim(x) == 0:
        x = float(x)
        return float(ys[-1] + slope * (x - xs[-1])) if x > xs[-1] else float(np.interp(x, xs, ys))
    x = np.asarray(x, dtype=float)
    return np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), np.interp(x, xs, ys))


# True: at a TP size where the fabric has no measurement of vLLM's custom all-reduce (MI300X TP8), messages below its
# one-shot limit (ONE_SHOT_BELOW_BYTES) are priced as a one-shot derived from the TP sizes that are measured
# (`one_shot_line`), not by the `fp` two-shot that stands in from the limit on (allreduce_latency.yaml header), which
# runs about twice vLLM's one-shot time there. docs/seed_validation.md section 50. A screening switch
# (--variant "NAME=PROFILE;ALLREDUCE_ONE_SHOT_DERIVED=False").
ALLREDUCE_ONE_SHOT_DERIVED = True
_ONE_SHOT_CURVES: dict[tuple[str, int], tuple[tuple[float, ...], tuple[float, ...]] | None] = {}


def one_shot_line(measured: "MeasuredAllreduce", tp: int) -> tuple[float, float] | None:
    """(latency at zero bytes in us, bytes per us from each peer) of vLLM's one-shot custom all-reduce over `tp` GPUs,
    derived from the TP sizes where it is measured (`measured.custom_measured_tps`, at least two), or None.

    A one-shot has every GPU read the whole message from each of its tp - 1 peers, on a full mesh each over that
    peer's own link. At each measured TP size a line, latency = alpha + message / per-peer rate, is fitted to the sizes
    the one-shot runs (below ONE_SHOT_BELOW_BYTES; world size 2 at every size). Carried to `tp` (assumed, the two
    measured sizes fixing each): alpha linear in the number of peers, and the GPU's aggregate read rate (peers x
    per-peer rate) a power of it: on MI300X TP2 gives 6.51 us and 48.0 GB/s, TP4 6.86 us and 3 x 35.0 GB/s, so TP8
    7.56 us and 7 x 27.4 GB/s, whose 17.1 us just below 256 KiB meets the measured two-shot there (16.4 us)."""
    fits = []
    for t in measured.custom_measured_tps:
        xs, ys = (np.asarray(v, dtype=float) for v in measured.curves[t]["custom"])
        below = np.inf if t == 2 else ONE_SHOT_BELOW_BYTES[4 if t <= 4 else 8]
        one_shot = xs < below
        if one_shot.sum() < 2:
            continue
        seconds_per_byte, alpha = np.polyfit(xs[one_shot], ys[one_shot], 1)
        fits.append((t - 1, alpha, (t - 1) / seconds_per_byte))
    if len(fits) < 2:
        return None
    peers, alphas, aggregate = (np.asarray(v, dtype=float) for v in zip(*fits))
    alpha_per_peer, alpha_0 = np.polyfit(peers, alphas, 1)
    exponent, log_rate = np.polyfit(np.log(peers), np.log(aggregate), 1)
    n = tp - 1
    return float(alpha_0 + alpha_per_peer * n), float(np.exp(log_rate) * n ** exponent / n)


def custom_allreduce_curve(measured: "MeasuredAllreduce", tp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(sizes, latencies in us) of vLLM's custom all-reduce over `tp` GPUs on the fabric: the measured curve where there
    is one; elsewhere the `fp` two-shot from the one-shot limit on, below it the derived one-shot (`one_shot_line`,
    where ALLREDUCE_ONE_SHOT_DERIVED and the limit applies: TP 3-8)."""
    custom = measured.curves[tp]["custom"]
    if tp in measured.custom_measured_tps or not ALLREDUCE_ONE_SHOT_DERIVED or not 2 < tp <= 8:
        return custom
    key = (measured.fabric, tp)
    if key not in _ONE_SHOT_CURVES:
        line = one_shot_line(measured, tp)
        curve = None
        if line is not None:
            alpha, per_peer = line
            below = float(ONE_SHOT_BELOW_BYTES[4 if tp <= 4 else 8])
            xs, ys = measured.curves[tp]["fp"]
            two_shot = [(x, y) for x, y in zip(xs, ys) if x >= below]
            pts = [(1.0, alpha + 1.0 / per_peer), (below - 1.0, alpha + (below - 1.0) / per_peer)] + two_shot
            curve = (tuple(x for x, _ in pts), tuple(y for _, y in pts))
        _ONE_SHOT_CURVES[key] = curve
    return _ONE_SHOT_CURVES[key] or custom


def measured_allreduce_s(message_bytes, measured: "MeasuredAllreduce", tp: int, quick_reduce_codec: str | None = None,
                         quick_reduce_min_bytes: float = 0.0):
    """Seconds of one all-reduce of `message_bytes` (scalar or array) over `tp` GPUs as measured on the fabric, on the
    path vLLM takes on ROCm: QuickReduce with its codec for messages of at least its minimum size where it is on
    (quick_reduce_rule), else its custom all-reduce (custom_allreduce_curve) below CUSTOM_ALLREDUCE_MAX_BYTES and RCCL
    from there. None where the measurements have no figures for this TP size."""
    paths = measured.curves.get(int(tp))
    if paths is None:
        return None

    def at(path: str):
        xs, ys = custom_allreduce_curve(measured, tp) if path == "custom" else paths[path]
        return _interp_extrapolate(message_bytes, np.asarray(xs), np.asarray(ys))

    custom, rccl = at("custom"), at("rccl")
    if type(message_bytes) is float or np.ndim(message_bytes) == 0:
        us = custom if float(message_bytes) < CUSTOM_ALLREDUCE_MAX_BYTES else rccl
        if quick_reduce_codec is not None and float(message_bytes) >= quick_reduce_min_bytes:
            us = at(quick_reduce_codec)
        return us * 1e-6
    sizes = np.asarray(message_bytes)
    us = np.where(sizes < CUSTOM_ALLREDUCE_MAX_BYTES, custom, rccl)
    if quick_reduce_codec is not None:
        us = np.where(sizes >= quick_reduce_min_bytes, at(quick_reduce_codec), us)
    return us * 1e-6


# Kernels one decoder layer launches outside the collectives, counted from vLLM's model code (graph-replayed
# decode; basis: assumed counts, not traced): a dense layer runs fused add + RMSNorm, QKV projection, rotary
# embedding with the KV-cache write, attention, o_proj, fused add + RMSNorm, gate_up, SiLU-and-mul, down: 9
# (a profile's `kernels_per_dense_layer`). A MoE layer replaces the MLP's three with the router GEMM, top-k
# softmax, expert alignment (moe_align / sorting), the two grouped expert GEMMs, SiLU-and-mul and the
# weighted sum: 7, so 13, plus the shared expert's three.
MOE_LAYER_KERNELS = 13
# AITER's fused MoE (ROCm with VLLM_ROCM_USE_AITER=1, engine.moe_backend: aiter) runs the experts in two stages
# whose kernels fuse the activation into the first grouped GEMM and the top-k weighted sum into the second
# (aiter/fused_moe.py: moe_sorting, then ck_moe_stage1 with the activation, then ck_moe_stage2, which accumulates
# each token's top-k outputs), so the MLP's three become the router GEMM, top-k, sorting and the two stages: 5, so 11
# (basis: assumed, counted from the code, not traced).
AITER_MOE_LAYER_KERNELS = 11
SHARED_EXPERT_KERNELS = 3
# Kernels an attention block launches beyond the GQA block's five counted above (basis: assumed counts from
# vLLM's model code, not traced). MLA (DeepSeek-V3 / Kimi-K2.5; vllm/model_executor/layers/mla.py
# MultiHeadLatentAttentionWrapper.forward) runs fused_qkv_a_proj, q_a_layernorm, kv_a_layernorm and q_b_proj
# before attention and the MLA backend's W_UK and W_UV batched matmuls around its decode kernel; that decode runs
# in two kernels, the split-KV partial attention and its reduction (vLLM's triton_decode_attention.py; AITER's
# mla_decode_fwd, aiter/mla.py), and the rotary of q_pe / k_pe runs apart from the latent cache write
# (concat_and_cache_mla): twelve where GQA runs five, 7 more (5 until 2026-12-06, which counted the decode as one
# kernel and the rotary with the cache write; docs/seed_validation.md §35). A q/k RMSNorm adds two: Qwen3's
# per-head q_norm and k_norm; MiniMax-M2's per-layer norm
# (vllm/model_executor/layers/mamba/linear_attn.py MiniMaxText01RMSNormTP.forward_qk) reduces the variance
# before its all-reduce and scales after it.
MLA_EXTRA_KERNELS = 7
QK_NORM_EXTRA_KERNELS = 2
# Bytes per token of MiniMax-M2's per-layer q/k-norm all-reduce: the q and k variances in fp32, all-reduced
# over the tensor-parallel group once per layer when TP > 1 (forward_qk above: torch.cat([q_var, k_var])
# then tensor_model_parallel_all_reduce).
QK_NORM_ALLREDUCE_BYTES_PER_TOKEN = 2 * 4


# AMD Quark's OCP-MX MXFP4 formats (4-bit weights and 4-bit activations), which vLLM on ROCm serves through
# vllm/model_executor/layers/quantization/quark/ (read at 039541c and later):
# - a dense linear quantizes its activations at run time in a kernel of its own before each GEMM
#   (schemes/quark_ocp_mx.py `gemm_with_dynamic_quant`: per_1x32_f4_quant_hip, or dynamic_mxfp4_quant on the Triton path,
#   then gemm_a4w4 / gemm_afp4wfp4; basis: counted from the code, not traced). FP8 activations are not counted: vLLM
#   fuses their quantization into the RMSNorm or activation before on some paths (not settled);
# - it runs natively only where `current_platform.supports_mx()` (gfx950: MX tensor cores) and emulates elsewhere, every
#   pass dequantizing the weights and quantize-dequantizing the activations, then the linears in 16 bit (`QuarkOCP_MX`
#   and quark_moe.py `QuarkOCP_MX_MoEMethod`: `emulate = not current_platform.supports_mx() or ...`). The simulator does
#   not price that emulation, so such a deployment is refused rather than priced as if native;
# - its experts run natively only through AITER's fused MoE (`QuarkOCP_MX_MoEMethod.apply` calls
#   `rocm_aiter_fused_experts`; earlier vLLM also required VLLM_ROCM_USE_AITER=1 for that path).
QUARK_OCP_MX_FORMATS = ("mxfp4_w4a4",)
_MX_EMULATED = ("{gpu} ({arch}) has no MXFP4 tensor cores: vLLM emulates {fmt} layers there (weights dequantized to 16 bit "
                "on every pass, vllm quark_ocp_mx.py / quark_moe.py, kernels/linear/__init__.py _POSSIBLE_MXFP4_KERNELS), "
                "which the simulator does not price; use a "
                "gfx950 GPU (MI355X, MI350X) or fp8")
# NVIDIA's NVFP4 formats (ModelOpt / compressed-tensors checkpoints: E2M1 weights in blocks of 16 with FP8 scales). vLLM
# has no native NVFP4 kernel on ROCm, on any AMD GPU: its linear layers take the one kernel listed for the platform,
# `EmulationNvFp4LinearKernel`, which dequantizes the whole weight to bf16 on every pass
# (vllm/model_executor/kernels/linear/__init__.py `_POSSIBLE_NVFP4_KERNELS[PlatformEnum.ROCM]`, read at 006fc898;
# nvfp4_emulation_utils.py `run_nvfp4_emulations`), and its NVFP4 fused-MoE backends are CUDA kernels (FlashInfer,
# CUTLASS, Marlin) or that emulation (fused_moe/oracle/nvfp4.py `select_nvfp4_moe_backend`). MI355X's fp4 tensor cores
# run MXFP4 (OCP-MX, blocks of 32 with E8M0 scales), not NVFP4. So an NVFP4 deployment on ROCm is refused like an
# emulated MXFP4 one rather than priced as if native.
NVFP4_FORMATS = ("nvfp4", "nvfp4_w4a4")
# MXFP4 weights in a dense linear (a dense model's layers, not experts) under 16-bit or FP8 activations. vLLM's MXFP4
# linear kernels on ROCm are `AiterMxfp4LinearKernel`, supported only where `current_platform.supports_mx()` (gfx950),
# then `EmulationMxfp4LinearKernel` (vllm/model_executor/kernels/linear/__init__.py `_POSSIBLE_MXFP4_KERNELS`, read at
# 006fc898; mxfp4/aiter.py `is_supported`). So on MI300X / MI325X such a linear is emulated. Experts in these formats are
# not refused: gpt-oss-120b's MXFP4 experts run natively on MI300X through vLLM's Triton MoE (its InferenceX rows).
MXFP4_DENSE_FORMATS = ("mxfp4", "mxfp4_w4a8")
_NVFP4_EMULATED = ("{gpu} ({arch}) is an AMD GPU: vLLM has no NVFP4 kernel on ROCm and emulates {fmt} layers there "
                   "(weights dequantized to bf16 on every pass, vllm kernels/linear/__init__.py _POSSIBLE_NVFP4_KERNELS), "
                   "which the simulator does not price; use an MXFP4 checkpoint (precision mxfp4, or mxfp4_w4a4 on "
                   "MI355X / MI350X) or fp8")


def emulated_on(gpu: "GpuProfile", weight_dtype: str) -> bool:
    """Whether vLLM emulates layers of `weight_dtype` on `gpu`: QUARK_OCP_MX_FORMATS on a ROCm GPU without fp4, and
    NVFP4_FORMATS on any ROCm GPU."""
    if not gpu.is_rocm:
        return False
    if weight_dtype in NVFP4_FORMATS:
        return True
    return weight_dtype in QUARK_OCP_MX_FORMATS and gpu.compute_dtype(weight_dtype) != "fp4"


def emulated_dense_on(gpu: "GpuProfile", dense_weight_dtype: str) -> bool:
    """Whether vLLM emulates dense linears of `dense_weight_dtype` on `gpu` (MXFP4_DENSE_FORMATS on a ROCm GPU without
    MX tensor cores), beyond what `emulated_on` says of the whole model's format."""
    return gpu.is_rocm and dense_weight_dtype in MXFP4_DENSE_FORMATS and gpu.compute_dtype("mxfp4_w4a4") != "fp4"


def emulation_error(gpu: "GpuProfile", weight_dtype: str) -> str:
    """The one-line refusal for a deployment `emulated_on` (or `emulated_dense_on`) this GPU, with its fix."""
    template = _NVFP4_EMULATED if weight_dtype in NVFP4_FORMATS else _MX_EMULATED
    return template.format(gpu=gpu.name, arch=gpu.architecture, fmt=weight_dtype)


def resolve_moe_backend(gpu: "GpuProfile", model: "ModelArch") -> str:
    """vLLM's own choice of fused-MoE kernels (scenario engine.moe_backend 'auto'): AITER's fused MoE for experts in
    QUARK_OCP_MX_FORMATS on a ROCm GPU that runs them natively (gfx950), else its default Triton fused MoE."""
    if (gpu.is_rocm and model.num_moe_layers and model.compute_weight_dtype in QUARK_OCP_MX_FORMATS
            and not emulated_on(gpu, model.compute_weight_dtype)):
        return "aiter"
    return "triton"


def activation_quant_kernels(model: "ModelArch") -> int:
    """Activation-quantization kernels one forward pass adds where its dense linears quantize their input at run time
    (QUARK_OCP_MX_FORMATS): one per quantized linear of a layer, QKV and o_proj, gate_up and down of a
    dense MLP or a shared expert (`gemm_calls` without the router, which is never quantized, and the LM head, which
    Quark's MXFP4 checkpoints exclude; a linear-attention layer's projections counted as two, as there)."""
    if model.dense_weight_dtype not in QUARK_OCP_MX_FORMATS:
        return 0
    dense, _ = gemm_calls(model)
    return dense - model.num_moe_layers - (1 if model.params_lm_head else 0)


def layer_overhead_units(model: "ModelArch", kernels_per_dense_layer: int = 0, moe_backend: str = "triton",
                         quantizes_activations: bool = False) -> float:
    """What `layer_overhead_us` multiplies. Without a kernel count (0): the number of layers. With one (a
    profile's opt-in `kernels_per_dense_layer`): the kernels of all layers in units of a dense layer's, so
    `layer_overhead_us` is the fixed GPU time of a dense layer's kernels and a MoE layer, which launches more
    (MOE_LAYER_KERNELS; AITER_MOE_LAYER_KERNELS where `moe_backend` is AITER's fused MoE), costs proportionally
    more (docs/seed_validation.md §18, §35); `quantizes_activations` adds `activation_quant_kernels` (ROCm, §44)."""
    if kernels_per_dense_layer <= 0:
        return float(model.num_layers)
    moe = model.num_moe_layers
    moe_kernels = AITER_MOE_LAYER_KERNELS if moe_backend == "aiter" else MOE_LAYER_KERNELS
    attention_extra = (MLA_EXTRA_KERNELS if model.uses_mla else 0) + (QK_NORM_EXTRA_KERNELS if model.qk_norm else 0)
    kernels = ((model.num_layers - moe) * kernels_per_dense_layer
               + moe * (moe_kernels + SHARED_EXPERT_KERNELS * (model.num_shared_experts > 0))
               + model.num_layers * attention_extra
               + (activation_quant_kernels(model) if quantizes_activations else 0))
    return kernels / kernels_per_dense_layer


# vLLM V1's cap on the default graph capture sizes (vllm/config/vllm.py `_set_cudagraph_sizes`: min(..., 512))
CUDAGRAPH_MAX_CAPTURE_SIZE = 512


def cudagraph_max_tokens(max_num_seqs: int, num_speculative_tokens: int = 0,
                         max_num_batched_tokens: int | None = None, max_capture_size: int | None = None) -> int:
    """The largest step (scheduled tokens) vLLM V1 replays from a captured CUDA/HIP graph: vllm/config/vllm.py
    `_set_cudagraph_sizes` (read at 09f030e; the draft factor since vLLM PR #30330, December 2025). Without a size
    from the server's arguments, decode_query_len = 1 + num_speculative_tokens; min(max_num_seqs * decode_query_len *
    2, 512) (before PR #30330, `min(max_num_seqs * 2, 512)`, PR #20628). `max_capture_size` is the one the server
    was given (`--max-cudagraph-capture-size`, or the largest of compilation-config `cudagraph_capture_sizes`),
    which replaces that rule. Either way at most max_num_batched_tokens. The same on ROCm (vllm/platforms/rocm.py
    overrides no capture size)."""
    if max_capture_size is None:
        size = min(int(max_num_seqs) * (1 + int(num_speculative_tokens)) * 2, CUDAGRAPH_MAX_CAPTURE_SIZE)
    else:
        size = int(max_capture_size)
    return size if max_num_batched_tokens is None else min(size, int(max_num_batched_tokens))


def gemm_calls(model: "ModelArch") -> tuple[int, int]:
    """(dense GEMM kernels, routed-expert GEMM kernels) one forward pass runs per GPU. basis: vLLM's
    model code fuses the projections: per layer one QKVParallelLinear (q, k, v) and one o_proj
    RowParallelLinear; per dense-MLP layer one MergedColumnParallelLinear (gate + up) and one down_proj;
    per MoE layer a router (ReplicatedLinear gate), the shared expert's gate_up and down where there is
    one, and FusedMoE's two grouped GEMMs (w13, w2) for the routed experts; one LM head. MLA and
    linear-attention layers run a few more projections each; counted as two (assumed)."""
    moe = model.num_moe_layers
    dense = (2 * model.num_layers + 2 * (model.num_layers - moe) + moe * (1 + 2 * (model.num_shared_experts > 0))
             + (1 if model.params_lm_head else 0))
    return dense, 2 * moe


def _float_or_array(x):
    """A Python float stays one (the engine prices single steps in plain floats: numpy's per-call
    overhead dwarfs the arithmetic there); anything else becomes a float array. Python and numpy
    float64 arithmetic round alike, so both give the same bits."""
    return x if type(x) is float else np.asarray(x, dtype=float)


def fast_maximum(a, b):
    """np.maximum, without numpy for two Python floats."""
    if type(a) is float and type(b) is float:
        return a if a >= b else b
    return np.maximum(a, b)


_FEW = 32   # below this many values, plain Python beats a numpy reduction call

_add_reduce = np.add.reduce   # what ndarray.sum() calls, without its Python wrapper (the same sums)


def float_sum(x: list[float]) -> float:
    """float(np.add.reduce(np.array(x))) of Python floats, bit for bit, in plain Python: numpy's
    pairwise summation of a contiguous array (numpy/_core/src/umath/loops_utils.h.src,
    `pairwise_sum`): fewer than 8 values one after the other from 0.0; up to 128 in eight running
    sums combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the remainder one by
    one; longer arrays split in two halves (the first a multiple of 8). Checked against numpy in
    tests/test_speed_exact.py."""
    n = len(x)
    if n < 8:
        total = 0.0
        for v in x:
            total += v
        return total
    if n > 128:
        half = n // 2
        half -= half % 8
        return float_sum(x[:half]) + float_sum(x[half:])
    r0, r1, r2, r3, r4, r5, r6, r7 = x[:8]
    m = n - n % 8
    for i in range(8, m, 8):
        r0 += x[i]
        r1 += x[i + 1]
        r2 += x[i + 2]
        r3 += x[i + 3]
        r4 += x[i + 4]
        r5 += x[i + 5]
        r6 += x[i + 6]
        r7 += x[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for v in x[m:]:
        total += v
    return total


def int_sum(a: np.ndarray) -> int:
    """int(a.sum()) of a 1-D integer array: plain Python for a few values (numpy's per-call cost
    dwarfs the additions, and an integer sum does not depend on the order)."""
    return sum(a.tolist()) if len(a) < _FEW else int(a.sum())


def int_min(a: np.ndarray) -> int:
    """int(a.min()) of a non-empty 1-D integer array (plain Python for a few values)."""
    return min(a.tolist()) if len(a) < _FEW else int(a.min())


def any_true(a: np.ndarray) -> bool:
    """bool(a.any()) of a 1-D array (plain Python for a few values)."""
    return any(a.tolist()) if len(a) < _FEW else bool(a.any())


def all_true(a: np.ndarray) -> bool:
    """bool(a.all()) of a 1-D array (plain Python for a few values)."""
    return all(a.tolist()) if len(a) < _FEW else bool(a.all())


class TokenTable:
    """fn(0), fn(1), ... of an elementwise function of a whole number of tokens, computed in one
    vectorised call and extended (doubling) when a larger count is asked for: an exact cache.

    The engine asks the same per-sequence questions (KV bytes or blocks at c tokens, attention
    FLOPs of a q-token chunk ending at c) for a handful of sequences thousands of times, where
    numpy's per-call overhead, not the arithmetic, is the cost. Index with a whole number >= 0 or
    an array of them (a negative index would wrap around, as numpy's do).
    """

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray]):
        self._fn = fn
        self.values = np.asarray(fn(np.arange(0)))

    def __getitem__(self, tokens):
        try:
            return self.values[tokens]
        except IndexError:
            n = int(np.max(tokens)) + 1
            self.values = np.asarray(self._fn(np.arange(max(n, 2 * len(self.values), 1024))))
            self._list = None
            return self.values[tokens]

    _list: list | None = None   # self.values as Python numbers (the same values), made on first use

    def lookup(self, tokens: list[int]) -> list:
        """[self[c] for c in tokens] as Python numbers, for a few whole numbers >= 0 (a numpy call
        per look-up would cost more than the look-up)."""
        values = self._list
        if values is not None:
            try:
                return [values[c] for c in tokens]
            except IndexError:
                pass
        self[max(tokens)]                                           # grows the table if needed
        values = self._list = self.values.tolist()
        return [values[c] for c in tokens]


# BLOCK_M of vLLM's prefix-prefill kernel (ROCM_ATTN's path for multi-token queries; module docstring):
# vllm/v1/attention/ops/prefix_prefill.py `context_attention_fwd` (BLOCK_M = 128, BLOCK_N = 64 for a
# power-of-two KV block size; 32 and 32 otherwise)
ROCM_ATTN_QUERY_TILE = 128
ROCM_ATTN_QUERY_TILE_NON_POW2_BLOCK = 32
# the largest head size ROCM_ATTN takes (vllm/v1/attention/backends/rocm_attn.py RocmAttentionBackend
# .get_supported_head_sizes: 32 ... 256); a larger one is refused ("head_size not supported", vLLM PR #38824)
ROCM_ATTN_MAX_HEAD_SIZE = 256


def rocm_attn_query_tile(model: "ModelArch") -> int:
    """BLOCK_M of ROCM_ATTN's prefix-prefill kernel for `model`: 32 where vLLM enlarges the KV block to a
    hybrid model's recurrent-state page (not a power of two: Qwen3.5's 784 and 1,056 tokens, per the
    comment in vllm/v1/attention/backends/rocm_attn.py `get_supported_kernel_block_sizes`), else 128.
    (vLLM never serves an MLA model on ROCM_ATTN; StepCostModel refuses the pair.)"""
    return ROCM_ATTN_QUERY_TILE_NON_POW2_BLOCK if model.num_linear_attention_layers else ROCM_ATTN_QUERY_TILE


def query_tile_padding_flops(model: "ModelArch", new_tokens, context_tokens, tile: int):
    """Attention FLOPs a query-tiled prefill kernel spends on the padding rows of its last tile, per
    sequence: a sequence of n > 1 query tokens at context c (the n included) runs ceil(n / tile) tiles of
    `tile` rows, and each padding row walks the c - n cached tokens of every full-attention layer
    (min(c - n, window) of a sliding one) like a real query token. 0 for n <= 1 (the decode kernel) or
    tile 0. Left out: the padding rows' pass over the chunk's own n tokens (at most pad x n per layer,
    small beside a verification's cached context). Scalars in, a float out; arrays in, an array out."""
    if not tile:
        return 0.0 if np.ndim(new_tokens) == 0 else np.zeros(np.shape(new_tokens))
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(context_tokens, dtype=np.float64)
    pad = np.where(n > 1.0, np.ceil(n / tile) * tile - n, 0.0)
    prefix = np.maximum(c - n, 0.0)
    out = model.attn_flops_per_token_per_ctx * pad * prefix
    if model.swa_attn_flops_per_token_per_ctx:
        out = out + model.swa_attn_flops_per_token_per_ctx * pad * np.minimum(prefix, model.sliding_window)
    return float(out) if np.ndim(out) == 0 else out


class AttentionTables:
    """`arch.attention_flops` and `arch.kv_read_bytes` per sequence from TokenTables: decode-width
    chunks (q <= MAX_CHUNK tokens at context c), whole-prompt chunks (q = c) and KV bytes at c.
    Other chunks (the rest of a long prompt) and large batches are computed directly. Exact: the
    tables hold the function's own values."""

    MAX_CHUNK = 32
    SCALAR_REST = 16   # up to this many sequences off the tables are priced one by one in Python floats
    MAX_ROWS = 32

    def __init__(self, arch: ModelArch, query_tile: int = 0):
        self.arch = arch
        self.query_tile = int(query_tile)   # ROCM_ATTN's BLOCK_M (query_tile_padding_flops); 0: no padding
        self.kv = TokenTable(arch.kv_read_bytes)
        self._whole = TokenTable(lambda c: arch.attention_flops(c, c))   # no cached prefix: no padding priced
        self._chunk: dict[int, TokenTable] = {}
        self._chunk_lists: dict[int, list] = {}   # the decode-width tables' lists (TokenTable.lookup), by width

    def chunk(self, q: int) -> TokenTable:
        """attention_flops(q, c) over c (NaN below c = q, where a q-token chunk cannot end)."""
        table = self._chunk.get(q)
        if table is None:
            def fn(c: np.ndarray, q: int = q) -> np.ndarray:
                return np.where(c >= q, self.attention_flops(np.full(c.shape, q), np.maximum(c, q)), np.nan)
            table = self._chunk[q] = TokenTable(fn)
        return table

    def attention_flops(self, new_tokens, context_tokens):
        """arch.attention_flops plus the query-tile padding of the attention kernel (`query_tile`)."""
        flops = self.arch.attention_flops(new_tokens, context_tokens)
        if self.query_tile:
            flops = flops + query_tile_padding_flops(self.arch, new_tokens, context_tokens, self.query_tile)
        return flops

    def sums(self, new_tokens: list[int] | int, context_tokens: list[int]) -> tuple[float, float]:
        """(attention FLOPs, KV bytes read) summed over a few sequences (Python whole numbers; new_tokens
        may be one number for all), bit for bit float(flops(q, c).sum()) and float(kv[c].sum()):
        the tables' own values, summed in numpy's order (float_sum)."""
        if type(new_tokens) is int:
            if 0 <= new_tokens <= self.MAX_CHUNK:
                attn = self.chunk(new_tokens).lookup(context_tokens)
            else:
                attn = self.flops(np.full(len(context_tokens), new_tokens), np.array(context_tokens, dtype=np.int64)).tolist()
        else:
            attn = self._per_seq_flops(new_tokens, context_tokens)
        return float_sum(attn), float_sum(self.kv.lookup(context_tokens))

    def flops(self, new_tokens: np.ndarray | int, context_tokens: np.ndarray) -> np.ndarray:
        """arch.attention_flops(new_tokens, context_tokens) for 1-D whole-number arrays (new_tokens
        may be one number for every sequence)."""
        if isinstance(new_tokens, int):
            if new_tokens <= self.MAX_CHUNK:
                return self.chunk(new_tokens)[context_tokens]
            new_tokens = np.full(len(context_tokens), new_tokens)
        if len(new_tokens) > self.MAX_ROWS:
            return self.attention_flops(new_tokens, context_tokens)
        # a few sequences: looked up in plain Python (the tables' own values), one array at the end
        return np.array(self._per_seq_flops(new_tokens.tolist(), context_tokens.tolist()))

    def _per_seq_flops(self, new_tokens, context_tokens) -> list[float]:
        """Per-sequence attention FLOPs as Python floats: the whole-prompt or decode-width table's value
        where one applies, else arch.attention_flops for those sequences (prompt chunks, or invalid
        input, which the function reports)."""
        whole, lists = self._whole._list, self._chunk_lists
        if whole is not None:                   # the usual step: every value in a table's list already
            out: list[float] = []
            append = out.append
            try:
                for q, c in zip(new_tokens, context_tokens):
                    if q == c >= 0:
                        append(whole[c])
                    elif c >= q >= 0:
                        append(lists[q][c])     # KeyError: no list for this width (or wider than MAX_CHUNK)
                    else:
                        break
                else:
                    return out
            except (KeyError, IndexError, TypeError):   # c beyond a list, or not a whole number
                pass
        return self._slow_flops(new_tokens, context_tokens)

    def _slow_flops(self, new_tokens, context_tokens) -> list[float]:
        """_per_seq_flops when some value is not in a table's list (yet): grows the tables it needs."""
        out: list[float] = []
        rest: list[int] = []
        whole, chunk, max_chunk = self._whole, self._chunk, self.MAX_CHUNK
        for i, (q, c) in enumerate(zip(new_tokens, context_tokens)):
            if q == c >= 0:
                table = whole
            elif 0 <= q <= max_chunk and c >= q:
                table = chunk.get(q) or self.chunk(q)
            else:
                rest.append(i)
                out.append(0.0)
                continue
            try:
                out.append(table._list[c])
            except (TypeError, IndexError):                         # no list yet, or c beyond it
                out.append(table.lookup([c])[0])
        if 0 < len(rest) <= self.SCALAR_REST:   # a step's few prompt chunks: plain floats, same bits
            one, tile = self.arch.attention_flops_one, self.query_tile
            for i in rest:
                out[i] = one(new_tokens[i], context_tokens[i])
                if tile:
                    out[i] += query_tile_padding_flops(self.arch, new_tokens[i], context_tokens[i], tile)
        elif rest:
            direct = self.attention_flops(np.array([new_tokens[i] for i in rest], dtype=np.int64),
                                          np.array([context_tokens[i] for i in rest], dtype=np.int64))
            for i, v in zip(rest, np.asarray(direct, dtype=float).tolist()):
                out[i] = v
        if any(self._chunk_lists.get(q) is not t._list for q, t in chunk.items() if q <= max_chunk):
            self._chunk_lists = {q: t._list for q, t in chunk.items() if t._list is not None and q <= max_chunk}
        return out


def _whole_numbers(*arrays: np.ndarray) -> bool:
    return all(a.dtype.kind in "iu" for a in arrays)


@dataclass(frozen=True)
class StepFeatures:
    """What the step time depends on, per step (scalars, or arrays over many steps).

    Recording features instead of times lets calibration re-price a recorded schedule with new
    efficiency parameters without re-running the simulation (for a closed loop the schedule does
    not depend on step durations).
    """

    num_tokens: np.ndarray | float      # tokens in the forward pass
    num_seqs: np.ndarray | float        # sequences scheduled
    num_sampled: np.ndarray | float     # positions that need logits
    attn_flops: np.ndarray | float      # attention-score FLOPs, whole model (all TP ranks)
    kv_read_bytes: np.ndarray | float   # KV bytes read, whole model
    verify_seqs: np.ndarray | float = 0.0   # sequences verifying N > 0 drafts (their drafts: num_sampled - num_seqs)

    def as_tuple(self) -> tuple:
        return (self.num_tokens, self.num_seqs, self.num_sampled, self.attn_flops, self.kv_read_bytes,
                self.verify_seqs)

    @property
    def num_drafts(self) -> np.ndarray | float:
        """Draft tokens verified in the step (sampled positions beyond one per sequence; Python floats
        stay floats)."""
        if type(self.num_sampled) is float and type(self.num_seqs) is float:
            return max(self.num_sampled - self.num_seqs, 0.0)
        return np.maximum(np.asarray(self.num_sampled, dtype=float) - np.asarray(self.num_seqs, dtype=float), 0.0)

    def first(self, k: int) -> "StepFeatures":
        """The first k steps of a many-step record."""
        n = np.shape(self.num_tokens)
        return StepFeatures(*(np.broadcast_to(np.asarray(x), n)[:k] for x in self.as_tuple()))


NUM_FEATURES = len(fields(StepFeatures))
"""Columns of a recorded step (StepFeatures.as_tuple())."""


class StepCostModel:
    """Prices forward passes of one model on one GPU type at one tensor-parallel size."""

    def __init__(self, gpu: GpuProfile, model: ModelArch, tensor_parallel_size: int = 1,
                 verify_routing_exponent: float = VERIFY_ROUTING_EXPONENT,
                 state_snapshot_write_efficiency: float = STATE_SNAPSHOT_WRITE_EFFICIENCY,
                 model_runner: str = "v1", expert_parallel: bool = False, async_scheduling: bool = True,
                 quick_reduce_quantization: str = "none", attention_backend: str = "auto", moe_backend: str = "auto",
                 graph_max_tokens: int | None = None, int4_tiles: str = "auto"):
        self.gpu = gpu
        # vLLM's async scheduling: the host work of a step overlaps the GPU's (module docstring)
        self.async_scheduling = bool(async_scheduling)
        self.model = model
        self.tp = int(tensor_parallel_size)
        # expert parallelism over the tensor-parallel GPUs (module docstring); 1: experts are TP-sliced
        self.ep = self.tp if expert_parallel and model.num_moe_layers else 1
        self._ep_z = expected_max_std_normal(self.ep)
        self.verify_routing_exponent = float(verify_routing_exponent)
        self.state_snapshot_write_efficiency = float(state_snapshot_write_efficiency)
        # The profile's spec_seq_overhead_us is host work of vLLM's V1 model runner; the V2 runner
        # does that bookkeeping on the GPU (module docstring), so it is not charged there, except
        # for targets with linear-attention state, whose V2 runs still show it.
        self.model_runner = model_runner
        self.spec_host_scale = 0.0 if model_runner == "v2" and model.num_linear_attention_layers == 0 else 1.0
        self.efficiency = dict(gpu.efficiency)
        self._peak_dense = gpu.peak_tflops(model.dense_weight_dtype) * 1e12
        self._peak_expert = gpu.peak_tflops(model.compute_weight_dtype) * 1e12
        self._peak_attn = gpu.peak_tflops("bf16") * 1e12
        self.moe_efficiency_key = gpu.moe_efficiency_key(model.compute_weight_dtype)
        # W4A16_EXPERT_KERNEL: weight-only 4-bit experts on CUDA, stream and FLOPs at `moe_int4`
        self._w4a16_experts = bool(W4A16_EXPERT_KERNEL and not gpu.is_rocm and model.num_moe_layers
                                   and weight_format(model.compute_weight_dtype) in ("int4", "fp4")
                                   and gpu.compute_dtype(model.compute_weight_dtype) == "bf16")
        if self._w4a16_experts:
            self.moe_efficiency_key = "moe_int4"
        # weight-only int4 experts on ROCm run vLLM's Triton int4 kernel, which unpacks each expert's weights once per
        # block of its tokens (INT4_TRITON_BLOCK_M); CUDA runs Marlin's MoE, whose blocking is not modelled
        int4_triton = runs_int4_triton_moe(gpu, model)
        self._int4_weight_per_block = INT4_WEIGHT_PER_BLOCK and int4_triton
        # ... under the tiles vLLM ships tuned for this GPU and MoE shape, or under its default tiles, which stream the
        # experts `default_tiles_slowdown` times slower than the `moe_int4` rate (INT4_DEFAULT_TILES)
        # (engine.int4_moe_tiles: 'auto' reads the shipped table, 'tuned' / 'default' say what the server runs)
        if int4_tiles not in ("auto", "tuned", "default"):
            raise CapacityError(f"engine.int4_moe_tiles '{int4_tiles}' is not one of auto, tuned, default")
        untuned = int4_tiles == "default" if int4_tiles != "auto" else int4_default_tiles(gpu, model, self.tp, self.ep)
        self.int4_default_tiles = int4_triton and INT4_DEFAULT_TILES and untuned
        self._int4_stream_scale = 1.0 / int4_tile_table().default_tiles_slowdown if self.int4_default_tiles else 1.0
        # the attention kernel family (scenario engine.attention_backend; 'auto': GpuProfile.attention_efficiency_key)
        self.attention_key = (gpu.attention_efficiency_key(model) if attention_backend == "auto"
                              else ATTENTION_BACKEND_KEYS[attention_backend])
        # ROCM_ATTN pads every multi-token query to its prefix-prefill kernel's tile (module docstring)
        if attention_backend == "rocm" and not gpu.is_rocm:
            raise CapacityError(f"engine.attention_backend 'rocm' is vLLM's ROCM_ATTN, which runs on AMD Instinct GPUs "
                                f"only; {gpu.name} is not one: use auto, flash or triton")
        if attention_backend == "rocm" and model.uses_mla:
            raise CapacityError(f"engine.attention_backend 'rocm': vLLM serves an MLA model such as {model.name} on its "
                                "MLA backends, never on ROCM_ATTN: use auto")
        if attention_backend == "rocm" and model.largest_head_dim > ROCM_ATTN_MAX_HEAD_SIZE:
            raise CapacityError(f"engine.attention_backend 'rocm': vLLM's ROCM_ATTN takes head sizes up to "
                                f"{ROCM_ATTN_MAX_HEAD_SIZE} and {model.name} has {model.largest_head_dim} "
                                "(vLLM runs it on TRITON_ATTN): "
                                "use auto or triton")
        query_tile = rocm_attn_query_tile(model) if attention_backend == "rocm" else 0
        self._kv_split = 1 if model.uses_mla else self.tp
        self._expert_bw = gpu.expert_stream_bw_tb_s * 1e12   # expert weights stream at a rate the die sets
        self._allreduce_bw = gpu.allreduce_bandwidth_gb_s(self.tp) * 1e9   # bytes/s one GPU reaches its peers with
        # the fused-MoE kernels vLLM runs (scenario engine.moe_backend; 'auto': resolve_moe_backend)
        if moe_backend not in ("auto", "triton", "aiter"):
            raise CapacityError(f"engine.moe_backend '{moe_backend}' is not one of auto, triton, aiter")
        if moe_backend == "aiter" and not gpu.is_rocm:
            raise CapacityError(f"engine.moe_backend 'aiter' is AMD's AITER fused MoE, which vLLM runs on AMD Instinct "
                                f"GPUs only; {gpu.name} is not one: use auto or triton")
        if emulated_on(gpu, model.weight_precision):
            raise CapacityError(emulation_error(gpu, model.weight_precision))
        if emulated_dense_on(gpu, model.dense_weight_dtype):
            raise CapacityError(emulation_error(gpu, model.dense_weight_dtype))
        self.moe_backend = resolve_moe_backend(gpu, model) if moe_backend == "auto" else moe_backend
        self._layer_units = layer_overhead_units(model, gpu.kernels_per_dense_layer, self.moe_backend, gpu.is_rocm)
        # steps above this many tokens run without a graph and pay `eager_kernel_us` per kernel (module docstring);
        # None: every step replays a graph
        self.graph_max_tokens = graph_max_tokens
        self._kernels_per_pass = self._layer_units * (gpu.kernels_per_dense_layer or 0)
        if graph_max_tokens is not None and gpu.efficiency.get("eager_kernel_us") and not self._kernels_per_pass:
            raise CapacityError(_NO_KERNEL_COUNT.format(gpu=gpu.name))
        self._allreduce_algorithm = "vllm" if gpu.scaleup_links_per_gpu else "ring"   # opt-in (allreduce_traffic)
        self._quick_reduce = quick_reduce_rule(gpu.architecture, self.tp, quick_reduce_quantization)
        # the fabric's measured all-reduce latencies where it has them for this TP size (ALLREDUCE_MEASURED_LATENCY)
        self._allreduce_measured: tuple | None = None
        measured = measured_allreduce(gpu.name) if ALLREDUCE_MEASURED_LATENCY and self.tp > 1 else None
        if measured is not None and self.tp in measured.curves:
            codec = quick_reduce_quantization.lower() if self._quick_reduce is not None else None
            self._allreduce_measured = (measured, codec, self._quick_reduce[0] if codec else 0.0)
        # shape-dependent GEMM efficiency (module docstring), where the profile has a curve for the dtype
        dense_calls, expert_calls = gemm_calls(model)
        w_dense = gpu.gemm_w_half_flops(model.dense_weight_dtype)
        self._dense_curve = None if w_dense is None else (gpu.gemm_ceiling(model.dense_weight_dtype),
                                                          dense_calls * w_dense)
        w_expert = gpu.gemm_w_half_flops(model.compute_weight_dtype) if model.num_moe_layers else None
        self._expert_curve = None if w_expert is None else (gpu.gemm_ceiling(model.compute_weight_dtype),
                                                            expert_calls * w_expert)
        # fixed time per GEMM kernel beyond its roofline (a profile's opt-in `gemm_call_us`; module docstring)
        self._dense_call_s = dense_calls * gpu.gemm_call_us * 1e-6
        self._expert_call_s = expert_calls * gpu.gemm_call_us * 1e-6
        # vLLM's rounding of gpt-oss's expert width per rank on ROCm (GPT_OSS_ROCM_EXPERT_ROUNDING), expert-sliced only
        self._expert_pad = 1.0
        if GPT_OSS_ROCM_EXPERT_ROUNDING and gpu.is_rocm and model.model_type == "gpt_oss" and self.ep == 1:
            width = model.expert_intermediate_size / self.tp
            self._expert_pad = -(-width // GPT_OSS_ROCM_EXPERT_ROUNDING) * GPT_OSS_ROCM_EXPERT_ROUNDING / width
        # AITER's fused MoE from its measured kernel curve (AITER_MOE_KERNEL_CURVE), per layer on this GPU: the local
        # experts, routes per token, one expert's weight bytes and FLOPs per routed token at the width this GPU holds
        self._aiter_moe = None
        curve = moe_kernel_curve(gpu.architecture) if model.num_moe_layers else None
        compute = gpu.compute_dtype(model.compute_weight_dtype)
        kernel_format = f"{weight_format(model.compute_weight_dtype)} x {compute}"
        if (gpu.architecture in AITER_MOE_KERNEL_CURVE and self.moe_backend == "aiter" and curve is not None
                and (curve.measures(kernel_format) or not AITER_MOE_CURVE_MEASURED_FORMATS_ONLY)):
            split = self.tp if self.ep == 1 else 1
            curve = curve.for_kernel(kernel_format)
            self._aiter_moe = (curve, model.num_experts / self.ep, model.experts_per_token / self.ep,
                               self._expert_pad * model.expert_weight_bytes / split,
                               self._expert_pad * model.expert_flops_per_token
                               / (model.num_moe_layers * model.experts_per_token * split),
                               gpu.hbm_bandwidth_tb_s * 1e12, gpu.peak_tflops(model.compute_weight_dtype) * 1e12)
        self._lm_head_flops = 2.0 * model.params_lm_head
        self._dense_flops_per_token = model.dense_flops_per_token - self._lm_head_flops
        self.tables = AttentionTables(model, query_tile)
        self._shape_memo: dict[tuple[int, int], tuple] = {}   # decode_parts' constants per batch shape

    # ------------------------------------------------------------------ features
    def features(self, new_tokens: np.ndarray, context_tokens: np.ndarray,
                 num_sampled: float | None = None, num_spec: np.ndarray | None = None) -> StepFeatures:
        """new_tokens[i]: tokens sequence i contributes to this pass; context_tokens[i]: its context
        length at the end of the pass (prompt + output tokens computed, including these);
        num_spec[i]: the drafts among them that sequence i verifies (None: no speculation). Python
        lists are taken as whole numbers (the engine's steps)."""
        n = len(new_tokens)
        few = 0 < n <= AttentionTables.MAX_ROWS
        if few and type(new_tokens) is list and type(context_tokens) is list:
            q, c = new_tokens, context_tokens
        else:
            new_tokens = np.asarray(new_tokens)
            context_tokens = np.asarray(context_tokens)
            whole = n and _whole_numbers(new_tokens, context_tokens)
            few = few and whole
            if few:
                q, c = new_tokens.tolist(), context_tokens.tolist()
        if few:                                         # a few sequences: plain Python, the same bits
            attn_sum, kv_sum = self.tables.sums(q, c)
            if num_spec is not None and type(num_spec) is not list:
                num_spec = np.asarray(num_spec).tolist()
            return StepFeatures(
                num_tokens=float(sum(q)), num_seqs=float(n),
                num_sampled=float(n if num_sampled is None else num_sampled),
                attn_flops=attn_sum, kv_read_bytes=kv_sum,
                verify_seqs=float(sum([s > 0 for s in num_spec])) if num_spec is not None else 0.0)
        if whole:
            attn, kv = self.tables.flops(new_tokens, context_tokens), self.tables.kv[context_tokens]
        elif n:
            attn, kv = self.tables.attention_flops(new_tokens, context_tokens), self.model.kv_read_bytes(context_tokens)
        return StepFeatures(
            num_tokens=float(int_sum(new_tokens) if whole else new_tokens.sum()),
            num_seqs=float(n),
            num_sampled=float(n if num_sampled is None else num_sampled),
            attn_flops=float(_add_reduce(attn)) if n else 0.0,
            kv_read_bytes=float(_add_reduce(kv)) if n else 0.0,
            verify_seqs=float(int_sum(np.asarray(num_spec) > 0)) if num_spec is not None else 0.0,
        )

    def decode_features(self, context_tokens: np.ndarray, tokens_per_seq: int = 1) -> StepFeatures:
        """Features of many decode steps at once: context_tokens is (steps × sequences), each
        sequence contributing `tokens_per_seq` tokens per step (1 + N when verifying N drafts)."""
        k, b = context_tokens.shape
        m = self.model
        n = float(b * tokens_per_seq)
        if context_tokens.dtype.kind in "iu" and isinstance(tokens_per_seq, (int, np.integer)):
            attn, kv = self.tables.chunk(int(tokens_per_seq))[context_tokens], self.tables.kv[context_tokens]
        else:
            attn = self.tables.attention_flops(np.full(context_tokens.shape, tokens_per_seq), context_tokens)
            kv = m.kv_read_bytes(context_tokens)
        # the batch is the same in every step: only attention varies (the rest is one value for all)
        return StepFeatures(
            num_tokens=n, num_seqs=float(b), num_sampled=n,
            attn_flops=_add_reduce(attn, 1), kv_read_bytes=_add_reduce(kv, 1),
            verify_seqs=float(b if tokens_per_seq > 1 else 0))

    def routed_tokens(self, f: StepFeatures) -> np.ndarray | float:
        """Tokens that count for the distinct-expert term: each of the `verify_seqs` sequences'
        1 + N verification tokens counts as (1 + N)^rho (module docstring), N = drafts / verify_seqs."""
        n_tok = np.asarray(f.num_tokens, dtype=float)
        v = np.asarray(f.verify_seqs, dtype=float)
        drafts = f.num_drafts
        q = 1.0 + drafts / np.maximum(v, 1.0)
        return n_tok - np.where(v > 0, v * (q - q ** self.verify_routing_exponent), 0.0)

    def snapshot_bytes(self, f: StepFeatures) -> np.ndarray | float:
        """Recurrent-state bytes (whole model) verification stores beyond decode's one state per
        sequence: one state per verified draft (module docstring)."""
        m = self.model
        if not (m.num_linear_attention_layers and m.state_bytes_per_seq):
            return np.zeros_like(np.asarray(f.num_tokens, dtype=float))
        drafts = f.num_drafts
        return m.state_bytes_per_seq * drafts * (np.asarray(f.verify_seqs, dtype=float) > 0)

    # ------------------------------------------------------------------ pricing
    def time_parts(self, f: StepFeatures, efficiency: dict[str, float] | None = None,
                   with_overhead: bool = True) -> dict[str, np.ndarray | float]:
        """Seconds per component; works on scalars or on arrays of many steps (Python floats in,
        Python floats out)."""
        eff = self.efficiency if efficiency is None else efficiency
        return self._priced(self._shape_parts(f, eff, with_overhead), f, eff)

    def decode_parts(self, context_tokens: np.ndarray, tokens_per_seq: int) -> tuple[StepFeatures, dict]:
        """(features, time_parts) of many decode steps of one batch (context_tokens: steps x sequences,
        whole numbers; `tokens_per_seq` a whole number): the features as one value for all steps but
        the attention ones, as the engine records them, and `time_parts` of them, bit for bit. The parts
        that do not depend on attention are priced once per batch shape and kept (the same values)."""
        k, b = context_tokens.shape
        memo = self._shape_memo.get((b, tokens_per_seq))
        if memo is None:
            n = float(b * tokens_per_seq)
            f = StepFeatures(n, float(b), n, 0.0, 0.0, float(b if tokens_per_seq > 1 else 0))
            eff = self.efficiency
            bw = self.gpu.hbm_bandwidth_tb_s * 1e12 * eff["hbm"]
            memo = self._shape_memo[(b, tokens_per_seq)] = (
                f, self._shape_parts(f, eff, True), self.tables.chunk(tokens_per_seq), self.tables.kv,
                self.tp * self._peak_attn * self._attention_efficiency(eff),
                self._kv_split * bw * eff.get("kv_read", KV_READ_DEFAULT))
        f, shape, chunk, kv_table, attn_div, kv_div = memo
        attn, kv = _add_reduce(chunk[context_tokens], 1), _add_reduce(kv_table[context_tokens], 1)
        f = StepFeatures(f.num_tokens, f.num_seqs, f.num_sampled, attn, kv, f.verify_seqs)
        before, snapshot, after, overhead = shape
        # time_parts' arithmetic on arrays (attention_time, then _priced), without the intermediate copies
        attention = attn / attn_div
        np.maximum(attention, kv / kv_div, out=attention)
        if snapshot is not None:
            np.add(attention, snapshot, out=attention)
        parts = dict(before)
        parts["attention"] = attention
        if after:
            parts.update(after)
        kernels, host, spec = overhead
        if self.async_scheduling and HOST_OVERLAP:
            shown = sum(parts.values())
            np.add(shown, kernels, out=shown)
            np.subtract(host, shown, out=shown)
            np.maximum(shown, 0.0, out=shown)
            np.add(kernels, shown, out=shown)
            parts["overhead"] = np.add(shown, spec, out=shown)
        else:
            parts["overhead"] = kernels + host + spec
        return f, parts

    def _shape_parts(self, f: StepFeatures, eff: dict[str, float], with_overhead: bool) -> tuple:
        """What `time_parts` computes from everything but the attention features: (the parts before
        attention, the recurrent-state snapshot term added to it or None, the parts after it, the
        overhead's (kernels, host, speculative host) or None)."""
        m, tp = self.model, self.tp
        bw = self.gpu.hbm_bandwidth_tb_s * 1e12 * eff["hbm"]
        n_tok = _float_or_array(f.num_tokens)
        dense_flops = self._dense_flops_per_token * n_tok + self._lm_head_flops * _float_or_array(f.num_sampled)
        if self._dense_curve is None:
            dense_compute_s = dense_flops / (tp * self._peak_dense * eff["gemm"])
        else:
            ceiling, extra = self._dense_curve
            if GEMM_TILE_M_HALF:
                dense_flops = dense_flops + GEMM_TILE_M_HALF * (self._dense_flops_per_token + self._lm_head_flops) * (n_tok > 0)
            dense_compute_s = (dense_flops / tp + extra) / (self._peak_dense * eff["gemm"] * ceiling)
        before: dict[str, np.ndarray | float] = {
            "dense_gemm": fast_maximum(dense_compute_s, m.dense_weight_bytes / (tp * bw)),
        }
        if self._dense_call_s:
            before["dense_gemm"] = before["dense_gemm"] + self._dense_call_s
        if m.num_moe_layers:
            routed = self.routed_tokens(f)
            experts = expected_distinct_experts(m.num_experts, m.experts_per_token, routed)
            # the grouped GEMM's compute at `moe`; its weight reads at the expert kernel's own efficiency
            # (`moe_int4` for weight-only int4 experts: module docstring), the same `moe` for every other format
            moe, moe_stream = eff["moe"], eff[self.moe_efficiency_key] * self._int4_stream_scale
            if self._w4a16_experts:
                moe = moe_stream
            pad = self._expert_pad
            if self._aiter_moe is not None:
                # AITER's measured kernel per layer (aiter_moe_layer_s), the two sides scaled to the busiest GPU
                # where experts are split (EP)
                curve, local, k_local, expert_bytes, flops_rt, hbm, peak = self._aiter_moe
                bytes_s, flops_s = aiter_moe_parts_s(curve, n_tok, local, k_local, expert_bytes, flops_rt, hbm, peak)
                if self.ep > 1:
                    flops_s, bytes_s = self._busiest_expert_gpu(flops_s, bytes_s, n_tok, experts)
                floor_s = m.num_moe_layers * curve.floor_us * 1e-6 * (n_tok > 0)
                flops_s, bytes_s = m.num_moe_layers * flops_s, m.num_moe_layers * bytes_s
            elif self._expert_curve is None:
                flops_s = pad * m.expert_flops_per_token * n_tok / (tp * self._peak_expert * eff["gemm"] * moe)
                if MOE_TILE_PADDING:
                    flops_s = flops_s * self._tile_padding(routed, n_tok)
                if MOE_M_HALF:
                    per_expert = routed * m.experts_per_token / np.maximum(experts, 1e-12)   # routed tokens per touched expert
                    flops_s = flops_s * (per_expert + MOE_M_HALF) / np.maximum(per_expert, 1e-12)
            else:
                ceiling, extra = self._expert_curve
                flops_s = (pad * m.expert_flops_per_token * n_tok / tp + extra) / (self._peak_expert * eff["gemm"] * ceiling * moe)
            if self._aiter_moe is None:
                # at a fraction of the bandwidth the expert efficiencies refer to (GpuProfile.expert_stream_bw_tb_s),
                # never faster than this GPU's own HBM
                stream = min(self._expert_bw * moe_stream, self.gpu.hbm_bandwidth_tb_s * 1e12) * eff["hbm"]
                # the weight panels the kernel works through: one per touched expert, or one per block of each
                # expert's tokens where the kernel unpacks them per block (vLLM's Triton int4 MoE on ROCm,
                # INT4_TRITON_BLOCK_M)
                panels = experts
                if self._int4_weight_per_block:
                    panels = expected_expert_blocks(m.num_experts, m.experts_per_token, routed,
                                                    int4_triton_block_m(n_tok))
                bytes_s = pad * m.num_moe_layers * panels * m.expert_weight_bytes / (tp * stream)
                if self.ep > 1:
                    flops_s, bytes_s = self._busiest_expert_gpu(flops_s, bytes_s, n_tok, experts)
            per_token = eff.get("moe_token_overhead_ns", 0.0)
            if self.moe_backend == "aiter":
                # AITER's fused MoE beyond its kernel curve (`aiter_moe_token_overhead_ns`): the untuned defaults that
                # the rows' images ran for these models' shapes (capacity/data/moe_kernel_curves.yaml header;
                # docs/seed_validation.md section 46)
                per_token = per_token + eff.get("aiter_moe_token_overhead_ns", 0.0)
            token_s = 0.0
            if per_token:
                # work every TP rank repeats for every token and each expert it is routed to, in each MoE layer
                # (routing, sorting, the tokens' gather and scatter; docs/seed_validation.md section 31): not
                # divided by TP
                routed = n_tok * m.num_moe_layers * (m.experts_per_token if MOE_TOKEN_COST_PER_EXPERT else 1)
                if MOE_TOKEN_COST_SPLIT_BY_EP:
                    routed = routed / self.ep
                token_s = per_token * 1e-9 * routed
            compute_side = bool(MOE_TOKEN_COST_COMPUTE_SIDE and per_token)
            if self._aiter_moe is None:
                before["moe_gemm"] = np.maximum(flops_s + token_s if compute_side else flops_s, bytes_s)
            else:
                before["moe_gemm"] = floor_s + roofline_join(bytes_s, flops_s + token_s if compute_side else flops_s)
            if self._expert_call_s and self._aiter_moe is None:
                before["moe_gemm"] = before["moe_gemm"] + self._expert_call_s
            if per_token and not compute_side:
                before["moe_gemm"] = before["moe_gemm"] + token_s
        snapshot = None
        if m.num_linear_attention_layers:
            snapshot = self.snapshot_bytes(f) / (tp * bw * self.state_snapshot_write_efficiency)
        after: dict[str, np.ndarray | float] = {}
        if tp > 1:
            seconds = 2 * m.num_layers * self._allreduce_call_s(n_tok * m.hidden_size * ACTIVATION_BYTES, eff)
            if m.qk_norm == "per_layer":     # one more, tiny, per layer (QK_NORM_ALLREDUCE_BYTES_PER_TOKEN)
                seconds = seconds + m.num_layers * self._allreduce_call_s(n_tok * QK_NORM_ALLREDUCE_BYTES_PER_TOKEN, eff)
            after["allreduce"] = seconds * (n_tok > 0)
        overhead = None
        if with_overhead:
            kernels = self.layer_kernels_s(eff)
            spec = (eff.get("spec_seq_overhead_us", 0.0) * self.spec_host_scale * 1e-6 * _float_or_array(f.verify_seqs)
                    + eff.get("spec_token_overhead_us", 0.0) * 1e-6 * f.num_drafts)
            host = eff["step_overhead_ms"] * 1e-3 + eff["per_seq_overhead_us"] * 1e-6 * _float_or_array(f.num_seqs)
            launches = self._ungraphed_launches_s(n_tok, eff)
            if launches is not None:
                if EAGER_HOST_OVERLAP:
                    host = host + launches
                else:
                    kernels = kernels + launches
            overhead = (kernels, host, spec)
        return before, snapshot, after, overhead

    def _tile_padding(self, routed, n_tok):
        """Padded expert rows over routed expert rows of a step of `n_tok` tokens, `routed` of them counting for the
        experts (routed_tokens) (MOE_TILE_PADDING), at least 1."""
        m = self.model
        mean = np.asarray(n_tok, dtype=float) * m.experts_per_token / m.num_experts   # tokens per expert
        block_m = np.full(mean.shape, MOE_TILE_BLOCKS_M[-1])
        for b in reversed(MOE_TILE_BLOCKS_M):
            block_m = np.where(mean / b < 0.9, b, block_m)
        blocks = expected_expert_blocks(m.num_experts, m.experts_per_token, routed, block_m)
        rows = np.maximum(np.asarray(routed, dtype=float) * m.experts_per_token, 1e-9)
        return np.maximum(blocks * block_m / rows, 1.0)

    def _ungraphed_launches_s(self, n_tok, eff: dict[str, float]):
        """Host time launching the kernels of steps too large for a captured graph (`eager_kernel_us` per kernel;
        module docstring), per step; None where the term is off (no value, or no capture size given)."""
        eager = eff.get("eager_kernel_us", 0.0)
        if not eager or self.graph_max_tokens is None:
            return None
        if not self._kernels_per_pass:
            raise CapacityError(_NO_KERNEL_COUNT.format(gpu=self.gpu.name))
        return eager * 1e-6 * self._kernels_per_pass * (n_tok > self.graph_max_tokens)

    def layer_kernels_s(self, efficiency: dict[str, float] | None = None) -> float:
        """Fixed GPU time of one forward pass's layer kernels (the kernels part of the "overhead" time part):
        `layer_overhead_us` times the layer units this model's layers count (`layer_overhead_units`)."""
        eff = self.efficiency if efficiency is None else efficiency
        return eff["layer_overhead_us"] * 1e-6 * self._layer_units

    def _allreduce_call_s(self, message_bytes, eff: dict[str, float]):
        """Seconds of one tensor-parallel all-reduce of `message_bytes`: the fabric's measured latency on vLLM's path
        (measured_allreduce_s) over `efficiency.allreduce` where the fabric has one, else the scale-up latency plus
        the bytes each GPU moves (allreduce_bytes: vLLM's algorithm or the ring, QuickReduce where it applies) over
        its bandwidth."""
        if self._allreduce_measured is not None:
            measured, codec, quick_min = self._allreduce_measured
            return measured_allreduce_s(message_bytes, measured, self.tp, codec, quick_min) / eff["allreduce"]
        seconds = (self.gpu.scaleup_latency_us * 1e-6
                   + allreduce_bytes(message_bytes, self.tp, self._allreduce_algorithm, self._quick_reduce)
                   / (self._allreduce_bw * eff["allreduce"]))
        if LARGE_ALLREDUCE_BUSBW_GB_S and self.tp in NCCL_FROM_BYTES:
            large = (self.gpu.scaleup_latency_us * 1e-6
                     + 2.0 * (self.tp - 1) / self.tp * message_bytes / (LARGE_ALLREDUCE_BUSBW_GB_S * 1e9))
            seconds = np.where(np.asarray(message_bytes) >= NCCL_FROM_BYTES[self.tp], large, seconds)
            if np.ndim(seconds) == 0:
                seconds = float(seconds)
        return seconds

    def _priced(self, shape: tuple, f: StepFeatures, eff: dict[str, float]) -> dict[str, np.ndarray | float]:
        """`time_parts` from its `_shape_parts` and the step's attention features."""
        before, snapshot, after, overhead = shape
        parts = dict(before)
        attention = self.attention_time(f.attn_flops, f.kv_read_bytes, eff)
        parts["attention"] = attention if snapshot is None else attention + snapshot
        if after:
            parts.update(after)
        if overhead is not None:
            kernels, host, spec = overhead
            if self.async_scheduling and HOST_OVERLAP:
                # the forward pass lasts max(GPU, host): only host time the GPU does not cover shows
                host = fast_maximum(host - (sum(parts.values()) + kernels), 0.0)
            parts["overhead"] = kernels + host + spec
        return parts

    def _busiest_expert_gpu(self, flops_s, bytes_s, n_tok, experts):
        """The mean per-GPU MoE times scaled to the busiest of the EP GPUs (module docstring)."""
        m, ep, z = self.model, self.ep, self._ep_z
        local = m.num_experts / ep                                   # experts per GPU
        p = np.clip(experts / m.num_experts, 1e-12, 1.0)             # chance an expert is touched
        touched = np.minimum(local, local * p + z * np.sqrt(local * p * (1.0 - p)))
        assignments = np.maximum(n_tok * m.experts_per_token, 1.0)   # token-expert pairs, all GPUs
        return (flops_s * (1.0 + z * np.sqrt((ep - 1) / assignments)),
                bytes_s * touched / (local * p))

    def attention_time(self, attn_flops: np.ndarray | float, kv_read_bytes: np.ndarray | float,
                       efficiency: dict[str, float] | None = None) -> np.ndarray | float:
        """Seconds of attention: its FLOPs at the attention peak or its KV reads at HBM bandwidth,
        whichever takes longer (the 'attention' part of `time_parts`)."""
        eff = self.efficiency if efficiency is None else efficiency
        bw = self.gpu.hbm_bandwidth_tb_s * 1e12 * eff["hbm"]
        return fast_maximum(_float_or_array(attn_flops) / (self.tp * self._peak_attn * self._attention_efficiency(eff)),
                            _float_or_array(kv_read_bytes) / (self._kv_split * bw * eff.get("kv_read", KV_READ_DEFAULT)))

    def _attention_efficiency(self, eff: dict[str, float]) -> float:
        """The attention kernels' efficiency for this model (`attention_key`); a mapping without
        `attention_triton` (an older override or screen) gives the `attention` value, as a profile without one does."""
        return eff.get(self.attention_key, eff["attention"])

    def total_time(self, f: StepFeatures, efficiency: dict[str, float] | None = None) -> np.ndarray | float:
        return sum(self.time_parts(f, efficiency).values())

    def forward(self, new_tokens: np.ndarray, context_tokens: np.ndarray,
                num_sampled: float | None = None, with_overhead: bool = True) -> StepTime:
        """Time of one forward pass, by component."""
        parts = self.time_parts(self.features(new_tokens, context_tokens, num_sampled), with_overhead=with_overhead)
        return StepTime({k: float(v) for k, v in parts.items()})

    def step_time_s(self, new_tokens: np.ndarray, context_tokens: np.ndarray,
                    num_sampled: float | None = None) -> float:
        return self.forward(new_tokens, context_tokens, num_sampled).total_s
