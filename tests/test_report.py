"""`capacity report`: figures against independent arithmetic, the HTML page's structure, the
draft-and-verify view against the closed form, and (when Chromium is installed) the page as a browser
draws it and the PNG/SVG export."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capacity.report import explainer

from capacity.report import figures

from capacity.report import build as report
from capacity.errors import CapacityError

CHROMIUM = Path("/usr/bin/chromium")
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium not installed")

ALPHA = 0.7
N = 3
SCENARIO = f"""
name: report-test
deployment: {{gpu: MI300X, model: google/gemma-4-31B-it, tensor_parallel_size: 1, replicas: 1}}
speculative: {{method: gemma4_mtp, num_speculative_tokens: {N}, acceptance: {{model: iid, alpha: {ALPHA}}}}}
traffic:
  arrival: {{process: poisson, rate_rps: 2.0}}
  num_requests: 60
  classes:
    - name: fixed
      input_tokens: {{dist: fixed, value: 512}}
      output_tokens: {{dist: uniform, low: 32, high: 160}}
slo: "ttft:p99<1s;tpot:p90<25ms;tok_s_per_user:p10>30"
simulation: {{seed: 1}}
"""


# ------------------------------------------------------------------------------------ helpers
def run_cli(argv: list[str]) -> int:
    """`capacity ARGV` with the CLI's error handling (exit status as an int)."""
    from capacity import cli

    return cli.main(argv)


def plotly_js_header() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()[:200].split("\n")[1].strip()       # '* plotly.js vX.Y.Z'


def figure_json(html_text: str, div_id: str) -> dict:
    """The data/layout a report div was drawn with (the Plotly.newPlot call plotly writes)."""
    m = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', html_text)
    assert m, f"no Plotly.newPlot for {div_id}"
    dec = json.JSONDecoder()
    data, end = dec.raw_decode(html_text, m.end())
    layout, _ = dec.raw_decode(html_text, re.compile(r",\s*").match(html_text, end).end())
    return {"data": data, "layout": layout}


def trace(fig, name):
    return next(t for t in fig.data if t.name == name)


# ----------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("sim")
    sc = base / "scenario.yaml"
    sc.write_text(SCENARIO)
    out = base / "out"
    assert run_cli(["simulate", str(sc), "--out", str(out)]) == 0
    assert (out / "result.json").is_file() and (out / "requests.csv").is_file()
    return out


# speedup of tok_s_per_user_p50 over method=none at the same rate and replicas (the truth the
# sweep fixture is built from), per (method, N)
SPEEDUP = {("eagle3", 1): 1.4, ("eagle3", 2): 1.8, ("eagle3", 4): 2.1,
           ("gemma4_mtp", 1): 1.5, ("gemma4_mtp", 2): 1.9, ("gemma4_mtp", 4): 1.7}
RATES = (1.0, 2.0, 4.0)


def sweep_rows() -> list[dict]:
    rows, pid = [], 0
    for replicas in (1, 2):
        for rate in RATES:
            base_user = 60.0 / rate            # tok/s per user without speculation
            base_tput = 300.0 * rate / replicas
            for (method, n), s in [(("none", 0), 1.0)] + list(SPEEDUP.items()):
                # at the highest load speculation helps less: halve the gain (exact, known below)
                gain = s if rate < 4.0 else 1.0 + (s - 1.0) / 2
                rows.append({
                    "point_id": pid, "speculative.method": method, "speculative.num_speculative_tokens": n,
                    "traffic.arrival.rate_rps": rate, "deployment.replicas": replicas,
                    "stable": not (replicas == 1 and rate == 4.0), "num_gpus": replicas,
                    "slo_met": not (replicas == 1 and rate == 4.0),
                    "ttft_ms_p99": 500.0, "tpot_ms_p90": 1000.0 / (base_user * gain),
                    "output_throughput_tok_s_per_gpu": base_tput * (1 + 0.1 * n) * (0.9 if method == "eagle3" else 1),
                    "tok_s_per_user_p50": base_user * gain,
                    # no goodput_rps column: the report must cope with missing columns
                })
                pid += 1
    return rows


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep")
    (d / "sweep.json").write_text(json.dumps({"scenario": "chatbot", "grid": {"speculative.method": ["none"]}}))
    (d / "results.jsonl").write_text("\n".join(json.dumps(r) for r in sweep_rows()) + "\n")
    return d


