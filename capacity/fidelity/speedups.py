"""Validate speculative decoding against measured speedups (the seed article) and spec serving rows.

Measured rows (schema of `capacity/data/measurements/seed_spec_decode.csv`, see
`capacity.measurements.schemas.SPEC_REQUIRED`) give,
per target × method × dataset × N, the non-speculative baseline throughput, the speculative
throughput and the per-position acceptance. The article does not report the load, so:

1. Load inference (one load per target). Every target was benchmarked at one fixed load, whose only
   observable is the baseline throughput. The load is modelled as a closed loop of C users (the
   article's four datasets are exactly those of the z-lab/dflash benchmark client, a fixed-concurrency
   closed loop; inferred) with one assumed request shape for every dataset (SEED_WORKLOAD of
   capacity.measurements.clients: prompts uniform in [64, 256] tokens, outputs uniform in [512, 2048]
   tokens; see the constant for the reasoning).
   C is found ONCE per target by bisection on the simulated baseline throughput (monotone in C) so
   that it matches the mean of the target's measured baselines over its datasets, on the target's
   GPU, TP, precision and max_num_batched_tokens.
2. Prediction. Each row is the same scenario with speculation on: the row's method and draft
   checkpoint, N = num_speculative_tokens, and the row's own measured per-position acceptance as a
   chain ({model: chain, rates, basis: marginal}). predicted_speedup = simulated speculative
   throughput / simulated baseline throughput at the same load (same seed, same requests).
3. Calibration. Only `draft_pass_overhead_us` of each method (a fixed cost per draft forward, shared
   by every target) is fitted, through `speculative.overrides`. Fitting re-prices the recorded
   schedules: in a closed loop on one replica the schedule (and every acceptance draw) does not depend
   on step durations, and with a static N each drafting step carries exactly `units` draft-pass
   overheads (N for the sequential drafters, 1 for DFlash/DSpark), so the run's duration with a new
   overhead is T0 + K · (new − old) (K = drafting steps × units) — what a full simulation with that
   override gives (tested). Error on all rows and in leave-one-target-out cross-validation.
4. Report: median / p90 absolute relative error of the speedup by method and by target, and the
   best-N regret per (target, method, dataset).

Serving rows (serving_vllm.csv, `source_id` starting `rocm_blog`) that measure speculative decoding at
a stated load are predicted by `capacity.fidelity.spec_serving` (`run` includes them by default).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from capacity.cost.step_cost import NUM_FEATURES, StepFeatures
from capacity.errors import CapacityError
from capacity.fidelity.common import (FITTED_PARAMETER, SEQ_KEY, TOK_KEY, ape, gpu_cost_overrides, pool_map,
                                      seq_key, simulate_scenario, tok_key, with_efficiency)
from capacity.fidelity.spec_serving import predict_serving_rows, serving_text
from capacity.inputs.hardware import load_gpu
from capacity.measurements.clients import SEED_WORKLOAD, attention_backend, int4_moe_tiles, model_runner, moe_backend
from capacity.measurements.row_scenario import speculative_config
from capacity.measurements.schemas import parse_float, read_spec_measurements, spec_precision
from capacity.paths import data_dir
from capacity.sim.simulate import has_request_delay
from capacity.spec.methods import find_method, get_method
from capacity.util.jsonio import write_json
from capacity.util.progress import Progress

PROMPTS_PER_USER = 16        # closed loop runs min(16·C, MAX_PROMPTS) prompts (speedup within ~1 % of 32·C)
MIN_PROMPTS = 64
MAX_PROMPTS = 1024           # the z-lab/dflash client's default --num-prompts (inferred client)
QUICK_PROMPTS_PER_USER = 4
ELASTICITY_SPAN = 2 ** 0.5   # the load's conditioning is measured between C / span and C * span
POORLY_DETERMINED = 0.5      # elasticity below this: a 10 % baseline error moves C by more than 21 %
# A draft pass's fixed cost (launches, metadata, sampling) is bounded by what a whole target forward's
# fixed cost is on these GPUs (MI300X `step_overhead_ms` fitted 1.8 ms): [0, 2 ms]. Wider bounds let
# the per-pass term absorb the per-sequence host cost below (fits of up to 20 ms per DFlash pass,
# docs/seed_validation.md section 3), which then mispredicts single-user runs.
FIT_BOUNDS_US = (0.0, 2000.0)
SEQ_BOUNDS_US = (0.0, 5000.0)
TOK_BOUNDS_US = (0.0, 500.0)


def default_spec_files() -> list[Path]:
    return [data_dir() / "measurements" / "seed_spec_decode.csv"]


# --------------------------------------------------------------------------------------------------
# Scenarios and simulation
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Deployment:
    """What a target was served on (shared by all its rows)."""

    target: str
    gpu: str
    tp: int
    precision: str | None
    max_num_batched_tokens: int | None
    max_model_len: int | None
    model_runner: str = "v1"
    gpu_overrides: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    attention_backend: str = "auto"
    moe_backend: str = "auto"
    int4_moe_tiles: str = "auto"

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Deployment":
        mnbt, mml = parse_float(row.get("max_num_batched_tokens")), parse_float(row.get("max_model_len"))
        tp = parse_float(row.get("tp"))
        if math.isnan(tp) or tp < 1:
            raise CapacityError(f"{row.get('target')}: tp '{row.get('tp')}' is not a positive number")
        return cls(str(row["target"]), str(row["gpu"]), int(tp), spec_precision(row.get("precision")),
                   None if math.isnan(mnbt) else int(mnbt), None if math.isnan(mml) else int(mml),
                   model_runner(row), attention_backend=attention_backend(row), moe_backend=moe_backend(row),
                   int4_moe_tiles=int4_moe_tiles(row))


def num_prompts(concurrency: int, prompts_per_user: int = PROMPTS_PER_USER) -> int:
    return int(min(MAX_PROMPTS, max(MIN_PROMPTS, prompts_per_user * concurrency)))


def workload(dep: Deployment) -> dict[str, Any]:
    """SEED_WORKLOAD, with outputs capped so that prompt + output fits max_model_len."""
    w = {k: dict(v) for k, v in SEED_WORKLOAD.items()}
    if dep.max_model_len:
        room = dep.max_model_len - w["input_tokens"]["high"]
        w["output_tokens"]["high"] = max(1, min(w["output_tokens"]["high"], room))
        w["output_tokens"]["low"] = min(w["output_tokens"]["low"], w["output_tokens"]["high"])
    return w


def scenario_dict(dep: Deployment, concurrency: int, prompts_per_user: int = PROMPTS_PER_USER,
                  speculative: dict[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    engine: dict[str, Any] = {}
    if dep.model_runner != "v1":
        engine["model_runner"] = dep.model_runner
    if dep.attention_backend != "auto":
        engine["attention_backend"] = dep.attention_backend
    if dep.moe_backend != "auto":
        engine["moe_backend"] = dep.moe_backend
    if dep.int4_moe_tiles != "auto":
        engine["int4_moe_tiles"] = dep.int4_moe_tiles
    if dep.max_num_batched_tokens:
        engine["max_num_batched_tokens"] = dep.max_num_batched_tokens
    sc = {
        "name": f"seed:{dep.target}:C={concurrency}",
        "deployment": {"gpu": dep.gpu, "model": dep.target, "precision": dep.precision,
                       "tensor_parallel_size": dep.tp, **({"gpu_overrides": dep.gpu_overrides} if dep.gpu_overrides else {})},
        "engine": engine,
        "traffic": {"arrival": {"process": "closed_loop", "concurrency": int(concurrency)},
                    "num_requests": num_prompts(concurrency, prompts_per_user),
                    "classes": [{"name": "seed", **workload(dep)}]},
        "simulation": {"seed": seed},
    }
    if speculative:
        sc["speculative"] = speculative
    return sc


def _throughput(sc: dict[str, Any]) -> float:
    return float(simulate_scenario(sc).metrics["output_throughput_tok_s"])


# --------------------------------------------------------------------------------------------------
# Load inference
# --------------------------------------------------------------------------------------------------

@dataclass
class LoadInference:
    """The closed-loop load inferred for one target from its measured baseline throughput."""

    deployment: Deployment
    measured_baseline_tok_s: float          # mean over the target's datasets
    concurrency: int
    simulated_baseline_tok_s: float
    bracket: tuple[int, int]                # C_lo, C_hi with sim(C_lo) <= measured <= sim(C_hi)
    bracket_tok_s: tuple[float, float]
    num_prompts: int
    evaluations: int
    note: str = ""
    elasticity: float = math.nan            # d ln(baseline) / d ln(C) around C (ELASTICITY_SPAN either side)

    @property
    def tolerance(self) -> float:
        """Relative step of the simulated baseline between the bracketing integer loads."""
        lo, hi = self.bracket_tok_s
        return abs(hi - lo) / max(min(lo, hi), 1e-9) if lo > 0 else math.inf

    @property
    def c_factor_per_10pct(self) -> float:
        """How far C moves (as a factor) if the simulated baseline were 10 % off: 1.1^(1/elasticity).
        Near saturation the baseline barely grows with C, and the inferred load is poorly determined."""
        e = self.elasticity
        return 1.1 ** (1.0 / e) if e > 0 else math.inf

    def to_json(self) -> dict[str, Any]:
        return {"target": self.deployment.target, "gpu": self.deployment.gpu, "tp": self.deployment.tp,
                "precision": self.deployment.precision, "model_runner": self.deployment.model_runner,
                "attention_backend": self.deployment.attention_backend,
                "max_num_batched_tokens": self.deployment.max_num_batched_tokens,
                "measured_baseline_tok_s": self.measured_baseline_tok_s, "concurrency": self.concurrency,
                "simulated_baseline_tok_s": self.simulated_baseline_tok_s, "bracket": list(self.bracket),
                "bracket_tok_s": list(self.bracket_tok_s), "num_prompts": self.num_prompts,
                "relative_error": self.simulated_baseline_tok_s / self.measured_baseline_tok_s - 1.0,
                "evaluations": self.evaluations, "note": self.note, "elasticity": self.elasticity,
                "c_factor_per_10pct": self.c_factor_per_10pct}


def infer_concurrency(dep: Deployment, measured_tok_s: float, prompts_per_user: int = PROMPTS_PER_USER,
                      max_concurrency: int = 1024, seed: int = 0,
                      throughput: Callable[[dict[str, Any]], float] | None = None) -> LoadInference:
    """The integer closed-loop concurrency C whose simulated baseline output throughput is closest (in
    ratio) to `measured_tok_s`: exponential search then bisection on C (throughput grows with C)."""
    if not measured_tok_s > 0:
        raise CapacityError(f"{dep.target}: baseline_output_tok_s must be a positive number to infer the load")
    tput = throughput or _throughput
    cache: dict[int, float] = {}

    def f(c: int) -> float:
        if c not in cache:
            cache[c] = tput(scenario_dict(dep, c, prompts_per_user, seed=seed))
        return cache[c]

    note = ""
    if f(1) >= measured_tok_s:
        lo = hi = 1
        note = "one user already exceeds the measured baseline (the cost model is too fast for this target)"
    else:
        lo, hi = 1, 2
        while f(hi) < measured_tok_s:
            if hi >= max_concurrency:
                raise CapacityError(
                    f"{dep.target} on {dep.tp}x {dep.gpu}: {hi} users give {f(hi):,.0f} tok/s, below the measured "
                    f"baseline {measured_tok_s:,.0f} tok/s; the cost model is too slow for this target")
            lo, hi = hi, min(2 * hi, max_concurrency)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if f(mid) < measured_tok_s:
                lo = mid
            else:
                hi = mid
    best = min((lo, hi), key=lambda c: abs(math.log(f(c) / measured_tok_s)))
    # conditioning: the baseline's elasticity in C over [C / span, C * span] (adjacent integers are
    # too close to see through the simulation's sampling noise)
    c_lo = max(1, round(best / ELASTICITY_SPAN))
    c_hi = max(c_lo + 1, min(max_concurrency, round(best * ELASTICITY_SPAN)))
    elasticity = math.log(f(c_hi) / f(c_lo)) / math.log(c_hi / c_lo)
    return LoadInference(dep, float(measured_tok_s), int(best), f(best), (lo, hi), (f(lo), f(hi)),
                         num_prompts(best, prompts_per_user), len(cache), note, elasticity)


def _infer_star(args):
    dep, measured, ppu = args
    try:
        return infer_concurrency(dep, measured, ppu)
    except CapacityError as e:
        return str(e)


# --------------------------------------------------------------------------------------------------
# One row
# --------------------------------------------------------------------------------------------------

def overhead_units(method: str, n: int) -> int:
    """Draft-pass overheads per drafting step: N sequential passes, or one block pass."""
    return int(n) if get_method(method).kind == "sequential" else 1


def default_overhead_us(method: str) -> float:
    p = get_method(method).parameters.get(FITTED_PARAMETER)
    return float(p.value) if p is not None else 0.0


@dataclass
class RowRun:
    """What re-pricing a simulated speculative row needs (closed loop, one replica)."""

    duration_s: float           # T0: simulated run duration at `overhead_us`
    overhead_us: float          # the draft_pass_overhead_us the run was simulated with
    overhead_count: float       # K: drafting steps x overhead units
    drafting_steps: int
    output_tokens: float
    num_steps: int
    mean_accepted_length: float
    gpu: str = ""
    verify_seq_count: float = 0.0   # sequences verifying drafts, summed over steps, where the runner charges them
    seq_overhead_us: float = 0.0    # the spec_seq_overhead_us the run was simulated with
    draft_token_count: float = 0.0  # draft tokens verified, summed over steps
    token_overhead_us: float = 0.0  # the spec_token_overhead_us the run was simulated with

    def throughput(self, overhead_us: float | None = None, step_overhead_us: float = 0.0,
                   seq_overhead_us: float | None = None, token_overhead_us: float | None = None) -> float:
        """Output tok/s with another draft-pass overhead, another per-sequence host cost of a
        speculative step (`spec_seq_overhead_us`), another cost per verified draft token
        (`spec_token_overhead_us`), and an optional fixed cost per drafting step."""
        t = self.duration_s
        if overhead_us is not None:
            t += self.overhead_count * (overhead_us - self.overhead_us) * 1e-6
        if seq_overhead_us is not None:
            t += self.verify_seq_count * (seq_overhead_us - self.seq_overhead_us) * 1e-6
        if token_overhead_us is not None:
            t += self.draft_token_count * (token_overhead_us - self.token_overhead_us) * 1e-6
        t += self.drafting_steps * step_overhead_us * 1e-6
        return self.output_tokens / t


def run_row(row: dict[str, Any], load: LoadInference, prompts_per_user: int = PROMPTS_PER_USER,
            overrides: dict[str, float] | None = None, seed: int = 0) -> RowRun:
    """Simulate one measured row at its target's inferred load and keep what re-pricing needs."""
    spec = speculative_config(row, overrides)
    sc = scenario_dict(load.deployment, load.concurrency, prompts_per_user, spec, seed)
    res = simulate_scenario(sc)
    if len(res.cluster.replicas) != 1:  # pragma: no cover - scenario_dict builds one replica
        raise CapacityError("re-pricing needs one replica")
    rec = res.cluster.replicas[0].recorder
    draft_s = np.asarray(rec.draft_s, dtype=float)
    steps = int(np.count_nonzero(draft_s > 0))
    units = overhead_units(spec["method"], spec["num_speculative_tokens"])
    ov = (overrides or {}).get(FITTED_PARAMETER, default_overhead_us(spec["method"]))
    req = res.requests
    tau = 1.0 + float(req.spec_accepted.sum()) / max(float(req.spec_steps.sum()), 1.0)
    out = float(req.output_tokens[np.isfinite(req.finish_s)].sum())
    f = StepFeatures(*np.asarray(rec.features, dtype=float).reshape(-1, NUM_FEATURES).T)
    cost = res.cluster.replicas[0].cost
    verify_seqs = float(f.verify_seqs.sum()) * cost.spec_host_scale   # 0 on the V2 runner (attention-only targets)
    seq_us = cost.efficiency.get(SEQ_KEY, 0.0)
    drafts = float(f.num_drafts.sum())
    return RowRun(duration_s=float(res.metrics["duration_s"]), overhead_us=float(ov), overhead_count=float(steps * units),
                  drafting_steps=steps, output_tokens=out, num_steps=int(res.num_steps), mean_accepted_length=tau,
                  gpu=load.deployment.gpu, verify_seq_count=verify_seqs, seq_overhead_us=float(seq_us),
                  draft_token_count=drafts, token_overhead_us=float(cost.efficiency.get(TOK_KEY, 0.0)))


