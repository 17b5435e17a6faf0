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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from capacity.hardware import GpuProfile
    from capacity.models import ModelArch

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


@dataclass(frozen=True)
class StepTime:
    """A step's time in seconds, by component (COMPONENTS). `total_s` is their sum."""

    parts_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return float(sum(self.parts_s.values()))

    def __add__(self, other: "StepTime") -> "StepTime":
        keys = set(self.parts_s) | set(other.parts_s)
        return StepTime({k: self.parts_s.get(k, 0.0) + other.parts_s.get(k, 0.0) for k in keys})


def expected_distinct_experts(num_experts: int, experts_per_token: int,
                              num_tokens: np.ndarray | float) -> np.ndarray | float:
    """Expected number of distinct experts a layer touches for `num_tokens` routed tokens
    (scalar or array). Uniform routing: E · (1 − (1 − k/E)^n) (modelling_notes §3.1, [S21][S22])."""
    if num_experts <= 0:
        return np.zeros_like(num_tokens, dtype=float)
    n = np.maximum(num_tokens, 0.0)
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** n)


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

    def first(self, k: int) -> "StepFeatures":
        """The first k steps of a many-step record."""
        n = np.shape(self.num_tokens)
        return StepFeatures(*(np.broadcast_to(np.asarray(x), n)[:k] for x in self.as_tuple()))