VALIDATE_ROWS = pd.DataFrame({
    "file": ["serving_vllm.csv"] * 5, "row": range(5), "gpu": ["MI300X"] * 5,
    "model": ["m"] * 5, "framework": ["vllm"] * 5, "tp": [1] * 5, "isl": [1024] * 5, "osl": [1024] * 5,
    "concurrency_or_qps": [4, 8, 16, 32, 64], "load_type": ["closed"] * 5,
    "ttft_ms": [50.0, 60.0, 80.0, None, 150.0], "predicted_ttft_ms": [55.0, 48.0, 100.0, 90.0, 150.0],
    "output_tok_s_per_gpu": [400.0, 700.0, 1100.0, 1500.0, 1800.0],
    "predicted_output_tok_s_per_gpu": [380.0, 760.0, 1000.0, 1600.0, None],
    "skipped": [None, None, None, None, None],
})


@pytest.fixture(scope="module")
def validate_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("validate")
    VALIDATE_ROWS.to_csv(d / "rows.csv", index=False)
    return d


# plan candidates: max rate per replica r, TP; GPUs at traffic g * R0 = ceil(g R0 / r) * TP
PLAN_R0 = 2.0
CANDIDATES = [
    {"gpu": "MI300X", "tensor_parallel_size": 1, "method": "eagle3", "num_speculative_tokens": 3,
     "max_rate_per_replica_rps": 0.9, "replicas": 3, "total_gpus": 3, "cost_per_hour_usd": 6.0, "feasible": True,
     "reason": ""},
    {"gpu": "MI300X", "tensor_parallel_size": 2, "method": "eagle3", "num_speculative_tokens": 3,
     "max_rate_per_replica_rps": 2.1, "replicas": 1, "total_gpus": 2, "cost_per_hour_usd": 4.0, "feasible": True,
     "reason": ""},
    {"gpu": "MI355X", "tensor_parallel_size": 1, "method": "none", "num_speculative_tokens": 0,
     "max_rate_per_replica_rps": 1.5, "replicas": 2, "total_gpus": 2, "cost_per_hour_usd": 5.0, "feasible": True,
     "reason": ""},
    {"gpu": "MI355X", "tensor_parallel_size": 1, "method": "eagle3", "num_speculative_tokens": 5,
     "max_rate_per_replica_rps": 0.0, "replicas": None, "total_gpus": None, "cost_per_hour_usd": None,
     "feasible": False, "reason": "misses tpot:p90 at any load"},
]


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory, sim_dir) -> Path:
    d = tmp_path_factory.mktemp("plan")
    payload = json.loads((sim_dir / "result.json").read_text())
    plan = {
        "recommendation": {"gpu": "MI300X", "tensor_parallel_size": 2, "replicas": 1, "total_gpus": 2,
                           "method": "eagle3", "num_speculative_tokens": 3, "cost_per_hour_usd": 4.0,
                           "cost_per_million_output_tokens_usd": 1.23, "slo": ["ttft:p99<1s", "tpot:p90<25ms"],
                           "rate_rps": PLAN_R0},
        "candidates": CANDIDATES,
        "evidence": {"recommended": payload, "one_fewer_replica": payload},
    }
    (d / "plan.json").write_text(json.dumps(plan))
    for name in ("recommended", "one_fewer_replica"):
        (d / "evidence" / name).mkdir(parents=True)
        shutil.copy(sim_dir / "requests.csv", d / "evidence" / name / "requests.csv")
    return d


