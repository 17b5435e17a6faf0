"""Per-request-class metrics and class-qualified SLOs (issue 18 item 6), against independent truth.

The truth is computed here from the run's requests frame with the documented `vllm bench serve`
definitions (TTFT = first token - arrival, E2E = finish - arrival, TPOT = (E2E - TTFT) / (output - 1)
over requests with more than one output token, queue = first scheduled - arrival, tok/s per user =
1000 / TPOT; completed requests only; numpy's default percentiles), never with the code's helpers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from capacity.cli import main
from capacity.inputs import scenario
from capacity.sim import simulate, summary

# Short prompts and long prompts on one GPU at a load it carries: the long class's TTFT is much
# longer (a 6,000-token prefill against 200), so one TTFT bound separates the classes.
TWO_CLASS = {
    "name": "two_class",
    "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
    "traffic": {
        "arrival": {"process": "poisson", "rate_rps": 3.0},
        "num_requests": 300,
        "classes": [
            {"name": "short", "weight": 3.0,
             "input_tokens": {"dist": "uniform", "low": 100, "high": 300},
             "output_tokens": {"dist": "uniform", "low": 1, "high": 200}},
            {"name": "Long prompts", "weight": 1.0,
             "input_tokens": {"dist": "uniform", "low": 5000, "high": 7000},
             "output_tokens": {"dist": "uniform", "low": 50, "high": 300}},
        ],
    },
    "simulation": {"seed": 3},
}
CLASSES = ("short", "Long prompts")
LAT = ("mean", "p50", "p90", "p99")


def two_class(slo: str | None = None, **traffic) -> scenario.Scenario:
    data = json.loads(json.dumps(TWO_CLASS))
    data["traffic"].update(traffic)
    if slo is not None:
        data["slo"] = slo
    return scenario.from_dict(data)


def truth(requests, cls: str | None = None) -> dict[str, np.ndarray]:
    """Per-request latencies of the completed requests (of one class), in ms, from the raw frame."""
    r = requests
    keep = ~np.isnan(r["arrival_s"].to_numpy(float)) & ~r["rejected"].to_numpy(bool)
    if cls is not None:
        keep &= (r["class_name"] == cls).to_numpy()
    r = r[keep]
    done = r[~np.isnan(r["finish_s"].to_numpy(float))]
    arrival = done["arrival_s"].to_numpy(float)
    ttft = (done["first_token_s"].to_numpy(float) - arrival) * 1000.0
    e2e = (done["finish_s"].to_numpy(float) - arrival) * 1000.0
    out = done["output_tokens"].to_numpy(float)
    multi = out > 1
    tpot = (e2e[multi] - ttft[multi]) / (out[multi] - 1.0)
    return {
        "sent": np.asarray(len(r)),
        "ttft": ttft, "e2e": e2e, "tpot": tpot, "tpot_all": np.where(multi, (e2e - ttft) / np.maximum(out - 1.0, 1.0), 0.0),
        "queue": (done["first_scheduled_s"].to_numpy(float) - arrival) * 1000.0,
        "out": out, "prompt": done["prompt_tokens"].to_numpy(float),
    }


@pytest.fixture(scope="module")
def run_two():
    return simulate.run(two_class())


def test_per_class_percentiles_equal_numpy_on_the_requests_frame(run_two):
    m = run_two.metrics
    assert list(m["per_class"]) == sorted(CLASSES, key=lambda c: int(
        np.flatnonzero((run_two.requests["class_name"] == c).to_numpy())[0]))
    assert set(m["per_class"]) == set(CLASSES)
    duration = m["duration_s"]
    for cls in CLASSES:
        t = truth(run_two.requests, cls)
        b = m["per_class"][cls]
        assert len(t["ttft"]) > 30 and len(t["tpot"]) > 30        # enough requests of each class to mean something
        assert b["num_requests"] == int(t["sent"])
        assert b["completed"] == len(t["ttft"])
        for key, v in (("ttft_ms", t["ttft"]), ("tpot_ms", t["tpot"]), ("e2e_ms", t["e2e"]),
                       ("queue_delay_ms", t["queue"])):
            for stat in LAT:
                want = np.mean(v) if stat == "mean" else np.percentile(v, float(stat[1:]))
                assert b[key][stat] == pytest.approx(want, rel=1e-12, abs=1e-12), (cls, key, stat)
        user = 1000.0 / t["tpot"]
        for stat in ("p10", "p50", "p90"):
            assert b["tok_s_per_user"][stat] == pytest.approx(np.percentile(user, float(stat[1:])), rel=1e-12)
        assert b["output_throughput_tok_s"] == pytest.approx(t["out"].sum() / duration, rel=1e-12)
        assert b["request_throughput_rps"] == pytest.approx(len(t["ttft"]) / duration, rel=1e-12)
        assert b["total_throughput_tok_s"] == pytest.approx((t["out"].sum() + t["prompt"].sum()) / duration, rel=1e-12)
        assert "itl_ms" not in b                                  # ITL gaps are pooled, not per request
        assert b["goodput_rps"] is None and b["slo"] == [] and b["slo_met"] is None
    # the long prompts do wait longer for their first token: the classes really differ
    assert m["per_class"]["Long prompts"]["ttft_ms"]["p50"] > 3 * m["per_class"]["short"]["ttft_ms"]["p50"]
    # the classes add up to the run
    for key in ("completed", "num_requests", "total_output_tokens", "total_input_tokens", "preemptions"):
        assert sum(m["per_class"][c][key] for c in CLASSES) == m[key], key
    assert sum(m["per_class"][c]["output_throughput_tok_s"] for c in CLASSES) == pytest.approx(m["output_throughput_tok_s"])


def test_pooled_numbers_unchanged_by_the_per_class_feature(run_two, monkeypatch):
    """The same seed with every request put in one class (so no per-class block is built) gives
    the same pooled metrics, bit for bit; and they are numpy's numbers on the whole frame."""
    slo = "ttft:p99<2s;tpot:p90<30ms;e2e:p50<10s"
    with_classes = simulate.run(two_class(slo)).metrics
    frame = simulate._request_columns

    def one_class(cluster, stream):
        df = frame(cluster, stream)
        df["class_name"] = np.full(len(df), "all", dtype=object)
        return df

    monkeypatch.setattr(simulate, "_request_columns", one_class)
    pooled_only = simulate.run(two_class(slo)).metrics
    assert "per_class" not in pooled_only
    per_class = with_classes.pop("per_class")
    assert json.dumps(with_classes, sort_keys=False) == json.dumps(pooled_only, sort_keys=False)
    t = truth(run_two.requests)
    assert with_classes["ttft_ms"]["p99"] == pytest.approx(np.percentile(t["ttft"], 99), rel=1e-12)
    assert with_classes["tpot_ms"]["p90"] == pytest.approx(np.percentile(t["tpot"], 90), rel=1e-12)
    # with only unqualified SLOs a class's goodput counts its requests meeting all of them
    assert sum(per_class[c]["goodput_rps"] for c in CLASSES) == pytest.approx(with_classes["goodput_rps"])
    assert all(per_class[c]["slo"] == [] and per_class[c]["slo_met"] is None for c in CLASSES)


