"""`capacity report RESULTS`: one self-contained HTML page (and optionally PNG/SVG files) for a results
folder written by `capacity simulate --out`, `validate --out`, `sweep --out` or `plan --out`.

The kind of folder is told by the files in it (first match wins):

* plan: ``plan.json`` (+ ``evidence/<name>/requests.csv``)
* sweep: ``sweep.json`` or ``results.jsonl`` (one JSON object per grid point)
* validate: ``rows.csv`` (+ ``summary.json``)
* simulate: ``result.json`` (+ ``requests.csv``, ``scenario.yaml``)

The page has a header (what, scenario, commit, date), a short summary of the key numbers, every figure
the data allows (capacity.report.figures; the ones it does not are listed with the reason) and the
draft-and-verify view (capacity.report.explainer). plotly.js is embedded once, inline, so the page opens
offline. ``--png DIR`` also writes each figure as PNG and SVG with kaleido (which draws in a headless
Chrome/Chromium: BROWSER_PATH if set, else chromium/google-chrome on PATH) and a ``summary.md`` that
links them.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from capacity.report import figures as F
from capacity.report.explainer import alpha_for, explainer_figure, explainer_section
from capacity.report.page import figure_div, page
from capacity.errors import CapacityError
from capacity.fidelity.common import error_table
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.sim.summary import speculation_lines
from capacity.spec.decoding import build_speculation
from capacity.util.text import quote

KINDS = (
    ("plan", ("plan.json",)),
    ("sweep", ("sweep.json", "results.jsonl")),
    ("validate", ("rows.csv",)),
    ("simulate", ("result.json",)),
)
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
PNG_WIDTH = 1200


@dataclass
class Report:
    kind: str
    folder: Path
    scenario: str
    source: str                                   # the provenance line the figures carry
    summary: list[str] = field(default_factory=list)
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)    # (slug, figure)
    skipped: list[tuple[str, str]] = field(default_factory=list)          # (figure, why not drawn)
    # where the draft-and-verify view opens: the run's (alpha, N, in words), None for its defaults
    explainer_start: tuple[float, int, str] | None = None
    generated: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))

    @property
    def title(self) -> str:
        return f"capacity {self.kind} report: {self.scenario}"


# ---------------------------------------------------------------------------------- reading
def detect_kind(folder: Path) -> str:
    try:
        is_dir = folder.is_dir()
    except (OSError, ValueError):     # a name too long for the file system, a NUL byte
        is_dir = False
    if not is_dir:
        raise CapacityError(f"{quote(str(folder))} is not a folder; give the --out folder of capacity simulate, validate, sweep or plan")
    for kind, names in KINDS:
        if any((folder / n).is_file() for n in names):
            return kind
    looked = "; ".join(f"{' or '.join(names)} ({kind})" for kind, names in KINDS)
    raise CapacityError(f"{folder} is not a capacity results folder: looked for {looked}")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise CapacityError(f"{path}: not readable JSON ({quote((str(e).splitlines() or [type(e).__name__])[0])})") from None


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except Exception as e:  # noqa: BLE001 - pandas raises several types for a broken CSV
        raise CapacityError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None


def read_sweep_rows(path: Path) -> pd.DataFrame:
    """results.jsonl as a DataFrame; nested objects are flattened with '_' (ttft_ms: {p99} -> ttft_ms_p99)."""
    try:
        df = pd.read_json(path, lines=True)
    except ValueError as e:
        raise CapacityError(f"{path}: not JSON lines ({str(e).splitlines()[0]})") from None
    if df.empty:
        raise CapacityError(f"{path}: no grid point in it")
    for col in [c for c in df.columns if df[c].map(lambda v: isinstance(v, dict)).any()]:
        flat = pd.json_normalize(df[col].map(lambda v: v if isinstance(v, dict) else {}).tolist(), sep="_")
        flat.columns = [f"{col}_{c}" for c in flat.columns]
        df = pd.concat([df.drop(columns=[col]), flat.set_index(df.index)], axis=1)
    return df


def _commit_of(*objs: Any) -> str | None:
    for o in objs:
        if isinstance(o, dict):
            for k in ("commit", "git_commit", "code_commit"):
                if o.get(k):
                    return str(o[k])
    return None


def _scenario_name(sc: Any, default: str) -> str:
    if isinstance(sc, dict):
        return str(sc.get("name") or default)
    if isinstance(sc, str) and sc:
        return Path(sc).stem if sc.endswith((".yaml", ".yml")) else sc
    return default


# ---------------------------------------------------------------------------------- numbers
def _f(v: Any, fmt: str = "{:,.1f}") -> str:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "n/a"
    return fmt.format(x) if math.isfinite(x) else "n/a"


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def payload_lines(payload: dict[str, Any]) -> list[str]:
    """Key numbers of a simulate payload (result.json)."""
    sc, m = payload.get("scenario") or {}, payload.get("metrics") or {}
    d, sp = sc.get("deployment") or {}, sc.get("speculative") or {}
    lines = [f"Deployment: {d.get('model', '?')} on {d.get('replicas', 1)} × TP{d.get('tensor_parallel_size', 1)} "
             f"{d.get('gpu', '?')} = {payload.get('num_gpus', '?')} GPU(s); speculation: "
             + (f"{sp.get('method')} N = {sp.get('num_speculative_tokens')}"
                if sp.get("method", "none") != "none" and sp.get("num_speculative_tokens") else "off")]
    rate = _get(sc, "traffic", "arrival", "rate_rps")
    conc = _get(sc, "traffic", "arrival", "concurrency")
    load = f"{_f(rate, '{:g}')} requests/s offered" if rate is not None else (
        f"{conc} concurrent users" if conc is not None else "")
    lines.append(f"Run: {'stable' if payload.get('stable', m.get('stable')) else 'UNSTABLE (queue grows without bound)'}; "
                 f"{m.get('completed', '?')}/{m.get('num_requests', '?')} requests completed" + (f"; {load}" if load else ""))
    lines.append(f"Throughput: {_f(m.get('output_throughput_tok_s_per_gpu'), '{:,.0f}')} output tok/s per GPU; "
                 f"{_f(m.get('request_throughput_rps'), '{:.2f}')} requests/s; goodput {_f(m.get('goodput_rps'), '{:.2f}')} requests/s")
    lines.append(f"Latency: TTFT p50 {_f(_get(m, 'ttft_ms', 'p50'), '{:,.0f}')} ms, p99 {_f(_get(m, 'ttft_ms', 'p99'), '{:,.0f}')} ms; "
                 f"TPOT p50 {_f(_get(m, 'tpot_ms', 'p50'))} ms, p90 {_f(_get(m, 'tpot_ms', 'p90'))} ms; "
                 f"{_f(_get(m, 'tok_s_per_user', 'p50'))} tok/s per user (median)")
    if m.get("slo"):
        lines.append("SLOs: " + "; ".join(
            f"{s.get('slo')} → {_f(s.get('achieved'))} {'met' if s.get('met') else 'MISSED'}" for s in m["slo"]))
    base = _get(payload, "without_speculation", "metrics")
    if isinstance(base, dict):
        lines.append(f"Without speculation (same traffic): {_f(base.get('output_throughput_tok_s_per_gpu'), '{:,.0f}')} "
                     f"output tok/s per GPU; TPOT p50 {_f(_get(base, 'tpot_ms', 'p50'))} ms; "
                     f"{_f(_get(base, 'tok_s_per_user', 'p50'))} tok/s per user (median); goodput "
                     f"{_f(base.get('goodput_rps'), '{:.2f}')} requests/s")
    return lines


def _acceptance_line(requests: pd.DataFrame | None) -> list[str]:
    if requests is None or not {"spec_accepted", "spec_steps"} <= set(requests.columns):
        return []
    steps = pd.to_numeric(requests.spec_steps, errors="coerce").sum()
    if not steps > 0:
        return []
    acc = pd.to_numeric(requests.spec_accepted, errors="coerce").sum()
    return [f"Mean accepted length: {1 + acc / steps:.2f} tokens per verification step ({int(steps):,} steps)"]


def scenario_acceptance(sc: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """S_1..S_N of the acceptance model the simulator builds for this scenario (same construction as
    simulate.deploy: GPU, model, drafting.build_speculation), or (None, why not)."""
    sp = sc.get("speculative") or {}
    n = int(sp.get("num_speculative_tokens") or 0)
    if str(sp.get("method", "none")).lower() in ("none", "") or n <= 0:
        return None, "speculation is off"
    try:
        d = sc.get("deployment") or {}
        gpu = load_gpu(d["gpu"])
        if d.get("gpu_overrides"):
            gpu = gpu.with_overrides(**d["gpu_overrides"])
        model = load_model(d["model"], weight_precision=d.get("precision"), kv_dtype=d.get("kv_cache_dtype", "bf16"))
        spec = build_speculation(sp, gpu, model, int(d.get("tensor_parallel_size", 1)))
        acc = spec.acceptance
        if acc is None:
            return None, "the scenario builds no acceptance model"
        cfg = sp.get("acceptance")
        label = (f"{cfg.get('model', 'profile')} " + ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "model")
                 if isinstance(cfg, dict) else "default profile")
        return np.asarray(acc.survival(n), float), f"{sp.get('method')} N={n}, {label.strip()}"
    except (CapacityError, KeyError, TypeError, ValueError) as e:
        return None, f"cannot rebuild the acceptance model ({str(e).splitlines()[0] if str(e) else type(e).__name__})"


# ---------------------------------------------------------------------------------- per kind
def _try(rep: Report, slug: str, title: str, make) -> None:
    try:
        rep.figures.append((slug, make()))
    except CapacityError as e:
        rep.skipped.append((title, str(e)))


def _requests_figures(rep: Report, runs: dict[str, pd.DataFrame], sc: dict[str, Any]) -> None:
    slo = sc.get("slo")
    if runs:
        _try(rep, "latency_cdf", "TTFT and TPOT CDFs", lambda: F.latency_cdf_figure(runs, slo, source=rep.source))
    else:
        rep.skipped.append(("TTFT and TPOT CDFs", "no requests.csv in the folder"))
    first = next(iter(runs.values()), None)
    if first is None:
        return
    if not {"spec_accepted", "spec_steps"} <= set(first.columns) or not (
            pd.to_numeric(first.spec_steps, errors="coerce") > 0).any():
        rep.skipped.append(("Acceptance per position", "the run did not use speculative decoding"))
        return
    steps = pd.to_numeric(first.spec_steps, errors="coerce").sum()
    n = (sc.get("speculative") or {}).get("num_speculative_tokens")
    if steps > 0 and isinstance(n, int) and n >= 1:
        tau = 1.0 + float(pd.to_numeric(first.spec_accepted, errors="coerce").sum()) / float(steps)
        alpha = alpha_for(tau, min(n, 8))
        rep.explainer_start = (alpha, n, f"Opens at this run's N = {n} and the α ≈ {alpha:.2f} whose closed form "
                                         f"gives its {tau:.2f} tokens per round (acceptance per position varies in "
                                         f"the run; the view assumes one α for every position). Press play to "
                                         f"step through the rounds.")
    surv, label = scenario_acceptance(sc)
    if surv is None:
        rep.summary.append(f"Acceptance model curve not drawn: {label}")
    _try(rep, "acceptance", "Acceptance per position",
         lambda: F.acceptance_figure(first, surv, source=rep.source, model_label=label))


def _load_simulate(folder: Path) -> Report:
    payload = _read_json(folder / "result.json")
    sc = payload.get("scenario") or {}
    name = _scenario_name(sc, folder.name)
    rep = Report("simulate", folder, name, F.provenance(name, _commit_of(payload)))
    req = _read_csv(folder / "requests.csv") if (folder / "requests.csv").is_file() else None
    rep.summary += payload_lines(payload) + _acceptance_line(req)
    _requests_figures(rep, {"simulated": req} if req is not None else {}, sc)
    pc = _get(payload, "metrics", "prefix_cache")
    if req is not None and "cached_tokens" in req:
        _try(rep, "prefix_cache", "Prefix cache hits", lambda: F.prefix_cache_figure(req, pc, source=rep.source))
    else:
        rep.skipped.append(("Prefix cache hits", "the run had prefix caching off (engine.enable_prefix_caching)"))
    _speculation_by_load(rep, payload.get("speculation_by_batch"))
    return rep


def _speculation_by_load(rep: Report, sb: Any) -> None:
    """The speedup-by-load figure of a speculative run (plan recommendation or simulate payload)."""
    if isinstance(sb, dict) and sb.get("curve"):
        _try(rep, "speculation_by_load", "Where speculation pays",
             lambda: F.speculation_by_load_figure(sb, source=rep.source))


def _load_validate(folder: Path) -> Report:
    rows = _read_csv(folder / "rows.csv")
    summ = _read_json(folder / "summary.json") if (folder / "summary.json").is_file() else {}
    files = sorted(set(rows["file"].dropna().astype(str))) if "file" in rows.columns else []
    name = "measured rows " + (", ".join(files) if files else folder.name)
    rep = Report("validate", folder, name, F.provenance(name, _commit_of(summ)))
    modelled = rows[rows["skipped"].isna()] if "skipped" in rows.columns else rows
    rep.summary.append(f"Rows: {len(modelled)} of {len(rows)} modelled"
                       + (f" ({len(rows) - len(modelled)} skipped)" if len(rows) > len(modelled) else ""))
    overall = summ.get("overall") if isinstance(summ, dict) else None
    if not overall:
        try:
            overall = error_table(modelled, [])
        except (KeyError, TypeError, ValueError):
            overall = []
    for g in overall or []:
        rep.summary.append(f"{F.METRIC_LABELS.get(g['metric'], g['metric'])}: median error {g['median_ape']:.1%}, "
                           f"p90 {g['p90_ape']:.1%} over {g['n']} rows")
    _try(rep, "predicted_vs_measured", "Predicted vs measured", lambda: F.validation_figure(modelled, source=rep.source))
    return rep


def _load_sweep(folder: Path) -> Report:
    manifest = _read_json(folder / "sweep.json") if (folder / "sweep.json").is_file() else {}
    if not (folder / "results.jsonl").is_file():
        raise CapacityError(f"{folder}: sweep.json but no results.jsonl (has the sweep finished?)")
    rows = read_sweep_rows(folder / "results.jsonl")
    name = _scenario_name((manifest.get("scenario") or manifest.get("base_scenario") or manifest.get("name"))
                          if isinstance(manifest, dict) else None, folder.name)
    rep = Report("sweep", folder, name, F.provenance(name, _commit_of(manifest, rows.iloc[0].to_dict())))
    stable = F._stable_mask(rows)
    rep.summary.append(f"Grid: {len(rows)} points, {int(stable.sum())} stable")
    keys = [c for c in rows.columns if "." in c]
    for k in keys:
        vals = list(dict.fromkeys(rows[k].dropna().tolist()))
        if len(vals) > 1:
            rep.summary.append(f"Varied {k}: {', '.join(map(str, vals[:12]))}{' …' if len(vals) > 12 else ''}")
    y = "output_throughput_tok_s_per_gpu"
    if y in rows.columns:
        ok = stable.copy()
        if "slo_met" in rows.columns:
            ok &= rows.slo_met.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0")).astype(bool)
        cand = rows[ok & pd.to_numeric(rows[y], errors="coerce").notna()]
        if len(cand):
            best = cand.loc[pd.to_numeric(cand[y]).idxmax()]
            where = ", ".join(f"{k}={best[k]}" for k in keys if rows[k].nunique() > 1)
            rep.summary.append(f"Highest throughput of a stable point{' meeting the SLOs' if 'slo_met' in rows else ''}: "
                               f"{_f(best[y], '{:,.0f}')} output tok/s per GPU"
                               + (f" (point {best['point_id']}" if "point_id" in rows else " (")
                               + (f"; {where})" if where else ")"))
    _try(rep, "pareto", "Throughput per GPU vs tokens/s per user", lambda: F.pareto_figure(rows, source=rep.source))
    _try(rep, "speedup", "Speedup vs N and vs load", lambda: F.speedup_figure(rows, source=rep.source))
    _try(rep, "gpus_vs_traffic", "GPUs needed vs traffic", lambda: F.gpus_vs_traffic_figure(rows, source=rep.source))
    return rep


def _plan_base_rate(plan: dict[str, Any]) -> float | None:
    rec = plan.get("recommendation") or {}
    for v in (plan.get("target_rate_rps"), plan.get("rate_rps"), _get(plan, "traffic", "rate_rps"),
              rec.get("rate_rps"), rec.get("target_rate_rps"),
              _get(plan, "evidence", "recommended", "scenario", "traffic", "arrival", "rate_rps")):
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x) and x > 0:
            return x
    return None


def _headroom(rec: dict[str, Any]) -> float:
    try:
        h = float(rec.get("headroom") or 0.0)
    except (TypeError, ValueError):
        return 0.0
    return h if math.isfinite(h) and h > 0 else 0.0


def _slo_unit(slo: Any) -> str:
    """The unit the plan's achieved values are in: milliseconds for latencies, tokens/s for speed per user."""
    return "tok/s" if str(slo).startswith("tok_s_per_user") else "ms"