# ------------------------------------------------------------------------------ kind detection
def test_unknown_folder_errors_in_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert run_cli(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for looked_for in ("plan.json", "sweep.json", "results.jsonl", "rows.csv", "result.json"):
        assert looked_for in err
    with pytest.raises(CapacityError):
        report.build_report(tmp_path / "missing")


def test_kinds_detected(sim_dir, sweep_dir, validate_dir, plan_dir):
    assert [report.detect_kind(d) for d in (sim_dir, sweep_dir, validate_dir, plan_dir)] == \
        ["simulate", "sweep", "validate", "plan"]


# ------------------------------------------------------------------------------------ figures
def test_latency_cdfs_are_the_per_request_values(sim_dir):
    req = pd.read_csv(sim_dir / "requests.csv")
    fig = figures.latency_cdf_figure({"run": req}, "ttft:p99<1s;tpot:p90<25ms;tok_s_per_user:p10>30")
    ttft, tpot = [t for t in fig.data if t.name == "run"]
    done = req.finish_s.notna()
    want_ttft = np.sort(((req.first_token_s - req.arrival_s) * 1000).dropna())
    want_tpot = np.sort(((req.finish_s - req.first_token_s) * 1000 / (req.output_tokens - 1))[done & (req.output_tokens > 1)])
    np.testing.assert_allclose(ttft.x, want_ttft)
    np.testing.assert_allclose(tpot.x, want_tpot)
    np.testing.assert_allclose(ttft.y, np.arange(1, len(want_ttft) + 1) / len(want_ttft))
    # SLO lines: ttft 1000 ms at 0.99, tpot 25 ms at 0.90, tok_s_per_user p10 > 30 = TPOT p90 < 33.3 ms
    lines = sorted(s.x0 for s in fig.layout.shapes)
    assert lines == pytest.approx([25.0, 1000.0 / 30.0, 1000.0])
    marks = {t.name: (t.x[0], t.y[0]) for t in fig.data if t.name.startswith("SLO")}
    assert marks["SLO ttft:p99<1s"] == pytest.approx((1000.0, 0.99))
    assert marks["SLO tpot:p90<25ms"] == pytest.approx((25.0, 0.90))
    assert fig.layout.xaxis.title.text == "TTFT per request (ms, log scale)"
    assert "ms per output token" in fig.layout.xaxis2.title.text


def test_acceptance_figure_survival_and_mean(sim_dir):
    req = pd.read_csv(sim_dir / "requests.csv")
    payload = json.loads((sim_dir / "result.json").read_text())
    surv, label = report.scenario_acceptance(payload["scenario"])
    np.testing.assert_allclose(surv, [ALPHA ** j for j in range(1, N + 1)])       # IID: S_j = alpha^j
    fig = figures.acceptance_figure(req, surv, model_label=label)
    bars = next(t for t in fig.data if t.type == "bar")
    np.testing.assert_allclose(bars.y, [0.7, 0.49, 0.343])
    run_mean = 1 + req.spec_accepted.sum() / req.spec_steps.sum()
    vlines = {s.name: s.x0 for s in fig.layout.shapes}
    assert vlines[f"run mean {run_mean:.2f} tokens/step"] == pytest.approx(run_mean)
    expected = (1 - ALPHA ** (N + 1)) / (1 - ALPHA)
    assert next(v for k, v in vlines.items() if k.startswith("model")) == pytest.approx(expected)
    # the simulated mean accepted length agrees with the model within sampling error
    assert run_mean == pytest.approx(expected, abs=0.1)
    hist = next(t for t in fig.data if t.type == "histogram")
    ok = req.spec_steps > 0
    np.testing.assert_allclose(np.sort(hist.x), np.sort(1 + req.spec_accepted[ok] / req.spec_steps[ok]))


def brute_front(x, y):
    return {i for i in range(len(x))
            if not any(x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i]) for j in range(len(x)))}


def test_pareto_frontier_per_method(sweep_dir):
    rows = report.read_sweep_rows(sweep_dir / "results.jsonl")
    fig = figures.pareto_figure(rows)
    assert {t.name for t in fig.data if t.showlegend is not False} == {"none", "eagle3", "gemma4_mtp"}
    stable = rows[rows.stable]
    for method in ("none", "eagle3", "gemma4_mtp"):
        g = stable[stable["speculative.method"] == method].reset_index(drop=True)
        x, y = g.tok_s_per_user_p50.to_numpy(), g.output_throughput_tok_s_per_gpu.to_numpy()
        front = brute_front(x, y)
        t = trace(fig, method)
        assert sorted(zip(t.x, t.y)) == sorted((x[i], y[i]) for i in front)
        assert list(t.x) == sorted(t.x)
        dominated = [tr for tr in fig.data if tr.name == f"{method} (dominated)"]
        n_dom = sum(len(tr.x) for tr in dominated)
        assert n_dom == len(g) - len(front)
    assert fig.layout.xaxis.title.text == "speed per user, median (tok/s per user)"
    assert fig.layout.yaxis.title.text == "output throughput (tok/s per GPU)"


