"""capacity plan (issue 18): a replica search that cannot give up on a feasible answer, margins
confirmed at target × (1 + headroom), percentiles with their uncertainty, and the answer as a
deployment (servers, `vllm serve` and `vllm bench serve` lines)."""

from __future__ import annotations

import itertools
import json
import math
import shlex

import numpy as np
import pytest
import yaml

from capacity.cli import main
from capacity.inputs import scenario
from capacity.inputs.hardware import load_gpu
from capacity.sim import simulate
from capacity.studies import plan

SCENARIO = {
    "name": "plan-search-test",
    "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
    "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 100,
                "classes": [{"name": "chat", "input_tokens": {"dist": "uniform", "low": 200, "high": 1200},
                             "output_tokens": {"dist": "uniform", "low": 50, "high": 250}}]},
    "slo": "ttft:p99<1s;tpot:p90<15ms",
    "plan": {"target_rate_rps": 20, "headroom": 0.25, "simulate_top": 1, "requests_per_probe": 100,
             "search": {"gpu": ["MI300X"], "tensor_parallel_size": [1], "speculative": [{"method": "none"}]}},
}


# ------------------------------------------------------------------------------ 1. the search
@pytest.mark.parametrize("start,true_min,max_r", [(28, 21, 256), (28, 3, 256), (1, 40, 256), (5, 5, 256),
                                                  (200, 1, 256), (7, 256, 256)])
def test_replica_search_finds_the_boundary_from_any_start(start, true_min, max_r):
    """From any starting estimate the search returns the fewest replicas that meet the SLOs, having
    seen that count meet and one fewer miss, in a logarithmic number of simulations; stepping one
    replica at a time from 28 down to 21 (the issue's case) took 8 adjustments and gave up."""
    calls = []

    def meets(r):
        calls.append(r)
        return r >= true_min

    found, tried = plan.search_replicas(start, max_r, meets)
    assert found == true_min
    assert tried[found] is True and (found == 1 or tried[found - 1] is False)
    assert len(calls) == len(set(calls))                      # each count simulated once
    assert len(calls) <= 2 * math.ceil(math.log2(max_r)) + 2


def test_replica_search_says_none_when_even_the_limit_misses():
    found, tried = plan.search_replicas(3, 16, lambda r: False)
    assert found is None and tried[16] is False


@pytest.fixture(scope="module")
def underestimated_plan(tmp_path_factory):
    """The failure mode of the issue, cheaply: the single-replica probes only try 8 % of the
    analytic rate, so the estimate starts at about ten times too many replicas and the old planner
    (one replica fewer per adjustment, at most 8) could not come down to the answer."""
    tmp = tmp_path_factory.mktemp("plan")
    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    mp = pytest.MonkeyPatch()
    mp.setattr(plan, "_PROBE_FACTORS", (0.08,))
    try:
        out = tmp / "out"
        assert main(["plan", str(path), "--out", str(out)]) == 0
    finally:
        mp.undo()
    return out


def test_an_estimate_far_too_high_still_ends_at_the_confirmed_minimum(underestimated_plan):
    p = json.loads((underestimated_plan / "plan.json").read_text())
    rec = p["recommendation"]
    tried = {int(k): v for k, v in rec["replicas_tried"].items()}
    start = max(tried)
    assert start - rec["replicas"] > 8                      # more than the old 8 adjustments away
    assert rec["slo_met"] is True and tried[rec["replicas"]] is True
    assert rec["replicas"] == 1 or tried[rec["replicas"] - 1] is False


