"""Speculative-decoding serving rows at a known load (serving_vllm.csv, `source_id` rocm_blog*).

The seed article (capacity.fidelity.speedups) gives speedups without a load; these AMD ROCm blog rows
state their load (one user, a closed loop of C users, or a Poisson rate) and are simulated as they
were run. `predict_serving_rows` says what is modelled and how; `capacity validate` calls it for
speculative rows whose acceptance is not given, and `capacity validate --spec` reports the summary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity.cost.step_cost import QUARK_OCP_MX_FORMATS
from capacity.errors import CapacityError
from capacity.fidelity.common import (FITTED_PARAMETER, ape, gpu_cost_overrides, pool_map, simulate_scenario,
                                      with_efficiency)
from capacity.inputs.models import load_model
from capacity.measurements.clients import SEED_WORKLOAD, client_of, length_fractions, random_lengths, v0_engine
from capacity.measurements.schemas import (blog_precision, default_serving_file, model_aliases, parse_float,
                                           serving_draft, serving_method)
from capacity.spec.acceptance import profile_rates

SERVING_SOURCE_PREFIX = "rocm_blog"
# Draft checkpoints named by the serving rows that have no shipped config, and the shipped config used
# in their place (same publisher / same target; an approximation, reported with every prediction).
DRAFT_STAND_INS = {
    "lightseekorg/kimi-k2.5-eagle3": "lightseekorg/kimi-k2.5-eagle3-mla",
    "amd/kimi-k2.5-eagle3-fp8": "lightseekorg/kimi-k2.5-eagle3-mla",
}
ASSUMED_EAGLE3_N = 3          # the EAGLE-3 blog does not state N for Kimi; its MiniMax runs use 3 (assumed)
MTP_PLATEAU_N = 8             # "MTP throughput plateaus ... past budget 8" -> modelled at N = 8
SINGLE_USER_PROMPTS = 16      # concurrency-1 rows: requests are independent, 16 converge the mean
# vLLM runs Quark MXFP4 (w4a4) experts natively only through AITER's fused MoE, and emulates them otherwise (dequantized
# to bf16): quark_moe.py `QuarkOCP_MX_MoEMethod`. The simulator's `auto` picks it (step_cost.resolve_moe_backend, vLLM's
# current rule on gfx950); earlier vLLM also needed VLLM_ROCM_USE_AITER=1, which the blog does not state.
QUARK_MXFP4_MOE_ON_AITER = ("Quark MXFP4 experts on AITER's fused MoE (vLLM's only native path for them, "
                            "quark_moe.py QuarkOCP_MX_MoEMethod; assumed: the blog's vLLM ran it, as current vLLM does "
                            "on gfx950 without VLLM_ROCM_USE_AITER)")
POISSON_PROMPTS = 200         # Poisson rows (the blog ran 500; 200 keep the run short, mean E2E within ~2 %)
PIN_TOLERANCE = 0.002         # bisection on the i.i.d. acceptance rate stops at this |ratio error|


@dataclass
class ServingCase:
    """One serving row and how it is modelled."""

    index: int
    row: dict[str, Any]
    status: str                              # predict | pin | baseline | skip
    reason: str = ""
    series: str = ""                         # rows of one spec series share the pinned acceptance
    scenario: dict[str, Any] | None = None   # without the speculative section
    speculative: dict[str, Any] | None = None
    measured: float = math.nan
    metric: str = ""                         # what is compared
    assumptions: str = ""


def plan_serving_rows(df: pd.DataFrame) -> list[ServingCase]:
    """Decide, for each rocm_blog row, whether and how it is modelled (see predict_serving_rows)."""
    cases: list[ServingCase] = []
    for i, row in enumerate(df.to_dict(orient="records")):
        sm = str(row.get("spec_method", "") or "").strip()
        method = serving_method(sm)
        notes = str(row.get("notes", ""))
        load_type = str(row.get("load_type", "")).lower()
        c = ServingCase(i, row, "skip")
        cases.append(c)
        expert_parallel = "with ep" in notes.lower() or "+ ep" in notes.lower()   # EP over the TP GPUs
        if "rate not stated" in load_type:
            c.reason = "load not stated (online serving, request rate not given)"
            continue
        if "offline" in load_type:
            c.reason = "offline mode, E2E latency without a unit"
            continue
        try:
            model = model_aliases().get(str(row["model"]), str(row["model"]))
            arch = load_model(model)
        except CapacityError:
            c.reason = f"no shipped config for model '{row['model']}'"
            continue
        draft, note = serving_draft(sm)
        assumptions = []
        if draft is not None:
            draft = model_aliases().get(draft, draft)
            if draft in DRAFT_STAND_INS:
                assumptions.append(f"draft {draft} has no shipped config: {DRAFT_STAND_INS[draft]} stands in")
                draft = DRAFT_STAND_INS[draft]
            try:
                load_model(draft)
            except CapacityError:
                c.reason = f"draft checkpoint '{draft}' has no shipped config"
                continue
        tp = int(parse_float(row.get("tp")))
        prec = blog_precision(row.get("precision", ""), row.get("model", ""))
        isl, osl = parse_float(row.get("isl")), parse_float(row.get("osl"))
        if v0_engine(row):
            assumptions.append(f"vLLM {row.get('framework_version')} ran the V0 engine; modelled with the v1 scheduler")
        dep = {"gpu": str(row["gpu"]), "model": model, "precision": prec, "tensor_parallel_size": tp}
        engine = {}
        if prec in QUARK_OCP_MX_FORMATS and arch.num_moe_layers:
            assumptions.append(QUARK_MXFP4_MOE_ON_AITER)
        if expert_parallel:
            dep["expert_parallel"] = True
            assumptions.append("expert parallelism over the TP GPUs (vLLM --enable-expert-parallel)")
        conc = parse_float(row.get("concurrency_or_qps"))
        if "concurrency 1" in load_type or ("closed" in load_type and conc == 1):
            # single-user rows of the DFlash blog: z-lab/dflash client, prompts like SEED_WORKLOAD
            n = int(parse_float(row.get("num_spec_tokens"))) if parse_float(row.get("num_spec_tokens")) > 0 else None
            if method == "mtp" and n is None:
                n = MTP_PLATEAU_N
                assumptions.append(f"MTP 'plateau past budget 8' modelled at N={n}")
            if method is None or n is None:
                c.reason = "speculative method or N not stated"
                continue
            target_seed = model if model != "Qwen/Qwen3.6-35B-A3B" else None
            if "humaneval" in notes.lower():
                datasets = ["HumanEval"]
            else:
                datasets = ["GSM8K", "MATH500", "HumanEval", "MBPP"]
                assumptions.append("workload not stated: acceptance = mean of the seed profile's four datasets")
            rates = np.mean([profile_rates(method, target_seed or model, d, n)[0] for d in datasets], axis=0)
            if model == "Qwen/Qwen3.6-35B-A3B":
                assumptions.append("Qwen3.5-35B-A3B modelled by the shipped Qwen3.6-35B-A3B config and its DFlash "
                                   "drafter; acceptance = mean seed DFlash profile over the measured targets")
            assumptions.append("acceptance from the seed article's profile of this method/target (temperature 0)")
            c.status, c.metric = "predict", "tok_s_per_user"
            c.measured = parse_float(row.get("tok_s_per_user"))
            c.scenario = {"name": f"serving:{i}", "deployment": dep, "engine": engine,
                          "traffic": {"arrival": {"process": "closed_loop", "concurrency": 1},
                                      "num_requests": SINGLE_USER_PROMPTS,
                                      "classes": [{"name": "seed", **{k: dict(v) for k, v in SEED_WORKLOAD.items()}}]}}
            c.speculative = {"method": method, "num_speculative_tokens": n, "draft": draft,
                             "acceptance": {"model": "chain", "rates": [float(x) for x in rates]}}
            c.assumptions = "; ".join(assumptions)
            continue
        if math.isnan(isl) or math.isnan(osl) or math.isnan(conc):
            c.reason = "isl, osl or load not stated"
            continue
        lengths = random_lengths(row, isl, osl)
        low, high = length_fractions(row)
        shape = ("exactly isl/osl tokens" if low == high == 1.0 else
                 f"uniform in [{low:g}, {high:g}] x isl/osl tokens")
        basis = client_of(row).get("basis", "stated by the source")
        assumptions.append(f"random prompts and outputs {shape} (the client's draw, {basis}; benchmark_clients.yaml)")
        if "closed" in load_type:
            traffic = {"arrival": {"process": "closed_loop", "concurrency": int(conc)}, "num_requests": 10 * int(conc)}
            value, metric = parse_float(row.get("reported_value")), "reported_tok_s_per_gpu"
        elif "poisson" in load_type:
            traffic = {"arrival": {"process": "poisson", "rate_rps": float(conc)}, "num_requests": POISSON_PROMPTS}
            value, metric = parse_float(row.get("e2e_ms")), "e2e_ms"
        else:
            c.reason = f"load type '{row.get('load_type')}' is not modelled"
            continue
        if not value > 0:
            c.reason = "no measured value"
            continue
        traffic["classes"] = [{"name": "random", **lengths}]
        c.scenario = {"name": f"serving:{i}", "deployment": dep, "engine": engine, "traffic": traffic}
        c.measured = value
        c.metric = metric
        if method is None:
            c.status = "baseline"
            c.series = f"{row['source_id']}|{model}|{tp}|{isl}|{osl}|{load_type}"
        else:
            n = int(parse_float(row.get("num_spec_tokens"))) if parse_float(row.get("num_spec_tokens")) > 0 else None
            if n is None:
                n = ASSUMED_EAGLE3_N
                assumptions.append(f"N not stated: {n} assumed")
            if "fp8 draft" in sm.lower():
                assumptions.append("FP8 draft weights modelled as the checkpoint's BF16")
            assumptions.append("acceptance not reported: i.i.d. rate pinned on the series' lowest load")
            c.status = "pin"
            c.series = f"{row['source_id']}|{model}|{tp}|{isl}|{osl}|{load_type}|{sm}"
            c.speculative = {"method": method, "num_speculative_tokens": n, "draft": draft}
        c.assumptions = "; ".join(assumptions)
    return cases


def _serving_metrics(sc: dict[str, Any]) -> dict[str, float]:
    res = simulate_scenario(sc)
    m = res.metrics
    return {"output_tok_s": m["output_throughput_tok_s"], "output_tok_s_per_gpu": m["output_throughput_tok_s_per_gpu"],
            "total_tok_s_per_gpu": m["total_throughput_tok_s_per_gpu"], "e2e_mean_ms": m["e2e_ms"]["mean"],
            "tok_s_per_user": m["tok_s_per_user_at_median_tpot"], "stable": bool(res.stable)}


def _serving_value(metrics: dict[str, float], metric: str) -> float:
    if metric == "tok_s_per_user":
        return metrics["output_tok_s"]       # one user: output throughput = that user's stream
    if metric == "e2e_ms":
        return metrics["e2e_mean_ms"]
    return metrics["output_tok_s_per_gpu"]


def _ratio(spec: dict[str, float], base: dict[str, float], metric: str) -> float:
    """Measured-comparable speedup: throughput spec/base, or E2E base/spec."""
    if metric == "e2e_ms":
        return base["e2e_mean_ms"] / spec["e2e_mean_ms"]
    return spec["output_tok_s_per_gpu"] / base["output_tok_s_per_gpu"]


def _with_spec(sc: dict[str, Any], spec: dict[str, Any] | None, overrides: dict[str, float] | None) -> dict[str, Any]:
    """The scenario with `spec` and, from a fit (`overrides`), the method's draft-pass overhead and
    the GPU's speculative costs (spec_seq_overhead_us, spec_token_overhead_us)."""
    out = {**sc}
    if spec:
        s = dict(spec)
        if overrides and s.get("method") in overrides:
            s["overrides"] = {FITTED_PARAMETER: overrides[s["method"]]}
        out["speculative"] = s
        gpu = sc.get("deployment", {}).get("gpu")
        values = gpu_cost_overrides(overrides, gpu)
        if values:
            out["deployment"] = {**out["deployment"],
                                 "gpu_overrides": with_efficiency(out["deployment"].get("gpu_overrides"), values)}
    return out


