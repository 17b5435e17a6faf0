"""Predict measured serving rows with the simulator and report the error.

A serving row (schema of serving_measurements.csv) becomes a scenario: the row's GPU, model,
precision and TP; a closed loop of `concurrency_or_qps` users (InferenceX) or Poisson arrivals
at `concurrency_or_qps` req/s; prompts and outputs uniform in the range the source's benchmark
client drew its random lengths from (benchmark_clients.yaml; [0.8, 1.0] × isl/osl for InferenceX).
Each modelled row is simulated and every measured column the simulator can produce gets a
`predicted_<column>`; a row that cannot be modelled says why in `skipped`.
A speculative row is simulated with its stated method, N and mean accepted length; the ROCm blog rows
that do not state them are handed to the speculative serving check (`with_blog_series`).
"""

from __future__ import annotations

import math
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from capacity.errors import CapacityError
from capacity.paths import data_dir
from capacity.util.progress import Progress

PREDICTED = ("output_tok_s_per_gpu", "total_tok_s_per_gpu", "tok_s_per_user", "ttft_ms", "tpot_ms", "e2e_ms")
SERVING_REQUIRED = ("gpu", "model", "framework", "tp", "isl", "osl", "concurrency_or_qps", "load_type")
PROMPTS_PER_USER = 10      # InferenceX runs 10 × concurrency prompts per point
POISSON_REQUESTS = 400     # assumed for Poisson rows that do not state their prompt count
PRECISIONS = {"fp16": "bf16", "bf16": "bf16", "fp8": "fp8", "int4": "int4", "fp4": "mxfp4", "mxfp4": "mxfp4",
              "mxfp8": "mxfp8", "nvfp4": "fp4"}


def default_files() -> list[Path]:
    return [data_dir() / "measurements" / "serving_vllm.csv"]


@lru_cache(maxsize=1)
def model_aliases() -> dict[str, str]:
    return yaml.safe_load((data_dir() / "measurements" / "model_aliases.yaml").read_text()) or {}


@lru_cache(maxsize=1)
def benchmark_clients() -> dict[str, Any]:
    return yaml.safe_load((data_dir() / "measurements" / "benchmark_clients.yaml").read_text()) or {}


def client_of(row: dict[str, Any]) -> dict[str, Any]:
    """The benchmark_clients.yaml entry of the row's `source_id` (the default entry for other sources)."""
    clients = benchmark_clients()
    return (clients.get("sources") or {}).get(str(row.get("source_id", "")).strip()) or clients.get("default") or {}


def length_fractions(row: dict[str, Any]) -> tuple[float, float]:
    """(low, high): the row's client drew random lengths uniformly from [low, high] x the nominal
    isl/osl (benchmark_clients.yaml, by `source_id`; its default entry for other sources)."""
    entry = client_of(row)
    return float(entry["low"]), float(entry["high"])


def random_lengths(row: dict[str, Any], isl: float, osl: float) -> dict[str, dict[str, Any]]:
    """The input/output length distributions of a row's random-dataset requests (`length_fractions`)."""
    low, high = length_fractions(row)

    def dist(n: float) -> dict[str, Any]:
        hi = max(1, int(round(high * n)))
        return {"dist": "uniform", "low": min(hi, max(1, int(round(low * n)))), "high": hi}

    return {"input_tokens": dist(isl), "output_tokens": dist(osl)}


def v0_engine(row: dict[str, Any]) -> bool:
    """Whether the row's vLLM (`framework_version`, e.g. "v0.6.7" or "vllm/vllm-openai-rocm:v0.18.0")
    predates 0.8, the first release with the V1 engine on by default: it ran the V0 engine, whose
    scheduler (prefills first, chunked prefill optional) the simulator does not mimic."""
    m = re.search(r"v?(\d+)\.(\d+)", str(row.get("framework_version", "")))
    return bool(m) and int(m.group(1)) == 0 and 0 < int(m.group(2)) < 8     # 0.0.x: not a vLLM release


