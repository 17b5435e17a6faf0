"""The report's figures: one function per figure, each returning a plotly Figure.

Every function takes plain data (a DataFrame of sweep/plan/validate rows, or per-request frames as
`capacity simulate --out` writes them to requests.csv) and a `source` string naming the scenario and
commit the data came from (see `provenance`); it is shown under the title so that a figure copied
out of a report still says where it came from. A figure the data cannot support raises
CapacityError with one line saying what is missing, so a notebook user sees why and the report can
list it as "not drawn".

    import pandas as pd
    from capacity.report import figures
    rows = pd.read_json("sweep/results.jsonl", lines=True)
    figures.pareto_figure(rows, source="sweep chatbot").show()
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from capacity.errors import CapacityError
from capacity.sim.metrics import parse_slos

__all__ = [
    "provenance", "code_version", "method_column", "n_column", "load_column",
    "pareto_figure", "speedup_figure", "speedup_table", "gpus_vs_growth_figure", "gpus_vs_traffic_figure",
    "latency_cdf_figure", "per_request_latencies", "acceptance_figure", "validation_figure",
    "speculation_by_load_figure", "prefix_cache_figure", "prefix_caching_plan_figure", "daily_figure", "METRIC_LABELS",
]

# Column names as the sweep writes them (dotted scenario keys) and shorter spellings plan rows use.
METHOD_COLUMNS = ("speculative.method", "method")
N_COLUMNS = ("speculative.num_speculative_tokens", "num_speculative_tokens")
LOAD_COLUMNS = {
    "traffic.arrival.rate_rps": "offered load (requests/s)",
    "rate_rps": "offered load (requests/s)",
    "traffic.arrival.concurrency": "concurrency (simultaneous users)",
    "concurrency": "concurrency (simultaneous users)",
}
NO_SPECULATION = "none"

# Measured columns of a validate rows.csv (capacity.measurements.schemas.PREDICTED) with their units.
METRIC_LABELS = {
    "output_tok_s_per_gpu": "output throughput (tok/s per GPU)",
    "total_tok_s_per_gpu": "total throughput (tok/s per GPU)",
    "tok_s_per_user": "speed per user (tok/s)",
    "ttft_ms": "TTFT (ms)",
    "tpot_ms": "TPOT (ms)",
    "e2e_ms": "E2E latency (ms)",
}

_PALETTE = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880",
            "#ff97ff", "#fecb52")
_NONE_COLOUR = "#555555"
HEIGHT = 480


# ------------------------------------------------------------------------------------ provenance
@lru_cache(maxsize=1)
def code_version() -> str:
    """'commit abc1234' of the checkout the package runs from, else 'capacity <version>'."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return f"commit {out.stdout.strip()}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"capacity {version('capacity')}"
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "capacity (version unknown)"


def provenance(scenario: str | None = None, commit: str | None = None) -> str:
    """The line every figure carries: 'scenario NAME · commit HASH' (commit: the one the results
    record, else this checkout's, else the package version)."""
    parts = []
    if scenario:
        parts.append(f"scenario {scenario}")
    parts.append(f"commit {commit}" if commit else code_version())
    return " · ".join(parts)


def _layout(fig: go.Figure, title: str, source: str, height: int = HEIGHT) -> go.Figure:
    if not source or source.startswith(" · "):          # no provenance given: this checkout's commit
        source = code_version() + (source or "")
    fig.update_layout(
        title={"text": title, "subtitle": {"text": source}, "x": 0.01, "xanchor": "left"},
        template="plotly_white", height=height, margin={"t": 105, "l": 70, "r": 30, "b": 60},
        legend={"orientation": "v"}, hovermode="closest",
    )
    return fig


