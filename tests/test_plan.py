"""capacity plan: the recommendation must be confirmed by simulation, and be minimal."""

from __future__ import annotations

import json
import numpy as np

import pytest
import yaml

from capacity.inputs import scenario

from capacity.sim import simulate
from capacity.cli import main

SCENARIO = {
    "name": "plan-test",
    "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
    "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 100,
                "classes": [{"name": "chat", "input_tokens": {"dist": "uniform", "low": 200, "high": 1200},
                             "output_tokens": {"dist": "uniform", "low": 50, "high": 250}}]},
    "slo": "ttft:p99<1s;tpot:p90<15ms",
    "plan": {"target_rate_rps": 24, "headroom": 0.0, "simulate_top": 2, "requests_per_probe": 120,
             "search": {"gpu": ["MI300X"], "tensor_parallel_size": [1, 2],
                        "speculative": [{"method": "none"},
                                        {"method": "eagle3", "num_speculative_tokens": [2, 4],
                                         "draft": "RedHatAI/Qwen3-8B-Thinking-speculator.eagle3"}]}},
}


@pytest.fixture()
def planned(tmp_path):
    path = tmp_path / "plan.yaml"
    data = json.loads(json.dumps(SCENARIO))
    data["plan"]["search"]["speculative"] = [{"method": "none"}]   # Llama has no shipped EAGLE-3 head
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["plan", str(path), "--out", str(out)]) == 0
    return out


def test_recommendation_is_confirmed_and_minimal(planned):
    plan = json.loads((planned / "plan.json").read_text())
    rec = plan["recommendation"]
    assert rec["slo_met"] is True
    assert rec["total_gpus"] == rec["replicas"] * rec["tensor_parallel_size"]
    # re-running the written scenarios: the recommendation meets the SLOs, one replica fewer does not
    ok = simulate.run(scenario.load(str(planned / "recommended.yaml")))
    assert ok.metrics["slo_met"] is True
    if rec["replicas"] > 1:
        fewer = simulate.run(scenario.load(str(planned / "one_fewer_replica.yaml")))
        assert fewer.metrics["slo_met"] is False
    # candidates are ranked by GPU count
    gpus = [c["total_gpus"] for c in plan["candidates"] if c["feasible"]]
    assert gpus == sorted(gpus)


def test_plan_without_slos_or_feasible_candidates_is_one_line(tmp_path, capsys):
    data = json.loads(json.dumps(SCENARIO))
    data.pop("slo")
    path = tmp_path / "noslo.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", str(path)]) == 2
    assert "slo" in capsys.readouterr().err
    data = json.loads(json.dumps(SCENARIO))
    data["slo"] = "ttft:p99<1ms"
    data["plan"]["search"]["speculative"] = [{"method": "none"}]
    path.write_text(yaml.safe_dump(data))
    assert main(["plan", str(path)]) == 2
    *progress, error = capsys.readouterr().err.strip().splitlines()
    assert "no candidate" in error and error.startswith("capacity: error:")
    assert all(line.startswith("plan: ") for line in progress)       # progress lines of a log, then the one error line


def test_a_simulated_candidate_says_where_its_acceptance_comes_from():
    """The recommendation carries the drafter's acceptance basis: DSpark was measured on Qwen3-8B
    only (seed article), so for gemma-4-31B-it it is carried over and must say so."""
    from capacity.studies.plan import _simulate

    sc = {"name": "basis", "deployment": {"gpu": "MI300X", "model": "google/gemma-4-31B-it"},
          "speculative": {"method": "dspark", "num_speculative_tokens": 7},
          "traffic": {"arrival": {"process": "poisson", "rate_rps": 1.0}, "num_requests": 4,
                      "classes": [{"name": "chat", "input_tokens": {"dist": "fixed", "value": 100},
                                   "output_tokens": {"dist": "fixed", "value": 20}}]}}
    basis = _simulate(sc)["acceptance_basis"]
    assert "Qwen/Qwen3-8B" in basis and "google/gemma-4-31B-it not measured for dspark" in basis
    assert _simulate({**sc, "speculative": {"method": "none"}})["acceptance_basis"] is None


def test_the_plan_shows_the_target_traffic_with_and_without_speculation(tmp_path, capsys):
    """The recommendation (speculation on), the same deployment with it off, and the cheapest
    deployment without it, all at the target rate; the middle column is exactly the written
    recommendation re-simulated with speculation off."""
    data = json.loads(json.dumps(SCENARIO))
    data["deployment"]["model"] = "google/gemma-4-31B-it"          # its Gemma 4 MTP assistant is shipped
    data["slo"] = "ttft:p99<2s;tpot:p90<20ms"
    data["plan"]["target_rate_rps"] = 3
    data["plan"]["search"]["speculative"] = [{"method": "none"}, {"method": "gemma4_mtp", "num_speculative_tokens": [3],
                                                                  "acceptance": {"dataset": "chat"}}]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["plan", str(path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rec = json.loads((out / "plan.json").read_text())["recommendation"]
    assert rec["method"] == "gemma4_mtp"
    runs = rec["comparison"]
    assert [r["label"] for r in runs] == ["gemma4_mtp N=3", "same GPUs, no spec", "cheapest without"]
    assert runs[0]["gpus"] == runs[1]["gpus"] == rec["total_gpus"]
    assert runs[2]["gpus"] == rec["without_speculation"]["total_gpus"] and runs[2]["slo_met"]
    # recommended.yaml is the confirmation run (target × (1 + headroom), evidence length); the table
    # is at the target rate with its own request count
    off = scenario.load(str(out / "recommended.yaml"), [f"traffic.arrival.rate_rps={runs[1]['rate_rps']}",
                                                         f"traffic.num_requests={runs[1]['num_requests']}"])
    off = off.model_copy(update={"speculative": scenario.Speculative()})
    assert simulate.run(off).metrics["tpot_ms"]["p90"] == pytest.approx(runs[1]["metrics"]["tpot_ms"]["p90"], rel=1e-9)
    assert "At 3 req/s" in text and "same GPUs, no spec" in text
    assert rec["speculation_by_batch"]["pays_up_to"] >= 1 and "pays up to" in text


def test_conversation_evidence_is_judged_at_the_planned_load():
    """After the last conversation starts only later turns arrive, at a falling load: the SLO verdict
    leaves them out, as it leaves out the warm-up (the first tenth of arrivals)."""
    from capacity.sim.metrics import parse_slos
    from capacity.studies.plan import _simulate, judge
    run = _simulate({"name": "s", "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
                     "slo": "ttft:p99<5s",
                     "traffic": {"arrival": {"process": "sessions", "rate_sessions_per_s": 2.0, "num_sessions": 100},
                                 "classes": [{"name": "chat", "turns": {"dist": "fixed", "value": 3},
                                              "think_time_s": {"dist": "fixed", "value": 5.0},
                                              "input_tokens": {"dist": "fixed", "value": 100},
                                              "output_tokens": {"dist": "fixed", "value": 20}}]}})
    req = run["requests"]
    arrival = np.sort(req["arrival_s"].to_numpy(float))
    last_start = req["arrival_s"][req["follows"] < 0].max()
    expected = int(((req["arrival_s"] >= arrival[30]) & (req["arrival_s"] <= last_start)).sum())
    verdict = judge(run, parse_slos("ttft:p99<5s"))
    assert verdict["steady_requests"] == expected < 300 - 30