def _plan_verdict(s: dict) -> str:
    """'met, margin 12 % ± 4 %' (older plan.json files: 'met' / 'MISSED')."""
    word = "met" if s.get("met") else "MISSED"
    if not isinstance(s.get("margin"), (int, float)):
        return word
    pm = s.get("margin_pm")
    iv = s.get("margin_interval")
    close = isinstance(iv, list) and len(iv) == 2 and iv[0] < 0.0 < iv[1]
    return (f"{word}, margin {s['margin'] * 100:.0f} %" + (f" ± {pm * 100:.0f} %" if isinstance(pm, (int, float)) else "")
            + (": within the run's uncertainty" if close else ""))


def _load_plan(folder: Path) -> Report:
    plan = _read_json(folder / "plan.json")
    if not isinstance(plan, dict):
        raise CapacityError(f"{folder / 'plan.json'}: expected an object with recommendation, candidates, evidence")
    rec = plan.get("recommendation") or {}
    evidence = plan.get("evidence") or {}
    sc = _get(evidence, "recommended", "scenario") or {}
    name = _scenario_name(plan.get("scenario") or sc, folder.name)
    rep = Report("plan", folder, name, F.provenance(name, _commit_of(plan)))
    if rec:
        spec = (f"{rec.get('method')} N = {rec.get('num_speculative_tokens')}"
                if rec.get("method") not in (None, "none") and rec.get("num_speculative_tokens") else "no speculation")
        rep.summary.append(f"Recommendation: {rec.get('replicas', '?')} × TP{rec.get('tensor_parallel_size', '?')} "
                           f"{rec.get('gpu', '?')} = {rec.get('total_gpus', '?')} GPUs, {spec}; "
                           f"${_f(rec.get('cost_per_hour_usd'), '{:,.2f}')}/h, "
                           f"${_f(rec.get('cost_per_million_output_tokens_usd'), '{:,.3f}')} per million output tokens")
        slo = rec.get("slo")
        if slo:
            at = f" at {_f(rec.get('confirmed_at_rps'), '{:g}')} req/s (target × (1 + headroom))" if rec.get("confirmed_at_rps") else ""
            rep.summary.append(f"SLOs{at}: " + "; ".join(
                (f"{s.get('slo')} → {_f(s.get('achieved'))} {_slo_unit(s.get('slo'))} {_plan_verdict(s)}" if isinstance(s, dict)
                 else str(s)) for s in (slo if isinstance(slo, list) else [slo])))
        dep = rec.get("deployment")
        if isinstance(dep, dict) and dep.get("servers"):
            rep.summary.append(f"Deployment: {dep.get('servers')} server(s) of {dep.get('gpus_per_server')} {dep.get('gpu')} "
                               f"({dep.get('gpus')} GPUs, {dep.get('replicas')} replica(s) of TP{dep.get('tensor_parallel_size')}); "
                               f"each replica: {dep.get('vllm_serve')}")
            if dep.get("vllm_bench_serve"):
                rep.summary.append(f"Check one replica: {dep['vllm_bench_serve']}")
        ctx = rec.get("context")
        if isinstance(ctx, dict) and ctx.get("model"):
            rep.summary.append(f"For {ctx.get('model')} ({ctx.get('precision')} weights), {ctx.get('traffic')}"
                               + (f"; binding SLO {ctx['binding_slo']}" if ctx.get("binding_slo") else "")
                               + (f". {ctx['acceptance_in_words']}" if ctx.get("acceptance_in_words") else ""))
            err = ctx.get("step_cost_error")
            if isinstance(err, dict) and err.get("in_words"):
                rep.summary.append("Step cost: " + err["in_words"]
                                   + (f" So {err['against_binding_margin']}" if err.get("against_binding_margin") else ""))
        sens = rec.get("sensitivity")
        if isinstance(sens, list) and sens:
            rep.summary.append("What if (re-planned by simulation): " + "; ".join(
                f"{x.get('what_if')}: {x.get('gpus') if x.get('gpus') is not None else 'none fits'} GPUs"
                for x in sens if isinstance(x, dict)) + f" (recommended: {rec.get('total_gpus')} GPUs)")
        if rec.get("acceptance_basis"):
            rep.summary.append(f"Drafter acceptance: {rec['acceptance_basis']}")
        if isinstance(rec.get("speculation_by_batch"), dict):
            rep.summary.append("Speculation by load: " + "; ".join(
                line.strip() for line in speculation_lines(rec["speculation_by_batch"])).removeprefix("speculation: "))
    base = _plan_base_rate(plan)
    if base:
        h = _headroom(rec)
        rep.summary.append(f"Traffic today: {base:g} requests/s" + (f" (sized for +{h:.0%} headroom)" if h else ""))
    cands = pd.DataFrame(plan.get("candidates") or [])
    if len(cands):
        feas = cands["feasible"].map(lambda v: str(v).strip().lower() in ("true", "1")) if "feasible" in cands else None
        rep.summary.append(f"Candidates: {len(cands)} configurations"
                           + (f", {int(feas.sum())} feasible" if feas is not None else ""))
    for nm in ("recommended", "one_fewer_replica"):
        p = evidence.get(nm)
        if isinstance(p, dict) and p.get("metrics"):
            m = p["metrics"]
            rep.summary.append(f"Evidence {nm.replace('_', ' ')}: {'stable' if p.get('stable') else 'UNSTABLE'}, "
                               f"{p.get('num_gpus', '?')} GPUs, TTFT p99 {_f(_get(m, 'ttft_ms', 'p99'), '{:,.0f}')} ms, "
                               f"TPOT p90 {_f(_get(m, 'tpot_ms', 'p90'))} ms, SLOs "
                               f"{'met' if m.get('slo_met') else 'missed' if m.get('slo_met') is False else 'n/a'}")
    for run in (rec.get("comparison") or []) if rec else []:
        m = run.get("metrics") or {}
        if m:
            rep.summary.append(
                f"At {_f(rec.get('target_rate_rps'), '{:g}')} req/s, {run.get('label')} ({run.get('config')}, {run.get('gpus')} GPUs): "
                f"output {_f(m.get('steady.output_throughput_tok_s_per_gpu'), '{:,.0f}')} tok/s per GPU (steady), "
                f"TTFT p99 {_f(_get(m, 'ttft_ms', 'p99'), '{:,.0f}')} ms, TPOT p90 {_f(_get(m, 'tpot_ms', 'p90'))} ms, "
                f"{_f(_get(m, 'tok_s_per_user', 'p50'))} tok/s per user (median), SLOs "
                f"{'met' if run.get('slo_met') else 'missed'}")
    if len(cands):
        _try(rep, "pareto", "Throughput per GPU vs tokens/s per user", lambda: F.pareto_figure(cands, source=rep.source))
        _try(rep, "gpus_vs_growth", "GPUs needed vs traffic growth",
             lambda: F.gpus_vs_growth_figure(cands, base, source=rep.source, recommended_gpus=rec.get("total_gpus"),
                                             headroom=_headroom(rec)))
    else:
        rep.skipped.append(("GPUs needed vs traffic growth", "plan.json has no candidates"))
    runs = {}
    ev_dir = folder / "evidence"
    if ev_dir.is_dir():
        order = ["recommended", "one_fewer_replica"]
        names = sorted((p.name for p in ev_dir.iterdir() if (p / "requests.csv").is_file()),
                       key=lambda n: (order.index(n) if n in order else len(order), n))
        runs = {n.replace("_", " "): _read_csv(ev_dir / n / "requests.csv") for n in names}
    rep.summary += _acceptance_line(next(iter(runs.values()), None))
    pc = (rec or {}).get("prefix_caching")
    if isinstance(pc, dict):
        rep.summary.append(f"Prefix caching: {pc.get('gpus')} GPUs with it (hit rate "
                           f"{_f(100 * (pc.get('prefix_cache_hit_rate') or 0), '{:.0f}')} %, router {pc.get('router')}), "
                           f"{pc.get('gpus_without_caching') if pc.get('gpus_without_caching') is not None else 'none fits'} "
                           f"without")
        _try(rep, "prefix_caching", "Prefix caching: GPUs with and without it",
             lambda: F.prefix_caching_plan_figure(pc, source=rep.source))
    dl = (rec or {}).get("daily")
    if isinstance(dl, dict):
        rep.summary.append(f"Over the day: {dl.get('gpu_hours_per_day_following', 0):,.0f} GPU-hours if replicas follow "
                           f"the rate profile, {dl.get('gpu_hours_per_day_at_peak', 0):,.0f} at the peak all day")
        _try(rep, "daily", "GPUs over the day", lambda: F.daily_figure(dl, source=rep.source))
    _requests_figures(rep, runs, sc if isinstance(sc, dict) else {})
    _speculation_by_load(rep, (rec or {}).get("speculation_by_batch"))
    return rep