def _row_star(args) -> RowRun | str:
    row, load, ppu, *rest = args
    try:
        return run_row(row, load, ppu, overrides=rest[0] if rest else None)
    except CapacityError as e:
        return str(e)


# --------------------------------------------------------------------------------------------------
# Metrics: errors, regret
# --------------------------------------------------------------------------------------------------

def error_table(rows: pd.DataFrame, key: str | None, pred: str = "predicted_speedup",
                meas: str = "speedup") -> list[dict[str, Any]]:
    """n, median and p90 of |pred - meas| / meas, grouped by `key` (None: all rows)."""
    ok = rows[pred].notna() & rows[meas].notna() & (rows[meas] > 0)
    sub = rows[ok].assign(_ape=ape(rows.loc[ok, pred], rows.loc[ok, meas]))
    groups = sub.groupby(key, sort=True) if key else [("all", sub)]
    out = []
    for k, g in groups:
        out.append({key or "group": k, "n": int(len(g)), "median_ape": float(g._ape.median()),
                    "p90_ape": float(g._ape.quantile(0.9)), "mean_signed": float(((g[pred] - g[meas]) / g[meas]).mean())})
    return out


def rows_above(rows: pd.DataFrame, threshold: float = 0.20, quantile: float = 0.9,
               pred: str = "predicted_speedup_default", meas: str = "speedup") -> dict[str, Any]:
    """The rows whose |pred - meas| / meas exceeds `threshold`, in all and by target, and the most that can exceed it,
    however far, with the `quantile` of the errors still at or below it (linear interpolation, as `error_table`'s
    p90): with n rows the quantile sits at position q (n - 1) of the sorted errors, so n - 1 - ceil(q (n - 1))."""
    ok = rows[pred].notna() & rows[meas].notna() & (rows[meas] > 0)
    sub = rows[ok]
    above = sub[ape(sub[pred], sub[meas]) > threshold]
    n = int(len(sub))
    return {"threshold": threshold, "quantile": quantile, "rows": n, "above": int(len(above)),
            "most_above": max(n - 1 - math.ceil(quantile * (n - 1)), 0),
            "by_target": {str(k): int(v) for k, v in above.groupby("target").size().sort_values(ascending=False).items()}}