def _serving_job(job) -> list[dict[str, Any]]:
    """One unit of serving work: a 'predict' case, or one series (pinned spec rows + their baselines)."""
    kind, cases, baselines, overrides = job
    out = []
    try:
        if kind == "predict":
            c = cases[0]
            m = _serving_metrics(_with_spec(c.scenario, c.speculative, overrides))
            d = _serving_metrics(_with_spec(c.scenario, c.speculative, None)) if overrides else m
            value = _serving_value(m, c.metric)
            out.append({"index": c.index, "predicted": value, "predicted_absolute": value,
                        "predicted_default": _serving_value(d, c.metric), "stable": m["stable"]})
            return out
        base = {b.row.get("concurrency_or_qps"): b for b in baselines}
        base_m = {k: _serving_metrics(b.scenario) for k, b in base.items()}
        for k, b in base.items():
            value = _serving_value(base_m[k], b.metric)
            out.append({"index": b.index, "predicted": value, "predicted_absolute": value,
                        "predicted_output_tok_s_per_gpu": base_m[k]["output_tok_s_per_gpu"],
                        "predicted_total_tok_s_per_gpu": base_m[k]["total_tok_s_per_gpu"], "stable": base_m[k]["stable"]})
        cases = sorted((c for c in cases if c.row.get("concurrency_or_qps") in base),
                       key=lambda c: parse_float(c.row.get("concurrency_or_qps")))
        if not cases:
            return out
        unstable = [k for k in (c.row.get("concurrency_or_qps") for c in cases) if not base_m[k]["stable"]]
        if unstable:
            for c in cases:
                out.append({"index": c.index, "error": f"the simulated baseline is overloaded at load {', '.join(unstable)} "
                                                       f"(see the baseline rows), so no speedup can be pinned or predicted"})
            return out
        pin = cases[0]
        key = pin.row.get("concurrency_or_qps")
        measured_ratio = pin.measured / base[key].measured if pin.metric != "e2e_ms" else base[key].measured / pin.measured

        def simulated_at(alpha: float, c: ServingCase) -> tuple[float, float]:
            """(speedup against the simulated baseline, the simulated value itself) at i.i.d. rate alpha."""
            spec = {**c.speculative, "acceptance": {"model": "iid", "alpha": alpha}}
            m = _serving_metrics(_with_spec(c.scenario, spec, overrides))
            return _ratio(m, base_m[c.row.get("concurrency_or_qps")], c.metric), _serving_value(m, c.metric)

        def ratio_at(alpha: float, c: ServingCase) -> float:
            return simulated_at(alpha, c)[0]

        lo, hi = 0.0, 1.0
        r_hi = ratio_at(hi, pin)
        if r_hi < measured_ratio:
            alpha = 1.0
        elif ratio_at(lo, pin) > measured_ratio:
            alpha = 0.0
        else:
            for _ in range(14):
                mid = 0.5 * (lo + hi)
                r = ratio_at(mid, pin)
                if abs(r - measured_ratio) / measured_ratio < PIN_TOLERANCE:
                    lo = hi = mid
                    break
                if r < measured_ratio:
                    lo = mid
                else:
                    hi = mid
            alpha = 0.5 * (lo + hi)
        for c in cases:
            r, absolute = simulated_at(alpha, c)
            bm = base_m[c.row.get("concurrency_or_qps")]
            pred = r * base[c.row.get("concurrency_or_qps")].measured if c.metric != "e2e_ms" \
                else base[c.row.get("concurrency_or_qps")].measured / r
            out.append({"index": c.index, "predicted": pred, "predicted_ratio": r,
                        "measured_ratio": (c.measured / base[c.row.get("concurrency_or_qps")].measured
                                           if c.metric != "e2e_ms" else base[c.row.get("concurrency_or_qps")].measured / c.measured),
                        "pinned_alpha": alpha, "used_for_pinning": c is pin, "predicted_absolute": absolute,
                        "predicted_output_tok_s_per_gpu": None, "baseline_predicted": _serving_value(bm, c.metric)})
    except CapacityError as e:
        for c in list(cases) + list(baselines):
            out.append({"index": c.index, "error": str(e)})
    return out