class StepCostModel:
    """Prices forward passes of one model on one GPU type at one tensor-parallel size."""

    def __init__(self, gpu: GpuProfile, model: ModelArch, tensor_parallel_size: int = 1,
                 verify_routing_exponent: float = VERIFY_ROUTING_EXPONENT,
                 state_snapshot_write_efficiency: float = STATE_SNAPSHOT_WRITE_EFFICIENCY):
        self.gpu = gpu
        self.model = model
        self.tp = int(tensor_parallel_size)
        self.verify_routing_exponent = float(verify_routing_exponent)
        self.state_snapshot_write_efficiency = float(state_snapshot_write_efficiency)
        self.efficiency = dict(gpu.efficiency)
        self._peak_dense = gpu.peak_tflops(model.dense_weight_dtype) * 1e12
        self._peak_expert = gpu.peak_tflops(model.compute_weight_dtype) * 1e12
        self._peak_attn = gpu.peak_tflops("bf16") * 1e12
        self._kv_split = 1 if model.uses_mla else self.tp
        self._lm_head_flops = 2.0 * model.params_lm_head
        self._dense_flops_per_token = model.dense_flops_per_token - self._lm_head_flops

    # ------------------------------------------------------------------ features
    def features(self, new_tokens: np.ndarray, context_tokens: np.ndarray,
                 num_sampled: float | None = None, num_spec: np.ndarray | None = None) -> StepFeatures:
        """new_tokens[i]: tokens sequence i contributes to this pass; context_tokens[i]: its context
        length at the end of the pass (prompt + output tokens computed, including these);
        num_spec[i]: the drafts among them that sequence i verifies (None: no speculation)."""
        new_tokens = np.asarray(new_tokens)
        context_tokens = np.asarray(context_tokens)
        n = len(new_tokens)
        return StepFeatures(
            num_tokens=float(new_tokens.sum()),
            num_seqs=float(n),
            num_sampled=float(n if num_sampled is None else num_sampled),
            attn_flops=float(np.sum(self.model.attention_flops(new_tokens, context_tokens))) if n else 0.0,
            kv_read_bytes=float(np.sum(self.model.kv_read_bytes(context_tokens))) if n else 0.0,
            verify_seqs=float(np.count_nonzero(np.asarray(num_spec) > 0)) if num_spec is not None else 0.0,
        )

    def decode_features(self, context_tokens: np.ndarray, tokens_per_seq: int = 1) -> StepFeatures:
        """Features of many decode steps at once: context_tokens is (steps × sequences), each
        sequence contributing `tokens_per_seq` tokens per step (1 + N when verifying N drafts)."""
        k, b = context_tokens.shape
        m = self.model
        n = float(b * tokens_per_seq)
        return StepFeatures(
            num_tokens=np.full(k, n), num_seqs=np.full(k, float(b)), num_sampled=np.full(k, n),
            attn_flops=m.attention_flops(np.full(context_tokens.shape, tokens_per_seq), context_tokens).sum(axis=1),
            kv_read_bytes=m.kv_read_bytes(context_tokens).sum(axis=1),
            verify_seqs=np.full(k, float(b if tokens_per_seq > 1 else 0)))

    def routed_tokens(self, f: StepFeatures) -> np.ndarray | float:
        """Tokens that count for the distinct-expert term: each of the `verify_seqs` sequences'
        1 + N verification tokens counts as (1 + N)^rho (module docstring), N = drafts / verify_seqs."""
        n_tok = np.asarray(f.num_tokens, dtype=float)
        v = np.asarray(f.verify_seqs, dtype=float)
        drafts = np.maximum(np.asarray(f.num_sampled, dtype=float) - np.asarray(f.num_seqs, dtype=float), 0.0)
        q = 1.0 + drafts / np.maximum(v, 1.0)
        return n_tok - np.where(v > 0, v * (q - q ** self.verify_routing_exponent), 0.0)

    def snapshot_bytes(self, f: StepFeatures) -> np.ndarray | float:
        """Recurrent-state bytes (whole model) verification stores beyond decode's one state per
        sequence: one state per verified draft (module docstring)."""
        m = self.model
        if not (m.num_linear_attention_layers and m.state_bytes_per_seq):
            return np.zeros_like(np.asarray(f.num_tokens, dtype=float))
        drafts = np.maximum(np.asarray(f.num_sampled, dtype=float) - np.asarray(f.num_seqs, dtype=float), 0.0)
        return m.state_bytes_per_seq * drafts * (np.asarray(f.verify_seqs, dtype=float) > 0)

    # ------------------------------------------------------------------ pricing
    def time_parts(self, f: StepFeatures, efficiency: dict[str, float] | None = None,
                   with_overhead: bool = True) -> dict[str, np.ndarray | float]:
        """Seconds per component; works on scalars or on arrays of many steps."""
        eff = self.efficiency if efficiency is None else efficiency
        m, tp = self.model, self.tp
        bw = self.gpu.hbm_bandwidth_tb_s * 1e12 * eff["hbm"]
        n_tok = np.asarray(f.num_tokens, dtype=float)
        dense_flops = self._dense_flops_per_token * n_tok + self._lm_head_flops * np.asarray(f.num_sampled, dtype=float)
        parts: dict[str, np.ndarray | float] = {
            "dense_gemm": np.maximum(dense_flops / (tp * self._peak_dense * eff["gemm"]),
                                     m.dense_weight_bytes / (tp * bw)),
        }
        if m.num_moe_layers:
            experts = expected_distinct_experts(m.num_experts, m.experts_per_token, self.routed_tokens(f))
            parts["moe_gemm"] = np.maximum(
                m.expert_flops_per_token * n_tok / (tp * self._peak_expert * eff["gemm"] * eff["moe"]),
                m.num_moe_layers * experts * m.expert_weight_bytes / (tp * bw * eff["moe"]))
        parts["attention"] = np.maximum(
            np.asarray(f.attn_flops, dtype=float) / (tp * self._peak_attn * eff["attention"]),
            np.asarray(f.kv_read_bytes, dtype=float) / (self._kv_split * bw))
        if m.num_linear_attention_layers:
            parts["attention"] = parts["attention"] + self.snapshot_bytes(f) / (
                tp * bw * self.state_snapshot_write_efficiency)
        if tp > 1:
            message = n_tok * m.hidden_size * ACTIVATION_BYTES
            ring = 2.0 * (tp - 1) / tp
            one = (self.gpu.scaleup_latency_us * 1e-6
                   + ring * message / (self.gpu.scaleup_bandwidth_gb_s * 1e9 * eff["allreduce"]))
            parts["allreduce"] = 2 * m.num_layers * one * (n_tok > 0)
        if with_overhead:
            parts["overhead"] = (eff["step_overhead_ms"] * 1e-3
                                 + eff["layer_overhead_us"] * 1e-6 * m.num_layers
                                 + eff["per_seq_overhead_us"] * 1e-6 * np.asarray(f.num_seqs, dtype=float))
        return parts

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