def test_class_qualified_slo_met_by_one_class_missed_by_the_other(run_two):
    short = truth(run_two.requests, "short")
    long_ = truth(run_two.requests, "Long prompts")
    # (the classes' TTFT tails are alike: a short prompt's worst case is to wait behind a long
    # prefill; their medians are far apart)
    p50_short, p50_long = np.percentile(short["ttft"], 50), np.percentile(long_["ttft"], 50)
    assert 2 * p50_short < 0.9 * p50_long
    bound = round(2.0 * p50_short, 6)                          # ms: the short class meets it
    long_bound = round(0.9 * p50_long / 1000.0, 9)             # s: the long class misses it, by 10 %
    tpot_bound = float(np.percentile(np.concatenate([short["tpot"], long_["tpot"]]), 95))
    slo = f"ttft[short]:p50<{bound:.6f}ms; ttft[Long prompts]:median<{long_bound:.9f}s; tpot:p90<{tpot_bound:.6f}ms"
    res = simulate.run(two_class(slo))
    m = res.metrics
    rows = {r["slo"]: r for r in m["slo"]}
    r_short, r_long, r_tpot = (rows[s.strip()] for s in slo.split(";"))
    assert r_short["class"] == "short" and r_short["met"] is True
    assert r_short["achieved"] == pytest.approx(p50_short, rel=1e-12)
    assert r_long["class"] == "Long prompts" and r_long["met"] is False
    assert r_long["achieved"] == pytest.approx(p50_long, rel=1e-12)
    assert "class" not in r_tpot and r_tpot["met"] is True
    assert m["slo_met"] is False
    pc = m["per_class"]
    assert pc["short"]["slo_met"] is True and [r["slo"] for r in pc["short"]["slo"]] == [r_short["slo"]]
    assert pc["Long prompts"]["slo_met"] is False and [r["slo"] for r in pc["Long prompts"]["slo"]] == [r_long["slo"]]
    # goodput (vLLM: a request is good when it meets every SLO that applies to it): a short request
    # needs the short TTFT bound and the TPOT bound, a long one the long TTFT bound and the TPOT bound
    thr = {"short": bound, "Long prompts": long_bound * 1000.0}
    good = {c: int(np.sum((t["ttft"] <= thr[c]) & (t["tpot_all"] <= tpot_bound)))
            for c, t in (("short", short), ("Long prompts", long_))}
    assert 0 < good["Long prompts"] < len(long_["ttft"])
    # the bounds are applied to their own class only: the long requests between the two bounds count
    assert np.sum((long_["ttft"] > thr["short"]) & (long_["ttft"] <= thr["Long prompts"])) > 0
    for c in CLASSES:
        assert pc[c]["goodput_rps"] == pytest.approx(good[c] / m["duration_s"], rel=1e-12)
    assert m["goodput_rps"] == pytest.approx(sum(good.values()) / m["duration_s"], rel=1e-12)
    # the human summary: a per-class table with each class's verdict, achieved values with units
    text = summary.simulation_summary(res)
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("Per class"))
    assert "TTFT p50/p99 ms" in lines[head] and "class SLOs" in lines[head]
    short_row, long_row = lines[head + 1], lines[head + 2]
    assert short_row.startswith("short") and short_row.rstrip().endswith("met")
    assert long_row.startswith("Long prompts") and long_row.rstrip().endswith("MISSED")
    assert f" {p50_short:,.0f} / " in short_row and f" {p50_long:,.0f} / " in long_row
    slo_line = next(ln for ln in lines if ln.startswith("SLOs"))
    assert f"→ {p50_short:,.1f} ms ok" in slo_line
    assert f"→ {p50_long / 1000:.3g} s MISSED" in slo_line