# ------------------------------------------------------------------------------ 2. margins that hold
def test_recommendation_holds_at_target_times_headroom_and_one_fewer_misses(underestimated_plan):
    """`capacity simulate` on recommended.yaml runs at target × (1 + headroom) and meets the SLOs
    (the whole run, as simulate judges it, and in the steady state); one fewer replica, at the same
    rate, misses under the plan's judgement."""
    rec = json.loads((underestimated_plan / "plan.json").read_text())["recommendation"]
    target = SCENARIO["plan"]["target_rate_rps"] * (1 + SCENARIO["plan"]["headroom"])
    assert rec["confirmed_at_rps"] == pytest.approx(target)
    sc = scenario.load(str(underestimated_plan / "recommended.yaml"))
    assert sc.traffic.arrival.rate_rps == pytest.approx(target)
    assert sc.deployment.replicas == rec["replicas"]
    slos = plan.parse_slos(sc.slo)
    res = simulate.run(sc)
    assert res.metrics["slo_met"] is True
    run = {"ok": True, "metrics": res.metrics, "requests": res.requests}
    assert plan.judge(run, slos)["ok"] is True
    if rec["replicas"] > 1:
        fewer_sc = scenario.load(str(underestimated_plan / "one_fewer_replica.yaml"))
        assert fewer_sc.traffic.arrival.rate_rps == pytest.approx(target)
        assert fewer_sc.deployment.replicas == rec["replicas"] - 1
        fewer = simulate.run(fewer_sc)
        verdict = plan.judge({"ok": bool(fewer.metrics["slo_met"]) and fewer.stable, "metrics": fewer.metrics,
                              "requests": fewer.requests}, slos)
        assert verdict["ok"] is False


def test_every_ranked_row_follows_from_its_rate_and_says_its_basis(underestimated_plan):
    p = json.loads((underestimated_plan / "plan.json").read_text())
    target = SCENARIO["plan"]["target_rate_rps"] * (1 + SCENARIO["plan"]["headroom"])
    for c in [c for c in p["candidates"] if c["feasible"]]:
        assert c["replicas"] == max(1, math.ceil(target / c["max_rate_per_replica_rps"] - 1e-9)), c["label"]
        assert c["total_gpus"] == c["replicas"] * c["tensor_parallel_size"]
        basis = c["basis"]
        if c["confirmed"]:
            assert basis.startswith("confirmed:") and "simulated" in basis
        elif c["simulated"]:
            assert basis.startswith("simulated: one replica")
        else:
            assert basis.startswith("analytic") and "not simulated" in basis


def test_the_written_scenario_describes_what_it_deploys(underestimated_plan):
    rec = json.loads((underestimated_plan / "plan.json").read_text())["recommendation"]
    text = yaml.safe_load((underestimated_plan / "recommended.yaml").read_text())["description"]
    assert f"{rec['replicas']} replicas × MI300X TP1" in text and "no speculation" in text
    assert f"{rec['confirmed_at_rps']:g} req/s" in text


# ------------------------------------------------------------------------------ 3. percentiles
def _binomial_cdfs(n: int, p: float) -> list[float]:
    """P(Binomial(n, p) <= k) for k = 0..n, summing C(n, i) p^i (1 - p)^(n - i)."""
    out, acc = [], 0.0
    for i in range(n + 1):
        acc += math.comb(n, i) * p ** i * (1 - p) ** (n - i)
        out.append(acc)
    return out


@pytest.mark.parametrize("n,q", [(1000, 99.0), (400, 90.0), (57, 50.0)])
def test_percentile_interval_is_the_binomial_order_statistic_interval(n, q):
    """The interval is [x_(l), x_(u)] with l the smallest rank whose Binomial(n, q) CDF reaches
    2.5 % and u − 1 the smallest whose CDF reaches 97.5 %; computed here from the binomial sum."""
    x = np.random.default_rng(1).lognormal(size=n)
    p = q / 100
    cdf = _binomial_cdfs(n, p)
    l = next(k for k in range(n + 1) if cdf[k] >= 0.025)
    u = next(k for k in range(n + 1) if cdf[k] >= 0.975) + 1
    srt = np.sort(x)
    lo, hi = plan.percentile_interval(x, q)
    assert lo == srt[max(l, 1) - 1] and hi == srt[min(u, n) - 1]
    # its coverage, P(l <= B < u), is at least 95 %
    assert cdf[u - 1] - (cdf[l - 1] if l >= 1 else 0.0) >= 0.95


