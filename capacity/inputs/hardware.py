"""GPU hardware profiles: load, validate, override and save the YAML files in `hw_profiles/`.

One YAML file per GPU (schema in `hw_profiles/README.md`). Every leaf is a mapping
`{value, unit?, basis, source, note?, fitted_on?}` so each number carries its provenance; the
loader turns a file into a frozen `GpuProfile` of plain numbers plus a `provenance` map from the
dotted key (``"peak_dense_tflops.fp8"``, ``"efficiency.gemm"``) to the `Sourced` record.

Units: GB = 1e9 bytes, TB/s = 1e12 bytes/s, GB/s = 1e9 bytes/s, TFLOPS = 1e12 FLOP/s, dense
(no sparsity). Scale-up bandwidth is per GPU and unidirectional.

Problems a user can fix (unknown GPU, malformed YAML, bad override) raise `CapacityError` with a
one-line message that names the file and the key.
"""

from __future__ import annotations

import csv
import functools

import datetime as _dt
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from capacity.errors import CapacityError
from capacity.paths import data_dir, hw_profiles_dir
from capacity.util.text import quote
from capacity.inputs import safe_yaml

EFFICIENCY_KEYS = ("gemm", "moe", "moe_int4", "hbm", "attention", "attention_triton", "allreduce", "step_overhead_ms",
                   "per_seq_overhead_us", "layer_overhead_us", "request_overhead_ms", "prompt_token_overhead_us",
                   "moe_token_overhead_ns", "aiter_moe_token_overhead_ns", "eager_kernel_us",
                   "spec_seq_overhead_us", "spec_token_overhead_us")
"""Parameters of the step-cost model; `capacity calibrate` replaces them with fitted values."""

HOST_EFFICIENCY_KEYS = ("step_overhead_ms", "per_seq_overhead_us", "request_overhead_ms", "eager_kernel_us")
"""The efficiency keys that are the host's time rather than the GPU's: the engine's work per step and per sequence,
the API server's delay per request, and the launches of a step without a captured graph. They depend on the server's
CPU and software, which a serving row does not record (docs/seed_validation.md section 52)."""

FRACTION_EFFICIENCY_KEYS = ("gemm", "moe", "moe_int4", "hbm", "attention", "attention_triton", "allreduce")
"""The efficiency keys that are fractions in (0, 1] (`allreduce` up to its measured ceiling,
`efficiency_ceiling`); the others are overheads (>= 0)."""

PEAK_DTYPES = ("bf16", "fp8", "fp6", "fp4")
"""Tensor-core data types a profile may list under `peak_dense_tflops` (bf16 is required)."""

GEMM_CURVE_MEASURED = {"bf16": "gemm_bf16_tflops", "fp8": "gemm_fp8_tflops"}
"""The measured max-achievable GEMM rate that is the ceiling of a `gemm_curve.<dtype>` entry (the
curve is defined only for the dtypes a max-achievable-FLOPS measurement exists for)."""

MEASURED_KEYS = (
    "gemm_bf16_tflops",
    "gemm_fp8_tflops",
    "hbm_stream_tb_s",
    "allreduce_busbw_gb_s",
    "flash_attention_tflops",
)

SCALAR_KEYS = (
    "hbm_capacity_gb",
    "hbm_bandwidth_tb_s",
    "scaleup_bandwidth_gb_s",
    "scaleup_latency_us",
    "scaleup_world_size",
    "board_power_w",
    "cost_per_gpu_hour_usd",
)

OPTIONAL_SCALAR_KEYS = ("scaleup_links_per_gpu", "kernels_per_dense_layer", "gemm_call_us", "hbm_runtime_gib",
                        "expert_stream_bandwidth_tb_s")
"""Scalar keys a profile may leave out. `hbm_runtime_gib`: the device memory the runtime reports
(`torch.cuda.mem_get_info()` total, which vLLM multiplies by gpu_memory_utilization), in GiB; absent: the
vendor's `hbm_capacity_gb` read as 1e9 bytes (conservative). `scaleup_links_per_gpu`: the GPU's scale-up links in a full mesh (one
direct link per peer, e.g. AMD Infinity Fabric on an 8-GPU platform: 7), so a tensor-parallel group of t GPUs
uses only t - 1 of them; absent: a switched fabric (NVLink through NVSwitch) where every GPU reaches its peers
through its whole scale-up bandwidth at any group size. `kernels_per_dense_layer`: opt-in, the kernels a dense
decoder layer launches (9, counted from vLLM's model code); with it `efficiency.layer_overhead_us` is the fixed
time of a dense layer's kernels and a MoE layer counts by its own kernels (step_cost.layer_overhead_units).
`gemm_call_us`: the fixed time of one GEMM kernel in a graph-replayed step beyond its roofline (the intercept of a
serving-shape GEMM sweep, time = gemm_call_us + max(compute, weight bytes)); each of a step's GEMM calls
(step_cost.gemm_calls) pays it; absent: 0. `expert_stream_bandwidth_tb_s`: the bandwidth the expert (MoE) kernels'
weight-streaming efficiencies `moe` and `moe_int4` are fractions of; absent: the profile's own `hbm_bandwidth_tb_s`.
A family transfer sets it to the sibling's, because those kernels stream at a rate set by the die, not by HBM
(`expert_stream_bw_tb_s`)."""

_SCALAR_ORDER = ("hbm_capacity_gb", "hbm_runtime_gib",
                 *SCALAR_KEYS[1:SCALAR_KEYS.index("scaleup_world_size") + 1], "scaleup_links_per_gpu",
                 "kernels_per_dense_layer", "gemm_call_us", "expert_stream_bandwidth_tb_s", *SCALAR_KEYS[SCALAR_KEYS.index("scaleup_world_size") + 1:])
"""Every scalar key in the order of the YAML files (the optional ones beside the keys they qualify)."""

OVERRIDE_BASIS = "override"
OVERRIDE_SOURCE = "user override (GpuProfile.with_overrides)"
FITTED_BASIS = "fitted"
TRANSFERRED_BASIS = "transferred from"
"""Basis prefix of an efficiency taken from a sibling GPU of the same family (`family_transfer`)."""

# vLLM on ROCm runs a model with attention sinks (gpt-oss) in a Triton unified-attention kernel, prefill and decode
# alike: PR #36702 (merged 2026-03, "[ROCm] Attention selector reordering": "AITER_UNIFIED - a variation of TRITON_ATTN,
# specifically tuned for ROCm. Will fall back here when the model requires sinks (GPT-OSS)"; ROCM_ATTN reports no sink
# support because it would fall back to a Triton implementation), and InferenceX's 2025 gpt-oss scripts on MI300X and
# MI355X set VLLM_USE_AITER_UNIFIED_ATTENTION=1 with VLLM_ROCM_USE_AITER_MHA=0 (capacity/data/measurements/
# serve_recipes.yaml). Its efficiency is `attention_triton`. Any other model is priced on the flash-attention kernels
# (`attention`: ROCM_AITER_FA for MHA/GQA, the CK-tile FlashAttention fallback for MLA prefill, vLLM PR #45033) unless
# its scenario says engine.attention_backend: triton (MI300X's Llama-3.3-70B series, serve_recipes.yaml) or rocm
# (vLLM's ROCM_ATTN, the ROCm default from vLLM 0.19 where no --attention-backend is given: its multi-token queries run
# a Triton prefix-prefill kernel, so `attention_triton` too, with the query-tile padding capacity/cost/step_cost.py
# prices; the seed article's Qwen targets ran it, capacity/data/measurements/seed_serve_flags.yaml says why they are
# simulated on 'auto').
TRITON_ATTENTION_ARCHS = ("gfx9",)
ATTENTION_BACKEND_KEYS = {"flash": "attention", "triton": "attention_triton", "rocm": "attention_triton"}
"""The efficiency entry of each scenario `engine.attention_backend` other than 'auto'."""
_TRITON_ATTENTION_DEFAULT = ("no separate measurement: the `attention` value (the FlashAttention kernels' efficiency); "
                             "calibrated where rows of a model with attention sinks on this GPU exist")
_MOE_TOKEN_DEFAULT = ("none: a TP-independent cost per routed token (token x expert) of MoE layers is not assumed "
                      "unless calibrated")
_AITER_MOE_TOKEN_DEFAULT = ("none: no time per routed token of AITER's fused MoE beyond its kernel curve is assumed "
                            "unless calibrated")
_EAGER_KERNEL_DEFAULT = ("none: a host time per kernel of a step too large for vLLM's captured graphs is not assumed "
                         "unless calibrated")
