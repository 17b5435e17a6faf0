"""Leave one GPU out: predict a GPU's shipped serving rows with ANOTHER GPU's efficiencies, no refit.

    python scripts/leave_one_gpu_out.py H100:H200 H200:H100 MI300X:MI355X [--workers 2] [--max-rows N] [--own] [--out DIR]

For each SOURCE:TARGET pair the TARGET's rows (capacity/data/measurements/serving_vllm.csv) are
simulated on the TARGET's own datasheet (peaks, HBM, scale-up, power) with every `efficiency` entry of
the SOURCE's shipped profile (fitted values included, with its `kernels_per_dense_layer`, `gemm_call_us` and, within
a family, the bandwidth its expert efficiencies are fractions of) - what
`family_transfer` does for a GPU without
serving rows (hw_profiles/README.md). Within a family (H100 <-> H200, both Hopper) this is the
out-of-sample error a user gets for a sibling GPU; across a generation (MI300X -> MI355X) it is the hard
case. `--own` also prints the TARGET's error with its own shipped fit (the fitted-row error).
`--target-host` keeps the TARGET's own host times (HOST_EFFICIENCY_KEYS: per step, per sequence, per request, per
kernel launched without a graph), so that what is left is the error of the GPU-side efficiencies alone: the rows do
not record the servers' CPUs, and two GPU generations usually come with two CPU generations.
Prints median / p90 absolute percentage error of output tok/s per GPU, TPOT and TTFT. Run by hand
(minutes per pair); not part of the tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from capacity.fidelity import serving
from capacity.inputs.hardware import HOST_EFFICIENCY_KEYS, family_of, load_gpu

METRICS = ("output_tok_s_per_gpu", "tpot_ms", "ttft_ms")


def errors(out) -> dict[str, dict[str, float]]:
    modelled = out[out["skipped"].isna()]
    table: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        if metric not in modelled:
            continue
        meas = pd.to_numeric(modelled[metric], errors="coerce").to_numpy(dtype=float)   # '' where not reported
        pred = pd.to_numeric(modelled[f"predicted_{metric}"], errors="coerce").to_numpy(dtype=float)
        ok = np.isfinite(meas) & np.isfinite(pred) & (meas > 0)
        ape = np.abs(pred[ok] - meas[ok]) / meas[ok]
        table[metric] = {"rows": int(ok.sum()), "median_pct": float(np.median(ape) * 100) if ok.any() else float("nan"),
                         "p90_pct": float(np.percentile(ape, 90) * 100) if ok.any() else float("nan")}
    return table


def line(label: str, table: dict[str, dict[str, float]]) -> str:
    cells = ", ".join(f"{m} {t['median_pct']:.1f} / {t['p90_pct']:.1f} % ({t['rows']} rows)" for m, t in table.items())
    return f"{label:34} {cells}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", help="SOURCE:TARGET GPU names")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--own", action="store_true", help="also the target's error with its own shipped fit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="folder: each pair's predicted rows as SOURCE_on_TARGET.csv")
    ap.add_argument("--target-host", action="store_true",
                    help="keep the TARGET's own host times (HOST_EFFICIENCY_KEYS): the GPU-side efficiencies' error")
    args = ap.parse_args()
    results = []
    for pair in args.pairs:
        source, target = pair.split(":")
        src = load_gpu(source)
        overrides = {"efficiency": dict(src.efficiency)}
        if args.target_host:
            own = load_gpu(target).efficiency
            overrides["efficiency"].update({k: own[k] for k in HOST_EFFICIENCY_KEYS if k in own})
        if src.kernels_per_dense_layer:   # a layer overhead fitted per dense layer's kernels needs its count
            overrides["kernels_per_dense_layer"] = src.kernels_per_dense_layer
        overrides["gemm_call_us"] = src.gemm_call_us   # so does the per-GEMM-call time they were fitted with (0: none)
        # and, within a family (one die), the bandwidth its expert efficiencies are fractions of
        # (GpuProfile.expert_stream_bw_tb_s); across a generation they stay fractions of the target's own HBM
        if family_of(src.architecture) == family_of(load_gpu(target).architecture):
            overrides["expert_stream_bandwidth_tb_s"] = src.expert_stream_bw_tb_s
        out = serving.run(gpus=[target], gpu_overrides=overrides, workers=args.workers,
                          max_rows=args.max_rows, progress=False).rows
        res = {"source": source, "target": target, "transferred": errors(out)}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            out.to_csv(Path(args.out) / f"{source}_on_{target}.csv", index=False)
        if args.own:
            own = serving.run(gpus=[target], workers=args.workers, max_rows=args.max_rows, progress=False).rows
            res["own_fit"] = errors(own)
        results.append(res)
        if not args.json:
            label = f"{target} with {source}'s efficiencies" + (f" ({target}'s host times)" if args.target_host else "")
            print(line(label, res["transferred"]), flush=True)
            if args.own:
                print(line(f"{target} with its own fit", res["own_fit"]), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