def test_judgement_leaves_out_the_warm_up_and_gives_margin_and_interval():
    """A hand-made run: the first tenth of arrivals is slow (warm-up); the steady-state p90 TPOT is
    the requests after them, and the margin is (threshold − achieved) / threshold."""
    import pandas as pd

    n = 200
    arrival = np.arange(n, dtype=float)
    ttft = np.full(n, 0.1)
    ttft[:20] = 5.0                          # warm-up requests: far over the 1 s TTFT SLO
    out = np.full(n, 11)
    tpot = np.linspace(0.008, 0.012, n)      # s per token
    req = pd.DataFrame({"arrival_s": arrival, "first_token_s": arrival + ttft,
                        "finish_s": arrival + ttft + tpot * (out - 1), "output_tokens": out,
                        "prompt_tokens": np.full(n, 100), "first_scheduled_s": arrival,
                        "num_preemptions": np.zeros(n, int)})
    for col in ("request_id", "class_name"):
        req[col] = range(n) if col == "request_id" else "chat"
    verdict = plan.judge({"ok": True, "metrics": {"slo": []}, "requests": req}, plan.parse_slos("ttft:p99<1s;tpot:p90<15ms"))
    ttft_row, tpot_row = verdict["slo"]
    assert verdict["steady_requests"] == n - 20
    assert ttft_row["met"] and ttft_row["achieved"] == pytest.approx(100.0)
    steady_tpot = tpot[20:] * 1000
    assert tpot_row["achieved"] == pytest.approx(np.percentile(steady_tpot, 90))
    assert tpot_row["margin"] == pytest.approx((15 - np.percentile(steady_tpot, 90)) / 15)
    lo, hi = tpot_row["interval"]
    assert lo <= tpot_row["achieved"] <= hi
    assert tpot_row["margin_pm"] == pytest.approx((hi - lo) / 2 / 15)
    assert plan._verdict(tpot_row).startswith("met, margin ") and " ± " in plan._verdict(tpot_row)
    assert "uncertainty" not in plan._verdict(tpot_row)
    close = {**tpot_row, "margin": 0.01, "margin_interval": [-0.01, 0.03], "margin_pm": 0.02}
    assert plan._verdict(close) == "met, margin 1 % ± 2 %: within the run's uncertainty"


def test_evidence_runs_are_long_enough_for_p99():
    slos = plan.parse_slos("ttft:p99<1s;tpot:p90<15ms")
    n = plan.evidence_requests(slos, 2, 300)
    assert n * (1 - plan.WARMUP_FRACTION) >= 1000
    assert plan.evidence_requests(plan.parse_slos("tpot:p90<15ms"), 1, 50) * (1 - plan.WARMUP_FRACTION) >= 100


# ------------------------------------------------------------------------------ 4. the deployment
# vLLM's method names (vllm/config/speculative.py SpeculativeMethod / EagleModelTypes, and
# DSpark in the stored vLLM of capacity/data/methods.yaml).
VLLM_METHODS = {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "mtp",
                "dflash", "dspark"}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_deployment_has_servers_and_a_vllm_serve_line(underestimated_plan):
    p = json.loads((underestimated_plan / "plan.json").read_text())
    dep = p["recommendation"]["deployment"]
    assert p["servers"] == dep["servers"] and p["vllm_serve"] == dep["vllm_serve"]
    assert dep["gpus_per_server"] == 8                    # an 8-GPU MI300X platform
    assert dep["servers"] == math.ceil(dep["gpus"] / 8)
    argv = shlex.split(dep["vllm_serve"])
    env = list(itertools.takewhile(lambda a: "=" in a, argv))
    argv = argv[len(env):]
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B"]
    # the attention kernels the plan priced ("auto": AITER's flash attention on ROCm), named as InferenceX's
    # MI355X scripts name them, since vLLM >= 0.19 would otherwise run ROCM_ATTN (docs/seed_validation.md §33)
    assert "VLLM_ROCM_USE_AITER=1" in env and _flag(argv, "--attention-backend") == "ROCM_AITER_FA"
    tp = int(_flag(argv, "--tensor-parallel-size"))
    assert dep["gpus_per_server"] % tp == 0
    assert int(_flag(argv, "--max-num-seqs")) == 1024 and int(_flag(argv, "--max-num-batched-tokens")) == 8192
    assert "--speculative-config" not in argv            # speculation off
    bench = shlex.split(p["vllm_bench_serve"])
    assert bench[:3] == ["vllm", "bench", "serve"]
    assert float(_flag(bench, "--request-rate")) == pytest.approx(
        p["recommendation"]["confirmed_at_rps"] / p["recommendation"]["replicas"], rel=1e-2)
    goodput = bench[bench.index("--goodput") + 1:bench.index("--save-result")]
    assert goodput == ["ttft:1000", "tpot:15"]            # vLLM's --goodput: KEY:VALUE in ms