def read_csv_checked(path: Path, required: tuple[str, ...] | list[str], kind: str) -> pd.DataFrame:
    """A measurement CSV as strings; a missing file, broken CSV or missing column is one line."""
    path = Path(path)
    if not path.is_file():
        raise CapacityError(f"measurement file {path} not found")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as e:  # pandas raises several types for a broken CSV
        raise CapacityError(f"{path}: not a readable CSV ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise CapacityError(f"{path}: not a {kind} file, missing columns {', '.join(missing)} "
                            f"(schema: see capacity/data/measurements/README.md)")
    return df


def read_measurements(path: Path) -> pd.DataFrame:
    df = read_csv_checked(path, SERVING_REQUIRED, "serving measurement")
    df.insert(0, "file", Path(path).name)
    df.insert(1, "row", np.arange(len(df)))
    return df


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _is_true(v: Any) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


# Skip reasons no simulator could get past: the row measures nothing it predicts, or states no load.
NOTHING_TO_PREDICT = "no measured column the simulator predicts"
LOAD_NOT_STATED = "tp, isl, osl or load not stated"
SPEC_WITHOUT_ACCEPTANCE = ("speculative row needs num_spec_tokens and acceptance_length "
                           "(the drafter's mean accepted length) to be predicted")
SPEC_NOT_FITTED = "speculative rows are not used to fit the serving efficiencies"
# The ROCm blogs' value of unstated basis (tok/s/GPU) is compared as output tok/s per GPU.
REPORTED = "reported_value"
METRICS = PREDICTED + (REPORTED,)


def row_speculation(row: dict[str, Any]) -> tuple[dict | None, str | None]:
    """The `speculative` section of a row that states its method, N and mean acceptance length (an
    i.i.d. rate with that mean: (1 - a^(N+1)) / (1 - a) = acceptance_length), or (None, why not)."""
    from capacity.spec.acceptance import iid_alpha_for_length
    from capacity.fidelity.spec_serving import serving_draft, serving_method

    label = str(row.get("spec_method", ""))
    n, length = _num(row.get("num_spec_tokens")), _num(row.get("acceptance_length"))
    if not (n >= 1 and length >= 1):
        return None, SPEC_WITHOUT_ACCEPTANCE
    try:
        alpha = iid_alpha_for_length(length, int(n))
    except CapacityError as e:
        return None, str(e)
    spec = {"method": serving_method(label), "num_speculative_tokens": int(n),
            "acceptance": {"model": "iid", "alpha": round(alpha, 6)}}
    draft = serving_draft(label)[0]
    if draft:
        spec["draft"] = model_aliases().get(draft, draft)
    return spec, None