def _colour(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


def _method_colours(methods: Sequence[str]) -> dict[str, str]:
    out, i = {}, 0
    for m in methods:
        if m == NO_SPECULATION:
            out[m] = _NONE_COLOUR
        else:
            out[m] = _colour(i)
            i += 1
    return out


# ---------------------------------------------------------------------------------- row helpers
def _first(df: pd.DataFrame, names: Sequence[str]) -> str | None:
    return next((c for c in names if c in df.columns), None)


def method_column(df: pd.DataFrame) -> str | None:
    return _first(df, METHOD_COLUMNS)


def n_column(df: pd.DataFrame) -> str | None:
    return _first(df, N_COLUMNS)


def load_column(df: pd.DataFrame) -> str | None:
    """The column that carries the traffic level (the first of LOAD_COLUMNS with more than one value,
    else the first present)."""
    present = [c for c in LOAD_COLUMNS if c in df.columns]
    varied = [c for c in present if df[c].nunique(dropna=True) > 1]
    return (varied or present or [None])[0]


def _methods(df: pd.DataFrame) -> pd.Series:
    """Method name per row; 'none' where speculation is off (method none/empty or N = 0)."""
    mcol, ncol = method_column(df), n_column(df)
    if mcol is None:      # N swept with the base scenario's method: N = 0 is the baseline
        m = pd.Series("speculative" if ncol is not None else "all rows", index=df.index)
    else:
        m = df[mcol].astype("string").fillna(NO_SPECULATION).str.strip().str.lower()
        m = m.mask(m.isin(["", "nan", "null", "off"]), NO_SPECULATION)
    if ncol is not None:
        n = pd.to_numeric(df[ncol], errors="coerce")
        m = m.mask(n.fillna(0) <= 0, NO_SPECULATION)
    return m.astype(object)


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce")


def _need(df: pd.DataFrame, cols: Sequence[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise CapacityError(f"{what} needs columns {', '.join(missing)}, which the rows do not have")


def _stable_mask(df: pd.DataFrame) -> pd.Series:
    if "stable" not in df.columns:
        return pd.Series(True, index=df.index)
    s = df["stable"]
    return s.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0", "yes")).astype(bool)


def _ordered_methods(values: Sequence[str]) -> list[str]:
    uniq = list(dict.fromkeys(values))
    return ([NO_SPECULATION] if NO_SPECULATION in uniq else []) + sorted(u for u in uniq if u != NO_SPECULATION)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both x and y (higher is better for both),
    sorted by x ascending."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    order = np.lexsort((-y, -x))          # x descending, ties: y descending
    keep, best = [], -math.inf
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    return np.array(sorted(keep, key=lambda i: x[i]), dtype=int)


def _hover(df: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    cols = [c for c in cols if c in df.columns]
    return ["<br>".join(f"{c} = {r[c]}" for c in cols) for _, r in df[cols].iterrows()] if cols else [""] * len(df)


# ------------------------------------------------------------------------------------- figures
def pareto_figure(rows: pd.DataFrame, *, source: str = "",
                  x: str = "tok_s_per_user_p50", y: str = "output_throughput_tok_s_per_gpu") -> go.Figure:
    """Throughput per GPU against speed per user, one trace per speculative method: every stable
    point as a marker, the method's Pareto frontier (no other point of the method is faster per user
    AND higher in throughput) as a line. Rows: sweep results or plan candidates with these columns."""
    _need(rows, [x, y], "the throughput-vs-speed figure")
    df = rows.assign(_m=_methods(rows), _x=_num(rows, x), _y=_num(rows, y))
    stable = _stable_mask(df)
    dropped = int((~stable).sum())
    df = df[stable & df._x.notna() & df._y.notna()]
    if df.empty:
        raise CapacityError(f"the throughput-vs-speed figure has no stable row with both {x} and {y}")
    fig = go.Figure()
    colours = _method_colours(_ordered_methods(df._m))
    hover_cols = ["label", "point_id", n_column(df) or "", load_column(df) or "", "num_gpus", "total_gpus"]
    gpu_col = _first(df, ("deployment.gpu", "gpu"))
    symbols = ("circle", "diamond", "square", "triangle-up", "cross", "x", "star", "pentagon")
    gpus = sorted(df[gpu_col].astype(str).unique()) if gpu_col else []
    symbol_of = {g: symbols[i % len(symbols)] for i, g in enumerate(gpus)}

    def marker_symbols(g: pd.DataFrame) -> list[str] | str:
        return [symbol_of[str(v)] for v in g[gpu_col]] if gpu_col and len(gpus) > 1 else "circle"

    for m, colour in colours.items():
        g = df[df._m == m]
        front = g.iloc[pareto_front(g._x.to_numpy(), g._y.to_numpy())]
        fig.add_trace(go.Scatter(x=front._x, y=front._y, mode="lines+markers", name=m, legendgroup=m,
                                 line={"color": colour, "width": 2},
                                 marker={"color": colour, "size": 9, "symbol": marker_symbols(front)},
                                 text=_hover(front, hover_cols), hovertemplate="%{text}<br>%{x:.1f} tok/s per user"
                                 "<br>%{y:,.0f} tok/s per GPU<extra>" + m + " frontier</extra>"))
        rest = g.drop(front.index)
        if len(rest):
            fig.add_trace(go.Scatter(x=rest._x, y=rest._y, mode="markers", name=f"{m} (dominated)", legendgroup=m,
                                     showlegend=False, marker={"color": colour, "size": 6, "opacity": 0.45,
                                                               "symbol": marker_symbols(rest)},
                                     text=_hover(rest, hover_cols), hovertemplate="%{text}<br>%{x:.1f} tok/s per user"
                                     "<br>%{y:,.0f} tok/s per GPU<extra>" + m + "</extra>"))
    for g, symbol in symbol_of.items() if len(gpus) > 1 else ():     # a legend entry per GPU's marker
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=g,
                                 marker={"symbol": symbol, "color": "#444", "size": 9}))
    note = f" · {dropped} unstable point(s) left out" if dropped else ""
    fig.update_xaxes(title_text="speed per user, median (tok/s per user)")
    fig.update_yaxes(title_text="output throughput (tok/s per GPU)", rangemode="tozero")
    return _layout(fig, "Throughput per GPU vs speed per user (Pareto frontier per speculative method)",
                   source + note)


def speedup_table(rows: pd.DataFrame, metric: str = "tok_s_per_user_p50") -> pd.DataFrame:
    """Speculative rows joined with the no-speculation row at the same other keys.

    The join keys are every dotted scenario-key column (the sweep's overrides) except the method and N
    columns. speedup = metric / baseline metric for a rate or throughput, baseline / metric for a
    latency (a metric whose name contains '_ms'), so > 1 always means speculation helps."""
    mcol, ncol = method_column(rows), n_column(rows)
    if ncol is None:
        raise CapacityError("the speedup figure needs a speculative.num_speculative_tokens column "
                            "(a sweep over N, with N = 0 or method none as the baseline)")
    _need(rows, [metric], "the speedup figure")
    df = rows.assign(_m=_methods(rows), _v=_num(rows, metric), _n=_num(rows, ncol))
    df = df[_stable_mask(df) & df._v.notna() & (df._v > 0)]
    keys = [c for c in rows.columns if "." in c and c not in (mcol, ncol)]
    base = df[df._m == NO_SPECULATION]
    if base.empty:
        raise CapacityError("the speedup figure needs rows with speculative.method=none to compare with")
    spec = df[df._m != NO_SPECULATION]
    if spec.empty:
        raise CapacityError("the speedup figure has no stable row with speculation on")
    if keys:
        base_v = base.groupby(keys, dropna=False)["_v"].mean().rename("_base").reset_index()
        joined = spec.merge(base_v, on=keys, how="inner")
    else:
        joined = spec.assign(_base=base._v.mean())
    if joined.empty:
        raise CapacityError("no speculative row has a method=none row at the same other keys to compare with")
    lower_is_better = "_ms" in metric
    joined["speedup"] = joined._base / joined._v if lower_is_better else joined._v / joined._base
    return joined.rename(columns={"_m": "method_name", "_n": "n", "_base": "baseline", "_v": "value"})


def speedup_figure(rows: pd.DataFrame, *, source: str = "", metric: str = "tok_s_per_user_p50") -> go.Figure:
    """Speedup from speculation relative to the method=none row at the same other keys: against N at
    the lightest load (left) and against load with the best N at each load (right), one trace per
    method (and per value of any other varied key)."""
    t = speedup_table(rows, metric)
    load = load_column(t)
    keys = [c for c in rows.columns if "." in c and c not in (method_column(rows), n_column(rows), load)]
    varied = [k for k in keys if t[k].nunique(dropna=False) > 1]
    t["_group"] = t.method_name if not varied else t.method_name + " · " + t[varied].apply(
        lambda r: ", ".join(f"{k}={r[k]}" for k in varied), axis=1)
    two = load is not None and t[load].nunique() > 1
    what = "median speed per user" if metric.startswith("tok_s_per_user") else metric
    titles = [f"vs N at the lightest load ({load} = {t[load].min():g})" if load else "vs N"]
    if two:
        titles.append("vs load, best N at each load")
    fig = make_subplots(rows=1, cols=2 if two else 1, subplot_titles=titles, horizontal_spacing=0.1)
    colours = _method_colours(_ordered_methods(t.method_name))
    dashes = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")
    seen: dict[str, int] = {}
    for group, g in t.groupby("_group", sort=True):
        method = g.method_name.iloc[0]
        colour = colours[method]
        line = {"color": colour, "dash": dashes[seen.get(method, 0) % len(dashes)]}
        seen[method] = seen.get(method, 0) + 1
        light = g[g[load] == g[load].min()] if load else g
        light = light.groupby("n", as_index=False)["speedup"].mean().sort_values("n")
        fig.add_trace(go.Scatter(x=light.n, y=light.speedup, mode="lines+markers", name=group, legendgroup=group,
                                 line=line, hovertemplate="N = %{x}<br>speedup %{y:.2f}×<extra>"
                                 + group + "</extra>"), row=1, col=1)
        if two:
            best = g.loc[g.groupby(load)["speedup"].idxmax()].sort_values(load)
            fig.add_trace(go.Scatter(x=best[load], y=best.speedup, mode="lines+markers", name=group, legendgroup=group,
                                     showlegend=False, line=line, customdata=best.n,
                                     hovertemplate="load %{x}<br>best N = %{customdata}<br>speedup %{y:.2f}×<extra>"
                                     + group + "</extra>"), row=1, col=2)
    for c in range(1, 3 if two else 2):
        fig.add_hline(y=1.0, line={"dash": "dash", "color": "#888"}, row=1, col=c)
    fig.update_xaxes(title_text="drafted tokens per step N (tokens)", dtick=1, row=1, col=1)
    if two:
        fig.update_xaxes(title_text=LOAD_COLUMNS.get(load, load), row=1, col=2)
    fig.update_yaxes(title_text=f"speedup of {what} (× no speculation)", row=1, col=1)
    return _layout(fig, f"Speedup from speculative decoding ({what}, relative to method=none at the same load)",
                   source)


def prefix_cache_figure(requests: pd.DataFrame, prefix_cache: Mapping[str, Any] | None = None, *,
                        source: str = "") -> go.Figure:
    """Share of each request's prompt found in the prefix cache (the `cached_tokens` column of
    requests.csv) as a CDF over requests, with the run's token-weighted hit rate (vLLM's
    prefix_cache_hits / prefix_cache_queries) in the title, per replica when there are several."""
    _need(requests, ["cached_tokens", "prompt_tokens"], "the prefix-cache figure (a run with caching on)")
    done = requests
    if "first_scheduled_s" in requests:
        done = requests[pd.to_numeric(requests["first_scheduled_s"], errors="coerce").notna()]
    share = _num(done, "cached_tokens") / _num(done, "prompt_tokens")
    x, y = _cdf(share.dropna())
    fig = go.Figure(go.Scatter(x=x * 100, y=y, mode="lines", line={"color": _colour(0)}, name="requests",
                               hovertemplate="%{x:.0f} % of the prompt cached<br>%{y:.2f} of requests<extra></extra>"))
    fig.update_xaxes(title_text="prompt found in the prefix cache (% of its tokens)", range=[0, 100])
    fig.update_yaxes(title_text="share of requests (cumulative)", range=[0, 1])
    title = "Prefix cache: share of each prompt found cached"
    pc = prefix_cache or {}
    if pc.get("prefix_cache_hit_rate") is not None:
        title += f" (hit rate {pc['prefix_cache_hit_rate']:.0%} of prompt tokens"
        per = [r.get("prefix_cache_hit_rate") for r in pc.get("per_replica") or []]
        if len(per) > 1:
            title += "; per replica " + ", ".join(f"{v:.0%}" for v in per)
        title += ")"
    return _layout(fig, title, source)


def prefix_caching_plan_figure(pc: Mapping[str, Any], *, source: str = "") -> go.Figure:
    """The plan's prefix-caching answer: GPUs the recommended configuration needs with caching on
    and off, and, with several replicas, the hit rate under each router."""
    if not pc or pc.get("gpus") is None:
        raise CapacityError("the prefix-caching figure needs recommendation.prefix_caching (a plan of traffic "
                            "with block identities and caching on)")
    routers = pc.get("routers") or []
    fig = make_subplots(rows=1, cols=2 if routers else 1, subplot_titles=(
        ["GPUs needed", "prefix-cache hit rate by router"] if routers else ["GPUs needed"]))
    off = pc.get("gpus_without_caching")
    labels = [f"caching on ({pc.get('router', '').replace('_', ' ')})", "caching off"]
    fig.add_trace(go.Bar(x=labels, y=[pc["gpus"], off if off is not None else 0], marker_color=[_colour(0), _NONE_COLOUR],
                         text=[str(pc["gpus"]), str(off) if off is not None else "none fits"], textposition="outside",
                         showlegend=False), row=1, col=1)
    fig.update_yaxes(title_text="GPUs", rangemode="tozero", row=1, col=1)
    if routers:
        fig.add_trace(go.Bar(x=[r["router"].replace("_", " ") for r in routers],
                             y=[100 * (r.get("prefix_cache_hit_rate") or 0) for r in routers],
                             marker_color=[_colour(1) if r.get("slo_met") else "#bbbbbb" for r in routers],
                             text=["SLO met" if r.get("slo_met") else "misses" for r in routers],
                             textposition="outside", showlegend=False), row=1, col=2)
        fig.update_yaxes(title_text="hit rate (% of prompt tokens)", range=[0, 105], row=1, col=2)
    hit = pc.get("prefix_cache_hit_rate")
    return _layout(fig, "Prefix caching: GPUs with and without it" + (f" (hit rate {hit:.0%})" if hit is not None else ""),
                   source)


def daily_figure(daily: Mapping[str, Any], *, source: str = "") -> go.Figure:
    """GPUs over the day when replicas follow the scenario's rate_profile (the plan's `daily` block),
    with the offered rate on a second axis."""
    steps = daily.get("steps") or []
    if not steps:
        raise CapacityError("the GPUs-over-the-day figure needs recommendation.daily (a scenario with a rate_profile)")
    hours = [x["start_s"] / 3600.0 for x in steps]
    width = daily["step_s"] / 3600.0
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=[h + width / 2 for h in hours], y=[x["gpus"] for x in steps], width=width * 0.95,
                         name="GPUs needed", marker_color=_colour(0),
                         hovertemplate="from %{x:.1f} h: %{y} GPUs<extra></extra>"), secondary_y=False)
    fig.add_trace(go.Scatter(x=[h + width / 2 for h in hours], y=[x["rate_rps"] for x in steps], mode="lines+markers",
                             name="offered load", line={"color": _colour(1)},
                             hovertemplate="%{y:.2f} req/s<extra></extra>"), secondary_y=True)
    fig.update_xaxes(title_text="time of the profile (hours)")
    fig.update_yaxes(title_text="GPUs", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="offered load (requests/s)", rangemode="tozero", secondary_y=True)
    return _layout(fig, f"GPUs over the day: {daily['gpu_hours_per_day_following']:,.0f} GPU-hours if replicas follow "
                        f"the load, {daily['gpu_hours_per_day_at_peak']:,.0f} at the peak's all day", source)