@pytest.mark.parametrize("method,n,model,draft", [
    ("dspark", 7, "google/gemma-4-31B-it", "RedHatAI/gemma-4-31B-it-speculator.dspark"),
    ("eagle3", 3, "google/gemma-4-31B-it", "RedHatAI/gemma-4-31B-it-speculator.eagle3"),
    ("gemma4_mtp", 3, "google/gemma-4-31B-it", "google/gemma-4-31B-it-assistant"),
    ("dflash", 15, "google/gemma-4-31B-it", "z-lab/gemma-4-31B-it-DFlash"),
    ("mtp", 3, "Qwen/Qwen3.5-27B", None),
    ("ngram", 4, "meta-llama/Llama-3.1-8B", None),
])
def test_speculative_config_is_vllms_json(method, n, model, draft):
    """The --speculative-config JSON has vLLM's keys and method names: Gemma 4's assistant runs as
    method "mtp" with the assistant as "model" (seed article's serve commands), native MTP and
    n-gram name no model."""
    cfg = plan.speculative_config(method, n, model, None)
    back = json.loads(json.dumps(cfg))
    assert set(back) <= {"method", "model", "num_speculative_tokens"}
    assert back["method"] in VLLM_METHODS and back["num_speculative_tokens"] == n
    assert back.get("model") == draft
    assert plan.speculative_config("none", 0, model, None) is None


def test_the_default_plans_serve_line_matches_its_recommendation(tmp_path):
    """On a speculative plan, the --speculative-config parsed from the serve line is the
    recommendation's method, draft and N (a small gemma-4 search)."""
    data = json.loads(json.dumps(SCENARIO))
    data["deployment"]["model"] = "google/gemma-4-31B-it"
    data["slo"] = "ttft:p99<2s;tpot:p90<20ms"
    data["plan"].update({"target_rate_rps": 3, "headroom": 0.0})
    data["plan"]["search"]["speculative"] = [{"method": "gemma4_mtp", "num_speculative_tokens": [3],
                                              "acceptance": {"dataset": "chat"}}]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["plan", str(path), "--out", str(out)]) == 0
    p = json.loads((out / "plan.json").read_text())
    rec = p["recommendation"]
    argv = shlex.split(p["vllm_serve"])
    cfg = json.loads(_flag(argv, "--speculative-config"))
    assert cfg == {"method": "mtp", "model": "google/gemma-4-31B-it-assistant",
                   "num_speculative_tokens": rec["num_speculative_tokens"]}
    assert int(_flag(argv, "--tensor-parallel-size")) == rec["tensor_parallel_size"]
    written = yaml.safe_load((out / "recommended.yaml").read_text())
    assert written["speculative"]["method"] == "gemma4_mtp"
    assert "gemma4_mtp N=3" in written["description"]


def test_the_plan_report_shows_the_deployment_and_the_margins(underestimated_plan):
    from capacity.report import build

    rep = build.build_report(underestimated_plan)
    text = "\n".join(rep.summary)
    assert "Deployment: " in text and "vllm serve meta-llama/Llama-3.1-8B" in text
    assert "Check one replica: vllm bench serve" in text
    assert "(target × (1 + headroom))" in text and "met, margin " in text and " ± " in text
    assert "What if (re-planned by simulation): acceptance −10 %" in text and "traffic × 2: " in text
    assert "For meta-llama/Llama-3.1-8B (bf16 weights)" in text


def test_replica_search_never_simulates_below_a_known_miss():
    calls = []
    found, tried = plan.search_replicas(6, 64, lambda r: calls.append(r) or r >= 6, known_miss=5)
    assert found == 6 and calls == [6]
    found, _ = plan.search_replicas(6, 64, lambda r: r >= 11, known_miss=5)
    assert found == 11