def test_speedup_relative_to_no_speculation(sweep_dir):
    rows = report.read_sweep_rows(sweep_dir / "results.jsonl")
    fig = figures.speedup_figure(rows)
    for (method, n), s in SPEEDUP.items():
        # vs N at the lightest load (rate 1): the known speedup (replicas=1 and =2 traces alike)
        for replicas in (1, 2):
            t = next(t for t in fig.data if t.xaxis == "x" and t.name == f"{method} · deployment.replicas={replicas}")
            assert dict(zip(t.x, t.y))[n] == pytest.approx(s)
    # vs load: the best N at each load; rate 4 with replicas=1 is unstable and left out
    for method in ("eagle3", "gemma4_mtp"):
        best = max(s for (m, _), s in SPEEDUP.items() if m == method)
        for replicas, rates in ((1, (1.0, 2.0)), (2, RATES)):
            t = next(t for t in fig.data if t.xaxis == "x2" and t.name == f"{method} · deployment.replicas={replicas}")
            want = [best if r < 4.0 else 1 + (best - 1) / 2 for r in rates]
            assert list(t.x) == list(rates)
            np.testing.assert_allclose(t.y, want)
    assert fig.layout.xaxis.title.text == "drafted tokens per step N (tokens)"
    assert fig.layout.xaxis2.title.text == "offered load (requests/s)"
    # a latency metric: the ratio is baseline / value, so the same speedups come back from TPOT
    t = figures.speedup_table(rows, "tpot_ms_p90")
    light = t[(t["traffic.arrival.rate_rps"] == 1.0)]
    for _, r in light.iterrows():
        assert r.speedup == pytest.approx(SPEEDUP[(r.method_name, r.n)])


def test_speedup_needs_a_baseline(sweep_dir):
    rows = report.read_sweep_rows(sweep_dir / "results.jsonl")
    with pytest.raises(CapacityError, match="method=none"):
        figures.speedup_figure(rows[rows["speculative.method"] != "none"])


def test_gpus_vs_traffic_from_sweep(sweep_dir):
    rows = report.read_sweep_rows(sweep_dir / "results.jsonl")
    fig = figures.gpus_vs_traffic_figure(rows)
    # replicas=1 is enough (stable, SLOs met) at rates 1 and 2; rate 4 needs 2 GPUs
    t = trace(fig, "eagle3")
    assert list(t.x) == list(RATES) and list(t.y) == [1, 1, 2]


def test_gpus_vs_growth_from_plan_candidates():
    fig = figures.gpus_vs_growth_figure(pd.DataFrame(CANDIDATES), PLAN_R0, recommended_gpus=2)
    mi300 = trace(fig, "MI300X eagle3")
    at = dict(zip(np.round(mi300.x, 4), mi300.y))
    # by hand: g=1 -> 2 rps: TP1 ceil(2/0.9)=3 GPUs, TP2 ceil(2/2.1)*2=2 -> 2
    #          g=2 -> 4 rps: TP1 5, TP2 2*2=4 -> 4;  g=3 -> 6 rps: TP1 7, TP2 3*2=6 -> 6
    #          g=4 -> 8 rps: TP1 ceil(8.89)=9, TP2 ceil(3.81)*2=8 -> 8
    assert (at[1.0], at[2.0], at[3.0], at[4.0]) == (2, 4, 6, 8)
    mi355 = trace(fig, "MI355X none")                      # r = 1.5: ceil(2/1.5)=2, ceil(4/1.5)=3, ceil(6/1.5)=4
    at = dict(zip(np.round(mi355.x, 4), mi355.y))
    assert (at[1.0], at[2.0], at[3.0]) == (2, 3, 4)
    assert not any("MI355X eagle3" == t.name for t in fig.data)   # infeasible candidate left out
    assert fig.layout.yaxis.title.text == "GPUs needed (GPUs)"
    assert "requests/s" in fig.layout.xaxis.title.text
    # the plan's headroom sizes for more traffic: g=1 with +20 % -> 2.4 rps: TP1 ceil(2.67)=3, TP2 ceil(1.14)*2=4 -> 3
    fig = figures.gpus_vs_growth_figure(pd.DataFrame(CANDIDATES), PLAN_R0, headroom=0.2)
    at = dict(zip(np.round(trace(fig, "MI300X eagle3").x, 4), trace(fig, "MI300X eagle3").y))
    assert at[1.0] == 3 and at[2.0] == 6                       # 4.8 rps: TP1 ceil(5.33)=6, TP2 ceil(2.29)*2=6