LOADERS = {"plan": _load_plan, "sweep": _load_sweep, "validate": _load_validate, "simulate": _load_simulate}


def build_report(folder: str | Path) -> Report:
    folder = Path(folder)
    kind = detect_kind(folder)
    try:
        return LOADERS[kind](folder)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, OverflowError) as e:
        # a file of the right name whose content is not what `capacity KIND --out` writes (edited, truncated, other tool)
        raise CapacityError(f"{folder}: its {kind} result files are not as `capacity {kind} --out` writes them "
                            f"({type(e).__name__}: {quote(str(e))}); re-run capacity {kind} with --out") from None


# ---------------------------------------------------------------------------------- HTML
def report_html(rep: Report) -> str:
    esc = html.escape
    header = (f"<h1>{esc(rep.title)}</h1><p>{esc(rep.kind)} results from <code>{esc(str(rep.folder))}</code> · "
              f"{esc(rep.source)} · generated {esc(rep.generated)}</p>")
    summary = "<section class=\"summary\"><h2>Summary</h2><ul>" + "".join(f"<li>{esc(s)}</li>" for s in rep.summary) + "</ul>"
    if rep.skipped:
        summary += "<p class=\"skipped\">Not drawn: " + "; ".join(f"{esc(t)} ({esc(w)})" for t, w in rep.skipped) + "</p>"
    summary += "</section>"
    sections = [summary]
    for slug, fig in rep.figures:
        sections.append(f"<section class=\"figure\" id=\"section-{esc(slug)}\">{figure_div(fig, f'fig-{slug}')}</section>")
    start = rep.explainer_start
    sections.append(explainer_section(rep.source) if start is None else
                    explainer_section(rep.source, alpha=start[0], n=start[1], basis=start[2]))
    return page(rep.title, sections, header)