def test_unknown_class_is_one_line_through_the_cli(tmp_path, capsys):
    data = json.loads(json.dumps(TWO_CLASS))
    data["traffic"]["num_requests"] = 20
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(data))
    rc = main(["simulate", str(path), "--set", "slo=ttft[chat]:p99<1s;tpot:p90<20ms"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("capacity: error: "), err
    for word in ("'chat'", "'short'", "'Long prompts'"):
        assert word in err[0], (word, err[0])
    # an ITL SLO cannot name a class (its gaps are not recorded per request)
    rc = main(["simulate", str(path), "--set", "slo=itl[short]:p99<100ms"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "itl" in err[0], err


def test_one_class_run_has_no_per_class_key(capsys):
    args = ["simulate", "chatbot_single_turn", "--json", "--no-compare", "--set", "traffic.num_requests=60"]
    assert main(args) == 0
    m = json.loads(capsys.readouterr().out)["metrics"]
    assert "per_class" not in m and m["slo"]
    # naming the only class judges the same requests as naming none
    assert main(args + ["--set", "slo=ttft[conversation]:p99<1s;tpot[conversation]:p90<15ms"]) == 0
    q = json.loads(capsys.readouterr().out)["metrics"]
    assert "per_class" not in q
    assert [(r["achieved"], r["met"]) for r in q["slo"]] == [(r["achieved"], r["met"]) for r in m["slo"]]
    assert (q["goodput_rps"], q["slo_met"]) == (m["goodput_rps"], m["slo_met"])


def test_the_plan_judges_a_class_slo_on_that_class_alone():
    """plan.judge: `ttft[a]:p99<100ms` is the 99th percentile of class a's steady-state TTFTs (numpy
    on the frame below), met although class b's TTFTs are ten times longer; the unqualified SLO is
    judged on every request."""
    import pandas as pd

    from capacity.sim.metrics import parse_slos
    from capacity.studies import plan

    n = 400
    cls = np.where(np.arange(n) % 2 == 0, "a", "b")
    ttft = np.where(cls == "a", 0.05, 0.5) + np.linspace(0, 0.01, n)
    arrival = np.arange(n) * 1.0
    frame = pd.DataFrame({"request_id": np.arange(n), "class_name": cls, "arrival_s": arrival,
                          "first_scheduled_s": arrival, "first_token_s": arrival + ttft,
                          "finish_s": arrival + ttft + 1.0, "output_tokens": np.full(n, 11),
                          "prompt_tokens": np.full(n, 100), "num_preemptions": np.zeros(n, dtype=int)})
    out = plan.judge({"metrics": {"slo": []}, "requests": frame, "ok": True},
                     parse_slos("ttft[a]:p99<100ms;ttft:p99<1s"))
    steady = frame.iloc[int(n * plan.WARMUP_FRACTION):]
    a = (steady.first_token_s - steady.arrival_s)[steady.class_name == "a"] * 1000
    assert out["slo"][0]["achieved"] == pytest.approx(np.percentile(a, 99))
    assert out["slo"][0]["met"] and out["slo"][1]["met"] and out["ok"]
    assert out["slo"][1]["achieved"] == pytest.approx(np.percentile((steady.first_token_s - steady.arrival_s) * 1000, 99))