def test_speedup_when_only_n_is_swept(sweep_dir):
    """No method column: N = 0 is the baseline of the base scenario's method."""
    rows = report.read_sweep_rows(sweep_dir / "results.jsonl")
    rows = rows[rows["speculative.method"].isin(["none", "eagle3"])].drop(columns=["speculative.method"])
    t = figures.speedup_table(rows)
    light = t[t["traffic.arrival.rate_rps"] == 1.0]
    assert set(light.method_name) == {"speculative"}
    for _, r in light.iterrows():
        assert r.speedup == pytest.approx(SPEEDUP[("eagle3", r.n)])


def test_validation_figure_points_and_bands(validate_dir):
    rows = pd.read_csv(validate_dir / "rows.csv")
    fig = figures.validation_figure(rows)
    ttft = trace(fig, "TTFT (ms)")
    assert sorted(zip(ttft.x, ttft.y)) == [(50.0, 55.0), (60.0, 48.0), (80.0, 100.0), (150.0, 150.0)]
    tput = trace(fig, "output throughput (tok/s per GPU)")
    assert len(tput.x) == 4
    np.testing.assert_allclose(sorted(tput.customdata), sorted([-5.0, 100 * 60 / 700, 100 * -100 / 1100, 100 * 100 / 1500]))
    diag = trace(fig, "y = x")
    np.testing.assert_allclose(diag.y, diag.x)
    for band in (0.15, 0.25):
        upper = trace(fig, f"±{band:.0%}")
        np.testing.assert_allclose(np.asarray(upper.y) / np.asarray(upper.x), 1 + band)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_speculation_by_load_figure_is_the_closed_form():
    """Step time a + b·B·(1 + n): the one-step speedup is τ(a + bB)/(a + bB(1 + n)), crossing 1 at
    B* = a(τ − 1)/(b(1 + n − τ)); the figure draws that curve and marks floor(B*)."""
    from capacity.spec.policies import break_even

    a, b, n, tau = 0.010, 0.00004, 3, 2.6
    sb = break_even(lambda B, c, k: a + b * B * (1 + k), {1: 1.7, 2: 2.2, 3: tau}.__getitem__, n, 800.0, 1024,
                    at_batch=20)
    fig = figures.speculation_by_load_figure(sb, source="test")
    curve, limit, star = fig.data
    x = np.asarray(curve.x, dtype=float)
    assert np.allclose(curve.y, tau * (a + b * x) / (a + b * x * (1 + n)))
    assert list(limit.x) == [math.floor(a * (tau - 1) / (b * (1 + n - tau)))] * 2
    assert list(star.x) == [20] and fig.layout.xaxis.type == "log"
    with pytest.raises(CapacityError, match="curve"):
        figures.speculation_by_load_figure({"num_speculative_tokens": 3}, source="test")


def test_figures_say_where_they_came_from():
    src = figures.provenance("chatbot", None)
    assert src.startswith("scenario chatbot · ")
    assert re.search(r"commit [0-9a-f]{4,}|capacity \S+", src)
    assert figures.provenance("x", "abc1234") == "scenario x · commit abc1234"


def test_missing_columns_are_one_line_errors():
    with pytest.raises(CapacityError) as e:
        figures.pareto_figure(pd.DataFrame({"a": [1]}))
    assert "\n" not in str(e.value) and "tok_s_per_user_p50" in str(e.value)


# ------------------------------------------------------------------------------- explainer
def exact_tau_moments(alpha: float, n: int) -> tuple[float, float]:
    """Mean and variance of tau = A + 1 with P(A = k) = alpha^k (1 - alpha) for k < n, alpha^n for k = n."""
    p = np.array([alpha ** k * (1 - alpha) for k in range(n)] + [alpha ** n])
    tau = np.arange(1, n + 2)
    mean = float(p @ tau)
    return mean, float(p @ tau ** 2 - mean ** 2)