def row_scenario(row: dict[str, Any], prompts_per_user: int = PROMPTS_PER_USER,
                 speculative: bool = True) -> tuple[dict | None, str | None]:
    """The scenario dict that reproduces a measured row, or (None, reason it cannot be modelled).
    `speculative=False` (calibration) refuses speculative rows."""
    from capacity.inputs.hardware import looks_like_path, load_gpu
    from capacity.inputs.models import load_model

    if "vllm" not in str(row.get("framework", "")).lower():
        return None, f"framework '{row.get('framework')}' is not modelled (the simulator mimics vLLM v1)"
    if _is_true(row.get("disagg")):
        return None, "disaggregated prefill/decode serving is not modelled"
    if _is_true(row.get("dp_attention")):
        return None, "data-parallel attention is not modelled"
    ep = _num(row.get("ep"))
    expert_parallel = not math.isnan(ep) and ep > 1
    if expert_parallel and ep != _num(row.get("tp")):
        return None, "expert parallelism over other GPUs than the tensor-parallel ones is not modelled (EP = TP only)"
    spec = None
    if str(row.get("spec_method", "none")).strip().lower() not in ("", "none", "nan"):
        if not speculative:
            return None, SPEC_NOT_FITTED
        spec, reason = row_speculation(row)
        if spec is None:
            return None, reason
    if not any(not math.isnan(_num(row.get(c))) for c in PREDICTED):
        return None, NOTHING_TO_PREDICT
    try:
        gpu = load_gpu(str(row["gpu"]))
    except CapacityError:
        return None, f"no hardware profile for GPU '{row['gpu']}'"
    name = model_aliases().get(str(row["model"]), str(row["model"]))
    precision = PRECISIONS.get(str(row.get("precision", "")).strip().lower())
    try:
        load_model(name, weight_precision=precision)
    except CapacityError:
        return None, f"unknown model '{row['model']}'"
    tp, isl, osl, load = _num(row["tp"]), _num(row["isl"]), _num(row["osl"]), _num(row["concurrency_or_qps"])
    if any(math.isnan(x) for x in (tp, isl, osl, load)):
        return None, LOAD_NOT_STATED
    num_gpus = _num(row.get("num_gpus"))
    if expert_parallel and num_gpus == tp * ep:
        # InferenceX's EP rows give num_gpus = tp x ep although EP runs over the TP GPUs: their
        # per-GPU rates are per tp GPUs (per-user rate x concurrency / tp = output_tok_s_per_gpu
        # within 1-6 % on all 51 shipped rows, as num_gpus does on the TP-only rows)
        num_gpus = tp
    replicas = int(round(num_gpus / tp)) if not math.isnan(num_gpus) and num_gpus > tp else 1
    load_type = str(row["load_type"]).lower()
    exact = _lens(row)
    if exact is not None:   # vllm bench serve --save-detailed: the run's own lengths (replayed by row_stream)
        ins, outs = exact
        lengths = {"input_tokens": {"dist": "uniform", "low": int(ins.min()), "high": int(ins.max())},
                   "output_tokens": {"dist": "uniform", "low": int(outs.min()), "high": int(outs.max())}}
    else:
        lengths = random_lengths(row, isl, osl)
    num_prompts = _num(row.get("num_prompts"))
    if math.isnan(num_prompts):
        num_prompts = _num(client_of(row).get("num_prompts"))
    if exact is not None:
        num_prompts = float(len(exact[0]))
    if "rate_and_concurrency" in load_type or "burst" in load_type:
        return None, f"load type '{row['load_type']}' is not modelled"
    if "closed" in load_type or "concurrency" in load_type:
        c = int(load)
        n = int(num_prompts) if num_prompts > 0 else prompts_per_user * c
        traffic = {"arrival": {"process": "closed_loop", "concurrency": c}, "num_requests": n}
    elif "poisson" in load_type or "gamma" in load_type:
        burst = _num(row.get("burstiness"))
        arrival = ({"process": "gamma", "rate_rps": load, "burstiness": burst}
                   if "gamma" in load_type and burst > 0 else {"process": "poisson", "rate_rps": load})
        traffic = {"arrival": arrival, "num_requests": int(num_prompts) if num_prompts > 0 else POISSON_REQUESTS}
    else:
        return None, f"load type '{row['load_type']}' is not modelled"
    traffic["classes"] = [{"name": "random", **lengths}]
    scenario = {
        "name": f"{row.get('file', 'row')}:{row.get('row', '')}",
        # a row measured on a profile YAML (e.g. `capacity calibrate --out`) keeps its path: the name
        # inside the file would load the shipped profile of that GPU instead
        "deployment": {"gpu": str(row["gpu"]).strip() if looks_like_path(str(row["gpu"]).strip()) else gpu.name,
                       "model": name, "precision": precision,
                       "tensor_parallel_size": int(tp), "replicas": replicas,
                       **({"expert_parallel": True} if expert_parallel else {})},
        "traffic": traffic,
    }
    engine = {k: int(_num(row[k])) for k in ("max_num_batched_tokens", "max_num_seqs")
              if k in row and _num(row[k]) > 0}
    if engine:
        scenario["engine"] = engine
    if spec:
        scenario["speculative"] = spec
    return scenario, None