def write_report(folder: str | Path, out: str | Path | None = None, png: str | Path | None = None) -> tuple[Report, Path]:
    rep = build_report(folder)
    out = Path(out) if out else Path(folder) / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_html(rep), encoding="utf-8")
    if png:
        export_images(rep, Path(png))
    return rep, out


# ---------------------------------------------------------------------------------- PNG / SVG
def find_browser() -> str:
    """The Chrome/Chromium kaleido draws with: BROWSER_PATH (kaleido's and choreographer's documented
    override) if set, else chromium / google-chrome on PATH, else /usr/bin/chromium, else a Chrome
    that `kaleido_get_chrome` downloaded."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise CapacityError(f"BROWSER_PATH={env} is not an executable browser; point it at chromium or unset it")
    for name in BROWSER_NAMES:
        p = shutil.which(name)
        if p:
            return p
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    try:  # kaleido's own browser finder, an optional extra: only PNG export looks for it
        from choreographer.browsers.chromium import Chromium

        p = Chromium.find_browser(skip_local=False)
        if p:
            return str(p)
    except Exception:  # noqa: BLE001 - best effort
        pass
    raise CapacityError("PNG export draws with Chrome/Chromium and none was found: install it "
                        "(apt-get install -y chromium) or set BROWSER_PATH to its executable")


def _slugify(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def export_images(rep: Report, out_dir: Path) -> list[Path]:
    """Every figure (and the explainer at its default frame) as PNG and SVG, plus summary.md."""
    try:  # kaleido starts a browser bridge on import: only PNG export needs it
        import kaleido
    except ImportError:
        raise CapacityError("PNG export needs kaleido >= 1: pip install 'kaleido>=1'") from None
    browser = find_browser()
    out_dir.mkdir(parents=True, exist_ok=True)
    start = rep.explainer_start
    figs = rep.figures + [("draft_and_verify", explainer_figure(source=rep.source) if start is None else
                           explainer_figure(start[0], min(start[1], 8), source=rep.source))]
    specs, written, md = [], [], []
    for i, (slug, fig) in enumerate(figs, start=1):
        stem = f"{i:02d}_{_slugify(slug)}"
        d = fig.to_dict()
        height = int(fig.layout.height or F.HEIGHT)
        for ext in ("png", "svg"):
            path = out_dir / f"{stem}.{ext}"
            specs.append({"fig": d, "path": path,
                          "opts": {"format": ext, "width": PNG_WIDTH, "height": height, "scale": 1}})
            written.append(path)
        title = fig.layout.title.text or slug
        md.append(f"## {title}\n\n![{title}]({stem}.png)\n\n[SVG]({stem}.svg)\n")
    try:
        kaleido.write_fig_from_object_sync(specs, kopts={"path": browser, "mathjax": False})
    except Exception as e:  # noqa: BLE001 - kaleido/choreographer raise many types; one line for the user
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CapacityError(f"PNG export with {browser} failed: {msg}") from None
    empty = [p for p in written if not p.is_file() or p.stat().st_size == 0]
    if empty:
        raise CapacityError(f"PNG export with {browser} wrote no image for {empty[0].name}")
    head = [f"# {rep.title}", "", f"{rep.kind} results from `{rep.folder}` · {rep.source} · generated {rep.generated}", "",
            "## Summary", ""] + [f"- {s}" for s in rep.summary]
    if rep.skipped:
        head += ["", "Not drawn: " + "; ".join(f"{t} ({w})" for t, w in rep.skipped)]
    (out_dir / "summary.md").write_text("\n".join(head) + "\n\n" + "\n".join(md), encoding="utf-8")
    return written
