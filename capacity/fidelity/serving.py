"""Predict measured serving rows with the simulator and report the error.

Each serving row becomes the scenario that reproduces it (`capacity.measurements.row_scenario`: the
row's GPU, model, precision and TP, its load, and the lengths its benchmark client drew) and is
simulated; every measured column the simulator can produce gets a `predicted_<column>`; a row that
cannot be modelled says why in `skipped`. A speculative row is simulated with its stated method, N
and mean accepted length; the ROCm blog rows that do not state them are handed to the speculative
serving check (`with_blog_series`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from capacity.errors import CapacityError
from capacity.fidelity.common import error_table, pool_map
from capacity.fidelity.spec_serving import SERVING_SOURCE_PREFIX, predict_serving_rows
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import list_gpus, load_gpu
from capacity.inputs.step_cost_fidelity import transferred_from
from capacity.measurements.clients import v0_engine
from capacity.measurements.row_scenario import (LOAD_NOT_STATED, NOTHING_TO_PREDICT, PROMPTS_PER_USER,
                                                SPEC_WITHOUT_ACCEPTANCE, row_scenario, row_stream)
from capacity.measurements.schemas import REPORTED, default_serving_file, read_measurements
from capacity.sim import simulate


def default_files() -> list[Path]:
    return [default_serving_file()]


def predict_row(row: dict[str, Any], gpu_overrides: dict | None = None,
                prompts_per_user: int = PROMPTS_PER_USER) -> dict[str, Any]:
    """Simulate one measured row; returns {predicted_<col>: value, ..., skipped: reason|None}."""
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
        if any(g["model"].endswith(V0_LABEL) for g in s["by_gpu_model_metric"]):
            lines.append(V0_FOOTNOTE)
        lines.append("")
        lines.append("All modelled rows, by GPU:")
        for g in s["by_gpu_metric"]:
            lines.append(f"{g['gpu']:8} {g['metric']:22} {g['n']:5d} {g['median_ape']:10.1%} {g['p90_ape']:8.1%}")
        return "\n".join(lines)


# Rows of vLLM < 0.8 (the V0 engine, whose scheduler is not the one simulated) are predicted but never fitted
# (calibrate.fit_exclusion); their table rows say so, so that a reader meets their errors with the reason.
V0_LABEL = " [V0 engine]"
V0_FOOTNOTE = (f"{V0_LABEL.strip()}: vLLM < 0.8 ran the V0 engine, whose scheduler is not the one simulated: predicted, "
               "never fitted (docs/seed_validation.md sections 7 and 10)")


def _model_label(row: pd.Series) -> str:
    return f"{row['model']}{V0_LABEL}" if v0_engine(row.to_dict()) else str(row["model"])


def summarize(rows: pd.DataFrame) -> dict[str, Any]:
    modelled = rows[rows["skipped"].isna()]
    if len(modelled) and "model" in modelled.columns:
        modelled = modelled.assign(model=modelled.apply(_model_label, axis=1))
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
    return [g.name for g in list_gpus()
            if any(g.provenance[f"efficiency.{k}"].basis == "fitted" for k in g.efficiency)]


def _sibling_hint(gpus: list[str]) -> str:
    """'; its efficiencies are X's (...)' for a GPU whose profile carries a sibling's fit, else ''."""
    for profile in map(load_gpu, gpus):
        sibling = transferred_from(profile)
        if sibling:
            return (f"; {profile.name}'s efficiencies are {sibling}'s (family transfer): "
                    f"`capacity validate --gpu {sibling}` checks them")
    return ""


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
            # a name that is neither a measured GPU nor a profile is a typo, not a GPU without rows
            measured = set(rows["gpu"].astype(str).str.upper())
            for g in gpus:
                if g.upper() not in measured:
                    load_gpu(g)
            rows = rows[rows["gpu"].str.upper().isin(wanted)].reset_index(drop=True)
            if rows.empty:
                raise CapacityError(f"no shipped serving rows for {', '.join(gpus)}: nothing to validate{_sibling_hint(gpus)}")
    records = rows.to_dict(orient="records")
    if max_rows is not None:
        modelled = [i for i, r in enumerate(records) if row_scenario(r)[0] is not None][:max_rows]
        records = [records[i] for i in modelled]
        rows = rows.iloc[modelled].reset_index(drop=True)
    jobs = [(r, gpu_overrides, prompts_per_user) for r in records]
    results = pool_map(_predict_star, jobs, workers, progress, "rows", title="validate", serial_below=4)
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
    if "source_id" not in rows.columns:
        return out
    open_rows = out["skipped"].isin([SPEC_WITHOUT_ACCEPTANCE, NOTHING_TO_PREDICT]) \
        & out["source_id"].astype(str).str.startswith(SERVING_SOURCE_PREFIX)
    if not open_rows.any():
        return out
    table, _ = predict_serving_rows(rows=rows, workers=workers, progress=progress)
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
    out.mkdir(parents=True, exist_ok=True)
    report.rows.to_csv(out / "rows.csv", index=False)
    (out / "summary.json").write_text(json.dumps(report.summary, indent=2))