def predict_serving_rows(path: str | Path | None = None, workers: int = 2, progress: bool = True,
                         quick: bool = False, overrides: dict[str, float] | None = None,
                         rows: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Predict the rows of serving_vllm.csv whose source_id starts with 'rocm_blog' (speculative decoding
    at a stated load, and their non-speculative baselines). What is modelled:

    * single-user rows (DFlash blog, MI355X, c = 1): absolute tok/s of one user, with the seed article's
      acceptance profile of the same draft on the same target (and dataset when stated) — an
      independent test of the cost model and the fitted draft overheads (`overrides`);
    * closed-loop and Poisson series with a baseline at every load (EAGLE-3 blog on MI355X; draft-model
      deep dive on MI300X): the acceptance is not reported, so one i.i.d. acceptance rate per series
      is pinned on its lowest load so that the simulated speedup there equals the measured one; the
      speedups at the other loads are predictions (how the benefit falls with load). Baseline rows
      are predicted in absolute terms (tok/s/GPU of unstated basis: output and total both given);
    * everything else is skipped with the reason (load not stated, drafts without a config, ...).

    `rows` (string columns, as read by capacity.measurements.schemas.read_measurements) replaces the file; the table's `row_index`
    is each row's index there (in the file otherwise). `predicted` of a pinned series' rows is the
    measured baseline times the predicted speedup; `predicted_absolute` is the simulated value itself.
    """
    if rows is None:
        path = Path(path) if path else default_serving_file()
        if not path.is_file():
            raise CapacityError(f"measurement file {path} not found")
        rows = pd.read_csv(path, dtype=str, keep_default_na=False)
        if "source_id" not in rows.columns:
            raise CapacityError(f"{path}: not a serving measurement file (no source_id column)")
    df = rows[rows["source_id"].astype(str).str.startswith(SERVING_SOURCE_PREFIX)]
    row_index = df.index.to_numpy()
    df = df.reset_index(drop=True)
    cases = plan_serving_rows(df)
    jobs = [("predict", [c], [], overrides) for c in cases if c.status == "predict"]
    by_series: dict[str, tuple[list, list]] = {}
    for c in cases:
        if c.status in ("pin", "baseline"):
            key = c.series if c.status == "baseline" else c.series.rsplit("|", 1)[0]
            by_series.setdefault(key, ([], []))[0 if c.status == "pin" else 1].append(c)
    for key, (spec_cases, base_cases) in by_series.items():
        if not spec_cases:
            jobs.append(("series", [], base_cases, overrides))
            continue
        for sm in sorted({c.series for c in spec_cases}):
            jobs.append(("series", [c for c in spec_cases if c.series == sm], base_cases, overrides))
    quick_jobs = jobs if not quick else [j for j in jobs if j[0] == "predict"]
    results = pool_map(_serving_job, quick_jobs, workers, progress, "serving rows")
    preds: dict[int, dict[str, Any]] = {}
    for res in results:
        for r in res:
            preds.setdefault(r["index"], {}).update({k: v for k, v in r.items() if v is not None or k not in preds.get(r["index"], {})})
    out_rows = []
    for c in cases:
        p = preds.get(c.index, {})
        status = c.status
        reason = c.reason or p.get("error", "")
        if status != "skip" and "predicted" not in p:
            status, reason = "skip", reason or ("not run in quick mode" if quick else "no prediction")
        pred = p.get("predicted", math.nan)
        r = c.row
        out_rows.append({
            "row_index": int(row_index[c.index]),
            "source_id": r.get("source_id"), "gpu": r.get("gpu"), "model": r.get("model"), "precision": r.get("precision"),
            "tp": r.get("tp"), "isl": r.get("isl"), "osl": r.get("osl"), "load_type": r.get("load_type"),
            "load": r.get("concurrency_or_qps"), "spec_method": r.get("spec_method"),
            "status": {"pin": "speculative (acceptance pinned on the series' lowest load)" if p.get("used_for_pinning")
                       else "speculative (predicted)", "predict": "speculative (predicted)",
                       "baseline": "baseline (predicted)", "skip": "skipped"}[status],
            "reason": reason, "metric": c.metric, "measured": c.measured, "predicted": pred,
            "ape": abs(pred - c.measured) / c.measured if status != "skip" and c.measured > 0 and pred == pred else math.nan,
            "measured_speedup": p.get("measured_ratio", math.nan), "predicted_speedup": p.get("predicted_ratio", math.nan),
            "pinned_alpha": p.get("pinned_alpha", math.nan),
            "predicted_default": p.get("predicted_default", math.nan),
            "predicted_absolute": p.get("predicted_absolute", math.nan) if status != "skip" else math.nan,
            "simulation_stable": p.get("stable", None),
            "predicted_output_tok_s_per_gpu": p.get("predicted_output_tok_s_per_gpu", math.nan),
            "predicted_total_tok_s_per_gpu": p.get("predicted_total_tok_s_per_gpu", math.nan),
            "assumptions": c.assumptions,
        })
    table = pd.DataFrame(out_rows)
    return table, serving_summary(table)


def serving_summary(t: pd.DataFrame) -> dict[str, Any]:
    pred = t[(t.status == "speculative (predicted)") & t.ape.notna()]
    base = t[(t.status == "baseline (predicted)") & t.ape.notna()]
    skipped = t[t.status == "skipped"].reason.value_counts().to_dict()
    out: dict[str, Any] = {"given": int(len(t)), "predicted_speculative": int(len(pred)),
                           "pinned": int((t.status.str.contains("pinned")).sum()), "baselines": int(len(base)),
                           "skipped": {str(k): int(v) for k, v in skipped.items()}, "groups": []}
    for sid, g in pred.groupby("source_id"):
        sp = g[g.measured_speedup.notna() & g.predicted_speedup.notna()]
        out["groups"].append({"source_id": sid, "n": int(len(g)), "median_ape": float(g.ape.median()),
                              "max_ape": float(g.ape.max()),
                              "speedup_median_ape": float(ape(sp.predicted_speedup, sp.measured_speedup).mean()) if len(sp) else None})
    out["baseline_groups"] = [{"source_id": sid, "n": int(len(g)), "median_ape": float(g.ape.median()),
                               "max_ape": float(g.ape.max()),
                               "overloaded": int((g.simulation_stable == False).sum())}  # noqa: E712
                              for sid, g in base.groupby("source_id")]
    out["rows"] = t.replace({np.nan: None}).to_dict(orient="records")
    return out


def serving_text(s: dict[str, Any]) -> list[str]:
    lines = [f"Serving rows (serving_vllm.csv, rocm_blog*): {s['given']} rows; {s['predicted_speculative']} speculative "
             f"rows predicted, {s['pinned']} used to pin an acceptance rate, {s['baselines']} baselines predicted"]
    lines.append(f"  {'source':36} {'load':>5} {'spec_method':40} {'metric':22} {'measured':>9} {'predicted':>9} {'err':>8}"
                 f" {'defaults':>9}")
    for r in s["rows"]:
        if r["status"] == "skipped":
            continue
        err = "" if r["ape"] is None else f"{(r['predicted'] - r['measured']) / r['measured']:+8.1%}"
        alpha = r.get("pinned_alpha")
        bound = alpha is not None and alpha in (0.0, 1.0)
        tag = (f" (pin, alpha={alpha:.2f}{': at its bound, the model cannot reach the measured speedup' if bound else ''})"
               if "pinned" in r["status"] else (f" (alpha={alpha:.2f}{' at bound' if bound else ''})" if alpha is not None
                                                else (" (overloaded)" if r.get("simulation_stable") is False else "")))
        dflt = "" if r.get("predicted_default") is None else f"{r['predicted_default']:9,.1f}"
        lines.append(f"  {str(r['source_id'])[:36]:36} {str(r['load']):>5} {str(r['spec_method'])[:40]:40} "
                     f"{r['metric'][:22]:22} {r['measured']:9,.1f} {r['predicted']:9,.1f} {err:>8} {dflt:>9}{tag}")
    for g in s["groups"]:
        lines.append(f"  {g['source_id']}: {g['n']} speculative rows predicted, median |error| {g['median_ape']:.1%}, "
                     f"max {g['max_ape']:.1%}")
    for g in s.get("baseline_groups", []):
        lines.append(f"  {g['source_id']}: {g['n']} baselines, median |error| {g['median_ape']:.1%}, max {g['max_ape']:.1%}"
                     + (f", {g['overloaded']} simulated overloaded" if g["overloaded"] else ""))
    lines.append("  skipped: " + "; ".join(f"{v}x {k}" for k, v in s["skipped"].items()))
    return lines