def embedded_data(html_text: str, div_id: str = "explainer") -> dict:
    m = re.search(r'<script type="application/json" id="' + div_id + r'-data">(.*?)</script>', html_text, re.S)
    assert m
    return json.loads(m.group(1))


def test_explainer_sampled_means_match_the_closed_form(tmp_path):
    out = tmp_path / "explainer.html"
    assert run_cli(["report", "--explainer", str(out)]) == 0
    text = out.read_text()
    assert text.count(plotly_js_header()) == 1
    data = embedded_data(text)
    assert data["model"] == "capacity.spec.acceptance.IIDAcceptance"
    assert len(data["alphas"]) == 21 and data["ns"] == list(range(1, 9))
    rounds = data["sample_rounds"]
    for ai, alpha in enumerate(data["alphas"]):
        for n in data["ns"]:
            f = data["frames"][ai][n - 1]
            mean, var = exact_tau_moments(alpha, n)
            assert f["expected"] == pytest.approx(mean, abs=1e-4)           # the page's closed form
            assert abs(f["sampled_mean"] - mean) <= 5 * math.sqrt(var / rounds) + 1e-9, (alpha, n)
            shown = np.array(f["shown"])
            assert shown.min() >= 0 and shown.max() <= n
            written = np.cumsum(shown + 1)
            assert written[-1] >= data["target_tokens"] and (len(shown) == 1 or written[-2] < data["target_tokens"])
    # the same uniforms for every alpha: more acceptance never takes more rounds
    for n in data["ns"]:
        used = [len(data["frames"][ai][n - 1]["shown"]) for ai in range(len(data["alphas"]))]
        assert used == sorted(used, reverse=True)
    # alpha = 0: one token per round; alpha = 1: every draft accepted
    assert data["frames"][0][3]["shown"] == [0] * data["target_tokens"]
    assert set(data["frames"][-1][3]["shown"]) == {4}


def test_explainer_figure_cells():
    fig = explainer.explainer_figure(0.5, 3)
    heat = fig.data[0]
    shown = explainer.explainer_data()["frames"][10][2]["shown"]
    assert len(heat.z) == len(shown)
    for row, a in zip(heat.z, shown):
        assert list(row) == [1] * a + ([2] if a < 3 else []) + [3] * max(0, 3 - a - 1) + [4]
    assert fig.layout.xaxis.title.text.startswith("position in the round")
    assert "(1 − α^(N+1))/(1 − α)" in fig.layout.title.subtitle.text


# ------------------------------------------------------------------------------ the HTML page
def check_page(path: Path, n_figures: int) -> str:
    text = path.read_text()
    assert text.count(plotly_js_header()) == 1                  # plotly.js inline exactly once
    from plotly.offline import get_plotlyjs

    rest = text.replace(get_plotlyjs(), "")                      # the page around plotly.js
    assert not re.search(r"<script[^>]+src=|<link|https?://", rest)     # nothing fetched: opens offline
    assert text.count('class="plotly-graph-div') == n_figures + 1     # + the draft-and-verify view
    return text


def test_simulate_report(sim_dir, tmp_path):
    out = tmp_path / "sim.html"
    assert run_cli(["report", str(sim_dir), "--out", str(out)]) == 0
    rep = report.build_report(sim_dir)
    assert [s for s, _ in rep.figures] == ["latency_cdf", "acceptance", "prefix_cache", "speculation_by_load"]
    text = check_page(out, 4)
    for needle in ("capacity simulate report: report-test", "scenario report-test",
                   "TTFT and TPOT distributions against the SLOs", "TTFT per request (ms, log scale)",
                   "fraction of requests (cumulative, 0–1)", "draft position j (token)",
                   "Acceptance of drafted tokens", "Draft and verify", "Mean accepted length"):
        assert needle in text or json.dumps(needle)[1:-1] in text, needle
    assert re.search(r"commit [0-9a-f]{4,}|capacity \d", text)
    drawn = figure_json(text, "fig-latency_cdf")
    assert drawn["layout"]["title"]["subtitle"]["text"].startswith("scenario report-test")


