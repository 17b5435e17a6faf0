"""Fit AITER's fused-MoE kernel curve per AMD architecture to its tuned kernel times; write the curve file.

    python scripts/fit_moe_kernel_curve.py [--write]

Rows: capacity/data/measurements/aiter_fused_moe.csv (AITER's tuner output, per token count and expert shape).
Form, per MoE layer and GPU (capacity/cost/step_cost.py `aiter_moe_layer_s`):

    time = floor + join(touched experts' weight bytes / (HBM peak x stream),
                        FLOPs / (dtype peak x compute x m / (m + m_half)))

join: the smooth maximum (s^4 + c^4)^(1/4) (step_cost.ROOFLINE_JOIN_EXPONENT)

with m the routed tokens per touched expert (a grouped GEMM's M per expert; AITER pads each expert's tokens to its
block, so small m wastes the tile), the touched experts E (1 - (1 - k/E)^n) for n tokens of top-k routing, the
GPU's datasheet peaks (hw_profiles). Four numbers per architecture (floor µs, stream, compute, m_half), and one compute
fraction more for each kernel pairing other than bf16 x bf16 and FP8 x FP8 (MXFP4 weights under MXFP4, bf16 or FP8
activations: `compute_by_format`), least squares
on log time over every row of that architecture, whatever its dtype (bf16, FP8, MXFP4) or width. Also printed: each
checkpoint's rows predicted by a fit without them (leave one checkpoint out), and each architecture's rows predicted by
the other architecture's curve with their own GPU's peaks (the generation transfer). `--write` rewrites
capacity/data/moe_kernel_curves.yaml.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from capacity.cost.step_cost import aiter_moe_layer_s
from capacity.inputs.hardware import MoeKernelCurve, load_gpu

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "capacity" / "data" / "measurements" / "aiter_fused_moe.csv"
OUT = ROOT / "capacity" / "data" / "moe_kernel_curves.yaml"
ARCHS = {"gfx950": "CDNA4 (gfx950)", "gfx942": "CDNA3 (gfx942)"}
# bytes per weight: MXFP4 packs two per byte plus one E8M0 scale per 32
WEIGHT_BYTES = {"float8_e4m3fn": 1.0, "float8_e4m3fnuz": 1.0, "bfloat16": 2.0, "float4_e2m1fn_x2": 0.5 + 1 / 32}
COMPUTE_DTYPE = {"float8_e4m3fn": "fp8", "float8_e4m3fnuz": "fp8", "bfloat16": "bf16", "float4_e2m1fn_x2": "fp4"}


# pairings whose kernels share the curve's `compute`; every other pairing timed gets its own fraction
SHARED_COMPUTE = ("bf16 x bf16", "fp8 x fp8")


def kernel_format(d: pd.DataFrame) -> pd.Series:
    """Each row's kernel as "WEIGHTS x ACTIVATIONS" (MoeKernelCurve.formats)."""
    return d.weight_dtype.map(COMPUTE_DTYPE) + " x " + d.activation_dtype.map(COMPUTE_DTYPE)


def kernel_formats(d: pd.DataFrame) -> list[str]:
    """The "WEIGHTS x ACTIVATIONS" pairings the rows time (MoeKernelCurve.formats)."""
    return sorted(set(kernel_format(d)))


def rows() -> pd.DataFrame:
    d = pd.read_csv(DATA)
    d["peak_flops"] = [load_gpu(g).peak_dense_tflops[COMPUTE_DTYPE[a]] * 1e12 for g, a in zip(d.gpu, d.activation_dtype)]
    d["hbm_bytes_s"] = [load_gpu(g).hbm_bandwidth_tb_s * 1e12 for g in d.gpu]
    d["expert_bytes"] = 3.0 * d.model_dim * d.inter_dim * d.weight_dtype.map(WEIGHT_BYTES)
    d["flops_per_routed_token"] = 6.0 * d.model_dim * d.inter_dim
    d["kernel"] = kernel_format(d)
    return d


def predict(curve: MoeKernelCurve, d: pd.DataFrame) -> np.ndarray:
    out = np.empty(len(d))
    for kernel in d.kernel.unique():
        rows_ = (d.kernel == kernel).to_numpy()
        x = d[rows_]
        out[rows_] = aiter_moe_layer_s(curve.for_kernel(kernel), x.tokens.to_numpy(float),
                                       x.experts.to_numpy(float), x.topk.to_numpy(float), x.expert_bytes.to_numpy(float),
                                       x.flops_per_routed_token.to_numpy(float), x.hbm_bytes_s.to_numpy(float),
                                       x.peak_flops.to_numpy(float)) * 1e6
    return out


def fit(d: pd.DataFrame) -> MoeKernelCurve:
    """Least squares on log time: four numbers, and one compute fraction more per pairing outside SHARED_COMPUTE."""
    own = [k for k in kernel_formats(d) if k not in SHARED_COMPUTE]
    formats = tuple(kernel_formats(d))
    def curve(p):
        return MoeKernelCurve(*p[:4], formats=formats, compute_by_format=tuple(zip(own, p[4:])))
    def residual(p):
        return np.log(predict(curve(p), d)) - np.log(d.kernel_us.to_numpy(float))
    start, lo, hi = [20.0, 0.6, 0.3, 30.0], [0, 0.05, 0.01, 0], [200, 1.0, 1.0, 2000]
    p = least_squares(residual, start + [0.3] * len(own), bounds=(lo + [0.01] * len(own), hi + [1.0] * len(own))).x
    return curve([float(v) for v in p])