def speculation_by_load_figure(sb: Mapping[str, Any], *, source: str = "") -> go.Figure:
    """Expected speedup of one decode step against the number of running requests for the chosen N
    (`policies.break_even`'s curve), with where it stops paying and the run's mean batch."""
    curve = sb.get("curve") or {}
    if not curve.get("batch"):
        raise CapacityError("the speedup-by-load figure needs speculation_by_batch.curve (re-run the plan or simulation)")
    n = sb.get("num_speculative_tokens")
    fig = go.Figure(go.Scatter(x=curve["batch"], y=curve["speedup"], mode="lines", name=f"N={n}",
                               line={"color": _colour(0)},
                               hovertemplate="%{x} running requests<br>%{y:.2f}× per decode step<extra></extra>"))
    fig.add_hline(y=1.0, line={"dash": "dash", "color": "#888"})
    limit = sb.get("pays_up_to") or 0
    if 0 < limit < sb.get("max_batch", limit + 1):
        # a trace, not add_vline: a shape's x on a log axis is in decades
        top = max(max(curve["speedup"]), 1.0) * 1.05
        fig.add_trace(go.Scatter(x=[limit, limit], y=[0, top], mode="lines", name=f"pays up to {limit}",
                                 line={"dash": "dot", "color": "#c00"}, hoverinfo="skip"))
    if sb.get("at_batch"):
        fig.add_trace(go.Scatter(x=[sb["at_batch"]], y=[sb["speedup_at_batch"]], mode="markers",
                                 name="mean running requests of the run", marker={"symbol": "star", "size": 13,
                                                                                  "color": "black"}))
    fig.update_xaxes(type="log", title_text="running requests per replica (requests)")
    fig.update_yaxes(title_text="expected speedup of one decode step (× no speculation)", rangemode="tozero")
    ctx = sb.get("mean_context_tokens")
    return _layout(fig, f"Where speculation pays: N={n}, decode steps at a mean context of "
                        f"{ctx:,.0f} tokens" if ctx else f"Where speculation pays: N={n}", source)


