"""Tests for capacity.sim.metrics against hand-computed values and queueing closed forms."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from capacity.errors import CapacityError
from capacity.sim.metrics import (
    RunInfo,
    Slo,
    assess_stability,
    in_system_at,
    mean_in_system,
    parse_slos,
    per_request_frame,
    summarize,
)


# --------------------------------------------------------------------------------------------
# Tiny hand-computed run
#
# R0: arrives 0.0, scheduled 0.1, chunks at 0.3 0.5 0.7 0.9 1.1 (5 tokens, 5 chunks)
#     TTFT 300 ms, E2E 1100 ms, TPOT (1100-300)/4 = 200 ms, queue 100 ms, ITL 4 x 200 ms
# R1: arrives 1.0, scheduled 1.0, one chunk at 1.2 (1 token)
#     TTFT 200 ms, E2E 200 ms, no TPOT (vLLM excludes output_len 1), queue 0
# R2: arrives 2.0, scheduled 2.5, chunks at 3.0 3.4 4.0 carrying 1+3+3 = 7 tokens (spec decode)
#     TTFT 1000 ms, E2E 2000 ms, TPOT 1000/6 ms, queue 500 ms, ITL 400, 600 ms
# duration = 4.0 - 0.0 = 4 s, 2 GPUs.
# --------------------------------------------------------------------------------------------


def tiny_requests() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": [0, 1, 2],
            "class_name": ["chat", "chat", "code"],
            "replica": [0, 1, 0],
            "arrival_s": [0.0, 1.0, 2.0],
            "first_scheduled_s": [0.1, 1.0, 2.5],
            "first_token_s": [0.3, 1.2, 3.0],
            "finish_s": [1.1, 1.2, 4.0],
            "prompt_tokens": [10, 20, 30],
            "output_tokens": [5, 1, 7],
            "num_chunks": [5, 1, 3],
            "num_preemptions": [0, 1, 2],
        }
    )


TINY_ITL_S = np.array([0.2, 0.2, 0.2, 0.2, 0.4, 0.6])


def tiny_run(**kw) -> RunInfo:
    args = dict(
        start_s=0.0,
        end_s=4.0,
        num_gpus=2,
        offered_rate_rps=1.0,
        arrival_window_end_s=2.0,
        t_s=np.array([0.0, 1.0, 3.0, 4.0]),
        waiting=np.array([0.0, 2.0, 1.0, 0.0]),
        running=np.array([1.0, 3.0, 0.0, 0.0]),
        kv_used_fraction=np.array([0.1, 0.5, 0.2, 0.0]),
    )
    args.update(kw)
    return RunInfo(**args)


def test_tiny_run_exact_metrics():
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run())
    approx = pytest.approx
    assert s["num_requests"] == 3 and s["completed"] == 3
    assert s["duration_s"] == approx(4.0)
    assert s["request_throughput_rps"] == approx(0.75)
    assert s["output_throughput_tok_s"] == approx(13 / 4)
    assert s["total_throughput_tok_s"] == approx(73 / 4)
    assert s["output_throughput_tok_s_per_gpu"] == approx(13 / 8)
    assert s["total_throughput_tok_s_per_gpu"] == approx(73 / 8)
    # TTFT [300, 200, 1000]; linear percentiles on sorted [200, 300, 1000]
    assert s["ttft_ms"] == approx({"mean": 500.0, "p50": 300.0, "p90": 860.0, "p99": 986.0})
    # TPOT [200, 166.67] (R1 excluded)
    t2 = 1000 / 6
    assert s["tpot_ms"] == approx(
        {"mean": (200 + t2) / 2, "p50": (200 + t2) / 2, "p90": t2 + 0.9 * (200 - t2), "p99": t2 + 0.99 * (200 - t2)}
    )
    # ITL sorted [200, 200, 200, 200, 400, 600]
    assert s["itl_ms"] == approx({"mean": 300.0, "p50": 200.0, "p90": 500.0, "p99": 590.0})
    # E2E sorted [200, 1100, 2000]
    assert s["e2e_ms"] == approx({"mean": 1100.0, "p50": 1100.0, "p90": 1820.0, "p99": 1982.0})
    assert s["queue_delay_ms"]["mean"] == approx(200.0)
    assert s["queue_delay_ms"]["p50"] == approx(100.0)
    # tok/s per user: 1000/200 = 5, 1000/166.67 = 6
    assert s["tok_s_per_user"] == approx({"mean": 5.5, "p10": 5.1, "p50": 5.5, "p90": 5.9})
    assert s["tok_s_per_user_at_median_tpot"] == approx(1000 / ((200 + t2) / 2))
    assert s["preemptions"] == 3
    # time-weighted series: each sample holds until the next, over [0, 4]
    assert s["kv_utilisation"]["mean"] == approx((0.1 * 1 + 0.5 * 2 + 0.2 * 1) / 4)
    assert s["kv_utilisation"]["max"] == approx(0.5)
    assert s["running"] == approx({"mean": (1 + 3 * 2) / 4, "max": 3.0})
    assert s["waiting"] == approx({"mean": (2 * 2 + 1) / 4, "max": 2.0})
    assert s["goodput_rps"] is None and s["slo"] == [] and s["slo_met"] is None
    assert s["stable"] is True
    json.dumps(s, allow_nan=False)


def test_per_request_frame_columns():
    df = per_request_frame(tiny_requests())
    np.testing.assert_allclose(df["ttft_ms"], [300, 200, 1000])
    np.testing.assert_allclose(df["e2e_ms"], [1100, 200, 2000])
    np.testing.assert_allclose(df["queue_delay_ms"], [100, 0, 500])
    assert df["tpot_ms"].iloc[0] == pytest.approx(200.0)
    assert math.isnan(df["tpot_ms"].iloc[1])  # one output token: TPOT undefined (vLLM)
    assert df["tpot_ms"].iloc[2] == pytest.approx(1000 / 6)
    assert df["tok_s_per_user"].iloc[2] == pytest.approx(6.0)
    assert math.isnan(df["tok_s_per_user"].iloc[1])


def test_tpot_excludes_single_token_requests():
    req = tiny_requests()
    # Give the one-token R1 a 98.8 s gap between first token and finish: if it entered TPOT
    # (as (E2E - TTFT)/max(out - 1, 1), say) it would dominate the mean.
    req.loc[1, "finish_s"] = 100.0
    s = summarize(req, TINY_ITL_S, tiny_run(end_s=100.0))
    assert s["tpot_ms"]["mean"] == pytest.approx((200 + 1000 / 6) / 2)
    assert s["tpot_ms"]["p99"] < 200.0 + 1e-9
    only_one_token = req.copy()
    only_one_token["output_tokens"] = 1
    s = summarize(only_one_token, np.array([]), tiny_run(end_s=100.0))
    assert s["tpot_ms"] == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert s["tok_s_per_user_at_median_tpot"] is None
    assert s["itl_ms"]["mean"] is None


def test_unfinished_requests_are_excluded_and_flag_instability():
    req = pd.concat([tiny_requests(), tiny_requests().iloc[[0]]], ignore_index=True)
    req.loc[3, ["request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s"]] = [
        3, 1.5, 1.6, np.nan, np.nan
    ]
    s = summarize(req, TINY_ITL_S, tiny_run())
    assert s["num_requests"] == 4 and s["completed"] == 3
    assert s["request_throughput_rps"] == pytest.approx(0.75)
    assert s["ttft_ms"]["mean"] == pytest.approx(500.0)
    assert s["stable"] is False
    assert "1 of 4 requests" in s["stability_note"]


def test_goodput_per_request_vllm_semantics():
    # ttft <= 400: R0 (300), R1 (200) pass, R2 (1000) fails.
    # tpot <= 250: R0 200 passes, R1 counts as TPOT 0 (vLLM all_tpots), R2 166.7 passes.
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("ttft:p99<400ms;tpot:p90<250ms"))
    assert s["goodput_rps"] == pytest.approx(2 / 4)
    # tpot <= 180 ms: R0 (200) fails, R1 (0) and R2 (166.7) pass; ttft <= 1200 ms: all pass.
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("tpot:mean<180ms;ttft:max<1.2s"))
    assert s["goodput_rps"] == pytest.approx(2 / 4)
    # Inclusive threshold, as vLLM's `slo >= value`: TTFT exactly 300 ms is good.
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("ttft:p50<300ms"))
    assert s["goodput_rps"] == pytest.approx(2 / 4)  # R0 300, R1 200 good; R2 1000 not
    # Per-user rate lower bound: R0 5 tok/s fails >= 5.5, R1 (one token) passes, R2 6 passes.
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("tok_s_per_user:p10>5.5"))
    assert s["goodput_rps"] == pytest.approx(2 / 4)
    # ITL has no per-request value: it does not change goodput.
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("itl:p99<1ms"))
    assert s["goodput_rps"] == pytest.approx(3 / 4)
    assert s["slo_met"] is False


def test_aggregate_slos_met_and_not_met():
    slos = parse_slos("ttft:p99<400ms;tpot:p90<250ms;e2e:mean<1.2s;ttft:p50<300ms;tok_s_per_user:p10>5")
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), slos)
    rows = {r["slo"]: r for r in s["slo"]}
    assert rows["ttft:p99<400ms"]["achieved"] == pytest.approx(986.0)
    assert rows["ttft:p99<400ms"]["threshold"] == pytest.approx(400.0)
    assert rows["ttft:p99<400ms"]["met"] is False
    assert rows["tpot:p90<250ms"]["achieved"] == pytest.approx(1000 / 6 + 0.9 * (200 - 1000 / 6))
    assert rows["tpot:p90<250ms"]["met"] is True
    assert rows["e2e:mean<1.2s"]["achieved"] == pytest.approx(1100.0)
    assert rows["e2e:mean<1.2s"]["threshold"] == pytest.approx(1200.0)
    assert rows["e2e:mean<1.2s"]["met"] is True
    assert rows["ttft:p50<300ms"]["met"] is True  # 300 == 300, inclusive
    assert rows["tok_s_per_user:p10>5"]["achieved"] == pytest.approx(5.1)
    assert rows["tok_s_per_user:p10>5"]["met"] is True
    assert s["slo_met"] is False
    ok = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("ttft:p99<1s;itl:p90<0.5s"))
    assert ok["slo_met"] is True
    assert ok["goodput_rps"] == pytest.approx(3 / 4)
    json.dumps(ok, allow_nan=False)


def test_parse_slos_good():
    slos = parse_slos("ttft:p99<1s; tpot:p90<40ms ;e2el:p50<20s,tok_s_per_user:p10>20;itl:mean<500us")
    assert slos == [
        Slo("ttft", "p99", "<", 1000.0),
        Slo("tpot", "p90", "<", 40.0),
        Slo("e2e", "p50", "<", 20000.0),
        Slo("tok_s_per_user", "p10", ">", 20.0),
        Slo("itl", "mean", "<", 0.5),
    ]
    assert str(slos[0]) == "ttft:p99<1s"
    assert parse_slos("tpot:p99.9<50")[0] == Slo("tpot", "p99.9", "<", 50.0)  # bare number: ms
    assert parse_slos("tok_s_per_user:min>=12.5")[0] == Slo("tok_s_per_user", "min", ">", 12.5)
    assert parse_slos("E2E:median<2S")[0] == Slo("e2e", "p50", "<", 2000.0)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "no SLOs given"),
        ("ttft<1s", "expected METRIC:STAT<VALUE"),
        ("ttfb:p99<1s", "unknown metric 'ttfb'"),
        ("ttft:p101<1s", "unknown statistic 'p101'"),
        ("ttft:avg<1s", "unknown statistic 'avg'"),
        ("ttft:p99<1min", "unknown time unit 'min'"),
        ("ttft:p99>1s", "use '<'"),
        ("tok_s_per_user:p10<20", "use '>'"),
        ("tok_s_per_user:p10>20ms", "plain number in tokens/s"),
        ("ttft:p99<0s", "positive"),
        ("ttft:p99<1s;tpot:p90", "bad SLO 'tpot:p90'"),
    ],
)
def test_parse_slos_bad(text, fragment):
    with pytest.raises(CapacityError) as exc:
        parse_slos(text)
    msg = str(exc.value)
    assert fragment in msg
    assert "\n" not in msg
    assert "ttft:p99<1s" in msg  # shows an example


def test_mean_in_system_and_in_system_at_hand_values():
    req = tiny_requests()  # in system on [0, 1.1), [1, 1.2), [2, 4)
    assert mean_in_system(req, 0.0, 4.0) == pytest.approx((1.1 + 0.2 + 2.0) / 4)
    assert mean_in_system(req, 1.0, 2.0) == pytest.approx(0.1 + 0.2)
    np.testing.assert_array_equal(in_system_at(req, np.array([0.5, 1.05, 1.15, 2.0, 4.0])), [1, 2, 1, 1, 0])


# --------------------------------------------------------------------------------------------
# M/M/1 via Lindley's recursion W_{n+1} = max(0, W_n + S_n - A_{n+1})
# --------------------------------------------------------------------------------------------


def lindley_waits(interarrival_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    """Lindley's recursion in closed form: with C_n = sum_{j<=n} (S_{j-1} - A_j), C_0 = 0,
    W_n = C_n - min_{k<=n} C_k (the reflected random walk)."""
    c = np.concatenate([[0.0], np.cumsum(service_s[:-1] - interarrival_s[1:])])
    return c - np.minimum.accumulate(c)


def mm1(lam: float, mu: float, n: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.exponential(1 / lam, n)
    s = rng.exponential(1 / mu, n)
    w = lindley_waits(a, s)
    arrival = np.cumsum(a)
    start = arrival + w
    finish = start + s
    out_tokens = 10
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "class_name": "c",
            "replica": 0,
            "arrival_s": arrival,
            "first_scheduled_s": start,
            "first_token_s": start + s / out_tokens,
            "finish_s": finish,
            "prompt_tokens": 100,
            "output_tokens": out_tokens,
            "num_chunks": out_tokens,
            "num_preemptions": 0,
        }
    )
    return frame, w


def test_lindley_closed_form_matches_the_recursion():
    rng = np.random.default_rng(7)
    a = rng.exponential(1 / 0.9, 3000)
    s = rng.exponential(1.0, 3000)
    w_loop = np.zeros(3000)
    for i in range(2999):
        w_loop[i + 1] = max(0.0, w_loop[i] + s[i] - a[i + 1])
    np.testing.assert_allclose(lindley_waits(a, s), w_loop, atol=1e-9)


def test_mm1_stable_queue_delay_littles_law_and_stability():
    lam, mu, n = 0.7, 1.0, 1_000_000
    rho = lam / mu
    req, _ = mm1(lam, mu, n, seed=1)
    arrival = req["arrival_s"].to_numpy()
    run = RunInfo(
        start_s=float(arrival[0]),
        end_s=float(req["finish_s"].max()),
        num_gpus=1,
        offered_rate_rps=lam,
        arrival_window_end_s=float(arrival[-1]),
    )
    # Mean wait in queue: closed form rho/(mu - lam).  Standard error of the sample mean of n
    # consecutive M/M/1 waits (asymptotic variance, Daley 1968):
    # sigma^2 = rho (2 + 5 rho - 4 rho^2 + rho^3) / (mu^2 (1 - rho)^4) / n  -> 0.018 s here.
    wq_closed_s = rho / (mu - lam)
    se_s = math.sqrt(rho * (2 + 5 * rho - 4 * rho**2 + rho**3) / (mu**2 * (1 - rho) ** 4) / n)
    df = per_request_frame(req)
    assert df["queue_delay_ms"].mean() / 1000 == pytest.approx(wq_closed_s, abs=4 * se_s)
    s = summarize(req, np.array([]), run)
    assert s["queue_delay_ms"]["mean"] / 1000 == pytest.approx(wq_closed_s, abs=4 * se_s)
    # Mean sojourn W = 1/(mu - lam) = Wq + 1/mu; its standard error is below Wq's + 1/sqrt(n)
    assert s["e2e_ms"]["mean"] / 1000 == pytest.approx(1 / (mu - lam), abs=4 * se_s + 4 / math.sqrt(n))
    # Little's law over the arrival window: L = lambda * W within 2 %
    l_window = mean_in_system(req, run.start_s, run.arrival_window_end_s)
    assert l_window == pytest.approx(lam * s["e2e_ms"]["mean"] / 1000, rel=0.02)
    # and the closed form L = rho / (1 - rho)
    assert l_window == pytest.approx(rho / (1 - rho), rel=0.05)
    stable, note = assess_stability(req, run)
    assert stable, note
    assert note.startswith("stable")
    assert s["stable"] is True


def test_mm1_overloaded_is_unstable_by_queue_growth():
    lam, mu, n = 1.3, 1.0, 20_000
    req, _ = mm1(lam, mu, n, seed=2)
    arrival = req["arrival_s"].to_numpy()
    # Drained run: every request finishes, so only the growth criterion can fire.
    run = RunInfo(
        start_s=float(arrival[0]),
        end_s=float(req["finish_s"].max()),
        num_gpus=1,
        offered_rate_rps=lam,
        arrival_window_end_s=float(arrival[-1]),
    )
    stable, note = assess_stability(req, run)
    assert not stable
    assert "grows without bound" in note and "lower the request rate" in note
    # Expected growth over half the window ~ (lam - mu) * T/2 ~ 0.3 * 7700 ~ 2300 requests.
    s = summarize(req, np.array([]), run, parse_slos("e2e:p50<1000s"))
    assert s["stable"] is False and s["slo_met"] is False


def test_mm1_overloaded_cut_at_horizon_is_unstable_by_unfinished():
    lam, mu, n = 1.3, 1.0, 20_000
    req, _ = mm1(lam, mu, n, seed=3)
    horizon = float(req["arrival_s"].iloc[-1])
    late = req["finish_s"] > horizon
    req.loc[late, "finish_s"] = np.nan
    req.loc[req["first_token_s"] > horizon, "first_token_s"] = np.nan
    req.loc[req["first_scheduled_s"] > horizon, "first_scheduled_s"] = np.nan
    run = RunInfo(start_s=float(req["arrival_s"].iloc[0]), end_s=horizon, num_gpus=1,
                  offered_rate_rps=lam, arrival_window_end_s=horizon)
    stable, note = assess_stability(req, run)
    assert not stable
    assert "had not finished" in note
    # Closed loop with the same unfinished requests is unstable too.
    closed = RunInfo(start_s=run.start_s, end_s=horizon, num_gpus=1)
    assert assess_stability(req, closed)[0] is False


def test_transient_growth_that_the_server_absorbs_is_stable():
    # Deterministic arrivals every second for 1000 s.  E2E is 0.5 s in the first half, then rises
    # linearly to 10.5 s: the in-system count climbs by ~10 (> 5) over the second half, but only
    # ~10 of 1000 requests finish after the window, so throughput is ~99 % of offered (>= 95 %).
    n = 1000
    arrival = np.arange(n, dtype=float)
    e2e = np.where(arrival < 500, 0.5, 0.5 + 0.02 * (arrival - 500))
    req = pd.DataFrame(
        {
            "request_id": np.arange(n), "arrival_s": arrival, "first_scheduled_s": arrival,
            "first_token_s": arrival + 0.1, "finish_s": arrival + e2e, "prompt_tokens": 1,
            "output_tokens": 2, "num_chunks": 2, "num_preemptions": 0,
        }
    )
    run = RunInfo(start_s=0.0, end_s=float((arrival + e2e).max()), num_gpus=1,
                  offered_rate_rps=1.0, arrival_window_end_s=float(n - 1))
    stable, note = assess_stability(req, run)
    assert stable, note
    growth = float(note.split("grew by ")[1].split(" ")[0])
    assert 8.0 < growth < 12.0
    assert "transient" in note


def test_closed_loop_is_stable_when_all_finish():
    run = tiny_run(offered_rate_rps=None, arrival_window_end_s=None)
    stable, note = assess_stability(tiny_requests(), run)
    assert stable and "closed loop" in note


def test_bad_inputs_raise_capacity_error():
    with pytest.raises(CapacityError, match="end_s"):
        RunInfo(start_s=1.0, end_s=1.0, num_gpus=1)
    with pytest.raises(CapacityError, match="lacks columns"):
        summarize(tiny_requests().drop(columns=["finish_s"]), TINY_ITL_S, tiny_run())
    with pytest.raises(CapacityError, match="no requests"):
        summarize(tiny_requests().iloc[0:0], TINY_ITL_S, tiny_run())
    bad = tiny_requests()
    bad.loc[2, "finish_s"] = 2.5  # before its first token at 3.0
    with pytest.raises(CapacityError, match="request 2 has timestamps out of order"):
        summarize(bad, TINY_ITL_S, tiny_run())


def test_unsent_requests_are_not_counted():
    # A closed loop cut at its horizon leaves requests that were never issued (NaN arrival).
    req = pd.concat([tiny_requests(), tiny_requests().iloc[[0]]], ignore_index=True)
    req.loc[3, ["arrival_s", "first_scheduled_s", "first_token_s", "finish_s"]] = np.nan
    s = summarize(req, TINY_ITL_S, tiny_run(offered_rate_rps=None, arrival_window_end_s=None))
    assert s["num_requests"] == 3 and s["not_sent"] == 1 and s["completed"] == 3
    assert s["e2e_ms"]["mean"] == pytest.approx(1100.0)
    assert s["stable"] is True
    assert mean_in_system(req, 0.0, 4.0) == pytest.approx(3.3 / 4)


def test_unsorted_series_fall_back_to_sample_mean():
    # Two replicas' samples concatenated: times go back at the join.
    run = tiny_run(t_s=np.array([0.0, 2.0, 0.0, 2.0]), running=np.array([1.0, 3.0, 2.0, 6.0]),
                   waiting=np.zeros(4), kv_used_fraction=np.array([0.2, 0.4, 0.6, 0.8]))
    s = summarize(tiny_requests(), TINY_ITL_S, run)
    assert s["running"] == pytest.approx({"mean": 3.0, "max": 6.0})
    assert s["kv_utilisation"] == pytest.approx({"mean": 0.5, "max": 0.8})


# --------------------------------------------------------------------------------------------
# Per-class statistics and class-qualified SLOs (issue 18 item 6), on the tiny run:
# chat = R0, R1 (TTFT 300, 200; E2E 1100, 200; TPOT 200 from R0 only); code = R2 (TTFT 1000,
# E2E 2000, TPOT 1000/6).
# --------------------------------------------------------------------------------------------


def test_tiny_run_per_class_hand_values():
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run())
    approx = pytest.approx
    assert list(s["per_class"]) == ["chat", "code"]
    chat, code = s["per_class"]["chat"], s["per_class"]["code"]
    assert (chat["num_requests"], chat["completed"], code["num_requests"], code["completed"]) == (2, 2, 1, 1)
    assert chat["ttft_ms"] == approx({"mean": 250.0, "p50": 250.0, "p90": 290.0, "p99": 299.0})
    assert chat["e2e_ms"] == approx({"mean": 650.0, "p50": 650.0, "p90": 1010.0, "p99": 1091.0})
    assert chat["tpot_ms"] == approx({"mean": 200.0, "p50": 200.0, "p90": 200.0, "p99": 200.0})
    assert chat["queue_delay_ms"]["p50"] == approx(50.0)
    assert chat["tok_s_per_user"]["p50"] == approx(5.0)
    assert code["ttft_ms"]["p99"] == approx(1000.0) and code["tpot_ms"]["mean"] == approx(1000 / 6)
    # the run's duration and GPUs are the denominators, so the classes add up to the run
    assert chat["output_throughput_tok_s"] == approx(6 / 4) and code["output_throughput_tok_s"] == approx(7 / 4)
    assert chat["output_throughput_tok_s_per_gpu"] == approx(6 / 8)
    assert chat["request_throughput_rps"] == approx(2 / 4)
    assert (chat["preemptions"], code["preemptions"]) == (1, 2)
    assert "itl_ms" not in chat                    # ITL gaps are pooled without their request
    assert chat["goodput_rps"] is None and chat["slo"] == [] and chat["slo_met"] is None
    json.dumps(s, allow_nan=False)
    # one class: no per_class block, and the rest unchanged
    one = tiny_requests().assign(class_name="chat")
    t = summarize(one, TINY_ITL_S, tiny_run())
    assert "per_class" not in t
    assert json.dumps({k: v for k, v in s.items() if k != "per_class"}) == json.dumps(t)
    assert "per_class" not in summarize(tiny_requests().drop(columns="class_name"), TINY_ITL_S, tiny_run())


def test_class_qualified_slos_and_goodput_by_hand():
    # ttft[chat]:p50<260ms -> chat p50 250 met; ttft[code]:max<900ms -> code 1000 missed;
    # tpot:max<190ms applies to all: R0 (200) fails it, R1 (1 token, TPOT 0) and R2 (166.7) pass.
    slos = parse_slos("ttft[chat]:p50<260ms;ttft[code]:max<0.9s;tpot:max<190ms")
    s = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), slos)
    rows = {r["slo"]: r for r in s["slo"]}
    assert rows["ttft[chat]:p50<260ms"] == {"slo": "ttft[chat]:p50<260ms", "achieved": pytest.approx(250.0),
                                             "threshold": 260.0, "met": True, "class": "chat"}
    assert rows["ttft[code]:max<0.9s"]["achieved"] == pytest.approx(1000.0)
    assert rows["ttft[code]:max<0.9s"]["met"] is False and rows["ttft[code]:max<0.9s"]["class"] == "code"
    assert rows["tpot:max<190ms"]["met"] is False and "class" not in rows["tpot:max<190ms"]
    assert s["slo_met"] is False
    # good: R1 only (R0 misses the TPOT bound, R2 the code TTFT bound); the code bound does not
    # touch R0/R1, the chat bound does not touch R2
    assert s["goodput_rps"] == pytest.approx(1 / 4)
    chat, code = s["per_class"]["chat"], s["per_class"]["code"]
    assert chat["goodput_rps"] == pytest.approx(1 / 4) and code["goodput_rps"] == 0.0
    assert [r["slo"] for r in chat["slo"]] == ["ttft[chat]:p50<260ms"] and chat["slo_met"] is True
    assert [r["slo"] for r in code["slo"]] == ["ttft[code]:max<0.9s"] and code["slo_met"] is False
    # a qualified SLO is not applied to the other class: chat's R0 (300 ms) stays good under a
    # code-only 250 ms bound, which code's R2 (1000 ms) misses
    s2 = summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("ttft[code]:max<250ms"))
    assert s2["slo_met"] is False and s2["goodput_rps"] == pytest.approx(2 / 4)
    assert s2["per_class"]["chat"]["slo_met"] is None and s2["per_class"]["chat"]["goodput_rps"] == pytest.approx(2 / 4)


def test_unknown_class_in_an_slo_is_one_line_naming_the_classes():
    with pytest.raises(CapacityError) as exc:
        summarize(tiny_requests(), TINY_ITL_S, tiny_run(), parse_slos("ttft:p99<1s;ttft[Chat]:p99<1s"))
    msg = str(exc.value)
    assert "\n" not in msg and "'Chat'" in msg and "'chat', 'code'" in msg
    with pytest.raises(CapacityError, match="no named classes"):
        summarize(tiny_requests().drop(columns="class_name"), TINY_ITL_S, tiny_run(), parse_slos("ttft[chat]:p99<1s"))


def test_parse_class_qualified_slos():
    a, b, c = parse_slos("TTFT[Support Bot]:P99<1S; tpot [code] : p90 < 15 ms ,e2el[x]:median<20s")
    assert a == Slo("ttft", "p99", "<", 1000.0, class_name="Support Bot")   # the class keeps its case
    assert b == Slo("tpot", "p90", "<", 15.0, class_name="code")
    assert c == Slo("e2e", "p50", "<", 20000.0, class_name="x")
    assert a != Slo("ttft", "p99", "<", 1000.0)                             # the class is part of the SLO
    assert str(Slo("ttft", "p99", "<", 1000.0, class_name="chat")) == "ttft[chat]:p99<1000ms"
    assert parse_slos("tok_s_per_user[chat]:p10>20")[0].class_name == "chat"
    assert parse_slos("ttft:p99<1s")[0].class_name is None
    # achieved values print in the unit the SLO was written in
    assert a.display(812.345) == "0.812 s"
    assert b.display(12.34) == "12.3 ms"
    assert parse_slos("tpot:p90<15")[0].display(12.34) == "12.3 ms"         # bare number: ms (vLLM)
    assert parse_slos("itl:p90<500us")[0].display(0.25) == "250.0 us"
    assert parse_slos("tok_s_per_user:p10>20")[0].display(33.333) == "33.3 tok/s"
    assert a.display(None) == "n/a"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("ttft[]:p99<1s", "empty request class"),
        ("ttft[ ]:p99<1s", "empty request class"),
        ("itl[chat]:p99<1s", "cannot be judged per request class"),
        ("ttft[a[b]]:p99<1s", "expected METRIC:STAT<VALUE"),
        ("ttft[chat:p99<1s", "expected METRIC:STAT<VALUE"),
    ],
)
def test_parse_class_qualified_slos_bad(text, fragment):
    with pytest.raises(CapacityError) as exc:
        parse_slos(text)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_a_constant_series_has_exactly_that_mean():
    """Time-weighted mean of a series that never changes is the value itself, bit for bit: one user's
    `running` mean must not read 0.9999999999999999 (summary.speculation_by_batch compares it with 1)."""
    from capacity.sim.metrics import _series_stats
    t = np.cumsum(np.random.default_rng(3).exponential(0.0137, 5000))
    assert _series_stats(t, np.ones_like(t))["mean"] == 1.0
    assert _series_stats(t, np.full_like(t, 7.0))["mean"] == 7.0
    # and a step: 1 for the first half of the time, 3 for the second -> 2
    assert _series_stats(np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0, 0.0]))["mean"] == pytest.approx(2.0)


def _light_run(arrival: dict, classes: list, num_requests: int | None = None) -> "object":
    from capacity.inputs import scenario as scenario_mod
    from capacity.sim import simulate
    return simulate.run(scenario_mod.from_dict({
        "name": "steady", "deployment": {"gpu": "MI300X", "model": "meta-llama/Llama-3.1-8B"},
        "slo": "ttft:p99<5s", "traffic": {"arrival": arrival, "classes": classes,
                                          **({"num_requests": num_requests} if num_requests else {})}}, "t"))


def test_the_steady_window_of_a_stable_poisson_run_carries_the_offered_rate():
    """Flow balance: in a stable run what completes per second inside the window is what arrives, a Poisson
    count of rate x span (4 req/s here; 720 requests in the window: 1 sd about 3.7 %)."""
    res = _light_run({"process": "poisson", "rate_rps": 4.0},
                     [{"name": "c", "input_tokens": {"dist": "fixed", "value": 200},
                       "output_tokens": {"dist": "fixed", "value": 50}}], num_requests=800)
    st = res.metrics["steady"]
    t0, t1 = st["window_s"]
    arrivals = np.sort(res.requests["arrival_s"].to_numpy(float))
    assert t0 == arrivals[80] and t1 == arrivals[-1]                 # the first tenth is the warm-up
    assert st["request_throughput_rps"] == pytest.approx(4.0, rel=0.12)
    assert st["output_throughput_tok_s_per_gpu"] == pytest.approx(50 * st["request_throughput_rps"])
    assert st["goodput_rps"] == pytest.approx(st["request_throughput_rps"])   # a loose SLO every request meets


def test_conversations_offer_their_rate_until_the_last_one_starts():
    """Sessions at 2/s, 3 turns each 5 s apart: after the last session starts only its later turns come, so
    the window ends there, and inside it the load is the offered 6 requests/s; the whole-run rate, over the
    tail as well, is lower."""
    res = _light_run({"process": "sessions", "rate_sessions_per_s": 2.0, "num_sessions": 150},
                     [{"name": "chat", "turns": {"dist": "fixed", "value": 3},
                       "think_time_s": {"dist": "fixed", "value": 5.0},
                       "input_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 20}}])
    req = res.requests
    st = res.metrics["steady"]
    assert st["window_s"][1] == req["arrival_s"][req["follows"] < 0].max()
    assert (req["follows"] >= 0).sum() == 2 * 150 and req.groupby("session").size().eq(3).all()
    assert st["request_throughput_rps"] == pytest.approx(6.0, rel=0.15)
    assert res.metrics["request_throughput_rps"] < st["request_throughput_rps"]


def test_columns_and_a_dataframe_give_the_same_metrics():
    """The simulator hands `summarize` numpy columns (metrics.Columns, no pandas on its path); a
    DataFrame of the same records gives the same summary, number for number."""
    from capacity.sim.metrics import Columns, per_request

    frame = tiny_requests()
    cols = Columns({c: frame[c].to_numpy() for c in frame.columns})
    slos = parse_slos("ttft:p99<2s;tpot[code]:p90<300ms")
    assert json.dumps(summarize(cols, TINY_ITL_S, tiny_run(), slos)) == \
        json.dumps(summarize(frame, TINY_ITL_S, tiny_run(), slos))
    added = per_request(cols)
    df = per_request_frame(frame)
    for name in ("completed", "ttft_ms", "tpot_ms", "e2e_ms", "queue_delay_ms", "tok_s_per_user"):
        np.testing.assert_array_equal(added[name], df[name].to_numpy())
    # a boolean mask selects rows of every column; a scalar column is broadcast
    chat = cols[cols["class_name"] == "chat"]
    assert len(chat) == 2 and chat["request_id"].tolist() == [0, 1]
    assert Columns({"a": np.arange(3), "b": ""})["b"].tolist() == ["", "", ""]