# The optional efficiency entries that are 0 where a profile states none: {key: (unit, source of that default)}
_ZERO_DEFAULTS = {"moe_token_overhead_ns": ("ns", _MOE_TOKEN_DEFAULT),
                  "aiter_moe_token_overhead_ns": ("ns", _AITER_MOE_TOKEN_DEFAULT),
                  "eager_kernel_us": ("us", _EAGER_KERNEL_DEFAULT)}
FITTED_SOURCE = "capacity calibrate"

_SCHEMA_HINT = "schema: hw_profiles/README.md"

# The unit each key must carry when a `unit` is given (the unit is optional; the key name says it).
_EXPECTED_UNIT = {
    "peak_dense_tflops": "TFLOPS",
    "hbm_capacity_gb": "GB",
    "hbm_bandwidth_tb_s": "TB/s",
    "scaleup_bandwidth_gb_s": "GB/s",
    "scaleup_latency_us": "us",
    "scaleup_world_size": "GPUs",
    "scaleup_links_per_gpu": "links",
    "kernels_per_dense_layer": "kernels",
    "gemm_call_us": "us",
    "expert_stream_bandwidth_tb_s": "TB/s",
    "hbm_runtime_gib": "GiB",
    "board_power_w": "W",
    "cost_per_gpu_hour_usd": "USD/GPU-hour",
    "measured.gemm_bf16_tflops": "TFLOPS",
    "measured.gemm_fp8_tflops": "TFLOPS",
    "measured.hbm_stream_tb_s": "TB/s",
    "measured.allreduce_busbw_gb_s": "GB/s",
    "measured.flash_attention_tflops": "TFLOPS",
    "efficiency.gemm": "fraction",
    "efficiency.moe": "fraction",
    "efficiency.moe_int4": "fraction",
    "efficiency.layer_overhead_us": "us",
    "efficiency.request_overhead_ms": "ms",
    "efficiency.prompt_token_overhead_us": "us",
    "efficiency.moe_token_overhead_ns": "ns",
    "efficiency.aiter_moe_token_overhead_ns": "ns",
    "efficiency.eager_kernel_us": "us",
    "efficiency.hbm": "fraction",
    "efficiency.attention": "fraction",
    "efficiency.attention_triton": "fraction",
    "efficiency.allreduce": "fraction",
    "efficiency.step_overhead_ms": "ms",
    "efficiency.per_seq_overhead_us": "us",
    "efficiency.spec_seq_overhead_us": "us",
    "efficiency.spec_token_overhead_us": "us",
    "gemm_curve": "GFLOP",
}

# Weight dtype spellings -> family. See GpuProfile.compute_dtype for the rule.
_DTYPE_FAMILY = {
    **dict.fromkeys(("bf16", "bfloat16", "fp16", "float16", "half", "f16"), "16bit"),
    **dict.fromkeys(
        ("fp8", "float8", "fp8_e4m3", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_e5m2", "e4m3", "e5m2", "mxfp8", "w8a8_fp8",
         "w4a8", "mxfp4_w4a8"),
        "fp8",
    ),
    **dict.fromkeys(("int8", "w8a8", "w8a8_int8"), "int8"),
    **dict.fromkeys(("fp6", "mxfp6", "fp6_e2m3", "fp6_e3m2"), "fp6"),
    **dict.fromkeys(("w4a4", "mxfp4_w4a4", "nvfp4_w4a4", "fp4_w4a4"), "fp4"),
    **dict.fromkeys(("int4", "uint4", "w4a16", "awq", "gptq", "w8a16", "fp4", "mxfp4", "nvfp4", "fp4_e2m1"),
                    "weight_only"),
}

_INT4_DTYPES = ("int4", "uint4", "w4a16", "awq", "gptq")
# Weight dtype spellings whose stored weights are not their family's: 4-bit weights under 8-bit activations, 8-bit
# integer weights served weight-only.
_WEIGHT_FORMAT = {**dict.fromkeys(("w4a8", "mxfp4_w4a8"), "fp4"), "w8a16": "int8"}
_FAMILY_WEIGHT_FORMAT = {"16bit": "bf16", "fp8": "fp8", "int8": "int8", "fp6": "fp6", "fp4": "fp4"}


def weight_format(weight_dtype: str) -> str:
    """How weights of `weight_dtype` are stored, whatever the GEMM computes in: bf16, fp8, int8, fp6, fp4 or int4
    (mxfp4, nvfp4 and their w4a4 / w4a8 forms are fp4; AWQ / GPTQ / w4a16 int4). With `GpuProfile.compute_dtype` it
    names a kernel, e.g. "fp4 x bf16" for MXFP4 experts with bf16 activations."""
    key = _normalise_dtype(weight_dtype)
    if key in _WEIGHT_FORMAT:
        return _WEIGHT_FORMAT[key]
    family = _DTYPE_FAMILY.get(key)
    if family is None:
        raise CapacityError(f"unknown weight dtype '{weight_dtype}'; use one of: {', '.join(sorted(_DTYPE_FAMILY))}")
    if family == "weight_only":
        return "int4" if key in _INT4_DTYPES else "fp4"
    return _FAMILY_WEIGHT_FORMAT[family]


@dataclass(frozen=True)
class Sourced:
    """One number with where it came from (`basis` e.g. 'vendor spec', 'measured', 'assumed', 'fitted')."""

    value: float
    basis: str
    source: str
    unit: str | None = None
    note: str | None = None
    fitted_on: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "unit": self.unit,
            "basis": self.basis,
            "source": self.source,
            "note": self.note,
            "fitted_on": self.fitted_on,
        }