def test_default_output_is_results_report_html(validate_dir):
    assert run_cli(["report", str(validate_dir)]) == 0
    text = check_page(validate_dir / "report.html", 1)
    assert "Predicted vs measured" in text and "median error" in text


def test_sweep_report(sweep_dir, tmp_path):
    out = tmp_path / "sweep.html"
    assert run_cli(["report", str(sweep_dir), "--out", str(out)]) == 0
    text = check_page(out, 3)
    for div in ("fig-pareto", "fig-speedup", "fig-gpus_vs_traffic"):
        assert f'id="{div}"' in text
    assert "scenario chatbot" in text and "Grid: 42 points, 35 stable" in text


def test_plan_report(plan_dir, tmp_path):
    out = tmp_path / "plan.html"
    assert run_cli(["report", str(plan_dir), "--out", str(out)]) == 0
    rep = report.build_report(plan_dir)
    assert [s for s, _ in rep.figures] == ["gpus_vs_growth", "latency_cdf", "acceptance"]
    assert any("Throughput per GPU" in t for t, _ in rep.skipped)       # candidates carry no per-user speed
    text = check_page(out, 3)
    assert "Recommendation: 1 × TP2 MI300X = 2 GPUs, eagle3 N = 3" in text
    cdf = figure_json(text, "fig-latency_cdf")
    assert {t.get("name") for t in cdf["data"]} >= {"recommended", "one fewer replica"}


# ------------------------------------------------------------------------ in a real browser
def chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", *args],
        capture_output=True, text=True, timeout=180)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line and re.search(r"error|uncaught|exception|failed", line, re.I)]


@needs_chromium
def test_browser_draws_every_figure_without_errors(sim_dir, sweep_dir, tmp_path):
    for name, folder, ids in (("sim", sim_dir, ["fig-latency_cdf", "fig-acceptance"]),
                              ("sweep", sweep_dir, ["fig-pareto", "fig-speedup", "fig-gpus_vs_traffic"])):
        page = tmp_path / f"{name}.html"
        report.write_report(folder, page)
        res = chromium(["--dump-dom", page.as_uri()], tmp_path / name)
        assert res.returncode == 0, res.stderr[-2000:]
        assert console_errors(res.stderr) == []
        dom = res.stdout
        for div in ids + ["explainer"]:
            m = re.search(r'<div id="' + div + r'" class="([^"]*)"', dom)
            assert m and "js-plotly-plot" in m.group(1), f"{div} was not drawn"
        assert dom.count('class="main-svg"') >= len(ids) + 1
        # the view's script ran: it filled the statistics line from the embedded samples
        assert re.search(r'id="explainer-stats">rounds used: <b>\d+</b>', dom)


@needs_chromium
def test_browser_sliders_switch_frames(tmp_path):
    """Moving the sliders redraws the view from the embedded frame of that alpha and N."""
    page = explainer.write_explainer(tmp_path / "explainer.html")
    ai, n = 10, 2                                                           # alpha 0.50, N = 2
    move = ("<script>(function(){var a=document.getElementById('explainer-alpha'),"
            "n=document.getElementById('explainer-n');"
            f"a.value={ai};a.dispatchEvent(new Event('input'));n.value={n};n.dispatchEvent(new Event('input'));"
            "})();</script></body>")
    page.write_text(page.read_text().replace("</body>", move))
    res = chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert res.returncode == 0 and console_errors(res.stderr) == []
    frame = explainer.explainer_data()["frames"][ai][n - 1]
    rounds = len(frame["shown"])
    dom = res.stdout
    assert 'id="explainer-alpha-value">0.50<' in dom and f'id="explainer-n-value">{n}<' in dom
    assert f"rounds used: <b>{rounds}</b>" in dom
    assert f"<b>{frame['sampled_mean']:.3f}</b>" in dom and f"<b>{frame['expected']:.3f}</b>" in dom
    assert f">round {rounds} (+{frame['shown'][-1] + 1})<" in dom and f">round {rounds + 1} (" not in dom
    assert ">d2<" in dom and ">d3<" not in dom                              # N = 2 columns, then +1