def errors(curve: MoeKernelCurve, d: pd.DataFrame) -> tuple[float, float]:
    e = np.abs(predict(curve, d) / d.kernel_us.to_numpy(float) - 1) * 100
    return float(np.median(e)), float(np.percentile(e, 90))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {OUT.relative_to(ROOT)}")
    args = ap.parse_args()
    d = rows()
    doc = {}
    for arch, name in ARCHS.items():
        x = d[d.arch == arch]
        curve = fit(x)
        med, p90 = errors(curve, x)
        own = "".join(f", {k} {v:.3f}" for k, v in curve.compute_by_format)
        print(f"{name}: floor {curve.floor_us:.1f} µs, stream {curve.stream:.3f}, compute {curve.compute:.3f}{own}, "
              f"m_half {curve.m_half:.1f}; {len(x)} rows, median / p90 |error| {med:.1f} / {p90:.1f} %")
        held = []
        for ck in sorted(x.checkpoint.unique()):
            rest, out = x[x.checkpoint != ck], x[x.checkpoint == ck]
            if rest.checkpoint.nunique() < 2:
                continue
            m, p = errors(fit(rest), out)
            # a kernel pairing no other checkpoint runs is priced at the shared `compute` in its fold
            alone = "" if set(out.kernel) - set(rest.kernel) <= set(SHARED_COMPUTE) else " (its kernel's own fraction unfitted)"
            held.append(f"{ck} {m:.1f} / {p:.1f}{alone}")
            print(f"  {ck} left out: median / p90 |error| {m:.1f} / {p:.1f} %{alone}")
        source = (f"fitted by scripts/fit_moe_kernel_curve.py to AITER's tuned fused-MoE kernel times "
                  f"(capacity/data/measurements/aiter_fused_moe.csv, {len(x)} rows: "
                  + ", ".join(sorted(x.checkpoint.unique())) + ")")
        fit_note = (f"median / p90 |error| {med:.1f} / {p90:.1f} % on its rows"
                    + (f"; each checkpoint left out of the fit: {'; '.join(held)}" if held else ""))
        doc[name] = {
            "floor_us": {"value": round(curve.floor_us, 2), "unit": "us",
                         "meaning": "the two GEMM stages' time per MoE layer beyond their work (launches, fixed cost)"},
            "stream": {"value": round(curve.stream, 4), "unit": "fraction of HBM peak",
                       "meaning": "rate at which the touched experts' weights stream"},
            "compute": {"value": round(curve.compute, 4), "unit": "fraction of the activations' dtype dense peak",
                        "meaning": "the grouped GEMM's rate at many tokens per expert"},
            "m_half": {"value": round(curve.m_half, 1), "unit": "routed tokens per touched expert",
                       "meaning": "tokens per expert at which the rate is half `compute` (tile padding at small M)"},
            "basis": "microbenchmark fit", "source": source, "fit": fit_note,
            "formats": {"value": kernel_formats(x), "unit": "weights x activations",
                        "meaning": "the kernels timed; another pairing (e.g. int4 weights with bf16 activations) runs "
                                   "another kernel, which the curve does not price"},
        }
        if curve.compute_by_format:
            doc[name]["compute_by_format"] = {
                "value": {k: round(v, 4) for k, v in curve.compute_by_format},
                "unit": "fraction of the activations' dtype dense peak",
                "meaning": "`compute` of a kernel other than the bf16 / FP8 ones (MXFP4 weights under MXFP4, bf16 or FP8 "
                           "activations), fitted with the rest"}
        for kernel in kernel_formats(x):
            print(f"  {kernel}: {(x.kernel == kernel).sum()} rows, median / p90 |error| "
                  + " / ".join(f"{v:.1f}" for v in errors(curve, x[x.kernel == kernel])) + " %")
    curves = {arch: fit(d[d.arch == arch]) for arch in ARCHS}
    for arch, other in (("gfx950", "gfx942"), ("gfx942", "gfx950")):
        med, p90 = errors(curves[arch], d[d.arch == other])
        print(f"{ARCHS[arch]}'s curve on {ARCHS[other]}'s rows (its datasheet peaks): median / p90 |error| "
              f"{med:.1f} / {p90:.1f} %")
    if args.write:
        header = ("# AITER fused-MoE kernel curves per AMD architecture (capacity/cost/step_cost.py `aiter_moe_layer_s`).\n"
                  "# Written by scripts/fit_moe_kernel_curve.py --write; do not edit by hand. A GPU takes the curve of its\n"
                  "# architecture (hw_profiles `architecture`) with its own datasheet peaks and HBM bandwidth.\n"
                  "# Kernel generation (docs/seed_validation.md section 46): the tables are AITER's of 2026-06 to 2026-08. The\n"
                  "# 2026 serving rows ran vLLM images v0.16.0-v0.19.1 (2026-02 to 2026-04). vLLM's Dockerfile.rocm_base pinned\n"
                  "# AITER v0.1.10.post2/3 in March 2026 and v0.1.13-rc5 only from 2026-05-08; AITER's tables hold no MoE shape\n"
                  "# of gpt-oss-120b, MiniMax-M2.5 or Kimi-K2.5 before v0.1.12 (2026-04-10, Kimi-K2's MXFP4), so those layers\n"
                  "# ran AITER's untuned defaults and the curve is a lower bound on their time.\n")
        OUT.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120, allow_unicode=True))
        print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