@dataclass(frozen=True)
class GpuProfile:
    """A GPU's specifications, measured figures and step-cost efficiencies, with provenance.

    Build one with `load_gpu`; change one with `with_overrides` (the dict fields are plain dicts
    for convenience: treat them as read-only).
    """

    name: str
    vendor: str
    architecture: str
    peak_dense_tflops: dict[str, float]
    hbm_capacity_gb: float
    hbm_bandwidth_tb_s: float
    scaleup_bandwidth_gb_s: float
    scaleup_latency_us: float
    scaleup_world_size: int
    board_power_w: float
    cost_per_gpu_hour_usd: float
    measured: dict[str, float]
    efficiency: dict[str, float]
    provenance: dict[str, Sourced]
    path: str
    gemm_curve: dict[str, float] = field(default_factory=dict)
    """Opt-in shape-dependent GEMM efficiency (`gemm_curve` section of the YAML): compute dtype ->
    W_half in FLOPs. Where a GEMM's compute dtype has an entry, a GEMM call of W FLOPs (per GPU)
    reaches efficiency.gemm x ceiling x W / (W + W_half) of peak, ceiling = the measured max-achievable
    rate / peak (`gemm_ceiling`), and `efficiency.gemm` is a multiplier on that measured curve (1 =
    the microbenchmark). Empty: every GEMM at efficiency.gemm of peak, as before."""
    scaleup_links_per_gpu: int = 0
    """Direct scale-up links per GPU of a full mesh (OPTIONAL_SCALAR_KEYS); 0: a switched fabric."""
    hbm_runtime_gib: float = 0.0
    """Device memory as the runtime reports it, GiB (OPTIONAL_SCALAR_KEYS); 0: not stated."""
    kernels_per_dense_layer: int = 0
    """Opt-in kernel count of a dense layer that weighs the per-layer overhead by structure (OPTIONAL_SCALAR_KEYS); 0: per layer."""
    gemm_call_us: float = 0.0
    """Fixed time of one GEMM kernel beyond its roofline, us (OPTIONAL_SCALAR_KEYS); 0: none."""
    expert_stream_bandwidth_tb_s: float = 0.0
    """Bandwidth the expert kernels' streaming efficiencies are fractions of (OPTIONAL_SCALAR_KEYS); 0: own HBM."""
    cross_validation: dict[str, Any] = field(default_factory=dict)
    """How far the fitted efficiencies are off on rows kept out of their fit (the YAML's `cross_validation`
    section, `_CrossValidationModel`; written by `capacity calibrate`); empty: not measured (no serving rows,
    a family transfer, or values changed since)."""
    transfer_check: dict[str, Any] = field(default_factory=dict)
    """A transferred profile's check on its own serving rows (the YAML's `family_transfer.checked_on`,
    `_TransferCheckModel`): the sibling's values' error there, no refit; empty: no rows, or values changed since."""

    def runtime_memory_bytes(self) -> float:
        """Device memory in bytes as the runtime reports it (what vLLM multiplies by
        gpu_memory_utilization): `hbm_runtime_gib` where the profile states it, else the vendor's
        `hbm_capacity_gb` read as 1e9 bytes."""
        return self.hbm_runtime_gib * 2 ** 30 if self.hbm_runtime_gib else self.hbm_capacity_gb * 1e9

    def efficiency_ceiling(self, key: str) -> float:
        """The largest value fraction efficiency `key` can physically take (`efficiency_ceiling`)."""
        return efficiency_ceiling(key, self.provenance)

    def gemm_ceiling(self, dtype: str) -> float:
        """Measured max-achievable GEMM rate over dense peak of the compute dtype a GEMM on `dtype`
        weights runs in (the asymptote of the gemm curve)."""
        compute = self.compute_dtype(dtype)
        return self.measured[GEMM_CURVE_MEASURED[compute]] / self.peak_dense_tflops[compute]

    def gemm_w_half_flops(self, dtype: str) -> float | None:
        """W_half (FLOPs) of the gemm curve for GEMMs on `dtype` weights; None: no curve for its compute dtype."""
        w = self.gemm_curve.get(self.compute_dtype(dtype))
        return None if w is None else w * 1e9

    @property
    def is_rocm(self) -> bool:
        """Whether vLLM serves this GPU on ROCm (an AMD Instinct, TRITON_ATTENTION_ARCHS), where its ROCm attention
        backends and their selection rules apply."""
        return any(a in self.architecture for a in TRITON_ATTENTION_ARCHS)

    @property
    def expert_stream_bw_tb_s(self) -> float:
        """Bandwidth (TB/s) that `efficiency.moe` / `moe_int4` are fractions of for expert weight streaming:
        the profile's own HBM bandwidth, or for a family transfer the sibling's (the step cost caps the
        resulting rate at this GPU's own HBM bandwidth).

        Why: vLLM's fused-MoE kernels at decode (a few tokens per expert) do not reach HBM bandwidth and
        stream at a rate the die sets. Measured on Hopper (capacity/data/measurements/serving_vllm.csv,
        InferenceX, same model, TP, load): gpt-oss-120b (vLLM v0.18.0) decodes at H100 / H200 TPOT 1.01-1.06 in
        24 of 28 matched rows at 1-8k prompts, 4-64 users and TP 2-8 (1.13-1.76 in four at 1k), where the dense
        Llama-3.3-70B FP8 shows 1.12-1.32 (one saturated row aside; HBM 4.8 / 3.35 = 1.43); MiniMax-M2.5 FP8 at TP4
        is no faster on H200 (v0.16.0) than on H100 (v0.18.0) in 9 of 10 matched rows. So a sibling's fitted expert
        efficiency carries over as the same bytes per second, not the same fraction of a different HBM
        (docs/seed_validation.md section 29)."""
        return self.expert_stream_bandwidth_tb_s or self.hbm_bandwidth_tb_s

    def allreduce_bandwidth_gb_s(self, tensor_parallel_size: int) -> float:
        """Scale-up bandwidth (GB/s, one direction) one GPU of a t-GPU tensor-parallel group can use to reach
        the others: on a full mesh the t - 1 links to its peers (scaleup_bandwidth_gb_s is all links
        together), on a switched fabric all of it at any t."""
        links = self.scaleup_links_per_gpu
        if links <= 0:
            return self.scaleup_bandwidth_gb_s
        return self.scaleup_bandwidth_gb_s * min(max(int(tensor_parallel_size) - 1, 1), links) / links

    def compute_dtype(self, weight_dtype: str) -> str:
        """The tensor-core dtype (a key of `peak_dense_tflops`) that a GEMM on weights of `weight_dtype` runs in.

        Rule: a quantized format runs natively when the GPU has tensor cores for it; otherwise the
        weights are dequantized in the kernel and the GEMM runs in bf16 (weight-only quantization).
          * bf16 / fp16 -> "bf16" (fp16 runs at the bf16 rate on every profiled GPU);
          * fp8 / mxfp8 (any e4m3/e5m2 spelling) -> "fp8" if the GPU has fp8, else "bf16";
          * int8 W8A8 -> "fp8" if the GPU has fp8, else "bf16" (int8 TOPS equal fp8 TFLOPS on
            every profiled GPU, hw_specs.csv peak_dense_int8 rows);
          * fp6 / mxfp6 -> "fp6" if the GPU has fp6 (MI355X, B200), else "bf16";
          * fp4 / mxfp4 / nvfp4 weights -> "bf16": served weight-only (activations stay bf16,
            w4a16), which is ASSUMED for vLLM's MXFP4 checkpoints. Evidence: fitting MI355X to the
            InferenceX vLLM rows with native fp4 compute drove the GEMM efficiency to 0.09 and the
            attention efficiency to its bound 1.0; with bf16 compute the fit gives 0.34 and 0.23,
            close to the measured flash-attention ratio 0.25. Spell "w4a4" (or mxfp4_w4a4) for
            checkpoints that also quantize activations: they run in "fp4" where the GPU has it (a ROCm GPU without
            it emulates mxfp4_w4a4, and every ROCm GPU emulates nvfp4 / nvfp4_w4a4, which the step cost refuses:
            step_cost.emulated_on); "mxfp4_w4a8"
            (or w4a8: 4-bit weights, 8-bit activations, e.g. vLLM's FlashInfer MXFP4 x MXFP8 MoE) runs in "fp8";
          * int4 / AWQ / GPTQ / w4a16 / w8a16 -> "bf16" (weight-only quantization).
        Unknown spellings raise CapacityError.
        """
        key = _normalise_dtype(weight_dtype)
        family = _DTYPE_FAMILY.get(key)
        if family is None:
            known = ", ".join(sorted(_DTYPE_FAMILY))
            raise CapacityError(f"unknown weight dtype '{weight_dtype}'; use one of: {known}")
        if family == "16bit" or family == "weight_only":
            return "bf16"
        native = "fp8" if family == "int8" else family
        return native if native in self.peak_dense_tflops else "bf16"

    def attention_efficiency_key(self, model: Any) -> str:
        """The efficiency entry for `model`'s attention FLOPs on this GPU: `attention_triton` where vLLM runs its
        Triton unified-attention kernel, `attention` (the flash-attention kernels) everywhere else. Triton runs
        a model with attention sinks on ROCm (TRITON_ATTENTION_ARCHS), and a model whose full-attention layers
        have another head size than its sliding ones (Gemma 4: 512 and 256) on any GPU: vLLM forces TRITON_ATTN
        for all its layers when no backend is named, because FlashAttention and ROCM_ATTN take head sizes up to
        256 (vllm/model_executor/models/config.py `Gemma4Config.verify_and_update_config`; newer vLLM picks
        FA4 instead where it is available). A profile without `attention_triton` prices it at `attention`."""
        if self.is_rocm and getattr(model, "attention_sinks", False):
            return "attention_triton"
        full, sliding = getattr(model, "full_head_dim", 0), getattr(model, "head_dim", 0)
        if full and sliding and full != sliding and getattr(model, "num_sliding_attention_layers", 0):
            return "attention_triton"
        return "attention"

    def moe_efficiency_key(self, expert_weight_dtype: str) -> str:
        """The efficiency entry that scales the weight streaming of expert (MoE) GEMMs on weights of this
        dtype: `moe_int4` for integer 4-bit weight-only experts (compressed-tensors/AWQ/GPTQ W4A16: vLLM's
        triton int4 grouped GEMM, which unpacks every weight tile in registers; its FLOPs run at `moe`,
        capacity/cost/step_cost.py), `moe` for every other format."""
        return "moe_int4" if _normalise_dtype(expert_weight_dtype) in _INT4_DTYPES else "moe"

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak TFLOPS of the tensor-core dtype a GEMM on `dtype` weights runs in (see compute_dtype)."""
        return self.peak_dense_tflops[self.compute_dtype(dtype)]

    def with_overrides(self, **changes: Any) -> GpuProfile:
        """A copy with some values replaced, e.g. ``with_overrides(efficiency={"gemm": 0.6}, cost_per_gpu_hour_usd=2.0)``.

        Scalar keys take a number; `peak_dense_tflops`, `measured` and `efficiency` take a mapping
        of the entries to replace (the others are kept). Overridden values get basis 'override'. A new
        `hbm_capacity_gb` without a new `hbm_runtime_gib` scales the runtime-reported memory with it.
        Unknown keys or out-of-range values raise CapacityError.
        """
        provenance = dict(self.provenance)
        allowed = SCALAR_KEYS + OPTIONAL_SCALAR_KEYS + ("peak_dense_tflops", "measured", "efficiency", "gemm_curve")
        for key, new in changes.items():
            if key not in allowed:
                raise CapacityError(
                    f"cannot override '{key}' of GPU {self.name}; overridable keys: {', '.join(allowed)}"
                )
            if key in SCALAR_KEYS + OPTIONAL_SCALAR_KEYS:
                provenance[key] = _override_record(self.provenance.get(key), key, new, self.name)
                continue
            if not isinstance(new, Mapping):
                raise CapacityError(
                    f"override '{key}' of GPU {self.name} must be a mapping such as {{'{_first_subkey(key)}': 0.5}}, "
                    f"got {new!r}"
                )
            valid = {"peak_dense_tflops": PEAK_DTYPES, "measured": MEASURED_KEYS, "efficiency": EFFICIENCY_KEYS,
                     "gemm_curve": tuple(GEMM_CURVE_MEASURED)}[key]
            for sub, sub_value in new.items():
                if sub not in valid:
                    raise CapacityError(
                        f"cannot override '{key}.{sub}' of GPU {self.name}; valid entries: {', '.join(valid)}"
                    )
                dotted = f"{key}.{sub}"
                provenance[dotted] = _override_record(self.provenance.get(dotted), dotted, sub_value, self.name)
        if "hbm_capacity_gb" in changes and "hbm_runtime_gib" not in changes and self.hbm_runtime_gib:
            # the runtime-reported memory follows a new capacity in the profile's own proportion
            scaled = self.hbm_runtime_gib * float(changes["hbm_capacity_gb"]) / self.hbm_capacity_gb
            provenance["hbm_runtime_gib"] = _override_record(self.provenance.get("hbm_runtime_gib"), "hbm_runtime_gib",
                                                             scaled, self.name)
        _check_values(provenance, where=f"override of GPU {self.name}")
        # the cross-validated errors describe the profile's own efficiencies, not overridden ones
        changed = "efficiency" in changes or "gemm_curve" in changes
        return _profile_from_provenance(self.name, self.vendor, self.architecture, provenance, self.path,
                                        {} if changed else self.cross_validation, {} if changed else self.transfer_check)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable view (values and provenance), e.g. for `capacity hardware --json`."""
        return {
            "name": self.name,
            "vendor": self.vendor,
            "architecture": self.architecture,
            "peak_dense_tflops": dict(self.peak_dense_tflops),
            "hbm_capacity_gb": self.hbm_capacity_gb,
            "hbm_bandwidth_tb_s": self.hbm_bandwidth_tb_s,
            "scaleup_bandwidth_gb_s": self.scaleup_bandwidth_gb_s,
            "scaleup_latency_us": self.scaleup_latency_us,
            "scaleup_world_size": self.scaleup_world_size,
            "scaleup_links_per_gpu": self.scaleup_links_per_gpu,
            "kernels_per_dense_layer": self.kernels_per_dense_layer,
            "gemm_call_us": self.gemm_call_us,
            "expert_stream_bandwidth_tb_s": self.expert_stream_bw_tb_s,
            "hbm_runtime_gib": self.hbm_runtime_gib,
            "board_power_w": self.board_power_w,
            "cost_per_gpu_hour_usd": self.cost_per_gpu_hour_usd,
            "measured": dict(self.measured),
            "efficiency": dict(self.efficiency),
            "gemm_curve": dict(self.gemm_curve),
            "provenance": {key: record.as_dict() for key, record in self.provenance.items()},
            "cross_validation": dict(self.cross_validation),
            "transfer_check": dict(self.transfer_check),
            "path": self.path,
        }