def best_n_regret(rows: pd.DataFrame, pred: str = "predicted_output_tok_s", meas: str = "output_tok_s",
                  keys: tuple[str, ...] = ("target", "method", "dataset"),
                  n_col: str = "num_speculative_tokens") -> pd.DataFrame:
    """Per group: the measured best N, the N the model ranks best, and the regret = throughput lost
    by running the model's N instead of the measured best, as a fraction of the measured best.
    Ties in the prediction go to the smaller N."""
    out = []
    for k, g in rows[rows[pred].notna() & rows[meas].notna()].groupby(list(keys), sort=True):
        g = g.sort_values(n_col)
        best = g.loc[g[meas].idxmax()]
        chosen = g.loc[g[pred].idxmax()]
        regret = (best[meas] - chosen[meas]) / best[meas]
        out.append({**dict(zip(keys, k if isinstance(k, tuple) else (k,))), "measured_best_n": int(best[n_col]),
                    "model_best_n": int(chosen[n_col]), "measured_best_tok_s": float(best[meas]),
                    "tok_s_at_model_n": float(chosen[meas]), "regret": float(regret), "rows": int(len(g))})
    return pd.DataFrame(out, columns=[*keys, "measured_best_n", "model_best_n", "measured_best_tok_s",
                                      "tok_s_at_model_n", "regret", "rows"])