def gpus_vs_growth_figure(candidates: pd.DataFrame, base_rate_rps: float | None, *, source: str = "",
                          max_growth: float = 4.0, recommended_gpus: int | None = None,
                          headroom: float = 0.0) -> go.Figure:
    """GPUs needed as traffic grows, from plan candidates: a configuration (GPU, TP, method, N) that
    serves at most `max_rate_per_replica_rps` per replica needs ceil(traffic × (1 + headroom) / that
    rate) replicas of TP GPUs each (the plan's own sizing rule); one step line per GPU type and method,
    the fewest GPUs over TP and N."""
    _need(candidates, ["max_rate_per_replica_rps"], "the GPUs-vs-growth figure")
    df = candidates.assign(_r=_num(candidates, "max_rate_per_replica_rps"), _m=_methods(candidates))
    tp = _num(df, "tensor_parallel_size") if "tensor_parallel_size" in df.columns else pd.Series(1, index=df.index)
    df = df.assign(_tp=tp.fillna(1).clip(lower=1))
    if "feasible" in df.columns:
        df = df[df.feasible.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0", "yes"))]
    df = df[df._r.notna() & (df._r > 0)]
    if df.empty:
        raise CapacityError("the GPUs-vs-growth figure has no feasible candidate with a positive max_rate_per_replica_rps")
    if base_rate_rps and base_rate_rps > 0:
        growth = np.round(np.arange(1.0, max_growth + 1e-9, 0.05), 4)
        rates = growth * base_rate_rps
        xtitle = f"traffic growth (× today's {base_rate_rps:g} requests/s)"
    else:
        top = float((df._r * df.get("replicas", pd.Series(1, index=df.index)).fillna(1)).max()) * max_growth
        rates = np.linspace(top / 200, top, 200)
        growth = rates
        xtitle = "traffic (requests/s)"
    gpu = df["gpu"].astype(str) if "gpu" in df.columns else pd.Series("", index=df.index)
    df = df.assign(_label=(gpu + " " + df._m).str.strip())
    fig = go.Figure()
    for i, (label, g) in enumerate(df.groupby("_label", sort=True)):
        need = np.ceil(rates[:, None] * (1 + headroom) / g._r.to_numpy()[None, :] - 1e-9) * g._tp.to_numpy()[None, :]
        best = need.min(axis=1)
        which = need.argmin(axis=1)
        cfg = [f"TP{int(g._tp.iloc[j])}" + (f", N={g[n_column(g)].iloc[j]}" if n_column(g) else "") for j in which]
        fig.add_trace(go.Scatter(x=growth, y=best, mode="lines", line_shape="hv", name=label,
                                 line={"color": _colour(i)}, customdata=[[float(r), c] for r, c in zip(rates, cfg)],
                                 hovertemplate="%{customdata[0]:.2f} requests/s<br>%{y:.0f} GPUs (%{customdata[1]})"
                                 "<extra>" + label + "</extra>"))
    if recommended_gpus and base_rate_rps:
        fig.add_trace(go.Scatter(x=[1.0], y=[recommended_gpus], mode="markers", name="recommended today",
                                 marker={"symbol": "star", "size": 14, "color": "black"}))
    fig.update_xaxes(title_text=xtitle)
    fig.update_yaxes(title_text="GPUs needed (GPUs)", rangemode="tozero")
    room = f" × (1 + {headroom:g} headroom)" if headroom else ""
    return _layout(fig, "GPUs needed as traffic grows (fewest GPUs per GPU type and method; replicas = "
                        f"⌈traffic{room} / max rate per replica⌉)", source)


def gpus_vs_traffic_figure(rows: pd.DataFrame, *, source: str = "") -> go.Figure:
    """From sweep rows: at each traffic level, the fewest GPUs among the points that stay stable (and
    meet the SLOs, when the rows say), one line per speculative method."""
    load = load_column(rows)
    if load is None:
        raise CapacityError("the GPUs-vs-traffic figure needs a traffic column such as traffic.arrival.rate_rps")
    _need(rows, ["num_gpus"], "the GPUs-vs-traffic figure")
    df = rows.assign(_m=_methods(rows), _g=_num(rows, "num_gpus"), _l=_num(rows, load))
    ok = _stable_mask(df)
    if "slo_met" in df.columns:
        ok &= df.slo_met.map(lambda v: str(v).strip().lower() in ("true", "1", "1.0", "yes")).astype(bool)
    df = df[ok & df._g.notna() & df._l.notna()]
    if df.empty:
        raise CapacityError("the GPUs-vs-traffic figure has no stable point that meets the SLOs")
    if df._g.nunique() < 2 and _num(rows, "num_gpus").nunique() < 2:
        raise CapacityError("the GPUs-vs-traffic figure needs a sweep that varies the number of GPUs "
                            "(deployment.replicas or tensor_parallel_size)")
    fig = go.Figure()
    colours = _method_colours(_ordered_methods(df._m))
    for m, colour in colours.items():
        g = df[df._m == m].groupby("_l", as_index=False)["_g"].min().sort_values("_l")
        fig.add_trace(go.Scatter(x=g._l, y=g._g, mode="lines+markers", line_shape="hv", name=m,
                                 line={"color": colour}, hovertemplate="%{x}<br>%{y:.0f} GPUs<extra>" + m + "</extra>"))
    fig.update_xaxes(title_text=LOAD_COLUMNS.get(load, load))
    fig.update_yaxes(title_text="GPUs needed (GPUs)", rangemode="tozero")
    return _layout(fig, "GPUs needed vs traffic (fewest GPUs of a stable point meeting the SLOs)", source)


def per_request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT and TPOT per request in ms, as `vllm bench serve` defines them: TTFT = first token −
    arrival; TPOT = (finish − first token) / (output tokens − 1), finished requests with > 1 token."""
    _need(requests, ["arrival_s", "first_token_s", "finish_s", "output_tokens"], "the latency CDFs")
    arrival, first = _num(requests, "arrival_s"), _num(requests, "first_token_s")
    finish, out = _num(requests, "finish_s"), _num(requests, "output_tokens")
    ttft = (first - arrival) * 1000.0
    tpot = ((finish - first) * 1000.0 / (out - 1)).where(finish.notna() & (out > 1))
    return pd.DataFrame({"ttft_ms": ttft, "tpot_ms": tpot})


def _cdf(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values.dropna().to_numpy(float))
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def _slo_quantile(stat: str) -> float | None:
    if stat.startswith("p"):
        return float(stat[1:]) / 100.0
    return {"min": 0.0, "max": 1.0}.get(stat)


def _panel_slos(slos: Sequence[Any]) -> dict[str, list[tuple[str, float, float | None]]]:
    """SLO lines per panel: (label, threshold ms, quantile). tok_s_per_user pNN > v is TPOT
    p(100-NN) < 1000/v per request."""
    out: dict[str, list] = {"ttft": [], "tpot": []}
    for s in slos:
        if s.metric in out:
            out[s.metric].append((str(s), s.threshold, _slo_quantile(s.stat)))
        elif s.metric == "tok_s_per_user" and s.stat.startswith("p"):
            q = 1.0 - float(s.stat[1:]) / 100.0
            out["tpot"].append((f"{s} (TPOT p{100 * q:g} < {1000 / s.threshold:.3g} ms)", 1000.0 / s.threshold, q))
    return out


def latency_cdf_figure(requests: pd.DataFrame | Mapping[str, pd.DataFrame], slo: str | None = None, *,
                       source: str = "") -> go.Figure:
    """Cumulative distributions of TTFT and TPOT per request (one trace per run) with the scenario's
    SLOs: a vertical line at each threshold and a marker at (threshold, quantile); the SLO holds when
    the curve reaches the marker's height at or left of the line."""
    runs = {"run": requests} if isinstance(requests, pd.DataFrame) else dict(requests)
    if not runs:
        raise CapacityError("the latency CDFs need at least one requests table")
    slos = _panel_slos(parse_slos(slo)) if slo else {"ttft": [], "tpot": []}
    fig = make_subplots(rows=1, cols=2, subplot_titles=["TTFT", "TPOT"], horizontal_spacing=0.1)
    for i, (name, req) in enumerate(runs.items()):
        lat = per_request_latencies(req)
        for col, metric in ((1, "ttft_ms"), (2, "tpot_ms")):
            x, y = _cdf(lat[metric])
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line_shape="hv", name=name, legendgroup=name,
                                     showlegend=col == 1, line={"color": _colour(i)},
                                     hovertemplate="%{x:.1f} ms<br>fraction ≤ x: %{y:.3f}<extra>" + name + "</extra>"),
                          row=1, col=col)
    for col, metric in ((1, "ttft"), (2, "tpot")):
        for label, threshold, q in slos[metric]:
            fig.add_vline(x=threshold, line={"dash": "dash", "color": "#d62728"}, row=1, col=col)
            fig.add_trace(go.Scatter(x=[threshold], y=[q if q is not None else 1.0], mode="markers+text",
                                     marker={"symbol": "x", "size": 11, "color": "#d62728"}, text=[f"SLO {label}"],
                                     textposition="bottom left", name=f"SLO {label}", showlegend=False,
                                     hovertemplate=f"SLO {label}<extra></extra>"), row=1, col=col)
    fig.update_xaxes(type="log", title_text="TTFT per request (ms, log scale)", row=1, col=1)
    fig.update_xaxes(type="log", title_text="TPOT per request (ms per output token, log scale)", row=1, col=2)
    fig.update_yaxes(title_text="fraction of requests (cumulative, 0–1)", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    return _layout(fig, "TTFT and TPOT distributions against the SLOs (CDF per request)", source)


def acceptance_figure(requests: pd.DataFrame, survival: Sequence[float] | None = None, *, source: str = "",
                      model_label: str = "acceptance model") -> go.Figure:
    """Acceptance of drafted tokens. Left (when the scenario names an acceptance model): its survival
    curve S_j = P(the j-th draft is accepted) per position. Right: tokens per verification step per
    request (1 + accepted / steps, from requests.csv's spec columns) with the run's mean and, with a
    model, its expectation 1 + sum S_j."""
    _need(requests, ["spec_accepted", "spec_steps"], "the acceptance figure")
    acc, steps = _num(requests, "spec_accepted"), _num(requests, "spec_steps")
    ok = steps > 0
    if not ok.any():
        raise CapacityError("the acceptance figure needs speculative decoding: no request ran a verification step")
    per_req = 1.0 + acc[ok] / steps[ok]
    run_mean = 1.0 + float(acc[ok].sum()) / float(steps[ok].sum())
    drafted = _num(requests, "spec_drafted")[ok].sum() / steps[ok].sum() if "spec_drafted" in requests.columns else None
    has_model = survival is not None and len(survival) > 0
    fig = make_subplots(rows=1, cols=2 if has_model else 1, horizontal_spacing=0.12,
                        subplot_titles=(["survival per draft position (model)", "tokens per verification step (run)"]
                                        if has_model else ["tokens per verification step (run)"]))
    col = 1
    if has_model:
        s = np.asarray(survival, float)
        j = np.arange(1, len(s) + 1)
        fig.add_trace(go.Bar(x=j, y=s, name=f"S_j, {model_label}", marker={"color": "#00a65a"},
                             text=[f"{v:.2f}" for v in s], textposition="outside",
                             hovertemplate="position %{x}<br>S_j = P(accepted) %{y:.3f}<extra></extra>"), row=1, col=1)
        fig.update_xaxes(title_text="draft position j (token)", dtick=1, row=1, col=1)
        fig.update_yaxes(title_text="P(draft j accepted), S_j (probability)", range=[0, 1.1], row=1, col=1)
        col = 2
    fig.add_trace(go.Histogram(x=per_req, name="requests", marker={"color": "#636efa"}, opacity=0.8,
                               hovertemplate="%{x} tokens/step<br>%{y} requests<extra></extra>"), row=1, col=col)
    fig.add_vline(x=run_mean, line={"color": "#111", "width": 2}, row=1, col=col, showlegend=True,
                  name=f"run mean {run_mean:.2f} tokens/step")
    if has_model:
        expected = 1.0 + float(np.sum(survival))
        fig.add_vline(x=expected, line={"color": "#00a65a", "dash": "dash", "width": 2}, row=1, col=col,
                      showlegend=True, name=f"model E[τ] = 1 + Σ S_j = {expected:.2f}")
    fig.update_xaxes(title_text="mean tokens per verification step (tokens, accepted drafts + 1)", row=1, col=col)
    fig.update_yaxes(title_text="requests (count)", row=1, col=col)
    note = f" · mean drafted per step {drafted:.2f}" if drafted is not None else ""
    return _layout(fig, f"Acceptance of drafted tokens: mean accepted length {run_mean:.2f} tokens per step",
                   source + note)


def validation_figure(rows: pd.DataFrame, *, source: str = "") -> go.Figure:
    """Predicted against measured, log-log, one colour per metric, with the y = x line and ±15 % and
    ±25 % bands. Rows: `capacity validate --out` rows.csv (measured column m and predicted_m)."""
    metrics = [m for m in METRIC_LABELS if m in rows.columns and f"predicted_{m}" in rows.columns]
    metrics += [c[len("predicted_"):] for c in rows.columns
                if c.startswith("predicted_") and c[len("predicted_"):] in rows.columns
                and c[len("predicted_"):] not in metrics]
    if not metrics:
        raise CapacityError("the predicted-vs-measured figure needs a measured column and its predicted_<column>")
    pts = []
    for m in metrics:
        meas, pred = _num(rows, m), _num(rows, f"predicted_{m}")
        ok = meas.notna() & pred.notna() & (meas > 0) & (pred > 0)
        if ok.any():
            pts.append((m, rows[ok], meas[ok], pred[ok]))
    if not pts:
        raise CapacityError("the predicted-vs-measured figure has no row with both a measured and a predicted value")
    lo = min(min(me.min(), pr.min()) for _, _, me, pr in pts) / 1.5
    hi = max(max(me.max(), pr.max()) for _, _, me, pr in pts) * 1.5
    line = np.geomspace(lo, hi, 50)
    fig = go.Figure()
    for band, fill in ((0.25, "rgba(255,165,0,0.12)"), (0.15, "rgba(0,166,90,0.15)")):
        fig.add_trace(go.Scatter(x=line, y=line * (1 - band), mode="lines", line={"width": 0.5, "color": fill},
                                 showlegend=False, hoverinfo="skip", legendgroup=f"band{band}"))
        fig.add_trace(go.Scatter(x=line, y=line * (1 + band), mode="lines", line={"width": 0.5, "color": fill},
                                 fill="tonexty", fillcolor=fill, name=f"±{band:.0%}", legendgroup=f"band{band}",
                                 hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=line, y=line, mode="lines", name="y = x", line={"color": "#333", "dash": "dash"},
                             hoverinfo="skip"))
    hover_cols = ["gpu", "model", "tp", "isl", "osl", "concurrency_or_qps"]
    for i, (m, sub, meas, pred) in enumerate(pts):
        err = (pred - meas) / meas
        fig.add_trace(go.Scatter(x=meas, y=pred, mode="markers", name=METRIC_LABELS.get(m, m),
                                 marker={"color": _colour(i), "size": 8, "opacity": 0.85},
                                 customdata=err * 100, text=_hover(sub, hover_cols),
                                 hovertemplate="%{text}<br>measured %{x:.4g}<br>predicted %{y:.4g}<br>"
                                 "error %{customdata:+.1f} %<extra>" + METRIC_LABELS.get(m, m) + "</extra>"))
    rng = [math.log10(lo), math.log10(hi)]
    fig.update_xaxes(type="log", range=rng, title_text="measured (tok/s or ms, the metric's own unit; log scale)")
    fig.update_yaxes(type="log", range=rng, title_text="predicted (same unit as measured; log scale)")
    n = sum(len(p[1]) for p in pts)
    return _layout(fig, f"Predicted vs measured ({n} values, one colour per metric)", source, height=600)