# ----------------------------------------------------------------------------------------------
# Public functions


@dataclass(frozen=True)
class MeasuredAllreduce:
    """Measured latency of one all-reduce on a GPU's scale-up fabric (capacity/data/measurements/allreduce_latency.yaml):
    per tensor-parallel size and path (custom, rccl, fp, int8, int6, int4), the message sizes in bytes and the
    latency in us at each."""

    fabric: str
    curves: dict[int, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]]
    custom_measured_tps: tuple[int, ...] = ()    # the TP sizes whose `custom` path is measured (not the `fp` stand-in)


ALLREDUCE_LATENCY_FILE = "allreduce_latency.yaml"


@functools.lru_cache(maxsize=None)
def measured_allreduce(gpu_name: str) -> MeasuredAllreduce | None:
    """The measured all-reduce latencies that apply to `gpu_name` (the fabric whose `gpus` list names it), or None.
    The `custom` path comes from the rows of `custom_from` whose kernel is vLLM's custom all-reduce, at the TP sizes
    they cover; elsewhere it is the table's `fp` column (the file's header says why; below vLLM's one-shot limit the
    cost model derives it instead, step_cost.custom_allreduce_curve)."""
    folder = data_dir() / "measurements"
    doc = yaml.safe_load((folder / ALLREDUCE_LATENCY_FILE).read_text())
    for fabric, entry in doc["fabrics"].items():
        if gpu_name not in entry["gpus"]:
            continue
        sizes = tuple(float(x) for x in entry["sizes_bytes"])
        curves: dict[int, dict[str, tuple[tuple[float, ...], tuple[float, ...]]]] = {}
        for tp, paths in entry["latency_us"].items():
            for path, values in paths.items():
                if len(values) != len(sizes):
                    raise CapacityError(f"{ALLREDUCE_LATENCY_FILE}: {fabric} TP{tp} {path} has {len(values)} "
                                        f"latencies for {len(sizes)} sizes; give one per size")
            curves[int(tp)] = {path: (sizes, tuple(float(v) for v in values)) for path, values in paths.items()}
            curves[int(tp)]["custom"] = curves[int(tp)]["fp"]
        ref = entry.get("custom_from")
        measured_tps: tuple[int, ...] = ()
        if ref:
            with open(folder / ref["file"], newline="") as f:
                rows = [r for r in csv.DictReader(f) if r["gpu"] == ref["gpu"]
                        and r["kernel"].startswith("vLLM custom all-reduce")]
            measured_tps = tuple(sorted({int(r["tp"]) for r in rows} & set(curves)))
            for tp in measured_tps:
                pts = sorted((float(r["message_bytes"]), float(r["time_us"])) for r in rows if int(r["tp"]) == tp)
                curves[tp]["custom"] = (tuple(x for x, _ in pts), tuple(y for _, y in pts))
        return MeasuredAllreduce(fabric, curves, measured_tps)
    return None


MOE_KERNEL_CURVES_FILE = "moe_kernel_curves.yaml"


@dataclass(frozen=True)
class MoeKernelCurve:
    """AITER's fused-MoE kernel time per MoE layer on one AMD architecture, fitted to AITER's own tuned kernel times
    (capacity/data/moe_kernel_curves.yaml; scripts/fit_moe_kernel_curve.py): a floor, the touched experts' weights
    streamed at `stream` of HBM peak, their FLOPs at `compute` of the activations' dtype peak times m / (m + m_half)
    for m routed tokens per touched expert (capacity/cost/step_cost.py `aiter_moe_layer_s`). `formats`: the kernels
    AITER's tables timed, as "WEIGHTS x ACTIVATIONS" storage formats (`weight_format` x `compute_dtype`, e.g.
    "fp8 x fp8"); another pairing runs another kernel, which the curve does not price (empty: every pairing).
    `compute_by_format`: a pairing's own compute fraction where its kernel is not the bf16 / FP8 one `compute` was
    fitted on (MXFP4 weights under MXFP4, bf16 or FP8 activations: other kernels, other tiles)."""
    floor_us: float
    stream: float
    compute: float
    m_half: float
    formats: tuple[str, ...] = ()
    compute_by_format: tuple[tuple[str, float], ...] = ()

    def measures(self, kernel_format: str) -> bool:
        """Whether AITER's tables timed the kernel of this "WEIGHTS x ACTIVATIONS" pairing (`formats`)."""
        return not self.formats or kernel_format in self.formats

    def for_kernel(self, kernel_format: str) -> "MoeKernelCurve":
        """This curve with the compute fraction of the "WEIGHTS x ACTIVATIONS" pairing's kernel as `compute`."""
        own = dict(self.compute_by_format).get(kernel_format)
        return self if own is None else replace(self, compute=own)


@functools.lru_cache(maxsize=None)
def moe_kernel_curve(architecture: str) -> MoeKernelCurve | None:
    """The AITER fused-MoE curve of `architecture` (a profile's `architecture`, e.g. 'CDNA3 (gfx942)'), or None where
    none was measured. A GPU takes its architecture's curve with its own datasheet peaks: family transfer."""
    path = data_dir() / MOE_KERNEL_CURVES_FILE
    if not path.exists():
        return None
    entry = (yaml.safe_load(path.read_text()) or {}).get(architecture)
    if entry is None:
        return None
    own = (entry.get("compute_by_format") or {}).get("value") or {}
    return MoeKernelCurve(*(float(entry[k]["value"]) for k in ("floor_us", "stream", "compute", "m_half")),
                          formats=tuple(entry.get("formats", {}).get("value", ())),
                          compute_by_format=tuple((k, float(v)) for k, v in sorted(own.items())))