# --------------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------------

STEP_KEY = "_step_overhead_us"


def _gpu_keys(gpu: str) -> list[str]:
    return [seq_key(gpu), tok_key(gpu)]


def predict_with(runs: list[RowRun], methods: list[str], baselines: np.ndarray, params: dict[str, float],
                 step_overhead_us: float = 0.0) -> np.ndarray:
    """Predicted speedup of every row for per-method draft_pass_overhead_us and per-GPU
    spec_seq_overhead_us (`seq_key(gpu)`) and spec_token_overhead_us (`tok_key(gpu)`) in `params` (a
    missing key keeps the simulated value)."""
    return np.array([r.throughput(params.get(m), step_overhead_us, params.get(seq_key(r.gpu)), params.get(tok_key(r.gpu)))
                     / b for r, m, b in zip(runs, methods, baselines)])


def fit_overheads(runs: list[RowRun], methods: list[str], baselines: np.ndarray, measured: np.ndarray,
                  start: dict[str, float], step_overhead: bool = False, seq_overhead: bool = True) -> dict[str, float]:
    """Least squares on log(predicted / measured speedup) with a soft-L1 loss (robust to the article's
    few inconsistent rows): one draft_pass_overhead_us per method present in `methods` (bounds
    FIT_BOUNDS_US) and, with `seq_overhead`, one spec_seq_overhead_us (SEQ_BOUNDS_US) and one
    spec_token_overhead_us (TOK_BOUNDS_US) per GPU present.
    With `step_overhead`, also one fixed cost per drafting step shared by every method (a diagnostic:
    the simulator has no such parameter), returned under STEP_KEY."""
    from scipy.optimize import least_squares   # here: ~0.35 s to import, needed only when fitting (validate --spec)

    present = sorted(set(methods))
    gpus = sorted({k for r in runs for k in _gpu_keys(r.gpu)}) if seq_overhead else []
    keys = present + gpus + ([STEP_KEY] if step_overhead else [])
    out = dict(start)
    if not present:
        return out
    bounds = [(SEQ_BOUNDS_US if k.startswith(SEQ_KEY) else TOK_BOUNDS_US) if k in gpus else FIT_BOUNDS_US for k in keys]
    x0 = np.array([min(max(start.get(k, 500.0), lo), hi) for k, (lo, hi) in zip(keys, bounds)], dtype=float)
    logm = np.log(measured)

    def resid(x):
        p = dict(zip(keys, x))
        step = p.pop(STEP_KEY, 0.0)
        return np.log(np.maximum(predict_with(runs, methods, baselines, p, step), 1e-9)) - logm

    sol = least_squares(resid, x0, bounds=(np.array([lo for lo, _ in bounds]), np.array([hi for _, hi in bounds])),
                        loss="soft_l1", f_scale=0.05, x_scale=100.0)
    out.update({k: float(v) for k, v in zip(keys, sol.x)})
    return out


