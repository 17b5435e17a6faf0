"""The shipped MoE pricing against AITER's tuned fused-MoE kernel times (a check; run by hand, not a test).

    python scripts/check_moe_kernels.py [--no-curve]

AITER times its fused MoE (sorting excluded: the tuner times the two GEMM stages) per token count and expert shape
when it tunes the kernels; `capacity/data/measurements/aiter_fused_moe.csv` holds three of those tables with their
commits. Two comparisons (docs/seed_validation.md section 41):

1. Across the generation at one shape: the measured MI355X / MI300X speed ratio of the same bf16 kernel shape
   (Qwen3-235B-A22B's experts at 384 wide per GPU) beside the ratio the two shipped profiles give a bf16 MoE of the
   same width per GPU (MiniMax-M2.5's experts at TP4, loaded in bf16: 384 wide). Compute-bound the measured ratio
   should sit near the bf16 peak ratio (2,500 / 1,307 = 1.91), streaming near the HBM ratio (8.0 / 5.3 = 1.51).
2. MiniMax-M2.5 FP8 (the rows' own kernel, `engine.moe_backend: aiter`): the step cost's MoE per layer (`moe_gemm`
   with the per-routed-token time off), the per-routed-token time per layer, against the kernel's time, on MI355X at
   TP1 / TP2 / TP4 and on MI325X at TP4 (MiniMax-M2.7, the same expert shapes).

The step cost prices AITER's MoE from the architecture's kernel curve (fitted to these tables by
scripts/fit_moe_kernel_curve.py) on the architectures in step_cost.AITER_MOE_KERNEL_CURVE; this script turns it on for
both; `--no-curve` shows the `gemm` x `moe` pricing it replaces.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from capacity.cost import step_cost
from capacity.cost.step_cost import StepCostModel
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model

DATA = Path(__file__).resolve().parents[1] / "capacity" / "data" / "measurements" / "aiter_fused_moe.csv"
TOKENS = [1, 4, 32, 128, 512, 1024, 2048, 8192, 32768]


def moe_layer_us(gpu: str, model: str, precision: str, tp: int, tokens: int, per_token: bool) -> float:
    """The profile's MoE time of one layer at `tokens` tokens (one prompt chunk), µs; `per_token` False leaves out
    the per-routed-token time, i.e. the grouped GEMM alone."""
    profile = load_gpu(gpu)
    arch = load_model(model, weight_precision=precision)
    cost = StepCostModel(profile, arch, tp, moe_backend="aiter" if profile.is_rocm else "auto")
    eff = dict(profile.efficiency)
    if not per_token:
        eff["moe_token_overhead_ns"] = eff["aiter_moe_token_overhead_ns"] = 0.0
    f = cost.features(np.array([tokens]), np.array([tokens]))
    return float(cost.time_parts(f, eff)["moe_gemm"]) * 1e6 / arch.num_moe_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-curve", action="store_true", help="price AITER's MoE by `gemm` x `moe` (before section 41)")
    step_cost.AITER_MOE_KERNEL_CURVE = () if ap.parse_args().no_curve else ("CDNA3 (gfx942)", "CDNA4 (gfx950)")
    d = pd.read_csv(DATA)
    qwen = d[(d.checkpoint.str.startswith("Qwen3-235B")) & (d.inter_dim == 384)]
    fast = qwen[qwen.gpu == "MI355X"].set_index("tokens").kernel_us
    slow = qwen[qwen.gpu == "MI300X"].set_index("tokens").kernel_us
    print("1. MI355X / MI300X speed at one bf16 MoE shape, 384 wide per GPU (kernel: AITER, Qwen3-235B-A22B; "
          "model: the step cost, MiniMax-M2.5 at TP4 in bf16, per-routed-token time off)")
    print(f"{'tokens':>7} {'measured':>9} {'model':>7}")
    for t in TOKENS:
        if t not in fast.index:
            continue
        model = (moe_layer_us("MI300X", "MiniMax-M2.5", "bf16", 4, t, False)
                 / moe_layer_us("MI355X", "MiniMax-M2.5", "bf16", 4, t, False))
        print(f"{t:>7} {slow[t] / fast[t]:>9.2f} {model:>7.2f}")
    print()
    print("2. MiniMax-M2.5 FP8 MoE per layer, µs: kernel (AITER) / model without / model's per-routed-token time")
    mm = d[d.checkpoint.isin(["MiniMax-M2.5 FP8", "MiniMax-M2.7 FP8"]) & (d.experts == 256)]
    for gpu, tps in (("MI355X", (1, 2, 4)), ("MI325X", (4,))):
        for tp in tps:
            rows = mm[(mm.gpu == gpu) & (mm.inter_dim == 1536 // tp)].set_index("tokens").kernel_us
            cells = []
            for t in TOKENS:
                if t not in rows.index:
                    continue
                gemm = moe_layer_us(gpu, "MiniMax-M2.5", "fp8", tp, t, False)
                token = moe_layer_us(gpu, "MiniMax-M2.5", "fp8", tp, t, True) - gemm
                cells.append(f"{t}: {rows[t]:.0f} / {gemm:.0f} / {token:.0f}")
            print(f"{gpu} TP{tp}  " + "   ".join(cells))


if __name__ == "__main__":
    main()