INT4_MOE_CONFIGS_FILE = "vllm_int4_moe_configs.yaml"


@dataclass(frozen=True)
class Int4TileTable:
    """vLLM's tuned tile files for its Triton int4 (W4A16) MoE kernel on ROCm (capacity/data/vllm_int4_moe_configs.yaml):
    the (GPU, local experts, expert width per GPU) shapes that have one, and how much slower the default tiles run."""
    default_tiles_slowdown: float
    tuned: frozenset[tuple[str, int, int]]

    def has_tuned(self, gpu_name: str, experts: int, expert_width: int) -> bool:
        """Whether vLLM ships tuned int4_w4a16 tiles for this GPU and MoE shape."""
        return (gpu_name.lower(), int(experts), int(expert_width)) in self.tuned


@functools.lru_cache(maxsize=None)
def int4_tile_table() -> Int4TileTable:
    """The shipped table of vLLM's tuned int4 MoE tiles (Int4TileTable)."""
    data = yaml.safe_load((data_dir() / INT4_MOE_CONFIGS_FILE).read_text())
    return Int4TileTable(float(data["default_tiles_slowdown"]["value"]),
                        frozenset((str(t["gpu"]).lower(), int(t["experts"]), int(t["expert_width"]))
                                  for t in data.get("tuned") or ()))


def load_gpu(name_or_path: str | os.PathLike[str]) -> GpuProfile:
    """Load a shipped profile by case-insensitive name ("mi300x", "H100 SXM") or any profile YAML by path."""
    text = os.fspath(name_or_path).strip()
    if looks_like_path(text):
        path = Path(text).expanduser()
        if not path.is_file():
            raise CapacityError(
                f"hardware profile file '{text}' not found; pass the path of an existing YAML "
                f"or a known GPU name ({', '.join(_known_profiles())})"
            )
        return _load_file(path)
    known = _known_profiles()
    wanted = _normalise_name(text)
    for name, path in known.items():
        if _normalise_name(name) == wanted:
            return _load_file(path)
    raise CapacityError(
        f"unknown GPU '{text}'; known GPUs: {', '.join(known)}; or pass the path of a profile YAML"
    )


def list_gpus() -> list[GpuProfile]:
    """Every shipped profile, sorted by name."""
    return sorted((_load_file(path) for path in _known_profiles().values()), key=lambda p: p.name)


def save_profile(
    profile: GpuProfile,
    path: str | os.PathLike[str],
    fitted: Mapping[str, float],
    fitted_on: str,
    cross_validation: Mapping[str, Any] | None = None,
) -> None:
    """Write `profile` as a YAML in the profile schema, with the efficiency entries in `fitted` replaced.

    Replaced entries get basis 'fitted', source 'capacity calibrate', `fitted_on` = the given text
    (what they were fitted on) and a note with the previous value; every other value, source and
    note is kept. `cross_validation` (the `_CrossValidationModel` fields) is written as the file's
    errors out of sample; None writes none, since the old profile's figures do not describe new values.
    The written file loads with `load_gpu(path)`.
    """
    if not isinstance(fitted_on, str) or not fitted_on.strip():
        raise CapacityError("save_profile needs fitted_on: a non-empty text saying what the values were fitted on")
    provenance = dict(profile.provenance)
    for key, value in fitted.items():
        if key not in EFFICIENCY_KEYS:
            raise CapacityError(f"cannot save fitted value '{key}'; fitted keys must be among: {', '.join(EFFICIENCY_KEYS)}")
        dotted = f"efficiency.{key}"
        old = profile.provenance[dotted]
        provenance[dotted] = Sourced(
            value=_as_number(value, dotted, where=f"fitted values for GPU {profile.name}"),
            basis=FITTED_BASIS,
            source=FITTED_SOURCE,
            unit=old.unit,
            # keep the pre-calibration anchor (a measured ratio or an assumption) across refits
            note=old.note if old.basis == FITTED_BASIS and old.note else
            f"before calibration: {old.value:g} ({old.basis}: {old.source})",
            fitted_on=fitted_on.strip(),
        )
    _check_values(provenance, where=f"fitted values for GPU {profile.name}")
    document = _yaml_document(profile.name, profile.vendor, profile.architecture, provenance)
    if cross_validation:
        document["cross_validation"] = _valid_cross_validation(dict(cross_validation),
                                                               f"cross_validation section for GPU {profile.name}")
    header = (
        f"# GPU profile {profile.name} written by capacity.inputs.hardware.save_profile.\n"
        f"# Efficiency entries with basis 'fitted' were fitted on: {' '.join(fitted_on.split())}\n"
        f"# Every other value and source is copied from {profile.path}. Schema: hw_profiles/README.md\n"
    )
    out = Path(path).expanduser()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120))
    except OSError as exc:
        raise CapacityError(f"cannot write hardware profile '{out}': {exc.strerror or exc}; choose a writable path") from exc


# ----------------------------------------------------------------------------------------------
# YAML schema (pydantic): structure and types. Ranges, units and allowed sub-keys are checked by
# _check_values so that the same checks apply to files, overrides and fitted values.


def _coerce_text(value: Any) -> Any:
    """YAML turns unquoted dates and numbers into non-strings; accept them as text."""
    if isinstance(value, (_dt.date, _dt.datetime)) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return str(value)
    return value


