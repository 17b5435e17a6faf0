"""Fit a GPU's efficiency parameters to measured serving rows (`capacity calibrate`).

Only physically meaningful parameters shared by every row of the GPU are fitted — the fraction
of peak FLOPs linear layers reach (gemm), of HBM bandwidth (hbm), of peak for attention FLOPs
(attention), of scale-up bandwidth for all-reduce (allreduce), and the fixed per-step and
per-sequence overheads — never a per-row or per-model correction.

Fitting re-prices recorded schedules instead of re-simulating: in a closed loop served by one
replica, which requests run in which step does not depend on how long the steps take (a new
request is sent when one finishes, i.e. at a step boundary). So each row is simulated once, its
per-step features are kept (tokens, sequences, attention FLOPs, KV bytes), and for a candidate
parameter set the step durations are priced with numpy and the row's latencies and throughputs
read off their cumulative sum — the same numbers a full simulation with those parameters gives.
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from capacity import validate
from capacity.errors import CapacityError
from capacity.hardware import GpuProfile, load_gpu, save_profile
from capacity.step_cost import StepCostModel, StepFeatures

FITTED_KEYS = ("gemm", "moe", "hbm", "attention", "allreduce", "step_overhead_ms", "per_seq_overhead_us",
               "layer_overhead_us", "request_overhead_ms")
BOUNDS = {"gemm": (0.02, 1.0), "moe": (0.02, 1.0), "hbm": (0.2, 1.0), "attention": (0.01, 1.0),
          "allreduce": (0.02, 1.0), "step_overhead_ms": (0.0, 30.0), "per_seq_overhead_us": (0.0, 500.0),
          "layer_overhead_us": (0.0, 2000.0), "request_overhead_ms": (0.0, 500.0)}
FIT_METRICS = ("output_tok_s_per_gpu", "ttft_ms", "tpot_ms")
# A second, neutral starting point for the fit (least squares on a roofline has local minima):
# mid-range efficiencies and small overheads. Not a prior: the better of the two fits is kept.
NEUTRAL_START = {"gemm": 0.5, "moe": 0.5, "hbm": 0.7, "attention": 0.3, "allreduce": 0.5, "step_overhead_ms": 1.0,
                 "per_seq_overhead_us": 10.0, "layer_overhead_us": 10.0, "request_overhead_ms": 20.0}


@dataclass
class RecordedRow:
    """One measured row and the schedule the simulator ran for it."""

    row: dict[str, Any]
    scenario: dict[str, Any]
    features: np.ndarray          # (steps, 5): tokens, seqs, sampled, attention FLOPs, KV bytes
    arrival_step: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    num_gpus: int


def record_row(row: dict[str, Any], prompts_per_user: int = validate.PROMPTS_PER_USER) -> RecordedRow | str:
    """Simulate a row once and keep its schedule; a string says why it cannot be recorded."""
    from capacity import scenario as scenario_mod, simulate

    sc, reason = validate.row_scenario(row, prompts_per_user)
    if sc is None:
        return reason
    if sc["traffic"]["arrival"]["process"] != "closed_loop" or sc["deployment"]["replicas"] != 1:
        return "only closed-loop single-replica rows can be re-priced"
    try:
        res = simulate.run(scenario_mod.from_dict(sc, sc["name"]))
    except CapacityError as e:
        return str(e)
    rep = res.cluster.replicas[0]
    t = res.cluster.table
    if np.any(np.isnan(t.finish)):
        return "the simulation did not finish every request"
    return RecordedRow(row=row, scenario=sc, features=np.asarray(rep.recorder.features, dtype=float),
                       arrival_step=t.arrival_step.copy(), first_token_step=t.first_token_step.copy(),
                       finish_step=t.finish_step.copy(), prompt_tokens=t.prompt.copy(),
                       output_tokens=t.target.copy(), num_gpus=res.num_gpus)


class Repricer:
    """Prices a recorded row under any efficiency parameters."""

    def __init__(self, rec: RecordedRow, gpu: GpuProfile):
        from capacity.models import load_model

        d = rec.scenario["deployment"]
        model = load_model(d["model"], weight_precision=d.get("precision"))
        self.rec = rec
        self.cost = StepCostModel(gpu, model, d["tensor_parallel_size"])
        f = rec.features
        self.features = StepFeatures(*(f[:, i] for i in range(f.shape[1])))

    def predict(self, efficiency: dict[str, float]) -> dict[str, float]:
        r = self.rec
        durations = self.cost.total_time(self.features, efficiency)
        ends = np.cumsum(durations)
        arrival = np.where(r.arrival_step > 0, ends[np.maximum(r.arrival_step - 1, 0)], 0.0)
        first = ends[r.first_token_step]
        finish = ends[r.finish_step]
        out = r.output_tokens
        multi = out > 1
        tpot = (finish[multi] - first[multi]) / (out[multi] - 1) * 1e3
        duration = ends[-1]
        # the serving-stack delay before a request reaches the scheduler adds to TTFT and E2E; the
        # small shift it causes in which step a request joins is ignored here (the DES models it)
        delay = efficiency["request_overhead_ms"] * 1e-3
        first, finish = first + delay, finish + delay
        stat = np.mean if str(r.row.get("latency_stat", "median")).lower().startswith("mean") else np.median
        tpot_stat = float(stat(tpot))
        return {
            "predicted_output_tok_s_per_gpu": out.sum() / duration / r.num_gpus,
            "predicted_total_tok_s_per_gpu": (out.sum() + r.prompt_tokens.sum()) / duration / r.num_gpus,
            "predicted_tok_s_per_user": 1e3 / float(np.median(tpot)),
            "predicted_ttft_ms": float(stat(first - arrival)) * 1e3,
            "predicted_tpot_ms": tpot_stat,
            "predicted_e2e_ms": float(stat(finish - arrival)) * 1e3,
        }


def _record_star(args):
    return record_row(*args)


def record_rows(rows: pd.DataFrame, workers: int = 2, progress: bool = True,
                prompts_per_user: int = validate.PROMPTS_PER_USER) -> list[RecordedRow | str]:
    jobs = [(r, prompts_per_user) for r in rows.to_dict(orient="records")]
    out: list[RecordedRow | str] = []
    workers = max(1, min(workers, os.cpu_count() or 1))
    if workers == 1:
        it = map(_record_star, jobs)
    else:
        pool = ProcessPoolExecutor(max_workers=workers)
        it = pool.map(_record_star, jobs, chunksize=1)
    for i, res in enumerate(it):
        out.append(res)
        if progress:
            print(f"\rcalibrate: simulated {i + 1}/{len(jobs)} rows", end="", file=sys.stderr, flush=True)
    if workers != 1:
        pool.shutdown()
    if progress:
        print(file=sys.stderr)
    return out


def _residuals(x: np.ndarray, keys: tuple[str, ...], base: dict[str, float], pricers: list[Repricer]) -> np.ndarray:
    eff = dict(base)
    eff.update(zip(keys, x))
    res = []
    for p in pricers:
        pred = p.predict(eff)
        for m in FIT_METRICS:
            meas = validate._num(p.rec.row.get(m))
            if meas > 0 and not math.isnan(meas):
                res.append(math.log(pred[f"predicted_{m}"] / meas))
    return np.asarray(res)


def fit(pricers: list[Repricer], start: dict[str, float], keys: tuple[str, ...] = FITTED_KEYS) -> dict[str, float]:
    """Least squares on log errors of throughput, TTFT and TPOT (robust soft-L1 loss)."""
    if not pricers:
        raise CapacityError("no rows to calibrate on: give serving measurements for this GPU")
    lo = np.array([BOUNDS[k][0] for k in keys])
    hi = np.array([BOUNDS[k][1] for k in keys])
    best = None
    for origin in (start, NEUTRAL_START):
        x0 = np.array([min(max(origin[k], BOUNDS[k][0]), BOUNDS[k][1]) for k in keys])
        sol = least_squares(_residuals, x0, bounds=(lo, hi), args=(keys, start, pricers), loss="soft_l1",
                            f_scale=0.1, x_scale=np.maximum(x0, 1e-2))
        if best is None or sol.cost < best.cost:
            best = sol
    sol = best
    fitted = dict(start)
    fitted.update({k: float(v) for k, v in zip(keys, sol.x)})
    return fitted


def predictions(pricers: list[Repricer], eff: dict[str, float]) -> pd.DataFrame:
    rows = []
    for p in pricers:
        rows.append({**p.rec.row, **p.predict(eff), "skipped": None})
    return pd.DataFrame(rows)


@dataclass
class CalibrationResult:
    gpu: str
    fitted: dict[str, float]
    start: dict[str, float]
    rows_used: int
    skipped: dict[str, int]
    train_errors: list[dict[str, Any]]
    holdout_errors: list[dict[str, Any]] = field(default_factory=list)
    lomo_errors: list[dict[str, Any]] = field(default_factory=list)
    lomo_fits: dict[str, dict[str, float]] = field(default_factory=dict)
    out: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def summary_text(self) -> str:
        lines = [f"Calibrated {self.gpu} on {self.rows_used} rows"
                 + (f" (skipped: {', '.join(f'{n}× {r}' for r, n in self.skipped.items())})" if self.skipped else "")]
        lines.append("parameter              start    fitted")
        for k in FITTED_KEYS:
            lines.append(f"{k:20} {self.start[k]:8.3f} {self.fitted[k]:9.3f}")
        for title, table in (("Error on the rows fitted on", self.train_errors),
                             ("Error on held-out rows", self.holdout_errors),
                             ("Leave-one-model-out cross-validation (fit without a model, predict it)", self.lomo_errors)):
            if not table:
                continue
            lines.append("")
            lines.append(title + ":")
            lines.append(f"{'model':42} {'metric':22} {'rows':>5} {'median APE':>11} {'p90 APE':>8}")
            for g in table:
                lines.append(f"{str(g.get('model', 'all'))[:42]:42} {g['metric']:22} {g['n']:5d} "
                             f"{g['median_ape']:10.1%} {g['p90_ape']:8.1%}")
        if self.out:
            lines.append(f"\nwrote {self.out}")
        return "\n".join(lines)


def _tables(df: pd.DataFrame) -> list[dict[str, Any]]:
    return validate.error_table(df, ["model"]) + [{"model": "all", **g} for g in validate.error_table(df, [])]


def run(files: list[str] | None, gpu: str, out: str | None = None, holdout: float = 0.0, progress: bool = True,
        workers: int = 2, cross_validate: bool = True, seed: int = 0, max_rows: int | None = None) -> CalibrationResult:
    profile = load_gpu(gpu)
    if not 0.0 <= holdout < 1.0:
        raise CapacityError(f"--holdout {holdout}: give a fraction in [0, 1), e.g. 0.25")
    paths = [Path(f) for f in files] if files else validate.default_files()
    rows = pd.concat([validate.read_measurements(p) for p in paths], ignore_index=True)
    rows = rows[rows["gpu"].str.upper() == profile.name.upper()]
    usable = [validate.row_scenario(r)[0] is not None for r in rows.to_dict(orient="records")]
    skipped_before = rows[[not u for u in usable]]
    rows = rows[usable]
    if max_rows:
        rows = rows.iloc[np.linspace(0, len(rows) - 1, min(max_rows, len(rows))).astype(int)]
    recorded = record_rows(rows, workers=workers, progress=progress)
    pricers, skipped = [], {}
    for r in skipped_before.to_dict(orient="records"):
        reason = validate.row_scenario(r)[1]
        skipped[reason] = skipped.get(reason, 0) + 1
    for rec in recorded:
        if isinstance(rec, str):
            skipped[rec] = skipped.get(rec, 0) + 1
        else:
            pricers.append(Repricer(rec, profile))
    start = dict(profile.efficiency)
    rng = np.random.default_rng(seed)
    held = set(rng.choice(len(pricers), int(round(holdout * len(pricers))), replace=False).tolist()) if holdout else set()
    train = [p for i, p in enumerate(pricers) if i not in held]
    test = [p for i, p in enumerate(pricers) if i in held]
    fitted = fit(train, start)
    result = CalibrationResult(gpu=profile.name, fitted=fitted, start=start, rows_used=len(train), skipped=skipped,
                               train_errors=_tables(predictions(train, fitted)))
    if test:
        result.holdout_errors = _tables(predictions(test, fitted))
    if cross_validate:
        models = sorted({p.rec.row["model"] for p in train})
        if len(models) > 1:
            oof = []
            for m in models:
                fold_fit = fit([p for p in train if p.rec.row["model"] != m], start)
                result.lomo_fits[m] = fold_fit
                oof.append(predictions([p for p in train if p.rec.row["model"] == m], fold_fit))
            result.lomo_errors = _tables(pd.concat(oof, ignore_index=True))
    if out:
        used = ", ".join(sorted({f"{p.rec.row.get('source_id', p.rec.row['file'])}" for p in train}))
        save_profile(profile, out, {k: fitted[k] for k in FITTED_KEYS},
                     f"capacity calibrate on {len(train)} rows of {used} ({', '.join(p.name for p in paths)}), {date.today()}")
        result.out = out
    return result