def _lens(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-request (input, output) lengths a vLLM --save-detailed result recorded, if any."""
    ins, outs = row.get("input_lens"), row.get("output_lens")
    if isinstance(ins, (list, np.ndarray)) and isinstance(outs, (list, np.ndarray)) and len(ins) and len(ins) == len(outs):
        return np.asarray(ins, dtype=np.int64), np.maximum(np.asarray(outs, dtype=np.int64), 1)
    return None


def row_stream(row: dict[str, Any], scenario: dict[str, Any]):
    """The exact request stream of a row with recorded per-request lengths, else None (the scenario draws it).

    Closed loop: the lengths in send order. Open loop: the recorded send times (`start_times`) when
    present, else vLLM's gamma/Poisson gaps drawn with the scenario's seed and rescaled as vLLM does.
    """
    from capacity.inputs.traffic import RequestStream, TrafficConfig, _open_loop_arrivals

    exact = _lens(row)
    if exact is None:
        return None
    ins, outs = exact
    arrival_cfg = scenario["traffic"]["arrival"]
    if arrival_cfg["process"] == "closed_loop":
        arrival = np.full(len(ins), np.nan)
        conc = int(arrival_cfg["concurrency"])
    else:
        conc = None
        starts = row.get("start_times")
        if isinstance(starts, (list, np.ndarray)) and len(starts) == len(ins):
            arrival = np.asarray(starts, dtype=float) - float(np.min(starts))
            order = np.argsort(arrival, kind="stable")
            arrival, ins, outs = arrival[order], ins[order], outs[order]
        else:
            cfg = TrafficConfig.model_validate(scenario["traffic"])
            rng = np.random.default_rng(np.random.SeedSequence(0).spawn(2)[0]).spawn(3)[0]
            arrival = _open_loop_arrivals(cfg.arrival, len(ins), None, rng)
    return RequestStream(arrival_s=arrival.astype(float), prompt_tokens=ins, output_tokens=outs,
                         class_index=np.zeros(len(ins), dtype=np.int64), class_names=["recorded"], concurrency=conc)


def predict_row(row: dict[str, Any], gpu_overrides: dict | None = None,
                prompts_per_user: int = PROMPTS_PER_USER) -> dict[str, Any]:
    """Simulate one measured row; returns {predicted_<col>: value, ..., skipped: reason|None}."""
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import simulate

    sc_dict, reason = row_scenario(row, prompts_per_user)
    if sc_dict is None:
        return {"skipped": reason}
    if gpu_overrides:
        sc_dict["deployment"]["gpu_overrides"] = gpu_overrides
    try:
        result = simulate.run(scenario_mod.from_dict(sc_dict, sc_dict["name"]), stream=row_stream(row, sc_dict))
    except CapacityError as e:
        return {"skipped": str(e)}
    return {**prediction_from_metrics(result.metrics, row), "skipped": None, "stable": result.stable}


def prediction_from_metrics(m: dict[str, Any], row: dict[str, Any]) -> dict[str, float]:
    stat = "mean" if str(row.get("latency_stat", "median")).lower().startswith("mean") else "p50"
    return {
        "predicted_output_tok_s_per_gpu": m["output_throughput_tok_s_per_gpu"],
        "predicted_total_tok_s_per_gpu": m["total_throughput_tok_s_per_gpu"],
        "predicted_tok_s_per_user": m["tok_s_per_user_at_median_tpot"],
        "predicted_ttft_ms": m["ttft_ms"][stat],
        "predicted_tpot_ms": m["tpot_ms"][stat],
        "predicted_e2e_ms": m["e2e_ms"][stat],
    }


def _predict_star(args):
    return predict_row(*args)


@dataclass
class ValidationReport:
    rows: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        rows = self.rows.replace({np.nan: None}).to_dict(orient="records")
        return {"rows": rows, "summary": self.summary}

    def summary_text(self) -> str:
        s = self.summary
        comparable = s.get("comparable", s["given"])
        lines = [f"Coverage: {s['modelled']} of {s['given']} rows modelled "
                 f"({s['modelled'] / max(s['given'], 1):.0%}); {s['modelled']} of the {comparable} that state a load "
                 f"and measure something the simulator predicts ({s['modelled'] / max(comparable, 1):.0%}); skipped: "
                 + ("; ".join(f"{n}× {r}" for r, n in s["skipped_reasons"].items()) or "none")]
        if len(s.get("coverage_by_gpu", {})) > 1:
            lines.append("Coverage by GPU: " + ", ".join(f"{g} {c['modelled']} of {c['given']}"
                                                         for g, c in s["coverage_by_gpu"].items()))
        lines.append("")
        lines.append(f"{'gpu':8} {'model':42} {'metric':22} {'rows':>5} {'median APE':>11} {'p90 APE':>8}")
        for g in s["by_gpu_model_metric"]:
            lines.append(f"{g['gpu']:8} {g['model'][:42]:42} {g['metric']:22} {g['n']:5d} "
                         f"{g['median_ape']:10.1%} {g['p90_ape']:8.1%}")
        lines.append("")
        lines.append("All modelled rows, by GPU:")
        for g in s["by_gpu_metric"]:
            lines.append(f"{g['gpu']:8} {g['metric']:22} {g['n']:5d} {g['median_ape']:10.1%} {g['p90_ape']:8.1%}")
        return "\n".join(lines)


def error_table(rows: pd.DataFrame, keys: list[str]) -> list[dict[str, Any]]:
    """Median and p90 absolute percentage error of every predicted column, grouped by `keys`."""
    out = []
    for metric in METRICS:
        pcol = f"predicted_{metric}"
        if pcol not in rows.columns or metric not in rows.columns:   # a user's file may omit measured columns
            continue
        meas = pd.to_numeric(rows[metric], errors="coerce")
        pred = pd.to_numeric(rows[pcol], errors="coerce")
        ok = meas.notna() & pred.notna() & (meas > 0)
        if not ok.any():
            continue
        sub = rows[ok].assign(ape=(pred[ok] - meas[ok]).abs() / meas[ok])
        for key, grp in sub.groupby(keys) if keys else [((), sub)]:
            key = key if isinstance(key, tuple) else (key,)
            out.append({**dict(zip(keys, key)), "metric": metric, "n": int(len(grp)),
                        "median_ape": float(grp.ape.median()), "p90_ape": float(grp.ape.quantile(0.9))})
    return out


def summarize(rows: pd.DataFrame) -> dict[str, Any]:
    modelled = rows[rows["skipped"].isna()]
    reasons = rows.loc[rows["skipped"].notna(), "skipped"].value_counts().to_dict()
    return {
        "given": int(len(rows)),
        "comparable": int(len(rows)) - sum(n for r, n in reasons.items() if r in (NOTHING_TO_PREDICT, LOAD_NOT_STATED)),
        "modelled": int(len(modelled)),
        "coverage_by_gpu": {str(g): {"given": int(len(grp)), "modelled": int(grp["skipped"].isna().sum())}
                            for g, grp in rows.groupby("gpu")} if "gpu" in rows.columns else {},
        "skipped_reasons": {str(k): int(v) for k, v in reasons.items()},
        "by_gpu_model_metric": error_table(modelled, ["gpu", "model"]),
        "by_gpu_metric": error_table(modelled, ["gpu"]),
        "overall": error_table(modelled, []),
    }


def calibrated_gpus() -> list[str]:
    """GPUs whose shipped profile has fitted efficiency parameters (the default validation scope)."""
    from capacity.inputs.hardware import list_gpus

    return [g.name for g in list_gpus()
            if any(g.provenance[f"efficiency.{k}"].basis == "fitted" for k in g.efficiency)]


def run(files: list[str] | None = None, workers: int = 2, max_rows: int | None = None,
        progress: bool = True, gpu_overrides: dict | None = None,
        prompts_per_user: int = PROMPTS_PER_USER, rows: pd.DataFrame | None = None,
        gpus: list[str] | None = None) -> ValidationReport:
    """Simulate measured rows. Without files: the shipped vLLM rows of the calibrated GPUs
    (`gpus` narrows any file to those GPUs; ["all"] keeps every row)."""
    if rows is None:
        paths = [Path(f) for f in files] if files else default_files()
        rows = pd.concat([read_measurements(p) for p in paths], ignore_index=True)
        if gpus is None and not files:
            gpus = calibrated_gpus()
        if gpus and gpus != ["all"]:
            wanted = {g.upper() for g in gpus}
            rows = rows[rows["gpu"].str.upper().isin(wanted)].reset_index(drop=True)
    records = rows.to_dict(orient="records")
    if max_rows is not None:
        modelled = [i for i, r in enumerate(records) if row_scenario(r)[0] is not None][:max_rows]
        records = [records[i] for i in modelled]
        rows = rows.iloc[modelled].reset_index(drop=True)
    jobs = [(r, gpu_overrides, prompts_per_user) for r in records]
    results: list[dict[str, Any]] = []
    workers = max(1, min(workers, os.cpu_count() or 1))
    prog = Progress("validate", progress)
    if workers == 1 or len(jobs) < 4:
        for i, job in enumerate(jobs):
            results.append(_predict_star(job))
            prog.update("rows", i + 1, len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, res in enumerate(pool.map(_predict_star, jobs, chunksize=1)):
                results.append(res)
                prog.update("rows", i + 1, len(jobs))
    prog.close()
    pred = pd.DataFrame(results, index=rows.index)
    out = pd.concat([rows, pred], axis=1)
    if "skipped" not in out.columns:
        out["skipped"] = None
    if gpu_overrides is None and max_rows is None:
        out = with_blog_series(out, rows, workers, progress)
    return ValidationReport(out, summarize(out))


SERIES_METRIC_COLUMN = {"tok_s_per_user": "tok_s_per_user", "reported_tok_s_per_gpu": REPORTED, "e2e_ms": "e2e_ms"}
PINNED = "speculative row used to pin its series' unreported acceptance rate"


def with_blog_series(out: pd.DataFrame, rows: pd.DataFrame, workers: int, progress: bool) -> pd.DataFrame:
    """Fill in the ROCm blog rows the row-by-row mapping cannot model, with the speculative serving
    check (capacity.fidelity.spec_serving.predict_serving_rows): speculative rows whose acceptance is not
    stated (the seed article's profile of the same drafter, or one i.i.d. rate per series pinned on
    its lowest load, that row then counting as skipped) and baselines measured only in
    `reported_value`. Every prediction is the simulated value itself, and says its assumptions."""
    from capacity.fidelity import spec_serving as validate_spec_serving

    if "source_id" not in rows.columns:
        return out
    open_rows = out["skipped"].isin([SPEC_WITHOUT_ACCEPTANCE, NOTHING_TO_PREDICT]) \
        & out["source_id"].astype(str).str.startswith(validate_spec_serving.SERVING_SOURCE_PREFIX)
    if not open_rows.any():
        return out
    table, _ = validate_spec_serving.predict_serving_rows(rows=rows, workers=workers, progress=progress)
    out = out.copy()
    for col in ["assumptions", "stable"] + [f"predicted_{c}" for c in SERIES_METRIC_COLUMN.values()]:
        if col not in out.columns:
            out[col] = None if col in ("assumptions", "stable") else np.nan
    for t in table.to_dict(orient="records"):
        i = t["row_index"]
        if not open_rows.get(i, False):
            continue
        if t["status"] == "skipped":
            if out.at[i, "skipped"] == SPEC_WITHOUT_ACCEPTANCE:
                out.at[i, "skipped"] = f"speculative row, acceptance not stated: {t['reason']}"
        elif "pinned" in t["status"]:
            out.at[i, "skipped"] = PINNED
        else:
            out.at[i, f"predicted_{SERIES_METRIC_COLUMN[t['metric']]}"] = t["predicted_absolute"]
            out.at[i, "skipped"] = None
            out.at[i, "stable"] = t["simulation_stable"]
            out.at[i, "assumptions"] = t["assumptions"]
    return out


def write(report: ValidationReport, out: Path) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    report.rows.to_csv(out / "rows.csv", index=False)
    (out / "summary.json").write_text(json.dumps(report.summary, indent=2))