class _LeafModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    value: float = Field(allow_inf_nan=False)
    unit: str | None = None
    basis: str = Field(min_length=1)
    source: str = ""
    note: str | None = None
    fitted_on: str | None = None

    @field_validator("unit", "basis", "source", "note", "fitted_on", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return _coerce_text(value)


class _EfficiencyModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gemm: _LeafModel
    moe: _LeafModel
    moe_int4: _LeafModel
    hbm: _LeafModel
    attention: _LeafModel
    attention_triton: _LeafModel | None = None   # optional: absent = the `attention` value (_TRITON_ATTENTION_DEFAULT)
    allreduce: _LeafModel
    step_overhead_ms: _LeafModel
    per_seq_overhead_us: _LeafModel
    layer_overhead_us: _LeafModel
    request_overhead_ms: _LeafModel
    prompt_token_overhead_us: _LeafModel
    moe_token_overhead_ns: _LeafModel | None = None   # optional: absent = 0 (_MOE_TOKEN_DEFAULT)
    aiter_moe_token_overhead_ns: _LeafModel | None = None   # optional: absent = 0 (_AITER_MOE_TOKEN_DEFAULT)
    eager_kernel_us: _LeafModel | None = None   # optional: absent = 0 (_EAGER_KERNEL_DEFAULT)
    spec_seq_overhead_us: _LeafModel
    spec_token_overhead_us: _LeafModel


class _FamilyTransferModel(BaseModel):
    """`family_transfer: {from: MI300X, reason: ..., source: ..., checked_on: ...}`: take every `efficiency` entry
    from a sibling GPU of the same architecture family (see `family_of`); `checked_on`, where this GPU has serving
    rows, records the sibling's values' error on them (no refit)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_gpu: str = Field(alias="from", min_length=1, strict=True)
    reason: str = Field(min_length=1, strict=True)
    source: str = ""
    checked_on: "_TransferCheckModel | None" = None


class _ErrorFiguresModel(BaseModel):
    """Median and p90 of |predicted - measured| / measured, in %, per metric (vllm bench serve's)."""

    model_config = ConfigDict(extra="forbid")

    output_tok_s_per_gpu_pct: tuple[float, float]
    tpot_pct: tuple[float, float]
    ttft_pct: tuple[float, float]


class _TransferCheckModel(BaseModel):
    """`family_transfer.checked_on:` the transferred values' error on this GPU's own serving rows, with no refit
    (nothing of this GPU was fitted, so every row is out of sample)."""

    model_config = ConfigDict(extra="forbid")

    measured_by: str = Field(min_length=1, strict=True)   # the command and date
    sibling_fit: str = Field(min_length=1, strict=True)   # the sibling's cross_validation.measured_by then
    rows: int = Field(ge=1)
    models: list[str] = Field(min_length=1)                # HF ids of the models the rows measure
    tensor_parallel_sizes: list[int] = Field(min_length=1)
    errors: _ErrorFiguresModel


_FamilyTransferModel.model_rebuild()


class _CrossValidationModel(BaseModel):
    """`cross_validation:` how far the profile's fitted efficiencies are off on serving rows kept out of their fit."""

    model_config = ConfigDict(extra="forbid")

    measured_by: str = Field(min_length=1, strict=True)   # the command and date, where the figures are recorded
    rows: int = Field(ge=1)
    models: list[str] = Field(min_length=1)                # HF ids of the models fitted on
    tensor_parallel_sizes: list[int] = Field(min_length=1)
    leave_one_model_out: _ErrorFiguresModel | None = None
    leave_one_tp_size_out: _ErrorFiguresModel | None = None
    fitted_rows: _ErrorFiguresModel


class _ProfileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, strict=True)
    vendor: str = Field(min_length=1, strict=True)
    architecture: str = Field(min_length=1, strict=True)
    peak_dense_tflops: dict[str, _LeafModel]
    hbm_capacity_gb: _LeafModel
    hbm_bandwidth_tb_s: _LeafModel
    scaleup_bandwidth_gb_s: _LeafModel
    scaleup_latency_us: _LeafModel
    scaleup_world_size: _LeafModel
    scaleup_links_per_gpu: _LeafModel | None = None
    kernels_per_dense_layer: _LeafModel | None = None
    gemm_call_us: _LeafModel | None = None
    expert_stream_bandwidth_tb_s: _LeafModel | None = None
    hbm_runtime_gib: _LeafModel | None = None
    board_power_w: _LeafModel
    cost_per_gpu_hour_usd: _LeafModel
    measured: dict[str, _LeafModel] = Field(default_factory=dict)
    efficiency: _EfficiencyModel | None = None
    family_transfer: _FamilyTransferModel | None = None
    gemm_curve: dict[str, _LeafModel] | None = None
    cross_validation: _CrossValidationModel | None = None

    @field_validator("measured", mode="before")
    @classmethod
    def _empty_measured(cls, value: Any) -> Any:
        return {} if value is None else value  # `measured:` with nothing under it


# ----------------------------------------------------------------------------------------------
# Helpers




_TRANSFER_SOURCES: dict[str, tuple[str, int, int]] = {}
"""profile path -> (sibling path, mtime, size) for profiles that transfer a sibling's efficiencies."""


def _stat_key(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_mtime_ns, stat.st_size


def _load_file(path: Path) -> GpuProfile:
    dep = _TRANSFER_SOURCES.get(str(path))
    if dep is not None and (not Path(dep[0]).is_file() or _stat_key(Path(dep[0])) != dep[1:]):
        _load_file_cached.cache_clear()          # the sibling changed: its transferred values are stale
    profile = _load_file_cached(str(path), *_stat_key(path))
    return profile


@functools.lru_cache(maxsize=64)
def _load_file_cached(path_str: str, mtime_ns: int, size: int) -> GpuProfile:
    """Profiles are immutable; re-read only when the file changes (sweeps load them thousands of times)."""
    path = Path(path_str)
    where = f"hw profile {path}"
    raw = safe_yaml.load_file(path, "hw profile")   # bounded aliases and depth; bad YAML/UTF-8: one line
    if not isinstance(raw, dict):
        raise CapacityError(f"{where}: expected a mapping of keys at the top level, got {type(raw).__name__}; {_SCHEMA_HINT}")
    try:
        model = _ProfileModel.model_validate(raw)
    except ValidationError as exc:
        raise CapacityError(f"{where}: {_describe_validation_error(exc)}; fix the file ({_SCHEMA_HINT})") from None

    provenance: dict[str, Sourced] = {}

    def add(dotted: str, leaf: _LeafModel) -> None:
        provenance[dotted] = Sourced(
            value=float(leaf.value),
            basis=leaf.basis.strip(),
            source=leaf.source.strip(),
            unit=leaf.unit,
            note=leaf.note,
            fitted_on=leaf.fitted_on,
        )

    for dtype, leaf in model.peak_dense_tflops.items():
        add(f"peak_dense_tflops.{dtype}", leaf)
    for key in SCALAR_KEYS:
        add(key, getattr(model, key))
    for key in OPTIONAL_SCALAR_KEYS:
        if getattr(model, key) is not None:
            add(key, getattr(model, key))
    for key, leaf in model.measured.items():
        add(f"measured.{key}", leaf)
    for key, leaf in (model.gemm_curve or {}).items():
        add(f"gemm_curve.{key}", leaf)
    if (model.efficiency is None) == (model.family_transfer is None):
        raise CapacityError(f"{where}: give either an 'efficiency' section or a 'family_transfer' from a sibling GPU, "
                            f"not {'both' if model.efficiency is not None else 'neither'}; {_SCHEMA_HINT}")
    sibling = None
    if model.efficiency is not None:
        for key in EFFICIENCY_KEYS:
            if getattr(model.efficiency, key) is not None:
                add(f"efficiency.{key}", getattr(model.efficiency, key))

    else:
        transferred, sibling = _transferred_efficiency(model.name, model.architecture, model.family_transfer, path,
                                                       where, provenance)
        provenance.update(transferred)
    _check_values(provenance, where=where, check_units=True)
    if model.cross_validation is not None and model.family_transfer is not None:
        raise CapacityError(f"{where}: 'cross_validation' describes a profile's own fitted efficiencies and this one "
                            f"transfers its sibling's; delete the section ({_SCHEMA_HINT})")
    cross_validation = {} if model.cross_validation is None else model.cross_validation.model_dump(mode="json")
    check = model.family_transfer.checked_on if model.family_transfer is not None else None
    if check is not None and sibling.cross_validation.get("measured_by") != check.sibling_fit:
        check = None   # the sibling was refitted since: the check measured other values (the planner says so)
    return _profile_from_provenance(model.name, model.vendor, model.architecture, provenance, str(path.resolve()),
                                    cross_validation, {} if check is None else check.model_dump(mode="json"))


def family_of(architecture: str) -> str:
    """The architecture family a profile's `architecture` names first: 'CDNA3 (gfx942)' -> 'CDNA3'."""
    return architecture.split()[0].strip().upper() if architecture.strip() else ""


def _transferred_efficiency(name: str, architecture: str, transfer: _FamilyTransferModel, path: Path,
                            where: str, own: Mapping[str, Sourced]) -> tuple[dict[str, Sourced], GpuProfile]:
    """Every efficiency entry of the sibling GPU `transfer.from_gpu`, as shipped (fitted values included),
    relabelled 'transferred from <sibling>', and the sibling. Kernel efficiencies and host overheads describe the silicon
    family and the software stack, so they carry over within a family; what the datasheet changes
    (peaks, HBM bandwidth and capacity, power) is this profile's own, and a fraction efficiency is
    scaled by the two GPUs' measured microbenchmark ratio where both have one (`_measured_scale`).
    One hop only, same family only."""
    sibling_ref = transfer.from_gpu.strip()
    if looks_like_path(sibling_ref) and not Path(sibling_ref).is_absolute():
        sibling_ref = str(path.parent / sibling_ref)
    if _normalise_name(Path(sibling_ref).stem if looks_like_path(sibling_ref) else sibling_ref) == _normalise_name(name):
        raise CapacityError(f"{where}: family_transfer.from names the GPU itself; name a sibling GPU ({_SCHEMA_HINT})")
    sibling = load_gpu(sibling_ref)
    _TRANSFER_SOURCES[str(path)] = (sibling.path, *_stat_key(Path(sibling.path)))
    if any(r.basis.startswith(TRANSFERRED_BASIS) for k, r in sibling.provenance.items() if k.startswith("efficiency.")):
        raise CapacityError(f"{where}: family_transfer.from {sibling.name} itself transfers its efficiencies; "
                            f"name the GPU they were measured or fitted on ({_SCHEMA_HINT})")
    if family_of(sibling.architecture) != family_of(architecture):
        raise CapacityError(f"{where}: family_transfer.from {sibling.name} is {sibling.architecture}, not the "
                            f"{family_of(architecture) or '?'} family of this profile; transfer only within a family")
    out: dict[str, Sourced] = {}
    # A sibling's gemm curve travels with its efficiencies (its `gemm` is a multiplier on the curve,
    # whose ceiling is then this GPU's own measured max-achievable ratio: no second scaling).
    curve = {k: r for k, r in sibling.provenance.items() if k.startswith("gemm_curve.")}
    for k, r in curve.items():
        if k not in own:
            out[k] = Sourced(value=r.value, basis=f"{TRANSFERRED_BASIS} {sibling.name} ({r.basis})",
                             source=f"{sibling.name} profile: {r.source}", unit=r.unit, note=r.note)
    # so does the kernel count its per-layer overhead was fitted with (the overhead's meaning depends on it)
    # and the GEMM kernels' fixed time (a property of the silicon and its GEMM library, like the efficiencies)
    for key in ("kernels_per_dense_layer", "gemm_call_us"):
        record = sibling.provenance.get(key)
        if record is not None and key not in own:
            out[key] = Sourced(value=record.value, basis=f"{TRANSFERRED_BASIS} {sibling.name} ({record.basis})",
                               source=f"{sibling.name} profile: {record.source}", unit=record.unit, note=record.note)
    # and the bandwidth its expert efficiencies are fractions of: the expert kernels stream at a rate the die
    # sets, so the same fraction of the sibling's bandwidth (GpuProfile.expert_stream_bw_tb_s)
    if "expert_stream_bandwidth_tb_s" not in own:
        bw = sibling.provenance.get("expert_stream_bandwidth_tb_s") or sibling.provenance["hbm_bandwidth_tb_s"]
        out["expert_stream_bandwidth_tb_s"] = Sourced(
            value=bw.value, basis=f"{TRANSFERRED_BASIS} {sibling.name} ({bw.basis})",
            source=f"{sibling.name} profile: {bw.source}", unit="TB/s",
            note=f"{sibling.name}'s HBM bandwidth, which its fitted `moe` and `moe_int4` are fractions of: expert "
                 "kernels at decode stream at a rate the die sets (H100 / H200 gpt-oss-120b TPOT 1.01-1.06 in 24 of 28 "
                 "matched rows where HBM differs 1.43x; GpuProfile.expert_stream_bw_tb_s). The rate is capped at this GPU's own HBM.")
    for key in EFFICIENCY_KEYS:
        old = sibling.provenance[f"efficiency.{key}"]
        if old.source == _TRITON_ATTENTION_DEFAULT or old.source in (src for _, src in _ZERO_DEFAULTS.values()):
            continue            # no value of its own on the sibling: this profile's follows its own `attention`
        value, note = old.value, " ".join(transfer.reason.split())
        scaled = None if (key == "gemm" and curve) else _measured_scale(key, own, sibling)
        if scaled is not None:
            factor, why = scaled
            value = min(efficiency_ceiling(key, own), old.value * factor)
            note += f" Scaled by {factor:.4g} = {why}."
        out[f"efficiency.{key}"] = Sourced(
            value=value, basis=f"{TRANSFERRED_BASIS} {sibling.name} ({old.basis})",
            source=f"{sibling.name} profile: {old.source}" + (f"; {transfer.source}" if transfer.source else ""),
            unit=old.unit, note=note, fitted_on=old.fitted_on)
    return out, sibling


# The microbenchmark behind each fraction efficiency, and the spec it is a fraction of.
_MEASURED_FOR = {
    "gemm": (("gemm_bf16_tflops", "peak_dense_tflops.bf16"), ("gemm_fp8_tflops", "peak_dense_tflops.fp8")),
    "hbm": (("hbm_stream_tb_s", "hbm_bandwidth_tb_s"),),
    "attention": (("flash_attention_tflops", "peak_dense_tflops.bf16"),),
    "allreduce": (("allreduce_busbw_gb_s", "scaleup_bandwidth_gb_s"),),
}


def _measured_scale(key: str, own: Mapping[str, Sourced], sibling: GpuProfile) -> tuple[float, str] | None:
    """(factor, why) when both GPUs measured the microbenchmark behind efficiency `key`: the ratio of
    their measured fractions of spec. It carries what the datasheet does not state but the benchmark
    sees — the clock a GPU sustains under its power cap (MI325X at 1000 W reaches 843 of 1307 bf16
    TFLOPS where MI300X at 750 W reaches 708 on the same die and kernels)."""
    for measured_key, spec_key in _MEASURED_FOR.get(key, ()):
        mine, theirs = own.get(f"measured.{measured_key}"), sibling.provenance.get(f"measured.{measured_key}")
        my_spec, their_spec = own.get(spec_key), sibling.provenance.get(spec_key)
        if mine and theirs and my_spec and their_spec:
            factor = (mine.value / my_spec.value) / (theirs.value / their_spec.value)
            return factor, (f"({measured_key} {mine.value:g} / {spec_key} {my_spec.value:g}) / ({sibling.name}'s "
                            f"{theirs.value:g} / {their_spec.value:g}), the ratio of the two GPUs' measured "
                            f"fractions of spec (sustained clock under each power cap)")
    return None


def efficiency_ceiling(key: str, provenance: Mapping[str, Sourced]) -> float:
    """The largest value fraction efficiency `key` can take: 1 (the spec it is a fraction of), or the profile's own
    microbenchmark over that spec (`_MEASURED_FOR`) where the measurement beats the spec. That happens for the
    all-reduce on an NVSwitch: NVLS reduces inside the switch, so NCCL's bus bandwidth beats the links (H200 479.98
    against 450 GB/s), and a ceiling of 1 there would put the fit's `allreduce` on a bound it has no physical reason for."""
    ratios = [provenance[m].value / provenance[spec].value for m, spec in
              ((f"measured.{measured}", spec) for measured, spec in _MEASURED_FOR.get(key, ()))
              if m in provenance and spec in provenance and provenance[spec].value > 0]
    return max([1.0, *ratios])


def _check_values(provenance: Mapping[str, Sourced], where: str, check_units: bool = False) -> None:
    """Raise CapacityError naming `where` and the dotted key for the first value out of its range."""

    def fail(key: str, problem: str) -> None:
        raise CapacityError(f"{where}: '{key}' {problem}; fix the value ({_SCHEMA_HINT})")

    if "peak_dense_tflops.bf16" not in provenance:
        fail("peak_dense_tflops.bf16", "is missing (every GPU needs a bf16 peak)")
    for key, record in provenance.items():
        group, _, sub = key.partition(".")
        if not record.source.strip() and record.basis.strip().lower() != "assumed":
            fail(key, "has an empty 'source' (give a URL or document, or set basis: assumed)")
        value = record.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            fail(key, f"must be a finite number, got {value!r}")
        if group == "peak_dense_tflops" and sub not in PEAK_DTYPES:
            fail(key, f"is not a known tensor-core dtype (use {', '.join(PEAK_DTYPES)})")
        if group == "measured" and sub not in MEASURED_KEYS:
            fail(key, f"is not a known measurement (use {', '.join(MEASURED_KEYS)})")
        if group == "gemm_curve":
            if sub not in GEMM_CURVE_MEASURED:
                fail(key, f"is not a dtype with a max-achievable GEMM measurement (use {', '.join(GEMM_CURVE_MEASURED)})")
            for need in (f"measured.{GEMM_CURVE_MEASURED[sub]}", f"peak_dense_tflops.{sub}"):
                if need not in provenance:
                    fail(key, f"needs {need} (the curve's ceiling is the measured max-achievable rate over peak)")
        if group == "efficiency" and sub not in EFFICIENCY_KEYS:
            fail(key, f"is not an efficiency parameter (use {', '.join(EFFICIENCY_KEYS)})")
        if group == "efficiency" and sub in FRACTION_EFFICIENCY_KEYS:
            ceiling = efficiency_ceiling(sub, provenance)
            if not 0.0 < value <= ceiling * (1 + 1e-9):
                fail(key, f"must be a fraction in (0, {ceiling:.4g}], got {value:g}"
                          + (" (its measured ceiling: all-reduce bus bandwidth / scale-up bandwidth)" if ceiling > 1 else ""))
        elif group == "gemm_curve":
            if value < 0:
                fail(key, f"must be >= 0 (W_half in GFLOP), got {value:g}")
        elif key in ("efficiency.step_overhead_ms", "efficiency.per_seq_overhead_us", "efficiency.layer_overhead_us",
                     "efficiency.request_overhead_ms", "efficiency.prompt_token_overhead_us", "efficiency.moe_token_overhead_ns",
                     "efficiency.aiter_moe_token_overhead_ns", "efficiency.eager_kernel_us", "efficiency.spec_seq_overhead_us",
                     "efficiency.spec_token_overhead_us",
                     "scaleup_latency_us", "gemm_call_us",
                     "cost_per_gpu_hour_usd"):
            if value < 0:
                fail(key, f"must be >= 0, got {value:g}")
        elif key in ("scaleup_world_size", "scaleup_links_per_gpu", "kernels_per_dense_layer"):
            if value < 1 or not float(value).is_integer():
                fail(key, f"must be a whole number of GPUs >= 1, got {value:g}")
        elif value <= 0:
            fail(key, f"must be > 0, got {value:g}")
        if check_units and record.unit is not None:
            expected = _EXPECTED_UNIT.get(key, _EXPECTED_UNIT.get(group))
            if expected is not None and _normalise_unit(record.unit) != _normalise_unit(expected):
                fail(key, f"has unit '{record.unit}' but the key is in {expected}")


def _with_optional_efficiencies(provenance: Mapping[str, Sourced]) -> dict[str, Sourced]:
    """`provenance` with the optional efficiency entries a profile may leave out: `moe_token_overhead_ns` at 0, and
    `attention_triton` at the `attention` value where the profile gives none (or gave none before an override or a
    refit of `attention`): an entry that follows `attention` until one is stated."""
    out = dict(provenance)
    for key, (unit, source) in _ZERO_DEFAULTS.items():
        if f"efficiency.{key}" not in out and "efficiency.attention" in out:
            out[f"efficiency.{key}"] = Sourced(value=0.0, basis="assumed", source=source, unit=unit,
                                               note="the profile states none")
    record, attention = out.get("efficiency.attention_triton"), out.get("efficiency.attention")
    if attention is not None and (record is None or record.source == _TRITON_ATTENTION_DEFAULT):
        out["efficiency.attention_triton"] = Sourced(
            value=attention.value, basis="assumed", source=_TRITON_ATTENTION_DEFAULT, unit="fraction",
            note="the profile states no separate value")
    return out


def _profile_from_provenance(
    name: str, vendor: str, architecture: str, provenance: Mapping[str, Sourced], path: str,
    cross_validation: Mapping[str, Any] | None = None, transfer_check: Mapping[str, Any] | None = None,
) -> GpuProfile:
    provenance = _with_optional_efficiencies(provenance)

    def values(prefix: str, order: tuple[str, ...]) -> dict[str, float]:
        return {k: float(provenance[f"{prefix}.{k}"].value) for k in order if f"{prefix}.{k}" in provenance}

    ordered = _ordered_keys(provenance)
    return GpuProfile(
        name=name,
        vendor=vendor,
        architecture=architecture,
        peak_dense_tflops=values("peak_dense_tflops", PEAK_DTYPES),
        hbm_capacity_gb=float(provenance["hbm_capacity_gb"].value),
        hbm_bandwidth_tb_s=float(provenance["hbm_bandwidth_tb_s"].value),
        scaleup_bandwidth_gb_s=float(provenance["scaleup_bandwidth_gb_s"].value),
        scaleup_latency_us=float(provenance["scaleup_latency_us"].value),
        scaleup_world_size=int(provenance["scaleup_world_size"].value),
        board_power_w=float(provenance["board_power_w"].value),
        cost_per_gpu_hour_usd=float(provenance["cost_per_gpu_hour_usd"].value),
        measured=values("measured", MEASURED_KEYS),
        efficiency=values("efficiency", EFFICIENCY_KEYS),
        provenance={key: provenance[key] for key in ordered},
        path=path,
        gemm_curve=values("gemm_curve", tuple(GEMM_CURVE_MEASURED)),
        scaleup_links_per_gpu=int(provenance["scaleup_links_per_gpu"].value) if "scaleup_links_per_gpu" in provenance else 0,
        kernels_per_dense_layer=(int(provenance["kernels_per_dense_layer"].value)
                                 if "kernels_per_dense_layer" in provenance else 0),
        hbm_runtime_gib=float(provenance["hbm_runtime_gib"].value) if "hbm_runtime_gib" in provenance else 0.0,
        gemm_call_us=float(provenance["gemm_call_us"].value) if "gemm_call_us" in provenance else 0.0,
        expert_stream_bandwidth_tb_s=(float(provenance["expert_stream_bandwidth_tb_s"].value)
                                      if "expert_stream_bandwidth_tb_s" in provenance else 0.0),
        cross_validation=dict(cross_validation or {}),
        transfer_check=dict(transfer_check or {}),
    )


def _valid_cross_validation(section: dict[str, Any], where: str) -> dict[str, Any]:
    """`section` checked against the `cross_validation` schema, as the YAML writes it."""
    try:
        return _CrossValidationModel.model_validate(section).model_dump(mode="json")
    except ValidationError as exc:
        raise CapacityError(f"{where}: {_describe_validation_error(exc)}; each figure is [median, p90] in % of "
                            "output_tok_s_per_gpu_pct, tpot_pct and ttft_pct (hw_profiles/README.md)") from None


def _ordered_keys(provenance: Mapping[str, Sourced]) -> list[str]:
    """Dotted keys in schema order (the order of the YAML files)."""
    order = (
        [f"peak_dense_tflops.{d}" for d in PEAK_DTYPES]
        + list(_SCALAR_ORDER)
        + [f"measured.{m}" for m in MEASURED_KEYS]
        + [f"efficiency.{e}" for e in EFFICIENCY_KEYS]
        + [f"gemm_curve.{d}" for d in GEMM_CURVE_MEASURED]
    )
    return [key for key in order if key in provenance]


def _yaml_document(name: str, vendor: str, architecture: str, provenance: Mapping[str, Sourced]) -> dict[str, Any]:
    def leaf(key: str) -> dict[str, Any]:
        record = provenance[key]
        value: float | int = record.value
        if key == "scaleup_world_size" or float(value).is_integer():
            value = int(value)
        out: dict[str, Any] = {"value": value}
        if record.unit is not None:
            out["unit"] = record.unit
        out["basis"] = record.basis
        out["source"] = record.source
        if record.note is not None:
            out["note"] = record.note
        if key.startswith("efficiency."):
            out["fitted_on"] = record.fitted_on
        return out

    keys = _ordered_keys(provenance)
    document: dict[str, Any] = {"name": name, "vendor": vendor, "architecture": architecture}
    document["peak_dense_tflops"] = {k.split(".", 1)[1]: leaf(k) for k in keys if k.startswith("peak_dense_tflops.")}
    for key in _SCALAR_ORDER:
        if key in provenance:
            document[key] = leaf(key)
    document["measured"] = {k.split(".", 1)[1]: leaf(k) for k in keys if k.startswith("measured.")}
    document["efficiency"] = {k.split(".", 1)[1]: leaf(k) for k in keys if k.startswith("efficiency.")
                              and provenance[k].source not in (_TRITON_ATTENTION_DEFAULT, _MOE_TOKEN_DEFAULT,
                                                                             _AITER_MOE_TOKEN_DEFAULT)}
    curve = {k.split(".", 1)[1]: leaf(k) for k in keys if k.startswith("gemm_curve.")}
    if curve:
        document["gemm_curve"] = curve
    return document


def _override_record(old: Sourced | None, key: str, new: Any, gpu: str) -> Sourced:
    return Sourced(
        value=_as_number(new, key, where=f"override of GPU {gpu}"),
        basis=OVERRIDE_BASIS,
        source=OVERRIDE_SOURCE,
        unit=old.unit if old is not None else None,
        note=f"replaces {old.value:g} ({old.basis})" if old is not None else None,
    )


def _as_number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CapacityError(f"{where}: '{key}' must be a finite number, got {value!r}; pass a number")
    return float(value)


def _first_subkey(group: str) -> str:
    return {"peak_dense_tflops": "bf16", "measured": "gemm_bf16_tflops", "efficiency": "gemm", "gemm_curve": "fp8"}[group]


def _describe_validation_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = ".".join(str(part) for part in first["loc"] if part != "[key]")
    kind = first["type"]
    given = first.get("input")
    if kind == "missing":
        text = f"missing key '{loc}'"
    elif kind == "extra_forbidden":
        text = f"unknown key '{loc}'"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = f"'{loc}' must be a mapping {{value, unit, basis, source}}, got {quote(repr(given), 60)}"
    elif kind.startswith("float") or kind.startswith("finite"):
        text = f"'{loc}' must be a finite number, got {quote(repr(given), 60)}"
    elif kind.startswith("string"):
        text = f"'{loc}' must be non-empty text, got {quote(repr(given), 60)}"
    else:
        text = f"'{loc}': {first['msg']}"
    if len(errors) > 1:
        text += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return text


def _known_profiles() -> dict[str, Path]:
    """Shipped profile names (file stems) -> path, sorted by name."""
    directory = hw_profiles_dir()
    files = [p for p in directory.glob("*.yaml") if p.is_file()] + [p for p in directory.glob("*.yml") if p.is_file()]
    return {p.stem: p for p in sorted(files, key=lambda p: p.stem.upper())}


def looks_like_path(text: str) -> bool:
    return text.lower().endswith((".yaml", ".yml")) or "/" in text or os.sep in text


def _normalise_name(text: str) -> str:
    key = "".join(ch for ch in text.lower() if ch.isalnum())
    for suffix in ("sxm5", "sxm", "oam"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
            break
    return key


def _normalise_dtype(text: str) -> str:
    return str(text).strip().lower().replace("-", "_").replace(" ", "_")


def _normalise_unit(unit: str) -> str:
    text = unit.strip().lower().replace("µ", "u").replace("μ", "u").replace(" ", "")
    return {"tflop/s": "tflops", "usd/gpu/hour": "usd/gpu-hour", "$/gpu-hour": "usd/gpu-hour", "gpu": "gpus"}.get(text, text)