# ------------------------------------------------------------------------------ 5. what decides it
def test_the_plan_names_what_it_is_for_and_replans_the_what_ifs(underestimated_plan):
    p = json.loads((underestimated_plan / "plan.json").read_text())
    rec = p["recommendation"]
    ctx = rec["context"]
    assert ctx["model"] == "meta-llama/Llama-3.1-8B" and ctx["precision"] == "bf16"
    assert "poisson" in ctx["traffic"] and ctx["binding_slo"] in {s["slo"] for s in rec["slo"]}
    assert ctx["binding_margin"] == min(s["margin"] for s in rec["slo"])
    # Llama-3.1-8B is in no GPU's calibration rows: the error that applies is a left-out model's, from the profile
    err = ctx["step_cost_error"]
    assert err["gpu"] == rec["gpu"] and err["model"] == "meta-llama/Llama-3.1-8B" and err["model_in_fit"] is False
    assert err["basis"] == "leave_one_model_out"
    assert err["figures"] == load_gpu(rec["gpu"]).cross_validation["leave_one_model_out"]
    sens = {row["what_if"]: row for row in p["sensitivity"]}
    tpot_p90 = err["figures"]["tpot_pct"][1]   # the GPU's p90 TPOT error on a left-out model (its profile)
    assert list(sens) == ["acceptance −10 %", "acceptance −20 %", "acceptance −30 %", "traffic × 1.5", "traffic × 2",
                          f"step cost +{tpot_p90:.0f} %"]
    assert all(sens[k]["gpus"] == rec["total_gpus"] and "no speculation" in sens[k]["note"]
               for k in list(sens)[:3])
    target = rec["confirmed_at_rps"]
    for k, f in (("traffic × 1.5", 1.5), ("traffic × 2", 2.0)):
        row = sens[k]
        assert row["rate_rps"] == pytest.approx(target * f)
        tried = {int(r): v for r, v in row["replicas_tried"].items()}
        assert tried[row["replicas"]] is True                          # found by simulation
        assert row["replicas"] - 1 < rec["replicas"] or tried[row["replicas"] - 1] is False
    assert rec["total_gpus"] <= sens["traffic × 1.5"]["gpus"] <= sens["traffic × 2"]["gpus"]
    slow = sens[f"step cost +{tpot_p90:.0f} %"]
    assert slow["rate_rps"] == pytest.approx(target) and "leave-one-model-out" in slow["note"]
    tried = {int(r): v for r, v in slow["replicas_tried"].items()}
    assert tried[slow["replicas"]] is True and slow["gpus"] >= rec["total_gpus"]   # a slower step never needs fewer


def test_a_gpu_without_serving_rows_says_its_step_cost_error_is_not_measured(tmp_path):
    """MI325X carries MI300X's efficiencies (a family transfer): the plan says the error is not measured, gives the
    sibling's left-out-model error as a lower bound, and re-plans a slower step by that lower bound, saying so."""
    sc = json.loads(json.dumps(SCENARIO))
    sc["deployment"]["gpu"] = "MI325X"
    sc["plan"].update({"target_rate_rps": 5, "search": {**sc["plan"]["search"], "gpu": ["MI325X"]}})
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(sc))
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 0
    rec = json.loads((tmp_path / "out" / "plan.json").read_text())["recommendation"]
    err = rec["context"]["step_cost_error"]
    assert err["basis"] == "sibling_leave_one_model_out" and err["sibling"] == "MI300X"
    assert err["figures"] == load_gpu("MI300X").cross_validation["leave_one_model_out"]
    slow = [row for row in rec["sensitivity"] if row["what_if"].startswith("step cost")]
    tpot_p90 = load_gpu("MI300X").cross_validation["leave_one_model_out"]["tpot_pct"][1]   # MI300X's p90
    assert len(slow) == 1 and slow[0]["what_if"] == f"step cost +{tpot_p90:.0f} %"
    assert "sibling-leave-one-model-out" in slow[0]["note"] and slow[0]["gpus"] >= rec["total_gpus"]


def test_overridden_efficiencies_get_no_error_and_no_slower_step_what_if(tmp_path):
    """With efficiencies of the user's own the profile's cross-validation does not describe them: not measured,
    and no what-if is made up for it."""
    sc = json.loads(json.dumps(SCENARIO))
    sc["deployment"]["gpu_overrides"] = {"efficiency": {"gemm": 0.3}}
    sc["plan"]["target_rate_rps"] = 5
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(sc))
    assert main(["plan", str(path), "--out", str(tmp_path / "out")]) == 0
    rec = json.loads((tmp_path / "out" / "plan.json").read_text())["recommendation"]
    assert rec["context"]["step_cost_error"]["basis"] == "not_measured"
    assert "not cross-validated" in rec["context"]["step_cost_error"]["in_words"]
    assert not any(row["what_if"].startswith("step cost") for row in rec["sensitivity"])