def fold_fallbacks(fit: dict[str, float], methods: list[str], gpus: list[str]) -> dict[str, float]:
    """Values for what a cross-validation fold could not fit (rules for unmeasured methods and GPUs):
    a method absent from the fold takes the mean fitted pass overhead of the fold's methods of the same
    kind (sequential drafters / one-pass block drafters: DSpark is the DFlash backbone, Gemma 4 MTP a
    sequential head like MTP and EAGLE-3); a GPU absent from the fold takes the mean of the fold's
    fitted GPUs (the host work is vLLM's, on similar server CPUs)."""
    out = dict(fit)
    fitted_m = [m for m in sorted(set(methods)) if m in fit]
    for m in set(methods) - set(fitted_m):
        same = [fit[k] for k in fitted_m if get_method(k).kind == get_method(m).kind]
        if same:
            out[m] = float(np.mean(same))
    for key in (seq_key, tok_key):
        fitted_g = [fit[key(g)] for g in sorted(set(gpus)) if key(g) in fit]
        for g in set(gpus):
            if key(g) not in fit and fitted_g:
                out[key(g)] = float(np.mean(fitted_g))
    return out


def cross_validate(runs: list[RowRun], methods: list[str], baselines: np.ndarray, measured: np.ndarray,
                   targets: np.ndarray, start: dict[str, float], step_overhead: bool = False
                   ) -> tuple[dict[str, float], np.ndarray, np.ndarray, dict[str, dict[str, float]]]:
    """(fit on all rows, its predictions, leave-one-target-out predictions, per-target fold fits). What
    a fold has no rows for (a method or GPU measured on the left-out target only) follows
    `fold_fallbacks`, never the value fitted on the left-out rows."""
    s0 = {**start, STEP_KEY: 500.0} if step_overhead else dict(start)
    fitted = fit_overheads(runs, methods, baselines, measured, s0, step_overhead)
    pred = predict_with(runs, methods, baselines, fitted, fitted.get(STEP_KEY, 0.0))
    loto = np.full(len(runs), np.nan)
    folds: dict[str, dict[str, float]] = {}
    all_gpus = [r.gpu for r in runs]
    for t in sorted(set(targets)):
        train = targets != t
        tr_runs = [r for r, k in zip(runs, train) if k]
        tr_methods = [m for m, k in zip(methods, train) if k]
        f = fit_overheads(tr_runs, tr_methods, baselines[train], measured[train], s0, step_overhead)
        trained = {k: v for k, v in f.items()
                   if k in set(tr_methods) or k in {g for r in tr_runs for g in _gpu_keys(r.gpu)} or k == STEP_KEY}
        f = fold_fallbacks(trained, methods, all_gpus)
        folds[str(t)] = f
        test = ~train
        loto[test] = predict_with([r for r, k in zip(runs, test) if k], [m for m, k in zip(methods, test) if k],
                                  baselines[test], f, f.get(STEP_KEY, 0.0))
    return fitted, pred, loto, folds


def repricing_is_exact(dep: Deployment) -> bool:
    """Re-pricing is exact when the closed loop's schedule cannot depend on step durations: no
    serving-stack delay between a request's dispatch and its arrival at the scheduler."""
    gpu = load_gpu(dep.gpu)
    if dep.gpu_overrides:
        gpu = gpu.with_overrides(**dep.gpu_overrides)
    return not has_request_delay(gpu.efficiency)


