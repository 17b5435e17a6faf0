"""GPU microbenchmarks measured with `scripts/gpu_microbench.py`, and the kernel models fitted to them.

`capacity/data/measurements/gpu_microbench_<gpu>.csv` holds one row per timed case (CUDA-graph replays of
back-to-back calls on buffers several times the L2 cache; the `.json` beside it, the machine). Fitted here:

* GEMM calls at the models' own shapes: `time = call_us + max(2MNK / (peak x ceiling_dtype), bytes /
  bandwidth)` per call. `call_us` is what a hardware profile's `gemm_call_us` holds; `bandwidth` is the
  rate weights stream at inside a GEMM, the physical meaning of `efficiency.hbm` x spec bandwidth.
* Causal prefill attention: achieved TFLOPS against prompt length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capacity.paths import data_dir

MICROBENCH_DIR = data_dir() / "measurements"


def microbench_path(gpu: str) -> Path:
    return MICROBENCH_DIR / f"gpu_microbench_{gpu.lower()}.csv"


def load(gpu: str):
    """The GPU's microbenchmark rows as a DataFrame (pandas is imported here, not on the simulate path)."""
    import pandas as pd

    return pd.read_csv(microbench_path(gpu))


@dataclass(frozen=True)
class GemmCallFit:
    call_us: float                      # fixed time per call
    bandwidth_tb_s: float               # weight streaming rate
    ceiling: dict[str, float]           # achieved fraction of dense peak per dtype, compute-bound
    median_error: float                 # |predicted / measured - 1| over the fitted calls
    p90_error: float
    calls: int


def serving_gemms(df):
    """The rows of GEMMs at model layer shapes (not the square size sweep), with FLOPs and bytes moved."""
    g = df[(df["kind"] == "gemm") & ~df["note"].astype(str).str.startswith("square") & df["us_per_call"].notna()].copy()
    width = np.where(g["dtype"] == "fp8", 1, 2)
    g["flops"] = 2.0 * g["m"] * g["n"] * g["k"]
    g["bytes"] = (g["n"] * g["k"] + g["m"] * g["k"]) * width + g["m"] * g["n"] * 2
    return g


def predict_gemm_us(g, call_us: float, bandwidth_tb_s: float, peak_tflops: dict[str, float],
                    ceiling: dict[str, float]) -> np.ndarray:
    rate = np.array([peak_tflops[d] * ceiling[d] for d in g["dtype"]]) * 1e12
    return call_us + np.maximum(g["flops"].to_numpy() / rate, g["bytes"].to_numpy() / (bandwidth_tb_s * 1e12)) * 1e6


def fit_gemm_calls(df, peak_tflops: dict[str, float], with_call: bool = True) -> GemmCallFit:
    """Least squares on log time over every serving-shape GEMM of the sweep (`with_call=False`: the plain
    roofline, no fixed time, for comparison)."""
    from scipy.optimize import least_squares

    g = serving_gemms(df)
    dtypes = sorted(set(g["dtype"]))
    measured = g["us_per_call"].to_numpy(float)

    def unpack(x):
        call = x[0] if with_call else 0.0
        rest = x[1:] if with_call else x
        return call, rest[0], dict(zip(dtypes, rest[1:]))

    def residual(x):
        call, bw, ceil = unpack(x)
        return np.log(predict_gemm_us(g, call, bw, peak_tflops, ceil) / measured)

    x0 = ([4.0] if with_call else []) + [4.0] + [0.7] * len(dtypes)
    lo = ([0.0] if with_call else []) + [0.1] + [0.01] * len(dtypes)
    hi = ([100.0] if with_call else []) + [100.0] + [1.0] * len(dtypes)
    res = least_squares(residual, x0, bounds=(lo, hi))
    call, bw, ceil = unpack(res.x)
    err = np.abs(predict_gemm_us(g, call, bw, peak_tflops, ceil) / measured - 1.0)
    return GemmCallFit(call_us=float(call), bandwidth_tb_s=float(bw), ceiling={d: float(v) for d, v in ceil.items()},
                       median_error=float(np.median(err)), p90_error=float(np.percentile(err, 90)), calls=len(g))


def best(df, kind: str, column: str, dtype: str | None = None) -> float:
    """The highest `column` among rows of `kind` (and `dtype`)."""
    rows = df[df["kind"] == kind]
    if dtype is not None:
        rows = rows[rows["dtype"] == dtype]
    return float(rows[column].max())