@needs_chromium
def test_browser_play_and_step_walk_through_the_rounds(tmp_path):
    """The view animates (issue 18 item 9): step back shows one round fewer, step forward one more,
    with the tokens written so far; at the end it shows every round again."""
    page = explainer.write_explainer(tmp_path / "explainer.html")
    frame = explainer.explainer_data()["frames"][explainer.ALPHAS.index(explainer.DEFAULT_ALPHA)][explainer.DEFAULT_N - 1]
    rounds = len(frame["shown"])
    clicks = ("<script>(function(){var b=document.getElementById('explainer-back'),"
              "s=document.getElementById('explainer-step');"
              "b.click();b.click();b.click();s.click();})();</script></body>")
    page.write_text(page.read_text().replace("</body>", clicks))
    res = chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert res.returncode == 0 and console_errors(res.stderr) == []
    k = rounds - 2                                              # three back, one forward
    written = sum(a + 1 for a in frame["shown"][:k])
    dom = res.stdout
    assert f"round <b>{k}</b> of {rounds}: <b>{written}</b> tokens written so far" in dom
    assert f">round {k} (" in dom and f">round {k + 1} (" not in dom
    assert 'id="explainer-play"' in dom


def test_the_view_opens_at_the_runs_n_and_alpha():
    """A run with N = 3 and 2.71 tokens per round opens the view at N = 3 and the α whose closed form
    (1 − α^4)/(1 − α) is 2.71."""
    alpha = explainer.alpha_for(2.71, 3)
    assert (1 - alpha ** 4) / (1 - alpha) == pytest.approx(2.71, abs=1e-9)
    html = explainer.explainer_section(alpha=alpha, n=3, basis="from this run")
    assert 'id="explainer-n" min="1" max="8" step="1" value="3"' in html and "from this run" in html


@needs_chromium
def test_png_export(sim_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    png = tmp_path / "png"
    assert run_cli(["report", str(sim_dir), "--out", str(tmp_path / "r.html"), "--png", str(png)]) == 0
    pngs = sorted(png.glob("*.png"))
    assert [p.stem for p in pngs] == ["01_latency_cdf", "02_acceptance", "03_prefix_cache", "04_speculation_by_load",
                                      "05_draft_and_verify"]
    for p in pngs:
        head = p.read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
        svg = p.with_suffix(".svg")
        assert svg.is_file() and "<svg" in svg.read_text()[:500]
    md = (png / "summary.md").read_text()
    for p in pngs:
        assert f"]({p.name})" in md and f"]({p.stem}.svg)" in md
    assert "Mean accepted length" in md


def test_png_export_without_a_browser_is_one_line(sim_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setattr(report.shutil, "which", lambda name: None)
    monkeypatch.setattr(report.os, "access", lambda path, mode: False)
    import choreographer.browsers.chromium as ch

    monkeypatch.setattr(ch.Chromium, "find_browser", classmethod(lambda cls, **kw: None))
    assert run_cli(["report", str(sim_dir), "--out", str(tmp_path / "r.html"), "--png", str(tmp_path / "png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "chromium" in err


def test_the_pareto_figure_of_plan_rows_names_each_points_gpu():
    """Plan candidates (issue 18 item 10): each point's GPU is its marker (a legend entry per GPU) and
    in its hover text; rows the planner did not simulate (no metrics) are left out."""
    import pandas as pd

    from capacity.report import figures as F

    rows = pd.DataFrame({"gpu": ["MI300X", "MI355X", "MI355X", "MI300X"],
                         "method": ["none", "none", "eagle3", "eagle3"],
                         "label": ["MI300X TP1 none", "MI355X TP1 none", "MI355X TP1 eagle3 N=3", "MI300X TP1 eagle3 N=3"],
                         "tok_s_per_user_p50": [40.0, 55.0, 120.0, None],
                         "output_throughput_tok_s_per_gpu": [300.0, 420.0, 800.0, None]})
    fig = F.pareto_figure(rows)
    names = [t.name for t in fig.data]
    assert "MI300X" in names and "MI355X" in names
    drawn = [t for t in fig.data if t.x and t.x[0] is not None]
    assert sum(len(t.x) for t in drawn) == 3
    assert any("MI355X TP1 eagle3" in txt for t in drawn for txt in (t.text or []))