def shape_table(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (target, method): a line R(N) = a + b·N through R = tokens per step / speedup, the cost of a
    speculative step relative to a baseline step at the same load, measured and simulated. The
    intercept a is the fixed cost of a speculative step (1 = free), the slope b the cost of one more
    draft token; both in units of a baseline step."""
    out = []
    for (t, m), g in rows.groupby(["target", "method"], sort=True):
        n = g["num_speculative_tokens"].to_numpy(dtype=float)
        if len(set(n)) < 2:
            continue
        entry = {"target": t, "method": m, "concurrency": int(g["concurrency"].iloc[0])}
        for name, sp, tau in (("measured", "speedup", "mean_accepted_length"),
                              ("default", "predicted_speedup_default", "simulated_mean_accepted_length"),
                              ("fitted", "predicted_speedup", "simulated_mean_accepted_length")):
            r = g[tau].to_numpy(dtype=float) / g[sp].to_numpy(dtype=float)
            b, a = np.polyfit(n, r, 1)
            entry[f"{name}_intercept"], entry[f"{name}_slope"] = float(a), float(b)
        out.append(entry)
    return out


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------

@dataclass
class SpecValidationReport:
    rows: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)
    serving: pd.DataFrame | None = None
    wall_time_s: float = 0.0            # printed, not in the JSON: reruns compare byte for byte

    def to_json(self) -> dict[str, Any]:
        keep = [c for c in self.rows.columns if not c.startswith("_")]
        rows = self.rows[keep].replace({np.nan: None}).to_dict(orient="records")
        out = {"rows": rows, "summary": self.summary}
        if self.serving is not None:
            out["serving_rows"] = self.serving.replace({np.nan: None}).to_dict(orient="records")
        return out

    def summary_text(self) -> str:
        return summary_text(self.summary) + f"\n\nwall time {self.wall_time_s:.0f} s"


def _pct(x: Any) -> str:
    return "   n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:6.1%}"


def _table(title: str, table: list[dict[str, Any]], key: str, width: int = 30) -> list[str]:
    lines = [title, f"  {key:{width}} {'rows':>5} {'median':>7} {'p90':>7} {'bias':>7}"]
    for g in table:
        lines.append(f"  {str(g[key])[:width]:{width}} {g['n']:5d} {_pct(g['median_ape'])} {_pct(g['p90_ape'])} "
                     f"{g['mean_signed']:+6.1%}")
    return lines


def summary_text(s: dict[str, Any]) -> str:
    lines = [f"Speculative rows: {s['modelled']} of {s['given']} modelled"
             + ("" if not s.get("skipped_reasons") else "; skipped: "
                + "; ".join(f"{n}x {r}" for r, n in s["skipped_reasons"].items()))]
    lines.append(f"Workload (assumed): {s['workload']}; prompts per load: min({s['prompts_per_user']}*C, {MAX_PROMPTS})")
    if s["errors"]["default"]["overall"]:
        lines.append("Speedup error, median / p90 |pred - meas| / meas: " + "; ".join(
            f"{label} {o['median_ape']:.1%} / {o['p90_ape']:.1%}"
            for label, o in (("the planner as shipped (what it predicts for these rows)", s["errors"]["default"]["overall"][0]),
                             ("re-fitted on these rows", s["errors"]["fitted"]["overall"][0]),
                             ("leave-one-target-out", s["errors"]["loto"]["overall"][0]))))
    a = s.get("above_20pct")
    if a and a["rows"]:
        lines.append(f"Rows above {a['threshold']:.0%} as shipped: {a['above']} of {a['rows']} (the p90 is at most "
                     f"{a['threshold']:.0%} with at most {a['most_above']}, however far above): "
                     + ", ".join(f"{t} {n}" for t, n in a["by_target"].items()))
    lines.append("")
    lines.append("Load inferred per target (closed loop of C users, from the mean measured baseline):")
    lines.append(f"  {'target':30} {'GPU':7} {'TP':>2} {'C':>4} {'measured':>9} {'simulated':>9} {'err':>6} "
                 f"{'step':>6} {'tok/s/user':>10} {'dlnB/dlnC':>9} {'C range if B 10% off':>20} {'runner':>6} "
                 f"{'attention':>9}")
    poor = []
    for ld in s["loads"]:
        e, k = ld.get("elasticity", math.nan), ld.get("c_factor_per_10pct", math.nan)
        c = ld["concurrency"]
        span = f"{c / k:.0f}-{c * k:.0f}" if math.isfinite(k) else "unbounded"
        lines.append(f"  {ld['target'][:30]:30} {ld['gpu']:7} {ld['tp']:2d} {c:4d} "
                     f"{ld['measured_baseline_tok_s']:9,.0f} {ld['simulated_baseline_tok_s']:9,.0f} "
                     f"{ld['relative_error']:+6.1%} {ld['bisection_step']:6.1%} "
                     f"{ld['measured_baseline_tok_s'] / c:10.1f} {e:9.2f} {span:>20} {ld.get('model_runner', 'v1'):>6} "
                 f"{ld.get('attention_backend', 'auto'):>9}")
        if not e >= POORLY_DETERMINED:
            poor.append(ld["target"])
    if poor:
        lines.append(f"  poorly determined (the baseline barely grows with C there, so a small error in the simulated "
                     f"baseline moves C a lot): {', '.join(poor)}")
    lines.append("")
    lines.append("Fitted draft_pass_overhead_us per method (start = methods.yaml), spec_seq_overhead_us and "
                 "spec_token_overhead_us per GPU (start = hardware profile), in us:")
    for m, v in s["fitted"].items():
        lines.append(f"  {m:34} start {s['start'][m]:8.0f}   fitted {v:8.0f}")
    for name, title in (("default", "the planner as shipped (methods.yaml and the GPU profiles; no fit on these rows)"),
                        ("fitted", "re-fitted on all these rows"),
                        ("loto", "leave-one-target-out (fit without the target, predict it)")):
        e = s["errors"][name]
        lines.append("")
        lines.append(f"Speedup |pred - meas| / meas, {title}:")
        lines += _table(" by method", e["by_method"], "method")
        lines += _table(" by target", e["by_target"], "target")
        lines += _table(" all rows", e["overall"], "group")
    lines.append("")
    r = s["regret"]
    lines.append(f"Best-N regret (fitted): mean {r['fitted']['mean']:.1%}, median {r['fitted']['median']:.1%}, "
                 f"max {r['fitted']['max']:.1%} over {r['fitted']['groups']} (target, method, dataset) groups; "
                 f"model picks the measured best N in {r['fitted']['exact']} of them")
    lines.append(f"Best-N regret (LOTO): mean {r['loto']['mean']:.1%}; (defaults): mean {r['default']['mean']:.1%}")
    lines.append("  by method (fitted): " + ", ".join(f"{k} {v:.1%}" for k, v in r["fitted"]["by_method"].items()))
    if s.get("shape"):
        lines.append("")
        lines.append("Cost of a speculative step relative to a baseline step, R(N) = tokens per step / speedup = a + b*N")
        lines.append(f"  {'target':26} {'method':12} {'C':>4}   {'measured a, b':>14}   {'defaults a, b':>14}   {'fitted a, b':>14}")
        for e in s["shape"]:
            lines.append(f"  {e['target'][:26]:26} {e['method'][:12]:12} {e['concurrency']:4d}   "
                         f"{e['measured_intercept']:6.2f} {e['measured_slope']:6.3f}   "
                         f"{e['default_intercept']:6.2f} {e['default_slope']:6.3f}   "
                         f"{e['fitted_intercept']:6.2f} {e['fitted_slope']:6.3f}")
    t = s["targets"]
    lines.append("")
    lines.append(f"Acceptance targets (re-fitted): median <= 7 % ({t['median_ok']}), p90 <= 20 % ({t['p90_ok']}), "
                 f"mean regret <= 2 % ({t['regret_ok']}), all rows modelled ({t['all_modelled']})")
    if s.get("serving"):
        lines.append("")
        lines += serving_text(s["serving"])
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------

def infer_loads(rows: pd.DataFrame, workers: int = 2, progress: bool = True,
                prompts_per_user: int = PROMPTS_PER_USER) -> tuple[dict[str, LoadInference], dict[str, str]]:
    """One LoadInference per target (mean measured baseline over its rows' datasets)."""
    jobs, names, failed = [], [], {}
    for target, g in rows.groupby("target", sort=True):
        first = g.iloc[0].to_dict()
        try:
            dep = Deployment.from_row(first)
        except CapacityError as e:
            failed[target] = str(e)
            continue
        per_dataset = g.groupby("dataset")["baseline_output_tok_s"].first()
        measured = float(per_dataset.mean())
        jobs.append((dep, measured, prompts_per_user))
        names.append(target)
    results = pool_map(_infer_star, jobs, workers, progress, "load inference")
    loads = {}
    for name, res in zip(names, results):
        if isinstance(res, str):
            failed[name] = res
        else:
            loads[name] = res
    return loads, failed


def _groups_summary(df: pd.DataFrame, col: str) -> dict[str, list]:
    return {"by_method": error_table(df, "method_name", col), "by_target": error_table(df, "target", col),
            "overall": error_table(df, None, col)}


def _rename(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{("method" if k == "method_name" else k): v for k, v in g.items()} for g in table]


def _regret_summary(df: pd.DataFrame, pred_col: str) -> dict[str, Any]:
    r = best_n_regret(df, pred=pred_col)
    if r.empty:
        return {"mean": math.nan, "median": math.nan, "max": math.nan, "groups": 0, "exact": 0, "by_method": {},
                "table": []}
    r["method"] = r["method"].map(lambda x: getattr(find_method(x), "name", x))
    return {"mean": float(r.regret.mean()), "median": float(r.regret.median()), "max": float(r.regret.max()),
            "groups": int(len(r)), "exact": int((r.measured_best_n == r.model_best_n).sum()),
            "by_method": {k: float(v) for k, v in r.groupby("method").regret.mean().items()},
            "table": r.to_dict(orient="records")}


def _with_seq_overhead(load: "LoadInference", fitted: dict[str, float]) -> "LoadInference":
    """The load with its GPU's fitted spec_seq_overhead_us and spec_token_overhead_us as profile
    overrides (re-simulation)."""
    dep = load.deployment
    values = gpu_cost_overrides(fitted, dep.gpu)
    if not values:
        return load
    return dataclasses.replace(load, deployment=dataclasses.replace(dep, gpu_overrides=with_efficiency(dep.gpu_overrides, values)))


def run(files: list[str] | None = None, workers: int = 2, progress: bool = True, quick: bool = False,
        serving: bool | None = None, rows: pd.DataFrame | None = None, resimulate: bool = False) -> SpecValidationReport:
    """Validate speculative decoding: infer each target's load, predict every row, fit the per-method
    draft-pass overhead, cross-validate leaving one target out, and (by default when no `files` are
    given) predict the speculative serving rows of serving_vllm.csv. `quick` simulates 4 prompts per
    user instead of 16 (a smoke run, same method). Fitted predictions are re-priced schedules: exact
    when the GPU profile has no request_overhead_ms, within ~1 % otherwise (measured: 0.0-0.7 % at
    62 ms on MI300X); `resimulate` re-simulates them with the fitted overrides instead."""
    wall0 = time.perf_counter()
    ppu = QUICK_PROMPTS_PER_USER if quick else PROMPTS_PER_USER
    if serving is None:
        serving = files is None and rows is None
    if rows is None:
        paths = [Path(f) for f in files] if files else default_spec_files()
        rows = pd.concat([read_spec_measurements(p) for p in paths], ignore_index=True)
    rows = rows.reset_index(drop=True).copy()
    rows["method_name"] = [getattr(find_method(m), "name", None) for m in rows["method"]]
    loads, load_failed = infer_loads(rows, workers, progress, ppu)

    records = rows.to_dict(orient="records")
    jobs, idx, skipped = [], [], {}
    for i, r in enumerate(records):
        reason = None
        if r["method_name"] is None:
            reason = f"unknown method label '{r['method']}'"
        elif r["target"] in load_failed:
            reason = load_failed[r["target"]]
        elif not (parse_float(r["speedup"]) > 0 and parse_float(r["baseline_output_tok_s"]) > 0):
            reason = "no measured speedup or baseline"
        if reason:
            skipped[i] = reason
        else:
            jobs.append((r, loads[r["target"]], ppu))
            idx.append(i)
    results = pool_map(_row_star, jobs, workers, progress, "rows")
    runs: dict[int, RowRun] = {}
    for i, res in zip(idx, results):
        if isinstance(res, str):
            skipped[i] = res
        else:
            runs[i] = res
    rows["skipped"] = [skipped.get(i) for i in range(len(rows))]
    ok = sorted(runs)
    m_list = [rows.at[i, "method_name"] for i in ok]
    base = np.array([loads[rows.at[i, "target"]].simulated_baseline_tok_s for i in ok])
    meas = rows.loc[ok, "speedup"].to_numpy(dtype=float)
    run_list = [runs[i] for i in ok]
    start = {m: default_overhead_us(m) for m in sorted(set(m_list))}
    start.update({seq_key(r.gpu): r.seq_overhead_us for r in run_list})
    start.update({tok_key(r.gpu): r.token_overhead_us for r in run_list})
    targets = rows.loc[ok, "target"].to_numpy()
    fitted, fit_pred, loto_pred, loto_fits = cross_validate(run_list, m_list, base, meas, targets, start)
    exact = all(repricing_is_exact(ld.deployment) for ld in loads.values())
    if resimulate and not exact:
        # a request delay makes the closed-loop schedule depend on step durations (re-pricing is then
        # within ~1 %, measured): re-simulate the final predictions with the fitted overrides
        jobs2 = [(rows.loc[i].to_dict(), _with_seq_overhead(loads[rows.at[i, "target"]], fitted), ppu,
                  {FITTED_PARAMETER: fitted[rows.at[i, "method_name"]]}) for i in ok]
        res2 = pool_map(_row_star, jobs2, workers, progress, "rows (fitted, re-simulated)")
        fit_pred = np.array([r.throughput() / b if isinstance(r, RowRun) else np.nan for r, b in zip(res2, base)])

    def put(col: str, values: np.ndarray) -> None:
        rows[col] = np.nan
        rows.loc[ok, col] = values

    put("concurrency", np.array([loads[t].concurrency for t in targets], dtype=float))
    put("predicted_baseline_output_tok_s", base)
    put("simulated_mean_accepted_length", np.array([r.mean_accepted_length for r in run_list]))
    put("predicted_speedup_default", predict_with(run_list, m_list, base, start))
    put("predicted_speedup", fit_pred)
    put("predicted_output_tok_s", rows.loc[ok, "predicted_speedup"].to_numpy() * base)
    put("predicted_speedup_loto", loto_pred)
    for col in ("default", "loto"):
        put(f"predicted_output_tok_s_{col}", rows.loc[ok, f"predicted_speedup_{col}"].to_numpy() * base)
    put("speedup_ape", ape(rows.loc[ok, "predicted_speedup"], meas))
    put("speedup_ape_loto", ape(loto_pred, meas))

    mod = rows.loc[ok]
    errors = {}
    for name, col in (("default", "predicted_speedup_default"), ("fitted", "predicted_speedup"),
                      ("loto", "predicted_speedup_loto")):
        e = _groups_summary(mod, col)
        errors[name] = {k: _rename(v) for k, v in e.items()}
    regret = {
        "fitted": _regret_summary(mod, "predicted_output_tok_s"),
        "loto": _regret_summary(mod, "predicted_output_tok_s_loto"),
        "default": _regret_summary(mod, "predicted_output_tok_s_default"),
    }
    reasons: dict[str, int] = {}
    for r in skipped.values():
        reasons[r] = reasons.get(r, 0) + 1
    overall = errors["fitted"]["overall"][0] if errors["fitted"]["overall"] else {"median_ape": math.nan, "p90_ape": math.nan}
    summary: dict[str, Any] = {
        "given": int(len(rows)), "modelled": int(len(ok)), "skipped_reasons": reasons,
        "workload": f"closed loop; prompts {SEED_WORKLOAD['input_tokens']['low']}-{SEED_WORKLOAD['input_tokens']['high']} tokens, "
                    f"outputs {SEED_WORKLOAD['output_tokens']['low']}-{SEED_WORKLOAD['output_tokens']['high']} tokens (uniform)",
        "prompts_per_user": ppu,
        "loads": [{**ld.to_json(), "bisection_step": ld.tolerance} for ld in loads.values()],
        "fitted_parameter": FITTED_PARAMETER,
        "repricing": "exact" if exact else ("re-simulated" if resimulate else
                                            "approximate (request_overhead_ms > 0: within ~1 %, measured)"),
        "start": start,
        "fitted": {m: fitted[m] for m in start},
        "loto_fits": {t: {m: f.get(m, start[m]) for m in start} for t, f in loto_fits.items()},
        "errors": errors,
        "regret": regret,
        "above_20pct": rows_above(mod),
        "shape": shape_table(rows.loc[ok]),
        "targets": {"median_ok": bool(overall["median_ape"] <= 0.07), "p90_ok": bool(overall["p90_ape"] <= 0.20),
                    "regret_ok": bool(regret["fitted"]["mean"] <= 0.02), "all_modelled": len(ok) == len(rows)},
    }
    serving_df = None
    if serving:
        serving_df, serving_summary = predict_serving_rows(workers=workers, progress=progress, quick=quick,
                                                           overrides=summary["fitted"])
        summary["serving"] = serving_summary
    return SpecValidationReport(rows, summary, serving_df, wall_time_s=time.perf_counter() - wall0)


def write(report: SpecValidationReport, out: Path) -> None:

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report.rows[[c for c in report.rows.columns if not c.startswith("_")]].to_csv(out / "spec_rows.csv", index=False)
    if report.serving is not None:
        report.serving.to_csv(out / "spec_serving_rows.csv", index=False)
    write_json(out / "spec_summary.json", report.summary)


# --------------------------------------------------------------------------------------------------
# Diagnostic: how the error depends on the inferred load
# --------------------------------------------------------------------------------------------------

def load_sensitivity(factors: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0), dataset: str = "GSM8K",
                     rows: pd.DataFrame | None = None, quick: bool = True, progress: bool = True) -> pd.DataFrame:
    """Evidence for the load model: each target's rows of one dataset simulated (methods.yaml
    overheads) at C = factor x the C inferred from the baseline. Per target and factor: the simulated
    baseline over the measured one, and the median signed / absolute error of the speedup. A factor
    whose speedups fit while its baseline does not says the baseline step cost, not the drafting
    cost, is what is wrong at that load."""
    ppu = QUICK_PROMPTS_PER_USER if quick else PROMPTS_PER_USER
    if rows is None:
        rows = read_spec_measurements(default_spec_files()[0])
    loads, failed = infer_loads(rows, workers=1, progress=progress, prompts_per_user=ppu)
    prog = Progress("load sensitivity", progress)
    out = []
    for target, ld in loads.items():
        g = rows[(rows.target == target) & (rows.dataset == dataset)]
        measured_base = float(g["baseline_output_tok_s"].iloc[0]) if len(g) else math.nan
        for f in factors:
            c = max(1, int(round(ld.concurrency * f)))
            base = _throughput(scenario_dict(ld.deployment, c, ppu))
            at = LoadInference(ld.deployment, ld.measured_baseline_tok_s, c, base, (c, c), (base, base),
                               num_prompts(c, ppu), 0)
            err = []
            for r in g.to_dict(orient="records"):
                err.append(run_row(r, at, ppu).throughput() / base / float(r["speedup"]) - 1.0)
            err = np.asarray(err)
            out.append({"target": target, "factor": f, "concurrency": c, "baseline_sim_over_measured": base / measured_base,
                        "median_signed_error": float(np.median(err)), "median_ape": float(np.median(np.abs(err))),
                        "rows": int(len(err))})
            prog.update(f"{target} x{f}")
    prog.close()
    return pd.DataFrame(out)
